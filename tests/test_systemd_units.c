/* Tests systemd/ (the units as configured for this build's install prefix, from the *.service.in
 * templates): `systemd-analyze verify` accepts kvstored.service and kvworker@.service with
 * no warning at all (unknown keys and bad values are only warnings to systemd, errors here;
 * skipped without systemd-analyze), and every directive is preceded by a comment line.
 * ExecStart= binaries are pointed at the build tree (kvgate.service too). The default kvstored.conf is accepted by
 * kvstored --print-config; kvworker@.service's own ExecStart= command line, with %i = 0 and the
 * default kvworker.conf, is accepted by kvworker serve --print-config and yields the settings it
 * promises (the model from the file, the store and GPU from the command line). */
#include "test_util.h"

#include <stdbool.h>
#include <sys/stat.h>
#include <sys/wait.h>

static char dir[64];

static void copy_unit(const char *name, const char *from, const char *to, const char *as)
{
	char src[1024], dst[1024], line[2048];
	snprintf(src, sizeof src, "%s/systemd/%s", FREEKV_BUILD_DIR, name); /* configured */
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

static bool have_analyze;

static void test_verify(void **state)
{
	(void)state;
	if (!have_analyze) {
		fprintf(stderr, "skip: systemd-analyze not found\n");
		skip();
	}
	char kvstored[1024], kvworker[1024], kvgate[1024];
	snprintf(kvgate, sizeof kvgate, "%s/gate/kvgate", FREEKV_BUILD_DIR);
	snprintf(kvstored, sizeof kvstored, "%s/kvstore/kvstored", FREEKV_BUILD_DIR);
	snprintf(kvworker, sizeof kvworker, "%s/worker/kvworker", FREEKV_BUILD_DIR);
	copy_unit("kvstored.service", FREEKV_INSTALL_SBINDIR "/kvstored", kvstored,
		  "kvstored.service");
	copy_unit("kvworker@.service", FREEKV_INSTALL_BINDIR "/kvworker", kvworker,
		  "kvworker@.service");
	copy_unit("kvgate.service", FREEKV_INSTALL_BINDIR "/kvgate", kvgate, "kvgate.service");
	verify("kvstored.service");
	verify("kvworker@0.service");
	verify("kvgate.service");
}

static void test_every_directive_commented(void **state)
{
	(void)state;
	static const char *const units[] = { "kvstored.service.in", "kvworker@.service.in",
					     "kvgate.service.in" };
	for (size_t u = 0; u < 3; u++) {
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

/* Replaces every occurrence of from in s (of capacity cap) by to; false when it does not fit. */
static bool replace_all(char *s, size_t cap, const char *from, const char *to)
{
	char out[4096];
	size_t n = 0, fl = strlen(from), tl = strlen(to);
	for (const char *p = s; *p;) {
		if (!strncmp(p, from, fl)) {
			if (n + tl >= sizeof out)
				return false;
			memcpy(out + n, to, tl);
			n += tl;
			p += fl;
		} else {
			if (n + 1 >= sizeof out)
				return false;
			out[n++] = *p++;
		}
	}
	out[n] = '\0';
	if (n >= cap)
		return false;
	memcpy(s, out, n + 1);
	return true;
}

static void test_worker_command_line(void **state)
{
	(void)state;
	char path[1024], line[4096], cmd[4200], out[4096], kvworker[1024], conf[1024];
	snprintf(path, sizeof path, "%s/systemd/kvworker@.service", FREEKV_BUILD_DIR);
	snprintf(kvworker, sizeof kvworker, "%s/worker/kvworker", FREEKV_BUILD_DIR);
	snprintf(conf, sizeof conf, "%s/systemd/kvworker.conf", FREEKV_SOURCE_DIR);
	FILE *f = fopen(path, "r");
	assert_non_null(f);
	bool found = false, notify = false;
	while (fgets(line, sizeof line, f)) {
		if (!strcmp(line, "Type=notify\n"))
			notify = true;
		if (!strncmp(line, "ExecStart=", 10)) {
			found = true;
			break;
		}
	}
	fclose(f);
	assert_true(found);
	assert_true(notify);
	line[strcspn(line, "\n")] = '\0';
	char *exec = line + 10;
	assert_true(replace_all(exec, sizeof line - 10, FREEKV_INSTALL_BINDIR "/kvworker", kvworker));
	assert_true(replace_all(exec, sizeof line - 10, "%i", "0"));
	assert_true(replace_all(exec, sizeof line - 10, FREEKV_INSTALL_CONFDIR "/kvworker.conf", conf));
	snprintf(cmd, sizeof cmd, "%s --print-config 2>&1", exec);
	FILE *p = popen(cmd, "r");
	assert_non_null(p);
	size_t n = fread(out, 1, sizeof out - 1, p);
	out[n] = '\0';
	int st = pclose(p);
	fprintf(stderr, "%s\n%s", cmd, out);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	assert_non_null(strstr(out, "model = /var/lib/freekv/models/model.gguf\n"));
	assert_non_null(strstr(out, "store = ipc:///run/freekv/kvstored.sock\n"));
	assert_non_null(strstr(out, "listen = ipc:///run/freekv/kvworker-0.sock\n"));
	assert_non_null(strstr(out, "gpu = 0\n"));
	assert_non_null(strstr(out, "policy = freekv\n"));
	assert_non_null(strstr(out, "backend = auto\n"));
	/* The same binary refuses a config key it does not know (the parser is not a no-op). */
	snprintf(path, sizeof path, "%s/bad.conf", dir);
	f = fopen(path, "w");
	assert_non_null(f);
	fprintf(f, "model = /m.gguf\nno-such-key = 1\n");
	fclose(f);
	snprintf(cmd, sizeof cmd, "%s serve --config %s --print-config >/dev/null 2>&1", kvworker,
		 path);
	st = system(cmd);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 2);
	snprintf(cmd, sizeof cmd, "%s serve --help >/dev/null", kvworker);
	st = system(cmd);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
}

int main(void)
{
	have_analyze = system("command -v systemd-analyze >/dev/null 2>&1") == 0;
	strcpy(dir, "/tmp/fkv-units-XXXXXX");
	if (!mkdtemp(dir))
		return 1;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_verify),
		cmocka_unit_test(test_every_directive_commented),
		cmocka_unit_test(test_default_conf),
		cmocka_unit_test(test_worker_command_line),
	};
	int rc = cmocka_run_group_tests(tests, NULL, NULL);
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", dir);
	return rc;
}
