/* model — a loaded Llama-family model: its configuration and its weight tensors.
 *
 * model_load() opens a GGUF file or a Hugging Face folder (config.json + safetensors), maps the
 * tensor data read-only and fills a struct fkv_model whose tensors point into those mappings:
 * weights stay in their file dtype (f32, f16, bf16) or GGUF block-quantized format (Q8_0, Q4_0,
 * Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K; docs/quant.md) and are converted by the backend. The model
 * owns the mappings and every allocation; model_free() releases them all. Loaders never crash on
 * bad files: they return a negative errno and write a message naming the key or tensor to err.
 *
 * Tensor shapes follow the file's row-major convention as (rows, cols) with cols contiguous:
 * a linear layer y = W x with x of size in and y of size out is stored (out, in). (GGUF lists
 * dims innermost first; they are reversed into this convention.) Every shape is checked against
 * the config (errors name the tensor, expected and found shape), and every tensor in the file
 * must map to a slot: an unexpected tensor is an error, not silently ignored. Tensors whose data
 * the file leaves misaligned for their dtype (safetensors allows it) are copied into aligned
 * model-owned memory; all others point into the read-only mappings.
 *
 * Format specifics: GGUF "llama" weights use interleaved rope pairs, "qwen2" and every Hugging
 * Face folder use halves (cfg.rope_style says which); the two layouts differ by a permutation of
 * the q/k rows within each head (HF row j*d/2 + i is GGUF row 2i + j). The output head is tied
 * (output.data == tok_embd.data, cfg.tied_embeddings) when the file has none, when its bytes
 * equal the embedding's (GGUF converters may write it twice), or when config.json says so.
 * cfg.ctx_len is what the file says (stories260K's GGUF says 2048 though it was trained at 512).
 * A GGUF's llama3 rope scaling comes as the tensor rope_freqs.weight (per-pair frequency
 * divisors, no metadata keys): the loader derives the four rope_* scaling fields from it and
 * refuses a tensor they do not reproduce to 1e-4. The divisors fix only factor and the band
 * edges original_ctx/low and original_ctx/high, so the fields may differ from the Hugging Face
 * config's by a common scale of (original_ctx, low, high) — the same rotation either way (for
 * Llama 3.1's values, 8 / 1 / 4 / 8192, a check by hand got them back).
 * For a Hugging Face model path is the folder, where tokenizer.json lies. */
#ifndef FREEKV_MODEL_H
#define FREEKV_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dtype.h"
#include "quant.h"

#define FKV_MAX_LAYERS 256
#define FKV_FINGERPRINT_BYTES 32
#define FKV_MAX_EOS 8

/* How rotary embedding pairs dimensions within a head. */
enum fkv_rope_style {
	FKV_ROPE_INTERLEAVED = 0, /* pairs (2i, 2i+1): GGUF llama weights, Meta checkpoints */
	FKV_ROPE_HALVES = 1,	  /* pairs (i, i + d/2): Hugging Face Llama/Mistral/Qwen2 */
};

/* A quantized tensor (quant != FKV_QNONE) holds ggml blocks as the file has them, each row
 * quant_row_bytes(quant, cols) bytes (docs/quant.md); its dtype is FKV_F32, what the blocks
 * dequantize to. Only 2-D weights are ever quantized. */
struct fkv_tensor {
	const void *data;	 /* borrowed: points into the model's mapping (or arena) */
	enum fkv_dtype dtype;
	int n_dims;		 /* 1 or 2 */
	int64_t shape[2];	 /* (rows, cols); for 1-D tensors shape[0] = n, shape[1] = 1 */
	enum fkv_quant quant;	 /* FKV_QNONE: elements of dtype (last, so positional initialisers hold) */
};

struct fkv_model_config {
	char arch[32];		/* "llama", "mistral", "qwen2" */
	int n_layers;
	int dim;		/* hidden size */
	int n_heads;		/* query heads */
	int n_kv_heads;
	int head_dim;		/* given, or dim / n_heads */
	int ffn_dim;		/* intermediate size */
	int vocab_size;
	int ctx_len;		/* trained context (max_position_embeddings) */
	float norm_eps;
	float rope_theta;
	enum fkv_rope_style rope_style;
	/* Llama 3.1 "llama3" rope scaling; rope_scaling_factor == 0 means none. */
	float rope_scaling_factor;
	float rope_low_freq_factor;
	float rope_high_freq_factor;
	int rope_original_ctx;
	bool tied_embeddings;	/* output == tok_embd */
	bool qkv_bias;		/* Qwen2 */
	int bos_id;		/* -1 when the model has none */
	int eos_id;		/* the first end-of-sequence id; -1 when none */
	int n_eos;		/* all end-of-sequence ids (Llama 3.1 lists three) */
	int eos_ids[FKV_MAX_EOS];
	int sliding_window;	/* Mistral v0.1 sliding-window attention span; 0 = none */
	enum fkv_dtype dtype;	/* dtype of the large weights; also the KV dtype (f16 when the
				 * weights are quantized, as llama.cpp keeps its KV) */
};

struct fkv_layer_weights {
	struct fkv_tensor attn_norm; /* (dim) */
	struct fkv_tensor wq;	     /* (n_heads*head_dim, dim) */
	struct fkv_tensor wk;	     /* (n_kv_heads*head_dim, dim) */
	struct fkv_tensor wv;	     /* (n_kv_heads*head_dim, dim) */
	struct fkv_tensor wo;	     /* (dim, n_heads*head_dim) */
	struct fkv_tensor bq, bk, bv; /* biases, data == NULL when absent */
	struct fkv_tensor ffn_norm;  /* (dim) */
	struct fkv_tensor w_gate;    /* (ffn_dim, dim) */
	struct fkv_tensor w_up;	     /* (ffn_dim, dim) */
	struct fkv_tensor w_down;    /* (dim, ffn_dim) */
};

struct fkv_model {
	struct fkv_model_config cfg;
	struct fkv_tensor tok_embd;   /* (vocab, dim) */
	struct fkv_tensor out_norm;   /* (dim) */
	struct fkv_tensor output;     /* (vocab, dim); same data as tok_embd when tied */
	struct fkv_layer_weights *layers; /* cfg.n_layers entries, owned */
	/* Identifies the model to kvstored so a sequence is only resumed by the same model.
	 * SHA-256 over: a version tag; every config field as text (floats as their IEEE bit
	 * patterns, so no locale or rounding enters); then for each tensor in a fixed order
	 * (tok_embd, out_norm, output, then per layer attn_norm wq wk wv wo bq bk bv ffn_norm
	 * w_gate w_up w_down) a line with its name, dtype, shape and byte size followed by its
	 * bytes — all of them up to 12 KiB, else the first, middle and last 4 KiB. Stable across
	 * runs and machines; any change to config, dtype, shape or sampled bytes changes it. It
	 * names the model, not the container: a GGUF and an HF folder with equal config (rope
	 * layout included) and weights share it; stories260K's two forms differ (rope layout). */
	uint8_t fingerprint[FKV_FINGERPRINT_BYTES];
	char path[4096];	      /* what was loaded */
	bool is_gguf;
	void *priv;		      /* loader-private: mappings, metadata, tokenizer data */
};

/* Loads a .gguf file or a Hugging Face folder. Returns 0 or a negative errno with a message in
 * err (which names the offending key or tensor). On failure m holds nothing to free. */
int model_load(const char *path, struct fkv_model *m, char *err, size_t errlen);
/* Releases everything model_load() allocated or mapped. Safe on a zeroed struct. */
void model_free(struct fkv_model *m);
/* Drops this process's resident pages of the model's file mappings, for a caller that holds
 * its own copy of the weights it reads (a backend's): the tensors' data is unchanged and reads
 * as before, from the page cache, when touched again. Model-owned copies are not touched. */
void model_drop_pages(const struct fkv_model *m);

/* Bytes of t's data (blocks for a quantized tensor); 0 when t is absent. */
size_t model_tensor_bytes(const struct fkv_tensor *t);

/* Writes the fingerprint as 64 lowercase hex digits and a NUL. */
void model_fingerprint_hex(const struct fkv_model *m, char out[2 * FKV_FINGERPRINT_BYTES + 1]);

/* Checks the relations every consumer relies on: positive sizes, n_heads a multiple of
 * n_kv_heads, even head_dim, n_layers <= FKV_MAX_LAYERS, eps and theta > 0. 0 or -EINVAL. */
int model_config_validate(const struct fkv_model_config *cfg, char *err, size_t errlen);

struct gguf_ctx;
/* The parsed GGUF file behind a model loaded from .gguf (metadata for the tokenizer), or NULL
 * for a Hugging Face model (whose tokenizer.json lies in the folder m->path). Borrowed: valid
 * until model_free(). */
const struct gguf_ctx *model_gguf(const struct fkv_model *m);

#endif
