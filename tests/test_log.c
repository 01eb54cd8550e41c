/* Tests common/log.c: level names both ways, lines above the level dropped, the line format
 * ("PROG: LEVEL: message", one trailing newline), and the sd-daemon priority prefix when stderr
 * is the journal (JOURNAL_STREAM set). */
#include "test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "log.h"

/* Runs fn with stderr sent to a temporary file; returns what it wrote (static buffer). */
static const char *captured(void (*fn)(void))
{
	static char buf[4096];
	char path[] = "/tmp/fkv-log-XXXXXX";
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	fflush(stderr);
	int saved = dup(2);
	assert_true(dup2(fd, 2) >= 0);
	fn();
	fflush(stderr);
	assert_true(dup2(saved, 2) >= 0);
	close(saved);
	ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
	assert_true(n >= 0);
	buf[n] = '\0';
	close(fd);
	unlink(path);
	return buf;
}

static void lines(void)
{
	log_error("disk %s failed", "nvme0");
	log_warn("slow\n");
	log_info("started");
	log_debug("detail %d", 7);
}

static void test_levels_and_format(void **state)
{
	(void)state;
	unsetenv("JOURNAL_STREAM");
	log_init("kvtest", LOG_INFO);
	assert_string_equal(captured(lines), "kvtest: error: disk nvme0 failed\nkvtest: warn: slow\n"
					     "kvtest: info: started\n");
	log_set_level(LOG_ERROR);
	assert_string_equal(captured(lines), "kvtest: error: disk nvme0 failed\n");
	log_set_level(LOG_DEBUG);
	assert_true(log_enabled(LOG_DEBUG));
	assert_non_null(strstr(captured(lines), "kvtest: debug: detail 7\n"));
	setenv("JOURNAL_STREAM", "8:12345", 1);
	log_init("kvtest", LOG_WARN);
	assert_string_equal(captured(lines), "<3>kvtest: error: disk nvme0 failed\n<4>kvtest: warn: slow\n");
	unsetenv("JOURNAL_STREAM");
}

static void test_parse(void **state)
{
	(void)state;
	enum log_level l;
	assert_int_equal(log_parse_level("debug", &l), 0);
	assert_int_equal(l, LOG_DEBUG);
	assert_int_equal(log_parse_level("WARNING", &l), 0);
	assert_int_equal(l, LOG_WARN);
	assert_int_equal(log_parse_level("Error", &l), 0);
	assert_int_equal(l, LOG_ERROR);
	assert_int_equal(log_parse_level("loud", &l), -1);
	assert_string_equal(log_level_name(LOG_INFO), "info");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_levels_and_format),
		cmocka_unit_test(test_parse),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
