/* errmsg — how fallible functions hand a human-readable reason to their caller.
 *
 * Functions that can fail take (char *err, size_t errlen) beside returning 0 or -errno; these
 * helpers format the message into that caller-owned buffer (which may be NULL or empty: then
 * nothing is written). Shared by kvstored, the client library and kvworker. */
#ifndef FREEKV_ERRMSG_H
#define FREEKV_ERRMSG_H

#include <stddef.h>

/* Formats the message and returns ret, so a failure path reads
 * `return errmsg(err, errlen, -EINVAL, "bad %s", what);`. */
int errmsg(char *err, size_t errlen, int ret, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

/* Formats the message only. */
void errmsg_set(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

#endif
