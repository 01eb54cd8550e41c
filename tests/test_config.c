/* Tests kvstore/daemon/config.c: defaults, typed parsing with bounds, K/M/G suffixes, the config file
 * parser (comments, errors naming the line), run-time-only reloads, cross-key validation, and
 * that --print-config output reads back to the same configuration. */
#include "test_util.h"

#include <errno.h>

#include "config.h"

static void test_defaults(void **state)
{
	(void)state;
	struct cfg c;
	char err[CFG_ERR_MAX];
	cfg_defaults(&c);
	assert_string_equal(c.endpoint, "ipc:///run/freekv/kvstored.sock");
	assert_int_equal(c.dram_bytes, 1ull << 30);
	assert_true(c.lock_memory);
	assert_int_equal(c.log_level, CFG_LOG_INFO);
	assert_int_equal(cfg_validate(&c, err, sizeof err), 0);
}

static void test_bytes_suffixes(void **state)
{
	(void)state;
	uint64_t v;
	assert_int_equal(cfg_parse_bytes("4096", &v), 0);
	assert_int_equal(v, 4096);
	assert_int_equal(cfg_parse_bytes("2K", &v), 0);
	assert_int_equal(v, 2048);
	assert_int_equal(cfg_parse_bytes("3M", &v), 0);
	assert_int_equal(v, 3ull << 20);
	assert_int_equal(cfg_parse_bytes("64G", &v), 0);
	assert_int_equal(v, 64ull << 30);
	assert_int_equal(cfg_parse_bytes("1GiB", &v), 0);
	assert_int_equal(v, 1ull << 30);
	assert_int_equal(cfg_parse_bytes("1X", &v), -EINVAL);
	assert_int_equal(cfg_parse_bytes("-1", &v), -EINVAL);
	assert_int_equal(cfg_parse_bytes("", &v), -EINVAL);
	assert_int_equal(cfg_parse_bytes("99999999999T", &v), -ERANGE);
}

static void test_set_types_and_bounds(void **state)
{
	(void)state;
	struct cfg c;
	char err[CFG_ERR_MAX];
	cfg_defaults(&c);
	assert_int_equal(cfg_set(&c, "dram_bytes", "512M", false, err, sizeof err), 0);
	assert_int_equal(c.dram_bytes, 512ull << 20);
	assert_int_equal(cfg_set(&c, "dram_bytes", "1K", false, err, sizeof err), -EINVAL);
	assert_non_null(strstr(err, "dram_bytes"));
	assert_int_equal(c.dram_bytes, 512ull << 20); /* unchanged on error */
	/* The table's lower bound is the real one: one 2 MiB slab unit (the daemon refused 1M at
	 * start although the key accepted it). */
	assert_int_equal(cfg_set(&c, "dram_bytes", "1M", false, err, sizeof err), -EINVAL);
	assert_non_null(strstr(err, "dram_bytes"));
	assert_int_equal(cfg_set(&c, "dram_bytes", "2M", false, err, sizeof err), 0);
	assert_int_equal(c.dram_bytes, 2ull << 20);
	assert_int_equal(cfg_set(&c, "lock_memory", "false", false, err, sizeof err), 0);
	assert_false(c.lock_memory);
	assert_int_equal(cfg_set(&c, "lock_memory", "maybe", false, err, sizeof err), -EINVAL);
	assert_int_equal(cfg_set(&c, "log_level", "debug", false, err, sizeof err), 0);
	assert_int_equal(c.log_level, CFG_LOG_DEBUG);
	assert_int_equal(cfg_set(&c, "log_level", "loud", false, err, sizeof err), -EINVAL);
	assert_int_equal(cfg_set(&c, "heartbeat_timeout_ms", "12abc", false, err, sizeof err), -EINVAL);
	assert_int_equal(cfg_set(&c, "heartbeat_timeout_ms", "5", false, err, sizeof err), -EINVAL);
	assert_int_equal(cfg_set(&c, "no_such_key", "1", false, err, sizeof err), -ENOENT);
	assert_non_null(strstr(err, "no_such_key"));
	assert_int_equal(cfg_set(&c, "ring_entries", "1000", false, err, sizeof err), 0);
	assert_int_equal(cfg_validate(&c, err, sizeof err), -EINVAL); /* not a power of two */
	assert_int_equal(cfg_set(&c, "ring_entries", "512", false, err, sizeof err), 0);
	char buf[CFG_STR_MAX];
	assert_int_equal(cfg_get(&c, "ring_entries", buf, sizeof buf), 0);
	assert_string_equal(buf, "512");
	assert_int_equal(cfg_get(&c, "nope", buf, sizeof buf), -ENOENT);
}

static void test_runtime_flag(void **state)
{
	(void)state;
	struct cfg c;
	char err[CFG_ERR_MAX];
	cfg_defaults(&c);
	assert_int_equal(cfg_set(&c, "dram_bytes", "2G", true, err, sizeof err), -EPERM);
	assert_int_equal(cfg_set(&c, "heartbeat_timeout_ms", "800", true, err, sizeof err), 0);
	assert_int_equal(c.heartbeat_timeout_ms, 800);
}

static void test_endpoint_and_watermarks(void **state)
{
	(void)state;
	struct cfg c;
	char err[CFG_ERR_MAX];
	static const char *const ok[] = { "tcp://127.0.0.1:5555", "tcp://[::1]:5555", "tcp://localhost:1",
					  "ipc:///run/x.sock" };
	static const char *const bad[] = { "tcp://0.0.0.0:5555", "tcp://10.1.2.3:5555", "inproc://x", "ipc://" };
	for (size_t i = 0; i < 4; i++) {
		cfg_defaults(&c);
		assert_int_equal(cfg_set(&c, "endpoint", ok[i], false, err, sizeof err), 0);
		if (i < 3) {
			/* tcp needs a token file or an explicit tcp_insecure (docs/design.md §4 "Access"). */
			assert_int_equal(cfg_validate(&c, err, sizeof err), -EINVAL);
			assert_non_null(strstr(err, "auth_token_file"));
			assert_int_equal(cfg_set(&c, "tcp_insecure", "true", false, err, sizeof err), 0);
		}
		assert_int_equal(cfg_validate(&c, err, sizeof err), 0);
		cfg_defaults(&c);
		assert_int_equal(cfg_set(&c, "endpoint", bad[i], false, err, sizeof err), 0);
		assert_int_equal(cfg_validate(&c, err, sizeof err), -EINVAL);
		assert_non_null(strstr(err, "endpoint"));
	}
	/* Start-up: --set order does not matter, the result is validated once. */
	cfg_defaults(&c);
	assert_int_equal(cfg_set_arg(&c, "dram_high_watermark=60", err, sizeof err), 0);
	assert_int_equal(cfg_set_arg(&c, "dram_low_watermark=40", err, sizeof err), 0);
	assert_int_equal(cfg_validate(&c, err, sizeof err), 0);
	assert_int_equal(cfg_set_arg(&c, "dram_low_watermark=70", err, sizeof err), 0);
	assert_int_equal(cfg_validate(&c, err, sizeof err), -EINVAL);
	assert_non_null(strstr(err, "dram_high_watermark"));
	/* Run time: each change must leave a valid configuration, else nothing changes. */
	cfg_defaults(&c);
	assert_int_equal(cfg_set(&c, "dram_low_watermark", "95", true, err, sizeof err), -EINVAL);
	assert_int_equal(c.dram_low_watermark, 75);
	cfg_defaults(&c);
	assert_int_equal(cfg_set(&c, "shm_name", "no-slash", false, err, sizeof err), 0);
	assert_int_equal(cfg_validate(&c, err, sizeof err), -EINVAL);
}

static char *write_tmp(const char *text)
{
	static char path[] = "/tmp/freekv-test-config-XXXXXX";
	strcpy(path, "/tmp/freekv-test-config-XXXXXX");
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	close(fd);
	return path;
}

static void test_file(void **state)
{
	(void)state;
	struct cfg c;
	char err[CFG_ERR_MAX];
	cfg_defaults(&c);
	char *p = write_tmp("# a comment\n\n  dram_bytes = 256M   # trailing comment\n"
			    "lock_memory=false\nshm_name = /fkv-test\n");
	assert_int_equal(cfg_load_file(&c, p, false, err, sizeof err), 0);
	assert_int_equal(c.dram_bytes, 256ull << 20);
	assert_false(c.lock_memory);
	assert_string_equal(c.shm_name, "/fkv-test");
	unlink(p);

	struct cfg before = c;
	p = write_tmp("dram_bytes = 128M\nbogus line\n");
	assert_int_equal(cfg_load_file(&c, p, false, err, sizeof err), -EINVAL);
	assert_non_null(strstr(err, ":2:"));
	assert_memory_equal(&c, &before, sizeof c); /* nothing applied */
	unlink(p);

	p = write_tmp("wat = 1\n");
	assert_int_equal(cfg_load_file(&c, p, false, err, sizeof err), -ENOENT);
	unlink(p);
	assert_int_equal(cfg_load_file(&c, "/nonexistent/freekv.conf", false, err, sizeof err), -ENOENT);

	/* A reload applies run-time keys only. */
	p = write_tmp("dram_bytes = 128M\nheartbeat_timeout_ms = 1234\n");
	assert_int_equal(cfg_load_file(&c, p, true, err, sizeof err), 0);
	assert_int_equal(c.dram_bytes, 256ull << 20);
	assert_int_equal(c.heartbeat_timeout_ms, 1234);
	unlink(p);
	/* ... and names the keys that changed but wait for a restart (not those unchanged). */
	char restart[256];
	p = write_tmp("dram_bytes = 128M\nshm_name = /fkv-test\nlock_memory = true\n"
		      "heartbeat_timeout_ms = 4321\n");
	assert_int_equal(cfg_reload_file(&c, p, restart, sizeof restart, err, sizeof err), 0);
	assert_string_equal(restart, "dram_bytes, lock_memory");
	assert_int_equal(c.heartbeat_timeout_ms, 4321);
	assert_int_equal(c.dram_bytes, 256ull << 20);
	unlink(p);
}

static void test_print_reads_back(void **state)
{
	(void)state;
	struct cfg c, d;
	char err[CFG_ERR_MAX];
	cfg_defaults(&c);
	assert_int_equal(cfg_set_arg(&c, "dram_bytes=3G", err, sizeof err), 0);
	assert_int_equal(cfg_set_arg(&c, " group = freekv ", err, sizeof err), 0);
	assert_int_equal(cfg_set_arg(&c, "noequals", err, sizeof err), -EINVAL);
	char path[] = "/tmp/freekv-test-print-XXXXXX";
	int fd = mkstemp(path);
	FILE *f = fdopen(fd, "w");
	cfg_print(&c, f);
	fclose(f);
	cfg_defaults(&d);
	assert_int_equal(cfg_load_file(&d, path, false, err, sizeof err), 0);
	assert_memory_equal(&c, &d, sizeof c);
	unlink(path);
	assert_true(cfg_count() >= 15);
	for (size_t i = 0; i < cfg_count(); i++)
		assert_non_null(cfg_help(i));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_defaults),
		cmocka_unit_test(test_bytes_suffixes),
		cmocka_unit_test(test_set_types_and_bounds),
		cmocka_unit_test(test_runtime_flag),
		cmocka_unit_test(test_endpoint_and_watermarks),
		cmocka_unit_test(test_file),
		cmocka_unit_test(test_print_reads_back),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
