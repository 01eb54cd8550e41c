/* Resume after a crash, with the real binaries: a kvworker generating into a real kvstored is
 * killed with SIGKILL mid-generation; the daemon marks its sequence orphaned; `kvworker resume`
 * continues it, and the sequence's token ids (what the dead worker had printed and kept, then
 * what resume printed) equal an uninterrupted greedy run's token for token. Run with the `full`
 * policy and, when they are built, `freekv` and `refreshkv`. refreshkv's first step after a
 * resume is a full step at every layer (docs/design.md §5), so with its default stride and
 * threshold the continuation is its own: the kept ids, the resume and its length are checked,
 * and its equality with the uninterrupted run is checked with Q = 1, s > 1 (every step past
 * the budget full, so the partial sets a crash loses change nothing). Also the refusals:
 * resuming an unknown or attached sequence, generating into a sequence that already holds
 * tokens; and a run stopped by SIGINT/SIGTERM exits 130/143 with its sequence kept. */
#include "clock.h"
#include "test_kvworker_proc.h"

#include "kvcache.h"

#define PROMPT "Once upon a time"
#define REF_N "600"
#define RESUME_N 40

static const char *g_model;

/* Appends the NULL-terminated flags extra (may be NULL) to the NULL-terminated argv. */
static void add_flags(const char **argv, const char *const *extra)
{
	int n = 0;
	while (argv[n])
		n++;
	for (int i = 0; extra && extra[i]; i++)
		argv[n++] = extra[i];
	argv[n] = NULL;
}

/* Page 8, budget 64, sink 8, window 16: retrieval runs from the 65th token on. */
#define KV_FLAGS "--page-size", "8", "--budget", "64", "--sink", "8", "--window", "16"

/* extra: flags after the policy's (NULL-terminated, up to 4); exact: the continuation must be
 * the uninterrupted run's. */
static void resume_case(const char *policy, const char *const *extra, bool exact)
{
	struct harness hs;
	harness_start(&hs, NULL);
	const char *E = hs.endpoint;
	static int ref_ids[P_MAX_IDS], ids[P_MAX_IDS];
	struct proc p;

	const char *ref[32] = { "generate", "-m", g_model, "-p", PROMPT, "-n", REF_N, "--temp", "0",
				"--ids", "--store", E, "--seq", "ref", "--keep", "--policy", policy,
				KV_FLAGS, NULL };
	add_flags(ref, extra);
	assert_int_equal(p_run(&p, ref), 0);
	assert_int_equal(p.n_ids, atoi(REF_N));
	int n_ref = p_seq_ids(E, "ref", ref_ids, P_MAX_IDS, NULL, NULL);
	int n_prompt = n_ref - p.n_ids;
	assert_true(n_prompt > 0);
	assert_memory_equal(ref_ids + n_prompt, p.ids, (size_t)p.n_ids * sizeof *p.ids);

	/* The victim would run far past the reference; it is killed once it printed 150
	 * ids, well past the budget, so retrieval (and its state) is in play when it dies. */
	const char *victim[32] = { "generate", "-m", g_model, "-p", PROMPT, "-n", "2000", "--temp",
				   "0", "--ids", "--store", E, "--seq", "victim", "--policy", policy,
				   KV_FLAGS, NULL };
	add_flags(victim, extra);
	p_start(&p, victim);
	assert_true(p_read_ids(&p, 150) >= 150);
	assert_int_equal(kill(p.pid, SIGKILL), 0);
	assert_int_equal(p_wait(&p), 128 + SIGKILL);
	int printed = p.n_ids;

	/* Orphaned within a second or so (pidfd). */
	int st = 0, n_before = 0;
	uint64_t committed = 0, t0 = clock_ms();
	while (clock_ms() - t0 < 3000) {
		n_before = p_seq_ids(E, "victim", ids, P_MAX_IDS, &st, &committed);
		if (st == FREEKV__SEQUENCE_STATE__SEQUENCE_STATE_ORPHANED)
			break;
		h_sleep_ms(20);
	}
	assert_int_equal(st, FREEKV__SEQUENCE_STATE__SEQUENCE_STATE_ORPHANED);
	fprintf(stderr, "%s: killed after %d printed ids; the store keeps %d ids, %llu committed\n",
		policy, printed, n_before, (unsigned long long)committed);
	/* Killed mid-generation; every id it printed was kept before it was printed. */
	assert_true(n_before < n_prompt + 2000);
	assert_true(n_before >= n_prompt + printed);
	assert_true(committed <= (uint64_t)n_before && committed + 2 >= (uint64_t)n_before);
	assert_true(n_before + RESUME_N <= n_ref);
	assert_memory_equal(ids, ref_ids, (size_t)n_before * sizeof *ids);

	char n_resume[16];
	snprintf(n_resume, sizeof n_resume, "%d", RESUME_N);
	const char *resume[32] = { "resume", "-m", g_model, "--store", E, "--seq", "victim", "-n",
				   n_resume, "--temp", "0", "--ids", "--keep", "--policy", policy,
				   KV_FLAGS, NULL };
	add_flags(resume, extra);
	assert_int_equal(p_run(&p, resume), 0);
	assert_int_equal(p.n_ids, RESUME_N);
	int n_after = p_seq_ids(E, "victim", ids, P_MAX_IDS, &st, &committed);
	assert_int_equal(st, FREEKV__SEQUENCE_STATE__SEQUENCE_STATE_DETACHED);
	assert_int_equal(n_after, n_before + RESUME_N);
	/* What resume printed is what it kept, and (exact) all of it is the uninterrupted run. */
	assert_memory_equal(ids + n_before, p.ids, RESUME_N * sizeof *ids);
	int differ = 0;
	for (int i = n_before; i < n_after; i++)
		differ += ids[i] != ref_ids[i];
	fprintf(stderr, "%s: %d of %d resumed ids differ from the uninterrupted run\n", policy,
		differ, RESUME_N);
	if (exact)
		assert_memory_equal(ids, ref_ids, (size_t)n_after * sizeof *ids);
	harness_stop(&hs);
}

static void test_resume_full(void **state)
{
	(void)state;
	resume_case("full", NULL, true);
}

static void test_resume_freekv(void **state)
{
	(void)state;
	if (!p_policy_built("freekv"))
		skip();
	resume_case("freekv", NULL, true);
}

static void test_resume_refreshkv(void **state)
{
	(void)state;
	if (!p_policy_built("refreshkv"))
		skip();
	const char *every[] = { "--refresh-stride", "1", "--refresh-threshold", "1.5", NULL };
	resume_case("refreshkv", every, true);
	resume_case("refreshkv", NULL, false);
}

static void test_refusals(void **state)
{
	(void)state;
	struct harness hs;
	harness_start(&hs, NULL);
	const char *E = hs.endpoint;
	struct proc p;
	const char *unknown[] = { "resume", "-m", g_model, "--store", E, "--seq", "nope", "-n",
				  "4", "--temp", "0", "--ids", NULL };
	assert_int_equal(p_run(&p, unknown), 1);
	const char *usage[] = { "resume", "-m", g_model, "--seq", "nope", NULL };
	assert_int_equal(p_run(&p, usage), 2);
	/* Prefix sharing is for a new sequence's prompt: its flags mean nothing to resume. */
	const char *salt[] = { "resume", "-m", g_model, "--store", E, "--seq", "nope",
			       "--cache-salt", "t", NULL };
	assert_int_equal(p_run(&p, salt), 2);

	const char *gen[] = { "generate", "-m", g_model, "-p", PROMPT, "-n", "8", "--temp", "0",
			      "--ids", "--store", E, "--seq", "kept", "--keep", NULL };
	assert_int_equal(p_run(&p, gen), 0);
	int ids[64];
	int n = p_seq_ids(E, "kept", ids, 64, NULL, NULL);
	/* Generating into it again is refused and changes nothing. */
	assert_int_equal(p_run(&p, gen), 1);
	assert_int_equal(p_seq_ids(E, "kept", ids, 64, NULL, NULL), n);
	/* Another page size is another geometry: refused. */
	const char *geo[] = { "resume", "-m", g_model, "--store", E, "--seq", "kept", "-n", "4",
			      "--temp", "0", "--ids", "--page-size", "16", "--budget", "128",
			      "--sink", "16", "--window", "32", NULL };
	assert_int_equal(p_run(&p, geo), 1);
	/* Without --page-size, resume takes the sequence's own (8 and 16: one is not the default). */
	static const char *const pages[2] = { "8", "16" }, *const pnames[2] = { "p8", "p16" };
	for (int i = 0; i < 2; i++) {
		const char *g[] = { "generate", "-m", g_model, "-p", PROMPT, "-n", "8", "--temp", "0",
				    "--ids", "--page-size", pages[i], "--store", E, "--seq", pnames[i],
				    "--keep", NULL };
		assert_int_equal(p_run(&p, g), 0);
		const char *res[] = { "resume", "-m", g_model, "--store", E, "--seq", pnames[i], "-n",
				      "4", "--temp", "0", "--ids", NULL };
		assert_int_equal(p_run(&p, res), 0);
		assert_int_equal(p.n_ids, 4);
	}
	/* Held by a live worker (this test, attached through the client library): refused. */
	struct kvs *k;
	uint64_t id;
	assert_int_equal(kvs_connect(E, 5000, &k), 0);
	assert_int_equal(kvs_hello(k, KVS_ROLE_WORKER, "holder"), 0);
	Freekv__Reply *r;
	assert_int_equal(kvs_show_sequence(k, 0, "kept", false, &r), 0);
	id = r->sequence->seq_id;
	kvs_reply_free(r);
	assert_int_equal(kvs_attach(k, id, NULL), 0);
	const char *busy[] = { "resume", "-m", g_model, "--store", E, "--seq", "kept", "-n", "4",
			       "--temp", "0", "--ids", NULL };
	assert_int_equal(p_run(&p, busy), 1);
	kvs_close(k);
	/* Detached again by the holder's Goodbye: now it resumes, without --keep it is dropped. */
	assert_int_equal(p_run(&p, busy), 0);
	assert_int_equal(p.n_ids, 4);
	struct kvs *c;
	assert_int_equal(kvs_connect(E, 5000, &c), 0);
	assert_int_equal(kvs_show_sequence(c, 0, "kept", false, &r), -ENOENT);
	kvs_close(c);
	harness_stop(&hs);
}

/* SIGINT (or SIGTERM) mid-generation: the run stops, says the sequence is kept, exits 128 + the
 * signal (130, 143: a script can tell a stopped run from a finished one), and the kept sequence
 * resumes. Without --store, --keep and --seq are refused (exit 2): there is nothing to keep. */
static void test_interrupted(void **state)
{
	(void)state;
	struct harness hs;
	harness_start(&hs, NULL);
	const char *E = hs.endpoint;
	static const int sigs[2] = { SIGINT, SIGTERM };
	static const char *const names[2] = { "int", "term" };
	for (int k = 0; k < 2; k++) {
		const char *gen[] = { "generate", "-m", g_model, "-p", PROMPT, "-n", "6000", "-c",
				      "8192", "--temp", "0", "--ids", "--store", E, "--seq",
				      names[k], NULL };
		struct proc p;
		p_start(&p, gen);
		assert_true(p_read_ids(&p, 40) >= 40); /* decoding */
		assert_int_equal(kill(p.pid, sigs[k]), 0);
		/* p_wait reads to EOF; its status conflates exit(130) with death by SIGINT. */
		p_read_ids(&p, P_MAX_IDS + 1);
		close(p.out);
		int st;
		assert_int_equal(waitpid(p.pid, &st, 0), p.pid);
		assert_true(WIFEXITED(st));
		assert_int_equal(WEXITSTATUS(st), 128 + sigs[k]);
		assert_true(p.n_ids > 40 && p.n_ids < 6000);
		int ids[P_MAX_IDS];
		assert_true(p_seq_ids(E, names[k], ids, P_MAX_IDS, NULL, NULL) > 40);
		const char *res[] = { "resume", "-m", g_model, "--store", E, "--seq", names[k], "-n",
				      "4", "-c", "8192", "--temp", "0", "--ids", NULL };
		assert_int_equal(p_run(&p, res), 0);
		assert_int_equal(p.n_ids, 4);
	}
	/* A run that fails before any token id is kept (here: the prompt exceeds -c) leaves no
	 * sequence behind: there is nothing to resume. */
	const char *toolong[] = { "generate", "-m", g_model, "-p", "Once upon a time there was a girl",
				  "-c", "4", "--temp", "0", "--ids", "--store", E, "--seq", "short",
				  NULL };
	struct proc q;
	assert_int_equal(p_run(&q, toolong), 1);
	struct kvs *c;
	Freekv__Reply *r;
	assert_int_equal(kvs_connect(E, 5000, &c), 0);
	assert_int_equal(kvs_show_sequence(c, 0, "short", false, &r), -ENOENT);
	kvs_close(c);
	const char *keep[] = { "generate", "-m", g_model, "-p", PROMPT, "-n", "4", "--keep", NULL };
	struct proc p;
	assert_int_equal(p_run(&p, keep), 2);
	const char *seq[] = { "generate", "-m", g_model, "-p", PROMPT, "-n", "4", "--seq", "x",
			      NULL };
	assert_int_equal(p_run(&p, seq), 2);
	assert_int_equal(p.n_ids, 0);
	harness_stop(&hs);
}

int main(void)
{
	g_model = test_model_path("stories260K/stories260K.gguf");
	if (!g_model)
		return TEST_SKIP_EXIT;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_refusals, h_teardown),
		cmocka_unit_test_teardown(test_interrupted, h_teardown),
		cmocka_unit_test_teardown(test_resume_full, h_teardown),
		cmocka_unit_test_teardown(test_resume_freekv, h_teardown),
		cmocka_unit_test_teardown(test_resume_refreshkv, h_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
