/* Integration: one sequence's KV larger than kvstored's DRAM pool, with the real binaries. A
 * kvstored with a 2 MiB pool and an 8 MiB NVMe tier; kvworker generate --lease-budget 64 of
 * LB_N tokens (2.1 MiB of KV) with the full, quest and freekv policies:
 * - each run succeeds and its greedy tokens equal an embedded-store run of the same prompt;
 * - the sequence ends up larger than the pool, partly on NVMe, and the daemon counts
 *   demotions (and, for the retrieval policies, which read old pages back, promotions), so
 *   the run cannot have kept everything in DRAM; the worker's --stats counts on-demand
 *   recalls and releases, and (retrieval policies) fewer than half as many RECALL ring entries
 *   as blocks recalled, since the recall thread pins a job's pages together;
 * - a prompt whose KV alone is larger than the pool (the shipped corpus: 2,466 tokens, 3 MiB
 *   of KV) prefills and decodes with freekv at --lease-budget 16 (the engine commits each
 *   ubatch, so the budget releases the prompt's pages as it goes), equal to the embedded run.
 * (test_lease_resume.c shows the same run failing without a budget.) */
#include "test_lease_budget.h"

static const char *g_model;

static void budget_case(const char *policy)
{
	static int ref[P_MAX_IDS];
	char n_str[16];
	snprintf(n_str, sizeof n_str, "%d", LB_N);
	int n_ref = lb_reference(g_model, policy, n_str, ref);
	assert_int_equal(n_ref, LB_N);

	struct harness hs;
	harness_start(&hs, lb_small_pool);
	const char *E = hs.endpoint;
	struct proc p;
	static char err[1 << 16];
	const char *run[] = { "generate", "-m", g_model, "-p", LB_PROMPT, "-n", n_str, "-c", LB_CTX,
			      "--temp", "0", "--ids", "--stats", "--store", E, "--seq", "big",
			      "--keep", "--lease-budget", LB_LEASES, "--policy", policy, NULL };
	assert_int_equal(lb_run(&p, run, err, sizeof err), 0);
	assert_int_equal(p.n_ids, LB_N);
	assert_memory_equal(p.ids, ref, (size_t)LB_N * sizeof *ref);

	uint64_t pool, demoted, promoted, dram, nvme, bb;
	lb_seq_pages(E, "big", &dram, &nvme, &bb);
	lb_tier_stats(E, &pool, &demoted, &promoted);
	fprintf(stderr, "%s: sequence of %llu blocks (%llu on NVMe) in a pool of %llu; demoted "
		"%llu, promoted %llu; worker: %lld recalls in %lld RECALL entries, %lld releases, %lld "
		"leases held\n",
		policy, (unsigned long long)(dram + nvme), (unsigned long long)nvme,
		(unsigned long long)(pool / bb), (unsigned long long)demoted,
		(unsigned long long)promoted, lb_stat(err, "lease_recalls"),
		lb_stat(err, "lease_recall_ops"), lb_stat(err, "lease_releases"),
		lb_stat(err, "leases_held"));
	assert_true((dram + nvme) * bb > pool);
	assert_true(nvme > 0);
	assert_true(demoted >= nvme);
	assert_int_equal(lb_stat(err, "lease_budget"), atoi(LB_LEASES));
	assert_true(lb_stat(err, "lease_releases") > 0);
	if (strcmp(policy, "full")) {
		/* Selected pages were read back: on demand, some of them from NVMe. */
		assert_true(promoted > 0);
		assert_true(lb_stat(err, "lease_recalls") > 0);
		/* The recall thread pins a job's pages at once: the released ones come back
		 * several to a RECALL entry (one a block before: 13,518 entries for quest). */
		assert_true(2 * lb_stat(err, "lease_recall_ops") < lb_stat(err, "lease_recalls"));
	} else {
		assert_int_equal(lb_stat(err, "lease_recall_ops"), 0);
	}
	harness_stop(&hs);
}

static void test_full(void **state)
{
	(void)state;
	budget_case("full");
}

static void test_quest(void **state)
{
	(void)state;
	if (!p_policy_built("quest"))
		skip();
	budget_case("quest");
}

static void test_freekv(void **state)
{
	(void)state;
	if (!p_policy_built("freekv"))
		skip();
	budget_case("freekv");
}

/* The shipped corpus (5.3 KB), cut at its last space: 2,466 stories260K tokens. */
static void long_prompt(char *text, size_t cap)
{
	char path[4096];
	snprintf(path, sizeof path, "%s/tests/data/stories_corpus.txt", FREEKV_SOURCE_DIR);
	FILE *f = fopen(path, "r");
	assert_non_null(f);
	size_t n = fread(text, 1, cap - 1, f);
	fclose(f);
	assert_true(n > 4000 && n < cap - 1);
	while (n > 0 && text[n - 1] != ' ')
		n--;
	text[n] = '\0';
}

static void test_long_prompt(void **state)
{
	(void)state;
	if (!p_policy_built("freekv"))
		skip();
	static char text[9001];
	long_prompt(text, sizeof text);
	struct proc ref;
	static char err[1 << 16];
	const char *embedded[] = { "generate", "-m", g_model, "-p", text, "-n", "8", "-c", "2600",
				   "--temp", "0", "--ids", "--policy", "freekv", NULL };
	assert_int_equal(lb_run(&ref, embedded, err, sizeof err), 0);
	assert_int_equal(ref.n_ids, 8);

	struct harness hs;
	harness_start(&hs, lb_small_pool);
	const char *E = hs.endpoint;
	struct proc p;
	const char *run[] = { "generate", "-m", g_model, "-p", text, "-n", "8", "-c", "2600",
			      "--temp", "0", "--ids", "--stats", "--store", E, "--seq", "long",
			      "--keep", "--lease-budget", "16", "--policy", "freekv", NULL };
	assert_int_equal(lb_run(&p, run, err, sizeof err), 0);
	assert_int_equal(p.n_ids, 8);
	assert_memory_equal(p.ids, ref.ids, 8 * sizeof *ref.ids);
	assert_true(lb_stat(err, "prompt_tokens") > 2000);
	uint64_t pool, demoted, promoted, dram, nvme, bb;
	lb_seq_pages(E, "long", &dram, &nvme, &bb);
	lb_tier_stats(E, &pool, &demoted, &promoted);
	fprintf(stderr, "long prompt: %lld tokens, sequence of %llu blocks (%llu on NVMe) in a pool "
		"of %llu; demoted %llu, promoted %llu\n", lb_stat(err, "prompt_tokens"),
		(unsigned long long)(dram + nvme), (unsigned long long)nvme,
		(unsigned long long)(pool / bb), (unsigned long long)demoted,
		(unsigned long long)promoted);
	assert_true((dram + nvme) * bb > pool);
	assert_true(nvme > 0);
	harness_stop(&hs);
}

int main(void)
{
	g_model = test_model_path("stories260K/stories260K.gguf");
	if (!g_model)
		return TEST_SKIP_EXIT;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_full, h_teardown),
		cmocka_unit_test_teardown(test_quest, h_teardown),
		cmocka_unit_test_teardown(test_freekv, h_teardown),
		cmocka_unit_test_teardown(test_long_prompt, h_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
