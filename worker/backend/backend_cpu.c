/* backend_cpu — the reference backend: f32 compute on the host with OpenBLAS and OpenMP.
 *
 * Buffers are plain heap memory. Weight matrices are copied into huge pages where the kernel
 * has them (cpu_wmem.h), else borrowed from the model mapping, as are vectors and weights read
 * by rows (weight_load_rows: the embedding). 16-bit weights are converted on the fly: a
 * product with one row (decode) runs a direct dot loop that converts a short chunk of a weight
 * row at a time; a larger product converts blocks of weight rows to f32 tiles and hands each
 * to sgemm. Attention works in units of query rows that share a KV head (a GQA group, or
 * several queries' groups in prefill): each K/V row is converted once per unit. Scratch for tiles and scores lives in one
 * growing buffer owned by the context, and attn_decode_slots keeps its span tables in the
 * context too (grown on demand, so a decode step allocates nothing once warm). Results do not
 * depend on the thread count. Block-quantized weights (docs/quant.md) take the same two paths
 * with cpu_quant.c's kernels: a row dot product that decodes blocks in registers, and
 * dequantized tiles for sgemm. The helpers shared with backend_cpu_refresh.c (refreshkv's ops)
 * and backend_cpu_kivi.c (specache's KIVI ops) are in backend_cpu_priv.h. */
#include "backend.h"
#include "backend_cpu_priv.h"
#include "cpu_dot16.h"
#include "cpu_gemm.h"
#include "cpu_q4k.h"
#include "cpu_wmem.h"
#include "cpu_qdot8.h"
#include "cpu_quant.h"
#include "layout.h"

#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* Products with at most this many activation rows compute each row on its own, exactly as a
 * one-row product does (16-bit weights: the direct dot loop, two rows in one pass over the
 * weights; quantized: the row dot product per row; f32: sgemv per row over the same blocks),
 * so a row's result does not depend on whether it ran alone: a `specache` step's real row (one
 * of two, docs/design.md §5) gets the bits of a one-row step. Measured on bf16 matrices of the
 * Llama-3.1-8B geometry, 2 threads: the two-row pass within the noise of converted tiles +
 * sgemm (4096x4096: 7.4-14.9 vs 5.5-8.0 ms; 14336x4096: 12.3-19.1 vs 17.7-23.0 ms). From 3
 * rows on, the AVX-512 GEMM (cpu_gemm.c), else converted tiles + sgemm. Q4_K on AVX-512 VNNI
 * (cpu_q4k.c) computes each row on its own at any count. */
#define CPU_GEMV_MAX_ROWS 2
/* Target size of one converted f32 weight tile for sgemm: about one core's L2 (measured best of
 * 256 KiB, 1 MiB, 4 MiB on the development machine). */
#define CPU_TILE_BYTES (1u << 20)
/* matmul_blocks cuts a small matrix into at least this many row blocks, so that up to this
 * many threads share it. */
#define CPU_TILE_SPLIT 8
/* Weight rows per task of the direct dot loop. */
#define CPU_DOT_ROWS 64
/* The most scores (floats) an attention unit's scratch may hold. */
#define CPU_ATTN_SCORES (1 << 20)
/* A unit reads one head's slice of each K/V row, a row stride apart: it prefetches the slice
 * this many rows ahead (measured on f32 spans of (32, 8, 128) pages: 1.8x over no prefetch,
 * 2 to 8 rows alike). */
#define CPU_ATTN_PREFETCH 4
/* CPU_PAR_MIN, CPU_MAX_HEAD_DIM, CPU_ATTN_ROWS, CPU_HOT and struct cpu_ctx: backend_cpu_priv.h. */

static float *scratch_get(struct cpu_ctx *c, size_t n)
{
	if (n > c->scratch_len) {
		float *p = realloc(c->scratch, n * sizeof *p);
		if (!p)
			return NULL;
		c->scratch = p;
		c->scratch_len = n;
	}
	return c->scratch;
}

/* Element i of a dtype-typed array, as f32. */
static inline float ld(const void *p, enum fkv_dtype t, int64_t i)
{
	switch (t) {
	case FKV_F16: return f16_to_f32(((const uint16_t *)p)[i]);
	case FKV_BF16: return bf16_to_f32(((const uint16_t *)p)[i]);
	case FKV_F32: break;
	}
	return ((const float *)p)[i];
}


/* Eight lanes, with GCC/Clang vector extensions: the kernels below spell out their vector
 * accumulators (an OpenMP simd reduction keeps its partial sums in memory, a store-to-load
 * chain per step); each clone compiles them to its widest registers. */
typedef float v8f __attribute__((vector_size(32)));
typedef uint32_t v8u __attribute__((vector_size(32)));
typedef uint16_t v8h __attribute__((vector_size(16)));

static inline v8f ld8(const float *p)
{
	v8f v;
	memcpy(&v, p, sizeof v);
	return v;
}


static inline float hsum8(const v8f *v)
{
	const v8f x = *v;
	return ((x[0] + x[4]) + (x[1] + x[5])) + ((x[2] + x[6]) + (x[3] + x[7]));
}


/* p[0..7], 16-bit values of dtype t, as f32: bf16_val / f16_val on eight lanes. */
__attribute__((always_inline)) static inline v8f cvt8(const uint16_t *p, enum fkv_dtype t)
{
	v8h h;
	memcpy(&h, p, sizeof h);
	v8u u = __builtin_convertvector(h, v8u), r;
	v8f f;
	if (t == FKV_BF16) {
		u <<= 16;
		memcpy(&f, &u, sizeof f);
		return f;
	}
	v8u em = u & 0x7fffu, b = em << 13;
	memcpy(&f, &b, sizeof f);
	f *= 0x1p112f;
	memcpy(&r, &f, sizeof r);
	r |= ((v8u)(em >= 0x7c00u) & 0x7f800000u) | (u & 0x8000u) << 16;
	memcpy(&f, &r, sizeof f);
	return f;
}


static void cpu_free(void *ctx)
{
	struct cpu_ctx *c = ctx;
	cpu_wmem_free(c->wmem);
	free(c->scratch);
	free(c->slot_spans);
	free(c->slot_src);
	free(c->q8);
	cpu_kivi_free(c);
	free(c);
}

static void *cpu_buf_alloc(void *ctx, size_t bytes)
{
	(void)ctx;
	void *p = NULL;
	if (posix_memalign(&p, 64, bytes ? bytes : 64))
		return NULL;
	return p;
}

static void cpu_buf_free(void *ctx, void *buf)
{
	(void)ctx;
	free(buf);
}

static int cpu_copy(void *ctx, void *dst, const void *src, size_t bytes)
{
	(void)ctx;
	memmove(dst, src, bytes);
	return 0;
}

static int cpu_convert(void *ctx, void *dst, enum fkv_dtype t, const float *src, int64_t n)
{
	(void)ctx;
	dtype_from_f32(dst, src, t, (size_t)n);
	return 0;
}

static int cpu_gather_rows(void *ctx, float *dst, const float *src, int64_t cols,
			   const int32_t *idx, int64_t n)
{
	(void)ctx;
	for (int64_t i = 0; i < n; i++)
		memcpy(dst + i * cols, src + (int64_t)idx[i] * cols, (size_t)cols * sizeof *dst);
	return 0;
}

static int cpu_split_cols(void *ctx, float *const *dst, const int64_t *cols, int n,
			  const float *src, int64_t rows)
{
	(void)ctx;
	int64_t all = 0;
	for (int i = 0; i < n; i++)
		all += cols[i];
	for (int64_t r = 0; r < rows; r++) {
		const float *row = src + r * all;
		for (int i = 0; i < n; i++) {
			memcpy(dst[i] + r * cols[i], row, (size_t)cols[i] * sizeof *row);
			row += cols[i];
		}
	}
	return 0;
}

/* A weight the CPU backend holds itself (priv: this, owning the buffer): a concatenation, or
 * (cpu_wmem_usable) a matrix copied into huge pages; other weights borrow the model's mapping
 * (priv NULL). matmul splits each part of a concatenation as it would split the part alone:
 * sgemv's sums depend on the block's shape, and the fused GEMM must give the separate GEMMs'
 * bits (a copied matrix is one part). */
#define CPU_CONCAT_MAX 4
struct cpu_concat {
	char *buf;
	struct cpu_wmem_chunk *chunk; /* buf lies in this cpu_wmem chunk; NULL: malloc'd */
	int n;
	int64_t rows[CPU_CONCAT_MAX]; /* of each part, stacked in this order */
};

/* A buffer for a weight of bytes: in huge pages where they are usable, else from malloc (NULL
 * on failure). */
static struct cpu_concat *held_new(struct cpu_ctx *c, size_t bytes)
{
	struct cpu_concat *cc = calloc(1, sizeof *cc);
	if (!cc)
		return NULL;
	if (cpu_wmem_usable())
		cc->buf = cpu_wmem_alloc(c->wmem, bytes, &cc->chunk);
	if (!cc->buf)
		cc->buf = malloc(bytes);
	if (!cc->buf) {
		free(cc);
		return NULL;
	}
	return cc;
}

static void cpu_weight_release(void *ctx, struct backend_mat *w)
{
	struct cpu_ctx *c = ctx;
	struct cpu_concat *cc = w->priv;
	if (cc && cc->chunk)
		cpu_wmem_put(c->wmem, cc->chunk);
	else if (cc)
		free(cc->buf);
	free(cc);
	memset(w, 0, sizeof *w);
}

/* weight_load and weight_load_rows: copy says whether a matrix goes into huge pages. */
static int load_mat(struct cpu_ctx *c, const struct fkv_tensor *src, struct backend_mat *dst,
		    bool copy)
{
	if (!src->data)
		return -EINVAL;
	dst->data = src->data;
	dst->dtype = src->dtype;
	dst->rows = src->shape[0];
	dst->cols = src->n_dims == 2 ? src->shape[1] : 1;
	dst->priv = NULL;
	dst->quant = src->quant;
	if (src->quant && !quant_row_bytes(src->quant, dst->cols))
		return -EINVAL; /* unknown format or rows of partial blocks: model_load refuses both */
	/* Matrices into huge pages (cpu_wmem.h); vectors stay where they are. Where the copy
	 * cannot be made the mapping serves. */
	if (!copy || src->n_dims != 2 || !cpu_wmem_usable())
		return 0;
	const size_t bytes = model_tensor_bytes(src);
	struct cpu_concat *cc = held_new(c, bytes);
	if (!cc || !cc->chunk) {
		if (cc)
			free(cc->buf);
		free(cc);
		return 0;
	}
	memcpy(cc->buf, src->data, bytes);
	cc->n = 1;
	cc->rows[0] = dst->rows;
	dst->data = cc->buf;
	dst->priv = cc;
	return 0;
}

static int cpu_weight_load(void *ctx, const struct fkv_tensor *src, struct backend_mat *dst)
{
	return load_mat(ctx, src, dst, true);
}

/* Read by rows (embed): one row a token gains nothing from huge pages, so the mapping serves. */
static int cpu_weight_load_rows(void *ctx, const struct fkv_tensor *src, struct backend_mat *dst)
{
	return load_mat(ctx, src, dst, false);
}

static int cpu_weight_concat(void *ctx, const struct fkv_tensor *const *parts, int n,
			     struct backend_mat *dst)
{
	struct cpu_ctx *c = ctx;
	if (n <= 0 || n > CPU_CONCAT_MAX)
		return -EINVAL;
	const int64_t cols = parts[0]->n_dims == 2 ? parts[0]->shape[1] : 1;
	int64_t rows = 0;
	for (int i = 0; i < n; i++) {
		if (parts[i]->quant != FKV_QNONE)
			return -EOPNOTSUPP; /* the engine keeps quantized weights apart */
		if (!parts[i]->data || parts[i]->dtype != parts[0]->dtype ||
		    (parts[i]->n_dims == 2 ? parts[i]->shape[1] : 1) != cols)
			return -EINVAL;
		rows += parts[i]->shape[0];
	}
	const size_t row_bytes = (size_t)cols * dtype_size(parts[0]->dtype);
	struct cpu_concat *cc = held_new(c, (size_t)rows * row_bytes);
	if (!cc)
		return -ENOMEM;
	char *buf = cc->buf;
	cc->n = n;
	size_t off = 0;
	for (int i = 0; i < n; i++) {
		memcpy(buf + off, parts[i]->data, (size_t)parts[i]->shape[0] * row_bytes);
		off += (size_t)parts[i]->shape[0] * row_bytes;
		cc->rows[i] = parts[i]->shape[0];
	}
	*dst = (struct backend_mat){ .data = buf, .dtype = parts[0]->dtype, .rows = rows,
				     .cols = cols, .priv = cc };
	return 0;
}

/* Rows [r0, r1) of y[j] (rows) = w · x[j] for j < nx (1 or 2) activation rows, 16-bit w of
 * dtype t, x[j] (cols): each weight element is converted in registers once and multiplied
 * into every activation row's sum. Four weight rows go together, each with its own vector sum
 * per activation row, so that independent chains hide the latency of the adds (one chain is
 * latency-bound); a short last group repeats its last row. Each sum is the same sequence of
 * operations whatever nx is. Always inlined with constant t and nx, so that their tests leave
 * the loop. */
__attribute__((always_inline)) static inline void
dot_rows_t(float *const *y, const float *const *x, int nx, const uint16_t *w, int64_t cols,
	   int64_t r0, int64_t r1, enum fkv_dtype t)
{
	float (*val)(uint16_t) = t == FKV_BF16 ? bf16_val : f16_val;
	for (int64_t r = r0; r < r1; r += 4) {
		const uint16_t *wr[4];
		for (int k = 0; k < 4; k++)
			wr[k] = w + (r + k < r1 ? r + k : r1 - 1) * cols;
		v8f a[2][4] = { { { 0 } } };
		int64_t c = 0;
		for (; c + 8 <= cols; c += 8) {
			v8f xv[2];
			for (int j = 0; j < nx; j++)
				xv[j] = ld8(x[j] + c);
			for (int k = 0; k < 4; k++) {
				v8f wv = cvt8(wr[k] + c, t);
				for (int j = 0; j < nx; j++)
					a[j][k] += wv * xv[j];
			}
		}
		for (int j = 0; j < nx; j++) {
			float acc[4] = { hsum8(&a[j][0]), hsum8(&a[j][1]), hsum8(&a[j][2]),
					 hsum8(&a[j][3]) };
			for (int64_t cc = c; cc < cols; cc++)
				for (int k = 0; k < 4; k++)
					acc[k] += val(wr[k][cc]) * x[j][cc];
			for (int k = 0; k < 4 && r + k < r1; k++)
				y[j][r + k] = acc[k];
		}
	}
}

CPU_HOT static void dot_rows(float *const *y, const float *const *x, int nx,
			     const struct backend_mat *w, int64_t r0, int64_t r1)
{
	if (nx == 2 && w->dtype == FKV_BF16)
		dot_rows_t(y, x, 2, w->data, w->cols, r0, r1, FKV_BF16);
	else if (nx == 2)
		dot_rows_t(y, x, 2, w->data, w->cols, r0, r1, FKV_F16);
	else if (w->dtype == FKV_BF16)
		dot_rows_t(y, x, 1, w->data, w->cols, r0, r1, FKV_BF16);
	else
		dot_rows_t(y, x, 1, w->data, w->cols, r0, r1, FKV_F16);
}

/* c->q8 (the quantized activation rows of the integer paths) holds at least bytes. */
static int q8_reserve(struct cpu_ctx *c, size_t bytes)
{
	if (bytes <= c->q8_len)
		return 0;
	void *p = realloc(c->q8, bytes);
	if (!p)
		return -ENOMEM;
	c->q8 = p;
	c->q8_len = bytes;
	return 0;
}

/* The weight rows of a parallel matmul in nblk blocks of about CPU_DOT_ROWS rows, nblk a
 * multiple of the threads so that the static schedule gives every thread the same share of rows
 * (within four): 576 rows in blocks of 64 left one of two threads 4 blocks and the other 5.
 * Every block starts at a multiple of four rows. */
struct row_split {
	int64_t rows, quads, nblk;
};

static struct row_split row_split(int64_t rows, bool par)
{
	const int64_t nt = par ? omp_get_max_threads() : 1, per = nt * CPU_DOT_ROWS;
	return (struct row_split){ rows, (rows + 3) / 4, nt * ((rows + per - 1) / per) };
}

/* Rows [*r0, *r1) of block b (possibly empty when the matrix has fewer quads than blocks). */
static void split_rows(const struct row_split *s, int64_t b, int64_t *r0, int64_t *r1)
{
	const int64_t e = (b + 1) * s->quads / s->nblk * 4;
	*r0 = b * s->quads / s->nblk * 4;
	*r1 = e < s->rows ? e : s->rows;
}

/* At most CPU_GEMV_MAX_ROWS activation rows, 16-bit or quantized weights: blocks of weight rows
 * spread over the threads; 16-bit, every activation row in the same pass (the vectorised work
 * is in dot_rows, outside the OpenMP region, so that it gets the CPU_HOT clone); quantized,
 * one row at a time. */
static int matmul_dot(struct cpu_ctx *c, float *y, const float *x, const struct backend_mat *w,
		      int64_t n)
{
	const int64_t rows = w->rows, cols = w->cols;
	const bool par = rows * cols > CPU_PAR_MIN;
	const struct row_split sp = row_split(rows, par);
	float *const ys[2] = { y, y + rows };
	const float *const xs[2] = { x, x + cols };
	const bool dot16 = !w->quant && cpu_dot16_usable(); /* AVX2 + F16C: cpu_dot16.c */
	/* Quantized weights with AVX2: the activation rows quantized once, integer dot products
	 * (cpu_qdot8.c) */
	const bool qdot8 = w->quant && cpu_qdot8_usable(w->quant);
	const size_t ab = qdot8 ? cpu_qdot8_act_bytes(w->quant, cols) : 0;
	if (qdot8 && q8_reserve(c, (size_t)n * ab))
		return -ENOMEM;
	for (int64_t j = 0; qdot8 && j < n; j++)
		cpu_qdot8_quantize((char *)c->q8 + j * ab, x + j * cols, cols, w->quant);
	#pragma omp parallel for schedule(static) if (par)
	for (int64_t b = 0; b < sp.nblk; b++) {
		int64_t r0, r1;
		split_rows(&sp, b, &r0, &r1);
		if (dot16)
			cpu_dot16_rows(ys, xs, (int)n, w->data, cols, r0, r1, w->dtype);
		else if (qdot8)
			for (int64_t j = 0; j < n; j++)
				cpu_qdot8_rows(y + j * rows, (const char *)c->q8 + j * ab, w->data,
					       w->quant, cols, r0, r1);
		else if (!w->quant)
			dot_rows(ys, xs, (int)n, w, r0, r1);
		else
			for (int64_t j = 0; j < n; j++)
				cpu_quant_dot_rows(y + j * rows, x + j * cols, w->data, w->quant, cols,
						   r0, r1);
	}
	return 0;
}

/* n 16-bit values of dtype t to f32: the tile conversion of matmul_blocks, cloned. */
CPU_HOT static void cvt_tile(float *dst, const uint16_t *src, enum fkv_dtype t, int64_t n)
{
	cvt16(dst, src, t, n);
}

/* Blocks of weight rows, one per task, each multiplied by one single-threaded sgemm (or
 * sgemv); 16-bit blocks are first converted into the task's thread's tile. OpenMP is the only
 * thread pool: OpenBLAS runs single-threaded inside the tasks, so the two pools never compete
 * for cores. */
static int matmul_blocks(struct cpu_ctx *c, float *y, const float *x, const struct backend_mat *w,
			 int64_t n)
{
	const int64_t rows = w->rows, cols = w->cols;
	/* Few rows: sgemv per row, threaded as one row, so a row's bits do not depend on n
	 * (CPU_GEMV_MAX_ROWS). */
	const bool rowwise = n <= CPU_GEMV_MAX_ROWS;
	const bool par = (rowwise ? 1 : n) * rows * cols > CPU_PAR_MIN;
	const int nt = par ? omp_get_max_threads() : 1;
	/* Segments split alike: the whole weight, or each part of a concatenation. */
	const struct cpu_concat *cc = w->priv;
	const int nseg = cc ? cc->n : 1;
	int64_t seg_r0[CPU_CONCAT_MAX + 1], seg_blk[CPU_CONCAT_MAX], seg_b0[CPU_CONCAT_MAX + 1];
	int64_t blk_max = 0;
	seg_r0[0] = seg_b0[0] = 0;
	for (int sg = 0; sg < nseg; sg++) {
		const int64_t sr = cc ? cc->rows[sg] : rows;
		int64_t blk = (int64_t)(CPU_TILE_BYTES / sizeof(float)) / cols;
		/* the split must not depend on nt: sgemm's sums differ with the block's shape, and
		 * results must not change with the thread count */
		if (blk > (sr + CPU_TILE_SPLIT - 1) / CPU_TILE_SPLIT)
			blk = (sr + CPU_TILE_SPLIT - 1) / CPU_TILE_SPLIT;
		if (blk < 16)
			blk = 16;
		seg_blk[sg] = blk;
		seg_r0[sg + 1] = seg_r0[sg] + sr;
		seg_b0[sg + 1] = seg_b0[sg] + (sr + blk - 1) / blk;
		blk_max = blk > blk_max ? blk : blk_max;
	}
	float *tiles = NULL;
	if ((w->dtype != FKV_F32 || w->quant) &&
	    !(tiles = scratch_get(c, (size_t)nt * (size_t)(blk_max * cols))))
		return -ENOMEM;
	const int64_t nblk = seg_b0[nseg];
	#pragma omp parallel for schedule(dynamic) num_threads(nt) if (par)
	for (int64_t b = 0; b < nblk; b++) {
		int sg = 0;
		while (b >= seg_b0[sg + 1])
			sg++;
		const int64_t blk = seg_blk[sg], r0 = seg_r0[sg] + (b - seg_b0[sg]) * blk;
		const int64_t m = seg_r0[sg + 1] - r0 < blk ? seg_r0[sg + 1] - r0 : blk;
		const float *wt = w->quant ? NULL : (const float *)w->data + r0 * cols;
		if (tiles) {
			float *t = tiles + (size_t)omp_get_thread_num() * (size_t)(blk_max * cols);
			if (w->quant)
				cpu_quant_dequant_rows(t, w->data, w->quant, cols, r0, m);
			else
				cvt_tile(t, (const uint16_t *)w->data + r0 * cols, w->dtype, m * cols);
			wt = t;
		}
		/* y[:, r0:r0+m] (n, m) = x (n, cols) · wtᵀ, wt (m, cols) */
		if (rowwise)
			for (int64_t j = 0; j < n; j++)
				cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)m, (int)cols, 1.0f, wt,
					    (int)cols, x + j * cols, 1, 0.0f, y + j * rows + r0, 1);
		else
			cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)m,
				    (int)cols, 1.0f, x, (int)cols, wt, (int)cols, 0.0f, y + r0,
				    (int)rows);
	}
	return 0;
}

/* More than CPU_GEMV_MAX_ROWS activation rows on 16-bit or quantized weights with AVX-512:
 * blocks of CPU_DOT_ROWS weight rows spread over the threads, each multiplied by cpu_gemm.c
 * (16-bit weights in their stored dtype, quantized ones dequantized a small tile at a time; no
 * packing, no converted matrix). */
static int matmul_gemm(float *y, const float *x, const struct backend_mat *w, int64_t n)
{
	const int64_t rows = w->rows, cols = w->cols;
	const bool par = n * rows * cols > CPU_PAR_MIN;
	const struct row_split sp = row_split(rows, par);
	#pragma omp parallel for schedule(static) if (par)
	for (int64_t b = 0; b < sp.nblk; b++) {
		int64_t r0, r1;
		split_rows(&sp, b, &r0, &r1);
		cpu_gemm_rows(y, rows, x, n, w->data, w->dtype, w->quant, cols, r0, r1);
	}
	return 0;
}

/* Q4_K weights with AVX-512 VNNI, any number of activation rows: the rows quantized once into
 * the context's buffer, blocks of CPU_DOT_ROWS weight rows spread over the threads, each against
 * every activation row (cpu_q4k.c). A row's result does not depend on n. */
static int matmul_q4k(struct cpu_ctx *c, float *y, const float *x, const struct backend_mat *w,
		      int64_t n)
{
	const int64_t rows = w->rows, cols = w->cols;
	const size_t ab = cpu_q4k_act_bytes(cols);
	if (q8_reserve(c, (size_t)n * ab))
		return -ENOMEM;
	for (int64_t j = 0; j < n; j++)
		cpu_q4k_quantize((char *)c->q8 + j * ab, x + j * cols, cols);
	const bool par = n * rows * cols > CPU_PAR_MIN;
	const struct row_split sp = row_split(rows, par);
	#pragma omp parallel for schedule(static) if (par)
	for (int64_t b = 0; b < sp.nblk; b++) {
		int64_t r0, r1;
		split_rows(&sp, b, &r0, &r1);
		cpu_q4k_rows(y, rows, c->q8, n, w->data, cols, r0, r1);
	}
	return 0;
}

static int cpu_matmul(void *ctx, float *y, const float *x, const struct backend_mat *w, int64_t n)
{
	if (n <= 0)
		return 0;
	if (w->quant == FKV_Q4_K && cpu_q4k_usable())
		return matmul_q4k(ctx, y, x, w, n);
	if ((w->dtype != FKV_F32 || w->quant) && n <= CPU_GEMV_MAX_ROWS)
		return matmul_dot(ctx, y, x, w, n);
	if (cpu_gemm_usable(w->dtype, w->quant))
		return matmul_gemm(y, x, w, n);
	return matmul_blocks(ctx, y, x, w, n);
}

static int cpu_rmsnorm(void *ctx, float *y, const float *x, const struct backend_mat *w,
		       int64_t n, int64_t dim, float eps)
{
	(void)ctx;
	#pragma omp parallel for schedule(static) if (n * dim > CPU_PAR_MIN)
	for (int64_t i = 0; i < n; i++) {
		const float *xi = x + i * dim;
		float *yi = y + i * dim;
		double ss = 0.0;
		for (int64_t j = 0; j < dim; j++)
			ss += (double)xi[j] * xi[j];
		float inv = (float)(1.0 / sqrt(ss / (double)dim + eps));
		for (int64_t j = 0; j < dim; j++)
			yi[j] = xi[j] * inv * ld(w->data, w->dtype, j);
	}
	return 0;
}

/* Inverse frequency of rotary pair i, with llama3 scaling when enabled. */
static double rope_freq(const struct backend_rope *r, int i, int head_dim)
{
	double f = pow((double)r->theta, -2.0 * i / head_dim);
	if (r->scaling_factor <= 0.0f)
		return f;
	double wavelen = 2.0 * M_PI / f;
	double low_wl = r->original_ctx / (double)r->low_freq_factor;
	double high_wl = r->original_ctx / (double)r->high_freq_factor;
	if (wavelen < high_wl)
		return f;
	if (wavelen > low_wl)
		return f / r->scaling_factor;
	double smooth = (r->original_ctx / wavelen - r->low_freq_factor) /
			(r->high_freq_factor - r->low_freq_factor);
	return (1.0 - smooth) * f / r->scaling_factor + smooth * f;
}

static int cpu_rope(void *ctx, float *x, int64_t n, int n_heads, int head_dim, const int32_t *pos,
		    const struct backend_rope *r)
{
	(void)ctx;
	if (head_dim <= 0 || head_dim % 2 || head_dim > CPU_MAX_HEAD_DIM)
		return -EINVAL;
	const int half = head_dim / 2;
	double freq[CPU_MAX_HEAD_DIM / 2];
	for (int i = 0; i < half; i++)
		freq[i] = rope_freq(r, i, head_dim);
	#pragma omp parallel for schedule(static) if (n * n_heads * head_dim > CPU_PAR_MIN)
	for (int64_t t = 0; t < n; t++) {
		float cs[CPU_MAX_HEAD_DIM / 2], sn[CPU_MAX_HEAD_DIM / 2];
		for (int i = 0; i < half; i++) {
			double a = (double)pos[t] * freq[i];
			cs[i] = (float)cos(a);
			sn[i] = (float)sin(a);
		}
		for (int h = 0; h < n_heads; h++) {
			float *v = x + (t * n_heads + h) * head_dim;
			for (int i = 0; i < half; i++) {
				int a = r->style == FKV_ROPE_INTERLEAVED ? 2 * i : i;
				int b = r->style == FKV_ROPE_INTERLEAVED ? 2 * i + 1 : i + half;
				float v0 = v[a], v1 = v[b];
				v[a] = v0 * cs[i] - v1 * sn[i];
				v[b] = v0 * sn[i] + v1 * cs[i];
			}
		}
	}
	return 0;
}

static int cpu_silu_mul(void *ctx, float *out, const float *gate, const float *up, int64_t n)
{
	(void)ctx;
	#pragma omp parallel for schedule(static) if (n > CPU_PAR_MIN)
	for (int64_t i = 0; i < n; i++) {
		float g = gate[i];
		out[i] = g / (1.0f + expf(-g)) * up[i];
	}
	return 0;
}

static int cpu_add(void *ctx, float *y, const float *x, int64_t n)
{
	(void)ctx;
	#pragma omp parallel for schedule(static) if (n > CPU_PAR_MIN)
	for (int64_t i = 0; i < n; i++)
		y[i] += x[i];
	return 0;
}

static int cpu_add_bias(void *ctx, float *y, const struct backend_mat *b, int64_t n)
{
	(void)ctx;
	const int64_t m = b->rows;
	for (int64_t i = 0; i < n; i++)
		for (int64_t j = 0; j < m; j++)
			y[i * m + j] += ld(b->data, b->dtype, j);
	return 0;
}

static int cpu_embed(void *ctx, float *out, const struct backend_mat *table, const int32_t *ids,
		     int64_t n)
{
	(void)ctx;
	const int64_t cols = table->cols;
	const size_t es = dtype_size(table->dtype);
	for (int64_t i = 0; i < n && table->quant; i++)
		cpu_quant_dequant_rows(out + i * cols, table->data, table->quant, cols, ids[i], 1);
	for (int64_t i = 0; i < n && !table->quant; i++)
		dtype_to_f32(out + i * cols, (const char *)table->data + (size_t)ids[i] * cols * es,
			     table->dtype, (size_t)cols);
	return 0;
}

static void softmax_row(float *x, int64_t n)
{
	float mx = -INFINITY;
	for (int64_t j = 0; j < n; j++)
		if (x[j] > mx)
			mx = x[j];
	double sum = 0.0;
	for (int64_t j = 0; j < n; j++) {
		x[j] = expf(x[j] - mx);
		sum += x[j];
	}
	float inv = (float)(1.0 / sum);
	for (int64_t j = 0; j < n; j++)
		x[j] *= inv;
}

static int cpu_softmax(void *ctx, float *x, int64_t rows, int64_t cols)
{
	(void)ctx;
	#pragma omp parallel for schedule(static) if (rows * cols > CPU_PAR_MIN)
	for (int64_t i = 0; i < rows; i++)
		softmax_row(x + i * cols, cols);
	return 0;
}



/* One key row x (d, f32) of a unit: its score for every row that sees it (pass 0), or its
 * share of every such row's output (pass 1). Always inlined: the span rows and the rows of a
 * source's row callback go through the same arithmetic. */
__attribute__((always_inline)) static inline void
unit_key(const struct attn_rows *u, float *s, int64_t ld_s, int64_t k0, int64_t key,
	 const float *x, int d, float scale, int pass)
{
	if (!pass) {
		for (int r = 0; r < u->n; r += 4)
			scores4(s + r * ld_s + (key - k0), ld_s, u, r, key, x, d, scale);
		return;
	}
	for (int r = 0; r < u->n; r++) {
		if (key < u->lo[r] || key >= u->hi[r])
			continue;
		float pr = s[r * ld_s + (key - k0)], *o = u->o[r];
		#pragma omp simd
		for (int i = 0; i < d; i++)
			o[i] += pr * x[i];
	}
}

/* Runs a unit: keys [k0, k1) of src (KV head kvh) hold every row's range; s is scratch of
 * (n, k1 - k0) scores. Two passes over the keys: scores (then a softmax per row, copied out
 * where the row asks for its probabilities), then the weighted sum of V. Every sum of a row
 * runs in key order, whatever the other rows of the unit are, so a row's result does not
 * depend on how rows are grouped or threaded. */
CPU_HOT static void attn_unit(const struct attn_rows *u, float *s, const struct attn_src *src,
			      int64_t k0, int64_t k1, int kvh, const struct backend_attn *a)
{
	const int d = a->head_dim;
	const int64_t ld_s = k1 - k0;
	const size_t es = dtype_size(a->kv_dtype);
	float tmp[CPU_MAX_HEAD_DIM];
	for (int pass = 0; pass < 2; pass++) {
		if (pass == 1)
			for (int r = 0; r < u->n; r++) {
				softmax_row(s + r * ld_s + (u->lo[r] - k0), u->hi[r] - u->lo[r]);
				memset(u->o[r], 0, (size_t)d * sizeof *u->o[r]);
				for (int64_t j = 0; u->pr[r] && j < u->n_pr; j++)
					u->pr[r][j] = j >= u->lo[r] && j < u->hi[r] ?
							      s[r * ld_s + (j - k0)] : 0.0f;
			}
		int64_t base = 0; /* key index of the span's first row */
		if (src->row) {
			for (int64_t key = k0; key < k1 && key < src->n_row; key++)
				unit_key(u, s, ld_s, k0, key, src->row(src->arg, pass, key, kvh, tmp),
					 d, a->scale, pass);
			base = src->n_row;
		}
		for (int sp = 0; sp < src->n_spans && base < k1; sp++) {
			const struct backend_kv_span *span = &src->spans[sp];
			int64_t t0 = k0 > base ? k0 - base : 0;
			int64_t t1 = k1 - base < span->n ? k1 - base : span->n;
			const char *rows = (const char *)(pass ? span->v : span->k);
			const size_t pf = (size_t)(CPU_ATTN_PREFETCH * span->row_stride) * es;
			for (int64_t t = t0; t < t1; t++) {
				const int64_t key = base + t;
				const char *p = rows + (size_t)(t * span->row_stride +
								(int64_t)kvh * d) * es;
				if (t + CPU_ATTN_PREFETCH < t1)
					for (size_t b = 0; b < (size_t)d * es; b += 64)
						__builtin_prefetch(p + pf + b);
				unit_key(u, s, ld_s, k0, key, row_f32(tmp, p, a->kv_dtype, 0, d), d,
					 a->scale, pass);
			}
			base += span->n;
		}
	}
}

/* See backend_cpu_priv.h. The rows of one KV head are cut into units of at most
 * CPU_ATTN_ROWS rows (fewer when the keys are many, to bound the score scratch) and the units
 * of all heads spread over the threads. */
int cpu_attn_run(struct cpu_ctx *c, float *out, const float *q, int64_t n_q,
		 const struct attn_src *src, int64_t n_ctx, bool causal,
		 const struct backend_attn *a, float *probs, int64_t n_prob)
{
	const int d = a->head_dim, H = a->n_heads, KV = a->n_kv_heads, G = H / KV;
	int64_t max_keys = causal ? n_ctx : 0;
	for (int kvh = 0; kvh < KV && !causal; kvh++)
		max_keys = src[kvh].n > max_keys ? src[kvh].n : max_keys;
	int64_t R = CPU_ATTN_SCORES / max_keys;
	const int64_t rows = n_q * G; /* per KV head */
	R = R > CPU_ATTN_ROWS ? CPU_ATTN_ROWS : R < 1 ? 1 : R;
	R = R > rows ? rows : R;
	const int64_t units = (rows + R - 1) / R;
	const bool par = n_q * H * max_keys * d > CPU_PAR_MIN && units * KV > 1;
	const int nt = par ? omp_get_max_threads() : 1;
	float *scores = scratch_get(c, (size_t)nt * (size_t)(R * max_keys));
	if (!scores)
		return -ENOMEM;
	#pragma omp parallel for schedule(dynamic) num_threads(nt) if (par)
	for (int64_t task = 0; task < units * KV; task++) {
		const int kvh = (int)(task / units);
		const int64_t j0 = task % units * R, j1 = j0 + R < rows ? j0 + R : rows;
		struct attn_rows u = { .n = (int)(j1 - j0), .n_pr = n_prob };
		int64_t k0 = INT64_MAX, k1 = 0;
		for (int64_t j = j0; j < j1; j++) {
			const int64_t i = j / G, h = (int64_t)kvh * G + j % G, r = j - j0;
			u.q[r] = q + (i * H + h) * d;
			u.o[r] = out + (i * H + h) * d;
			u.hi[r] = causal ? n_ctx - n_q + i + 1 : src[kvh].n;
			u.lo[r] = causal && a->window > 0 && u.hi[r] > a->window ?
					  u.hi[r] - a->window : 0;
			u.pr[r] = probs && i == n_q - 1 ? probs + h * n_prob : NULL;
			k0 = u.lo[r] < k0 ? u.lo[r] : k0;
			k1 = u.hi[r] > k1 ? u.hi[r] : k1;
		}
		const int th = par ? omp_get_thread_num() : 0;
		float *s = scores + (size_t)th * (size_t)(R * max_keys);
		attn_unit(&u, s, &src[kvh], k0, k1, kvh, a);
	}
	return 0;
}

static int cpu_attn_prefill(void *ctx, float *out, const float *q, int64_t n_q, const void *k,
			    const void *v, int64_t n_ctx, const struct backend_attn *a)
{
	int ret = cpu_check_attn(a);
	if (ret)
		return ret;
	if (n_q > n_ctx)
		return -EINVAL;
	if (n_q <= 0)
		return 0;
	struct backend_kv_span span = { k, v, n_ctx, (int64_t)a->n_kv_heads * a->head_dim };
	struct attn_src *src = malloc((size_t)a->n_kv_heads * sizeof *src);
	if (!src)
		return -ENOMEM;
	for (int kvh = 0; kvh < a->n_kv_heads; kvh++)
		src[kvh] = (struct attn_src){ .spans = &span, .n_spans = 1, .n = n_ctx };
	ret = cpu_attn_run(ctx, out, q, n_q, src, n_ctx, true, a, NULL, 0);
	free(src);
	return ret;
}

static int cpu_attn_decode(void *ctx, float *out, const float *q,
			   const struct backend_kv_span *spans, int n_spans,
			   const struct backend_attn *a)
{
	int ret = cpu_check_attn(a);
	if (ret)
		return ret;
	int64_t n_keys = 0;
	for (int s = 0; s < n_spans; s++)
		n_keys += spans[s].n;
	if (n_keys <= 0)
		return -EINVAL;
	struct attn_src *src = malloc((size_t)a->n_kv_heads * sizeof *src);
	if (!src)
		return -ENOMEM;
	for (int kvh = 0; kvh < a->n_kv_heads; kvh++)
		src[kvh] = (struct attn_src){ .spans = spans, .n_spans = n_spans, .n = n_keys };
	ret = cpu_attn_run(ctx, out, q, 1, src, 0, false, a, NULL, 0);
	free(src);
	return ret;
}

int cpu_head_srcs(const struct backend_kv_span *spans, const int *first,
		  const struct backend_attn *a, struct attn_src **out)
{
	int ret = cpu_check_attn(a);
	if (ret)
		return ret;
	struct attn_src *src = malloc((size_t)a->n_kv_heads * sizeof *src);
	if (!src)
		return -ENOMEM;
	for (int g = 0; g < a->n_kv_heads && !ret; g++) {
		src[g] = (struct attn_src){ .spans = spans + first[g],
					    .n_spans = first[g + 1] - first[g] };
		if (first[g + 1] < first[g])
			ret = -EINVAL;
		for (int i = first[g]; i < first[g + 1] && !ret; i++)
			src[g].n += spans[i].n;
	}
	if (ret)
		free(src);
	else
		*out = src;
	return ret;
}

static int cpu_attn_decode_heads(void *ctx, float *out, const float *q,
				 const struct backend_kv_span *spans, const int *first,
				 const struct backend_attn *a)
{
	struct attn_src *src = NULL;
	int ret = cpu_head_srcs(spans, first, a, &src);
	for (int kvh = 0; !ret && kvh < a->n_kv_heads; kvh++)
		if (src[kvh].n <= 0)
			ret = -EINVAL;
	if (!ret)
		ret = cpu_attn_run(ctx, out, q, 1, src, 0, false, a, NULL, 0);
	free(src);
	return ret;
}

/* Grows the span tables of attn_decode_slots to n_spans spans and n_kv sources. */
static int slot_tables(struct cpu_ctx *c, size_t n_spans, int n_kv)
{
	if (n_spans > c->slot_spans_len) {
		struct backend_kv_span *p = realloc(c->slot_spans, n_spans * sizeof *p);
		if (!p)
			return -ENOMEM;
		c->slot_spans = p;
		c->slot_spans_len = n_spans;
	}
	if (n_kv > c->slot_src_len) {
		struct attn_src *p = realloc(c->slot_src, (size_t)n_kv * sizeof *p);
		if (!p)
			return -ENOMEM;
		c->slot_src = p;
		c->slot_src_len = n_kv;
	}
	return 0;
}

/* The slot list becomes one span per page (the slot's K rows, then its V rows, rows n_kv * d
 * apart) and one source per KV head, exactly the spans and sources attn_decode_heads would get
 * for the same rows: the same attn_run, so the same bits. */
static int cpu_attn_decode_slots(void *ctx, float *out, const float *q, const void *slots,
				 int n_slots, const int32_t *list, int max_pages,
				 const int32_t *n_tok, int p, const struct backend_attn *a)
{
	struct cpu_ctx *c = ctx;
	int ret = cpu_check_attn(a);
	if (ret)
		return ret;
	if (!cpu_kv_dtype_ok(a->kv_dtype) || !slots || !list || !n_tok || n_slots <= 0 ||
	    max_pages <= 0 || p <= 0)
		return -EINVAL;
	const int KV = a->n_kv_heads;
	size_t n_spans = 0;
	for (int h = 0; h < KV; h++) {
		if (n_tok[h] <= 0 || n_tok[h] > (int64_t)max_pages * p)
			return -EINVAL;
		const int pages = (n_tok[h] + p - 1) / p;
		for (int i = 0; i < pages; i++) {
			const int32_t sl = list[(size_t)h * max_pages + i];
			if (sl < 0 || sl >= n_slots)
				return -EINVAL;
		}
		n_spans += (size_t)pages;
	}
	if ((ret = slot_tables(c, n_spans, KV)))
		return ret;
	const int64_t row = (int64_t)KV * a->head_dim;
	const size_t es = dtype_size(a->kv_dtype), slot_bytes = (size_t)(2 * p) * (size_t)row * es;
	struct backend_kv_span *sp = c->slot_spans;
	for (int h = 0; h < KV; h++) {
		const int pages = (n_tok[h] + p - 1) / p;
		const int32_t *lh = list + (size_t)h * max_pages;
		for (int i = 0; i < pages; i++) {
			const char *sl = (const char *)slots + (size_t)lh[i] * slot_bytes;
			sp[i] = (struct backend_kv_span){
				.k = sl, .v = sl + (size_t)p * row * es,
				.n = i + 1 < pages ? p : n_tok[h] - (int64_t)(pages - 1) * p,
				.row_stride = row,
			};
		}
		c->slot_src[h] = (struct attn_src){ .spans = sp, .n_spans = pages, .n = n_tok[h] };
		sp += pages;
	}
	return cpu_attn_run(c, out, q, 1, c->slot_src, 0, false, a, NULL, 0);
}

/* Exactly the single calls, one item after the other. */
static int cpu_attn_decode_batch(void *ctx, float *out, const float *q,
				 const struct backend_attn_item *items, int n)
{
	for (int i = 0; i < n; i++) {
		const struct backend_attn_item *it = &items[i];
		const int64_t qd = (int64_t)it->a.n_heads * it->a.head_dim;
		float *o = out + it->row * qd;
		const float *qi = q + it->row * qd;
		int ret = it->slots ? cpu_attn_decode_slots(ctx, o, qi, it->slots, it->n_slots,
							    it->list, it->max_pages, it->n_tok,
							    it->p, &it->a)
				    : cpu_attn_decode(ctx, o, qi, &it->span, 1, &it->a);
		if (ret)
			return ret;
	}
	return 0;
}


static int cpu_upload(void *ctx, void *dst, const void *src, size_t bytes)
{
	return cpu_copy(ctx, dst, src, bytes);
}

static int cpu_download(void *ctx, void *dst, const void *src, size_t bytes)
{
	return cpu_copy(ctx, dst, src, bytes);
}

static int cpu_set_threads(void *ctx, int n)
{
	(void)ctx;
	if (n <= 0)
		return -EINVAL;
	omp_set_num_threads(n);
	return 0;
}

static int cpu_get_threads(void *ctx)
{
	(void)ctx;
	return omp_get_max_threads();
}

static const struct backend_ops cpu_ops = {
	.name = "cpu",
	.host_memory = true,
	.free = cpu_free,
	.buf_alloc = cpu_buf_alloc,
	.buf_free = cpu_buf_free,
	.upload = cpu_upload,
	.download = cpu_download,
	.copy = cpu_copy,
	.convert = cpu_convert,
	.gather_rows = cpu_gather_rows,
	.split_cols = cpu_split_cols,
	.weight_load = cpu_weight_load,
	.weight_load_rows = cpu_weight_load_rows,
	.weight_release = cpu_weight_release,
	.weight_concat = cpu_weight_concat,
	.matmul = cpu_matmul,
	.rmsnorm = cpu_rmsnorm,
	.rope = cpu_rope,
	.silu_mul = cpu_silu_mul,
	.add = cpu_add,
	.add_bias = cpu_add_bias,
	.embed = cpu_embed,
	.softmax = cpu_softmax,
	.attn_prefill = cpu_attn_prefill,
	.attn_decode = cpu_attn_decode,
	.attn_decode_heads = cpu_attn_decode_heads,
	.attn_decode_slots = cpu_attn_decode_slots,
	.attn_decode_batch = cpu_attn_decode_batch,
	.attn_scores = cpu_attn_scores,
	.attn_accum = cpu_attn_accum,
	.gather_heads = cpu_gather_heads,
	.recall_units = cpu_recall_units,
	.recall_direct = cpu_recall_direct,
	.recall_mapped = cpu_recall_direct, /* host memory is the device's: read where it lies */
	.recall_fragmented = cpu_recall_fragmented,
	.store_rows = cpu_store_rows,
	.round_to = cpu_round_to,
	.page_summary = cpu_page_summary,
	.select_pages = cpu_select_pages,
	.group_cosine = cpu_group_cosine,
	.host_alloc = cpu_host_alloc,
	.host_free = cpu_host_free,
	.fence_new = cpu_fence_new,
	.fence_free = cpu_fence_free,
	.download_async = cpu_download_async,
	.fence_wait = cpu_fence_wait,
	.fence_stream_wait = cpu_fence_stream_wait,
	.kivi_quant = cpu_kivi_quant,
	.kivi_dequant = cpu_kivi_dequant,
	.attn_kivi = cpu_attn_kivi,
	.sync = NULL,
	.set_threads = cpu_set_threads,
	.get_threads = cpu_get_threads,
};

int backend_cpu_new(struct backend **out, int threads)
{
	struct backend *be = calloc(1, sizeof *be);
	struct cpu_ctx *c = calloc(1, sizeof *c);
	if (!be || !c) {
		free(be);
		free(c);
		return -ENOMEM;
	}
	if (cpu_wmem_new(&c->wmem)) {
		free(be);
		free(c);
		return -ENOMEM;
	}
	be->ops = &cpu_ops;
	be->ctx = c;
	openblas_set_num_threads(1); /* see matmul_blocks */
	if (threads > 0)
		cpu_set_threads(c, threads);
	*out = be;
	return 0;
}

void backend_free(struct backend *be)
{
	if (!be)
		return;
	be->ops->free(be->ctx);
	free(be);
}
