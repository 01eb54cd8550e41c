/* Two kvworker processes decode different sequences on one kvstored at the same time; each
 * output equals the same run made alone with the embedded store, and the daemon keeps both
 * sequences' token ids. With `full` and, when it is built, `freekv`. */
#include "clock.h"
#include "test_kvworker_proc.h"

#include "kvcache.h"

#define N_GEN "1000"

static const char *g_model;
static const char *const prompts[2] = { "Once upon a time", "Lily and Tom went to the park" };

#define KV_FLAGS "--page-size", "8", "--budget", "64", "--sink", "8", "--window", "16"

static void two_case(const char *policy)
{
	static struct proc solo[2], duo[2];
	for (int w = 0; w < 2; w++) {
		const char *args[] = { "generate", "-m", g_model, "-p", prompts[w], "-n", N_GEN,
				       "--temp", "0", "--ids", "--policy", policy, KV_FLAGS, NULL };
		assert_int_equal(p_run(&solo[w], args), 0);
		assert_int_equal(solo[w].n_ids, atoi(N_GEN));
	}
	struct harness hs;
	harness_start(&hs, NULL);
	const char *names[2] = { "seq-a", "seq-b" };
	for (int w = 0; w < 2; w++) {
		const char *args[] = { "generate", "-m", g_model, "-p", prompts[w], "-n", N_GEN,
				       "--temp", "0", "--ids", "--policy", policy, "--store",
				       hs.endpoint, "--seq", names[w], "--keep", "-t", "1", KV_FLAGS,
				       NULL };
		p_start(&duo[w], args);
	}
	/* Both are attached at once: the daemon lists two workers holding a sequence each. */
	assert_true(p_read_ids(&duo[0], 1) >= 1);
	assert_true(p_read_ids(&duo[1], 1) >= 1);
	struct kvs *k;
	assert_int_equal(kvs_connect(hs.endpoint, 5000, &k), 0);
	int both = 0;
	for (uint64_t t0 = clock_ms(); !both && clock_ms() - t0 < 5000;) {
		Freekv__Reply *r;
		assert_int_equal(kvs_list_workers(k, &r), 0);
		int busy = 0;
		for (size_t i = 0; i < r->workers->n_workers; i++)
			busy += r->workers->workers[i]->sequences == 1;
		kvs_reply_free(r);
		both = busy == 2;
	}
	kvs_close(k);
	assert_true(both);
	for (int w = 0; w < 2; w++) {
		assert_int_equal(p_wait(&duo[w]), 0);
		assert_int_equal(duo[w].n_ids, solo[w].n_ids);
		assert_memory_equal(duo[w].ids, solo[w].ids, sizeof(int) * (size_t)solo[w].n_ids);
		static int ids[P_MAX_IDS];
		int st;
		uint64_t committed;
		int n = p_seq_ids(hs.endpoint, names[w], ids, P_MAX_IDS, &st, &committed);
		assert_int_equal(st, FREEKV__SEQUENCE_STATE__SEQUENCE_STATE_DETACHED);
		assert_true(n > solo[w].n_ids);
		assert_int_equal(committed, (uint64_t)n - 1); /* the last id was never run */
		assert_memory_equal(ids + n - solo[w].n_ids, solo[w].ids,
				    sizeof(int) * (size_t)solo[w].n_ids);
	}
	harness_stop(&hs);
}

static void test_two_full(void **state)
{
	(void)state;
	two_case("full");
}

static void test_two_freekv(void **state)
{
	(void)state;
	if (!p_policy_built("freekv"))
		skip();
	two_case("freekv");
}

int main(void)
{
	g_model = test_model_path("stories260K/stories260K.gguf");
	if (!g_model)
		return TEST_SKIP_EXIT;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_two_full, h_teardown),
		cmocka_unit_test_teardown(test_two_freekv, h_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
