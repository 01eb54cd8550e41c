/* cmd_info — `kvworker info -m MODEL [--json]`: what a user checks first about a model file —
 * geometry, vocabulary, tokenizer, rope, tensor types and sizes, chat-template family — from its
 * headers only: a GGUF's metadata and tensor table, or a Hugging Face folder's config.json,
 * tokenizer.json, tokenizer_config.json (or chat_template.jinja) and safetensors headers. The
 * files are mapped, no weight is read. It reports what the file says without judging it, so it
 * works where generate refuses: quantized types without kernels (docs/quant.md), an architecture or a pre-tokenizer freekv
 * does not support. A file it cannot parse is an error (exit 1, the reader's message). */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <json-c/json.h>

#include "cmd_common.h"
#include "errmsg.h"
#include "gguf.h"
#include "safetensors.h"

#define UNKNOWN (-1)
#define MAX_TYPES 40

struct info_type {
	char name[16];
	int64_t count;
	uint64_t bytes;
};

/* Everything printed; integers are UNKNOWN and strings "" when the file does not say. */
struct info {
	const char *path;
	const char *format;	/* "gguf" or "hf" */
	uint32_t gguf_version;
	char name[128];		/* GGUF general.name */
	char arch[64];		/* general.architecture, or config.json model_type */
	char hf_class[96];	/* config.json architectures[0] */
	int64_t layers, heads, kv_heads, head_dim, dim, ffn, vocab, ctx, rope_dims;
	double rope_theta;
	bool rope_theta_default;
	const char *rope_style;	/* "interleaved", "halves" or "unknown" */
	char scaling[32];	/* "none", "linear", "yarn", "llama3", ... */
	double scaling_factor, low_freq, high_freq; /* 0 when not given */
	int64_t scaling_orig_ctx;
	bool scaling_tensor;	/* GGUF rope_freqs.weight: llama3 divisors as a tensor */
	double norm_eps;	/* < 0 when not given */
	char tok_model[64], tok_pre[128];
	const char *chat;	/* chat-template family */
	struct info_type types[MAX_TYPES];
	int n_types;
	int64_t n_tensors;
	uint64_t n_params, bytes;
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvworker info -m MODEL [--json]\n"
		"  -m, --model PATH     .gguf file or Hugging Face folder\n"
		"      --json           print one JSON object instead of text\n"
		"  -h, --help           this text\n"
		"Reads headers only; works on files generate cannot load (quantized types without\n"
		"kernels, unsupported architectures or tokenizers).\n");
}

/* Rotary layout by GGUF architecture (llama.cpp's rope type: NORM pairs adjacent dims). */
static const struct {
	const char *arch;
	const char *style;
} gguf_rope[] = {
	{ "llama", "interleaved" },  { "baichuan", "interleaved" }, { "internlm2", "interleaved" },
	{ "minicpm", "interleaved" }, { "command-r", "interleaved" }, { "olmo", "interleaved" },
	{ "deepseek", "interleaved" }, { "deepseek2", "interleaved" }, { "granite", "interleaved" },
	{ "qwen", "halves" },	     { "qwen2", "halves" },	   { "qwen2moe", "halves" },
	{ "qwen3", "halves" },	     { "qwen3moe", "halves" },	   { "phi2", "halves" },
	{ "phi3", "halves" },	     { "gemma", "halves" },	   { "gemma2", "halves" },
	{ "gemma3", "halves" },	     { "stablelm", "halves" },	   { "starcoder2", "halves" },
	{ "falcon", "halves" },	     { "gptneox", "halves" },	   { "olmo2", "halves" },
};

/* The family a chat template belongs to, by the markers its format is built from. */
static const char *chat_family(const char *t)
{
	static const struct {
		const char *marker, *family;
	} fam[] = {
		{ "<|im_start|>", "chatml" },
		{ "<|start_header_id|>", "llama3" },
		{ "[INST]", "llama2" },
		{ "<start_of_turn>", "gemma" },
	};
	if (!t || !*t)
		return "none";
	for (size_t i = 0; i < sizeof fam / sizeof fam[0]; i++) {
		if (strstr(t, fam[i].marker))
			return fam[i].family;
	}
	return "unknown";
}

static void add_type(struct info *in, const char *name, uint64_t n_el, uint64_t bytes)
{
	int i = 0;
	while (i < in->n_types && strcmp(in->types[i].name, name))
		i++;
	if (i == in->n_types) {
		if (in->n_types == MAX_TYPES)
			i = MAX_TYPES - 1; /* more kinds than exist today: fold into the last */
		else
			snprintf(in->types[in->n_types++].name, sizeof in->types[0].name, "%s", name);
	}
	in->types[i].count++;
	in->types[i].bytes += bytes;
	in->n_tensors++;
	in->n_params += n_el;
	in->bytes += bytes;
}

/* ---- GGUF ---- */

/* "<arch>.<suffix>" as a non-negative integer, or UNKNOWN. */
static int64_t gguf_int(const struct gguf_ctx *g, const char *arch, const char *suffix)
{
	char key[160];
	uint64_t v;
	snprintf(key, sizeof key, "%s.%s", arch, suffix);
	return !gguf_get_u64(g, key, &v) && v <= INT64_MAX ? (int64_t)v : UNKNOWN;
}

static double gguf_float(const struct gguf_ctx *g, const char *arch, const char *suffix, double dflt)
{
	char key[160];
	float v;
	snprintf(key, sizeof key, "%s.%s", arch, suffix);
	return gguf_get_f32(g, key, &v) ? dflt : v;
}

static void gguf_copy_str(const struct gguf_ctx *g, const char *key, char *dst, size_t len)
{
	const char *s;
	if (!gguf_get_str(g, key, &s, NULL))
		snprintf(dst, len, "%s", s);
}

static void gguf_rope_info(const struct gguf_ctx *g, struct info *in)
{
	const char *a = in->arch;
	char key[160];
	in->rope_theta = gguf_float(g, a, "rope.freq_base", -1);
	if (in->rope_theta < 0) {
		in->rope_theta = 10000.0; /* what llama.cpp and model_load assume */
		in->rope_theta_default = true;
	}
	in->rope_dims = gguf_int(g, a, "rope.dimension_count");
	in->rope_style = "unknown";
	for (size_t i = 0; i < sizeof gguf_rope / sizeof gguf_rope[0]; i++) {
		if (!strcmp(a, gguf_rope[i].arch))
			in->rope_style = gguf_rope[i].style;
	}
	snprintf(in->scaling, sizeof in->scaling, "none");
	snprintf(key, sizeof key, "%s.rope.scaling.type", a);
	gguf_copy_str(g, key, in->scaling, sizeof in->scaling);
	in->scaling_factor = gguf_float(g, a, "rope.scaling.factor", 0);
	double lin = gguf_float(g, a, "rope.scale_linear", 0); /* the key before scaling.type */
	if (!strcmp(in->scaling, "none") && lin > 0 && lin != 1) {
		snprintf(in->scaling, sizeof in->scaling, "linear");
		in->scaling_factor = lin;
	}
	in->scaling_orig_ctx = gguf_int(g, a, "rope.scaling.original_context_length");
	if (gguf_find_tensor(g, "rope_freqs.weight") >= 0) {
		in->scaling_tensor = true;
		if (!strcmp(in->scaling, "none"))
			snprintf(in->scaling, sizeof in->scaling, "llama3");
	}
}

static int info_gguf(const char *path, struct info *in, char *err, size_t errlen)
{
	struct gguf_ctx *g;
	int ret = gguf_open(path, &g, err, errlen);
	if (ret)
		return ret;
	in->format = "gguf";
	in->gguf_version = gguf_version(g);
	gguf_copy_str(g, "general.name", in->name, sizeof in->name);
	gguf_copy_str(g, "general.architecture", in->arch, sizeof in->arch);
	const char *a = in->arch;
	in->layers = gguf_int(g, a, "block_count");
	in->heads = gguf_int(g, a, "attention.head_count");
	in->kv_heads = gguf_int(g, a, "attention.head_count_kv");
	if (in->kv_heads == UNKNOWN)
		in->kv_heads = in->heads;
	in->dim = gguf_int(g, a, "embedding_length");
	in->head_dim = gguf_int(g, a, "attention.key_length");
	if (in->head_dim == UNKNOWN && in->dim > 0 && in->heads > 0)
		in->head_dim = in->dim / in->heads;
	in->ffn = gguf_int(g, a, "feed_forward_length");
	in->ctx = gguf_int(g, a, "context_length");
	in->norm_eps = gguf_float(g, a, "attention.layer_norm_rms_epsilon", -1);
	if (in->norm_eps < 0)
		in->norm_eps = gguf_float(g, a, "attention.layer_norm_epsilon", -1);
	gguf_rope_info(g, in);
	struct gguf_arr toks;
	if (!gguf_get_arr(g, "tokenizer.ggml.tokens", &toks) && toks.n <= INT64_MAX)
		in->vocab = (int64_t)toks.n;
	else if ((in->vocab = gguf_int(g, a, "vocab_size")) == UNKNOWN) {
		int64_t ti = gguf_find_tensor(g, "token_embd.weight");
		if (ti >= 0 && gguf_tensor(g, ti)->n_dims == 2)
			in->vocab = gguf_tensor(g, ti)->ne[1];
	}
	gguf_copy_str(g, "tokenizer.ggml.model", in->tok_model, sizeof in->tok_model);
	gguf_copy_str(g, "tokenizer.ggml.pre", in->tok_pre, sizeof in->tok_pre);
	const char *tmpl = NULL;
	gguf_get_str(g, "tokenizer.chat_template", &tmpl, NULL);
	in->chat = chat_family(tmpl);
	for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
		const struct gguf_tensor_info *t = gguf_tensor(g, i);
		add_type(in, t->type_name, t->n_elements, t->size);
	}
	gguf_close(g);
	return 0;
}

/* ---- Hugging Face folder ---- */

static struct json_object *jget(struct json_object *o, const char *key)
{
	struct json_object *v = NULL;
	if (o && json_object_is_type(o, json_type_object) && json_object_object_get_ex(o, key, &v) &&
	    !json_object_is_type(v, json_type_null))
		return v;
	return NULL;
}

static const char *jstr(struct json_object *o, const char *key)
{
	struct json_object *v = jget(o, key);
	return v && json_object_is_type(v, json_type_string) ? json_object_get_string(v) : NULL;
}

static int64_t jint(struct json_object *o, const char *key)
{
	struct json_object *v = jget(o, key);
	if (!v || !json_object_is_type(v, json_type_int))
		return UNKNOWN;
	int64_t x = json_object_get_int64(v);
	return x >= 0 ? x : UNKNOWN;
}

static double jnum(struct json_object *o, const char *key, double dflt)
{
	struct json_object *v = jget(o, key);
	if (!v || (!json_object_is_type(v, json_type_int) && !json_object_is_type(v, json_type_double)))
		return dflt;
	return json_object_get_double(v);
}

/* dir/name parsed as JSON: 0, -ENOENT when the file is absent, else an error. */
static int read_json(const char *dir, const char *name, struct json_object **out, char *err,
		     size_t errlen)
{
	char path[4200];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	*out = NULL;
	if (access(path, F_OK))
		return -ENOENT;
	*out = json_object_from_file(path);
	if (!*out)
		return errmsg(err, errlen, -EINVAL, "%s: not valid JSON (%s)", path, json_util_get_last_err());
	return 0;
}

/* "Split+ByteLevel" for a Sequence, the type for one pre-tokenizer. */
static void pre_names(struct json_object *pre, char *dst, size_t len)
{
	const char *type = jstr(pre, "type");
	struct json_object *seq = jget(pre, "pretokenizers");
	if (!type || strcmp(type, "Sequence") || !seq || !json_object_is_type(seq, json_type_array)) {
		snprintf(dst, len, "%s", type ? type : "none");
		return;
	}
	size_t o = 0;
	dst[0] = '\0';
	for (size_t i = 0; i < json_object_array_length(seq) && o < len; i++) {
		const char *t = jstr(json_object_array_get_idx(seq, i), "type");
		o += (size_t)snprintf(dst + o, len - o, "%s%s", i ? "+" : "", t ? t : "?");
	}
}

static int hf_tokenizer(const char *dir, struct info *in, char *err, size_t errlen)
{
	struct json_object *tok, *cfg;
	int ret = read_json(dir, "tokenizer.json", &tok, err, errlen);
	if (ret && ret != -ENOENT)
		return ret;
	if (tok) {
		const char *type = jstr(jget(tok, "model"), "type");
		snprintf(in->tok_model, sizeof in->tok_model, "%s", type ? type : "?");
		pre_names(jget(tok, "pre_tokenizer"), in->tok_pre, sizeof in->tok_pre);
		json_object_put(tok);
	}
	/* the chat template: tokenizer_config.json (a string, or named templates), else the
	 * chat_template.jinja newer exports write beside it */
	if ((ret = read_json(dir, "tokenizer_config.json", &cfg, err, errlen)) && ret != -ENOENT)
		return ret;
	struct json_object *ct = jget(cfg, "chat_template");
	const char *tmpl = ct && json_object_is_type(ct, json_type_string) ? json_object_get_string(ct) : NULL;
	for (size_t i = 0; !tmpl && ct && json_object_is_type(ct, json_type_array) &&
			   i < json_object_array_length(ct); i++) {
		struct json_object *e = json_object_array_get_idx(ct, i);
		const char *name = jstr(e, "name");
		if (!i || (name && !strcmp(name, "default")))
			tmpl = jstr(e, "template");
	}
	char *jinja = NULL;
	if (!tmpl) {
		char path[4200];
		snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
		if (!access(path, F_OK) && (ret = cmd_read_text(path, &jinja))) {
			json_object_put(cfg);
			return errmsg(err, errlen, ret, "cannot read %s: %s", path, strerror(-ret));
		}
		tmpl = jinja;
	}
	in->chat = chat_family(tmpl);
	free(jinja);
	json_object_put(cfg);
	return 0;
}

static void hf_rope_scaling(struct json_object *c, struct info *in)
{
	struct json_object *rs = jget(c, "rope_scaling");
	const char *type = jstr(rs, "rope_type");
	if (!type)
		type = jstr(rs, "type");
	snprintf(in->scaling, sizeof in->scaling, "%s", !type || !strcmp(type, "default") ? "none" : type);
	in->scaling_factor = jnum(rs, "factor", 0);
	in->low_freq = jnum(rs, "low_freq_factor", 0);
	in->high_freq = jnum(rs, "high_freq_factor", 0);
	in->scaling_orig_ctx = jint(rs, "original_max_position_embeddings");
}

static const char *st_type_name(enum fkv_dtype t)
{
	return t == FKV_F32 ? "F32" : t == FKV_F16 ? "F16" : t == FKV_BF16 ? "BF16" : "?";
}

static int info_hf(const char *dir, struct info *in, char *err, size_t errlen)
{
	struct json_object *root;
	int ret = read_json(dir, "config.json", &root, err, errlen);
	if (ret == -ENOENT)
		return errmsg(err, errlen, -ENOENT, "no config.json in the folder (not a Hugging Face model)");
	if (ret)
		return ret;
	in->format = "hf";
	struct json_object *archs = jget(root, "architectures");
	if (archs && json_object_is_type(archs, json_type_array) && json_object_array_length(archs) &&
	    json_object_is_type(json_object_array_get_idx(archs, 0), json_type_string))
		snprintf(in->hf_class, sizeof in->hf_class, "%s",
			 json_object_get_string(json_object_array_get_idx(archs, 0)));
	const char *mt = jstr(root, "model_type");
	snprintf(in->arch, sizeof in->arch, "%s", mt ? mt : "");
	/* multimodal configs keep the language model's geometry under text_config */
	struct json_object *c = jget(root, "text_config") ? jget(root, "text_config") : root;
	in->layers = jint(c, "num_hidden_layers");
	in->heads = jint(c, "num_attention_heads");
	in->kv_heads = jint(c, "num_key_value_heads");
	if (in->kv_heads == UNKNOWN)
		in->kv_heads = in->heads;
	in->dim = jint(c, "hidden_size");
	in->head_dim = jint(c, "head_dim");
	if (in->head_dim == UNKNOWN && in->dim > 0 && in->heads > 0)
		in->head_dim = in->dim / in->heads;
	in->ffn = jint(c, "intermediate_size");
	in->vocab = jint(c, "vocab_size");
	in->ctx = jint(c, "max_position_embeddings");
	in->norm_eps = jnum(c, "rms_norm_eps", jnum(c, "layer_norm_eps", jnum(c, "layer_norm_epsilon", -1)));
	in->rope_theta = jnum(c, "rope_theta", -1);
	if (in->rope_theta < 0) {
		in->rope_theta = 10000.0; /* the transformers default */
		in->rope_theta_default = true;
	}
	in->rope_style = "halves"; /* the Hugging Face layout, whatever the architecture */
	double prf = jnum(c, "partial_rotary_factor", 1.0);
	in->rope_dims = in->head_dim > 0 ? (int64_t)(prf * (double)in->head_dim) : UNKNOWN;
	hf_rope_scaling(c, in);
	json_object_put(root);
	if ((ret = hf_tokenizer(dir, in, err, errlen)))
		return ret;
	struct st_ctx *st;
	if ((ret = st_open(dir, &st, err, errlen)))
		return ret;
	for (int i = 0; i < st_n_tensors(st); i++) {
		const struct st_tensor *t = st_tensor(st, i);
		uint64_t n = 1;
		for (int d = 0; d < t->n_dims; d++)
			n *= (uint64_t)t->shape[d];
		add_type(in, st_type_name(t->dtype), n, t->size);
	}
	st_close(st);
	return 0;
}

/* ---- output ---- */

/* The shortest text that reads back as the same float (1e-05, not 9.99999975e-06; 100000,
 * not 1e+05). */
static void fmt_float(double v, char *buf, size_t len)
{
	if (v == (double)(int64_t)v && fabs(v) < 1e15) {
		snprintf(buf, len, "%.0f", v);
		return;
	}
	for (int p = 1; p <= 17; p++) {
		snprintf(buf, len, "%.*g", p, v);
		if ((float)strtod(buf, NULL) == (float)v)
			return;
	}
}

static void print_int(const char *label, int64_t v)
{
	if (v == UNKNOWN)
		printf("%-16s ?\n", label);
	else
		printf("%-16s %" PRId64 "\n", label, v);
}

static void scaling_text(const struct info *in, char *buf, size_t len)
{
	char f[32], lo[32], hi[32];
	if (!strcmp(in->scaling, "none")) {
		snprintf(buf, len, "none");
		return;
	}
	if (in->scaling_tensor) {
		snprintf(buf, len, "%s (per-pair divisors in tensor rope_freqs.weight)", in->scaling);
		return;
	}
	size_t o = (size_t)snprintf(buf, len, "%s", in->scaling);
	fmt_float(in->scaling_factor, f, sizeof f);
	fmt_float(in->low_freq, lo, sizeof lo);
	fmt_float(in->high_freq, hi, sizeof hi);
	if (in->scaling_factor > 0 && o < len)
		o += (size_t)snprintf(buf + o, len - o, " (factor %s", f);
	if (in->low_freq > 0 && in->high_freq > 0 && o < len)
		o += (size_t)snprintf(buf + o, len - o, ", low_freq_factor %s, high_freq_factor %s", lo, hi);
	if (in->scaling_orig_ctx > 0 && o < len)
		o += (size_t)snprintf(buf + o, len - o, ", original context %" PRId64, in->scaling_orig_ctx);
	if (in->scaling_factor > 0 && o < len)
		snprintf(buf + o, len - o, ")");
}

static void print_text(const struct info *in)
{
	char b[512], f[32];
	if (!strcmp(in->format, "gguf"))
		printf("%-16s %s (GGUF v%u)\n", "file:", in->path, in->gguf_version);
	else
		printf("%-16s %s (Hugging Face folder)\n", "file:", in->path);
	if (in->name[0])
		printf("%-16s %s\n", "name:", in->name);
	if (in->hf_class[0])
		printf("%-16s %s (%s)\n", "architecture:", in->arch[0] ? in->arch : "?", in->hf_class);
	else
		printf("%-16s %s\n", "architecture:", in->arch[0] ? in->arch : "?");
	print_int("layers:", in->layers);
	print_int("heads:", in->heads);
	print_int("kv heads:", in->kv_heads);
	print_int("head dim:", in->head_dim);
	print_int("hidden size:", in->dim);
	print_int("ffn size:", in->ffn);
	print_int("vocab size:", in->vocab);
	print_int("context length:", in->ctx);
	fmt_float(in->rope_theta, f, sizeof f);
	printf("%-16s %s%s\n", "rope base:", f, in->rope_theta_default ? " (not given: default)" : "");
	if (in->rope_dims > 0 && in->head_dim > 0 && in->rope_dims != in->head_dim)
		printf("%-16s %s (partial: %" PRId64 " of %" PRId64 " dims)\n", "rope style:", in->rope_style,
		       in->rope_dims, in->head_dim);
	else
		printf("%-16s %s\n", "rope style:", in->rope_style);
	scaling_text(in, b, sizeof b);
	printf("%-16s %s\n", "rope scaling:", b);
	fmt_float(in->norm_eps, f, sizeof f);
	printf("%-16s %s\n", "norm eps:", in->norm_eps < 0 ? "?" : f);
	printf("%-16s %s\n", "tokenizer:", in->tok_model[0] ? in->tok_model : "none");
	printf("%-16s %s\n", "pre-tokenizer:", in->tok_pre[0] ? in->tok_pre : "none");
	printf("%-16s %s\n", "chat template:", in->chat);
	size_t o = 0;
	b[0] = '\0';
	for (int i = 0; i < in->n_types && o < sizeof b; i++)
		o += (size_t)snprintf(b + o, sizeof b - o, "%s%s %" PRId64, i ? ", " : "", in->types[i].name,
				      in->types[i].count);
	printf("%-16s %" PRId64 " (%s)\n", "tensors:", in->n_tensors, b);
	printf("%-16s %" PRIu64 " (%.1fM)\n", "parameters:", in->n_params, (double)in->n_params / 1e6);
	printf("%-16s %" PRIu64 " (%.1f MiB)\n", "parameter bytes:", in->bytes, (double)in->bytes / (1 << 20));
}

static struct json_object *jnew_int(int64_t v)
{
	return v == UNKNOWN ? NULL : json_object_new_int64(v);
}

static struct json_object *jnew_float(double v)
{
	char f[32];
	fmt_float(v, f, sizeof f);
	return json_object_new_double_s(v, f);
}

static struct json_object *jnew_str(const char *s)
{
	return s && *s ? json_object_new_string(s) : NULL;
}

static int print_json(const struct info *in)
{
	struct json_object *o = json_object_new_object(), *rs = json_object_new_object();
	struct json_object *types = json_object_new_object();
	if (!o || !rs || !types) {
		json_object_put(o);
		json_object_put(rs);
		json_object_put(types);
		return -ENOMEM;
	}
	json_object_object_add(o, "path", json_object_new_string(in->path));
	json_object_object_add(o, "format", json_object_new_string(in->format));
	if (!strcmp(in->format, "gguf"))
		json_object_object_add(o, "gguf_version", json_object_new_int64(in->gguf_version));
	json_object_object_add(o, "name", jnew_str(in->name));
	json_object_object_add(o, "architecture", jnew_str(in->arch));
	if (in->hf_class[0])
		json_object_object_add(o, "hf_architecture", jnew_str(in->hf_class));
	json_object_object_add(o, "layers", jnew_int(in->layers));
	json_object_object_add(o, "heads", jnew_int(in->heads));
	json_object_object_add(o, "kv_heads", jnew_int(in->kv_heads));
	json_object_object_add(o, "head_dim", jnew_int(in->head_dim));
	json_object_object_add(o, "hidden_size", jnew_int(in->dim));
	json_object_object_add(o, "ffn_size", jnew_int(in->ffn));
	json_object_object_add(o, "vocab_size", jnew_int(in->vocab));
	json_object_object_add(o, "context_length", jnew_int(in->ctx));
	json_object_object_add(o, "rope_theta", jnew_float(in->rope_theta));
	json_object_object_add(o, "rope_theta_default", json_object_new_boolean(in->rope_theta_default));
	json_object_object_add(o, "rope_style", json_object_new_string(in->rope_style));
	json_object_object_add(o, "rope_dims", jnew_int(in->rope_dims));
	json_object_object_add(rs, "type", json_object_new_string(in->scaling));
	if (in->scaling_factor > 0)
		json_object_object_add(rs, "factor", jnew_float(in->scaling_factor));
	if (in->low_freq > 0)
		json_object_object_add(rs, "low_freq_factor", jnew_float(in->low_freq));
	if (in->high_freq > 0)
		json_object_object_add(rs, "high_freq_factor", jnew_float(in->high_freq));
	if (in->scaling_orig_ctx > 0)
		json_object_object_add(rs, "original_context_length", jnew_int(in->scaling_orig_ctx));
	if (in->scaling_tensor)
		json_object_object_add(rs, "tensor", json_object_new_string("rope_freqs.weight"));
	json_object_object_add(o, "rope_scaling", rs);
	json_object_object_add(o, "norm_eps", in->norm_eps < 0 ? NULL : jnew_float(in->norm_eps));
	json_object_object_add(o, "tokenizer_model", jnew_str(in->tok_model));
	json_object_object_add(o, "pre_tokenizer", jnew_str(in->tok_pre));
	json_object_object_add(o, "chat_template", json_object_new_string(in->chat));
	json_object_object_add(o, "tensors", json_object_new_int64(in->n_tensors));
	for (int i = 0; i < in->n_types; i++) {
		struct json_object *t = json_object_new_object();
		json_object_object_add(t, "count", json_object_new_int64(in->types[i].count));
		json_object_object_add(t, "bytes", json_object_new_int64((int64_t)in->types[i].bytes));
		json_object_object_add(types, in->types[i].name, t);
	}
	json_object_object_add(o, "tensor_types", types);
	json_object_object_add(o, "parameters", json_object_new_int64((int64_t)in->n_params));
	json_object_object_add(o, "parameter_bytes", json_object_new_int64((int64_t)in->bytes));
	printf("%s\n", json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE));
	json_object_put(o);
	return 0;
}

/* 0 parsed, -1 help shown, CMD_USAGE. -m goes through the session flag parser, so it reads
 * exactly as in generate (-m X, --model X, --model=X); its other flags do not apply here. */
static int parse(int argc, char **argv, const char **model, bool *json)
{
	struct cmd_session_opts o;
	cmd_session_defaults(&o, "kvworker info");
	*json = false;
	/* Only -m and --json apply; the shared options are known, so that one of them is
	 * refused by name rather than as unknown. */
	static const struct option own[] = { { "json", no_argument, NULL, 'j' },
					     { "help", no_argument, NULL, 'h' } };
	struct option opts[128];
	cmd_options(opts, 128, own, 2, true);
	optind = 0;
	opterr = 0;
	int c, li = -1;
	while ((li = -1, c = getopt_long(argc, argv, ":h" CMD_SESSION_SHORT, opts, &li)) != -1) {
		if (c == 'j') {
			*json = true;
			continue;
		}
		if (c == 'h') {
			usage(stdout);
			return -1;
		}
		if (c == 'm') {
			o.model = optarg;
			continue;
		}
		if (c == '?' || c == ':')
			cmd_getopt_error(o.prog, c, argv);
		else
			fprintf(stderr, "kvworker info: option '%s%s' does not apply to info\n",
				li >= 0 ? "--" : "-", li >= 0 ? opts[li].name : (char[2]){ (char)c, 0 });
		usage(stderr);
		return CMD_USAGE;
	}
	if (optind < argc) {
		fprintf(stderr, "kvworker info: unexpected argument '%s'\n", argv[optind]);
		usage(stderr);
		return CMD_USAGE;
	}
	if (!o.model) {
		fprintf(stderr, "kvworker info: need -m MODEL\n");
		usage(stderr);
		return CMD_USAGE;
	}
	*model = o.model;
	return 0;
}

int cmd_info(int argc, char **argv)
{
	const char *path;
	bool json;
	int ret = parse(argc, argv, &path, &json);
	if (ret)
		return ret < 0 ? CMD_OK : ret;
	struct info in = { .path = path, .rope_style = "unknown", .chat = "none", .norm_eps = -1 };
	in.layers = in.heads = in.kv_heads = in.head_dim = in.dim = in.ffn = in.vocab = in.ctx =
		in.rope_dims = in.scaling_orig_ctx = UNKNOWN;
	char err[1024];
	struct stat st;
	if (stat(path, &st)) {
		fprintf(stderr, "kvworker info: %s: %s\n", path, strerror(errno));
		return CMD_FAIL;
	}
	ret = S_ISDIR(st.st_mode) ? info_hf(path, &in, err, sizeof err) : info_gguf(path, &in, err, sizeof err);
	if (ret) {
		fprintf(stderr, "kvworker info: cannot read %s: %s\n", path, err);
		return CMD_FAIL;
	}
	if (json ? print_json(&in) : (print_text(&in), 0)) {
		fprintf(stderr, "kvworker info: out of memory\n");
		return CMD_FAIL;
	}
	return CMD_OK;
}
