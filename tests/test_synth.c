/* Tests worker/model/synth.c: presets written to a temp folder load back with model_load() with the
 * preset's geometry, and the weights that load are the generator's values in the file dtype;
 * sharding changes files, not the model (same fingerprint); tokenizer.json is a byte-level BPE
 * whose 256 byte tokens, merges, specials and padding add up to the vocabulary; the weights
 * have the documented scale; bad arguments are refused. */
#include "test_util.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <sys/stat.h>

#include <json-c/json.h>

#include "model.h"
#include "synth.h"

static char dir[64];

static void make_dir(void)
{
	snprintf(dir, sizeof dir, "/tmp/freekv-synth-XXXXXX");
	assert_non_null(mkdtemp(dir));
}

static void rm_dir(void)
{
	DIR *d = opendir(dir);
	assert_non_null(d);
	struct dirent *e;
	char p[512];
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
		unlink(p);
	}
	closedir(d);
	rmdir(dir);
}

static void synth_ok(const char *preset, int layers, enum fkv_dtype dt, uint64_t seed, int vocab, uint64_t shard)
{
	char err[512];
	int ret = shard ? synth_write_sharded(preset, layers, dt, dir, seed, vocab, shard, err, sizeof err)
			: synth_write(preset, layers, dt, dir, seed, vocab, err, sizeof err);
	if (ret)
		fail_msg("synth %s: %d %s", preset, ret, err);
}

static void load_ok(struct fkv_model *m)
{
	char err[512];
	int ret = model_load(dir, m, err, sizeof err);
	if (ret)
		fail_msg("model_load(%s): %d %s", dir, ret, err);
}

/* The first, middle and last 64 elements (or all, when fewer) of t equal the generator's values in t's dtype. */
static void check_values(const struct fkv_tensor *t, const char *hf_name, uint64_t seed)
{
	uint64_t nel = (uint64_t)(t->shape[0] * t->shape[1]);
	size_t k = nel < 64 ? (size_t)nel : 64;
	const uint64_t starts[] = { 0, (nel - k) / 2, nel - k };
	float want[64], got[64], conv[64];
	uint8_t tmp[64 * 4];
	for (size_t s = 0; s < 3; s++) {
		synth_values(seed, hf_name, starts[s], k, want);
		dtype_from_f32(tmp, want, t->dtype, k);
		dtype_to_f32(conv, tmp, t->dtype, k);
		dtype_to_f32(got, (const uint8_t *)t->data + starts[s] * dtype_size(t->dtype), t->dtype, k);
		for (size_t i = 0; i < k; i++) {
			if (got[i] != conv[i])
				fail_msg("%s[%llu]: got %g want %g", hf_name, (unsigned long long)(starts[s] + i),
					 (double)got[i], (double)conv[i]);
		}
	}
}

static void test_tiny(void **state)
{
	(void)state;
	make_dir();
	synth_ok("tiny", 0, FKV_F32, 7, 0, 0);
	struct fkv_model m;
	load_ok(&m);
	const struct fkv_model_config *c = &m.cfg;
	assert_string_equal(c->arch, "llama");
	assert_int_equal(c->n_layers, 2);
	assert_int_equal(c->dim, 64);
	assert_int_equal(c->n_heads, 4);
	assert_int_equal(c->n_kv_heads, 2);
	assert_int_equal(c->head_dim, 16);
	assert_int_equal(c->ffn_dim, 128);
	assert_int_equal(c->vocab_size, 512);
	assert_int_equal(c->dtype, FKV_F32);
	assert_int_equal(c->rope_style, FKV_ROPE_HALVES);
	assert_false(c->tied_embeddings);
	assert_false(c->qkv_bias);
	assert_int_equal(c->bos_id, 510);
	assert_int_equal(c->eos_id, 511);
	check_values(&m.tok_embd, "model.embed_tokens.weight", 7);
	check_values(&m.output, "lm_head.weight", 7);
	check_values(&m.out_norm, "model.norm.weight", 7);
	check_values(&m.layers[1].wk, "model.layers.1.self_attn.k_proj.weight", 7);
	check_values(&m.layers[0].w_down, "model.layers.0.mlp.down_proj.weight", 7);
	check_values(&m.layers[1].ffn_norm, "model.layers.1.post_attention_layernorm.weight", 7);
	/* the generator differs by tensor and by seed */
	float a[4], b[4], d[4];
	synth_values(7, "x", 0, 4, a);
	synth_values(7, "y", 0, 4, b);
	synth_values(8, "x", 0, 4, d);
	assert_memory_not_equal(a, b, sizeof a);
	assert_memory_not_equal(a, d, sizeof a);

	/* the tokenizer: byte tokens, merges, specials, padding = vocab; ids agree with config */
	char p[256];
	snprintf(p, sizeof p, "%s/tokenizer.json", dir);
	struct json_object *t = json_object_from_file(p), *model, *vocab, *merges, *added, *x;
	assert_non_null(t);
	assert_true(json_object_object_get_ex(t, "model", &model));
	assert_true(json_object_object_get_ex(model, "type", &x));
	assert_string_equal(json_object_get_string(x), "BPE");
	assert_true(json_object_object_get_ex(model, "byte_fallback", &x));
	assert_false(json_object_get_boolean(x));
	assert_true(json_object_object_get_ex(model, "vocab", &vocab));
	assert_int_equal(json_object_object_length(vocab), 512);
	assert_true(json_object_object_get_ex(vocab, "\xc4\xa0", &x)); /* "Ġ": the space byte */
	assert_int_equal(json_object_get_int(x), ' ');
	assert_true(json_object_object_get_ex(vocab, "A", &x));
	assert_int_equal(json_object_get_int(x), 'A');
	assert_true(json_object_object_get_ex(vocab, "\xc4\x8a", &x)); /* "Ċ": newline */
	assert_int_equal(json_object_get_int(x), '\n');
	assert_true(json_object_object_get_ex(vocab, "\xc4\xa0the", &x));
	assert_true(json_object_object_get_ex(vocab, "<|begin_of_text|>", &x));
	assert_int_equal(json_object_get_int(x), 510);
	assert_true(json_object_object_get_ex(model, "merges", &merges));
	size_t nm = json_object_array_length(merges);
	assert_true(nm > 40);
	assert_string_equal(json_object_get_string(json_object_array_get_idx(merges, 0)), "\xc4\xa0 t");
	/* ids are 0..511, each once */
	uint8_t seen[512] = { 0 };
	json_object_object_foreach(vocab, key, val)
	{
		(void)key;
		int id = json_object_get_int(val);
		assert_true(id >= 0 && id < 512);
		assert_int_equal(seen[id], 0);
		seen[id] = 1;
	}
	assert_true(json_object_object_get_ex(t, "added_tokens", &added));
	assert_int_equal(json_object_array_length(added), 2);
	assert_true(json_object_object_get_ex(json_object_array_get_idx(added, 1), "id", &x));
	assert_int_equal(json_object_get_int(x), 511);
	json_object_put(t);
	model_free(&m);
	rm_dir();
}

static void test_llama31_one_layer(void **state)
{
	(void)state;
	make_dir();
	synth_ok("llama-3.1-8b", 1, FKV_BF16, 99, 1000, 0);
	struct fkv_model m;
	load_ok(&m);
	const struct fkv_model_config *c = &m.cfg;
	assert_string_equal(c->arch, "llama");
	assert_int_equal(c->n_layers, 1);
	assert_int_equal(c->dim, 4096);
	assert_int_equal(c->n_heads, 32);
	assert_int_equal(c->n_kv_heads, 8);
	assert_int_equal(c->head_dim, 128);
	assert_int_equal(c->ffn_dim, 14336);
	assert_int_equal(c->vocab_size, 1000);
	assert_int_equal(c->ctx_len, 131072);
	assert_true(c->rope_theta == 500000.0f);
	assert_true(c->rope_scaling_factor == 8.0f);
	assert_true(c->rope_low_freq_factor == 1.0f);
	assert_true(c->rope_high_freq_factor == 4.0f);
	assert_int_equal(c->rope_original_ctx, 8192);
	assert_int_equal(c->dtype, FKV_BF16);
	assert_false(c->tied_embeddings);
	assert_int_equal(c->n_eos, 3); /* the three Llama 3.1 stop ids, moved inside the small vocab */
	assert_int_equal(c->bos_id, 996);
	assert_int_equal(c->eos_ids[0], 997);
	assert_int_equal(c->eos_ids[2], 999);
	assert_int_equal(m.layers[0].wk.shape[0], 1024);
	assert_int_equal(m.layers[0].wk.shape[1], 4096);
	assert_int_equal(m.layers[0].w_down.shape[0], 4096);
	assert_int_equal(m.layers[0].w_down.shape[1], 14336);
	assert_int_equal(m.layers[0].wq.dtype, FKV_BF16);
	check_values(&m.layers[0].wq, "model.layers.0.self_attn.q_proj.weight", 99);
	check_values(&m.layers[0].w_down, "model.layers.0.mlp.down_proj.weight", 99);
	check_values(&m.layers[0].attn_norm, "model.layers.0.input_layernorm.weight", 99);

	/* scale: matrices ~ N-like(0, 0.02), norms ~ 1 */
	const struct fkv_tensor *w = &m.layers[0].w_gate;
	size_t n = 1u << 20;
	double s = 0, s2 = 0;
	for (size_t i = 0; i < n; i++) {
		double v = bf16_to_f32(((const uint16_t *)w->data)[i * 7]);
		s += v;
		s2 += v * v;
	}
	double mean = s / (double)n, sd = sqrt(s2 / (double)n - mean * mean);
	assert_true(fabs(mean) < 1e-3);
	assert_true(fabs(sd - 0.02) < 1e-3);
	float nv = bf16_to_f32(((const uint16_t *)m.out_norm.data)[17]);
	assert_true(nv > 0.94f && nv < 1.06f);
	model_free(&m);
	rm_dir();
}

static void test_sharded_same_model(void **state)
{
	(void)state;
	make_dir();
	synth_ok("tiny-qwen2", 0, FKV_F16, 3, 0, 0);
	struct fkv_model a, b;
	load_ok(&a);
	assert_string_equal(a.cfg.arch, "qwen2");
	assert_true(a.cfg.qkv_bias);
	assert_true(a.cfg.tied_embeddings);
	assert_ptr_equal(a.output.data, a.tok_embd.data);
	assert_non_null(a.layers[1].bv.data);
	assert_int_equal(a.layers[1].bk.shape[0], 32);
	assert_int_equal(a.layers[1].bk.n_dims, 1);
	check_values(&a.layers[1].bq, "model.layers.1.self_attn.q_proj.bias", 3);
	rm_dir();
	make_dir();
	synth_ok("tiny-qwen2", 0, FKV_F16, 3, 0, 40000);
	char p[256];
	snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
	assert_int_equal(access(p, R_OK), 0);
	snprintf(p, sizeof p, "%s/model.safetensors", dir);
	assert_int_equal(access(p, F_OK), -1);
	load_ok(&b);
	assert_memory_equal(a.fingerprint, b.fingerprint, FKV_FINGERPRINT_BYTES);
	check_values(&b.layers[1].w_up, "model.layers.1.mlp.up_proj.weight", 3);
	model_free(&a);
	model_free(&b);
	/* a different seed is a different model */
	synth_ok("tiny-qwen2", 0, FKV_F16, 4, 0, 40000);
	load_ok(&b);
	load_ok(&a);
	assert_memory_equal(a.fingerprint, b.fingerprint, FKV_FINGERPRINT_BYTES);
	model_free(&a);
	rm_dir();
	make_dir();
	synth_ok("tiny-qwen2", 0, FKV_F16, 3, 0, 0);
	load_ok(&a);
	assert_memory_not_equal(a.fingerprint, b.fingerprint, FKV_FINGERPRINT_BYTES);
	model_free(&a);
	model_free(&b);
	rm_dir();
}

/* The 7B-class presets with one layer and a small vocabulary: geometry as the real models
 * publish it (config.json of Qwen2.5-7B-Instruct and Mistral-7B-v0.3). */
static void test_other_presets(void **state)
{
	(void)state;
	static const struct {
		const char *preset, *arch;
		int dim, heads, kv, hd, ffn;
		float theta;
		bool bias;
	} want[] = {
		{ "qwen2.5-7b", "qwen2", 3584, 28, 4, 128, 18944, 1000000.0f, true },
		{ "mistral-7b", "mistral", 4096, 32, 8, 128, 14336, 1000000.0f, false },
	};
	for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
		make_dir();
		synth_ok(want[i].preset, 1, FKV_F16, 5, 700, 0);
		struct fkv_model m;
		load_ok(&m);
		const struct fkv_model_config *c = &m.cfg;
		assert_string_equal(c->arch, want[i].arch);
		assert_int_equal(c->n_layers, 1);
		assert_int_equal(c->dim, want[i].dim);
		assert_int_equal(c->n_heads, want[i].heads);
		assert_int_equal(c->n_kv_heads, want[i].kv);
		assert_int_equal(c->head_dim, want[i].hd);
		assert_int_equal(c->ffn_dim, want[i].ffn);
		assert_int_equal(c->vocab_size, 700);
		assert_true(c->rope_theta == want[i].theta);
		assert_int_equal(c->qkv_bias, want[i].bias);
		assert_true(c->rope_scaling_factor == 0);
		assert_int_equal(c->dtype, FKV_F16);
		if (want[i].bias) {
			assert_int_equal(m.layers[0].bk.shape[0], want[i].kv * want[i].hd);
			check_values(&m.layers[0].bk, "model.layers.0.self_attn.k_proj.bias", 5);
		}
		check_values(&m.layers[0].wo, "model.layers.0.self_attn.o_proj.weight", 5);
		model_free(&m);
		rm_dir();
	}
}

static void test_bad_args(void **state)
{
	(void)state;
	char err[256];
	assert_true(synth_n_presets() >= 4);
	const char *want[] = { "llama-3.1-8b", "qwen2.5-7b", "mistral-7b", "tiny" };
	for (size_t w = 0; w < 4; w++) {
		bool found = false;
		for (int i = 0; i < synth_n_presets(); i++)
			found = found || !strcmp(synth_preset_name(i), want[w]);
		assert_true(found);
	}
	assert_null(synth_preset_name(synth_n_presets()));
	assert_non_null(synth_preset_desc(0));
	assert_int_equal(synth_write("gpt-5", 1, FKV_F32, "/tmp", 1, 0, err, sizeof err), -EINVAL);
	assert_non_null(strstr(err, "llama-3.1-8b"));
	assert_int_equal(synth_write("tiny", 1, FKV_F32, "/tmp", 1, 100, err, sizeof err), -EINVAL);
	assert_non_null(strstr(err, "too small"));
	assert_int_equal(synth_write("tiny", 1, FKV_F32, "/nonexistent/dir/x", 1, 0, err, sizeof err), -ENOENT);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_tiny),
		cmocka_unit_test(test_llama31_one_layer),
		cmocka_unit_test(test_sharded_same_model),
		cmocka_unit_test(test_other_presets),
		cmocka_unit_test(test_bad_args),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
