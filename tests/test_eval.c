/* Tests for `kvworker eval` (worker/cli/cmd_eval.c): runs the real binary on stories260K over the
 * shipped corpus (tests/data/stories_corpus.txt) and checks what is exact. `full` agrees with
 * itself on every position, and its teacher-forced decode-path perplexity equals the prefill
 * path of `kvworker perplexity` to float rounding; with a budget covering the whole window every
 * policy reproduces full's scores bit for bit and recalls nothing; freekv with tau above 1
 * corrects every checked head and reproduces quest exactly, and both recall (retrieval really
 * engaged); with --kv-top-p it reproduces hardkv exactly, both attending fewer pages a head
 * than quest (the reported fraction of quest's is below 1, quest's is 1); refreshkv with Q 1 and
 * s above 1 takes only full steps and reproduces full; specache with k covering the window
 * reproduces full's scores exactly. No accuracy ordering between policies is asserted: none is
 * guaranteed. Policies not built yet are skipped with a note. --json parses with json-c; bad
 * input exits 2 or 1 with a message, never a crash. */
#include "test_proc.h"

#include <json-c/json.h>
#include <math.h>

#include "kvcache.h"

static char bin[4096], tmpdir[64], gguf[4096], corpus[4096];

/* Runs kvworker with args (NULL-terminated), stdin from /dev/null. */
static struct result run(const char *const *args)
{
	return proc_run(bin, tmpdir, NULL, args);
}

#define RUN(...) run((const char *const[]){ __VA_ARGS__, NULL })

/* Parses a successful --json run; the caller puts the document. */
static json_object *parse_json(struct result *r)
{
	if (r->rc != 0)
		fprintf(stderr, "kvworker eval failed (%d): %s\n", r->rc, r->err);
	assert_int_equal(r->rc, 0);
	json_object *doc = json_tokener_parse(r->out);
	assert_non_null(doc);
	assert_true(json_object_is_type(doc, json_type_object));
	return doc;
}

static json_object *field(json_object *o, const char *k)
{
	json_object *v = NULL;
	if (!json_object_object_get_ex(o, k, &v))
		fail_msg("JSON field %s missing", k);
	return v;
}

/* The entry of policy name in doc's "policies" array; fails when absent. */
static json_object *policy(json_object *doc, const char *name)
{
	json_object *arr = field(doc, "policies");
	for (size_t i = 0; i < json_object_array_length(arr); i++) {
		json_object *p = json_object_array_get_idx(arr, i);
		if (!strcmp(json_object_get_string(field(p, "policy")), name))
			return p;
	}
	fail_msg("policy %s not in the output", name);
	return NULL;
}

static double num(json_object *o, const char *k)
{
	return json_object_get_double(field(o, k));
}

static int64_t inum(json_object *o, const char *k)
{
	return json_object_get_int64(field(o, k));
}

static bool built(const char *name)
{
	if (kvcache_policy(name))
		return true;
	fprintf(stderr, "note: policy %s is not built; its checks are skipped\n", name);
	return false;
}

static int setup(void **state)
{
	(void)state;
	snprintf(bin, sizeof bin, "%s/worker/kvworker", FREEKV_BUILD_DIR);
	snprintf(corpus, sizeof corpus, "%s/tests/data/stories_corpus.txt", FREEKV_SOURCE_DIR);
	const char *g = test_model_path("stories260K/stories260K.gguf");
	if (access(bin, X_OK) || access(corpus, R_OK) || !g) {
		fprintf(stderr, "skip: %s, %s or the model is missing\n", bin, corpus);
		exit(TEST_SKIP_EXIT);
	}
	snprintf(gguf, sizeof gguf, "%s", g);
	strcpy(tmpdir, "/tmp/freekv-eval-XXXXXX");
	return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state)
{
	(void)state;
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
	return system(cmd) == 0 ? 0 : -1;
}

/* full against itself: every position agrees, the document is complete, and the decode-path
 * perplexity equals `kvworker perplexity` (one causal prefill per window) to rounding — a
 * teacher-forcing off-by-one would change it by far more. */
static void test_full_self_and_perplexity(void **state)
{
	(void)state;
	struct result r = RUN("eval", "-m", gguf, "-f", corpus, "--policies", "full", "--json");
	json_object *doc = parse_json(&r);
	assert_int_equal(json_object_array_length(field(doc, "policies")), 1);
	json_object *f = policy(doc, "full");
	int64_t n = inum(doc, "tokens");
	assert_true(n > 2000); /* the corpus is ~2.5K tokens: several windows */
	assert_true(inum(doc, "windows") >= 4);
	assert_int_equal(inum(f, "tokens"), n);
	assert_int_equal(inum(f, "agree"), n);
	assert_true(num(f, "agreement") == 1.0);
	assert_true(json_object_get_type(field(f, "correction_rate")) == json_type_null);
	double ppl = num(f, "perplexity");
	assert_true(ppl > 1.0 && ppl < 100.0);
	assert_true(fabs(log(ppl) - num(f, "nll_sum") / (double)n) < 1e-12);
	json_object_put(doc);
	proc_result_free(&r);

	r = RUN("perplexity", "-m", gguf, "-f", corpus);
	assert_int_equal(r.rc, 0);
	const char *last = strstr(r.out, "perplexity: ");
	assert_non_null(last);
	for (const char *p; (p = strstr(last + 1, "perplexity: "));)
		last = p;
	double ref = strtod(last + strlen("perplexity: "), NULL);
	assert_true(fabs(ppl - ref) / ref < 1e-4);
	proc_result_free(&r);
}

/* --max-tokens bounds the scored tokens exactly; the table has a row per policy. */
static void test_max_tokens_and_table(void **state)
{
	(void)state;
	struct result r = RUN("eval", "-m", gguf, "-f", corpus, "--policies", "full",
			      "--max-tokens", "100");
	assert_int_equal(r.rc, 0);
	assert_non_null(strstr(r.out, "scored 100 tokens (windows: 1 "));
	assert_non_null(strstr(r.out, "| full      |"));
	assert_non_null(strstr(r.out, "perplexity"));
	proc_result_free(&r);
}

/* With B at least the window every policy attends to everything: full's scores exactly. */
static void test_budget_covers_context(void **state)
{
	(void)state;
	const char *names[] = { "streaming", "quest", "freekv", "hardkv", "refreshkv" };
	char list[64] = "full";
	for (size_t i = 0; i < 5; i++)
		if (built(names[i]))
			snprintf(list + strlen(list), sizeof list - strlen(list), ",%s", names[i]);
	struct result r = RUN("eval", "-m", gguf, "-f", corpus, "--policies", list, "--ctx", "512",
			      "--max-tokens", "1100", "--page-size", "8", "--budget", "512",
			      "--sink", "8", "--window", "16", "--json");
	json_object *doc = parse_json(&r);
	json_object *f = policy(doc, "full");
	for (size_t i = 0; i < 5; i++) {
		if (!kvcache_policy(names[i]))
			continue;
		json_object *p = policy(doc, names[i]);
		assert_int_equal(inum(p, "tokens"), inum(f, "tokens"));
		assert_true(num(p, "nll_sum") == num(f, "nll_sum"));
		assert_true(num(p, "perplexity") == num(f, "perplexity"));
		assert_int_equal(inum(p, "agree"), inum(p, "tokens"));
		assert_int_equal(inum(p, "pages_recalled"), 0);
	}
	json_object_put(doc);
	proc_result_free(&r);
}

/* tau above 1 flags every checked head, so freekv selects with the current query every step:
 * quest's scores exactly. Budget 64 < the 512-token windows, so both really recall. */
static void test_freekv_tau2_equals_quest(void **state)
{
	(void)state;
	if (!built("quest") || !built("freekv"))
		skip();
	struct result r = RUN("eval", "-m", gguf, "-f", corpus, "--policies", "quest,freekv",
			      "--max-tokens", "1100", "--tau", "2", "--json");
	json_object *doc = parse_json(&r);
	json_object *ret = field(doc, "retrieval");
	assert_int_equal(inum(ret, "budget"), 64);
	assert_int_equal(inum(ret, "page"), 8);
	json_object *q = policy(doc, "quest"), *fk = policy(doc, "freekv");
	assert_true(num(fk, "nll_sum") == num(q, "nll_sum"));
	assert_int_equal(inum(fk, "agree"), inum(q, "agree"));
	assert_true(inum(q, "pages_recalled") > 0);
	assert_true(inum(fk, "pages_recalled") > 0);
	assert_true(inum(fk, "head_checks") > 0);
	assert_int_equal(inum(fk, "corrections"), inum(fk, "head_checks"));
	assert_true(num(fk, "correction_rate") == 1.0);
	/* Per layer: the first (--full-layers 1 by default) keeps full attention, the counters of
	 * the others add up to the totals. */
	json_object *layers = field(fk, "layers");
	assert_int_equal(json_object_array_length(layers), 5);
	int64_t sum = 0;
	for (size_t l = 0; l < 5; l++) {
		json_object *lo = json_object_array_get_idx(layers, l);
		sum += inum(lo, "pages_recalled");
		if (l == 0) {
			assert_int_equal(inum(lo, "retrieval_steps"), 0);
			assert_int_equal(inum(lo, "pages_recalled"), 0);
		} else {
			assert_true(inum(lo, "retrieval_steps") > 0);
		}
	}
	assert_int_equal(sum, inum(fk, "pages_recalled"));
	json_object_put(doc);
	proc_result_free(&r);
}

/* specache with k covering the window reads an exact row at every quantised position: full's
 * scores exactly, with rows really fetched; its speculative tokens are counted, and its device
 * bytes per token reported against 16-bit K/V. */
static void test_specache_topk_covers_context(void **state)
{
	(void)state;
	if (!built("specache"))
		skip();
	struct result r = RUN("eval", "-m", gguf, "-f", corpus, "--policies", "specache",
			      "--max-tokens", "1100", "--spec-topk", "512", "--kv-bits", "1",
			      "--json");
	json_object *doc = parse_json(&r);
	json_object *ret = field(doc, "retrieval");
	assert_int_equal(inum(ret, "kv_bits"), 1);
	assert_int_equal(inum(ret, "spec_topk"), 512);
	json_object *f = policy(doc, "full"), *sc = policy(doc, "specache");
	assert_true(num(sc, "nll_sum") == num(f, "nll_sum"));
	assert_int_equal(inum(sc, "agree"), inum(sc, "tokens"));
	assert_true(inum(sc, "tokens_fetched") > 0);
	const double hit = num(sc, "spec_hit_rate");
	assert_true(hit > 0.0 && hit < 1.0);
	assert_true(num(sc, "device_ratio_vs_16bit") > 0.0);
	assert_null(field(f, "spec_hit_rate")); /* present, null: not applicable */
	json_object_put(doc);
	proc_result_free(&r);
}

/* refreshkv with Q = 1 and s > 1 takes a full step at every step past the budget (64, below the
 * 512-token windows): full's scores exactly, full-step rate 1, rows fetched. */
static void test_refreshkv_every_step_full(void **state)
{
	(void)state;
	if (!built("refreshkv"))
		skip();
	struct result r = RUN("eval", "-m", gguf, "-f", corpus, "--policies", "refreshkv",
			      "--max-tokens", "1100", "--refresh-stride", "1",
			      "--refresh-threshold", "1.5", "--json");
	json_object *doc = parse_json(&r);
	json_object *ret = field(doc, "retrieval");
	assert_int_equal(inum(ret, "budget"), 64);
	assert_int_equal(inum(ret, "refresh_stride"), 1);
	json_object *f = policy(doc, "full"), *p = policy(doc, "refreshkv");
	assert_true(num(p, "nll_sum") == num(f, "nll_sum"));
	assert_int_equal(inum(p, "agree"), inum(p, "tokens"));
	assert_true(inum(p, "retrieval_steps") > 0);
	assert_int_equal(inum(p, "full_steps"), inum(p, "retrieval_steps"));
	assert_true(num(p, "full_step_rate") == 1.0);
	assert_true(inum(p, "tokens_fetched") > 0);
	json_object_put(doc);
	proc_result_free(&r);
}

/* --kv-top-p with tau above 1: freekv corrects every head every step and selects as hardkv does,
 * so it reproduces hardkv exactly; both attend fewer selected pages a head than quest. */
static void test_freekv_top_p_tau2_equals_hardkv(void **state)
{
	(void)state;
	if (!built("quest") || !built("freekv") || !built("hardkv"))
		skip();
	struct result r = RUN("eval", "-m", gguf, "-f", corpus, "--policies", "quest,freekv,hardkv",
			      "--max-tokens", "1100", "--tau", "2", "--kv-top-p", "0.8",
			      "--recalibrate", "32", "--json");
	json_object *doc = parse_json(&r);
	json_object *ret = field(doc, "retrieval");
	assert_true(num(ret, "kv_top_p") == 0.8);
	assert_int_equal(inum(ret, "recalibrate"), 32);
	json_object *q = policy(doc, "quest"), *fk = policy(doc, "freekv");
	json_object *h = policy(doc, "hardkv");
	assert_true(num(fk, "nll_sum") == num(h, "nll_sum"));
	assert_int_equal(inum(fk, "agree"), inum(h, "agree"));
	assert_int_equal(inum(fk, "pages_selected"), inum(h, "pages_selected"));
	assert_true(inum(h, "calibrations") > 0);
	assert_int_equal(inum(fk, "calibrations"), inum(h, "calibrations"));
	assert_int_equal(inum(q, "calibrations"), 0);
	assert_true(num(q, "pages_fraction_of_quest") == 1.0);
	double fr = num(h, "pages_fraction_of_quest");
	assert_true(fr > 0.0 && fr < 1.0);
	assert_true(num(h, "nll_sum") != num(q, "nll_sum"));
	json_object_put(doc);
	proc_result_free(&r);
}

/* Bad input: exit 2 (usage) or 1 (failure) with a message, never a crash. */
static void test_bad_input(void **state)
{
	(void)state;
	struct {
		int rc;
		const char *msg;
		const char *args[12];
	} cases[] = {
		{ 2, "unknown policy", { "--policies", "full,bogus" } },
		{ 2, "--policies", { "--policy", "quest" } },
		{ 2, "multiples of the page size", { "--budget", "60", "--page-size", "8" } },
		{ 2, "--ctx", { "--ctx", "1" } },
		{ 2, "--prefill", { "--prefill", "0" } },
		{ 2, "unknown option", { "--frobnicate" } },
		{ 2, "needs a value", { "--policies" } },
		{ 2, "(0, 1]", { "--kv-top-p", "0" } },
		{ 2, "(0, 1]", { "--kv-top-p", "1.5" } },
		{ 2, "--recalibrate", { "--recalibrate", "0" } },
		{ 2, "--refresh-stride", { "--refresh-stride", "0" } },
		{ 2, "--refresh-threshold", { "--refresh-threshold", "3" } },
		{ 2, "--budget", { "--policies", "refreshkv", "--budget", "4" } },
	};
	for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
		const char *args[20] = { "eval", "-m", gguf, "-f", corpus };
		int n = 5;
		for (int k = 0; cases[c].args[k]; k++)
			args[n++] = cases[c].args[k];
		args[n] = NULL;
		struct result r = run(args);
		if (r.rc != cases[c].rc || !strstr(r.err, cases[c].msg))
			fail_msg("case %zu: rc %d, stderr: %s", c, r.rc, r.err);
		proc_result_free(&r);
	}
	struct result r = RUN("eval", "-m", gguf, "-f", "/nonexistent/corpus.txt");
	assert_int_equal(r.rc, 1);
	assert_non_null(strstr(r.err, "cannot read"));
	proc_result_free(&r);
	r = RUN("eval", "-f", corpus);
	assert_int_equal(r.rc, 2);
	proc_result_free(&r);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_full_self_and_perplexity),
		cmocka_unit_test(test_max_tokens_and_table),
		cmocka_unit_test(test_budget_covers_context),
		cmocka_unit_test(test_freekv_tau2_equals_quest),
		cmocka_unit_test(test_freekv_top_p_tau2_equals_hardkv),
		cmocka_unit_test(test_refreshkv_every_step_full),
		cmocka_unit_test(test_specache_topk_covers_context),
		cmocka_unit_test(test_bad_input),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
