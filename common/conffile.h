/* conffile — reading a `key = value` file as command-line flags, for the programs whose
 * settings are flags (kvworker serve, kvgate): '#' starts a comment, blank lines are skipped, and
 * each line becomes the pair `--key value`, so a file and a command line go through one option
 * parser. A file may not name another (`config = ...` is refused).
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
void conffile_free(struct conffile *cf);

#endif
