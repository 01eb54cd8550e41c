/* cmd_common — see cmd_common.h. */
#include "cmd_common.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tokenizer.h"

int cmd_parse_long(const char *s, long lo, long hi, long *out)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi)
		return -EINVAL;
	*out = v;
	return 0;
}

int cmd_parse_float(const char *s, double lo, double hi, double *out)
{
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || end == s || *end || isnan(v) || v < lo || v > hi)
		return -EINVAL;
	*out = v;
	return 0;
}

int cmd_parse_u64(const char *s, uint64_t *out)
{
	char *end;
	errno = 0;
	if (*s == '-')
		return -EINVAL;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || end == s || *end)
		return -EINVAL;
	*out = v;
	return 0;
}

int cmd_read_text(const char *path, char **out)
{
	FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
	if (!f)
		return -errno;
	size_t cap = 4096, len = 0;
	char *buf = malloc(cap);
	int ret = 0;
	while (buf) {
		if (len + 1 >= cap) {
			char *nb = realloc(buf, cap * 2);
			if (!nb)
				break;
			buf = nb;
			cap *= 2;
		}
		size_t got = fread(buf + len, 1, cap - len - 1, f);
		len += got;
		if (got == 0)
			break;
	}
	if (!buf || ferror(f) || len + 1 >= cap)
		ret = buf && ferror(f) ? -EIO : -ENOMEM;
	if (f != stdin)
		fclose(f);
	if (ret) {
		free(buf);
		return ret;
	}
	buf[len] = '\0';
	*out = buf;
	return 0;
}

int cmd_load(const char *path, struct fkv_model *m, struct fkv_tokenizer **tok)
{
	char err[1024];
	int ret = model_load(path, m, err, sizeof err);
	if (ret) {
		fprintf(stderr, "kvworker: cannot load model %s: %s\n", path, err);
		return ret;
	}
	ret = tokenizer_load(m, tok, err, sizeof err);
	if (ret) {
		fprintf(stderr, "kvworker: cannot load the tokenizer of %s: %s\n", path, err);
		model_free(m);
		return ret;
	}
	return 0;
}

double cmd_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}
