/* backend_cpu_priv — what the CPU backend's files share (backend_cpu.c: the ops table and most
 * ops; backend_cpu_refresh.c: refreshkv's full-step ops; backend_cpu_select.c: the selection
 * ops and the fences of download_async; backend_cpu_xfer.c: the KV transfers — recall,
 * offload, rounding; backend_cpu_kivi.c: specache's KIVI ops): the hot-loop cloning, the
 * 16-bit to f32 conversions, the double-lane vectors of the attention scores, attention's
 * sources, query-row units, score kernel and loop, so every attention op computes the same
 * bits; the ops those files define for the ops table; and the backend's context (made by
 * backend_cpu_new, freed by its free op, which calls cpu_kivi_free for the KIVI scratch). The
 * selection and transfer ops keep no state in the CPU context, so any thread may call them.
 * Static inline helpers and declarations only; nothing here owns memory. */
#ifndef FREEKV_BACKEND_CPU_PRIV_H
#define FREEKV_BACKEND_CPU_PRIV_H

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "backend.h"
#include "dtype.h"

/* Below this many multiply-adds (or elements) an op runs on one thread: waking the pool costs
 * more than it saves. */
#define CPU_PAR_MIN (1 << 18)

/* Largest head_dim the stack buffers accept. */
#define CPU_MAX_HEAD_DIM 1024

static inline bool cpu_kv_dtype_ok(enum fkv_dtype dt)
{
	return dt == FKV_F32 || dt == FKV_F16 || dt == FKV_BF16;
}

/* Most query rows one attention unit takes; it converts each K/V row once for all of them. */
#define CPU_ATTN_ROWS 64

/* The hot loops are compiled twice, for x86-64-v3 (AVX2, FMA) and the baseline, and the loader
 * picks the clone the CPU runs (GCC function multiversioning): the build targets the baseline,
 * so without this every loop would be SSE2. Functions with an OpenMP region are not cloned
 * (the region is outlined before cloning); they call CPU_HOT workers. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
	!defined(__SANITIZE_THREAD__) /* an instrumented ifunc resolver runs before TSan starts */
#define CPU_HOT __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define CPU_HOT
#endif

static inline float bf16_val(uint16_t b)
{
	uint32_t u = (uint32_t)b << 16;
	float f;
	memcpy(&f, &u, sizeof f);
	return f;
}

/* f16 -> f32 without branches, so that conversion loops vectorise: the exponent/mantissa bits
 * shifted into f32 position and scaled by 2^112 give every finite value exactly (subnormals
 * included); Inf/NaN get the all-ones exponent. Same results as f16_to_f32 (tested). */
static inline float f16_val(uint16_t h)
{
	uint32_t em = h & 0x7fffu, r;
	uint32_t u = em << 13;
	float f;
	memcpy(&f, &u, sizeof f);
	f *= 0x1p112f;
	memcpy(&r, &f, sizeof r);
	r |= (em >= 0x7c00u ? 0x7f800000u : 0u) | (uint32_t)(h & 0x8000u) << 16;
	memcpy(&f, &r, sizeof f);
	return f;
}

/* n 16-bit values of dtype t to f32. */
static inline void cvt16(float *dst, const uint16_t *src, enum fkv_dtype t, int64_t n)
{
	if (t == FKV_BF16) {
		#pragma omp simd
		for (int64_t i = 0; i < n; i++)
			dst[i] = bf16_val(src[i]);
	} else {
		#pragma omp simd
		for (int64_t i = 0; i < n; i++)
			dst[i] = f16_val(src[i]);
	}
}

/* Four double lanes, with GCC/Clang vector extensions (see backend_cpu.c's eight-lane kernels):
 * attention scores accumulate in them. */
#pragma GCC diagnostic ignored "-Wpsabi" /* vectors by value, only between inlined statics */
typedef float v4f __attribute__((vector_size(16)));
typedef double v4d __attribute__((vector_size(32)));

static inline v4d ld4d(const float *p)
{
	v4f v;
	memcpy(&v, p, sizeof v);
	return __builtin_convertvector(v, v4d);
}

static inline double hsum4d(const v4d *v)
{
	const v4d x = *v;
	return (x[0] + x[2]) + (x[1] + x[3]);
}

/* Row r of a (rows, cols) array of dtype t converted into dst (cols). Returns dst, or the row
 * itself when it is already f32. */
static inline const float *row_f32(float *dst, const void *base, enum fkv_dtype t, int64_t r,
				   int64_t cols)
{
	if (t == FKV_F32)
		return (const float *)base + r * cols;
	cvt16(dst, (const uint16_t *)base + r * cols, t, cols);
	return dst;
}

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
	/* matmul_dot on K-quant weights: the activation rows quantized to 8 bits (cpu_qdot8.h) */
	void *q8;
	size_t q8_len; /* bytes */
	struct cpu_wmem *wmem; /* the weights the backend copies (cpu_wmem.h) */
};

/* Query rows that share one KV head, as one unit of work: row r is query q[r] (d) attending
 * to keys [lo[r], hi[r]) of the source, its output going to o[r] (d). The rows of a unit are
 * a GQA group (decode) or the groups of consecutive queries (prefill), so each K and V row is
 * converted once for all of them. */
struct attn_rows {
	const float *q[CPU_ATTN_ROWS];
	float *o[CPU_ATTN_ROWS];
	int64_t lo[CPU_ATTN_ROWS], hi[CPU_ATTN_ROWS];
	int n;
	float *pr[CPU_ATTN_ROWS]; /* NULL, or where the row's probabilities of keys [0, n_pr) go */
	int64_t n_pr;
};

/* Attention scores accumulate in double: the sum is then independent of the order of the
 * head dimensions to f32 precision, so both rotary layouts of one model agree.
 * Scores of key row x (d) for rows r .. r + 3 of u (those that exist and see the key) into
 * s[0], s[ld], s[2 ld], s[3 ld]. The four sums run side by side, so their vector adds overlap
 * (one sum is latency-bound); a missing row repeats row r. Always inlined, so that it is
 * compiled into each clone of attn_unit. */
__attribute__((always_inline)) static inline void
scores4(float *s, int64_t ld, const struct attn_rows *u, int r, int64_t key, const float *x, int d,
	float scale)
{
	const float *q[4];
	bool any = false;
	for (int k = 0; k < 4; k++) {
		q[k] = u->q[r + k < u->n ? r + k : r];
		any |= r + k < u->n && key >= u->lo[r + k] && key < u->hi[r + k];
	}
	if (!any)
		return;
	v4d a0 = { 0 }, a1 = { 0 }, a2 = { 0 }, a3 = { 0 };
	int i = 0;
	for (; i + 4 <= d; i += 4) {
		v4d xv = ld4d(x + i);
		a0 += ld4d(q[0] + i) * xv;
		a1 += ld4d(q[1] + i) * xv;
		a2 += ld4d(q[2] + i) * xv;
		a3 += ld4d(q[3] + i) * xv;
	}
	double acc[4] = { hsum4d(&a0), hsum4d(&a1), hsum4d(&a2), hsum4d(&a3) };
	for (; i < d; i++)
		for (int k = 0; k < 4; k++)
			acc[k] += (double)q[k][i] * x[i];
	for (int k = 0; k < 4 && r + k < u->n; k++)
		if (key >= u->lo[r + k] && key < u->hi[r + k])
			s[k * ld] = (float)acc[k] * scale;
}

static inline int cpu_check_attn(const struct backend_attn *a)
{
	if (a->head_dim <= 0 || a->head_dim > CPU_MAX_HEAD_DIM || a->n_kv_heads <= 0 ||
	    a->n_heads % a->n_kv_heads || a->window < 0)
		return -EINVAL;
	return 0;
}

/* One source per KV head: its spans spans[first[g] .. first[g + 1]); *out is the caller's to
 * free. 0, -EINVAL or -ENOMEM (backend_cpu.c). */
int cpu_head_srcs(const struct backend_kv_span *spans, const int *first,
		  const struct backend_attn *a, struct attn_src **out);

/* Every query head of n_q queries q (n_q, n_heads, d) against its KV head's keys src[kvh], into
 * out (n_q, n_heads, d) (backend_cpu.c). causal: query i sees keys up to n_ctx - n_q + i
 * (windowed as a.window says), else every key of its source. probs (optional, NULL):
 * (n_heads, n_prob), each query head's attention probabilities of the last query at keys
 * [0, n_prob) (0 where it does not see the key). A row's result depends on its own keys only,
 * not on the other rows or the thread count. 0 or -ENOMEM. */
int cpu_attn_run(struct cpu_ctx *c, float *out, const float *q, int64_t n_q,
		 const struct attn_src *src, int64_t n_ctx, bool causal,
		 const struct backend_attn *a, float *probs, int64_t n_prob);

/* specache's KIVI ops (backend_cpu_kivi.c; backend.h describes them), and the release of
 * their scratch. */
int cpu_kivi_quant(void *ctx, const struct backend_kivi *q, int64_t t0, const void *k,
		   const void *v, int64_t n, enum fkv_dtype dt);
int cpu_kivi_dequant(void *ctx, float *k, float *v, const struct backend_kivi *q, int64_t t0,
		     int64_t n);
int cpu_attn_kivi(void *ctx, float *out, const float *q, int n_q,
		  const struct backend_kivi_attn *ka, const struct backend_attn *a);
void cpu_kivi_free(struct cpu_ctx *c);

/* refreshkv's ops (backend_cpu_refresh.c; backend.h describes them). */
int cpu_attn_scores(void *ctx, float *s, int64_t ld, const float *q,
		    const struct backend_kv_span *spans, const int *first,
		    const struct backend_attn *a);
int cpu_attn_accum(void *ctx, float *out, const float *p, int64_t ld,
		   const struct backend_kv_span *spans, const int *first, bool accumulate,
		   const struct backend_attn *a);
int cpu_gather_heads(void *ctx, float *dst, const float *src, const int32_t *map, int n,
		     int n_kv, int d);

/* The selection ops and download_async's fences (backend_cpu_select.c), the KV transfers
 * (backend_cpu_xfer.c); backend.h describes them. */
int cpu_page_summary(void *ctx, float *kmin, float *kmax, int page_stride, int page,
		     const void *slot, enum fkv_dtype slot_dt, int p, int n_kv, int d);
int cpu_select_pages(void *ctx, const struct backend_select *g, const float *q,
		     const float *kmin, const float *kmax, const uint8_t *resident, int32_t *pages,
		     int32_t *changed, int32_t *n_changed);
int cpu_group_cosine(void *ctx, float *out, const float *q_t, const float *q_prev, int n_q,
		     int n_kv, int d);
void *cpu_host_alloc(void *ctx, size_t bytes);
void cpu_host_free(void *ctx, void *p);
int cpu_fence_new(void *ctx, void **fence);
void cpu_fence_free(void *ctx, void *fence);
int cpu_download_async(void *ctx, void *host_dst, const void *src, size_t bytes, void *fence);
int cpu_fence_wait(void *ctx, void *fence);

int cpu_recall_units(void *ctx, void *const *slots, const int *heads, const void *units, int n,
		     int p, int n_kv, int d, enum fkv_dtype unit_dt, enum fkv_dtype slot_dt,
		     void *done);
int cpu_recall_direct(void *ctx, void *const *slots, const int *heads, const void *const *srcs,
		      int n, int p, int n_kv, int d, enum fkv_dtype unit_dt,
		      enum fkv_dtype slot_dt, void *done);
int cpu_recall_fragmented(void *ctx, void *const *slots, const int *heads,
			  const void *const *srcs, int n, int p, int n_kv, int d,
			  enum fkv_dtype unit_dt, enum fkv_dtype slot_dt, void *done);
int cpu_fence_stream_wait(void *ctx, void *fence);
int cpu_store_rows(void *ctx, void *const *blocks, int t0, const float *k, const float *v,
		   int n_tok, int p, int n_kv, int d, enum fkv_dtype dt);
int cpu_round_to(void *ctx, float *x, int64_t n, enum fkv_dtype dt);

#endif
