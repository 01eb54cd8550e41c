/* Tests common/conffile.c: `key = value` lines become `--key value` pairs with their line
 * numbers; comments, blank lines and spaces are dropped; a line without '=', a nested `config`
 * and an over-long line are refused naming the file and line. */
#include "test_util.h"

#include <errno.h>

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

int main(void)
{
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	close(fd);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_pairs),
		cmocka_unit_test(test_refused),
	};
	int r = cmocka_run_group_tests(tests, NULL, NULL);
	unlink(path);
	return r;
}
