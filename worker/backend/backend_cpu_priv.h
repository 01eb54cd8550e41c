/* backend_cpu_priv — what the CPU backend's files share (backend_cpu.c: the ops table, compute
 * and attention; backend_cpu_kivi.c: the KIVI quantisation and the attention over a KIVI copy,
 * docs/design.md §5 `specache`). One struct cpu_ctx per backend, made by backend_cpu_new and
 * freed by its free op, which calls cpu_kivi_free for the KIVI scratch. */
#ifndef FREEKV_BACKEND_CPU_PRIV_H
#define FREEKV_BACKEND_CPU_PRIV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"

struct attn_src;

struct cpu_ctx {
	float *scratch; /* tiles and attention scores */
	size_t scratch_len;
	/* attn_decode_slots: the slot list as spans (n_kv, pages) and one source per KV head */
	struct backend_kv_span *slot_spans;
	size_t slot_spans_len;
	struct attn_src *slot_src;
	int slot_src_len;
	/* attn_kivi: which exact row each (KV head, quantised position) reads, -1 for none
	 * (n_kv, n_quant); the per-query-head probabilities of the last row (n_heads, n_prob). */
	int32_t *kivi_map;
	size_t kivi_map_len;
	float *kivi_pr;
	size_t kivi_pr_len;
};

/* Where an attention call reads one KV head's keys from: n keys, the first n_row of them
 * through row() when it is set, the rest from the spans in order (the decode spans, or one
 * dense span for prefill). row() returns key `key` of KV head kvh as f32 — its K row on pass 0,
 * its V row on pass 1 — in tmp (head_dim floats) or in memory of its own; it runs on the
 * attention's threads, so it keeps no state. */
struct attn_src {
	const struct backend_kv_span *spans;
	int n_spans;
	int64_t n;
	const float *(*row)(const void *arg, int pass, int64_t key, int kvh, float *tmp);
	const void *arg;
	int64_t n_row;
};

/* 0, or -EINVAL for an attention geometry the CPU backend does not take. */
int cpu_check_attn(const struct backend_attn *a);

/* Every query head of n_q queries q (n_q, n_heads, d) against its KV head's keys src[kvh], into
 * out (n_q, n_heads, d). causal: query i sees keys up to n_ctx - n_q + i (windowed as a.window
 * says), else every key of its source. probs (optional, NULL): (n_heads, n_prob), each query
 * head's attention probabilities of the last query at keys [0, n_prob) (0 where it does not
 * see the key). A row's result depends on its own keys only, not on the other rows or the
 * thread count. 0 or -ENOMEM. */
int cpu_attn_run(struct cpu_ctx *c, float *out, const float *q, int64_t n_q,
		 const struct attn_src *src, int64_t n_ctx, bool causal,
		 const struct backend_attn *a, float *probs, int64_t n_prob);

/* backend_cpu_kivi.c: the ops of the table, and the release of their scratch. */
int cpu_kivi_quant(void *ctx, const struct backend_kivi *q, int64_t t0, const void *k,
		   const void *v, int64_t n, enum fkv_dtype dt);
int cpu_kivi_dequant(void *ctx, float *k, float *v, const struct backend_kivi *q, int64_t t0,
		     int64_t n);
int cpu_attn_kivi(void *ctx, float *out, const float *q, int n_q,
		  const struct backend_kivi_attn *ka, const struct backend_attn *a);
void cpu_kivi_free(struct cpu_ctx *c);

#endif
