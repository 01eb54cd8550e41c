/* Prefix sharing is bit-exact (docs/design.md §4 "Prefix sharing", *Exactness*): in one process,
 * against a real kvstored, a sequence that attaches another's prompt pages, rebuilds its policy
 * from them and prefills only the rest gives the same logits, bit for bit, as a cold run of the
 * same prompt — at the end of the prompt and over 12 greedy decode steps after it — for `full`
 * and for `freekv`, on stories260K. */
#include "test_kvstored_harness.h"

#include <math.h>

#include "backend.h"
#include "engine.h"
#include "hostkv.h"
#include "kvcache.h"
#include "model.h"

#define N_PUB 1000	/* the publisher's prompt */
#define N_SHARED 800	/* ids the second prompt shares with it */
#define N_ASK 840	/* the second prompt */
#define N_DEC 12
#define UB 64

static struct fkv_model g_m;
static bool g_loaded;

static int setup(void **state)
{
	(void)state;
	const char *p = test_model_path("stories260K/stories260K.gguf");
	char err[512];
	if (!p)
		return 0;
	if (model_load(p, &g_m, err, sizeof err)) {
		fprintf(stderr, "model_load: %s\n", err);
		return -1;
	}
	g_loaded = true;
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	if (g_loaded)
		model_free(&g_m);
	return 0;
}

static int argmax(const float *v, int n)
{
	int b = 0;
	for (int i = 1; i < n; i++)
		if (v[i] > v[b])
			b = i;
	return b;
}

/* Opens seq `name` (with the prompt for sharing when share), runs what the store did not
 * cover, then N_DEC greedy steps; logits (1 + N_DEC, V). Returns the covered length. */
static int64_t run(struct engine *e, struct hostkv *h, const char *name, const int32_t *ids,
		   int n, bool share, float *logits)
{
	char err[512], variant[64];
	struct kv_geom g;
	engine_kv_geom(e, &g);
	snprintf(variant, sizeof variant, "test");
	struct hostkv_prefix px = { .ids = ids, .n_ids = (size_t)n, .ubatch = UB, .variant = variant };
	struct hostkv_seq *hs;
	int ret = share ? hostkv_seq_open_prefix(h, name, g_m.fingerprint, g_m.cfg.n_layers, &g,
						 &px, &hs, err, sizeof err)
			: hostkv_seq_open(h, name, g_m.fingerprint, g_m.cfg.n_layers, &g, true, &hs,
					  err, sizeof err);
	if (ret)
		fail_msg("open %s: %s", name, err);
	int64_t covered = hostkv_seq_committed(hs);
	int s;
	if (engine_seq_open(e, hs, &s, err, sizeof err))
		fail_msg("engine_seq_open %s: %s", name, err);
	assert_int_equal(engine_seq_len(e, s), covered);
	if (engine_prefill(e, s, ids + covered, n - (int)covered, logits, false, err, sizeof err))
		fail_msg("prefill %s: %s", name, err);
	int V = g_m.cfg.vocab_size;
	for (int t = 0; t < N_DEC; t++) {
		int32_t next = argmax(logits + (size_t)t * V, V);
		if (engine_decode(e, 1, &s, &next, logits + (size_t)(t + 1) * V, err, sizeof err))
			fail_msg("decode %s: %s", name, err);
	}
	engine_seq_free(e, s);
	hostkv_seq_close(hs, false);
	return covered;
}

static void exact_case(const char *policy)
{
	if (!g_loaded)
		skip();
	if (!kvcache_policy(policy)) {
		fprintf(stderr, "note: policy %s is not built: case skipped\n", policy);
		skip();
	}
	struct harness hs;
	harness_start(&hs, NULL);
	char err[512];
	struct backend *be;
	assert_int_equal(backend_open("cpu", 1, &be, err, sizeof err), 0);
	struct engine_opts o = { .max_ctx = 2048, .ubatch = UB, .policy = policy,
				 .kv = { .page = 16, .budget = 256, .sink = 16, .window = 32,
					 .full_layers = 1, .tau = 0.9f } };
	struct engine *e;
	if (engine_new(&e, &g_m, be, &o, err, sizeof err))
		fail_msg("engine_new: %s", err);
	struct hostkv_opts ho = { .endpoint = hs.endpoint, .worker_name = "test_prefix_logits" };
	struct hostkv *h;
	if (hostkv_open(&ho, &h, err, sizeof err))
		fail_msg("hostkv_open: %s", err);
	static int32_t pub[N_PUB], ask[N_ASK];
	uint64_t r = 7;
	for (int i = 0; i < N_PUB; i++)
		pub[i] = (int32_t)(test_rand(&r) % (uint64_t)g_m.cfg.vocab_size);
	memcpy(ask, pub, N_SHARED * sizeof *ask);
	for (int i = N_SHARED; i < N_ASK; i++)
		ask[i] = (int32_t)(test_rand(&r) % (uint64_t)g_m.cfg.vocab_size);
	size_t V = (size_t)g_m.cfg.vocab_size;
	float *lp = malloc((1 + N_DEC) * V * sizeof *lp);
	float *cold = malloc((1 + N_DEC) * V * sizeof *cold);
	float *shr = malloc((1 + N_DEC) * V * sizeof *shr);
	assert_int_equal(run(e, h, "publisher", pub, N_PUB, true, lp), 0);
	assert_int_equal(run(e, h, "cold", ask, N_ASK, false, cold), 0);
	int64_t covered = run(e, h, "shared", ask, N_ASK, true, shr);
	fprintf(stderr, "%s: %lld of %d prompt tokens found in the pool\n", policy,
		(long long)covered, N_ASK);
	assert_int_equal(covered, N_SHARED / UB * UB); /* whole ubatches (and pages) of the shared ids */
	size_t diff = 0;
	for (size_t i = 0; i < (1 + N_DEC) * V; i++)
		diff += memcmp(&cold[i], &shr[i], sizeof *shr) != 0;
	if (diff)
		fprintf(stderr, "%s: %zu of %zu logits differ\n", policy, diff, (1 + N_DEC) * V);
	assert_int_equal(diff, 0);
	free(lp);
	free(cold);
	free(shr);
	hostkv_close(h);
	engine_free(e);
	backend_free(be);
	harness_stop(&hs);
}

static void test_exact_full(void **state)
{
	(void)state;
	exact_case("full");
}

static void test_exact_freekv(void **state)
{
	(void)state;
	exact_case("freekv");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_exact_full, h_teardown),
		cmocka_unit_test_teardown(test_exact_freekv, h_teardown),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
