/* Slow test: the real SmolLM2-135M-Instruct Q4_1 GGUF (Q4_1 matrices, a Q8_0 embedding) loads as
 * it is — no tensor converted — and its perplexity on tests/data/stories_corpus.txt is within 1%
 * of its dequantized F32 copy's, on the CPU backend (prefill through dequantized tiles), and the
 * next-token logits of one decode step (the dot kernels) agree to 2% of their range.
 *
 * Files: $FREEKV_SMOLLM2_Q4_1 and $FREEKV_SMOLLM2_F32, else scripts/fetch-models.sh's cache
 * (${FREEKV_CACHE:-$HOME/.cache/freekv}/smollm2/SmolLM2-135M-Instruct.{Q4_1,F32}.gguf); skipped
 * (77) when absent. The text is cut into tokens by greedy longest match over the model's
 * byte-level vocabulary (GPT-2 byte mapping): real text as real tokens, without depending on
 * the tokenizer's pre-tokenizer; both models score the same ids. */
#include "test_util.h"

#include <math.h>

#include "backend.h"
#include "engine.h"
#include "gguf.h"
#include "model.h"

static char q_path[4096], f_path[4096];

static bool pick(char *out, const char *env, const char *name)
{
	const char *e = getenv(env), *cache = getenv("FREEKV_CACHE"), *home = getenv("HOME");
	if (e)
		snprintf(out, 4096, "%s", e);
	else if (cache)
		snprintf(out, 4096, "%s/smollm2/%s", cache, name);
	else
		snprintf(out, 4096, "%s/.cache/freekv/smollm2/%s", home ? home : "", name);
	if (access(out, R_OK)) {
		fprintf(stderr, "skip: %s not found (set %s or run scripts/fetch-models.sh)\n", out, env);
		return false;
	}
	return true;
}

/* GPT-2's byte -> code point map, as UTF-8 (at most 2 bytes). */
static int byte_utf8(unsigned b, char *out)
{
	unsigned cp = b;
	if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)) {
		unsigned n = 0;
		for (unsigned x = 0; x < b; x++)
			n += !((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174);
		cp = 256 + n;
	}
	if (cp < 0x80) {
		out[0] = (char)cp;
		return 1;
	}
	out[0] = (char)(0xc0 | cp >> 6);
	out[1] = (char)(0x80 | (cp & 0x3f));
	return 2;
}

struct piece {
	const char *s;
	size_t len;
	int id;
};

static int cmp_piece(const void *a, const void *b)
{
	const struct piece *x = a, *y = b;
	size_t n = x->len < y->len ? x->len : y->len;
	int c = memcmp(x->s, y->s, n);
	return c ? c : (x->len > y->len) - (x->len < y->len);
}

/* Greedy longest-match tokenization of text (bytes mapped as GPT-2 does). Returns the count. */
static int tokenize(const struct fkv_model *m, const char *text, int32_t *ids, int max)
{
	struct gguf_arr toks;
	assert_int_equal(gguf_get_arr(model_gguf(m), "tokenizer.ggml.tokens", &toks), 0);
	struct piece *v = malloc(toks.n * sizeof *v);
	size_t tl = strlen(text);
	char *mapped = malloc(2 * tl + 1);
	assert_true(v && mapped);
	for (uint64_t i = 0; i < toks.n; i++)
		v[i] = (struct piece){ toks.strs[i].s, toks.strs[i].len, (int)i };
	qsort(v, toks.n, sizeof *v, cmp_piece);
	size_t ml = 0;
	for (size_t i = 0; i < tl; i++)
		ml += (size_t)byte_utf8((unsigned char)text[i], mapped + ml);
	int n = 0;
	for (size_t at = 0; at < ml && n < max;) {
		size_t best = 0;
		int id = -1;
		for (size_t len = 1; len <= 48 && at + len <= ml; len++) {
			struct piece k = { mapped + at, len, 0 };
			struct piece *hit = bsearch(&k, v, toks.n, sizeof *v, cmp_piece);
			if (hit) {
				best = len;
				id = hit->id;
			}
		}
		assert_true(id >= 0); /* every single mapped byte is a token */
		ids[n++] = id;
		at += best;
	}
	free(v);
	free(mapped);
	return n;
}

/* Perplexity of ids in windows of w tokens (each a fresh sequence), and the logits after the
 * first 32 ids followed by one decode step of id 33 (into step, vocab floats). */
static double perplexity(const struct fkv_model *m, const int32_t *ids, int n, int w, float *step)
{
	struct backend *be;
	struct engine *e;
	char err[512];
	const int V = m->cfg.vocab_size;
	assert_int_equal(backend_cpu_new(&be, 0), 0);
	struct engine_opts o = { .max_ctx = w + 1, .ubatch = 128 };
	if (engine_new(&e, m, be, &o, err, sizeof err))
		fail_msg("engine_new: %s", err);
	float *lg = malloc((size_t)w * V * sizeof *lg);
	assert_non_null(lg);
	double nll = 0;
	long count = 0;
	for (int at = 0; at + 2 <= n; at += w) {
		int len = n - at < w ? n - at : w, s;
		assert_int_equal(engine_seq_new(e, &s, err, sizeof err), 0);
		if (engine_prefill(e, s, ids + at, len, lg, true, err, sizeof err))
			fail_msg("engine_prefill: %s", err);
		for (int i = 0; i + 1 < len; i++) {
			const float *l = lg + (size_t)i * V;
			double mx = -INFINITY, z = 0;
			for (int j = 0; j < V; j++)
				mx = fmax(mx, l[j]);
			for (int j = 0; j < V; j++)
				z += exp(l[j] - mx);
			nll += mx + log(z) - l[ids[at + i + 1]];
			count++;
		}
		engine_seq_free(e, s);
	}
	int s;
	assert_int_equal(engine_seq_new(e, &s, err, sizeof err), 0);
	assert_int_equal(engine_prefill(e, s, ids, 32, lg, false, err, sizeof err), 0);
	if (engine_decode(e, 1, &s, ids + 32, step, err, sizeof err))
		fail_msg("engine_decode: %s", err);
	free(lg);
	engine_free(e);
	backend_free(be);
	return exp(nll / (double)count);
}

static void test_smollm2_q4_1(void **state)
{
	(void)state;
	struct fkv_model q, f;
	char err[512];
	if (model_load(q_path, &q, err, sizeof err))
		fail_msg("%s: %s", q_path, err);
	if (model_load(f_path, &f, err, sizeof err))
		fail_msg("%s: %s", f_path, err);
	/* as the file has them: Q4_1 matrices, the Q8_0 embedding tied to the output */
	assert_int_equal(q.tok_embd.quant, FKV_Q8_0);
	assert_int_equal(q.output.quant, FKV_Q8_0);
	for (int l = 0; l < q.cfg.n_layers; l++) {
		assert_int_equal(q.layers[l].wq.quant, FKV_Q4_1);
		assert_int_equal(q.layers[l].w_down.quant, FKV_Q4_1);
		assert_int_equal(q.layers[l].attn_norm.quant, FKV_QNONE);
	}
	const struct gguf_tensor_info *t = gguf_tensor(model_gguf(&q), gguf_find_tensor(model_gguf(&q), "blk.0.attn_q.weight"));
	assert_ptr_equal(q.layers[0].wq.data, t->data); /* points into the mapping: not converted */
	assert_int_equal(f.layers[0].wq.quant, FKV_QNONE);

	size_t len;
	char path[4096];
	snprintf(path, sizeof path, "%s/tests/data/stories_corpus.txt", FREEKV_SOURCE_DIR);
	char *z = (char *)test_read_file(path, &len); /* NUL-terminated */
	int32_t ids[1024];
	int n = tokenize(&q, z, ids, 1024);
	assert_true(n > 256);
	const int V = q.cfg.vocab_size;
	float *sq = malloc((size_t)V * sizeof *sq), *sf = malloc((size_t)V * sizeof *sf);
	assert_true(sq && sf);
	double pq = perplexity(&q, ids, n, 256, sq), pf = perplexity(&f, ids, n, 256, sf);
	double r = fabs(pq - pf) / pf;
	print_message("SmolLM2 %d tokens: perplexity Q4_1 %.4f, F32 copy %.4f, relative difference %.5f\n", n, pq, pf, r);
	assert_true(pf > 1 && pf < 1000);
	assert_true(r < 0.01);
	double d = 0, lo = INFINITY, hi = -INFINITY;
	for (int j = 0; j < V; j++) {
		d = fmax(d, fabs(sq[j] - sf[j]));
		lo = fmin(lo, sf[j]);
		hi = fmax(hi, sf[j]);
	}
	print_message("decode step logits: max difference %.4f over a range of %.4f\n", d, hi - lo);
	assert_true(d < 0.02 * (hi - lo));
	free(sq);
	free(sf);
	free(z);
	model_free(&q);
	model_free(&f);
}

int main(void)
{
	if (!pick(q_path, "FREEKV_SMOLLM2_Q4_1", "SmolLM2-135M-Instruct.Q4_1.gguf") ||
	    !pick(f_path, "FREEKV_SMOLLM2_F32", "SmolLM2-135M-Instruct.F32.gguf"))
		return 77;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_smollm2_q4_1),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
