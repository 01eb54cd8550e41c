/* conffile — the one reader of `key = value` files: '#' starts a comment, blank lines are
 * skipped, and each line becomes the pair `--key value`. kvworker serve and kvgate put each pair
 * through their getopt_long table (conffile_getopt), so a file and a command line are one option
 * parser; kvstored gives the keys its typed table (config.c). A file may not name another
 * (`config = ...` is refused).
 *
 * Ownership: conffile_read fills struct conffile with one allocation holding every string; the
 * pairs stay valid until conffile_free, so options may keep pointing into them. */
#ifndef FREEKV_CONFFILE_H
#define FREEKV_CONFFILE_H

#include <stddef.h>

struct conffile {
	char **argv;	/* (2 * n): "--key", "value", ... */
	int *line;	/* (n): the line each pair came from */
	int n;
	char *store;
};

/* 0, or -errno with "PATH:LINE: what" (or "PATH: what") in err. */
int conffile_read(const char *path, struct conffile *cf, char *err, size_t errlen);

struct option;
/* Pair k through a program's getopt_long table, as the argv { prog, "--key", "value" }: the
 * option's val, with *arg its value; 0 when the key names no option of opts (or help-like ones
 * the caller refuses itself); -1 when the option takes no value, which a line always gives. */
int conffile_getopt(const struct conffile *cf, int k, const struct option *opts, const char **arg);
void conffile_free(struct conffile *cf);

#endif
