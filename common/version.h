/* version — what every binary prints for --version (exit 0): the release, the commit it was built
 * from, the build type and whether the CUDA backend is built in. The header with the values is
 * generated at build time (cmake/version.cmake). */
#ifndef FREEKV_VERSION_H
#define FREEKV_VERSION_H

#include <stdio.h>

/* "PROG (freekv) 0.1.0\ncommit ...\nbuild TYPE, CUDA on|off\n" on f. */
void fkv_version_print(FILE *f, const char *prog);
/* "VERSION COMMIT": what identifies this build's code (prefix-sharing keys include it). */
const char *fkv_build_id(void);
/* Whether argv holds --version before any "--" (then the caller prints and exits 0). */
int fkv_version_asked(int argc, char **argv);

#endif
