/* Tests model_load() on GGUF files with block-quantized tensors (docs/quant.md, "Loading"):
 * stories260K rewritten with some matrices as Q8_0 / Q4_1 / Q5_0 blocks loads with the blocks
 * in place (same bytes, quant set, KV dtype f16, fingerprint changed) and runs a forward pass;
 * bad files are refused with a message naming the tensor — a quantized norm, rows that are not
 * whole blocks, a type without kernels, a byte size the loader does not expect, a file cut
 * inside the last block. The numerics of quantized models are tests/test_quant_model.sh's. */
#include "test_util.h"

#include <errno.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend.h"
#include "engine.h"
#include "gguf.h"
#include "model.h"

static char gguf_path[4096], path[64];
static uint64_t seed = 0x51ab;

static int setup(void **state)
{
	(void)state;
	const char *p = test_model_path("stories260K/stories260K.gguf");
	if (!p)
		return -1;
	snprintf(gguf_path, sizeof gguf_path, "%s", p);
	return 0;
}

static void load_ok(const char *path, struct fkv_model *m)
{
	char err[512];
	int ret = model_load(path, m, err, sizeof err);
	if (ret)
		fail_msg("model_load(%s): %d %s", path, ret, err);
}

/* One tensor to write: its name, ggml type id, ggml dims and bytes. */
struct wt {
	char name[64];
	uint32_t type;
	int n_dims;
	uint64_t ne[2];
	const void *data;
	size_t bytes;
};

static void put_str(FILE *f, const char *s)
{
	uint64_t n = strlen(s);
	fwrite(&n, 8, 1, f);
	fwrite(s, 1, n, f);
}

static void put_f32(FILE *f, const char *key, float v)
{
	uint32_t t = GGUF_TYPE_FLOAT32;
	put_str(f, key);
	fwrite(&t, 4, 1, f);
	fwrite(&v, 4, 1, f);
}

static void put_u32(FILE *f, const char *key, uint32_t v)
{
	uint32_t t = GGUF_TYPE_UINT32;
	put_str(f, key);
	fwrite(&t, 4, 1, f);
	fwrite(&v, 4, 1, f);
}

/* A llama GGUF of m's config with the tensors ts (interleaved rope, as m was loaded). */
static void write_gguf(const struct fkv_model *m, const struct wt *ts, int n, const char *path)
{
	FILE *f = fopen(path, "wb");
	assert_non_null(f);
	const struct fkv_model_config *c = &m->cfg;
	uint32_t magic = 0x46554747u, ver = 3, st = GGUF_TYPE_STRING;
	uint64_t nt = (uint64_t)n, nkv = 8;
	fwrite(&magic, 4, 1, f);
	fwrite(&ver, 4, 1, f);
	fwrite(&nt, 8, 1, f);
	fwrite(&nkv, 8, 1, f);
	put_str(f, "general.architecture");
	fwrite(&st, 4, 1, f);
	put_str(f, "llama");
	put_u32(f, "llama.context_length", (uint32_t)c->ctx_len);
	put_u32(f, "llama.embedding_length", (uint32_t)c->dim);
	put_u32(f, "llama.block_count", (uint32_t)c->n_layers);
	put_u32(f, "llama.feed_forward_length", (uint32_t)c->ffn_dim);
	put_u32(f, "llama.attention.head_count", (uint32_t)c->n_heads);
	put_u32(f, "llama.attention.head_count_kv", (uint32_t)c->n_kv_heads);
	put_f32(f, "llama.attention.layer_norm_rms_epsilon", c->norm_eps);
	uint64_t off = 0;
	for (int i = 0; i < n; i++) {
		put_str(f, ts[i].name);
		uint32_t nd = (uint32_t)ts[i].n_dims;
		fwrite(&nd, 4, 1, f);
		fwrite(ts[i].ne, 8, nd, f);
		fwrite(&ts[i].type, 4, 1, f);
		fwrite(&off, 8, 1, f);
		off += (ts[i].bytes + 31) / 32 * 32;
	}
	while (ftell(f) % 32)
		fputc(0, f);
	for (int i = 0; i < n; i++) {
		fwrite(ts[i].data, 1, ts[i].bytes, f);
		while (i + 1 < n && ftell(f) % 32)
			fputc(0, f);
	}
	assert_int_equal(ferror(f), 0);
	fclose(f);
}

/* Every tensor of m as the loader gave it (F32 for stories260K). */
static int model_tensors(const struct fkv_model *m, struct wt *ts)
{
	static const char *const ln[] = { "attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
					  "attn_output.weight", "ffn_norm.weight", "ffn_gate.weight",
					  "ffn_up.weight", "ffn_down.weight" };
	int n = 0;
	const struct fkv_tensor *g[] = { &m->tok_embd, &m->out_norm };
	const char *gn[] = { "token_embd.weight", "output_norm.weight" };
	for (int i = 0; i < 2 + 9 * m->cfg.n_layers; i++) {
		const struct fkv_tensor *t;
		if (i < 2) {
			t = g[i];
			snprintf(ts[n].name, sizeof ts[n].name, "%s", gn[i]);
		} else {
			const struct fkv_layer_weights *w = &m->layers[(i - 2) / 9];
			const struct fkv_tensor *lt[] = { &w->attn_norm, &w->wq, &w->wk, &w->wv, &w->wo,
							  &w->ffn_norm, &w->w_gate, &w->w_up, &w->w_down };
			t = lt[(i - 2) % 9];
			snprintf(ts[n].name, sizeof ts[n].name, "blk.%d.%s", (i - 2) / 9, ln[(i - 2) % 9]);
		}
		assert_int_equal(t->dtype, FKV_F32);
		ts[n].type = 0;
		ts[n].n_dims = t->n_dims;
		ts[n].ne[0] = (uint64_t)(t->n_dims == 2 ? t->shape[1] : t->shape[0]);
		ts[n].ne[1] = (uint64_t)t->shape[0];
		ts[n].data = t->data;
		ts[n].bytes = model_tensor_bytes(t);
		n++;
	}
	return n;
}

static int find(const struct wt *ts, int n, const char *name)
{
	for (int i = 0; i < n; i++)
		if (!strcmp(ts[i].name, name))
			return i;
	fail_msg("no tensor %s", name);
	return -1;
}

/* Random blocks of ggml type `type` (bb bytes per block of be) for ts[i], f16 scales finite. */
static void *quantize_rand(struct wt *t, uint32_t type, int be, size_t bb)
{
	size_t nb = t->ne[0] * t->ne[1] / (uint64_t)be;
	uint8_t *p = malloc(nb * bb);
	assert_non_null(p);
	for (size_t i = 0; i < nb * bb; i++)
		p[i] = (uint8_t)test_rand(&seed);
	for (size_t b = 0; b < nb; b++) {
		uint16_t d = f32_to_f16(test_randf(&seed) / 64);
		memcpy(p + b * bb, &d, 2);
		if (type == FKV_Q4_1)
			memcpy(p + b * bb + 2, &d, 2);
	}
	t->type = type;
	t->data = p;
	t->bytes = nb * bb;
	return p;
}

static void expect_error(const struct fkv_model *h, const struct wt *ts, int n, const char *path, int want,
			 const char *needle, const char *needle2)
{
	struct fkv_model g;
	char err[512] = "";
	write_gguf(h, ts, n, path);
	int ret = model_load(path, &g, err, sizeof err);
	if (ret != want || !strstr(err, needle) || (needle2 && !strstr(err, needle2)))
		fail_msg("model_load: %d '%s' (expected %d with '%s' and '%s')", ret, err, want, needle,
			 needle2 ? needle2 : "");
}

static void test_quant_load(void **state)
{
	(void)state;
	int fd = -1;
	snprintf(path, sizeof path, "/tmp/freekv-quant-XXXXXX.gguf");
	assert_true((fd = mkstemps(path, 5)) >= 0);
	close(fd);
	struct fkv_model h, g;
	load_ok(gguf_path, &h);
	struct wt ts[64];
	int n = model_tensors(&h, ts);
	const int iq = find(ts, n, "blk.0.attn_q.weight"), iu = find(ts, n, "blk.1.ffn_up.weight");
	const int ie = find(ts, n, "token_embd.weight");
	void *a = quantize_rand(&ts[iq], FKV_Q8_0, 32, 34);
	void *b = quantize_rand(&ts[iu], FKV_Q4_1, 32, 20);
	void *c = quantize_rand(&ts[ie], FKV_Q5_0, 32, 22);
	write_gguf(&h, ts, n, path);
	load_ok(path, &g);
	assert_int_equal(g.layers[0].wq.quant, FKV_Q8_0);
	assert_int_equal(g.layers[0].wq.dtype, FKV_F32);
	assert_int_equal(g.layers[0].wq.shape[0], h.layers[0].wq.shape[0]);
	assert_int_equal(g.layers[0].wq.shape[1], h.layers[0].wq.shape[1]);
	assert_memory_equal(g.layers[0].wq.data, a, ts[iq].bytes); /* the blocks, not a conversion */
	assert_int_equal(model_tensor_bytes(&g.layers[0].wq), ts[iq].bytes);
	assert_int_equal(g.layers[1].w_up.quant, FKV_Q4_1);
	assert_memory_equal(g.layers[1].w_up.data, b, ts[iu].bytes);
	assert_int_equal(g.tok_embd.quant, FKV_Q5_0);
	assert_true(g.cfg.tied_embeddings);
	assert_int_equal(g.output.quant, FKV_Q5_0);
	assert_int_equal(g.layers[0].wk.quant, FKV_QNONE);
	assert_int_equal(g.cfg.dtype, FKV_F16); /* quantized weights: f16 KV, as llama.cpp */
	assert_memory_not_equal(g.fingerprint, h.fingerprint, FKV_FINGERPRINT_BYTES);
	/* a forward pass over the blocks gives finite logits */
	struct backend *be;
	struct engine *e;
	char err[512];
	int s;
	assert_int_equal(backend_cpu_new(&be, 2), 0);
	struct engine_opts o = { .ubatch = 4 };
	if (engine_new(&e, &g, be, &o, err, sizeof err))
		fail_msg("engine_new: %s", err);
	int32_t ids[6] = { 1, 42, 7, 300, 9, 11 };
	float *lg = malloc(6 * (size_t)g.cfg.vocab_size * sizeof *lg);
	assert_non_null(lg);
	assert_int_equal(engine_seq_new(e, &s, err, sizeof err), 0);
	if (engine_prefill(e, s, ids, 6, lg, true, err, sizeof err))
		fail_msg("engine_prefill: %s", err);
	for (int i = 0; i < 6 * g.cfg.vocab_size; i++)
		assert_true(isfinite(lg[i]));
	free(lg);
	engine_free(e);
	backend_free(be);
	model_free(&g);

	/* a file cut inside the last block */
	write_gguf(&h, ts, n, path);
	struct stat sb;
	assert_int_equal(stat(path, &sb), 0);
	assert_int_equal(truncate(path, sb.st_size - 10), 0);
	assert_int_equal(model_load(path, &g, err, sizeof err), -EINVAL);
	assert_non_null(strstr(err, ts[n - 1].name));

	/* a quantized norm */
	const int in = find(ts, n, "blk.0.attn_norm.weight");
	struct wt keep = ts[in];
	void *d = quantize_rand(&ts[in], FKV_Q8_0, 32, 34);
	expect_error(&h, ts, n, path, -EINVAL, "'blk.0.attn_norm.weight'", "Q8_0");
	ts[in] = keep;
	free(d);

	/* rows of 64 are not whole blocks of Q4_K's 256 (the size is what gguf would compute) */
	keep = ts[iq];
	ts[iq].type = FKV_Q4_K;
	ts[iq].bytes = ts[iq].ne[0] * ts[iq].ne[1] / 256 * 144;
	expect_error(&h, ts, n, path, -EINVAL, "blk.0.attn_q.weight", "256");

	/* Q8_1 (ggml id 9, blocks of 32 in 36 bytes) has no kernels */
	ts[iq].type = 9;
	ts[iq].bytes = ts[iq].ne[0] * ts[iq].ne[1] / 32 * 36;
	uint8_t *q81 = calloc(1, ts[iq].bytes);
	assert_non_null(q81);
	ts[iq].data = q81;
	expect_error(&h, ts, n, path, -EPROTO, "'blk.0.attn_q.weight'", "Q8_1");
	free(q81);

	/* a Q8_0 tensor whose declared shape is one row short of its blocks: the next tensor's
	 * offset is where the file says, so only the shape check can catch it */
	ts[iq] = keep;
	ts[iq].ne[1] -= 1;
	expect_error(&h, ts, n, path, -EINVAL, "'blk.0.attn_q.weight'", "shape");

	free(a);
	free(b);
	free(c);
	model_free(&h);
	unlink(path);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_quant_load),
	};
	return cmocka_run_group_tests(tests, setup, NULL);
}
