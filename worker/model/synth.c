/* synth — random-weight Hugging Face folders. See synth.h.
 *
 * Order of work: resolve the preset (overrides applied), lay out the tensor table, assign
 * tensors to shards greedily in table order, then write each shard (header, then each tensor
 * generated chunk by chunk), the index, config.json and the tokenizer files. */
#include "synth.h"

#include "errmsg.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define SYNTH_CHUNK (1u << 22) /* elements generated per write */
#define SYNTH_SLICE (1u << 16) /* elements per parallel work item */
#define SYNTH_STD 0.02f
#define SYNTH_NORM_JITTER 0.05f

enum synth_regex { RX_LLAMA3, RX_QWEN2 };

struct synth_preset {
	const char *name;
	const char *desc;
	const char *hf_arch;
	const char *model_type;
	int n_layers, dim, n_heads, n_kv_heads, head_dim, ffn_dim, vocab, ctx;
	float eps, theta;
	float rs_factor, rs_low, rs_high; /* llama3 rope scaling; factor 0 = none */
	int rs_orig_ctx;
	bool tied, qkv_bias;
	enum synth_regex regex;
	int bos;		/* -1: none in config */
	const char *bos_text;
	int n_eos;
	int eos[3];
	const char *eos_text[3];
	bool add_bos;
};

static const struct synth_preset presets[] = {
	{ "llama-3.1-8b", "Llama 3.1 8B: 32 layers, dim 4096, GQA 32/8, d 128, ffn 14336, vocab 128256, llama3 rope scaling",
	  "LlamaForCausalLM", "llama", 32, 4096, 32, 8, 128, 14336, 128256, 131072, 1e-5f, 500000.0f,
	  8.0f, 1.0f, 4.0f, 8192, false, false, RX_LLAMA3, 128000, "<|begin_of_text|>", 3,
	  { 128001, 128008, 128009 }, { "<|end_of_text|>", "<|eom_id|>", "<|eot_id|>" }, true },
	{ "qwen2.5-7b", "Qwen2.5 7B: 28 layers, dim 3584, GQA 28/4, d 128, ffn 18944, vocab 152064, q/k/v biases",
	  "Qwen2ForCausalLM", "qwen2", 28, 3584, 28, 4, 128, 18944, 152064, 32768, 1e-6f, 1000000.0f,
	  0, 0, 0, 0, false, true, RX_QWEN2, 151643, "<|endoftext|>", 1, { 151645 }, { "<|im_end|>" }, false },
	{ "mistral-7b", "Mistral 7B v0.3: 32 layers, dim 4096, GQA 32/8, d 128, ffn 14336, vocab 32768",
	  "MistralForCausalLM", "mistral", 32, 4096, 32, 8, 128, 14336, 32768, 32768, 1e-5f, 1000000.0f,
	  0, 0, 0, 0, false, false, RX_LLAMA3, 1, "<s>", 1, { 2 }, { "</s>" }, true },
	{ "tiny", "tiny Llama for tests: 2 layers, dim 64, GQA 4/2, d 16, ffn 128, vocab 512",
	  "LlamaForCausalLM", "llama", 2, 64, 4, 2, 16, 128, 512, 256, 1e-5f, 10000.0f,
	  0, 0, 0, 0, false, false, RX_LLAMA3, 510, "<|begin_of_text|>", 1, { 511 }, { "<|end_of_text|>" }, true },
	{ "tiny-qwen2", "tiny Qwen2 for tests: 2 layers, dim 64, GQA 4/2, d 16, ffn 96, vocab 400, biases, tied",
	  "Qwen2ForCausalLM", "qwen2", 2, 64, 4, 2, 16, 96, 400, 256, 1e-6f, 1000000.0f,
	  0, 0, 0, 0, true, true, RX_QWEN2, 398, "<|endoftext|>", 1, { 399 }, { "<|im_end|>" }, false },
};
#define N_PRESETS ((int)(sizeof presets / sizeof presets[0]))

/* Pre-tokenizer regexes as the Llama 3 and Qwen2 tokenizer.json files give them. */
static const char *const regexes[] = {
	[RX_LLAMA3] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
	[RX_QWEN2] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
};

/* BPE merges in rank order, in byte-level form ("Ġ" is the space byte). Each right-hand side
 * and left-hand side is a byte token or the result of an earlier merge. */
static const char *const merges[][2] = {
	{ "Ġ", "t" },  { "h", "e" },   { "i", "n" },   { "Ġ", "a" },  { "e", "r" },	 { "o", "n" },
	{ "Ġt", "he" }, { "r", "e" },  { "a", "n" },   { "a", "t" },  { "e", "n" },	 { "o", "r" },
	{ "Ġ", "s" },  { "Ġ", "w" },   { "e", "s" },   { "Ġ", "o" },  { "i", "s" },	 { "Ġ", "c" },
	{ "i", "t" },  { "Ġ", "b" },   { "n", "d" },   { "Ġ", "f" },  { "Ġ", "m" },	 { "o", "u" },
	{ "e", "d" },  { "Ġ", "p" },   { "in", "g" },  { "Ġ", "d" },  { "a", "r" },	 { "l", "l" },
	{ "Ġ", "h" },  { "Ġa", "nd" }, { "Ġ", "i" },   { "Ġo", "f" }, { "Ġt", "o" },	 { "Ġ", "in" },
	{ "Ġ", "is" }, { "Ġ", "T" },   { "Ġ", "S" },   { "Ġ", "l" },  { "Ġ", "n" },	 { "Ġ", "e" },
	{ "Ġ", "g" },  { "Ġ", "y" },   { "Ġ", "I" },   { "Ġ", "A" },  { "l", "e" },	 { "o", "m" },
	{ "a", "s" },  { "Ġw", "as" },  { "Ġ", "on" },  { "Ġ", "it" }, { "t", "h" },	 { "Ġ", "u" },
	{ "Ġ", "th" }, { "Ġ", "re" },  { "Ġ", "an" }, { ".", "Ċ" },  { "Ċ", "Ċ" },	 { "Ġ", "Ġ" },
};
#define N_MERGES ((int)(sizeof merges / sizeof merges[0]))

int synth_n_presets(void) { return N_PRESETS; }
const char *synth_preset_name(int i) { return i >= 0 && i < N_PRESETS ? presets[i].name : NULL; }
const char *synth_preset_desc(int i) { return i >= 0 && i < N_PRESETS ? presets[i].desc : NULL; }
int synth_min_vocab(void) { return 256 + N_MERGES + 4; }

/* ---- the generator ---- */

static uint64_t splitmix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static bool ends_with(const char *s, const char *sfx)
{
	size_t a = strlen(s), b = strlen(sfx);
	return a >= b && !strcmp(s + a - b, sfx);
}

void synth_values(uint64_t seed, const char *hf_name, uint64_t first, size_t n, float *out)
{
	uint64_t key = 0xcbf29ce484222325ull; /* FNV-1a of the name, mixed with the seed */
	for (const char *p = hf_name; *p; p++)
		key = (key ^ (uint8_t)*p) * 0x100000001b3ull;
	key = splitmix64(key ^ splitmix64(seed));
	bool norm = ends_with(hf_name, "norm.weight");
	/* uniform on [-a, a) has standard deviation a / sqrt(3) */
	float a = norm ? SYNTH_NORM_JITTER : SYNTH_STD * 1.7320508f;
	float base = norm ? 1.0f : 0.0f;
	for (size_t i = 0; i < n; i++) {
		uint64_t r = splitmix64(key + (first + i) * 0xd1b54a32d192ed03ull);
		float u = (float)((double)(r >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
		out[i] = base + a * u;
	}
}

/* ---- layout ---- */

struct synth_tensor {
	char name[96];
	int n_dims;
	int64_t shape[2];
	uint64_t nel;
	int shard;
	uint64_t begin; /* offset in its shard's data */
};

struct synth_job {
	struct synth_preset p;
	enum fkv_dtype dtype;
	uint64_t seed;
	struct synth_tensor *t;
	int n;
	int n_shards;
};

static void add_tensor(struct synth_job *j, const char *name, int64_t rows, int64_t cols)
{
	struct synth_tensor *t = &j->t[j->n++];
	snprintf(t->name, sizeof t->name, "%s", name);
	t->n_dims = cols ? 2 : 1;
	t->shape[0] = rows;
	t->shape[1] = cols;
	t->nel = (uint64_t)rows * (uint64_t)(cols ? cols : 1);
}

static int layout(struct synth_job *j, uint64_t shard_bytes)
{
	const struct synth_preset *p = &j->p;
	int64_t q = (int64_t)p->n_heads * p->head_dim, kv = (int64_t)p->n_kv_heads * p->head_dim;
	j->t = calloc((size_t)(3 + 12 * p->n_layers), sizeof *j->t);
	if (!j->t)
		return -ENOMEM;
	char nm[96];
	add_tensor(j, "model.embed_tokens.weight", p->vocab, p->dim);
	for (int l = 0; l < p->n_layers; l++) {
		static const struct {
			const char *suffix;
			int rows, cols; /* 0 dim, 1 q, 2 kv, 3 ffn; cols -1 = 1-D */
			bool bias;
		} lt[] = {
			{ "input_layernorm.weight", 0, -1, false },  { "self_attn.q_proj.weight", 1, 0, false },
			{ "self_attn.k_proj.weight", 2, 0, false },  { "self_attn.v_proj.weight", 2, 0, false },
			{ "self_attn.q_proj.bias", 1, -1, true },    { "self_attn.k_proj.bias", 2, -1, true },
			{ "self_attn.v_proj.bias", 2, -1, true },    { "self_attn.o_proj.weight", 0, 1, false },
			{ "post_attention_layernorm.weight", 0, -1, false }, { "mlp.gate_proj.weight", 3, 0, false },
			{ "mlp.up_proj.weight", 3, 0, false },	     { "mlp.down_proj.weight", 0, 3, false },
		};
		const int64_t sz[4] = { p->dim, q, kv, p->ffn_dim };
		for (size_t i = 0; i < sizeof lt / sizeof lt[0]; i++) {
			if (lt[i].bias && !p->qkv_bias)
				continue;
			snprintf(nm, sizeof nm, "model.layers.%d.%s", l, lt[i].suffix);
			add_tensor(j, nm, sz[lt[i].rows], lt[i].cols < 0 ? 0 : sz[lt[i].cols]);
		}
	}
	add_tensor(j, "model.norm.weight", p->dim, 0);
	if (!p->tied)
		add_tensor(j, "lm_head.weight", p->vocab, p->dim);
	uint64_t used = 0;
	int shard = 0;
	size_t es = dtype_size(j->dtype);
	for (int i = 0; i < j->n; i++) {
		uint64_t bytes = j->t[i].nel * es;
		if (used && used + bytes > shard_bytes) {
			shard++;
			used = 0;
		}
		j->t[i].shard = shard;
		j->t[i].begin = used;
		used += bytes;
	}
	j->n_shards = shard + 1;
	return 0;
}

/* ---- writing ---- */

static void shard_name(const struct synth_job *j, int s, char *buf, size_t len)
{
	if (j->n_shards == 1)
		snprintf(buf, len, "model.safetensors");
	else
		snprintf(buf, len, "model-%05d-of-%05d.safetensors", s + 1, j->n_shards);
}

static FILE *open_out(const char *dir, const char *name, char *err, size_t errlen, int *ret)
{
	char path[4096];
	if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, name) >= sizeof path) {
		*ret = errmsg(err, errlen, -ENAMETOOLONG, "synth: path too long");
		return NULL;
	}
	FILE *f = fopen(path, "wb");
	if (!f)
		*ret = errmsg(err, errlen, -errno, "synth: cannot create %s: %s", path, strerror(errno));
	return f;
}

static int close_out(FILE *f, const char *name, char *err, size_t errlen)
{
	int bad = ferror(f);
	if (fclose(f) || bad)
		return errmsg(err, errlen, -EIO, "synth: error writing %s: %s", name, strerror(errno));
	return 0;
}

static int write_shard(const struct synth_job *j, int s, const char *dir, float *fbuf, void *obuf,
		       char *err, size_t errlen)
{
	static const char *const st_dtype[] = { [FKV_F32] = "F32", [FKV_F16] = "F16", [FKV_BF16] = "BF16" };
	char name[64];
	shard_name(j, s, name, sizeof name);
	/* header: JSON, padded with spaces so the data starts 8-byte aligned */
	size_t cap = 256 + (size_t)j->n * 200, len = 0;
	char *h = malloc(cap);
	if (!h)
		return errmsg(err, errlen, -ENOMEM, "synth: out of memory");
	len += (size_t)snprintf(h + len, cap - len, "{\"__metadata__\":{\"format\":\"pt\"}");
	for (int i = 0; i < j->n; i++) {
		const struct synth_tensor *t = &j->t[i];
		if (t->shard != s)
			continue;
		uint64_t bytes = t->nel * dtype_size(j->dtype);
		len += (size_t)snprintf(h + len, cap - len, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%" PRId64, t->name,
					st_dtype[j->dtype], t->shape[0]);
		if (t->n_dims == 2)
			len += (size_t)snprintf(h + len, cap - len, ",%" PRId64, t->shape[1]);
		len += (size_t)snprintf(h + len, cap - len, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}",
					t->begin, t->begin + bytes);
	}
	len += (size_t)snprintf(h + len, cap - len, "}");
	assert(len + 8 < cap);
	while (len % 8)
		h[len++] = ' ';
	int ret = 0;
	FILE *f = open_out(dir, name, err, errlen, &ret);
	if (!f) {
		free(h);
		return ret;
	}
	uint64_t hl = len;
	fwrite(&hl, 8, 1, f);
	fwrite(h, 1, len, f);
	free(h);
	for (int i = 0; i < j->n && !ferror(f); i++) {
		const struct synth_tensor *t = &j->t[i];
		if (t->shard != s)
			continue;
		for (uint64_t done = 0; done < t->nel && !ferror(f);) {
			size_t n = t->nel - done < SYNTH_CHUNK ? (size_t)(t->nel - done) : SYNTH_CHUNK;
			size_t es = dtype_size(j->dtype);
			/* the generator is counter-based: slices are independent, any thread count
			 * gives the same bytes */
#pragma omp parallel for schedule(static)
			for (size_t b = 0; b < n; b += SYNTH_SLICE) {
				size_t m = n - b < SYNTH_SLICE ? n - b : SYNTH_SLICE;
				synth_values(j->seed, t->name, done + b, m, fbuf + b);
				dtype_from_f32((uint8_t *)obuf + b * es, fbuf + b, j->dtype, m);
			}
			fwrite(obuf, es, n, f);
			done += n;
		}
	}
	return close_out(f, name, err, errlen);
}

static int write_index(const struct synth_job *j, const char *dir, char *err, size_t errlen)
{
	int ret = 0;
	FILE *f = open_out(dir, "model.safetensors.index.json", err, errlen, &ret);
	if (!f)
		return ret;
	uint64_t total = 0;
	for (int i = 0; i < j->n; i++)
		total += j->t[i].nel * dtype_size(j->dtype);
	fprintf(f, "{\n  \"metadata\": {\"total_size\": %" PRIu64 "},\n  \"weight_map\": {", total);
	for (int i = 0; i < j->n; i++) {
		char name[64];
		shard_name(j, j->t[i].shard, name, sizeof name);
		fprintf(f, "%s\n    \"%s\": \"%s\"", i ? "," : "", j->t[i].name, name);
	}
	fprintf(f, "\n  }\n}\n");
	return close_out(f, "model.safetensors.index.json", err, errlen);
}

static int write_config(const struct synth_job *j, const char *dir, char *err, size_t errlen)
{
	static const char *const torch[] = { [FKV_F32] = "float32", [FKV_F16] = "float16", [FKV_BF16] = "bfloat16" };
	const struct synth_preset *p = &j->p;
	int ret = 0;
	FILE *f = open_out(dir, "config.json", err, errlen, &ret);
	if (!f)
		return ret;
	fprintf(f,
		"{\n  \"architectures\": [\"%s\"],\n  \"model_type\": \"%s\",\n  \"hidden_size\": %d,\n"
		"  \"intermediate_size\": %d,\n  \"num_hidden_layers\": %d,\n  \"num_attention_heads\": %d,\n"
		"  \"num_key_value_heads\": %d,\n  \"head_dim\": %d,\n  \"vocab_size\": %d,\n"
		"  \"max_position_embeddings\": %d,\n  \"rms_norm_eps\": %g,\n  \"rope_theta\": %.1f,\n"
		"  \"hidden_act\": \"silu\",\n  \"tie_word_embeddings\": %s,\n  \"torch_dtype\": \"%s\",\n",
		p->hf_arch, p->model_type, p->dim, p->ffn_dim, p->n_layers, p->n_heads, p->n_kv_heads, p->head_dim,
		p->vocab, p->ctx, (double)p->eps, (double)p->theta, p->tied ? "true" : "false", torch[j->dtype]);
	if (p->rs_factor > 0)
		fprintf(f,
			"  \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": %.1f, \"low_freq_factor\": %.1f, "
			"\"high_freq_factor\": %.1f, \"original_max_position_embeddings\": %d},\n",
			(double)p->rs_factor, (double)p->rs_low, (double)p->rs_high, p->rs_orig_ctx);
	else
		fprintf(f, "  \"rope_scaling\": null,\n");
	fprintf(f, "  \"bos_token_id\": %d,\n  \"eos_token_id\": ", p->bos);
	if (p->n_eos == 1) {
		fprintf(f, "%d\n}\n", p->eos[0]);
	} else {
		for (int i = 0; i < p->n_eos; i++)
			fprintf(f, "%s%d", i ? ", " : "[", p->eos[i]);
		fprintf(f, "]\n}\n");
	}
	return close_out(f, "config.json", err, errlen);
}

/* GPT-2's byte-to-unicode map: printable bytes stand for themselves, the rest map to U+0100+. */
static void byte_token(int b, char out[4])
{
	int cp;
	if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) {
		cp = b;
	} else {
		int n = 0;
		for (int x = 0; x < b; x++) {
			if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255)))
				n++;
		}
		cp = 256 + n;
	}
	if (cp < 0x80) {
		out[0] = (char)cp;
		out[1] = 0;
	} else {
		out[0] = (char)(0xc0 | (cp >> 6));
		out[1] = (char)(0x80 | (cp & 0x3f));
		out[2] = 0;
	}
}

static void json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		if (c == '"' || c == '\\')
			fprintf(f, "\\%c", c);
		else if (c < 0x20)
			fprintf(f, "\\u%04x", c);
		else
			fputc(c, f);
	}
	fputc('"', f);
}

/* The special tokens' ids: the preset's when they lie past the BPE tokens and inside the
 * vocabulary, else the last ids of the vocabulary (BOS, then the EOS ids in order). */
static void special_ids(const struct synth_preset *p, int *bos, int *eos, int *n_eos)
{
	int lo = 256 + N_MERGES;
	bool fit = p->bos >= lo && p->bos < p->vocab;
	for (int i = 0; i < p->n_eos; i++)
		fit = fit && p->eos[i] >= lo && p->eos[i] < p->vocab;
	if (fit) {
		*bos = p->bos;
		*n_eos = p->n_eos;
		memcpy(eos, p->eos, sizeof p->eos);
	} else {
		*n_eos = p->n_eos;
		*bos = p->vocab - 1 - p->n_eos;
		for (int i = 0; i < p->n_eos; i++)
			eos[i] = p->vocab - p->n_eos + i;
	}
}

static int write_tokenizer(const struct synth_job *j, const char *dir, char *err, size_t errlen)
{
	const struct synth_preset *p = &j->p;
	int ret = 0;
	FILE *f = open_out(dir, "tokenizer.json", err, errlen, &ret);
	if (!f)
		return ret;
	int bos = p->bos, n_eos = p->n_eos, eos[3] = { p->eos[0], p->eos[1], p->eos[2] };
	fprintf(f, "{\n\"version\": \"1.0\",\n\"truncation\": null,\n\"padding\": null,\n\"added_tokens\": [");
	const int ids[4] = { bos, eos[0], eos[1], eos[2] };
	const char *texts[4] = { p->bos_text, p->eos_text[0], p->eos_text[1], p->eos_text[2] };
	for (int i = 0; i < 1 + n_eos; i++) {
		fprintf(f, "%s\n {\"id\": %d, \"content\": ", i ? "," : "", ids[i]);
		json_str(f, texts[i]);
		fprintf(f, ", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, \"normalized\": false, "
			   "\"special\": true}");
	}
	fprintf(f, "\n],\n\"normalizer\": null,\n\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [\n"
		   " {\"type\": \"Split\", \"pattern\": {\"Regex\": ");
	json_str(f, regexes[p->regex]);
	fprintf(f, "}, \"behavior\": \"Isolated\", \"invert\": false},\n"
		   " {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true, \"use_regex\": false}]},\n");
	if (p->add_bos) {
		fprintf(f, "\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": ");
		json_str(f, p->bos_text);
		fprintf(f, ", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], \"pair\": [{\"Sequence\": "
			   "{\"id\": \"A\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"B\", \"type_id\": 1}}], "
			   "\"special_tokens\": {");
		json_str(f, p->bos_text);
		fprintf(f, ": {\"id\": ");
		json_str(f, p->bos_text);
		fprintf(f, ", \"ids\": [%d], \"tokens\": [", bos);
		json_str(f, p->bos_text);
		fprintf(f, "]}}},\n");
	} else {
		fprintf(f, "\"post_processor\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": false, "
			   "\"use_regex\": false},\n");
	}
	fprintf(f, "\"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": true, "
		   "\"use_regex\": true},\n\"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": null, "
		   "\"continuing_subword_prefix\": null, \"end_of_word_suffix\": null, \"fuse_unk\": false, "
		   "\"byte_fallback\": false, \"ignore_merges\": false,\n\"vocab\": {");
	char tok[64];
	int id = 0;
	for (int b = 0; b < 256; b++, id++) {
		byte_token(b, tok);
		fprintf(f, "%s\n", id ? "," : "");
		json_str(f, tok);
		fprintf(f, ": %d", id);
	}
	for (int m = 0; m < N_MERGES; m++, id++) {
		snprintf(tok, sizeof tok, "%s%s", merges[m][0], merges[m][1]);
		fprintf(f, ",\n");
		json_str(f, tok);
		fprintf(f, ": %d", id);
	}
	for (; id < p->vocab; id++) {
		bool special = id == bos;
		for (int e = 0; e < n_eos; e++)
			special = special || id == eos[e];
		fprintf(f, ",\n");
		if (special) {
			for (int k = 0; k < 1 + n_eos; k++) {
				if (ids[k] == id)
					json_str(f, texts[k]);
			}
		} else {
			snprintf(tok, sizeof tok, "<|pad_%d|>", id);
			json_str(f, tok);
		}
		fprintf(f, ": %d", id);
	}
	fprintf(f, "\n},\n\"merges\": [");
	for (int m = 0; m < N_MERGES; m++) {
		snprintf(tok, sizeof tok, "%s %s", merges[m][0], merges[m][1]);
		fprintf(f, "%s\n", m ? "," : "");
		json_str(f, tok);
	}
	fprintf(f, "\n]}\n}\n");
	if ((ret = close_out(f, "tokenizer.json", err, errlen)))
		return ret;
	if (!(f = open_out(dir, "tokenizer_config.json", err, errlen, &ret)))
		return ret;
	fprintf(f, "{\n  \"add_bos_token\": %s,\n  \"add_eos_token\": false,\n  \"bos_token\": ",
		p->add_bos ? "true" : "false");
	json_str(f, p->bos_text);
	fprintf(f, ",\n  \"eos_token\": ");
	json_str(f, p->eos_text[0]);
	fprintf(f, ",\n  \"model_max_length\": %d,\n  \"clean_up_tokenization_spaces\": false,\n"
		   "  \"tokenizer_class\": \"PreTrainedTokenizerFast\"\n}\n", p->ctx);
	return close_out(f, "tokenizer_config.json", err, errlen);
}

/* The merge table must build each token from existing ones, and never the same token twice. */
static bool merges_consistent(void)
{
	char have[N_MERGES][64];
	for (int m = 0; m < N_MERGES; m++) {
		for (int side = 0; side < 2; side++) {
			const char *s = merges[m][side];
			bool ok = false;
			for (int b = 0; b < 256 && !ok; b++) {
				char t[4];
				byte_token(b, t);
				ok = !strcmp(t, s);
			}
			for (int k = 0; k < m && !ok; k++)
				ok = !strcmp(have[k], s);
			if (!ok)
				return false;
		}
		snprintf(have[m], sizeof have[m], "%s%s", merges[m][0], merges[m][1]);
		for (int k = 0; k < m; k++) {
			if (!strcmp(have[k], have[m]))
				return false;
		}
	}
	return true;
}

int synth_write_sharded(const char *preset, int n_layers_override, enum fkv_dtype dtype,
			const char *outdir, uint64_t seed, int vocab_override, uint64_t shard_bytes,
			char *err, size_t errlen)
{
	if (!merges_consistent())
		return errmsg(err, errlen, -EINVAL, "synth: internal merge table is inconsistent");
	const struct synth_preset *src = NULL;
	for (int i = 0; i < N_PRESETS; i++) {
		if (!strcmp(presets[i].name, preset))
			src = &presets[i];
	}
	if (!src) {
		char list[256] = "";
		for (int i = 0; i < N_PRESETS; i++)
			snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", presets[i].name);
		return errmsg(err, errlen, -EINVAL, "synth: unknown preset '%s' (known: %s)", preset, list);
	}
	if ((unsigned)dtype > FKV_BF16)
		return errmsg(err, errlen, -EINVAL, "synth: bad dtype");
	if (n_layers_override < 0 || n_layers_override > 256 || vocab_override < 0)
		return errmsg(err, errlen, -EINVAL, "synth: layers must be 1..256 and vocab positive");
	if (vocab_override && vocab_override < synth_min_vocab())
		return errmsg(err, errlen, -EINVAL, "synth: vocab %d is too small (at least %d: bytes, merges, specials)",
			    vocab_override, synth_min_vocab());
	if (shard_bytes == 0)
		return errmsg(err, errlen, -EINVAL, "synth: shard size must be positive");
	struct synth_job j = { .p = *src, .dtype = dtype, .seed = seed };
	if (n_layers_override)
		j.p.n_layers = n_layers_override;
	if (vocab_override)
		j.p.vocab = vocab_override;
	int bos, eos[3] = { 0 }, n_eos;
	special_ids(&j.p, &bos, eos, &n_eos);
	j.p.bos = bos;
	j.p.n_eos = n_eos;
	memcpy(j.p.eos, eos, sizeof eos);
	if (mkdir(outdir, 0755) < 0 && errno != EEXIST)
		return errmsg(err, errlen, -errno, "synth: cannot create %s: %s", outdir, strerror(errno));
	if (layout(&j, shard_bytes))
		return errmsg(err, errlen, -ENOMEM, "synth: out of memory");
	float *fbuf = malloc(SYNTH_CHUNK * sizeof *fbuf);
	void *obuf = malloc(SYNTH_CHUNK * sizeof(float));
	int ret = (!fbuf || !obuf) ? errmsg(err, errlen, -ENOMEM, "synth: out of memory") : 0;
	for (int s = 0; s < j.n_shards && !ret; s++)
		ret = write_shard(&j, s, outdir, fbuf, obuf, err, errlen);
	if (!ret && j.n_shards > 1)
		ret = write_index(&j, outdir, err, errlen);
	if (!ret)
		ret = write_config(&j, outdir, err, errlen);
	if (!ret)
		ret = write_tokenizer(&j, outdir, err, errlen);
	free(fbuf);
	free(obuf);
	free(j.t);
	return ret;
}

int synth_write(const char *preset, int n_layers_override, enum fkv_dtype dtype, const char *outdir,
		uint64_t seed, int vocab_override, char *err, size_t errlen)
{
	return synth_write_sharded(preset, n_layers_override, dtype, outdir, seed, vocab_override,
				   SYNTH_SHARD_BYTES, err, errlen);
}
