/* errmsg — see errmsg.h. */
#include "errmsg.h"

#include <stdarg.h>
#include <stdio.h>

static void errmsg_vset(char *err, size_t errlen, const char *fmt, va_list ap)
{
	if (err && errlen)
		vsnprintf(err, errlen, fmt, ap);
}

int errmsg(char *err, size_t errlen, int ret, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	errmsg_vset(err, errlen, fmt, ap);
	va_end(ap);
	return ret;
}

void errmsg_set(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	errmsg_vset(err, errlen, fmt, ap);
	va_end(ap);
}
