/* model — a loaded Llama-family model: its configuration and its weight tensors.
 *
 * model_load() opens a GGUF file or a Hugging Face folder (config.json + safetensors), maps the
 * tensor data read-only and fills a struct fkv_model whose tensors point into those mappings:
 * weights stay in their file dtype (f32, f16, bf16) and are converted by the backend. The model
 * owns the mappings and every allocation; model_free() releases them all. Loaders never crash on
 * bad files: they return a negative errno and write a message naming the key or tensor to err.
 *
 * Tensor shapes follow the file's row-major convention as (rows, cols) with cols contiguous:
 * a linear layer y = W x with x of size in and y of size out is stored (out, in). */
#ifndef FREEKV_MODEL_H
#define FREEKV_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dtype.h"

#define FKV_MAX_LAYERS 256
#define FKV_FINGERPRINT_BYTES 32

/* How rotary embedding pairs dimensions within a head. */
enum fkv_rope_style {
	FKV_ROPE_INTERLEAVED = 0, /* pairs (2i, 2i+1): GGUF llama weights, Meta checkpoints */
	FKV_ROPE_HALVES = 1,	  /* pairs (i, i + d/2): Hugging Face Llama/Mistral/Qwen2 */
};

struct fkv_tensor {
	const void *data;	 /* borrowed: points into the model's mapping (or arena) */
	enum fkv_dtype dtype;
	int n_dims;		 /* 1 or 2 */
	int64_t shape[2];	 /* (rows, cols); for 1-D tensors shape[0] = n, shape[1] = 1 */
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
	int eos_id;
	enum fkv_dtype dtype;	/* dtype of the large weights; also the KV dtype */
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
	/* Stable hash of the config and the tensor table (names, dtypes, shapes, data); identifies
	 * the model to kvstored so a sequence is only resumed by the same model. */
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

#endif
