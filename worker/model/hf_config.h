/* hf_config — a Hugging Face config.json read into struct fkv_model_config.
 *
 * Architectures LlamaForCausalLM, MistralForCausalLM and Qwen2ForCausalLM (from "architectures",
 * else "model_type"). Required keys: hidden_size, intermediate_size, num_hidden_layers,
 * num_attention_heads, vocab_size, rms_norm_eps, max_position_embeddings; a missing or mistyped
 * one is -EINVAL naming the key. Defaults as the transformers config classes have them:
 * num_key_value_heads = num_attention_heads, head_dim = hidden_size / num_attention_heads,
 * rope_theta = 10000, tie_word_embeddings = false, no rope scaling, no bos/eos (-1).
 * rope_scaling: "llama3" (factor, low_freq_factor, high_freq_factor,
 * original_max_position_embeddings, all required) or "default"/null; any other type is -EPROTO.
 * eos_token_id may be a list (all kept, the first is eos_id). Qwen2 (and Llama with
 * attention_bias) sets qkv_bias. sliding_window is kept only when in use (use_sliding_window, which
 * Qwen2 defaults to false). torch_dtype sets cfg->dtype (f32 when absent); the model loader
 * replaces it with the weights' actual dtype. rope_style is FKV_ROPE_HALVES (the HF layout).
 *
 * Pure parsing: nothing is kept; cfg is fully written on success and untouched on failure. */
#ifndef FREEKV_HF_CONFIG_H
#define FREEKV_HF_CONFIG_H

#include <stddef.h>

#include "model.h"

/* Parses len bytes of config.json text. */
int hf_config_parse(const char *json, size_t len, struct fkv_model_config *cfg, char *err, size_t errlen);
/* Reads and parses <dir>/config.json. */
int hf_config_load(const char *dir, struct fkv_model_config *cfg, char *err, size_t errlen);

#endif
