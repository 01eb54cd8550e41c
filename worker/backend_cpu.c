/* backend_cpu — the reference backend: f32 compute on the host with OpenBLAS and OpenMP.
 *
 * Buffers are plain heap memory, weights are borrowed from the model mapping (weight_load copies
 * nothing). 16-bit weights are converted on the fly: a product with one row (decode) runs a
 * direct dot loop that converts a short chunk of a weight row at a time; a larger product
 * converts blocks of weight rows to f32 tiles and hands each to sgemm. Attention converts one
 * K/V row at a time. Scratch for those lives in one growing buffer owned by the context. */
#include "backend.h"

#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* Products with at most this many activation rows use the direct dot loop (measured: from 2
 * rows on, converted tiles + sgemm win). */
#define CPU_GEMV_MAX_ROWS 1
/* Elements of a weight row converted at once by the dot loop (stack buffer). */
#define CPU_DOT_CHUNK 256
/* Target size of one converted f32 weight tile for sgemm: about one core's L2 (measured best of
 * 256 KiB, 1 MiB, 4 MiB on the development machine). */
#define CPU_TILE_BYTES (1u << 20)
/* Below this many multiply-adds (or elements) an op runs on one thread: waking the pool costs
 * more than it saves. */
#define CPU_PAR_MIN (1 << 18)
/* Largest head_dim the stack buffers accept. */
#define CPU_MAX_HEAD_DIM 1024

struct cpu_ctx {
	float *scratch; /* tiles and attention scores */
	size_t scratch_len;
};

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

static void cpu_free(void *ctx)
{
	struct cpu_ctx *c = ctx;
	free(c->scratch);
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

static int cpu_weight_load(void *ctx, const struct fkv_tensor *src, struct backend_mat *dst)
{
	(void)ctx;
	if (!src->data)
		return -EINVAL;
	dst->data = src->data;
	dst->dtype = src->dtype;
	dst->rows = src->shape[0];
	dst->cols = src->n_dims == 2 ? src->shape[1] : 1;
	dst->priv = NULL;
	return 0;
}

static void cpu_weight_release(void *ctx, struct backend_mat *w)
{
	(void)ctx;
	memset(w, 0, sizeof *w);
}

/* Few activation rows, 16-bit weights: each weight row is read once, converted a chunk at a
 * time, and dotted with every activation row. */
static void matmul_dot(float *y, const float *x, const struct backend_mat *w, int64_t n)
{
	const int64_t rows = w->rows, cols = w->cols;
	const size_t es = dtype_size(w->dtype);
	#pragma omp parallel for schedule(static) if (rows * cols * n > CPU_PAR_MIN)
	for (int64_t r = 0; r < rows; r++) {
		float tmp[CPU_DOT_CHUNK];
		float acc[CPU_GEMV_MAX_ROWS] = { 0 };
		const char *wr = (const char *)w->data + (size_t)(r * cols) * es;
		for (int64_t c0 = 0; c0 < cols; c0 += CPU_DOT_CHUNK) {
			int64_t m = cols - c0 < CPU_DOT_CHUNK ? cols - c0 : CPU_DOT_CHUNK;
			cvt16(tmp, (const uint16_t *)wr + c0, w->dtype, m);
			for (int64_t j = 0; j < n; j++) {
				const float *xj = x + j * cols + c0;
				float s = 0.0f;
				#pragma omp simd reduction(+ : s)
				for (int64_t c = 0; c < m; c++)
					s += tmp[c] * xj[c];
				acc[j] += s;
			}
		}
		for (int64_t j = 0; j < n; j++)
			y[j * rows + r] = acc[j];
	}
}

/* Blocks of weight rows, one per task, each multiplied by one single-threaded sgemm (or
 * sgemv); 16-bit blocks are first converted into the task's thread's tile. OpenMP is the only
 * thread pool: OpenBLAS runs single-threaded inside the tasks, so the two pools never compete
 * for cores. */
static int matmul_blocks(struct cpu_ctx *c, float *y, const float *x, const struct backend_mat *w,
			 int64_t n)
{
	const int64_t rows = w->rows, cols = w->cols;
	const bool par = n * rows * cols > CPU_PAR_MIN;
	const int nt = par ? omp_get_max_threads() : 1;
	int64_t blk = (int64_t)(CPU_TILE_BYTES / sizeof(float)) / cols;
	if (blk > (rows + nt - 1) / nt)
		blk = (rows + nt - 1) / nt;
	if (blk < 16)
		blk = 16;
	float *tiles = NULL;
	if (w->dtype != FKV_F32 && !(tiles = scratch_get(c, (size_t)nt * (size_t)(blk * cols))))
		return -ENOMEM;
	const int64_t nblk = (rows + blk - 1) / blk;
	#pragma omp parallel for schedule(dynamic) num_threads(nt) if (par)
	for (int64_t b = 0; b < nblk; b++) {
		int64_t r0 = b * blk, m = rows - r0 < blk ? rows - r0 : blk;
		const float *wt = (const float *)w->data + r0 * cols;
		if (tiles) {
			float *t = tiles + (size_t)omp_get_thread_num() * (size_t)(blk * cols);
			cvt16(t, (const uint16_t *)w->data + r0 * cols, w->dtype, m * cols);
			wt = t;
		}
		/* y[:, r0:r0+m] (n, m) = x (n, cols) · wtᵀ, wt (m, cols) */
		if (n == 1)
			cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)m, (int)cols, 1.0f, wt,
				    (int)cols, x, 1, 0.0f, y + r0, 1);
		else
			cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)m,
				    (int)cols, 1.0f, x, (int)cols, wt, (int)cols, 0.0f, y + r0,
				    (int)rows);
	}
	return 0;
}

static int cpu_matmul(void *ctx, float *y, const float *x, const struct backend_mat *w, int64_t n)
{
	if (n <= 0)
		return 0;
	if (w->dtype != FKV_F32 && n <= CPU_GEMV_MAX_ROWS) {
		matmul_dot(y, x, w, n);
		return 0;
	}
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
	for (int64_t i = 0; i < n; i++)
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

/* Attention scores accumulate in double: the sum is then independent of the order of the
 * head dimensions to f32 precision, so both rotary layouts of one model agree. */
static inline float dot(const float *a, const float *b, int n)
{
	double s = 0.0;
	#pragma omp simd reduction(+ : s)
	for (int i = 0; i < n; i++)
		s += (double)a[i] * b[i];
	return (float)s;
}

/* Where an attention call reads keys from: the decode spans, or one dense span for prefill. */
struct attn_src {
	const struct backend_kv_span *spans;
	int n_spans;
};

/* One query head q (d) against keys [k0, n_keys) of src (KV head kvh): scores into s
 * (n_keys - k0), output into o (d). */
static void attn_head(float *o, const float *q, float *s, const struct attn_src *src,
		      int64_t k0, int64_t n_keys, int kvh, const struct backend_attn *a)
{
	const int d = a->head_dim;
	const size_t es = dtype_size(a->kv_dtype);
	float tmp[CPU_MAX_HEAD_DIM];
	int64_t base = 0; /* key index of the span's first row */
	for (int pass = 0; pass < 2; pass++) {
		base = 0;
		if (pass == 1) {
			softmax_row(s, n_keys - k0);
			memset(o, 0, (size_t)d * sizeof *o);
		}
		for (int sp = 0; sp < src->n_spans && base < n_keys; sp++) {
			const struct backend_kv_span *span = &src->spans[sp];
			int64_t t0 = k0 > base ? k0 - base : 0;
			int64_t t1 = n_keys - base < span->n ? n_keys - base : span->n;
			const char *rows = (const char *)(pass ? span->v : span->k);
			for (int64_t t = t0; t < t1; t++) {
				const char *r = rows + (size_t)(t * span->row_stride +
								(int64_t)kvh * d) * es;
				const float *x = row_f32(tmp, r, a->kv_dtype, 0, d);
				if (!pass) {
					s[base + t - k0] = dot(q, x, d) * a->scale;
				} else {
					float p = s[base + t - k0];
					for (int i = 0; i < d; i++)
						o[i] += p * x[i];
				}
			}
			base += span->n;
		}
	}
}

static int check_attn(const struct backend_attn *a)
{
	if (a->head_dim <= 0 || a->head_dim > CPU_MAX_HEAD_DIM || a->n_kv_heads <= 0 ||
	    a->n_heads % a->n_kv_heads || a->window < 0)
		return -EINVAL;
	return 0;
}

static int cpu_attn_prefill(void *ctx, float *out, const float *q, int64_t n_q, const void *k,
			    const void *v, int64_t n_ctx, const struct backend_attn *a)
{
	struct cpu_ctx *c = ctx;
	int ret = check_attn(a);
	if (ret)
		return ret;
	if (n_q > n_ctx)
		return -EINVAL;
	const int d = a->head_dim, H = a->n_heads, G = a->n_heads / a->n_kv_heads;
	int nt = omp_get_max_threads();
	float *scores = scratch_get(c, (size_t)nt * (size_t)n_ctx);
	if (!scores)
		return -ENOMEM;
	struct backend_kv_span span = { k, v, n_ctx, (int64_t)a->n_kv_heads * d };
	struct attn_src src = { &span, 1 };
	#pragma omp parallel for collapse(2) schedule(dynamic, 4) \
		if (n_q * n_ctx * H * d > CPU_PAR_MIN)
	for (int64_t i = 0; i < n_q; i++)
		for (int h = 0; h < H; h++) {
			float *s = scores + (size_t)omp_get_thread_num() * (size_t)n_ctx;
			int64_t last = n_ctx - n_q + i; /* this query's own position */
			int64_t k0 = a->window > 0 && last + 1 > a->window ? last + 1 - a->window : 0;
			attn_head(out + (i * H + h) * d, q + (i * H + h) * d, s, &src, k0, last + 1,
				  h / G, a);
		}
	return 0;
}

static int cpu_attn_decode(void *ctx, float *out, const float *q,
			   const struct backend_kv_span *spans, int n_spans,
			   const struct backend_attn *a)
{
	struct cpu_ctx *c = ctx;
	int ret = check_attn(a);
	if (ret)
		return ret;
	int64_t n_keys = 0;
	for (int s = 0; s < n_spans; s++)
		n_keys += spans[s].n;
	if (n_keys <= 0)
		return -EINVAL;
	const int d = a->head_dim, H = a->n_heads, G = a->n_heads / a->n_kv_heads;
	float *scores = scratch_get(c, (size_t)H * (size_t)n_keys);
	if (!scores)
		return -ENOMEM;
	struct attn_src src = { spans, n_spans };
	#pragma omp parallel for schedule(static) if (n_keys * H * d > CPU_PAR_MIN)
	for (int h = 0; h < H; h++)
		attn_head(out + h * d, q + h * d, scores + (size_t)h * (size_t)n_keys, &src, 0,
			  n_keys, h / G, a);
	return 0;
}

static int cpu_attn_decode_heads(void *ctx, float *out, const float *q,
				 const struct backend_kv_span *spans, const int *first,
				 const struct backend_attn *a)
{
	struct cpu_ctx *c = ctx;
	int ret = check_attn(a);
	if (ret)
		return ret;
	const int d = a->head_dim, H = a->n_heads, G = a->n_heads / a->n_kv_heads;
	int64_t max_keys = 0;
	for (int kvh = 0; kvh < a->n_kv_heads; kvh++) {
		int64_t n = 0;
		if (first[kvh + 1] < first[kvh])
			return -EINVAL;
		for (int s = first[kvh]; s < first[kvh + 1]; s++)
			n += spans[s].n;
		if (n <= 0)
			return -EINVAL;
		max_keys = n > max_keys ? n : max_keys;
	}
	float *scores = scratch_get(c, (size_t)H * (size_t)max_keys);
	if (!scores)
		return -ENOMEM;
	#pragma omp parallel for schedule(static) if (max_keys * H * d > CPU_PAR_MIN)
	for (int h = 0; h < H; h++) {
		int kvh = h / G;
		struct attn_src src = { spans + first[kvh], first[kvh + 1] - first[kvh] };
		int64_t n = 0;
		for (int s = 0; s < src.n_spans; s++)
			n += src.spans[s].n;
		attn_head(out + h * d, q + h * d, scores + (size_t)h * (size_t)max_keys, &src, 0, n,
			  kvh, a);
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
	.free = cpu_free,
	.buf_alloc = cpu_buf_alloc,
	.buf_free = cpu_buf_free,
	.upload = cpu_upload,
	.download = cpu_download,
	.copy = cpu_copy,
	.convert = cpu_convert,
	.gather_rows = cpu_gather_rows,
	.weight_load = cpu_weight_load,
	.weight_release = cpu_weight_release,
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
