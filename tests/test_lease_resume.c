/* Integration: resuming a sequence larger than kvstored's DRAM pool, with the real binaries. In
 * a kvstored with a 2 MiB pool and an 8 MiB NVMe tier, kvworker generate --lease-budget 64
 * writes LB_SPLIT tokens (more KV than the pool holds with the blocks allocated ahead) and
 * detaches the sequence (--keep); kvworker resume --lease-budget 64 rebuilds its policy state
 * from the host copy (reading pages back from NVMe) and generates the rest. The sequence's
 * token ids equal an uninterrupted embedded-store run of LB_N tokens, for the full and freekv
 * policies. Without a budget the same generate run fails with ENOSPC once DRAM is full of
 * leased blocks, having printed fewer tokens: the budget is what makes it work. */
#include "test_lease_budget.h"

#define LB_SPLIT 1300

static const char *g_model;

static void resume_case(const char *policy)
{
	static int ref[P_MAX_IDS], ids[P_MAX_IDS];
	char n_ref_s[16], n_split[16], n_rest[16];
	snprintf(n_ref_s, sizeof n_ref_s, "%d", LB_N);
	snprintf(n_split, sizeof n_split, "%d", LB_SPLIT);
	snprintf(n_rest, sizeof n_rest, "%d", LB_N - LB_SPLIT);
	assert_int_equal(lb_reference(g_model, policy, n_ref_s, ref), LB_N);

	struct harness hs;
	harness_start(&hs, lb_small_pool);
	const char *E = hs.endpoint;
	struct proc p;
	static char err[1 << 16];
	const char *gen[] = { "generate", "-m", g_model, "-p", LB_PROMPT, "-n", n_split, "-c",
			      LB_CTX, "--temp", "0", "--ids", "--store", E, "--seq", "r", "--keep",
			      "--lease-budget", LB_LEASES, "--policy", policy, NULL };
	assert_int_equal(lb_run(&p, gen, err, sizeof err), 0);
	assert_int_equal(p.n_ids, LB_SPLIT);
	int n_before = p_seq_ids(E, "r", ids, P_MAX_IDS, NULL, NULL);
	int n_prompt = n_before - LB_SPLIT;
	assert_true(n_prompt > 0);
	uint64_t pool, demoted0, promoted0, demoted, promoted, dram, nvme, bb;
	lb_seq_pages(E, "r", &dram, &nvme, &bb);
	lb_tier_stats(E, &pool, &demoted0, &promoted0);
	assert_true(nvme > 0);

	const char *res[] = { "resume", "-m", g_model, "--store", E, "--seq", "r", "-n", n_rest,
			      "-c", LB_CTX, "--temp", "0", "--ids", "--stats", "--keep",
			      "--lease-budget", LB_LEASES, "--policy", policy, NULL };
	assert_int_equal(lb_run(&p, res, err, sizeof err), 0);
	assert_int_equal(p.n_ids, LB_N - LB_SPLIT);
	int n_after = p_seq_ids(E, "r", ids, P_MAX_IDS, NULL, NULL);
	assert_int_equal(n_after, n_prompt + LB_N);
	assert_memory_equal(ids + n_prompt, ref, (size_t)LB_N * sizeof *ids);
	assert_memory_equal(p.ids, ref + LB_SPLIT, (size_t)(LB_N - LB_SPLIT) * sizeof *ids);

	/* The rebuild read the demoted pages back from NVMe, on demand. */
	lb_seq_pages(E, "r", &dram, &nvme, &bb);
	lb_tier_stats(E, &pool, &demoted, &promoted);
	fprintf(stderr, "%s: resumed; sequence of %llu blocks (%llu on NVMe) in a pool of %llu; "
		"promoted %llu during the resume; worker: %lld recalls, %lld releases\n", policy,
		(unsigned long long)(dram + nvme), (unsigned long long)nvme,
		(unsigned long long)(pool / bb), (unsigned long long)(promoted - promoted0),
		lb_stat(err, "lease_recalls"), lb_stat(err, "lease_releases"));
	assert_true(promoted > promoted0);
	assert_true(lb_stat(err, "lease_recalls") > 0);
	assert_true((dram + nvme) * bb > pool);
	harness_stop(&hs);
}

static void test_resume_full(void **state)
{
	(void)state;
	resume_case("full");
}

static void test_resume_freekv(void **state)
{
	(void)state;
	if (!p_policy_built("freekv"))
		skip();
	resume_case("freekv");
}

static void test_no_budget(void **state)
{
	(void)state;
	struct harness hs;
	harness_start(&hs, lb_small_pool);
	struct proc p;
	static char err[1 << 16];
	char n_str[16];
	snprintf(n_str, sizeof n_str, "%d", LB_N);
	const char *run[] = { "generate", "-m", g_model, "-p", LB_PROMPT, "-n", n_str, "-c", LB_CTX,
			      "--temp", "0", "--ids", "--store", hs.endpoint, "--policy", "full",
			      NULL };
	assert_int_equal(lb_run(&p, run, err, sizeof err), 1);
	assert_non_null(strstr(err, "No space left on device"));
	/* ... says what fills the pool (this worker's leases) and what to do about it ... */
	assert_non_null(strstr(err, "pool full"));
	assert_non_null(strstr(err, "leased by workers"));
	assert_non_null(strstr(err, "`kvctl evict --detached`"));
	assert_non_null(strstr(err, "--lease-budget N"));
	assert_true(p.n_ids > 0 && p.n_ids < LB_N);
	/* ... and keeps the failed run's sequence only because it can be resumed, saying how. */
	assert_non_null(strstr(err, "kept in the store"));
	assert_non_null(strstr(err, "kvworker resume --seq"));
	harness_stop(&hs);
}

int main(void)
{
	g_model = test_model_path("stories260K/stories260K.gguf");
	if (!g_model)
		return TEST_SKIP_EXIT;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_no_budget, h_teardown),
		cmocka_unit_test_teardown(test_resume_full, h_teardown),
		cmocka_unit_test_teardown(test_resume_freekv, h_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
