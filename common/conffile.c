/* conffile — `key = value` files as flag pairs. See conffile.h. */
#include "conffile.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errmsg.h"

#define LINE_MAX_BYTES 4096

static char *trim(char *s)
{
	while (*s == ' ' || *s == '\t')
		s++;
	char *e = s + strlen(s);
	while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\n' || e[-1] == '\r'))
		*--e = '\0';
	return s;
}

/* Appends s to the store; returns its offset, or -1 when out of memory. */
static long keep(struct conffile *cf, size_t *len, size_t *cap, const char *s)
{
	size_t n = strlen(s) + 1;
	if (*len + n > *cap) {
		size_t c = *cap ? *cap * 2 : 4096;
		while (c < *len + n)
			c *= 2;
		char *st = realloc(cf->store, c);
		if (!st)
			return -1;
		cf->store = st;
		*cap = c;
	}
	memcpy(cf->store + *len, s, n);
	*len += n;
	return (long)(*len - n);
}

int conffile_read(const char *path, struct conffile *cf, char *err, size_t errlen)
{
	memset(cf, 0, sizeof *cf);
	FILE *f = fopen(path, "r");
	if (!f)
		return errmsg(err, errlen, -errno, "%s: %s", path, strerror(errno));
	char line[LINE_MAX_BYTES];
	size_t len = 0, cap = 0;
	long *offs = NULL; /* offsets into the store until it stops moving */
	int lineno = 0, ret = 0, n = 0;
	while (!ret && fgets(line, sizeof line, f)) {
		++lineno;
		if (!strchr(line, '\n') && !feof(f)) {
			ret = errmsg(err, errlen, -EINVAL, "%s:%d: line too long", path, lineno);
			break;
		}
		char *hash = strchr(line, '#');
		if (hash)
			*hash = '\0';
		char *s = trim(line), *eq = strchr(s, '=');
		if (!*s)
			continue;
		if (!eq) {
			ret = errmsg(err, errlen, -EINVAL, "%s:%d: expected 'key = value'", path, lineno);
			break;
		}
		*eq = '\0';
		char *key = trim(s), *val = trim(eq + 1), flag[LINE_MAX_BYTES + 2];
		if (!strcmp(key, "config")) {
			ret = errmsg(err, errlen, -EINVAL, "%s:%d: a config file cannot name another",
				     path, lineno);
			break;
		}
		snprintf(flag, sizeof flag, "--%s", key);
		long *o2 = realloc(offs, (size_t)(n + 1) * 2 * sizeof *o2);
		int *l2 = realloc(cf->line, (size_t)(n + 1) * sizeof *l2);
		if (o2)
			offs = o2;
		if (l2)
			cf->line = l2;
		long a = o2 && l2 ? keep(cf, &len, &cap, flag) : -1;
		long b = a < 0 ? -1 : keep(cf, &len, &cap, val);
		if (b < 0) {
			ret = errmsg(err, errlen, -ENOMEM, "%s: out of memory", path);
			break;
		}
		offs[2 * n] = a;
		offs[2 * n + 1] = b;
		cf->line[n++] = lineno;
	}
	fclose(f);
	if (!ret && n && !(cf->argv = malloc((size_t)n * 2 * sizeof *cf->argv)))
		ret = errmsg(err, errlen, -ENOMEM, "%s: out of memory", path);
	for (int i = 0; !ret && i < 2 * n; i++)
		cf->argv[i] = cf->store + offs[i];
	free(offs);
	cf->n = ret ? 0 : n;
	if (ret)
		conffile_free(cf);
	return ret;
}

void conffile_free(struct conffile *cf)
{
	free(cf->argv);
	free(cf->line);
	free(cf->store);
	memset(cf, 0, sizeof *cf);
}

int conffile_getopt(const struct conffile *cf, int k, const struct option *opts, const char **arg)
{
	char *av[4] = { "conffile", cf->argv[2 * k], cf->argv[2 * k + 1], NULL };
	optind = 0;
	opterr = 0;
	int c = getopt_long(3, av, ":", opts, NULL);
	*arg = optarg;
	if (c == '?' || c == ':' || c == -1)
		return 0;
	return optind == 3 ? c : -1;
}
