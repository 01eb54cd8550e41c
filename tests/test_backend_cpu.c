/* Tests for worker/backend/backend_cpu.c: every op of the CPU backend against naive float64 loops in
 * this file, on random inputs, for every weight / KV dtype, covering each internal path
 * (sgemv, direct dot loop and its eight-lane conversion, converted tiles; dense, strided and
 * paged attention spans, per-head slot lists, prefill units of several sizes; refreshkv's
 * scores/accum split of decode attention), and results equal bit for bit across thread counts. */
#include "test_util.h"

#include <errno.h>
#include <math.h>
#include <sys/mman.h>

#include "cpu_dot16.h"
#include "cpu_gemm.h"
#include "cpu_wmem.h"
#include "layout.h"
#include "test_backend.h"

static uint64_t seed = 0x5eed;

static const enum fkv_dtype dtypes[] = { FKV_F32, FKV_F16, FKV_BF16 };

static float *randv(int64_t n, float scale)
{
	float *v = malloc((size_t)n * sizeof *v);
	assert_non_null(v);
	for (int64_t i = 0; i < n; i++)
		v[i] = test_randf(&seed) * scale;
	return v;
}

/* Random tensor of dtype t, plus its exact values as double (what the op must compute with). */
static void *rand_typed(enum fkv_dtype t, int64_t n, double **exact)
{
	float *f = randv(n, 1.0f);
	void *d = malloc((size_t)n * dtype_size(t));
	assert_non_null(d);
	dtype_from_f32(d, f, t, (size_t)n);
	dtype_to_f32(f, d, t, (size_t)n);
	*exact = malloc((size_t)n * sizeof **exact);
	assert_non_null(*exact);
	for (int64_t i = 0; i < n; i++)
		(*exact)[i] = f[i];
	free(f);
	return d;
}

static struct backend_mat mat(const void *data, enum fkv_dtype t, int64_t rows, int64_t cols)
{
	struct fkv_tensor src = { .data = data, .dtype = t, .n_dims = cols > 1 ? 2 : 1, .shape = { rows, cols } };
	struct backend_mat m;
	assert_int_equal(be->ops->weight_load(be->ctx, &src, &m), 0);
	return m;
}

static void check_matmul(enum fkv_dtype t, int64_t n, int64_t rows, int64_t cols)
{
	double *w64;
	void *w = rand_typed(t, rows * cols, &w64);
	float *x = randv(n * cols, 1.0f);
	float *y = malloc((size_t)(n * rows) * sizeof *y);
	double *ref = malloc((size_t)(n * rows) * sizeof *ref);
	for (int64_t i = 0; i < n; i++)
		for (int64_t r = 0; r < rows; r++) {
			double s = 0.0;
			for (int64_t c = 0; c < cols; c++)
				s += w64[r * cols + c] * x[i * cols + c];
			ref[i * rows + r] = s;
		}
	struct backend_mat m = mat(w, t, rows, cols);
	assert_int_equal(be->ops->matmul(be->ctx, y, x, &m, n), 0);
	double e = nerr(y, ref, n * rows);
	if (e > 1e-5)
		fail_msg("matmul %s n=%lld %lldx%lld: error %g", dtype_name(t), (long long)n,
			 (long long)rows, (long long)cols, e);
	be->ops->weight_release(be->ctx, &m);
	free(w);
	free(w64);
	free(x);
	free(y);
	free(ref);
}

static void test_matmul(void **state)
{
	(void)state;
	static const int64_t ns[] = { 1, 3, 8, 9, 37 };
	for (size_t i = 0; i < 3; i++)
		for (size_t j = 0; j < sizeof ns / sizeof *ns; j++)
			check_matmul(dtypes[i], ns[j], 67, 300);
	/* Fewer weight rows than one group of the dot loop. */
	for (size_t i = 0; i < 3; i++)
		check_matmul(dtypes[i], 1, 3, 5);
	/* Several converted tiles (tile = 1 MiB of f32 rows). */
	check_matmul(FKV_BF16, 9, 4000, 300);
	check_matmul(FKV_F16, 12, 4000, 300);
	/* Several column chunks of the 16-bit GEMM (CPU_GEMM_KC), with a short last one. */
	check_matmul(FKV_F16, 7, 41, 2 * CPU_GEMM_KC + 37);
	check_matmul(FKV_BF16, 13, 9, 3 * CPU_GEMM_KC);
}

/* A product of one or two rows gives each row the bits it gets alone (CPU_GEMV_MAX_ROWS): a
 * specache step runs its real row beside a speculative one and must equal a one-row step. Every
 * weight dtype, below and above the threading threshold, on odd row counts (a short last group
 * of the dot loop). */
static void test_matmul_rows_alone(void **state)
{
	(void)state;
	static const int64_t shapes[][2] = { { 67, 300 }, { 701, 1000 }, { 5, 64 } };
	for (size_t t = 0; t < 3; t++)
		for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
			const int64_t rows = shapes[i][0], cols = shapes[i][1];
			double *w64;
			void *w = rand_typed(dtypes[t], rows * cols, &w64);
			float *x = randv(2 * cols, 1.0f), *y2 = malloc((size_t)(2 * rows) * 4);
			float *y1 = malloc((size_t)rows * 4);
			assert_true(y1 && y2);
			struct backend_mat m = mat(w, dtypes[t], rows, cols);
			assert_int_equal(be->ops->matmul(be->ctx, y2, x, &m, 2), 0);
			for (int j = 0; j < 2; j++) {
				assert_int_equal(be->ops->matmul(be->ctx, y1, x + j * cols, &m, 1), 0);
				if (memcmp(y1, y2 + j * rows, (size_t)rows * 4))
					fail_msg("matmul %s %lldx%lld: row %d of two differs from it "
						 "alone", dtype_name(dtypes[t]), (long long)rows,
						 (long long)cols, j);
			}
			be->ops->weight_release(be->ctx, &m);
			free(w);
			free(w64);
			free(x);
			free(y1);
			free(y2);
		}
}

/* The AVX2/F16C decode GEMV (cpu_dot16.c) against the portable loop it replaces: the same bits,
 * for both 16-bit dtypes, one and two activation rows, row counts that leave a short last group
 * of four and column counts that leave a scalar tail. */
static void test_matmul_dot16_equals_portable(void **state)
{
	(void)state;
	cpu_dot16_enable(true);
	if (!cpu_dot16_usable()) {
		printf("skipped: this CPU lacks AVX2, FMA or F16C, so only the portable loop runs\n");
		return;
	}
	static const int64_t shapes[][2] = { { 67, 300 }, { 701, 1000 }, { 5, 64 }, { 3, 5 },
					     { 130, 2051 } };
	static const enum fkv_dtype t16[] = { FKV_F16, FKV_BF16 };
	for (size_t t = 0; t < 2; t++)
		for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
			for (int64_t n = 1; n <= 2; n++) {
				const int64_t rows = shapes[i][0], cols = shapes[i][1];
				double *w64;
				void *w = rand_typed(t16[t], rows * cols, &w64);
				float *x = randv(n * cols, 1.0f);
				float *ya = malloc((size_t)(n * rows) * 4), *yb = malloc((size_t)(n * rows) * 4);
				assert_true(ya && yb);
				struct backend_mat m = mat(w, t16[t], rows, cols);
				cpu_dot16_enable(false);
				assert_int_equal(be->ops->matmul(be->ctx, ya, x, &m, n), 0);
				cpu_dot16_enable(true);
				assert_int_equal(be->ops->matmul(be->ctx, yb, x, &m, n), 0);
				for (int64_t k = 0; k < n * rows; k++)
					if (memcmp(&ya[k], &yb[k], 4))
						fail_msg("matmul %s %lldx%lld n=%lld: element %lld is %a "
							 "portable, %a with AVX2", dtype_name(t16[t]),
							 (long long)rows, (long long)cols, (long long)n,
							 (long long)k, ya[k], yb[k]);
				be->ops->weight_release(be->ctx, &m);
				free(w);
				free(w64);
				free(x);
				free(ya);
				free(yb);
			}
}

/* The AVX-512 prefill GEMM on 16-bit weights (cpu_gemm.c) against its scalar reference: the
 * same bits, directly on row ranges and through matmul, for both dtypes, every count of
 * activation rows in a register tile (3 .. 14: full tiles of six and each short one), weight
 * row counts that leave a short group of four, and columns that end in a masked step, inside
 * the first chunk or past several. */
static void test_matmul_gemm_equals_ref(void **state)
{
	(void)state;
	cpu_gemm_enable(true);
	if (!cpu_gemm_usable(FKV_F16, FKV_QNONE)) {
		printf("skipped: this CPU lacks AVX-512, so converted tiles + sgemm run\n");
		return;
	}
	static const int64_t shapes[][2] = { { 67, 300 }, { 130, 2051 }, { 5, 16 }, { 3, 5 },
					     { 64, CPU_GEMM_KC }, { 9, 2 * CPU_GEMM_KC + 1 } };
	static const enum fkv_dtype t16[] = { FKV_F16, FKV_BF16 };
	for (size_t t = 0; t < 2; t++)
		for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
			for (int64_t n = 3; n <= 14; n++) {
				const int64_t rows = shapes[i][0], cols = shapes[i][1];
				double *w64;
				uint16_t *w = rand_typed(t16[t], rows * cols, &w64);
				float *x = randv(n * cols, 1.0f);
				float *ya = malloc((size_t)(n * rows) * 4), *yb = malloc((size_t)(n * rows) * 4);
				float *yc = malloc((size_t)(n * rows) * 4);
				assert_true(ya && yb && yc);
				assert_int_equal(cpu_gemm_ref(ya, rows, x, n, w, t16[t], FKV_QNONE, cols, 0, rows), 0);
				/* two row ranges, the first ending inside a group of four */
				const int64_t cut = rows > 6 ? 6 : rows;
				cpu_gemm_rows(yb, rows, x, n, w, t16[t], FKV_QNONE, cols, 0, cut);
				cpu_gemm_rows(yb, rows, x, n, w, t16[t], FKV_QNONE, cols, cut, rows);
				struct backend_mat m = mat(w, t16[t], rows, cols);
				assert_int_equal(be->ops->matmul(be->ctx, yc, x, &m, n), 0);
				for (int64_t k = 0; k < n * rows; k++)
					if (memcmp(&ya[k], &yb[k], 4) || memcmp(&ya[k], &yc[k], 4))
						fail_msg("gemm %s %lldx%lld n=%lld: element %lld is %a "
							 "in the reference, %a by the kernel, %a by matmul",
							 dtype_name(t16[t]), (long long)rows,
							 (long long)cols, (long long)n, (long long)k,
							 ya[k], yb[k], yc[k]);
				be->ops->weight_release(be->ctx, &m);
				free(w);
				free(w64);
				free(x);
				free(ya);
				free(yb);
				free(yc);
			}
}

/* The backend's own 16-bit conversion (used by every op) on all 65536 patterns, through the
 * dot path (n = 1, 2) and the tile path (n = 3): y = w · 1 must be exactly w. */
static void test_matmul_all_16bit_patterns(void **state)
{
	(void)state;
	uint16_t *w = malloc(65536 * sizeof *w);
	float x[3] = { 1.0f, 1.0f, 1.0f }, *y = malloc(3 * 65536 * sizeof *y);
	assert_true(w && y);
	for (int i = 0; i < 65536; i++)
		w[i] = (uint16_t)i;
	for (size_t t = 1; t < 3; t++) {
		struct backend_mat m = mat(w, dtypes[t], 65536, 1);
		for (int n = 1; n <= 3; n++) {
			assert_int_equal(be->ops->matmul(be->ctx, y, x, &m, n), 0);
			for (int i = 0; i < 65536 * n; i++) {
				float want;
				dtype_to_f32(&want, &w[i % 65536], dtypes[t], 1);
				if (isnan(want) ? !isnan(y[i]) : y[i] != want)
					fail_msg("%s pattern 0x%04x (n=%d): got %g, want %g",
						 dtype_name(dtypes[t]), i % 65536, n, y[i], want);
			}
		}
	}
	/* The same through the eight-lane conversion of the dot loop: row i is (pattern i, 0, ...,
	 * 0), the activation (1, 0, ..., 0). */
	uint16_t *w8 = calloc(65536 * 8, sizeof *w8);
	float x8[8] = { 1.0f };
	assert_non_null(w8);
	for (int i = 0; i < 65536; i++)
		w8[i * 8] = (uint16_t)i;
	for (size_t t = 1; t < 3; t++) {
		struct backend_mat m = mat(w8, dtypes[t], 65536, 8);
		assert_int_equal(be->ops->matmul(be->ctx, y, x8, &m, 1), 0);
		for (int i = 0; i < 65536; i++) {
			float want;
			dtype_to_f32(&want, &w[i], dtypes[t], 1);
			if (isnan(want) ? !isnan(y[i]) : y[i] != want)
				fail_msg("%s pattern 0x%04x (8 lanes): got %g, want %g",
					 dtype_name(dtypes[t]), i, y[i], want);
		}
		be->ops->weight_release(be->ctx, &m);
	}
	free(w8);
	free(w);
	free(y);
}

static void test_rmsnorm(void **state)
{
	(void)state;
	const int64_t n = 5, dim = 97;
	const float eps = 1e-5f;
	for (size_t t = 0; t < 3; t++) {
		double *w64;
		void *w = rand_typed(dtypes[t], dim, &w64);
		float *x = randv(n * dim, 3.0f);
		float *y = malloc((size_t)(n * dim) * sizeof *y);
		double *ref = malloc((size_t)(n * dim) * sizeof *ref);
		for (int64_t i = 0; i < n; i++) {
			double ss = 0.0;
			for (int64_t j = 0; j < dim; j++)
				ss += (double)x[i * dim + j] * x[i * dim + j];
			double r = 1.0 / sqrt(ss / dim + eps);
			for (int64_t j = 0; j < dim; j++)
				ref[i * dim + j] = x[i * dim + j] * r * w64[j];
		}
		struct backend_mat m = mat(w, dtypes[t], dim, 1);
		assert_int_equal(be->ops->rmsnorm(be->ctx, y, x, &m, n, dim, eps), 0);
		assert_true(nerr(y, ref, n * dim) < 1e-6);
		/* In place gives the same. */
		assert_int_equal(be->ops->rmsnorm(be->ctx, x, x, &m, n, dim, eps), 0);
		assert_memory_equal(x, y, (size_t)(n * dim) * sizeof *y);
		free(w);
		free(w64);
		free(x);
		free(y);
		free(ref);
	}
}

/* Rotation angle of pair i at position pos, written from the Llama 3.1 reference recipe. */
static double ref_angle(const struct backend_rope *r, int i, int d, int pos)
{
	double inv = 1.0 / pow(r->theta, (2.0 * i) / d);
	if (r->scaling_factor > 0) {
		double wl = 2 * M_PI / inv;
		double lo = r->original_ctx / r->low_freq_factor;
		double hi = r->original_ctx / r->high_freq_factor;
		if (wl > lo) {
			inv = inv / r->scaling_factor;
		} else if (wl >= hi) {
			double sm = (r->original_ctx / wl - r->low_freq_factor) /
				    (r->high_freq_factor - r->low_freq_factor);
			inv = (1 - sm) * inv / r->scaling_factor + sm * inv;
		}
	}
	return pos * inv;
}

static void check_rope(const struct backend_rope *r)
{
	const int n = 6, H = 3, d = 64;
	float *x = randv(n * H * d, 1.0f);
	double *ref = malloc((size_t)(n * H * d) * sizeof *ref);
	int32_t pos[6] = { 0, 1, 7, 500, 8191, 100000 };
	for (int t = 0; t < n; t++)
		for (int h = 0; h < H; h++) {
			const float *v = x + (t * H + h) * d;
			double *o = ref + (t * H + h) * d;
			for (int i = 0; i < d / 2; i++) {
				int a = r->style == FKV_ROPE_HALVES ? i : 2 * i;
				int b = r->style == FKV_ROPE_HALVES ? i + d / 2 : 2 * i + 1;
				double th = ref_angle(r, i, d, pos[t]);
				o[a] = v[a] * cos(th) - v[b] * sin(th);
				o[b] = v[a] * sin(th) + v[b] * cos(th);
			}
		}
	assert_int_equal(be->ops->rope(be->ctx, x, n, H, d, pos, r), 0);
	double e = nerr(x, ref, n * H * d);
	if (e > 1e-5)
		fail_msg("rope style %d scaling %g: error %g", r->style, r->scaling_factor, e);
	free(x);
	free(ref);
}

static void test_rope(void **state)
{
	(void)state;
	struct backend_rope r = { FKV_ROPE_INTERLEAVED, 10000.0f, 0, 0, 0, 0 };
	check_rope(&r);
	r.style = FKV_ROPE_HALVES;
	check_rope(&r);
	struct backend_rope l3 = { FKV_ROPE_HALVES, 500000.0f, 8.0f, 1.0f, 4.0f, 8192 };
	check_rope(&l3);
	l3.style = FKV_ROPE_INTERLEAVED;
	check_rope(&l3);
	/* Scaling changes the result (the test would notice scaling being ignored). */
	float a[64], b[64];
	for (int i = 0; i < 64; i++)
		a[i] = b[i] = test_randf(&seed);
	int32_t p = 100000;
	r.theta = 500000.0f;
	be->ops->rope(be->ctx, a, 1, 1, 64, &p, &r);
	be->ops->rope(be->ctx, b, 1, 1, 64, &p, &l3);
	assert_memory_not_equal(a, b, sizeof a);
	assert_int_equal(be->ops->rope(be->ctx, a, 1, 1, 63, &p, &r), -EINVAL);
}

static void test_elementwise(void **state)
{
	(void)state;
	const int64_t n = 1000, rows = 10, cols = 100;
	float *g = randv(n, 4.0f), *u = randv(n, 2.0f), *o = malloc(n * sizeof *o);
	double *ref = malloc(n * sizeof *ref);
	for (int64_t i = 0; i < n; i++)
		ref[i] = g[i] / (1.0 + exp(-(double)g[i])) * u[i];
	assert_int_equal(be->ops->silu_mul(be->ctx, o, g, u, n), 0);
	assert_true(nerr(o, ref, n) < 1e-6);
	for (int64_t i = 0; i < n; i++)
		ref[i] = (double)o[i] + g[i];
	assert_int_equal(be->ops->add(be->ctx, o, g, n), 0);
	assert_true(nerr(o, ref, n) < 1e-7);
	for (size_t t = 0; t < 3; t++) {
		double *b64;
		void *b = rand_typed(dtypes[t], cols, &b64);
		struct backend_mat bm = mat(b, dtypes[t], cols, 1);
		for (int64_t i = 0; i < n; i++)
			ref[i] = (double)o[i] + b64[i % cols];
		assert_int_equal(be->ops->add_bias(be->ctx, o, &bm, rows), 0);
		assert_true(nerr(o, ref, n) < 1e-7);
		free(b);
		free(b64);
	}
	/* softmax */
	float *x = randv(n, 10.0f);
	for (int64_t r = 0; r < rows; r++) {
		double mx = -INFINITY, s = 0;
		for (int64_t j = 0; j < cols; j++)
			mx = fmax(mx, x[r * cols + j]);
		for (int64_t j = 0; j < cols; j++)
			s += exp(x[r * cols + j] - mx);
		for (int64_t j = 0; j < cols; j++)
			ref[r * cols + j] = exp(x[r * cols + j] - mx) / s;
	}
	assert_int_equal(be->ops->softmax(be->ctx, x, rows, cols), 0);
	assert_true(nerr(x, ref, n) < 1e-6);
	free(g);
	free(u);
	free(o);
	free(ref);
	free(x);
}

static void test_embed_gather_convert(void **state)
{
	(void)state;
	const int64_t V = 50, dim = 33;
	int32_t ids[4] = { 0, 49, 7, 7 };
	float out[4 * 33];
	double ref[4 * 33];
	for (size_t t = 0; t < 3; t++) {
		double *e64;
		void *e = rand_typed(dtypes[t], V * dim, &e64);
		struct backend_mat m = mat(e, dtypes[t], V, dim);
		assert_int_equal(be->ops->embed(be->ctx, out, &m, ids, 4), 0);
		for (int i = 0; i < 4; i++)
			for (int j = 0; j < dim; j++)
				ref[i * dim + j] = e64[ids[i] * dim + j];
		assert_true(nerr(out, ref, 4 * dim) == 0.0);
		be->ops->weight_release(be->ctx, &m);
		free(e);
		free(e64);
	}
	/* gather_rows picks rows by index. */
	float src[5 * 3], dst[2 * 3];
	for (int i = 0; i < 15; i++)
		src[i] = (float)i;
	int32_t idx[2] = { 4, 1 };
	assert_int_equal(be->ops->gather_rows(be->ctx, dst, src, 3, idx, 2), 0);
	assert_true(dst[0] == 12.0f && dst[2] == 14.0f && dst[3] == 3.0f && dst[5] == 5.0f);
	/* convert, upload/download round trip through a backend buffer. */
	for (size_t t = 0; t < 3; t++) {
		float *f = randv(100, 1.0f);
		void *buf = be->ops->buf_alloc(be->ctx, 100 * dtype_size(dtypes[t]));
		assert_non_null(buf);
		assert_int_equal(be->ops->convert(be->ctx, buf, dtypes[t], f, 100), 0);
		uint16_t host[200];
		assert_int_equal(be->ops->download(be->ctx, host, buf, 100 * dtype_size(dtypes[t])), 0);
		float back[100];
		dtype_to_f32(back, host, dtypes[t], 100);
		for (int i = 0; i < 100; i++)
			assert_true(fabsf(back[i] - f[i]) <= (dtypes[t] == FKV_BF16 ? 4e-3f : 1e-3f));
		be->ops->buf_free(be->ctx, buf);
		free(f);
	}
}

/* Reference attention of one query head against keys 0..nk-1 given as double rows. */
static void ref_attn(double *o, const float *q, const double *k, const double *v, int64_t nk,
		     int64_t kstride, int d, double scale)
{
	double *s = malloc((size_t)nk * sizeof *s), mx = -INFINITY, sum = 0;
	for (int64_t j = 0; j < nk; j++) {
		s[j] = 0;
		for (int i = 0; i < d; i++)
			s[j] += q[i] * k[j * kstride + i];
		s[j] *= scale;
		mx = fmax(mx, s[j]);
	}
	for (int64_t j = 0; j < nk; j++)
		sum += (s[j] = exp(s[j] - mx));
	for (int i = 0; i < d; i++) {
		o[i] = 0;
		for (int64_t j = 0; j < nk; j++)
			o[i] += s[j] / sum * v[j * kstride + i];
	}
	free(s);
}

static void test_attn_prefill(void **state)
{
	(void)state;
	const int H = 8, KV = 2, d = 16;
	/* A chunk of 70 queries after 130 cached tokens; large enough for the threaded path. */
	const int64_t n_ctx = 200, n_q = 70;
	static const int64_t windows[] = { 0, 17 };
	for (size_t t = 0; t < 3; t++)
		for (size_t wi = 0; wi < 2; wi++) {
			int64_t W = windows[wi];
			struct backend_attn a = { H, KV, d, dtypes[t], 1.0f / sqrtf(d), W };
			double *k64, *v64;
			void *k = rand_typed(dtypes[t], n_ctx * KV * d, &k64);
			void *v = rand_typed(dtypes[t], n_ctx * KV * d, &v64);
			float *q = randv(n_q * H * d, 2.0f), *out = malloc((size_t)(n_q * H * d) * 4);
			double *ref = malloc((size_t)(n_q * H * d) * sizeof *ref);
			for (int64_t i = 0; i < n_q; i++)
				for (int h = 0; h < H; h++) {
					int kvh = h / (H / KV);
					int64_t last = n_ctx - n_q + i;
					int64_t j0 = W && last + 1 > W ? last + 1 - W : 0;
					ref_attn(ref + (i * H + h) * d, q + (i * H + h) * d,
						 k64 + j0 * KV * d + kvh * d, v64 + j0 * KV * d + kvh * d,
						 last + 1 - j0, KV * d, d, a.scale);
				}
			assert_int_equal(be->ops->attn_prefill(be->ctx, out, q, n_q, k, v, n_ctx, &a),
					 0);
			double e = nerr(out, ref, n_q * H * d);
			if (e > 1e-5)
				fail_msg("attn_prefill %s window %lld: error %g", dtype_name(dtypes[t]),
					 (long long)W, e);
			assert_int_equal(be->ops->attn_prefill(be->ctx, out, q, n_ctx + 1, k, v, n_ctx,
							       &a), -EINVAL);
			free(k);
			free(v);
			free(k64);
			free(v64);
			free(q);
			free(out);
			free(ref);
		}
}

static void test_attn_decode(void **state)
{
	(void)state;
	/* Spans interleave with other data (stride); large enough for the threaded path. */
	enum { H = 16, KV = 4, d = 64, stride = 3 * KV * d };
	const int64_t lens[3] = { 50, 1, 300 }, total = 351;
	for (size_t t = 0; t < 3; t++) {
		struct backend_attn a = { H, KV, d, dtypes[t], 0.3f, 0 };
		struct backend_kv_span spans[3];
		double *k64 = malloc((size_t)(total * KV * d) * sizeof *k64);
		double *v64 = malloc((size_t)(total * KV * d) * sizeof *v64);
		void *store[6];
		double *ex[6];
		int64_t row = 0;
		for (int s = 0; s < 3; s++) {
			store[2 * s] = rand_typed(dtypes[t], lens[s] * stride, &ex[2 * s]);
			store[2 * s + 1] = rand_typed(dtypes[t], lens[s] * stride, &ex[2 * s + 1]);
			spans[s] = (struct backend_kv_span){ store[2 * s], store[2 * s + 1], lens[s],
							     stride };
			for (int64_t j = 0; j < lens[s]; j++, row++)
				for (int i = 0; i < KV * d; i++) {
					k64[row * KV * d + i] = ex[2 * s][j * stride + i];
					v64[row * KV * d + i] = ex[2 * s + 1][j * stride + i];
				}
		}
		float *q = randv(H * d, 0.5f), out[H * d];
		double ref[H * d];
		for (int h = 0; h < H; h++)
			ref_attn(ref + h * d, q + h * d, k64 + (h / (H / KV)) * d,
				 v64 + (h / (H / KV)) * d, total, KV * d, d, a.scale);
		assert_int_equal(be->ops->attn_decode(be->ctx, out, q, spans, 3, &a), 0);
		double e = nerr(out, ref, H * d);
		if (e > 1e-5)
			fail_msg("attn_decode %s: error %g", dtype_name(dtypes[t]), e);
		for (int i = 0; i < 6; i++) {
			free(store[i]);
			free(ex[i]);
		}
		free(k64);
		free(v64);
		free(q);
	}
}

/* Per-head key sets: every KV head reads its own spans of one shared NHD pool; the result must
 * be attn_decode run with that head's spans, bit for bit, for the query heads of its group. */
static void test_attn_decode_heads(void **state)
{
	(void)state;
	enum { H = 8, KV = 4, d = 32, rows = 96, max_spans = 5 };
	for (size_t t = 0; t < 3; t++) {
		struct backend_attn a = { H, KV, d, dtypes[t], 0.3f, 0 };
		double *e64, *f64;
		void *k = rand_typed(dtypes[t], rows * KV * d, &e64);
		void *v = rand_typed(dtypes[t], rows * KV * d, &f64);
		size_t es = dtype_size(dtypes[t]);
		struct backend_kv_span spans[KV * max_spans];
		int first[KV + 1], n = 0;
		for (int h = 0; h < KV; h++) {
			first[h] = n;
			int ns = 1 + (int)(test_rand(&seed) % max_spans);
			for (int i = 0; i < ns; i++) {
				int64_t r0 = (int64_t)(test_rand(&seed) % (rows - 8));
				int64_t len = 1 + (int64_t)(test_rand(&seed) % 8);
				spans[n++] = (struct backend_kv_span){
					(const char *)k + (size_t)r0 * KV * d * es,
					(const char *)v + (size_t)r0 * KV * d * es, len, KV * d,
				};
			}
		}
		first[KV] = n;
		float *q = randv(H * d, 0.5f), out[H * d], ref[H * d];
		assert_int_equal(be->ops->attn_decode_heads(be->ctx, out, q, spans, first, &a), 0);
		for (int h = 0; h < KV; h++) {
			float one[H * d];
			assert_int_equal(be->ops->attn_decode(be->ctx, one, q, spans + first[h],
							      first[h + 1] - first[h], &a), 0);
			int G = H / KV;
			memcpy(ref + h * G * d, one + h * G * d, (size_t)G * d * sizeof *one);
		}
		assert_memory_equal(out, ref, sizeof out);
		/* A head with no keys is a caller bug the op refuses. */
		int saved = first[1];
		first[1] = first[0];
		assert_int_equal(be->ops->attn_decode_heads(be->ctx, out, q, spans, first, &a),
				 -EINVAL);
		first[1] = saved;
		free(q);
		free(k);
		free(v);
		free(e64);
		free(f64);
	}
}

/* refreshkv's full step ops: attn_scores (against float64 dot products), the softmax op, then
 * attn_accum chained over two key ranges, give attn_decode_heads' output bit for bit over the
 * same per-head spans; gather_heads copies the head slices its map names and refuses a bad
 * head. Every KV dtype. */
static void test_attn_scores_accum(void **state)
{
	(void)state;
	enum { H = 8, KV = 4, d = 32, rows = 96, ns = 6 };
	for (size_t t = 0; t < 3; t++) {
		struct backend_attn a = { H, KV, d, dtypes[t], 0.3f, 0 };
		double *e64, *f64;
		void *k = rand_typed(dtypes[t], rows * KV * d, &e64);
		void *v = rand_typed(dtypes[t], rows * KV * d, &f64);
		size_t es = dtype_size(dtypes[t]);
		/* Every head: ns spans of the same lengths at its own random rows. */
		int64_t len[ns], n = 0, n0 = 0;
		for (int i = 0; i < ns; i++) {
			len[i] = 1 + (int64_t)(test_rand(&seed) % 9);
			n += len[i];
			n0 += i < ns / 2 ? len[i] : 0;
		}
		struct backend_kv_span spans[KV * ns];
		int64_t r0s[KV * ns];
		int first[KV + 1];
		for (int h = 0; h < KV; h++) {
			first[h] = h * ns;
			for (int i = 0; i < ns; i++) {
				int64_t r0 = (int64_t)(test_rand(&seed) % (rows - 9));
				r0s[h * ns + i] = r0;
				spans[h * ns + i] = (struct backend_kv_span){
					(const char *)k + (size_t)r0 * KV * d * es,
					(const char *)v + (size_t)r0 * KV * d * es, len[i], KV * d,
				};
			}
		}
		first[KV] = KV * ns;
		float *q = randv(H * d, 0.5f), out[H * d], ref[H * d], sc[H * 64];
		assert_true(n <= 64);
		assert_int_equal(be->ops->attn_scores(be->ctx, sc, n, q, spans, first, &a), 0);
		for (int h = 0; h < H; h++) {
			const int g = h / (H / KV);
			int64_t j = 0;
			for (int i = 0; i < ns; i++)
				for (int64_t r = 0; r < len[i]; r++, j++) {
					double dot = 0.0;
					const double *kr = e64 + ((size_t)(r0s[g * ns + i] + r) * KV + g) * d;
					for (int c = 0; c < d; c++)
						dot += (double)q[h * d + c] * kr[c];
					if (fabs(sc[h * n + j] - dot * 0.3) > 1e-5)
						fail_msg("attn_scores %s: head %d key %lld: %g, want %g",
							 dtype_name(dtypes[t]), h, (long long)j,
							 (double)sc[h * n + j], dot * 0.3);
				}
		}
		assert_int_equal(be->ops->softmax(be->ctx, sc, H, n), 0);
		/* Two calls: spans [0, ns/2) of each head, then [ns/2, ns) with the probabilities
		 * from column n0. */
		int second[KV + 1];
		struct backend_kv_span sp2[KV * ns];
		for (int h = 0; h < KV; h++) {
			second[h] = h * (ns - ns / 2);
			memcpy(sp2 + second[h], spans + h * ns + ns / 2,
			       (size_t)(ns - ns / 2) * sizeof *sp2);
		}
		second[KV] = KV * (ns - ns / 2);
		struct backend_kv_span sp1[KV * ns];
		int first1[KV + 1];
		for (int h = 0; h < KV; h++) {
			first1[h] = h * (ns / 2);
			memcpy(sp1 + first1[h], spans + h * ns, (size_t)(ns / 2) * sizeof *sp1);
		}
		first1[KV] = KV * (ns / 2);
		assert_int_equal(be->ops->attn_accum(be->ctx, out, sc, n, sp1, first1, false, &a), 0);
		assert_int_equal(be->ops->attn_accum(be->ctx, out, sc + n0, n, sp2, second, true, &a),
				 0);
		assert_int_equal(be->ops->attn_decode_heads(be->ctx, ref, q, spans, first, &a), 0);
		if (memcmp(out, ref, sizeof out))
			fail_msg("attn_scores + softmax + attn_accum %s differ from attn_decode_heads",
				 dtype_name(dtypes[t]));
		free(q);
		free(k);
		free(v);
		free(e64);
		free(f64);
	}
	float src[3 * 2 * 4], dst[5 * 2 * 4], want[5 * 2 * 4];
	for (int i = 0; i < 24; i++)
		src[i] = (float)i;
	for (int i = 0; i < 40; i++)
		dst[i] = want[i] = -1.0f;
	const int32_t map[] = { 4, 0, 1, 0, 2, 0, 3, 2, 1 };
	for (int e = 0; e < 3; e++)
		memcpy(want + (map[3 * e] * 2 + map[3 * e + 2]) * 4,
		       src + (map[3 * e + 1] * 2 + map[3 * e + 2]) * 4, 4 * sizeof(float));
	assert_int_equal(be->ops->gather_heads(be->ctx, dst, src, map, 3, 2, 4), 0);
	assert_memory_equal(dst, want, sizeof dst);
	const int32_t bad[] = { 0, 0, 2 };
	assert_int_equal(be->ops->gather_heads(be->ctx, dst, src, bad, 1, 2, 4), -EINVAL);
}

/* Naive float64 decode attention of query heads q (H, d) over the slot list of attn_decode_slots:
 * the n_tok[kvh] rows of each KV head gathered page by page from slots (n_slots, 2, p, KV, d). */
static void ref_slots(double *ref, const float *q, const float *slots, const int32_t *list,
		      int max_pages, const int32_t *n_tok, int p, int H, int KV, int d,
		      double scale)
{
	const size_t row = (size_t)KV * d, slot = 2 * (size_t)p * row, cap = (size_t)max_pages * p;
	double *k = malloc(cap * d * sizeof *k), *v = malloc(cap * d * sizeof *v);
	assert_true(k && v);
	for (int kvh = 0; kvh < KV; kvh++) {
		const int pages = (n_tok[kvh] + p - 1) / p;
		int64_t t = 0;
		for (int i = 0; i < pages; i++) {
			const float *sl = slots + (size_t)list[kvh * max_pages + i] * slot;
			for (int r = 0; r < p && t < n_tok[kvh]; r++, t++)
				for (int j = 0; j < d; j++) {
					k[t * d + j] = sl[r * row + (size_t)kvh * d + j];
					v[t * d + j] = sl[((size_t)p + r) * row + (size_t)kvh * d + j];
				}
		}
		assert_int_equal(t, n_tok[kvh]);
		for (int h = kvh * (H / KV); h < (kvh + 1) * (H / KV); h++)
			ref_attn(ref + (size_t)h * d, q + (size_t)h * d, k, v, n_tok[kvh], d, d, scale);
	}
	free(k);
	free(v);
}

/* attn_decode_slots: per-head slot lists (slots repeated across heads and within one, ring
 * order) and per-head token counts (the heads of a call read different numbers of pages, as
 * hardkv's do) against the float64 reference, and bit for bit against attn_decode_heads over
 * the same rows as spans and against itself on one thread; list entries past a head's count
 * are never read; then every refusal, with out untouched. */
static void test_attn_decode_slots(void **state)
{
	(void)state;
	static const struct {
		int KV, G, p, d, max_pages, n_slots;
	} cfg[] = {
		{ 1, 1, 4, 8, 3, 3 },	  { 2, 4, 8, 16, 6, 9 },   { 4, 2, 5, 12, 7, 12 },
		{ 3, 3, 1, 8, 9, 4 },	  { 4, 4, 32, 64, 10, 16 }, /* threaded: 16 * 300 * 64 */
	};
	for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
		const int KV = cfg[c].KV, H = KV * cfg[c].G, p = cfg[c].p, d = cfg[c].d;
		const int MP = cfg[c].max_pages, NS = cfg[c].n_slots;
		const int64_t cap = (int64_t)MP * p;
		const int64_t toks[] = { 1, p, cap - p + 1, cap, cap > 3 ? cap - 3 : 1,
					 cap > 300 ? 300 : cap / 2 + 1 };
		struct backend_attn a = { H, KV, d, FKV_F32, 1.0f / sqrtf((float)d), 0 };
		float *slots = randv((int64_t)NS * 2 * p * KV * d, 1.0f);
		float *q = randv(H * d, 2.0f);
		int32_t *list = malloc((size_t)KV * MP * sizeof *list);
		struct backend_kv_span *spans = malloc((size_t)KV * MP * sizeof *spans);
		float *out = malloc((size_t)H * d * sizeof *out), *o2 = malloc((size_t)H * d * 4);
		double *ref = malloc((size_t)H * d * sizeof *ref);
		assert_true(list && spans && out && o2 && ref);
		const size_t n_toks = sizeof toks / sizeof toks[0];
		for (size_t ti = 0; ti < n_toks; ti++) {
			/* Even heads read toks[ti], odd heads another entry of toks. */
			int32_t n_tok[KV];
			for (int h = 0; h < KV; h++)
				n_tok[h] = (int32_t)toks[h % 2 ? (ti + 2) % n_toks : ti];
			/* Head 0 a ring rotated by a random offset, the others random slots; past
			 * each head's last page an index out of range, which must not be read. */
			const int rot = (int)(test_rand(&seed) % NS);
			for (int h = 0; h < KV; h++)
				for (int i = 0; i < MP; i++)
					list[h * MP + i] = i >= (n_tok[h] + p - 1) / p ? NS
							 : h == 0 ? (rot + i) % NS
								  : (int32_t)(test_rand(&seed) % NS);
			ref_slots(ref, q, slots, list, MP, n_tok, p, H, KV, d, a.scale);
			assert_int_equal(be->ops->attn_decode_slots(be->ctx, out, q, slots, NS, list,
								    MP, n_tok, p, &a), 0);
			double e = nerr(out, ref, H * d);
			if (e > 1e-5)
				fail_msg("attn_decode_slots cfg %zu n_tok %d/%d: error %g", c,
					 n_tok[0], KV > 1 ? n_tok[1] : n_tok[0], e);
			int first[KV + 1], ns = 0;
			const size_t row = (size_t)KV * d;
			for (int h = 0; h < KV; h++) {
				const int pages = (n_tok[h] + p - 1) / p;
				first[h] = ns;
				for (int i = 0; i < pages; i++) {
					const float *sl = slots + (size_t)list[h * MP + i] * 2 * p * row;
					spans[ns++] = (struct backend_kv_span){
						sl, sl + (size_t)p * row,
						i + 1 < pages ? p : n_tok[h] - (int64_t)(pages - 1) * p,
						(int64_t)row,
					};
				}
			}
			first[KV] = ns;
			assert_int_equal(be->ops->attn_decode_heads(be->ctx, o2, q, spans, first, &a),
					 0);
			assert_memory_equal(out, o2, (size_t)H * d * sizeof *out);
			assert_int_equal(be->ops->set_threads(be->ctx, 1), 0);
			assert_int_equal(be->ops->attn_decode_slots(be->ctx, o2, q, slots, NS, list,
								    MP, n_tok, p, &a), 0);
			assert_int_equal(be->ops->set_threads(be->ctx, 2), 0);
			assert_memory_equal(out, o2, (size_t)H * d * sizeof *out);
			/* 16-bit slots (CUDA's slot dtype) read as f32 slots holding the same values:
			 * bit for bit, the accumulation being f32 either way. */
			const size_t nf = (size_t)NS * 2 * p * row;
			for (size_t t = 1; t < 3; t++) {
				float *r32 = malloc(nf * sizeof *r32);
				void *r16 = malloc(nf * 2);
				assert_true(r32 && r16);
				memcpy(r32, slots, nf * sizeof *r32);
				dtype_round(r32, dtypes[t], nf);
				dtype_from_f32(r16, r32, dtypes[t], nf);
				struct backend_attn a16 = a;
				a16.kv_dtype = dtypes[t];
				assert_int_equal(be->ops->attn_decode_slots(be->ctx, out, q, r32, NS,
									    list, MP, n_tok, p, &a),
						 0);
				assert_int_equal(be->ops->attn_decode_slots(be->ctx, o2, q, r16, NS,
									    list, MP, n_tok, p, &a16),
						 0);
				assert_memory_equal(out, o2, (size_t)H * d * sizeof *out);
				free(r32);
				free(r16);
			}
		}
		/* Refusals: nothing written. */
		for (int i = 0; i < H * d; i++)
			out[i] = o2[i] = -7.0f;
		for (int i = 0; i < KV * MP; i++)
			list[i] = (int32_t)(test_rand(&seed) % NS);
		int32_t n_tok[KV], bt[KV];
		for (int h = 0; h < KV; h++)
			n_tok[h] = (int32_t)(cap - 1 > 0 ? cap - 1 : 1);
		const int last = (n_tok[0] + p - 1) / p - 1;
		struct backend_attn bad = a;
#define REFUSE(ATTN, SLOTS, NSL, LIST, MPG, NT, P)                                              \
	assert_int_equal(be->ops->attn_decode_slots(be->ctx, out, q, SLOTS, NSL, LIST, MPG, NT, P, \
						    ATTN), -EINVAL)
		/* a bad count on the last head */
		const int32_t bad_tok[] = { (int32_t)cap + 1, 0, -1 };
		for (size_t i = 0; i < 3; i++) {
			memcpy(bt, n_tok, sizeof bt);
			bt[KV - 1] = bad_tok[i];
			REFUSE(&a, slots, NS, list, MP, bt, p);
		}
		REFUSE(&a, slots, NS, list, MP, NULL, p);
		REFUSE(&a, slots, NS, list, MP, n_tok, 0);
		REFUSE(&a, slots, NS, list, 0, n_tok, p);
		REFUSE(&a, slots, 0, list, MP, n_tok, p);
		REFUSE(&a, slots, NS, NULL, MP, n_tok, p);
		REFUSE(&a, NULL, NS, list, MP, n_tok, p);
		const int32_t saved = list[(KV - 1) * MP + last];
		list[(KV - 1) * MP + last] = NS; /* the last head's last page */
		REFUSE(&a, slots, NS, list, MP, n_tok, p);
		list[(KV - 1) * MP + last] = -1;
		REFUSE(&a, slots, NS, list, MP, n_tok, p);
		list[(KV - 1) * MP + last] = saved;
		bad.kv_dtype = (enum fkv_dtype)7; /* no such dtype */
		REFUSE(&bad, slots, NS, list, MP, n_tok, p);
		bad = a;
		bad.n_heads = H + 1;
		if (KV > 1)
			REFUSE(&bad, slots, NS, list, MP, n_tok, p);
		bad = a;
		bad.head_dim = 0;
		REFUSE(&bad, slots, NS, list, MP, n_tok, p);
		bad = a;
		bad.n_kv_heads = 0;
		REFUSE(&bad, slots, NS, list, MP, n_tok, p);
#undef REFUSE
		assert_memory_equal(out, o2, (size_t)H * d * sizeof *out);
		/* And the op still works after them. */
		assert_int_equal(be->ops->attn_decode_slots(be->ctx, out, q, slots, NS, list, MP,
							    n_tok, p, &a), 0);
		free(slots);
		free(q);
		free(list);
		free(spans);
		free(out);
		free(o2);
		free(ref);
	}
}

/* Prefill of n_q queries after n_ctx - n_q cached tokens against the float64 reference. */
static void check_prefill(enum fkv_dtype t, int H, int KV, int d, int64_t n_ctx, int64_t n_q,
			  int64_t W)
{
	struct backend_attn a = { H, KV, d, t, 1.0f / sqrtf((float)d), W };
	double *k64, *v64;
	void *k = rand_typed(t, n_ctx * KV * d, &k64);
	void *v = rand_typed(t, n_ctx * KV * d, &v64);
	float *q = randv(n_q * H * d, 2.0f), *out = malloc((size_t)(n_q * H * d) * 4);
	double *ref = malloc((size_t)(n_q * H * d) * sizeof *ref);
	assert_true(out && ref);
	for (int64_t i = 0; i < n_q; i++)
		for (int h = 0; h < H; h++) {
			int kvh = h / (H / KV);
			int64_t last = n_ctx - n_q + i;
			int64_t j0 = W && last + 1 > W ? last + 1 - W : 0;
			ref_attn(ref + (i * H + h) * d, q + (i * H + h) * d,
				 k64 + j0 * KV * d + kvh * d, v64 + j0 * KV * d + kvh * d,
				 last + 1 - j0, KV * d, d, a.scale);
		}
	assert_int_equal(be->ops->attn_prefill(be->ctx, out, q, n_q, k, v, n_ctx, &a), 0);
	double e = nerr(out, ref, n_q * H * d);
	if (e > 1e-5)
		fail_msg("attn_prefill %s H %d KV %d d %d ctx %lld q %lld window %lld: error %g",
			 dtype_name(t), H, KV, d, (long long)n_ctx, (long long)n_q, (long long)W,
			 e);
	free(k);
	free(v);
	free(k64);
	free(v64);
	free(q);
	free(out);
	free(ref);
}

/* The prefill work is cut into units of query rows of one KV head: groups of 3 that straddle
 * unit boundaries, head dim 128, and a context long enough that units shrink below
 * CPU_ATTN_ROWS rows to bound the scores (with and without a window). */
static void test_attn_prefill_units(void **state)
{
	(void)state;
	for (size_t t = 0; t < 3; t++) {
		check_prefill(dtypes[t], 9, 3, 128, 200, 70, 0);
		check_prefill(dtypes[t], 6, 2, 16, 131, 131, 40);
	}
	check_prefill(FKV_BF16, 9, 3, 32, 20000, 40, 0);
	check_prefill(FKV_F16, 6, 3, 32, 20000, 40, 5000);
}

/* Llama-3-8B decode geometry (32 query heads on 8 KV heads, d 128) over 2048 keys in 64
 * pages of 32 tokens taken from a larger pool in shuffled order, as a paged policy hands
 * them over; against the reference for every dtype. */
static void test_attn_decode_paged(void **state)
{
	(void)state;
	enum { H = 32, KV = 8, d = 128, P = 32, pages = 64, pool = 80 };
	for (size_t t = 0; t < 3; t++) {
		struct backend_attn a = { H, KV, d, dtypes[t], 1.0f / sqrtf(d), 0 };
		double *k64, *v64;
		void *k = rand_typed(dtypes[t], (int64_t)pool * P * KV * d, &k64);
		void *v = rand_typed(dtypes[t], (int64_t)pool * P * KV * d, &v64);
		size_t es = dtype_size(dtypes[t]);
		int order[pool];
		for (int i = 0; i < pool; i++)
			order[i] = i;
		for (int i = pool - 1; i > 0; i--) {
			int j = (int)(test_rand(&seed) % (uint64_t)(i + 1)), x = order[i];
			order[i] = order[j];
			order[j] = x;
		}
		struct backend_kv_span spans[pages];
		double *kc = malloc((size_t)pages * P * KV * d * sizeof *kc);
		double *vc = malloc((size_t)pages * P * KV * d * sizeof *vc);
		assert_true(kc && vc);
		for (int s = 0; s < pages; s++) {
			const size_t off = (size_t)order[s] * P * KV * d, len = (size_t)P * KV * d;
			spans[s] = (struct backend_kv_span){ (const char *)k + off * es,
							     (const char *)v + off * es, P,
							     KV * d };
			memcpy(kc + (size_t)s * len, k64 + off, len * sizeof *kc);
			memcpy(vc + (size_t)s * len, v64 + off, len * sizeof *vc);
		}
		float *q = randv(H * d, 1.0f), *out = malloc(H * d * sizeof *out);
		double *ref = malloc(H * d * sizeof *ref);
		assert_true(out && ref);
		for (int h = 0; h < H; h++)
			ref_attn(ref + h * d, q + h * d, kc + (h / (H / KV)) * d,
				 vc + (h / (H / KV)) * d, (int64_t)pages * P, KV * d, d, a.scale);
		assert_int_equal(be->ops->attn_decode(be->ctx, out, q, spans, pages, &a), 0);
		double e = nerr(out, ref, H * d);
		if (e > 1e-5)
			fail_msg("attn_decode paged %s: error %g", dtype_name(dtypes[t]), e);
		free(k);
		free(v);
		free(k64);
		free(v64);
		free(kc);
		free(vc);
		free(q);
		free(out);
		free(ref);
	}
}

/* Results do not depend on the thread count, bit for bit (a resumed or re-run sequence must
 * pick the same tokens): matmul on both 16-bit paths and attention, 1 thread against 2. */
static void test_threads_bitwise(void **state)
{
	(void)state;
	enum { rows = 1001, cols = 700, n = 9, H = 8, KV = 2, d = 64, ctx = 300, nq = 40 };
	double *w64, *k64, *v64;
	void *w = rand_typed(FKV_BF16, rows * cols, &w64);
	void *k = rand_typed(FKV_F16, ctx * KV * d, &k64);
	void *v = rand_typed(FKV_F16, ctx * KV * d, &v64);
	float *x = randv(n * cols, 1.0f), *q = randv(nq * H * d, 1.0f);
	float *y[2], *o[2], *od[2];
	struct backend_mat m = mat(w, FKV_BF16, rows, cols);
	struct backend_attn a = { H, KV, d, FKV_F16, 0.125f, 0 };
	struct backend_kv_span span = { k, v, ctx, KV * d };
	for (int i = 0; i < 2; i++) {
		y[i] = malloc((size_t)(n + 1) * rows * sizeof *y[i]);
		o[i] = malloc((size_t)nq * H * d * sizeof *o[i]);
		od[i] = malloc((size_t)H * d * sizeof *od[i]);
		assert_true(y[i] && o[i] && od[i]);
		assert_int_equal(be->ops->set_threads(be->ctx, i + 1), 0);
		assert_int_equal(be->ops->matmul(be->ctx, y[i], x, &m, 1), 0);
		assert_int_equal(be->ops->matmul(be->ctx, y[i] + rows, x, &m, n), 0);
		assert_int_equal(be->ops->attn_prefill(be->ctx, o[i], q, nq, k, v, ctx, &a), 0);
		assert_int_equal(be->ops->attn_decode(be->ctx, od[i], q, &span, 1, &a), 0);
	}
	assert_memory_equal(y[0], y[1], (size_t)(n + 1) * rows * sizeof *y[0]);
	assert_memory_equal(o[0], o[1], (size_t)nq * H * d * sizeof *o[0]);
	assert_memory_equal(od[0], od[1], (size_t)H * d * sizeof *od[0]);
	assert_int_equal(be->ops->set_threads(be->ctx, 2), 0);
	be->ops->weight_release(be->ctx, &m);
	for (int i = 0; i < 2; i++) {
		free(y[i]);
		free(o[i]);
		free(od[i]);
	}
	free(w);
	free(w64);
	free(k);
	free(k64);
	free(v);
	free(v64);
	free(x);
	free(q);
}

/* store_rows: backend rows into host blocks, checked against layout_store_tokens applied token
 * by token, for every dtype, runs that start mid-page and cross pages; bytes the call must not
 * touch keep their random contents. */
static void test_store_rows(void **state)
{
	(void)state;
	const int H = 3, P = 5, D = 7;
	const int runs[][2] = { { 0, 1 }, { 4, 1 }, { 2, 3 }, { 3, 9 }, { 0, 15 }, { 1, 0 }, { 4, 12 } };
	const size_t row = (size_t)H * D;
	for (size_t t = 0; t < 3; t++) {
		const struct kv_geom g = { .n_kv = H, .p = P, .d = D, .dtype = dtypes[t] };
		const size_t bb = layout_block_bytes(&g);
		for (size_t r = 0; r < sizeof runs / sizeof *runs; r++) {
			const int t0 = runs[r][0], n = runs[r][1], nb = (t0 + n + P - 1) / P;
			float *k = randv((int64_t)(n ? n : 1) * (int64_t)row, 3.0f);
			float *v = randv((int64_t)(n ? n : 1) * (int64_t)row, 3.0f);
			float *bk = be->ops->buf_alloc(be->ctx, (n ? n : 1) * row * sizeof *bk);
			float *bv = be->ops->buf_alloc(be->ctx, (n ? n : 1) * row * sizeof *bv);
			assert_true(bk && bv);
			assert_int_equal(be->ops->upload(be->ctx, bk, k, n * row * sizeof *k), 0);
			assert_int_equal(be->ops->upload(be->ctx, bv, v, n * row * sizeof *v), 0);
			uint8_t *got = malloc((size_t)(nb + 1) * bb), *want = malloc((size_t)(nb + 1) * bb);
			assert_true(got && want);
			for (size_t i = 0; i < (size_t)(nb + 1) * bb; i++)
				got[i] = want[i] = (uint8_t)test_rand(&seed);
			void *blocks[8];
			for (int b = 0; b < nb; b++)
				blocks[b] = got + (size_t)b * bb;
			assert_int_equal(be->ops->store_rows(be->ctx, blocks, t0, bk, bv, n, P, H, D,
							     dtypes[t]), 0);
			for (int i = 0; i < n; i++) {
				int at = t0 + i;
				layout_store_tokens(&g, want + (size_t)(at / P) * bb, at % P, at % P + 1,
						    k + (size_t)i * row, v + (size_t)i * row);
			}
			assert_memory_equal(got, want, (size_t)(nb + 1) * bb);
			be->ops->buf_free(be->ctx, bk);
			be->ops->buf_free(be->ctx, bv);
			free(got);
			free(want);
			free(k);
			free(v);
		}
	}
	void *none[1] = { NULL };
	float x = 0;
	assert_int_equal(be->ops->store_rows(be->ctx, none, P, &x, &x, 1, P, H, D, FKV_F16), -EINVAL);
	assert_int_equal(be->ops->store_rows(be->ctx, none, -1, &x, &x, 1, P, H, D, FKV_F16), -EINVAL);
	assert_int_equal(be->ops->store_rows(be->ctx, none, 0, &x, &x, 1, P, H, D, (enum fkv_dtype)7),
			 -EINVAL);
}

/* round_to equals a conversion to the dtype and back, bit for bit, on random values of every
 * magnitude and on the special ones (signed zeros, subnormals, overflow, infinities, NaN). */
static void test_round_to(void **state)
{
	(void)state;
	const int64_t n = 4096 + 13;
	const float special[] = { 0.0f, -0.0f, 1e-8f, -3e-41f, 65504.0f, 65520.0f, 1e30f, -1e38f,
				  INFINITY, -INFINITY, NAN, 1.0f + 0x1p-11f, 1.0f + 0x1p-8f };
	for (size_t t = 0; t < 3; t++) {
		float *x = randv(n, 1.0f);
		for (int64_t i = 0; i < n; i++)
			x[i] = ldexpf(x[i], (int)(test_rand(&seed) % 80) - 40);
		memcpy(x, special, sizeof special);
		float *want = malloc((size_t)n * sizeof *want);
		uint16_t *tmp = malloc((size_t)n * sizeof *tmp);
		assert_true(want && tmp);
		memcpy(want, x, (size_t)n * sizeof *want);
		float *orig = malloc((size_t)n * sizeof *orig);
		assert_non_null(orig);
		memcpy(orig, x, (size_t)n * sizeof *orig);
		if (dtypes[t] != FKV_F32)
			for (int64_t i = 0; i < n; i++) {
				dtype_from_f32(tmp + i, x + i, dtypes[t], 1);
				dtype_to_f32(want + i, tmp + i, dtypes[t], 1);
			}
		float *b = be->ops->buf_alloc(be->ctx, (size_t)n * sizeof *b);
		assert_non_null(b);
		assert_int_equal(be->ops->upload(be->ctx, b, x, (size_t)n * sizeof *x), 0);
		assert_int_equal(be->ops->round_to(be->ctx, b, n, dtypes[t]), 0);
		assert_int_equal(be->ops->download(be->ctx, x, b, (size_t)n * sizeof *x), 0);
		assert_memory_equal(x, want, (size_t)n * sizeof *x);
		/* Not a no-op: most random f32 values are not representable in 16 bits. */
		int64_t changed = 0;
		for (int64_t i = 0; i < n; i++)
			changed += memcmp(&x[i], &orig[i], sizeof *x) != 0;
		assert_true(dtypes[t] == FKV_F32 ? changed == 0 : changed > n / 2);
		free(orig);
		be->ops->buf_free(be->ctx, b);
		free(x);
		free(want);
		free(tmp);
	}
	float y = 1;
	assert_int_equal(be->ops->round_to(be->ctx, &y, 1, (enum fkv_dtype)7), -EINVAL);
}

/* Weights in huge pages (cpu_wmem.h): where the kernel has transparent huge pages, weight_load
 * copies a matrix (and weight_concat stacks its parts) into an arena advised for them, and
 * matmul gives the bits it gives on the model's own mapping; vectors and weight_load_rows
 * (embed) keep the mapping. Without them (or with the switch off) nothing is copied. */
static void test_weights_huge_pages(void **state)
{
	(void)state;
	const int64_t rows = 333, cols = 96, n = 3;
	for (size_t t = 0; t < 3; t++) {
		double *w64;
		void *w = rand_typed(dtypes[t], rows * cols, &w64);
		float *x = randv(n * cols, 1.0f);
		float *y_map = malloc((size_t)(n * rows) * sizeof *y_map);
		float *y_huge = malloc((size_t)(n * rows) * sizeof *y_huge);
		assert_true(y_map && y_huge);
		struct fkv_tensor src = { .data = w, .dtype = dtypes[t], .n_dims = 2,
					  .shape = { rows, cols } };
		struct backend_mat m;
		cpu_wmem_enable(false);
		assert_int_equal(be->ops->weight_load(be->ctx, &src, &m), 0);
		assert_ptr_equal(m.data, w);
		for (int64_t k = 1; k <= n; k++) /* the dot path (1, 2 rows) and the tiles (3) */
			assert_int_equal(be->ops->matmul(be->ctx, y_map, x, &m, k), 0);
		be->ops->weight_release(be->ctx, &m);
		cpu_wmem_enable(true);
		assert_int_equal(be->ops->weight_load(be->ctx, &src, &m), 0);
		if (cpu_wmem_usable()) {
			assert_true(m.data != w && m.priv);
			assert_int_equal((uintptr_t)m.data % 64, 0);
			assert_memory_equal(m.data, w, (size_t)(rows * cols) * dtype_size(dtypes[t]));
		} else { /* no transparent huge pages here: nothing is copied */
			assert_ptr_equal(m.data, w);
		}
		for (int64_t k = 1; k <= n; k++)
			assert_int_equal(be->ops->matmul(be->ctx, y_huge, x, &m, k), 0);
		assert_memory_equal(y_huge, y_map, (size_t)(n * rows) * sizeof *y_map);
		be->ops->weight_release(be->ctx, &m);
		/* Read by rows, or a vector: the mapping. */
		assert_int_equal(be->ops->weight_load_rows(be->ctx, &src, &m), 0);
		assert_ptr_equal(m.data, w);
		be->ops->weight_release(be->ctx, &m);
		struct fkv_tensor vec = { .data = w, .dtype = dtypes[t], .n_dims = 1,
					  .shape = { cols, 1 } };
		assert_int_equal(be->ops->weight_load(be->ctx, &vec, &m), 0);
		assert_ptr_equal(m.data, w);
		be->ops->weight_release(be->ctx, &m);
		/* A concatenation holds the parts back to back, wherever it lies. */
		const struct fkv_tensor *parts[] = { &src, &src };
		assert_int_equal(be->ops->weight_concat(be->ctx, parts, 2, &m), 0);
		const size_t part = (size_t)(rows * cols) * dtype_size(dtypes[t]);
		assert_memory_equal(m.data, w, part);
		assert_memory_equal((const char *)m.data + part, w, part);
		be->ops->weight_release(be->ctx, &m);
		free(w);
		free(w64);
		free(x);
		free(y_map);
		free(y_huge);
	}
}

/* Whether the page at p is mapped (mincore fails with ENOMEM on an unmapped range). */
static bool mapped(const void *p)
{
	unsigned char v;
	void *page = (void *)((uintptr_t)p & ~(uintptr_t)4095);
	return mincore(page, 4096, &v) == 0;
}

/* The arena: 64-byte-aligned pieces packed into CPU_WMEM_CHUNK chunks (the first piece of a
 * chunk on a huge-page boundary), a piece larger than a chunk in a mapping of its own, and a
 * chunk unmapped once the arena has moved past it and its last piece is put, not before. */
static void test_wmem_arena(void **state)
{
	(void)state;
	struct cpu_wmem *a;
	assert_int_equal(cpu_wmem_new(&a), 0);
	const size_t piece = CPU_WMEM_CHUNK / 3 - 100; /* three fit a chunk, rounded to 64 */
	struct cpu_wmem_chunk *ch[5];
	char *p[5];
	for (int i = 0; i < 3; i++) {
		p[i] = cpu_wmem_alloc(a, piece, &ch[i]);
		assert_non_null(p[i]);
		assert_int_equal((uintptr_t)p[i] % 64, 0);
		memset(p[i], i + 1, piece); /* writable, all of it */
	}
	assert_int_equal((uintptr_t)p[0] % CPU_WMEM_HUGE, 0);
	assert_ptr_equal(ch[0], ch[1]);
	assert_ptr_equal(ch[1], ch[2]);
	assert_ptr_equal(p[1], p[0] + (piece + 63) / 64 * 64);
	p[3] = cpu_wmem_alloc(a, piece, &ch[3]); /* no room left: the next chunk */
	assert_non_null(p[3]);
	assert_true(ch[3] != ch[0]);
	assert_int_equal((uintptr_t)p[3] % CPU_WMEM_HUGE, 0);
	p[4] = cpu_wmem_alloc(a, CPU_WMEM_CHUNK + 1, &ch[4]); /* a mapping of its own */
	assert_non_null(p[4]);
	assert_true(ch[4] != ch[3]);
	memset(p[4], 7, CPU_WMEM_CHUNK + 1);
	struct cpu_wmem_chunk *c5;
	char *p5 = cpu_wmem_alloc(a, 64, &c5); /* the arena stayed on its chunk */
	assert_ptr_equal(c5, ch[3]);
	assert_null(cpu_wmem_alloc(a, 0, &c5));
	cpu_wmem_put(a, ch[0]);
	cpu_wmem_put(a, ch[1]);
	assert_true(mapped(p[2]) && p[2][piece - 1] == 3);
	cpu_wmem_put(a, ch[2]); /* the first chunk's last piece: gone */
	assert_false(mapped(p[0]));
	cpu_wmem_put(a, ch[4]);
	assert_false(mapped(p[4]));
	cpu_wmem_put(a, ch[3]);
	assert_true(mapped(p5)); /* still the arena's current chunk */
	cpu_wmem_put(a, c5);
	cpu_wmem_free(a);
	assert_false(mapped(p[3]));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_matmul),
		cmocka_unit_test(test_matmul_rows_alone),
		cmocka_unit_test(test_matmul_dot16_equals_portable),
		cmocka_unit_test(test_matmul_gemm_equals_ref),
		cmocka_unit_test(test_matmul_all_16bit_patterns),
		cmocka_unit_test(test_rmsnorm),
		cmocka_unit_test(test_rope),
		cmocka_unit_test(test_elementwise),
		cmocka_unit_test(test_embed_gather_convert),
		cmocka_unit_test(test_attn_prefill),
		cmocka_unit_test(test_attn_decode),
		cmocka_unit_test(test_attn_decode_heads),
		cmocka_unit_test(test_attn_scores_accum),
		cmocka_unit_test(test_attn_decode_slots),
		cmocka_unit_test(test_attn_prefill_units),
		cmocka_unit_test(test_attn_decode_paged),
		cmocka_unit_test(test_threads_bitwise),
		cmocka_unit_test(test_store_rows),
		cmocka_unit_test(test_round_to),
		cmocka_unit_test(test_weights_huge_pages),
		cmocka_unit_test(test_wmem_arena),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
