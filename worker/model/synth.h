/* synth — writes random-weight Hugging Face model folders with real models' geometry.
 *
 * synth_write() produces config.json, the weights (model.safetensors, or shards of at most
 * SYNTH_SHARD_BYTES plus model.safetensors.index.json), tokenizer.json and tokenizer_config.json
 * in outdir (created when missing; existing files of those names are replaced). The result loads
 * with model_load() and tokenizes with a tokenizer.json byte-level BPE loader: 256 byte tokens in
 * GPT-2 byte-to-unicode form, a fixed list of English merges, the preset's BOS/EOS as special
 * added tokens, and "<|pad_N|>" entries padding the vocabulary to its size (reachable by no
 * merge). The pre-tokenizer is the preset family's regex (Llama 3 or Qwen2) followed by
 * ByteLevel; the decoder is ByteLevel.
 *
 * Weights come from a counter-based generator keyed by (seed, tensor name, element index):
 * uniform with standard deviation 0.02 for matrices and biases, 1 + uniform(+-0.05) for RMSNorm
 * weights, so activations stay finite at any depth. synth_values() reproduces them, which is how
 * tests check that what loads is what was written. Tensors are generated (OpenMP threads; the
 * bytes do not depend on the thread count) and written in chunks of 4 Mi elements: memory use
 * is about 32 MiB whatever the model size.
 *
 * Nothing is kept between calls; all functions are thread-compatible. */
#ifndef FREEKV_SYNTH_H
#define FREEKV_SYNTH_H

#include <stddef.h>
#include <stdint.h>

#include "dtype.h"

/* Shard size limit for the weights (the largest single tensor may exceed it on its own). */
#define SYNTH_SHARD_BYTES (4ull << 30)

int synth_n_presets(void);
/* Name of preset i (0..synth_n_presets()-1), or NULL. */
const char *synth_preset_name(int i);
/* One line describing preset i ("llama-3.1-8b: Llama 3.1 8B, 32 layers, ..."), or NULL. */
const char *synth_preset_desc(int i);

/* Writes the preset's model to outdir. n_layers_override / vocab_override replace the preset's
 * values when > 0 (vocab_override must leave room for the byte tokens, merges and specials:
 * at least synth_min_vocab()). Returns 0 or a negative errno with a message in err. */
int synth_write(const char *preset, int n_layers_override, enum fkv_dtype dtype, const char *outdir,
		uint64_t seed, int vocab_override, char *err, size_t errlen);
/* As synth_write, with an explicit shard size limit in bytes (tests use a small one). */
int synth_write_sharded(const char *preset, int n_layers_override, enum fkv_dtype dtype,
			const char *outdir, uint64_t seed, int vocab_override, uint64_t shard_bytes,
			char *err, size_t errlen);
int synth_min_vocab(void);

/* The f32 values of elements [first, first + n) of the tensor named hf_name (Hugging Face name)
 * written with seed, before conversion to the file dtype. */
void synth_values(uint64_t seed, const char *hf_name, uint64_t first, size_t n, float *out);

#endif
