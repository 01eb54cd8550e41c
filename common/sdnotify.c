/* sdnotify — see sdnotify.h. */
#include "sdnotify.h"

#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int sdn_init(struct sdn *n)
{
	memset(n, 0, sizeof *n);
	n->fd = -1;
	const char *path = getenv("NOTIFY_SOCKET");
	if (!path || !*path)
		return 0;
	size_t len = strlen(path);
	if ((path[0] != '/' && path[0] != '@') || len >= sizeof n->addr.sun_path)
		return -EINVAL;
	n->addr.sun_family = AF_UNIX;
	memcpy(n->addr.sun_path, path, len);
	if (path[0] == '@')
		n->addr.sun_path[0] = '\0'; /* abstract namespace: no NUL terminator counted */
	n->addr_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len + (path[0] == '/'));

	const char *usec = getenv("WATCHDOG_USEC"), *pid = getenv("WATCHDOG_PID");
	if (usec && (!pid || strtol(pid, NULL, 10) == (long)getpid()))
		n->watchdog_usec = strtoull(usec, NULL, 10);

	n->fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (n->fd < 0)
		return -errno;
	return 0;
}

void sdn_shutdown(struct sdn *n)
{
	if (n->fd >= 0)
		close(n->fd);
	n->fd = -1;
}

int sdn_send(struct sdn *n, const char *fmt, ...)
{
	char buf[1024];
	va_list ap;
	if (n->fd < 0)
		return 0;
	va_start(ap, fmt);
	int len = vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	if (len < 0)
		return -EINVAL;
	if ((size_t)len >= sizeof buf)
		len = sizeof buf - 1;
	ssize_t w = sendto(n->fd, buf, (size_t)len, MSG_NOSIGNAL, (struct sockaddr *)&n->addr, n->addr_len);
	return w < 0 ? -errno : 0;
}

uint64_t sdn_watchdog_ms(const struct sdn *n)
{
	return n->watchdog_usec / 2000;
}
