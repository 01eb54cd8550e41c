/* Tests worker/model/model.c and worker/model/hf_config.c: stories260K loaded from GGUF and from the HF
 * folder give the same config and the same weights, except q/k rows, which differ by the
 * rotary-layout permutation — derived here by matching rows, then checked against the closed
 * form; fingerprints are stable and change with config and bytes; config.json errors name the
 * key; shape, dtype and unexpected-tensor errors name the tensor; misaligned safetensors data
 * is copied to aligned memory with the same values. */
#include "test_util.h"

#include <errno.h>
#include <math.h>
#include <sys/stat.h>

#include <json-c/json.h>

#include "backend.h"
#include "engine.h"
#include "gguf.h"
#include "hf_config.h"
#include "model.h"
#include "synth.h"

static char gguf_path[4096], hf_dir[4096];

static int setup(void **state)
{
	(void)state;
	const char *p = test_model_path("stories260K/stories260K.gguf");
	if (p)
		snprintf(gguf_path, sizeof gguf_path, "%s", p);
	p = test_model_path("stories260K/hf");
	if (p)
		snprintf(hf_dir, sizeof hf_dir, "%s", p);
	return 0;
}

static void load_ok(const char *path, struct fkv_model *m)
{
	char err[512];
	int ret = model_load(path, m, err, sizeof err);
	if (ret)
		fail_msg("model_load(%s): %d %s", path, ret, err);
}

static size_t tensor_bytes(const struct fkv_tensor *t)
{
	return (size_t)(t->shape[0] * t->shape[1]) * dtype_size(t->dtype);
}

static void assert_same_tensor(const struct fkv_tensor *a, const struct fkv_tensor *b)
{
	assert_int_equal(a->dtype, b->dtype);
	assert_int_equal(a->n_dims, b->n_dims);
	assert_int_equal(a->shape[0], b->shape[0]);
	assert_int_equal(a->shape[1], b->shape[1]);
	assert_memory_equal(a->data, b->data, tensor_bytes(a));
}

/* Finds, for every row of the HF matrix, the row of the GGUF matrix in the same head with the
 * same bytes, and checks it is the rotate-half <-> interleaved map: HF row j*d/2 + i of a head
 * is GGUF row 2i + j. Also checks the identity is not a match, so the check can fail. */
static void check_qk_permutation(const struct fkv_tensor *g, const struct fkv_tensor *h, int heads, int d)
{
	assert_int_equal(g->shape[0], (int64_t)heads * d);
	size_t row = (size_t)g->shape[1] * sizeof(float);
	const uint8_t *gb = g->data, *hb = h->data;
	int identity_rows = 0;
	for (int hd = 0; hd < heads; hd++) {
		for (int r = 0; r < d; r++) {
			int found = -1, matches = 0;
			for (int c = 0; c < d; c++) {
				if (!memcmp(hb + (size_t)(hd * d + r) * row, gb + (size_t)(hd * d + c) * row, row)) {
					found = c;
					matches++;
				}
			}
			assert_int_equal(matches, 1);
			int j = r / (d / 2), i = r % (d / 2);
			assert_int_equal(found, 2 * i + j);
			identity_rows += found == r;
		}
	}
	assert_true(identity_rows < heads * d);
}

static void test_gguf_vs_hf(void **state)
{
	(void)state;
	if (!gguf_path[0] || !hf_dir[0])
		skip();
	struct fkv_model g, h;
	load_ok(gguf_path, &g);
	load_ok(hf_dir, &h);
	const struct fkv_model_config *a = &g.cfg, *b = &h.cfg;
	assert_true(g.is_gguf);
	assert_false(h.is_gguf);
	assert_non_null(model_gguf(&g));
	assert_null(model_gguf(&h));
	assert_string_equal(g.path, gguf_path);
	assert_string_equal(h.path, hf_dir);
	assert_string_equal(a->arch, "llama");
	assert_string_equal(b->arch, "llama");
	assert_int_equal(a->n_layers, 5);
	assert_int_equal(a->dim, 64);
	assert_int_equal(a->n_heads, 8);
	assert_int_equal(a->n_kv_heads, 4);
	assert_int_equal(a->head_dim, 8);
	assert_int_equal(a->ffn_dim, 172);
	assert_int_equal(a->vocab_size, 512);
	assert_int_equal(a->bos_id, 1);
	assert_int_equal(a->eos_id, 2);
	assert_true(a->tied_embeddings);
	assert_false(a->qkv_bias);
	assert_int_equal(a->dtype, FKV_F32);
	assert_int_equal(a->rope_style, FKV_ROPE_INTERLEAVED);
	assert_int_equal(b->rope_style, FKV_ROPE_HALVES);
	assert_int_equal(a->ctx_len, 2048); /* what the GGUF says */
	assert_int_equal(b->ctx_len, 512);
	assert_int_equal(a->n_layers, b->n_layers);
	assert_int_equal(a->dim, b->dim);
	assert_int_equal(a->n_heads, b->n_heads);
	assert_int_equal(a->n_kv_heads, b->n_kv_heads);
	assert_int_equal(a->head_dim, b->head_dim);
	assert_int_equal(a->ffn_dim, b->ffn_dim);
	assert_int_equal(a->vocab_size, b->vocab_size);
	assert_true(a->norm_eps == b->norm_eps);
	assert_true(a->rope_theta == b->rope_theta);
	assert_true(a->rope_scaling_factor == 0 && b->rope_scaling_factor == 0);
	assert_int_equal(a->tied_embeddings, b->tied_embeddings);
	assert_int_equal(a->qkv_bias, b->qkv_bias);
	assert_int_equal(a->bos_id, b->bos_id);
	assert_int_equal(a->eos_id, b->eos_id);
	assert_int_equal(a->n_eos, b->n_eos);
	assert_int_equal(a->dtype, b->dtype);

	assert_same_tensor(&g.tok_embd, &h.tok_embd);
	assert_same_tensor(&g.out_norm, &h.out_norm);
	assert_ptr_equal(g.output.data, g.tok_embd.data); /* tied */
	assert_ptr_equal(h.output.data, h.tok_embd.data);
	for (int l = 0; l < a->n_layers; l++) {
		const struct fkv_layer_weights *x = &g.layers[l], *y = &h.layers[l];
		assert_same_tensor(&x->attn_norm, &y->attn_norm);
		assert_same_tensor(&x->wv, &y->wv);
		assert_same_tensor(&x->wo, &y->wo);
		assert_same_tensor(&x->ffn_norm, &y->ffn_norm);
		assert_same_tensor(&x->w_gate, &y->w_gate);
		assert_same_tensor(&x->w_up, &y->w_up);
		assert_same_tensor(&x->w_down, &y->w_down);
		assert_null(x->bq.data);
		assert_null(y->bk.data);
		assert_int_equal(x->wq.shape[0], y->wq.shape[0]);
		assert_int_equal(x->wk.shape[0], 32);
		assert_int_equal(x->wk.shape[1], 64);
		assert_int_equal(x->w_down.shape[0], 64);
		assert_int_equal(x->w_down.shape[1], 172);
		check_qk_permutation(&x->wq, &y->wq, a->n_heads, a->head_dim);
		check_qk_permutation(&x->wk, &y->wk, a->n_kv_heads, a->head_dim);
	}
	model_free(&g);
	model_free(&h);
	model_free(&h); /* safe on a freed (zeroed) model */
}

/* ---- temp folders holding a modified copy of the HF model ---- */

static char tmpdir[64];

static void make_tmpdir(void)
{
	snprintf(tmpdir, sizeof tmpdir, "/tmp/freekv-model-XXXXXX");
	assert_non_null(mkdtemp(tmpdir));
}

static void rm_tmpdir(void)
{
	const char *names[] = { "config.json", "model.safetensors", "x.gguf" };
	char p[256];
	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
		snprintf(p, sizeof p, "%s/%s", tmpdir, names[i]);
		unlink(p);
	}
	rmdir(tmpdir);
}

static void write_all(const char *name, const void *p, size_t len)
{
	test_write_file(tmpdir, name, p, len);
}

/* The stories config with key set to value (a JSON literal), or removed when value is NULL. */
static void write_config(const char *key, const char *value)
{
	char path[4200];
	snprintf(path, sizeof path, "%s/config.json", hf_dir);
	struct json_object *root = json_object_from_file(path);
	assert_non_null(root);
	if (key) {
		json_object_object_del(root, key);
		if (value)
			json_object_object_add(root, key, json_tokener_parse(value));
	}
	const char *s = json_object_to_json_string(root);
	write_all("config.json", s, strlen(s));
	json_object_put(root);
}

static uint8_t *stories_weights(size_t *len)
{
	char path[4200];
	snprintf(path, sizeof path, "%s/model.safetensors", hf_dir);
	return test_read_file(path, len);
}

static int load_tmp(char *err, size_t errlen)
{
	struct fkv_model m;
	int ret = model_load(tmpdir, &m, err, errlen);
	if (!ret)
		model_free(&m);
	return ret;
}

static void expect_load(int want, const char *needle)
{
	char err[512] = "";
	int ret = load_tmp(err, sizeof err);
	if (ret != want || !strstr(err, needle))
		fail_msg("want %d containing '%s', got %d: %s", want, needle, ret, err);
}

static void test_fingerprint(void **state)
{
	(void)state;
	if (!gguf_path[0] || !hf_dir[0])
		skip();
	struct fkv_model a, b, g;
	load_ok(hf_dir, &a);
	load_ok(hf_dir, &b);
	load_ok(gguf_path, &g);
	assert_memory_equal(a.fingerprint, b.fingerprint, FKV_FINGERPRINT_BYTES);
	assert_memory_not_equal(a.fingerprint, g.fingerprint, FKV_FINGERPRINT_BYTES);
	char hex[2 * FKV_FINGERPRINT_BYTES + 1];
	model_fingerprint_hex(&a, hex);
	assert_int_equal(strlen(hex), 64);
	char want[3];
	snprintf(want, sizeof want, "%02x", a.fingerprint[31]);
	assert_memory_equal(hex + 62, want, 2);

	make_tmpdir();
	size_t len;
	uint8_t *w = stories_weights(&len);
	write_config(NULL, NULL);
	write_all("model.safetensors", w, len);
	struct fkv_model c;
	load_ok(tmpdir, &c); /* same files elsewhere: same fingerprint */
	assert_memory_equal(a.fingerprint, c.fingerprint, FKV_FINGERPRINT_BYTES);
	model_free(&c);
	/* one byte of model.norm.weight (all 256 bytes are sampled), found in the file by content */
	uint8_t *hit = memmem(w, len, a.out_norm.data, 256);
	assert_non_null(hit);
	hit[5] ^= 0x01;
	write_all("model.safetensors", w, len);
	load_ok(tmpdir, &c);
	assert_memory_not_equal(a.fingerprint, c.fingerprint, FKV_FINGERPRINT_BYTES);
	model_free(&c);
	hit[5] ^= 0x01;
	write_all("model.safetensors", w, len);
	/* a config change with the same tensors */
	write_config("max_position_embeddings", "1024");
	load_ok(tmpdir, &c);
	assert_memory_not_equal(a.fingerprint, c.fingerprint, FKV_FINGERPRINT_BYTES);
	model_free(&c);
	write_config("rope_theta", "10000.5");
	load_ok(tmpdir, &c);
	assert_memory_not_equal(a.fingerprint, c.fingerprint, FKV_FINGERPRINT_BYTES);
	model_free(&c);
	write_config(NULL, NULL);
	load_ok(tmpdir, &c);
	assert_memory_equal(a.fingerprint, c.fingerprint, FKV_FINGERPRINT_BYTES);
	model_free(&c);
	free(w);
	rm_tmpdir();
	model_free(&a);
	model_free(&b);
	model_free(&g);
}

static void test_hf_config_parse(void **state)
{
	(void)state;
	struct fkv_model_config c;
	char err[256];
	const char *llama31 =
		"{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":4096,\"intermediate_size\":14336,"
		"\"num_hidden_layers\":32,\"num_attention_heads\":32,\"num_key_value_heads\":8,\"vocab_size\":128256,"
		"\"rms_norm_eps\":1e-05,\"max_position_embeddings\":131072,\"rope_theta\":500000.0,"
		"\"rope_scaling\":{\"factor\":8.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
		"\"original_max_position_embeddings\":8192,\"rope_type\":\"llama3\"},\"bos_token_id\":128000,"
		"\"eos_token_id\":[128001,128008,128009],\"torch_dtype\":\"bfloat16\",\"tie_word_embeddings\":false}";
	assert_int_equal(hf_config_parse(llama31, strlen(llama31), &c, err, sizeof err), 0);
	assert_string_equal(c.arch, "llama");
	assert_int_equal(c.head_dim, 128); /* derived */
	assert_int_equal(c.n_kv_heads, 8);
	assert_true(c.rope_scaling_factor == 8.0f && c.rope_low_freq_factor == 1.0f && c.rope_high_freq_factor == 4.0f);
	assert_int_equal(c.rope_original_ctx, 8192);
	assert_int_equal(c.n_eos, 3);
	assert_int_equal(c.eos_id, 128001);
	assert_int_equal(c.eos_ids[2], 128009);
	assert_int_equal(c.bos_id, 128000);
	assert_int_equal(c.dtype, FKV_BF16);
	assert_true(c.rope_theta == 500000.0f);
	assert_int_equal(c.rope_style, FKV_ROPE_HALVES);
	assert_false(c.qkv_bias);

	const char *qwen = "{\"architectures\":[\"Qwen2ForCausalLM\"],\"hidden_size\":3584,\"intermediate_size\":18944,"
			   "\"num_hidden_layers\":28,\"num_attention_heads\":28,\"num_key_value_heads\":4,"
			   "\"vocab_size\":152064,\"rms_norm_eps\":1e-06,\"max_position_embeddings\":32768,"
			   "\"sliding_window\":131072,\"use_sliding_window\":false,\"rope_scaling\":null}";
	assert_int_equal(hf_config_parse(qwen, strlen(qwen), &c, err, sizeof err), 0);
	assert_string_equal(c.arch, "qwen2");
	assert_true(c.qkv_bias);
	assert_int_equal(c.sliding_window, 0);
	assert_int_equal(c.bos_id, -1);
	assert_int_equal(c.n_eos, 0);
	assert_true(c.rope_theta == 10000.0f); /* default */
	assert_int_equal(c.dtype, FKV_F32);

	const char *mistral = "{\"model_type\":\"mistral\",\"hidden_size\":4096,\"intermediate_size\":14336,"
			      "\"num_hidden_layers\":32,\"num_attention_heads\":32,\"head_dim\":128,"
			      "\"vocab_size\":32000,\"rms_norm_eps\":1e-05,\"max_position_embeddings\":32768,"
			      "\"sliding_window\":4096,\"eos_token_id\":2}";
	assert_int_equal(hf_config_parse(mistral, strlen(mistral), &c, err, sizeof err), 0);
	assert_string_equal(c.arch, "mistral");
	assert_int_equal(c.n_kv_heads, 32); /* default = heads */
	assert_int_equal(c.sliding_window, 4096);
	assert_int_equal(c.eos_id, 2);

	/* each required key, removed, is named */
	static const char *const required[] = { "hidden_size", "intermediate_size", "num_hidden_layers",
						"num_attention_heads", "vocab_size", "rms_norm_eps",
						"max_position_embeddings" };
	for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) {
		struct json_object *o = json_tokener_parse(llama31);
		json_object_object_del(o, required[i]);
		const char *s = json_object_to_json_string(o);
		memset(&c, 0x5a, sizeof c);
		struct fkv_model_config before = c;
		int ret = hf_config_parse(s, strlen(s), &c, err, sizeof err);
		assert_int_equal(ret, -EINVAL);
		assert_non_null(strstr(err, required[i]));
		assert_memory_equal(&c, &before, sizeof c); /* untouched on failure */
		json_object_put(o);
	}
	static const struct {
		const char *key, *value, *needle;
		int ret;
	} bad[] = {
		{ "architectures", "[\"GPT2LMHeadModel\"]", "GPT2LMHeadModel", -EPROTO },
		{ "rope_scaling", "{\"rope_type\":\"yarn\",\"factor\":4.0}", "yarn", -EPROTO },
		{ "rope_scaling", "{\"rope_type\":\"llama3\",\"factor\":8.0}", "low_freq_factor", -EINVAL },
		{ "torch_dtype", "\"float8_e4m3fn\"", "float8_e4m3fn", -EPROTO },
		{ "hidden_size", "\"4096\"", "hidden_size", -EINVAL },
		{ "num_key_value_heads", "5", "multiple", -EINVAL },
		{ "eos_token_id", "[1, \"x\"]", "eos_token_id", -EINVAL },
		{ "bos_token_id", "200000", "vocabulary", -EINVAL },
		{ "num_hidden_layers", "100000", "layers", -EINVAL },
		{ "tie_word_embeddings", "1", "tie_word_embeddings", -EINVAL },
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		struct json_object *o = json_tokener_parse(llama31);
		json_object_object_del(o, bad[i].key);
		json_object_object_add(o, bad[i].key, json_tokener_parse(bad[i].value));
		const char *s = json_object_to_json_string(o);
		int ret = hf_config_parse(s, strlen(s), &c, err, sizeof err);
		if (ret != bad[i].ret || !strstr(err, bad[i].needle))
			fail_msg("%s=%s: want %d '%s', got %d: %s", bad[i].key, bad[i].value, bad[i].ret, bad[i].needle,
				 ret, err);
		json_object_put(o);
	}
	/* every prefix of a valid config is refused (and nothing leaks) */
	size_t n = strlen(llama31);
	for (size_t cut = 0; cut < n; cut++) {
		int ret = hf_config_parse(llama31, cut, &c, err, sizeof err);
		if (ret != -EINVAL)
			fail_msg("prefix of %zu bytes: %d %s", cut, ret, err);
	}
	assert_int_equal(hf_config_parse("{\"hidden_size\":", 15, &c, err, sizeof err), -EINVAL);
	assert_non_null(strstr(err, "invalid JSON"));
	assert_int_equal(hf_config_parse("[]", 2, &c, err, sizeof err), -EINVAL);
}

static void test_load_errors(void **state)
{
	(void)state;
	if (!hf_dir[0])
		skip();
	make_tmpdir();
	size_t len;
	uint8_t *w = stories_weights(&len);
	write_all("model.safetensors", w, len);

	write_config("hidden_size", NULL);
	expect_load(-EINVAL, "'hidden_size'");
	write_config("intermediate_size", "171");
	expect_load(-EINVAL, "tensor 'model.layers.0.mlp.gate_proj.weight' has shape (172, 64), expected (171, 64)");
	write_config("vocab_size", "500");
	expect_load(-EINVAL, "tensor 'model.embed_tokens.weight' has shape (512, 64), expected (500, 64)");
	write_config("num_hidden_layers", "6");
	expect_load(-EINVAL, "missing tensor 'model.layers.5.input_layernorm.weight'");
	write_config("num_hidden_layers", "4");
	expect_load(-EINVAL, "unexpected tensor 'model.layers.4.");
	write_config("architectures", "[\"Qwen2ForCausalLM\"]"); /* wants biases the file lacks */
	expect_load(-EINVAL, "missing tensor 'model.layers.0.self_attn.q_proj.bias'");
	write_config("head_dim", "16");
	expect_load(-EINVAL, "'model.layers.0.self_attn.q_proj.weight' has shape (64, 64), expected (128, 64)");

	/* an unsupported dtype in the weights, named */
	write_config(NULL, NULL);
	const char *h = "{\"model.embed_tokens.weight\":{\"dtype\":\"I32\",\"shape\":[512,64],\"data_offsets\":[0,131072]}}";
	size_t hl = strlen(h), ilen = 8 + hl + 131072;
	uint8_t *img = calloc(1, ilen);
	uint64_t hl64 = hl;
	memcpy(img, &hl64, 8);
	memcpy(img + 8, h, hl);
	write_all("model.safetensors", img, ilen);
	free(img);
	expect_load(-EPROTO, "'model.embed_tokens.weight' has unsupported dtype I32");

	/* misaligned data (header one byte longer): loads, values equal, pointers aligned */
	uint64_t ohl;
	memcpy(&ohl, w, 8);
	uint8_t *mis = malloc(len + 1);
	uint64_t nhl = ohl + 1;
	memcpy(mis, &nhl, 8);
	memcpy(mis + 8, w + 8, ohl);
	mis[8 + ohl] = ' ';
	memcpy(mis + 8 + ohl + 1, w + 8 + ohl, len - 8 - ohl);
	write_all("model.safetensors", mis, len + 1);
	free(mis);
	struct fkv_model a, b;
	load_ok(hf_dir, &a);
	load_ok(tmpdir, &b);
	assert_int_equal((uintptr_t)b.layers[2].w_up.data % 4, 0);
	assert_int_equal((uintptr_t)b.tok_embd.data % 4, 0);
	assert_same_tensor(&a.layers[2].w_up, &b.layers[2].w_up);
	assert_same_tensor(&a.tok_embd, &b.tok_embd);
	assert_memory_equal(a.fingerprint, b.fingerprint, FKV_FINGERPRINT_BYTES);
	model_free(&a);
	model_free(&b);

	/* GGUF: a tensor of a quantised type without kernels (docs/quant.md) is refused by name */
	if (gguf_path[0]) {
		size_t glen;
		uint8_t *gb = test_read_file(gguf_path, &glen);
		const char name[] = "blk.2.ffn_up.weight";
		uint8_t *at = memmem(gb, 20000, name, sizeof name - 1);
		assert_non_null(at);
		uint32_t q81 = 9; /* Q8_1; after the name: n_dims u32, 2 x ne u64, then the type */
		memcpy(at + sizeof name - 1 + 4 + 16, &q81, 4);
		write_all("x.gguf", gb, glen);
		free(gb);
		char p[128], err[512];
		snprintf(p, sizeof p, "%s/x.gguf", tmpdir);
		struct fkv_model m;
		int ret = model_load(p, &m, err, sizeof err);
		assert_int_equal(ret, -EPROTO);
		assert_non_null(strstr(err, "tensor 'blk.2.ffn_up.weight' has type Q8_1"));
	}
	char err[512];
	struct fkv_model m;
	assert_int_equal(model_load("/nonexistent/model.gguf", &m, err, sizeof err), -ENOENT);
	char cfg[4200];
	snprintf(cfg, sizeof cfg, "%s/config.json", hf_dir);
	assert_int_equal(model_load(cfg, &m, err, sizeof err), -EINVAL);
	assert_non_null(strstr(err, "neither a .gguf file nor a Hugging Face folder"));
	free(w);
	rm_tmpdir();
	assert_int_equal(model_load(tmpdir, &m, err, sizeof err), -ENOENT);
}

/* model_load over GGUF files with random bytes of the metadata/tensor table changed or cut:
 * every outcome is a clean success or a clean error (run under ASan: no crash, no leak). */
static void test_load_fuzz(void **state)
{
	(void)state;
	if (!gguf_path[0])
		skip();
	make_tmpdir();
	size_t len;
	uint8_t *orig = test_read_file(gguf_path, &len), *p = malloc(len);
	assert_non_null(p);
	char path[128], err[512];
	snprintf(path, sizeof path, "%s/x.gguf", tmpdir);
	uint64_t seed = 77;
	int ok = 0, bad = 0;
	for (int it = 0; it < 120; it++) {
		memcpy(p, orig, len);
		for (int k = 0; k < 2; k++)
			p[test_rand(&seed) % 14176] = (uint8_t)test_rand(&seed);
		size_t cut = it % 4 ? len : test_rand(&seed) % len;
		write_all("x.gguf", p, cut);
		struct fkv_model m;
		err[0] = 0;
		int ret = model_load(path, &m, err, sizeof err);
		if (ret == 0) {
			assert_true(m.cfg.n_layers > 0 && m.layers);
			model_free(&m);
			ok++;
		} else {
			assert_true(err[0] != 0);
			bad++;
		}
	}
	assert_true(bad > 0);
	free(p);
	free(orig);
	rm_tmpdir();
}

/* ---- a GGUF written here from a loaded HF model (tests the GGUF path for qwen2) ---- */

struct gw {
	FILE *f;
	uint64_t data_off; /* running offset of the next tensor's data */
};

static void gw_str(FILE *f, const char *s)
{
	uint64_t n = strlen(s);
	fwrite(&n, 8, 1, f);
	fwrite(s, 1, n, f);
}

static void gw_u32(FILE *f, const char *key, uint32_t v)
{
	uint32_t t = GGUF_TYPE_UINT32;
	gw_str(f, key);
	fwrite(&t, 4, 1, f);
	fwrite(&v, 4, 1, f);
}

static void gw_f32(FILE *f, const char *key, float v)
{
	uint32_t t = GGUF_TYPE_FLOAT32;
	gw_str(f, key);
	fwrite(&t, 4, 1, f);
	fwrite(&v, 4, 1, f);
}

struct gw_tensor {
	char name[64];
	const struct fkv_tensor *t;
};

/* Writes m as a GGUF of architecture arch; output: 0 none, 1 m's output head (for a tied model
 * a copy of the embedding), 2 that with one byte changed. With permute, the q/k rows of each head are reordered from the
 * Hugging Face halves layout to interleaved pairs, as llama.cpp's converter does for "llama";
 * rope_freqs (may be NULL) is written as the f32 tensor rope_freqs.weight. */
static void write_gguf_ex(const struct fkv_model *m, const char *arch, int output, bool permute,
			  const struct fkv_tensor *rope_freqs, const char *path)
{
	struct gw_tensor ts[4 + 12 * 4];
	int n = 0;
	if (rope_freqs) {
		snprintf(ts[n].name, sizeof ts[n].name, "rope_freqs.weight");
		ts[n++].t = rope_freqs;
	}
	static const char *const ln[] = { "attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
					  "attn_output.weight", "attn_q.bias", "attn_k.bias", "attn_v.bias",
					  "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight" };
	snprintf(ts[n].name, sizeof ts[n].name, "token_embd.weight");
	ts[n++].t = &m->tok_embd;
	snprintf(ts[n].name, sizeof ts[n].name, "output_norm.weight");
	ts[n++].t = &m->out_norm;
	if (output) {
		snprintf(ts[n].name, sizeof ts[n].name, "output.weight");
		ts[n++].t = &m->output;
	}
	assert_true(m->cfg.n_layers <= 4);
	for (int l = 0; l < m->cfg.n_layers; l++) {
		const struct fkv_layer_weights *w = &m->layers[l];
		const struct fkv_tensor *lt[] = { &w->attn_norm, &w->wq, &w->wk, &w->wv, &w->wo, &w->bq,
						  &w->bk, &w->bv, &w->ffn_norm, &w->w_gate, &w->w_up, &w->w_down };
		for (int i = 0; i < 12; i++) {
			if (!lt[i]->data)
				continue;
			snprintf(ts[n].name, sizeof ts[n].name, "blk.%d.%s", l, ln[i]);
			ts[n++].t = lt[i];
		}
	}
	FILE *f = fopen(path, "wb");
	assert_non_null(f);
	const struct fkv_model_config *c = &m->cfg;
	uint32_t u = 0x46554747u, ver = 3;
	uint64_t nt = (uint64_t)n, nkv = 11;
	fwrite(&u, 4, 1, f);
	fwrite(&ver, 4, 1, f);
	fwrite(&nt, 8, 1, f);
	fwrite(&nkv, 8, 1, f);
	uint32_t st = GGUF_TYPE_STRING;
	gw_str(f, "general.architecture");
	fwrite(&st, 4, 1, f);
	gw_str(f, arch);
	char key[128];
	const struct {
		const char *k;
		int v;
	} ints[] = { { "context_length", c->ctx_len }, { "embedding_length", c->dim }, { "block_count", c->n_layers },
		     { "feed_forward_length", c->ffn_dim }, { "attention.head_count", c->n_heads },
		     { "attention.head_count_kv", c->n_kv_heads } };
	for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
		snprintf(key, sizeof key, "%s.%s", arch, ints[i].k);
		gw_u32(f, key, (uint32_t)ints[i].v);
	}
	snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", arch);
	gw_f32(f, key, c->norm_eps);
	snprintf(key, sizeof key, "%s.rope.freq_base", arch);
	gw_f32(f, key, c->rope_theta);
	gw_u32(f, "tokenizer.ggml.bos_token_id", (uint32_t)c->bos_id);
	gw_u32(f, "tokenizer.ggml.eos_token_id", (uint32_t)c->eos_id);
	static const uint32_t ggml_type[] = { [FKV_F32] = 0, [FKV_F16] = 1, [FKV_BF16] = 30 };
	uint64_t off = 0;
	for (int i = 0; i < n; i++) {
		const struct fkv_tensor *t = ts[i].t;
		gw_str(f, ts[i].name);
		uint32_t nd = (uint32_t)t->n_dims, ty = ggml_type[t->dtype];
		fwrite(&nd, 4, 1, f);
		uint64_t ne0 = (uint64_t)(nd == 2 ? t->shape[1] : t->shape[0]), ne1 = (uint64_t)t->shape[0];
		fwrite(&ne0, 8, 1, f);
		if (nd == 2)
			fwrite(&ne1, 8, 1, f);
		fwrite(&ty, 4, 1, f);
		fwrite(&off, 8, 1, f);
		off += (tensor_bytes(t) + 31) / 32 * 32;
	}
	while (ftell(f) % 32)
		fputc(0, f);
	for (int i = 0; i < n; i++) {
		size_t b = tensor_bytes(ts[i].t);
		uint8_t *copy = malloc(b);
		memcpy(copy, ts[i].t->data, b);
		if (output == 2 && !strcmp(ts[i].name, "output.weight"))
			copy[b - 1] ^= 1;
		if (permute && (strstr(ts[i].name, "attn_q.") || strstr(ts[i].name, "attn_k."))) {
			/* GGUF row 2i + j of a head is HF row j*d/2 + i */
			int d = m->cfg.head_dim;
			size_t row = b / (size_t)ts[i].t->shape[0];
			for (int64_t r = 0; r < ts[i].t->shape[0]; r++) {
				int64_t h = r / d, k = r % d, src = h * d + (k % 2) * (d / 2) + k / 2;
				memcpy(copy + (size_t)r * row, (const uint8_t *)ts[i].t->data + (size_t)src * row, row);
			}
		}
		fwrite(copy, 1, b, f);
		free(copy);
		while (ftell(f) % 32)
			fputc(0, f);
	}
	assert_int_equal(ferror(f), 0);
	fclose(f);
}

static void write_gguf_from(const struct fkv_model *m, const char *arch, int output, const char *path)
{
	write_gguf_ex(m, arch, output, false, NULL, path);
}

static void test_gguf_qwen2(void **state)
{
	(void)state;
	make_tmpdir();
	char err[512], path[128];
	assert_int_equal(synth_write("tiny-qwen2", 0, FKV_BF16, tmpdir, 11, 0, err, sizeof err), 0);
	struct fkv_model h, g;
	load_ok(tmpdir, &h);
	snprintf(path, sizeof path, "%s/x.gguf", tmpdir);
	for (int output = 0; output < 3; output++) {
		write_gguf_from(&h, "qwen2", output, path);
		load_ok(path, &g);
		assert_string_equal(g.cfg.arch, "qwen2");
		assert_int_equal(g.cfg.rope_style, FKV_ROPE_HALVES); /* qwen2 GGUFs are not permuted */
		assert_true(g.cfg.qkv_bias);
		assert_int_equal(g.cfg.n_kv_heads, h.cfg.n_kv_heads);
		assert_int_equal(g.cfg.head_dim, h.cfg.head_dim);
		assert_int_equal(g.cfg.vocab_size, h.cfg.vocab_size); /* from token_embd: no token list */
		assert_int_equal(g.cfg.bos_id, h.cfg.bos_id);
		assert_true(g.cfg.norm_eps == h.cfg.norm_eps && g.cfg.rope_theta == h.cfg.rope_theta);
		assert_int_equal(g.cfg.dtype, FKV_BF16);
		assert_int_equal(g.cfg.tied_embeddings, output != 2);
		if (output == 2)
			assert_ptr_not_equal(g.output.data, g.tok_embd.data);
		else
			assert_ptr_equal(g.output.data, g.tok_embd.data);
		for (int l = 0; l < h.cfg.n_layers; l++) {
			assert_same_tensor(&g.layers[l].wq, &h.layers[l].wq);
			assert_same_tensor(&g.layers[l].bk, &h.layers[l].bk);
			assert_same_tensor(&g.layers[l].w_down, &h.layers[l].w_down);
		}
		/* the fingerprint identifies the model, not the container: same config and weights,
		 * same fingerprint; a different output head, a different one */
		if (output == 2)
			assert_memory_not_equal(g.fingerprint, h.fingerprint, FKV_FINGERPRINT_BYTES);
		else
			assert_memory_equal(g.fingerprint, h.fingerprint, FKV_FINGERPRINT_BYTES);
		model_free(&g);
	}
	/* the same tensors as a llama GGUF: biases are taken from the tensors, rope is interleaved,
	 * and the fingerprint changes with the rope layout */
	write_gguf_from(&h, "llama", 0, path);
	load_ok(path, &g);
	assert_int_equal(g.cfg.rope_style, FKV_ROPE_INTERLEAVED);
	assert_true(g.cfg.qkv_bias);
	assert_memory_not_equal(g.fingerprint, h.fingerprint, FKV_FINGERPRINT_BYTES);
	model_free(&g);
	write_gguf_from(&h, "gpt2", 0, path);
	struct fkv_model m;
	assert_int_equal(model_load(path, &m, err, sizeof err), -EPROTO);
	assert_non_null(strstr(err, "'gpt2'"));
	model_free(&h);
	char p[256];
	const char *names[] = { "tokenizer.json", "tokenizer_config.json" };
	for (size_t i = 0; i < 2; i++) {
		snprintf(p, sizeof p, "%s/%s", tmpdir, names[i]);
		unlink(p);
	}
	rm_tmpdir();
}

/* ---- llama3 rope scaling from a GGUF's rope_freqs.weight ---- */

/* The divisors llama.cpp's converter writes for llama3 scaling, computed as it does (f32 base
 * frequencies, double arithmetic): written from its description, sharing nothing with model.c. */
static void llama3_divisors(float theta, int d, double factor, double low, double high, double orig,
			    float *out)
{
	for (int i = 0; i < d / 2; i++) {
		float freq = 1.0f / powf(theta, (float)(2 * i) / (float)d);
		double wl = 2 * M_PI / freq;
		if (wl < orig / high) {
			out[i] = 1;
		} else if (wl > orig / low) {
			out[i] = (float)factor;
		} else {
			double sm = (orig / wl - low) / (high - low);
			out[i] = (float)(1 / ((1 - sm) / factor + sm));
		}
	}
}

/* config.json of the tiny model in tmpdir with the given llama3 rope scaling. */
static void set_rope_scaling(double factor, double low, double high, int orig)
{
	char path[256], js[256];
	snprintf(path, sizeof path, "%s/config.json", tmpdir);
	struct json_object *root = json_object_from_file(path);
	assert_non_null(root);
	snprintf(js, sizeof js,
		 "{\"rope_type\":\"llama3\",\"factor\":%.17g,\"low_freq_factor\":%.17g,"
		 "\"high_freq_factor\":%.17g,\"original_max_position_embeddings\":%d}",
		 factor, low, high, orig);
	json_object_object_add(root, "rope_scaling", json_tokener_parse(js));
	assert_int_equal(json_object_to_file(path, root), 0);
	json_object_put(root);
}

/* Logits of every position of ids under m (CPU backend, full KV): (n, vocab), malloc'ed. */
static float *all_logits(const struct fkv_model *m, const int32_t *ids, int n)
{
	struct backend *be;
	struct engine *e;
	char err[256];
	int s;
	assert_int_equal(backend_cpu_new(&be, 1), 0);
	struct engine_opts o = { .ubatch = 64 };
	if (engine_new(&e, m, be, &o, err, sizeof err))
		fail_msg("engine_new: %s", err);
	float *lg = malloc((size_t)n * (size_t)m->cfg.vocab_size * sizeof *lg);
	assert_non_null(lg);
	assert_int_equal(engine_seq_new(e, &s, err, sizeof err), 0);
	if (engine_prefill(e, s, ids, n, lg, true, err, sizeof err))
		fail_msg("engine_prefill: %s", err);
	engine_free(e);
	backend_free(be);
	return lg;
}

/* max |a - b| / max |b| */
static double rel_diff(const float *a, const float *b, size_t n)
{
	double d = 0, mb = 0;
	for (size_t i = 0; i < n; i++) {
		d = fmax(d, fabs((double)a[i] - b[i]));
		mb = fmax(mb, fabs((double)b[i]));
	}
	return d / mb;
}

static void expect_gguf_error(const struct fkv_model *h, const struct fkv_tensor *rf, const char *path,
			      const char *needle, const char *needle2)
{
	struct fkv_model g;
	char err[512] = "";
	write_gguf_ex(h, "llama", 0, true, rf, path);
	int ret = model_load(path, &g, err, sizeof err);
	if (ret != -EINVAL || !strstr(err, needle) || (needle2 && !strstr(err, needle2)))
		fail_msg("want -EINVAL with '%s'/'%s', got %d: %s", needle, needle2 ? needle2 : "", ret, err);
}

/* The tiny model (d 16, theta 1e4: pair wavelengths 6.3, 20, 63, 199, 628, 1987, 6283, 19869)
 * with llama3 scaling whose band holds two or three pairs (parameters fitted, and recovered
 * exactly), one pair, none, and every pair scaled; a GGUF written with that scaling's rope_freqs and
 * interleaved q/k must give the HF folder's logits, and without rope_freqs it must not. Divisors
 * no llama3 parameters produce, a wrong shape and values below 1 are refused naming the entry. */
static void test_gguf_rope_freqs(void **state)
{
	(void)state;
	static const struct {
		double factor, low, high;
		int orig;
		bool exact; /* the band pins the parameters: they come back as written */
	} cases[] = {
		{ 8, 1, 4, 2048, true },
		{ 8, 1, 16, 2048, true },
		{ 8, 1, 2, 1000, false },
		{ 4, 1, 1.25, 300, false },
		{ 2, 1, 4, 4, false },
	};
	make_tmpdir();
	char err[512], path[128];
	assert_int_equal(synth_write("tiny", 0, FKV_F32, tmpdir, 5, 0, err, sizeof err), 0);
	snprintf(path, sizeof path, "%s/x.gguf", tmpdir);
	enum { N = 200 };
	int32_t ids[N];
	uint64_t seed = 42;
	float rf[8];
	struct fkv_tensor rft = { .data = rf, .dtype = FKV_F32, .n_dims = 1, .shape = { 8, 1 } };
	for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
		set_rope_scaling(cases[c].factor, cases[c].low, cases[c].high, cases[c].orig);
		struct fkv_model h, g;
		load_ok(tmpdir, &h);
		assert_int_equal(h.cfg.head_dim, 16);
		assert_true(h.cfg.rope_scaling_factor == (float)cases[c].factor);
		for (int i = 0; i < N; i++)
			ids[i] = (int32_t)(test_rand(&seed) % (uint64_t)h.cfg.vocab_size);
		float *ref = all_logits(&h, ids, N);
		size_t nl = (size_t)N * (size_t)h.cfg.vocab_size;

		llama3_divisors(h.cfg.rope_theta, 16, cases[c].factor, cases[c].low, cases[c].high,
				cases[c].orig, rf);
		write_gguf_ex(&h, "llama", 1, true, &rft, path);
		load_ok(path, &g);
		assert_int_equal(g.cfg.rope_style, FKV_ROPE_INTERLEAVED);
		assert_true(g.cfg.rope_scaling_factor == (float)cases[c].factor);
		if (cases[c].exact) {
			assert_true(g.cfg.rope_low_freq_factor == (float)cases[c].low);
			assert_true(g.cfg.rope_high_freq_factor == (float)cases[c].high);
			assert_int_equal(g.cfg.rope_original_ctx, cases[c].orig);
		}
		float *lg = all_logits(&g, ids, N);
		double d = rel_diff(lg, ref, nl);
		print_message("rope_freqs case %zu: GGUF vs HF logits rel diff %.3g\n", c, d);
		assert_true(d < 1e-5);
		model_free(&g);
		free(lg);

		write_gguf_ex(&h, "llama", 1, true, NULL, path); /* scaling dropped: logits must differ */
		load_ok(path, &g);
		assert_true(g.cfg.rope_scaling_factor == 0);
		lg = all_logits(&g, ids, N);
		d = rel_diff(lg, ref, nl);
		print_message("rope_freqs case %zu: without rope_freqs rel diff %.3g\n", c, d);
		assert_true(d > 1e-4); /* 10x the tolerance above */
		model_free(&g);
		free(lg);
		free(ref);
		model_free(&h);
	}
	struct fkv_model h;
	load_ok(tmpdir, &h);
	/* all ones: no scaling */
	for (int i = 0; i < 8; i++)
		rf[i] = 1;
	struct fkv_model g;
	write_gguf_ex(&h, "llama", 0, true, &rft, path);
	load_ok(path, &g);
	assert_true(g.cfg.rope_scaling_factor == 0);
	model_free(&g);
	/* the middle of three divisors inside the band off by 1%: no llama3 parameters give it */
	llama3_divisors(h.cfg.rope_theta, 16, 8, 1, 16, 2048, rf);
	assert_true(rf[2] == 1 && rf[3] > 1 && rf[5] < 8 && rf[6] == 8);
	rf[4] *= 1.01f;
	expect_gguf_error(&h, &rft, path, "'rope_freqs.weight' is not llama3 rope scaling", "entry ");
	/* not rising from 1 to factor */
	llama3_divisors(h.cfg.rope_theta, 16, 8, 1, 4, 2048, rf);
	rf[1] = 8;
	expect_gguf_error(&h, &rft, path, "'rope_freqs.weight' is not llama3 rope scaling", NULL);
	rf[1] = 1;
	rf[7] = 1;
	expect_gguf_error(&h, &rft, path, "'rope_freqs.weight' is not llama3 rope scaling", "entry 4 is");
	rf[7] = 0.5f;
	expect_gguf_error(&h, &rft, path, "'rope_freqs.weight' entry 7 is 0.5", NULL);
	rf[7] = NAN;
	expect_gguf_error(&h, &rft, path, "'rope_freqs.weight' entry 7 is nan", NULL);
	/* random divisors: from random llama3 parameters (must load), or random rising runs (may be
	 * refused); whatever loads reproduces the file's divisors under the converter's formula */
	uint64_t rs = 7;
	int loaded = 0, refused = 0;
	for (int it = 0; it < 150; it++) {
		double factor = 1.5 + 30 * (test_randf(&rs) + 1) / 2;
		if (it % 2 == 0) {
			double low = 0.5 + (test_randf(&rs) + 1), high = low * (1.2 + 4 * (test_randf(&rs) + 1));
			int orig = 4 + (int)(test_rand(&rs) % 30000);
			llama3_divisors(h.cfg.rope_theta, 16, factor, low, high, orig, rf);
		} else {
			int a = (int)(test_rand(&rs) % 9), b = a + (int)(test_rand(&rs) % (uint64_t)(9 - a));
			for (int i = 0; i < 8; i++)
				rf[i] = i < a ? 1.0f : i >= b ? (float)factor : (float)(1 + (factor - 1) * (test_randf(&rs) + 1) / 2);
			for (int i = a; i + 1 < b; i++) /* sort the band ascending */
				for (int j = i + 1; j < b; j++)
					if (rf[j] < rf[i]) {
						float t = rf[i];
						rf[i] = rf[j];
						rf[j] = t;
					}
		}
		write_gguf_ex(&h, "llama", 0, true, &rft, path);
		int ret = model_load(path, &g, err, sizeof err);
		if (ret) {
			assert_int_equal(ret, -EINVAL);
			assert_non_null(strstr(err, "rope_freqs.weight"));
			assert_true(it % 2 == 1);
			refused++;
			continue;
		}
		float back[8];
		const struct fkv_model_config *gc = &g.cfg;
		if (gc->rope_scaling_factor > 0)
			llama3_divisors(gc->rope_theta, 16, gc->rope_scaling_factor, gc->rope_low_freq_factor,
					gc->rope_high_freq_factor, gc->rope_original_ctx, back);
		for (int i = 0; i < 8; i++) {
			double want = gc->rope_scaling_factor > 0 ? back[i] : 1.0;
			if (fabs(rf[i] - want) > 1.2e-4 * want)
				fail_msg("iteration %d: pair %d file %g, loaded parameters give %g", it, i, (double)rf[i], want);
		}
		model_free(&g);
		loaded++;
	}
	print_message("random rope_freqs: %d loaded, %d refused\n", loaded, refused);
	assert_true(loaded >= 75 && refused > 0);
	/* head_dim values instead of head_dim / 2 */
	float wide[16];
	for (int i = 0; i < 16; i++)
		wide[i] = 1;
	struct fkv_tensor wt = { .data = wide, .dtype = FKV_F32, .n_dims = 1, .shape = { 16, 1 } };
	expect_gguf_error(&h, &wt, path, "'rope_freqs.weight'", "expected (8)");
	model_free(&h);
	char p[256];
	const char *names[] = { "tokenizer.json", "tokenizer_config.json" };
	for (size_t i = 0; i < 2; i++) {
		snprintf(p, sizeof p, "%s/%s", tmpdir, names[i]);
		unlink(p);
	}
	rm_tmpdir();
}

/* Rss of the mapping that holds p, from /proc/self/smaps (kB); -1 when not found. */
static long mapping_rss_kb(const void *p)
{
	FILE *f = fopen("/proc/self/smaps", "r");
	assert_non_null(f);
	char line[512];
	bool in = false;
	long rss = -1;
	while (fgets(line, sizeof line, f)) {
		unsigned long lo, hi;
		if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
			in = (uintptr_t)p >= lo && (uintptr_t)p < hi;
			continue;
		}
		if (in && sscanf(line, "Rss: %ld kB", &rss) == 1)
			break;
	}
	fclose(f);
	return rss;
}

/* model_drop_pages: the file mappings' pages leave the process (their Rss drops to 0), the
 * tensors read the same bytes afterwards; a HF folder's safetensors shards likewise. */
static void test_drop_pages(void **state)
{
	(void)state;
	if (!gguf_path[0] || !hf_dir[0])
		skip();
	const char *paths[] = { gguf_path, hf_dir };
	for (int i = 0; i < 2; i++) {
		struct fkv_model m;
		load_ok(paths[i], &m);
		const struct fkv_tensor *t = &m.layers[0].w_gate;
		const size_t n = model_tensor_bytes(t);
		uint8_t *before = malloc(n);
		assert_non_null(before);
		memcpy(before, t->data, n); /* touched: resident */
		assert_true(mapping_rss_kb(t->data) > 0);
		model_drop_pages(&m);
		assert_int_equal(mapping_rss_kb(t->data), 0);
		assert_memory_equal(t->data, before, n);
		assert_true(mapping_rss_kb(t->data) > 0); /* read back from the page cache */
		free(before);
		model_free(&m);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_gguf_vs_hf),
		cmocka_unit_test(test_fingerprint),
		cmocka_unit_test(test_hf_config_parse),
		cmocka_unit_test(test_load_errors),
		cmocka_unit_test(test_load_fuzz),
		cmocka_unit_test(test_gguf_qwen2),
		cmocka_unit_test(test_gguf_rope_freqs),
		cmocka_unit_test(test_drop_pages),
	};
	return cmocka_run_group_tests(tests, setup, NULL);
}
