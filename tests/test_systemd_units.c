/* Tests systemd/: `systemd-analyze verify` accepts kvstored.service and kvworker@.service with
 * no warning at all (unknown keys and bad values are only warnings to systemd, errors here), and
 * every directive is preceded by a comment line. ExecStart= binaries are pointed at the build
 * tree (kvworker's serve mode does not exist yet: /bin/true stands in). The default
 * kvstored.conf is accepted by kvstored --print-config. Skips (77) without systemd-analyze. */
#include "test_util.h"

#include <stdbool.h>
#include <sys/stat.h>
#include <sys/wait.h>

static char dir[64];

static void copy_unit(const char *name, const char *from, const char *to, const char *as)
{
	char src[1024], dst[1024], line[2048];
	snprintf(src, sizeof src, "%s/systemd/%s", FREEKV_SOURCE_DIR, name);
	snprintf(dst, sizeof dst, "%s/%s", dir, as);
	FILE *in = fopen(src, "r"), *out = fopen(dst, "w");
	assert_non_null(in);
	assert_non_null(out);
	while (fgets(line, sizeof line, in)) {
		char *p = strstr(line, from);
		if (p && !strncmp(line, "ExecStart=", 10)) {
			*p = '\0';
			fprintf(out, "%s%s%s", line, to, p + strlen(from));
		} else {
			fputs(line, out);
		}
	}
	fclose(in);
	fclose(out);
}

static void verify(const char *unit)
{
	char cmd[2048], buf[4096];
	snprintf(cmd, sizeof cmd, "cd %s && systemd-analyze verify --man=no ./%s 2>&1", dir, unit);
	FILE *p = popen(cmd, "r");
	assert_non_null(p);
	size_t n = fread(buf, 1, sizeof buf - 1, p);
	buf[n] = '\0';
	int st = pclose(p);
	if (n)
		fprintf(stderr, "%s: %s", unit, buf);
	assert_int_equal(WEXITSTATUS(st), 0);
	assert_int_equal(n, 0);
}

static void test_verify(void **state)
{
	(void)state;
	char kvstored[1024];
	snprintf(kvstored, sizeof kvstored, "%s/kvstore/kvstored", FREEKV_BUILD_DIR);
	copy_unit("kvstored.service", "/usr/sbin/kvstored", kvstored, "kvstored.service");
	copy_unit("kvworker@.service", "/usr/bin/kvworker", "/bin/true", "kvworker@.service");
	verify("kvstored.service");
	verify("kvworker@0.service");
}

static void test_every_directive_commented(void **state)
{
	(void)state;
	static const char *const units[] = { "kvstored.service", "kvworker@.service" };
	for (size_t u = 0; u < 2; u++) {
		char path[1024], line[2048];
		bool prev_comment = false;
		snprintf(path, sizeof path, "%s/systemd/%s", FREEKV_SOURCE_DIR, units[u]);
		FILE *f = fopen(path, "r");
		assert_non_null(f);
		int lineno = 0;
		while (fgets(line, sizeof line, f)) {
			lineno++;
			bool directive = strchr(line, '=') && line[0] != '#' && line[0] != '[';
			if (directive && !prev_comment) {
				fprintf(stderr, "%s:%d: directive without a comment: %s", units[u], lineno, line);
				fail();
			}
			prev_comment = line[0] == '#';
		}
		fclose(f);
	}
}

static void test_default_conf(void **state)
{
	(void)state;
	char cmd[2048];
	snprintf(cmd, sizeof cmd, "%s/kvstore/kvstored --config %s/systemd/kvstored.conf --print-config >/dev/null",
		 FREEKV_BUILD_DIR, FREEKV_SOURCE_DIR);
	int st = system(cmd);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
}

int main(void)
{
	if (system("command -v systemd-analyze >/dev/null 2>&1") != 0) {
		fprintf(stderr, "skip: systemd-analyze not found\n");
		return TEST_SKIP_EXIT;
	}
	strcpy(dir, "/tmp/fkv-units-XXXXXX");
	if (!mkdtemp(dir))
		return 1;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_verify),
		cmocka_unit_test(test_every_directive_commented),
		cmocka_unit_test(test_default_conf),
	};
	int rc = cmocka_run_group_tests(tests, NULL, NULL);
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", dir);
	return rc;
}
