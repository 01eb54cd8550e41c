/* Integration: the kvctl binary against a real kvstored. Every verb with --json parses with
 * json-c and carries the daemon's numbers; human output names the sequence; exit codes are 0 ok,
 * 1 refused, 2 usage, 3 unreachable (quickly, thanks to the receive timeout); with --json errors
 * are one JSON object on stdout that names the problem, and configuration numbers are numbers. */
#include "clock.h"
#include "test_kvstored_harness.h"

#include <json-c/json.h>

static char out[1 << 16];

/* Run kvctl with args; returns its exit code, output in out[]. */
static int kvctl(const struct harness *h, const char *args)
{
	char cmd[8192];
	snprintf(cmd, sizeof cmd, "%s/ctl/kvctl -e %s --timeout 1000 %s 2>/dev/null", FREEKV_BUILD_DIR,
		 h ? h->endpoint : "ipc:///tmp/fkv-h2-nobody-here.sock", args);
	FILE *p = popen(cmd, "r");
	assert_non_null(p);
	size_t n = fread(out, 1, sizeof out - 1, p);
	out[n] = '\0';
	int st = pclose(p);
	assert_true(WIFEXITED(st));
	return WEXITSTATUS(st);
}

static json_object *parsed(void)
{
	json_object *j = json_tokener_parse(out);
	if (!j)
		fprintf(stderr, "not JSON: %s\n", out);
	assert_non_null(j);
	return j;
}

static int64_t jint(json_object *j, const char *key)
{
	json_object *v;
	assert_true(json_object_object_get_ex(j, key, &v));
	return json_object_get_int64(v);
}

/* out[] is {"error": {"message": ..., "kind": kind, "exit_code": code}}, message holding substr. */
static void expect_error(const char *kind, int code, const char *substr)
{
	json_object *j = parsed(), *e, *v;
	assert_true(json_object_object_get_ex(j, "error", &e));
	assert_true(json_object_object_get_ex(e, "kind", &v));
	assert_string_equal(json_object_get_string(v), kind);
	assert_int_equal(jint(e, "exit_code"), code);
	assert_true(json_object_object_get_ex(e, "message", &v));
	if (!strstr(json_object_get_string(v), substr))
		fail_msg("error message '%s' lacks '%s'", json_object_get_string(v), substr);
	json_object_put(j);
}

static void test_verbs(void **state)
{
	(void)state;
	struct harness h;
	uint64_t seq, off[4];
	uint32_t tokens[3] = { 11, 22, 33 };
	harness_start(&h, NULL);
	struct kvs *k = h_worker(&h, "chat-1", &seq);
	assert_non_null(k);
	assert_int_equal(kvs_alloc(k, seq, 0, 0, 4, off), 0);
	assert_int_equal(kvs_commit(k, seq, 64, off, 4), 0);
	assert_int_equal(kvs_commit_tokens(k, seq, 64, 0, tokens, 3), 0);

	assert_int_equal(kvctl(&h, "ls"), 0); /* ids kept, then tokens with K/V committed */
	assert_non_null(strstr(out, "TOKENS       KV"));
	assert_non_null(strstr(out, "chat-1"));
	assert_non_null(strstr(strstr(out, "chat-1"), " 3       64 "));
	assert_int_equal(kvctl(&h, "status"), 0);
	assert_non_null(strstr(out, "1 sequences"));
	assert_int_equal(kvctl(&h, "status --json"), 0);
	json_object *j = parsed();
	assert_int_equal(jint(j, "sequences"), 1);
	assert_int_equal(jint(j, "blocks_dram"), 4);
	json_object_put(j);

	assert_int_equal(kvctl(&h, "ls"), 0);
	assert_non_null(strstr(out, "chat-1"));
	assert_non_null(strstr(out, "attached"));
	assert_int_equal(kvctl(&h, "ls --json"), 0);
	j = parsed();
	json_object *arr;
	assert_true(json_object_object_get_ex(j, "sequences", &arr));
	assert_int_equal(json_object_array_length(arr), 1);
	assert_int_equal(jint(json_object_array_get_idx(arr, 0), "pages_dram"), 4);
	json_object_put(j);

	assert_int_equal(kvctl(&h, "show chat-1 --tokens --json"), 0);
	j = parsed();
	assert_int_equal(jint(j, "committed_tokens"), 64);
	assert_int_equal(jint(j, "token_count"), 3); /* ids kept: one count, in ls and show alike */
	assert_true(json_object_object_get_ex(j, "token_ids", &arr));
	assert_int_equal(json_object_array_length(arr), 3);
	assert_int_equal(json_object_get_int(json_object_array_get_idx(arr, 2)), 33);
	json_object_put(j);
	assert_int_equal(kvctl(&h, "show chat-1 --tokens"), 0);
	assert_non_null(strstr(out, "11 22 33"));
	/* One line starts with "tokens": the ids, which scripts read (scripts/demo.sh does). */
	assert_non_null(strstr(out, "\ntokens     11 22 33\n"));
	assert_null(strstr(strstr(out, "\ntokens ") + 1, "\ntokens"));
	assert_non_null(strstr(out, "length     3 token ids kept"));
	assert_int_equal(kvctl(&h, "show nosuch"), 1);
	char by_id[64];
	snprintf(by_id, sizeof by_id, "show id:%llu", (unsigned long long)seq);
	assert_int_equal(kvctl(&h, by_id), 0);
	assert_non_null(strstr(out, "chat-1"));

	assert_int_equal(kvctl(&h, "workers --json"), 0);
	j = parsed();
	assert_true(json_object_object_get_ex(j, "workers", &arr));
	assert_int_equal(json_object_array_length(arr), 1);
	assert_int_equal(jint(json_object_array_get_idx(arr, 0), "sequences"), 1);
	json_object_put(j);

	assert_int_equal(kvctl(&h, "demote chat-1 --json"), 0);
	j = parsed();
	assert_int_equal(jint(j, "blocks"), 4);
	json_object_put(j);
	Freekv__Reply *r = h_settled(k, "chat-1");
	assert_int_equal(r->sequence->pages->nvme, 4);
	kvs_reply_free(r);

	assert_int_equal(kvctl(&h, "stats --json"), 0);
	j = parsed();
	assert_int_equal(jint(j, "demoted_blocks"), 4);
#ifdef __SANITIZE_ADDRESS__
	/* The sanitizer's allocator: the daemon knows nothing and says nothing. */
	assert_false(json_object_object_get_ex(j, "heap_in_use_bytes", NULL));
#else
	/* The daemon's metadata: its tables at least (the worker registry alone is 94 KiB). */
	assert_true(jint(j, "heap_in_use_bytes") > 64 * 1024);
	assert_true(jint(j, "heap_in_use_bytes") < 1ll << 30);
#endif
	json_object_put(j);
	assert_int_equal(kvctl(&h, "stats"), 0);
	assert_non_null(strstr(out, "OpenSequence"));
#ifndef __SANITIZE_ADDRESS__
	assert_non_null(strstr(out, "heap in use"));
#endif

	assert_int_equal(kvctl(&h, "config get heartbeat_timeout_ms --json"), 0);
	j = parsed();
	json_object *v;
	assert_true(json_object_object_get_ex(j, "heartbeat_timeout_ms", &v));
	assert_true(json_object_is_type(v, json_type_int)); /* numbers as numbers */
	assert_int_equal(json_object_get_int64(v), 5000);
	json_object_put(j);
	assert_int_equal(kvctl(&h, "config get --json"), 0);
	j = parsed();
	assert_true(json_object_object_get_ex(j, "persist", &v));
	assert_true(json_object_is_type(v, json_type_boolean));
	assert_true(json_object_object_get_ex(j, "endpoint", &v));
	assert_true(json_object_is_type(v, json_type_string));
	json_object_put(j);
	assert_int_equal(kvctl(&h, "config set heartbeat_timeout_ms 6000"), 0);
	assert_int_equal(kvctl(&h, "config set dram_bytes 1G"), 1);
	assert_int_equal(kvctl(&h, "config frob"), 2);

	assert_int_equal(kvctl(&h, "watch --count 3 --interval 0.05 --json"), 0);
	int lines = 0;
	for (char *s = out; (s = strchr(s, '\n')); s++)
		lines++;
	assert_int_equal(lines, 3);

	/* Evict: attached sequences are refused, detached ones go. */
	assert_int_equal(kvctl(&h, "evict chat-1"), 1);
	assert_int_equal(kvctl(&h, "evict --worker 1 --json"), 0);
	assert_int_equal(kvs_detach(k, seq), 0);
	assert_int_equal(kvctl(&h, "evict --detached --json"), 0);
	j = parsed();
	assert_int_equal(jint(j, "sequences"), 1);
	assert_int_equal(jint(j, "blocks"), 4);
	json_object_put(j);
	assert_int_equal(kvctl(&h, "ls --json"), 0);
	j = parsed();
	assert_true(json_object_object_get_ex(j, "sequences", &arr));
	assert_int_equal(json_object_array_length(arr), 0);
	json_object_put(j);

	assert_int_equal(kvctl(&h, "frobnicate"), 2);
	assert_int_equal(kvctl(&h, "show"), 2);
	assert_int_equal(kvctl(&h, "evict a --detached"), 2);
	assert_int_equal(kvctl(&h, "ls --bogus"), 2);

	/* With --json every error is one JSON object on stdout, naming what was wrong. */
	assert_int_equal(kvctl(&h, "show id:abc --json"), 2);
	expect_error("usage", 2, "'id:abc' is not a sequence id");
	assert_int_equal(kvctl(&h, "show id:0 --json"), 2);
	expect_error("usage", 2, "is not a sequence id");
	assert_int_equal(kvctl(&h, "show nosuch --json"), 1);
	expect_error("refused", 1, "no sequence 'nosuch'");
	assert_int_equal(kvctl(&h, "ls --bogus --json"), 2);
	expect_error("usage", 2, "unknown option --bogus");
	assert_int_equal(kvctl(&h, "watch --count x --json"), 2);
	expect_error("usage", 2, "--count wants a number");
	assert_int_equal(kvctl(&h, "--json frobnicate"), 2);
	expect_error("usage", 2, "unknown verb 'frobnicate'");
	assert_int_equal(kvctl(&h, "show a b --json"), 2);
	expect_error("usage", 2, "show takes fewer arguments");
	kvs_close(k);
	harness_stop(&h);
}

static void test_unreachable(void **state)
{
	(void)state;
	uint64_t t0 = clock_ms();
	assert_int_equal(kvctl(NULL, "status"), 3);
	assert_int_equal(kvctl(NULL, "ls --json"), 3);
	expect_error("unreachable", 3, "fkv-h2-nobody-here.sock");
	assert_true(clock_ms() - t0 < 5000);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_verbs, h_teardown),
		cmocka_unit_test_teardown(test_unreachable, h_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
