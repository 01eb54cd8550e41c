/* model — model_load(): GGUF or Hugging Face folder -> struct fkv_model. See model.h.
 *
 * Both formats go through one declarative table of tensors (our slot, GGUF name, HF name,
 * expected shape in config terms); a format-specific lookup turns a name into a raw view
 * (dtype, row-major dims, bytes). Every tensor of the file must be claimed by the table (old HF
 * rotary_emb.inv_freq buffers excepted, and GGUF rope_freqs.weight, which becomes the config's
 * llama3 rope scaling), so a file with weights we would silently ignore is refused rather than
 * run wrong. */
#include "model.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <openssl/evp.h>

#include "gguf.h"
#include "hf_config.h"
#include "safetensors.h"
#include "errmsg.h"

/* Bytes hashed from the start, the middle and the end of each tensor for the fingerprint. */
#define FP_SAMPLE 4096

struct model_priv {
	struct gguf_ctx *gguf;
	struct st_ctx *st;
	uint8_t *claimed;	/* per file tensor: claimed by the table */
	void **copies;		/* aligned copies of tensors the file left misaligned */
	int n_copies;
};

/* A tensor as found in the file, dims in row-major order (dims[n_dims-1] contiguous). */
struct raw {
	enum fkv_dtype dtype;
	enum fkv_quant quant;	/* GGUF block format, FKV_QNONE when dtype holds */
	int n_dims;
	int64_t dims[8];
	const void *data;
	uint64_t size;
	int64_t index;		/* in the file's table, for claiming */
};

enum shape_kind { SK_ONE, SK_DIM, SK_QDIM, SK_KVDIM, SK_FFN, SK_VOCAB };

#define TS_BIAS 1u	/* only when cfg.qkv_bias */
#define TS_OPTIONAL 2u	/* absent is fine (output: tied) */

struct tensor_spec {
	size_t off;		/* offset of the struct fkv_tensor in its parent */
	const char *gguf;
	const char *hf;
	enum shape_kind rows, cols;
	unsigned flags;
};

#define LW(f) offsetof(struct fkv_layer_weights, f)
static const struct tensor_spec layer_specs[] = {
	{ LW(attn_norm), "attn_norm.weight", "input_layernorm.weight", SK_DIM, SK_ONE, 0 },
	{ LW(wq), "attn_q.weight", "self_attn.q_proj.weight", SK_QDIM, SK_DIM, 0 },
	{ LW(wk), "attn_k.weight", "self_attn.k_proj.weight", SK_KVDIM, SK_DIM, 0 },
	{ LW(wv), "attn_v.weight", "self_attn.v_proj.weight", SK_KVDIM, SK_DIM, 0 },
	{ LW(wo), "attn_output.weight", "self_attn.o_proj.weight", SK_DIM, SK_QDIM, 0 },
	{ LW(bq), "attn_q.bias", "self_attn.q_proj.bias", SK_QDIM, SK_ONE, TS_BIAS },
	{ LW(bk), "attn_k.bias", "self_attn.k_proj.bias", SK_KVDIM, SK_ONE, TS_BIAS },
	{ LW(bv), "attn_v.bias", "self_attn.v_proj.bias", SK_KVDIM, SK_ONE, TS_BIAS },
	{ LW(ffn_norm), "ffn_norm.weight", "post_attention_layernorm.weight", SK_DIM, SK_ONE, 0 },
	{ LW(w_gate), "ffn_gate.weight", "mlp.gate_proj.weight", SK_FFN, SK_DIM, 0 },
	{ LW(w_up), "ffn_up.weight", "mlp.up_proj.weight", SK_FFN, SK_DIM, 0 },
	{ LW(w_down), "ffn_down.weight", "mlp.down_proj.weight", SK_DIM, SK_FFN, 0 },
};
#undef LW

#define MW(f) offsetof(struct fkv_model, f)
static const struct tensor_spec global_specs[] = {
	{ MW(tok_embd), "token_embd.weight", "model.embed_tokens.weight", SK_VOCAB, SK_DIM, 0 },
	{ MW(out_norm), "output_norm.weight", "model.norm.weight", SK_DIM, SK_ONE, 0 },
	{ MW(output), "output.weight", "lm_head.weight", SK_VOCAB, SK_DIM, TS_OPTIONAL },
};
#undef MW

/* GGUF architectures: the key prefix and the rotary layout their converter writes. */
static const struct {
	const char *arch;
	enum fkv_rope_style rope;
} gguf_archs[] = {
	{ "llama", FKV_ROPE_INTERLEAVED },
	{ "qwen2", FKV_ROPE_HALVES },
};

int model_config_validate(const struct fkv_model_config *c, char *err, size_t errlen)
{
	if (c->n_layers <= 0 || c->n_layers > FKV_MAX_LAYERS)
		return errmsg(err, errlen, -EINVAL, "model: %d layers (1..%d supported)", c->n_layers, FKV_MAX_LAYERS);
	if (c->dim <= 0 || c->n_heads <= 0 || c->n_kv_heads <= 0 || c->head_dim <= 0 || c->ffn_dim <= 0 ||
	    c->vocab_size <= 0 || c->ctx_len <= 0)
		return errmsg(err, errlen, -EINVAL,
			    "model: sizes must be positive (dim %d, heads %d, kv heads %d, head_dim %d, ffn %d, vocab %d, ctx %d)",
			    c->dim, c->n_heads, c->n_kv_heads, c->head_dim, c->ffn_dim, c->vocab_size, c->ctx_len);
	if (c->n_heads % c->n_kv_heads)
		return errmsg(err, errlen, -EINVAL, "model: %d query heads is not a multiple of %d KV heads", c->n_heads,
			    c->n_kv_heads);
	if (c->head_dim % 2)
		return errmsg(err, errlen, -EINVAL, "model: head_dim %d is odd (rotary pairs need it even)", c->head_dim);
	if ((int64_t)c->n_heads * c->head_dim > (1 << 20) || c->dim > (1 << 20) || c->ffn_dim > (1 << 22))
		return errmsg(err, errlen, -EINVAL, "model: implausibly large geometry");
	if (!(c->norm_eps > 0) || !(c->rope_theta > 0))
		return errmsg(err, errlen, -EINVAL, "model: rms_norm_eps and rope_theta must be positive");
	bool ids_ok = c->bos_id < c->vocab_size && c->eos_id < c->vocab_size && c->n_eos >= 0 &&
		      c->n_eos <= FKV_MAX_EOS;
	for (int i = 0; ids_ok && i < c->n_eos; i++)
		ids_ok = c->eos_ids[i] >= 0 && c->eos_ids[i] < c->vocab_size;
	if (!ids_ok)
		return errmsg(err, errlen, -EINVAL, "model: bos/eos id outside the vocabulary of %d", c->vocab_size);
	return 0;
}

static int64_t shape_of(const struct fkv_model_config *c, enum shape_kind k)
{
	switch (k) {
	case SK_ONE: return 1;
	case SK_DIM: return c->dim;
	case SK_QDIM: return (int64_t)c->n_heads * c->head_dim;
	case SK_KVDIM: return (int64_t)c->n_kv_heads * c->head_dim;
	case SK_FFN: return c->ffn_dim;
	case SK_VOCAB: return c->vocab_size;
	}
	return 0;
}

/* Looks a tensor up in whichever file the model came from. 0 or -ENOENT. */
static int find_raw(const struct model_priv *p, const char *name, struct raw *r)
{
	memset(r, 0, sizeof *r);
	if (p->gguf) {
		int64_t i = gguf_find_tensor(p->gguf, name);
		if (i < 0)
			return -ENOENT;
		const struct gguf_tensor_info *t = gguf_tensor(p->gguf, i);
		r->dtype = t->has_dtype ? t->dtype : FKV_F32;
		if (!t->has_dtype && quant_from_ggml(t->type, &r->quant))
			return -EPROTO; /* gguf_check_types refused it already */
		r->n_dims = t->n_dims;
		for (int d = 0; d < t->n_dims; d++)
			r->dims[d] = t->ne[t->n_dims - 1 - d];
		r->data = t->data;
		r->size = t->size;
		r->index = i;
		return 0;
	}
	const struct st_tensor *t = st_find(p->st, name);
	if (!t)
		return -ENOENT;
	r->dtype = t->dtype;
	r->n_dims = t->n_dims;
	for (int d = 0; d < t->n_dims; d++)
		r->dims[d] = t->shape[d];
	r->data = t->data;
	r->size = t->size;
	r->index = t - st_tensor(p->st, 0);
	return 0;
}

static void fmt_shape(char *buf, size_t len, const int64_t *dims, int n)
{
	size_t o = (size_t)snprintf(buf, len, "(");
	for (int i = 0; i < n && o < len; i++)
		o += (size_t)snprintf(buf + o, len - o, "%s%" PRId64, i ? ", " : "", dims[i]);
	if (o < len)
		snprintf(buf + o, len - o, ")");
}

/* Finds, checks and binds one tensor. Returns 0, -ENOENT (absent: caller decides) or an error. */
static int bind(struct fkv_model *m, struct model_priv *p, const char *name, enum shape_kind rk,
		enum shape_kind ck, struct fkv_tensor *dst, char *err, size_t errlen)
{
	struct raw r;
	if (find_raw(p, name, &r))
		return -ENOENT;
	int64_t want[2] = { shape_of(&m->cfg, rk), shape_of(&m->cfg, ck) };
	int want_dims = ck == SK_ONE ? 1 : 2;
	if (r.n_dims != want_dims || r.dims[0] != want[0] || (want_dims == 2 && r.dims[1] != want[1])) {
		char a[96], b[96];
		fmt_shape(a, sizeof a, want, want_dims);
		fmt_shape(b, sizeof b, r.dims, r.n_dims);
		return errmsg(err, errlen, -EINVAL, "model: tensor '%s' has shape %s, expected %s", name, b, a);
	}
	if (r.quant) {
		/* blocks as they are: only matrices are quantized, whole blocks per row */
		size_t rb = want_dims == 2 ? quant_row_bytes(r.quant, want[1]) : 0;
		if (!rb)
			return errmsg(err, errlen, -EINVAL, "model: tensor '%s' is %s, which needs a matrix whose "
				    "rows are whole blocks of %d", name, quant_name(r.quant), quant_block_elems(r.quant));
		if (r.size != (uint64_t)want[0] * rb)
			return errmsg(err, errlen, -EINVAL, "model: tensor '%s' (%s) holds %" PRIu64 " bytes, expected "
				    "%" PRId64 " rows of %zu", name, quant_name(r.quant), r.size, want[0], rb);
	}
	const void *data = r.data;
	/* blocks start with f16 fields: 2-byte alignment */
	if ((uintptr_t)data % (r.quant ? 2 : dtype_size(r.dtype))) {
		/* the format allows it; the backends read whole elements */
		void **nc = realloc(p->copies, (size_t)(p->n_copies + 1) * sizeof *nc);
		if (!nc)
			return errmsg(err, errlen, -ENOMEM, "model: out of memory");
		p->copies = nc;
		void *copy = aligned_alloc(64, (r.size + 63) / 64 * 64);
		if (!copy)
			return errmsg(err, errlen, -ENOMEM, "model: out of memory copying tensor '%s'", name);
		memcpy(copy, data, r.size);
		p->copies[p->n_copies++] = copy;
		data = copy;
	}
	dst->data = data;
	dst->dtype = r.dtype;
	dst->quant = r.quant;
	dst->n_dims = want_dims;
	dst->shape[0] = want[0];
	dst->shape[1] = want_dims == 2 ? want[1] : 1;
	p->claimed[r.index] = 1;
	return 0;
}

static int bind_all(struct fkv_model *m, struct model_priv *p, char *err, size_t errlen)
{
	char name[256];
	int ret;
	for (size_t i = 0; i < sizeof global_specs / sizeof global_specs[0]; i++) {
		const struct tensor_spec *s = &global_specs[i];
		const char *n = m->is_gguf ? s->gguf : s->hf;
		struct fkv_tensor *dst = (struct fkv_tensor *)((char *)m + s->off);
		ret = bind(m, p, n, s->rows, s->cols, dst, err, errlen);
		if (ret == -ENOENT && !(s->flags & TS_OPTIONAL))
			return errmsg(err, errlen, -EINVAL, "model: missing tensor '%s'", n);
		if (ret && ret != -ENOENT)
			return ret;
	}
	for (int l = 0; l < m->cfg.n_layers; l++) {
		for (size_t i = 0; i < sizeof layer_specs / sizeof layer_specs[0]; i++) {
			const struct tensor_spec *s = &layer_specs[i];
			snprintf(name, sizeof name, m->is_gguf ? "blk.%d.%s" : "model.layers.%d.%s", l,
				 m->is_gguf ? s->gguf : s->hf);
			if ((s->flags & TS_BIAS) && !m->cfg.qkv_bias)
				continue;
			struct fkv_tensor *dst = (struct fkv_tensor *)((char *)&m->layers[l] + s->off);
			ret = bind(m, p, name, s->rows, s->cols, dst, err, errlen);
			if (ret == -ENOENT)
				return errmsg(err, errlen, -EINVAL, "model: missing tensor '%s'", name);
			if (ret)
				return ret;
		}
	}
	return 0;
}

/* Output head: absent -> tied; present with the embedding's exact bytes (GGUF converters write
 * the tied matrix twice) -> tied too; the config's tie flag wins for HF. */
static void resolve_output(struct fkv_model *m)
{
	const struct fkv_tensor *e = &m->tok_embd, *o = &m->output;
	bool same = o->data && o->dtype == e->dtype && o->quant == e->quant &&
		    !memcmp(o->data, e->data, model_tensor_bytes(e));
	if (!o->data || same || (!m->is_gguf && m->cfg.tied_embeddings)) {
		m->output = m->tok_embd;
		m->cfg.tied_embeddings = true;
	} else {
		m->cfg.tied_embeddings = false;
	}
}

static int check_claimed(const struct fkv_model *m, const struct model_priv *p, char *err, size_t errlen)
{
	int64_t n = p->gguf ? gguf_n_tensors(p->gguf) : st_n_tensors(p->st);
	for (int64_t i = 0; i < n; i++) {
		if (p->claimed[i])
			continue;
		const char *name = p->gguf ? gguf_tensor(p->gguf, i)->name : st_tensor(p->st, (int)i)->name;
		size_t len = strlen(name), sfx = strlen("rotary_emb.inv_freq");
		if (!m->is_gguf && len >= sfx && !strcmp(name + len - sfx, "rotary_emb.inv_freq"))
			continue;
		return errmsg(err, errlen, -EINVAL, "model: unexpected tensor '%s' (not part of a %s model%s)", name,
			    m->cfg.arch, m->cfg.qkv_bias ? "" : " without q/k/v biases");
	}
	return 0;
}

/* gguf_open() describes tensors of every ggml type; the backends compute on F32, F16, BF16 and
 * the block formats of quant.h. */
static int gguf_check_types(const struct gguf_ctx *g, char *err, size_t errlen)
{
	for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
		const struct gguf_tensor_info *t = gguf_tensor(g, i);
		enum fkv_quant q;
		if (!t->has_dtype && quant_from_ggml(t->type, &q))
			return errmsg(err, errlen, -EPROTO,
				    "gguf: tensor '%s' has type %s (%u); supported: F32, F16, BF16, Q8_0, Q4_0, "
				    "Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K", t->name, t->type_name, t->type);
	}
	return 0;
}

/* GGUF metadata -> config. Keys are "<arch>.<name>". */
static int gguf_config(struct gguf_ctx *g, struct fkv_model_config *c, char *err, size_t errlen)
{
	const char *arch;
	char key[128];
	int ret;
	if (gguf_get_str(g, "general.architecture", &arch, NULL))
		return errmsg(err, errlen, -EINVAL, "gguf: missing key 'general.architecture'");
	size_t ai;
	for (ai = 0; ai < sizeof gguf_archs / sizeof gguf_archs[0]; ai++) {
		if (!strcmp(arch, gguf_archs[ai].arch))
			break;
	}
	if (ai == sizeof gguf_archs / sizeof gguf_archs[0])
		return errmsg(err, errlen, -EPROTO, "gguf: architecture '%s' is not supported (llama, qwen2 are)", arch);
	snprintf(c->arch, sizeof c->arch, "%s", arch);
	c->rope_style = gguf_archs[ai].rope;
	static const struct {
		const char *suffix;
		size_t off;
		bool required;
	} ints[] = {
		{ "context_length", offsetof(struct fkv_model_config, ctx_len), true },
		{ "embedding_length", offsetof(struct fkv_model_config, dim), true },
		{ "block_count", offsetof(struct fkv_model_config, n_layers), true },
		{ "feed_forward_length", offsetof(struct fkv_model_config, ffn_dim), true },
		{ "attention.head_count", offsetof(struct fkv_model_config, n_heads), true },
		{ "attention.head_count_kv", offsetof(struct fkv_model_config, n_kv_heads), false },
		{ "attention.key_length", offsetof(struct fkv_model_config, head_dim), false },
	};
	for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
		int32_t v;
		snprintf(key, sizeof key, "%s.%s", arch, ints[i].suffix);
		ret = gguf_get_i32(g, key, &v);
		if (ret == -ENOENT && !ints[i].required)
			continue;
		if (ret || v <= 0)
			return errmsg(err, errlen, -EINVAL, "gguf: %s key '%s'", ret == -ENOENT ? "missing" : "invalid", key);
		*(int *)((char *)c + ints[i].off) = v;
	}
	if (!c->n_kv_heads)
		c->n_kv_heads = c->n_heads;
	if (!c->head_dim)
		c->head_dim = c->n_heads ? c->dim / c->n_heads : 0;
	snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", arch);
	if (gguf_get_f32(g, key, &c->norm_eps))
		return errmsg(err, errlen, -EINVAL, "gguf: missing or invalid key '%s'", key);
	snprintf(key, sizeof key, "%s.rope.freq_base", arch);
	ret = gguf_get_f32(g, key, &c->rope_theta);
	if (ret == -ENOENT)
		c->rope_theta = 10000.0f;
	else if (ret)
		return errmsg(err, errlen, -EINVAL, "gguf: invalid key '%s'", key);
	uint32_t rdim;
	snprintf(key, sizeof key, "%s.rope.dimension_count", arch);
	if (!gguf_get_u32(g, key, &rdim) && (int)rdim != c->head_dim)
		return errmsg(err, errlen, -EPROTO, "gguf: key '%s' = %u: partial rotary (head dim %d) is not supported",
			    key, rdim, c->head_dim);
	const char *st;
	snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
	if (!gguf_get_str(g, key, &st, NULL) && strcmp(st, "none"))
		return errmsg(err, errlen, -EPROTO, "gguf: key '%s' = '%s': rope scaling is not supported from GGUF", key, st);
	struct gguf_arr toks;
	if (!gguf_get_arr(g, "tokenizer.ggml.tokens", &toks)) {
		if (toks.n == 0 || toks.n > (1u << 24))
			return errmsg(err, errlen, -EINVAL, "gguf: key 'tokenizer.ggml.tokens' has %" PRIu64 " entries", toks.n);
		c->vocab_size = (int)toks.n;
	} else {
		int64_t ti = gguf_find_tensor(g, "token_embd.weight");
		if (ti < 0)
			return errmsg(err, errlen, -EINVAL, "gguf: missing tensor 'token_embd.weight'");
		int64_t rows = gguf_tensor(g, ti)->ne[1];
		if (rows > (1 << 24))
			return errmsg(err, errlen, -EINVAL, "gguf: tensor 'token_embd.weight' has %" PRId64 " rows", rows);
		c->vocab_size = (int)rows;
	}
	uint32_t id;
	c->bos_id = c->eos_id = -1;
	if (!gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &id) && id < (uint32_t)c->vocab_size)
		c->bos_id = (int)id;
	if (!gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &id) && id < (uint32_t)c->vocab_size) {
		c->eos_id = (int)id;
		c->eos_ids[0] = c->eos_id;
		c->n_eos = 1;
	}
	c->qkv_bias = gguf_find_tensor(g, "blk.0.attn_q.bias") >= 0;
	return model_config_validate(c, err, errlen);
}

/* ---- GGUF rope_freqs.weight: llama3 rope scaling stored as per-pair divisors ----
 *
 * llama.cpp's converter writes the rope scaling of Llama 3.1+ not as metadata but as a tensor of
 * head_dim/2 divisors of the rotary frequencies f_i = theta^(-2i/d) (the backends' formula in
 * divisor form): 1 where the wavelength 2pi/f_i is below original_ctx/high_freq_factor, factor
 * above original_ctx/low_freq_factor, and 1/((1-s)/factor + s) between, with
 * s = (original_ctx/wavelength - low) / (high - low). The divisors pin factor and the two band
 * edges only (scaling original_ctx, low and high together changes nothing), so the parameters
 * are derived in x = 1/wavelength, where s = (x - x_lo)/(x_hi - x_lo) is a line: fitted through
 * the first and last pair inside the band, or with the edges put midway between the pairs that
 * bound them when the band holds fewer than two; original_ctx is the integer nearest 1/x_lo.
 * The result is kept only when the formula reproduces every divisor; a tensor it cannot
 * reproduce (not llama3 scaling, or corrupt) is refused naming the first entry that disagrees. */

#define RF_CLASS_TOL 1e-4 /* a divisor this close (relative) to 1 or factor is at a band edge */
#define RF_MATCH_TOL 1e-4 /* derived parameters must reproduce every divisor this closely */
#define RF_EXACT_TOL 2e-6 /* rounded parameters are preferred when they reproduce this closely */

struct rope_l3 {
	double factor, low, high;
	int orig;
};

static double rf_x(const struct fkv_model_config *c, int i)
{
	return pow((double)c->rope_theta, -2.0 * i / c->head_dim) / (2.0 * M_PI);
}

/* Divisor of pair i with the parameters as the config will hold them (floats). */
static double rf_divisor(const struct fkv_model_config *c, const struct rope_l3 *p, int i)
{
	float factor = (float)p->factor, low = (float)p->low, high = (float)p->high;
	double wavelen = 1.0 / rf_x(c, i);
	if (wavelen < p->orig / (double)high)
		return 1.0;
	if (wavelen > p->orig / (double)low)
		return factor;
	double s = (p->orig / wavelen - low) / ((double)high - low);
	return 1.0 / ((1.0 - s) / factor + s);
}

/* Largest relative error over the pairs, and the first pair beyond tol (-1 when none). */
static double rf_check(const struct fkv_model_config *c, const struct rope_l3 *p, const float *r,
		       int n, double tol, int *bad)
{
	double worst = 0;
	*bad = -1;
	for (int i = 0; i < n; i++) {
		double d = rf_divisor(c, p, i), e = fabs(r[i] - d) / d;
		if (!(e <= tol) && *bad < 0)
			*bad = i;
		if (!(e <= worst))
			worst = e;
	}
	return worst;
}

static bool rf_near(double v, double to)
{
	return fabs(v - to) <= RF_CLASS_TOL * to;
}

/* Band edges x_lo < x_hi in 1/wavelength from the divisors r[0..n), factor = r[n-1] > 1. */
static int rf_edges(const struct fkv_model_config *c, const float *r, int n, double *x_lo,
		    double *x_hi)
{
	double factor = r[n - 1];
	int a = 0, b = n;
	while (a < n && rf_near(r[a], 1.0))
		a++;
	while (b > a && rf_near(r[b - 1], factor))
		b--;
#define RF_S(i) ((1.0 / r[i] - 1.0 / factor) / (1.0 - 1.0 / factor))
	if (b - a >= 2) {
		double xa = rf_x(c, a), xb = rf_x(c, b - 1), sa = RF_S(a), sb = RF_S(b - 1);
		double k = (sa - sb) / (xa - xb);
		if (!(k > 0))
			return -EINVAL;
		*x_lo = xb - sb / k;
		*x_hi = *x_lo + 1.0 / k;
	} else if (b - a == 1) {
		double xa = rf_x(c, a), s = RF_S(a);
		double up = a > 0 ? rf_x(c, a - 1) : 2.0 * xa, dn = b < n ? rf_x(c, b) : 0.0;
		if (!(s > 0 && s < 1))
			return -EINVAL;
		*x_hi = (xa + up) / 2;
		*x_lo = (xa - s * *x_hi) / (1.0 - s);
		if (*x_lo < dn) {
			*x_lo = (dn + xa) / 2;
			*x_hi = *x_lo + (xa - *x_lo) / s;
		}
	} else if (a == 0) { /* every pair scaled: the band lies above the highest frequency */
		*x_lo = 2.0 * rf_x(c, 0);
		*x_hi = 4.0 * rf_x(c, 0);
	} else {
		double xa = rf_x(c, a), gap = rf_x(c, a - 1) - xa;
		*x_lo = xa + gap / 3;
		*x_hi = xa + 2 * gap / 3;
	}
#undef RF_S
	return isfinite(*x_lo) && isfinite(*x_hi) && *x_lo > 0 && *x_hi > *x_lo ? 0 : -EINVAL;
}

/* Derives llama3 parameters reproducing the divisors; factor 0 when every divisor is 1. */
static int rf_derive(const struct fkv_model_config *c, const float *r, int n, struct rope_l3 *out,
		     char *err, size_t errlen)
{
	static const char T[] = "rope_freqs.weight";
	memset(out, 0, sizeof *out);
	for (int i = 0; i < n; i++) {
		if (!isfinite(r[i]) || r[i] < 1.0 - RF_CLASS_TOL)
			return errmsg(err, errlen, -EINVAL,
				    "model: tensor '%s' entry %d is %g; rope frequency divisors are finite and >= 1",
				    T, i, (double)r[i]);
	}
	if (rf_near(r[n - 1], 1.0)) {
		for (int i = 0; i < n; i++) {
			if (!rf_near(r[i], 1.0))
				return errmsg(err, errlen, -EINVAL,
					    "model: tensor '%s' is not llama3 rope scaling: entry %d is %g but the "
					    "last is 1", T, i, (double)r[i]);
		}
		return 0;
	}
	double x_lo, x_hi;
	if (rf_edges(c, r, n, &x_lo, &x_hi) || 1.0 / x_lo > INT_MAX / 2)
		return errmsg(err, errlen, -EINVAL,
			    "model: tensor '%s' is not llama3 rope scaling (divisors do not rise from 1 to factor %g "
			    "across one band)", T, (double)r[n - 1]);
	struct rope_l3 raw = { r[n - 1], 0, 0, (int)llround(1.0 / x_lo) };
	if (raw.orig < 1)
		raw.orig = 1;
	raw.low = raw.orig * x_lo;
	raw.high = raw.orig * x_hi;
	/* Llama 3.1's own parameters (8, 1, 4, 8192) come back to within float rounding: prefer
	 * the rounded values when they reproduce the divisors as well */
	struct rope_l3 nice = { round(raw.factor * 1e3) / 1e3, round(raw.low * 1e3) / 1e3,
				round(raw.high * 1e3) / 1e3, raw.orig };
	int bad;
	if (nice.low > 0 && nice.high > nice.low && rf_check(c, &nice, r, n, RF_EXACT_TOL, &bad) <= RF_EXACT_TOL) {
		*out = nice;
		return 0;
	}
	*out = raw;
	if (rf_check(c, out, r, n, RF_MATCH_TOL, &bad) <= RF_MATCH_TOL)
		return 0;
	double want = rf_divisor(c, out, bad);
	return errmsg(err, errlen, -EINVAL,
		    "model: tensor '%s' is not llama3 rope scaling: entry %d is %g, the closest llama3 parameters "
		    "(factor %g, low_freq_factor %g, high_freq_factor %g, original context %d) give %g",
		    T, bad, (double)r[bad], out->factor, out->low, out->high, out->orig, want);
}

/* A GGUF's rope_freqs.weight (optional) -> the config's llama3 scaling, the tensor claimed. */
static int bind_rope_freqs(struct fkv_model *m, struct model_priv *p, char *err, size_t errlen)
{
	int64_t ti = gguf_find_tensor(p->gguf, "rope_freqs.weight");
	if (ti < 0)
		return 0;
	const struct gguf_tensor_info *t = gguf_tensor(p->gguf, ti);
	struct fkv_model_config *c = &m->cfg;
	int n = c->head_dim / 2;
	if (!t->has_dtype)
		return errmsg(err, errlen, -EINVAL, "model: tensor 'rope_freqs.weight' is %s; it must be F32, F16 "
			    "or BF16", t->type_name);
	if (t->n_dims != 1 || t->ne[0] != n) {
		int64_t dims[GGUF_MAX_DIMS];
		char b[96];
		for (int d = 0; d < t->n_dims; d++)
			dims[d] = t->ne[t->n_dims - 1 - d];
		fmt_shape(b, sizeof b, dims, t->n_dims);
		return errmsg(err, errlen, -EINVAL, "model: tensor 'rope_freqs.weight' has shape %s, expected (%d) "
			    "(head_dim / 2)", b, n);
	}
	size_t es = dtype_size(t->dtype);
	float *r = malloc((size_t)n * sizeof *r);
	void *raw = malloc((size_t)n * es);
	int ret = -ENOMEM;
	if (r && raw) {
		memcpy(raw, t->data, (size_t)n * es); /* the file's alignment may not suit floats */
		dtype_to_f32(r, raw, t->dtype, (size_t)n);
		struct rope_l3 l3;
		ret = rf_derive(c, r, n, &l3, err, errlen);
		if (!ret) {
			c->rope_scaling_factor = (float)l3.factor;
			c->rope_low_freq_factor = (float)l3.low;
			c->rope_high_freq_factor = (float)l3.high;
			c->rope_original_ctx = l3.orig;
			p->claimed[ti] = 1;
		}
	} else {
		errmsg(err, errlen, ret, "model: out of memory");
	}
	free(raw);
	free(r);
	return ret;
}

static int fp_update_u32(EVP_MD_CTX *h, uint32_t v)
{
	return EVP_DigestUpdate(h, &v, sizeof v);
}

static int fp_tensor(EVP_MD_CTX *h, const char *name, const struct fkv_tensor *t)
{
	char line[320];
	if (!t->data) {
		int n = snprintf(line, sizeof line, "tensor %s absent\n", name);
		return EVP_DigestUpdate(h, line, (size_t)n);
	}
	uint64_t size = model_tensor_bytes(t);
	int n = snprintf(line, sizeof line, "tensor %s %s %d %" PRId64 " %" PRId64 " %" PRIu64 "\n", name,
			 t->quant ? quant_name(t->quant) : dtype_name(t->dtype), t->n_dims, t->shape[0],
			 t->shape[1], size);
	if (!EVP_DigestUpdate(h, line, (size_t)n))
		return 0;
	const uint8_t *d = t->data;
	if (size <= 3 * FP_SAMPLE)
		return EVP_DigestUpdate(h, d, size);
	return EVP_DigestUpdate(h, d, FP_SAMPLE) && EVP_DigestUpdate(h, d + size / 2, FP_SAMPLE) &&
	       EVP_DigestUpdate(h, d + size - FP_SAMPLE, FP_SAMPLE);
}

static int fingerprint(struct fkv_model *m, char *err, size_t errlen)
{
	const struct fkv_model_config *c = &m->cfg;
	EVP_MD_CTX *h = EVP_MD_CTX_new();
	if (!h)
		return errmsg(err, errlen, -ENOMEM, "model: out of memory (fingerprint)");
	char buf[1024];
	float fl[5] = { c->norm_eps, c->rope_theta, c->rope_scaling_factor, c->rope_low_freq_factor,
			c->rope_high_freq_factor };
	uint32_t bits[5];
	memcpy(bits, fl, sizeof bits);
	int n = snprintf(buf, sizeof buf,
			 "freekv-model-fingerprint-v1\narch=%s\nlayers=%d\ndim=%d\nheads=%d\nkv_heads=%d\n"
			 "head_dim=%d\nffn=%d\nvocab=%d\nctx=%d\neps=%08x\ntheta=%08x\nrope_style=%d\n"
			 "rope_scaling=%08x,%08x,%08x,%d\ntied=%d\nqkv_bias=%d\nbos=%d\nsliding=%d\ndtype=%s\n"
			 "eos=%d",
			 c->arch, c->n_layers, c->dim, c->n_heads, c->n_kv_heads, c->head_dim, c->ffn_dim,
			 c->vocab_size, c->ctx_len, bits[0], bits[1], (int)c->rope_style, bits[2], bits[3], bits[4],
			 c->rope_original_ctx, c->tied_embeddings, c->qkv_bias, c->bos_id, c->sliding_window,
			 dtype_name(c->dtype), c->n_eos);
	bool ok = EVP_DigestInit_ex(h, EVP_sha256(), NULL) && EVP_DigestUpdate(h, buf, (size_t)n);
	for (int i = 0; i < c->n_eos && ok; i++)
		ok = fp_update_u32(h, (uint32_t)c->eos_ids[i]);
	ok = ok && fp_tensor(h, "tok_embd", &m->tok_embd) && fp_tensor(h, "out_norm", &m->out_norm) &&
	     fp_tensor(h, c->tied_embeddings ? "output(tied)" : "output", &m->output);
	static const char *const lnames[] = { "attn_norm", "wq", "wk", "wv", "wo", "bq", "bk", "bv",
					      "ffn_norm", "w_gate", "w_up", "w_down" };
	for (int l = 0; l < c->n_layers && ok; l++) {
		const struct fkv_layer_weights *w = &m->layers[l];
		const struct fkv_tensor *ts[] = { &w->attn_norm, &w->wq, &w->wk, &w->wv, &w->wo, &w->bq,
						  &w->bk, &w->bv, &w->ffn_norm, &w->w_gate, &w->w_up, &w->w_down };
		for (size_t i = 0; i < sizeof ts / sizeof ts[0] && ok; i++) {
			snprintf(buf, sizeof buf, "%d.%s", l, lnames[i]);
			ok = fp_tensor(h, buf, ts[i]);
		}
	}
	unsigned int len = 0;
	ok = ok && EVP_DigestFinal_ex(h, m->fingerprint, &len) && len == FKV_FINGERPRINT_BYTES;
	EVP_MD_CTX_free(h);
	return ok ? 0 : errmsg(err, errlen, -EIO, "model: SHA-256 failed (OpenSSL)");
}

size_t model_tensor_bytes(const struct fkv_tensor *t)
{
	if (!t->data)
		return 0;
	if (t->quant)
		return (size_t)t->shape[0] * quant_row_bytes(t->quant, t->shape[1]);
	return (size_t)(t->shape[0] * t->shape[1]) * dtype_size(t->dtype);
}

void model_fingerprint_hex(const struct fkv_model *m, char out[2 * FKV_FINGERPRINT_BYTES + 1])
{
	for (int i = 0; i < FKV_FINGERPRINT_BYTES; i++)
		snprintf(out + 2 * i, 3, "%02x", m->fingerprint[i]);
}

static bool has_suffix(const char *s, const char *sfx)
{
	size_t a = strlen(s), b = strlen(sfx);
	return a >= b && !strcmp(s + a - b, sfx);
}

static int load(const char *path, struct fkv_model *m, struct model_priv *p, char *err, size_t errlen)
{
	struct stat st;
	int ret;
	if (stat(path, &st) < 0)
		return errmsg(err, errlen, -errno, "model: %s: %s", path, strerror(errno));
	if ((size_t)snprintf(m->path, sizeof m->path, "%s", path) >= sizeof m->path)
		return errmsg(err, errlen, -ENAMETOOLONG, "model: path too long");
	if (S_ISDIR(st.st_mode)) {
		if ((ret = hf_config_load(path, &m->cfg, err, errlen)))
			return ret;
		if ((ret = st_open(path, &p->st, err, errlen)))
			return ret;
	} else if (S_ISREG(st.st_mode) && has_suffix(path, ".gguf")) {
		m->is_gguf = true;
		if ((ret = gguf_open(path, &p->gguf, err, errlen)) ||
		    (ret = gguf_check_types(p->gguf, err, errlen)))
			return ret;
		if ((ret = gguf_config(p->gguf, &m->cfg, err, errlen)))
			return ret;
	} else {
		return errmsg(err, errlen, -EINVAL,
			    "model: %s is neither a .gguf file nor a Hugging Face folder (config.json + safetensors)", path);
	}
	int64_t nt = p->gguf ? gguf_n_tensors(p->gguf) : st_n_tensors(p->st);
	p->claimed = calloc((size_t)(nt ? nt : 1), 1);
	m->layers = calloc((size_t)m->cfg.n_layers, sizeof *m->layers);
	if (!p->claimed || !m->layers)
		return errmsg(err, errlen, -ENOMEM, "model: out of memory");
	if (p->gguf && (ret = bind_rope_freqs(m, p, err, errlen)))
		return ret;
	if ((ret = bind_all(m, p, err, errlen)) || (ret = check_claimed(m, p, err, errlen)))
		return ret;
	resolve_output(m);
	m->cfg.dtype = m->layers[0].wq.quant ? FKV_F16 : m->layers[0].wq.dtype;
	return fingerprint(m, err, errlen);
}

int model_load(const char *path, struct fkv_model *m, char *err, size_t errlen)
{
	memset(m, 0, sizeof *m);
	struct model_priv *p = calloc(1, sizeof *p);
	if (!p)
		return errmsg(err, errlen, -ENOMEM, "model: out of memory");
	m->priv = p;
	int ret = load(path, m, p, err, errlen);
	if (ret)
		model_free(m);
	return ret;
}

void model_drop_pages(const struct fkv_model *m)
{
	const struct model_priv *p = m->priv;
	if (p) {
		gguf_drop_pages(p->gguf);
		st_drop_pages(p->st);
	}
}

void model_free(struct fkv_model *m)
{
	struct model_priv *p = m->priv;
	if (p) {
		gguf_close(p->gguf);
		st_close(p->st);
		for (int i = 0; i < p->n_copies; i++)
			free(p->copies[i]);
		free(p->copies);
		free(p->claimed);
		free(p);
	}
	free(m->layers);
	memset(m, 0, sizeof *m);
}

const struct gguf_ctx *model_gguf(const struct fkv_model *m)
{
	const struct model_priv *p = m->priv;
	return p ? p->gguf : NULL;
}
