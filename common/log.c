/* log — see log.h. */
#include "log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char *g_prog = "freekv";
static atomic_int g_level = LOG_INFO;
static atomic_int g_journal = -1; /* -1: not checked yet (any thread may be the first) */

static const char *const names[] = { "error", "warn", "info", "debug" };
static const char *const prefixes[] = { "<3>", "<4>", "<6>", "<7>" };

void log_init(const char *prog, enum log_level level)
{
	g_prog = prog;
	atomic_store(&g_journal, -1); /* JOURNAL_STREAM is read again */
	log_set_level(level);
}

void log_set_level(enum log_level level)
{
	atomic_store(&g_level, level < LOG_ERROR ? LOG_ERROR : level > LOG_DEBUG ? LOG_DEBUG : level);
}

enum log_level log_get_level(void)
{
	return (enum log_level)atomic_load(&g_level);
}

int log_parse_level(const char *s, enum log_level *out)
{
	for (int i = 0; i < 4; i++)
		if (!strcasecmp(s, names[i])) {
			*out = (enum log_level)i;
			return 0;
		}
	if (!strcasecmp(s, "warning")) {
		*out = LOG_WARN;
		return 0;
	}
	return -1;
}

const char *log_level_name(enum log_level level)
{
	return level >= LOG_ERROR && level <= LOG_DEBUG ? names[level] : "?";
}

int log_enabled(enum log_level level)
{
	return (int)level <= atomic_load(&g_level);
}

/* Whether stderr is the journal: systemd sets JOURNAL_STREAM to "DEVICE:INODE" of the stream. */
static int to_journal(void)
{
	int j = atomic_load(&g_journal);
	if (j < 0) {
		j = getenv("JOURNAL_STREAM") != NULL;
		atomic_store(&g_journal, j);
	}
	return j;
}

void log_msg(enum log_level level, const char *fmt, ...)
{
	if (!log_enabled(level))
		return;
	char msg[2048];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	size_t n = strlen(msg);
	while (n && msg[n - 1] == '\n')
		msg[--n] = '\0';
	int l = level < LOG_ERROR ? LOG_ERROR : level > LOG_DEBUG ? LOG_DEBUG : level;
	fprintf(stderr, "%s%s: %s: %s\n", to_journal() ? prefixes[l] : "", g_prog, names[l], msg);
}
