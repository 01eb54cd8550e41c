/* log — the one logger of the long-lived processes (kvstored, kvworker serve, kvgate): leveled
 * lines on stderr, "PROG: LEVEL: message". Under systemd (JOURNAL_STREAM names stderr) each line
 * starts with the sd-daemon priority prefix ("<3>" error, "<4>" warning, "<6>" info, "<7>"
 * debug), so `journalctl -p warning` filters them. Lines above the level set are dropped; the
 * default level is info. Thread-safe: one fprintf per line (stdio locks the stream), the level is
 * an atomic.
 *
 * Usage errors and the output a command prints for its user (tables, ids, JSON) are not logs:
 * they stay plain stdout/stderr writes. */
#ifndef FREEKV_LOG_H
#define FREEKV_LOG_H

enum log_level { LOG_ERROR = 0, LOG_WARN = 1, LOG_INFO = 2, LOG_DEBUG = 3 };

/* Names the process in every line (a static string) and sets the level. */
void log_init(const char *prog, enum log_level level);
void log_set_level(enum log_level level);
enum log_level log_get_level(void);
/* "error", "warn" (or "warning"), "info", "debug" -> *out; -1 for anything else. */
int log_parse_level(const char *s, enum log_level *out);
const char *log_level_name(enum log_level level);
/* Whether a line at level would be written (to skip building an expensive message). */
int log_enabled(enum log_level level);

void log_msg(enum log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_error(...) log_msg(LOG_ERROR, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_WARN, __VA_ARGS__)
#define log_info(...) log_msg(LOG_INFO, __VA_ARGS__)
#define log_debug(...) log_msg(LOG_DEBUG, __VA_ARGS__)

#endif
