/* sdnotify — the systemd notification protocol, written by hand (no libsystemd).
 *
 * When systemd starts kvstored with Type=notify it sets NOTIFY_SOCKET (a filesystem path, or an
 * abstract-namespace name written with a leading '@') and, with WatchdogSec=, WATCHDOG_USEC and
 * WATCHDOG_PID. sdn_init() reads them; sdn_send() sends one datagram such as "READY=1",
 * "STATUS=...", "STOPPING=1" or "WATCHDOG=1". Without NOTIFY_SOCKET every call is a successful
 * no-op, so the daemon runs the same way in a terminal. struct sdn is caller-owned; it holds one
 * datagram socket that sdn_shutdown() closes. */
#ifndef FREEKV_SDNOTIFY_H
#define FREEKV_SDNOTIFY_H

#include <stdint.h>
#include <sys/socket.h>
#include <sys/un.h>

struct sdn {
	int fd;				/* -1 when not running under systemd */
	struct sockaddr_un addr;
	socklen_t addr_len;
	uint64_t watchdog_usec;		/* 0 when no watchdog is requested for this process */
};

/* -EINVAL when NOTIFY_SOCKET is set but malformed; errors of socket(). */
int sdn_init(struct sdn *n);
void sdn_shutdown(struct sdn *n);

/* Send one notification (printf-style; several "K=V" lines may be joined with '\n'). */
int sdn_send(struct sdn *n, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* How often to send WATCHDOG=1: half of WATCHDOG_USEC, in milliseconds; 0 when disabled. */
uint64_t sdn_watchdog_ms(const struct sdn *n);

#endif
