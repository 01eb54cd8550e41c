/* version — see version.h. */
#include "version.h"

#include <string.h>

#include "version_info.h"

void fkv_version_print(FILE *f, const char *prog)
{
	fprintf(f, "%s (freekv) %s\ncommit %s\nbuild %s, CUDA %s\n", prog, FREEKV_VERSION,
		FREEKV_COMMIT, FREEKV_BUILD_TYPE, !strcmp(FREEKV_CUDA_BUILT, "ON") ? "on" : "off");
}

const char *fkv_build_id(void)
{
	return FREEKV_VERSION " " FREEKV_COMMIT;
}

int fkv_version_asked(int argc, char **argv)
{
	for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
		if (!strcmp(argv[i], "--version"))
			return 1;
	return 0;
}
