/* Tests common/conffile.c: `key = value` lines become `--key value` pairs with their line
 * numbers; comments, blank lines and spaces are dropped; a line without '=', a nested `config`
 * and an over-long line are refused naming the file and line; conffile_getopt reads a pair
 * through a getopt_long table. */
#include "test_util.h"

#include <errno.h>
#include <getopt.h>

#include "conffile.h"

static char path[] = "/tmp/fkv-conffile-XXXXXX";

static void write_conf(const char *text)
{
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

static void test_pairs(void **state)
{
	(void)state;
	struct conffile cf;
	char err[256];
	write_conf("# a comment\n\n  max-seqs = 8   # trailing\nlisten=tcp://127.0.0.1:5\n"
		   "\tmodel =  /m/a b.gguf\r\n");
	assert_int_equal(conffile_read(path, &cf, err, sizeof err), 0);
	assert_int_equal(cf.n, 3);
	assert_string_equal(cf.argv[0], "--max-seqs");
	assert_string_equal(cf.argv[1], "8");
	assert_int_equal(cf.line[0], 3);
	assert_string_equal(cf.argv[2], "--listen");
	assert_string_equal(cf.argv[3], "tcp://127.0.0.1:5");
	assert_string_equal(cf.argv[4], "--model");
	assert_string_equal(cf.argv[5], "/m/a b.gguf");
	assert_int_equal(cf.line[2], 5);
	conffile_free(&cf);
}

static void test_refused(void **state)
{
	(void)state;
	struct conffile cf;
	char err[256];
	write_conf("a = 1\nno equals sign\n");
	assert_int_equal(conffile_read(path, &cf, err, sizeof err), -EINVAL);
	assert_non_null(strstr(err, ":2: expected 'key = value'"));
	assert_int_equal(cf.n, 0);
	write_conf("config = /etc/other.conf\n");
	assert_int_equal(conffile_read(path, &cf, err, sizeof err), -EINVAL);
	assert_non_null(strstr(err, "cannot name another"));
	char big[6000];
	memset(big, 'x', sizeof big - 2);
	big[0] = 'k', big[1] = '=';
	big[sizeof big - 2] = '\n', big[sizeof big - 1] = '\0';
	write_conf(big);
	assert_int_equal(conffile_read(path, &cf, err, sizeof err), -EINVAL);
	assert_non_null(strstr(err, ":1: line too long"));
	assert_int_equal(conffile_read("/nonexistent/x.conf", &cf, err, sizeof err), -ENOENT);
	assert_non_null(strstr(err, "/nonexistent/x.conf"));
}

/* Each pair through a program's option table: the option's val and the line's value; 0 for a
 * key that is no option; -1 for an option that takes no value (a line always gives one). */
static void test_getopt(void **state)
{
	(void)state;
	static const struct option opts[] = {
		{ "max-seqs", required_argument, NULL, 300 },
		{ "listen", required_argument, NULL, 'l' },
		{ "debug", no_argument, NULL, 301 },
		{ 0, 0, 0, 0 },
	};
	struct conffile cf;
	char err[256];
	write_conf("max-seqs = 8\nlisten = ipc:///x\ndebug = true\nbogus = 1\n");
	assert_int_equal(conffile_read(path, &cf, err, sizeof err), 0);
	const char *v;
	assert_int_equal(conffile_getopt(&cf, 0, opts, &v), 300);
	assert_string_equal(v, "8");
	assert_int_equal(conffile_getopt(&cf, 1, opts, &v), 'l');
	assert_string_equal(v, "ipc:///x");
	assert_int_equal(conffile_getopt(&cf, 2, opts, &v), -1);
	assert_int_equal(conffile_getopt(&cf, 3, opts, &v), 0);
	conffile_free(&cf);
}

int main(void)
{
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	close(fd);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_pairs),
		cmocka_unit_test(test_refused),
		cmocka_unit_test(test_getopt),
	};
	int r = cmocka_run_group_tests(tests, NULL, NULL);
	unlink(path);
	return r;
}
