/* Tests for worker/backend/cpu_quant.c and the CPU backend's quantized paths: for every block
 * format, on random blocks, the tile kernel equals the reference quant_dequant() bit for bit
 * (itself checked against float64 in test_quant.c); the dot kernel is within 1e-5 of the
 * float64 dot product of the reference values (normalised by Σ|w x|, since a sum that cancels
 * has no relative error to speak of); and through the ops table, matmul with one activation row
 * (the dot path) and with several (dequantized tiles + sgemm) and embed agree with the same
 * float64 reference, bit for bit across thread counts. The integer path on K-quants
 * (cpu_qdot8.c): the activation's 8-bit quantization, the kernel equal bit for bit to its scalar
 * reference, both within 1e-5 of float64 on the quantized activation (saturating values
 * included), and matmul through it within the quantization's error of the f32 activation. */
#include "test_util.h"

#include <errno.h>
#include <math.h>

#include "backend.h"
#include "cpu_gemm.h"
#include "cpu_q4k.h"
#include "cpu_qdot8.h"
#include "cpu_quant.h"
#include "dtype.h"

static struct backend *be;

static int setup(void **state)
{
	(void)state;
	return backend_cpu_new(&be, 2);
}

static int teardown(void **state)
{
	(void)state;
	backend_free(be);
	return 0;
}

static uint64_t seed = 0xc0ffee;

static const enum fkv_quant formats[] = { FKV_Q8_0, FKV_Q4_0, FKV_Q4_1, FKV_Q5_0,
					  FKV_Q5_1, FKV_Q4_K, FKV_Q5_K, FKV_Q6_K };
#define N_FMT (sizeof formats / sizeof formats[0])

/* A random (rows, cols) matrix of format q with finite f16 scales of magnitude <= 1/8. */
static uint8_t *rand_matrix(enum fkv_quant q, int64_t rows, int64_t cols)
{
	const size_t rb = quant_row_bytes(q, cols), bb = quant_block_bytes(q);
	assert_true(rb > 0);
	uint8_t *w = malloc(rb * (size_t)rows);
	assert_non_null(w);
	for (size_t i = 0; i < rb * (size_t)rows; i++)
		w[i] = (uint8_t)test_rand(&seed);
	for (uint8_t *b = w; b < w + rb * (size_t)rows; b += bb) {
		uint16_t h[2] = { f32_to_f16(test_randf(&seed) / 8), f32_to_f16(test_randf(&seed) / 8) };
		if (q == FKV_Q6_K)
			memcpy(b + 208, h, 2);
		else
			memcpy(b, h, q == FKV_Q8_0 || q == FKV_Q4_0 || q == FKV_Q5_0 ? 2 : 4);
	}
	return w;
}

static float *randv(int64_t n)
{
	float *v = malloc((size_t)n * sizeof *v);
	assert_non_null(v);
	for (int64_t i = 0; i < n; i++)
		v[i] = test_randf(&seed);
	return v;
}

/* Largest |got - want| / Σ|w x| over the rows of y = w x, want in float64 from dequantized w. */
static double dot_err(const float *got, const float *wd, const float *x, int64_t rows, int64_t cols)
{
	double worst = 0;
	for (int64_t r = 0; r < rows; r++) {
		double s = 0, a = 1e-30;
		for (int64_t c = 0; c < cols; c++) {
			s += (double)wd[r * cols + c] * x[c];
			a += fabs((double)wd[r * cols + c] * x[c]);
		}
		assert_false(isnan(got[r]));
		worst = fmax(worst, fabs(got[r] - s) / a);
	}
	return worst;
}

static void test_kernels(void **state)
{
	(void)state;
	for (size_t f = 0; f < N_FMT; f++) {
		const enum fkv_quant q = formats[f];
		const int be = quant_block_elems(q);
		const int64_t colss[] = { be, 3 * be, 4096 };
		for (size_t ci = 0; ci < 3; ci++) {
			const int64_t rows = 37, cols = colss[ci];
			uint8_t *w = rand_matrix(q, rows, cols);
			float *ref = malloc(sizeof(float) * (size_t)(rows * cols));
			float *tile = malloc(sizeof(float) * (size_t)(rows * cols));
			float *x = randv(cols), *y = malloc(sizeof(float) * (size_t)rows);
			assert_non_null(ref);
			assert_non_null(tile);
			assert_non_null(y);
			quant_dequant(q, ref, w, rows * cols);
			/* rows 5 .. 5+m: the tile kernel starts where it is told */
			cpu_quant_dequant_rows(tile, w, q, cols, 5, rows - 5);
			assert_memory_equal(tile, ref + 5 * cols, sizeof(float) * (size_t)((rows - 5) * cols));
			for (int64_t r = 0; r < rows; r++)
				y[r] = NAN;
			cpu_quant_dot_rows(y, x, w, q, cols, 1, rows);
			assert_true(isnan(y[0])); /* rows before r0 untouched */
			double e = dot_err(y + 1, ref + cols, x, rows - 1, cols);
			if (!(e < 1e-5))
				fail_msg("%s, %lld columns: dot error %g", quant_name(q), (long long)cols, e);
			free(w);
			free(ref);
			free(tile);
			free(x);
			free(y);
		}
	}
}

/* The activation as cpu_qdot8 sees it for weights of format q: d · qs. */
static float *act_values(const void *act, int64_t cols, enum fkv_quant q)
{
	float *v = malloc((size_t)cols * sizeof *v);
	assert_non_null(v);
	const struct q8k_block *k = act;
	const struct q8_32_block *l = act;
	for (int64_t i = 0; i < cols; i++)
		v[i] = quant_block_elems(q) == QK_K ? k[i / QK_K].d * k[i / QK_K].qs[i % QK_K]
						    : l[i / 32].d * l[i / 32].qs[i % 32];
	return v;
}

static void *quantize_act(const float *x, int64_t cols, enum fkv_quant q)
{
	void *a = malloc(cpu_qdot8_act_bytes(q, cols));
	assert_non_null(a);
	cpu_qdot8_quantize(a, x, cols, q);
	return a;
}

static void test_q8k_quantize(void **state)
{
	(void)state;
	const int64_t cols = 3 * QK_K;
	float *x = randv(cols);
	for (int i = 0; i < QK_K; i++)
		x[QK_K + i] = 0; /* an all-zero block */
	x[7] = -4.0f;	 /* the block's largest magnitude is negative */
	struct q8k_block b[3];
	cpu_qdot8_quantize(b, x, cols, FKV_Q4_K);
	assert_true(b[0].d == 4.0f / 127.0f);
	assert_int_equal(b[0].qs[7], -127);
	assert_true(b[1].d == 0);
	for (int64_t i = 0; i < cols; i++) {
		const struct q8k_block *o = &b[i / QK_K];
		assert_true(o->qs[i % QK_K] >= -127);
		assert_true(fabsf(x[i] - o->d * o->qs[i % QK_K]) <= o->d * 0.5f * (1 + 1e-5f));
	}
	for (int k = 0; k < 3; k++)
		for (int j = 0; j < 16; j++) {
			int s = 0;
			for (int i = 0; i < 16; i++)
				s += b[k].qs[16 * j + i];
			assert_int_equal(b[k].bsums[j], s);
		}
	/* blocks of 32 for the legacy formats */
	struct q8_32_block l[3 * QK_K / 32];
	assert_int_equal(cpu_qdot8_act_bytes(FKV_Q8_0, cols), sizeof l);
	cpu_qdot8_quantize(l, x, cols, FKV_Q5_0);
	assert_true(l[0].d == 4.0f / 127.0f);
	for (size_t k = 0; k < sizeof l / sizeof l[0]; k++) {
		int s = 0;
		for (int i = 0; i < 32; i++) {
			s += l[k].qs[i];
			assert_true(fabsf(x[32 * k + i] - l[k].d * l[k].qs[i]) <=
				    l[k].d * 0.5f * (1 + 1e-5f));
		}
		assert_int_equal(l[k].sum, s);
	}
	/* a NaN in a block reaches the result, as through the f32 path */
	x[3] = NAN;
	cpu_qdot8_quantize(b, x, cols, FKV_Q4_K);
	assert_true(isnan(b[0].d));
	cpu_qdot8_quantize(l, x, cols, FKV_Q8_0);
	assert_true(isnan(l[0].d));
	assert_false(isnan(l[1].d));
	free(x);
}

static void test_qdot8_kernels(void **state)
{
	(void)state;
	for (size_t f = 0; f < N_FMT; f++) {
		const enum fkv_quant q = formats[f];
		const int be = quant_block_elems(q);
		const int64_t colss[] = { be, 3 * be, 4096 };
		for (size_t ci = 0; ci < 3; ci++) {
			/* random bytes; then every byte 0xff (largest values, scales and mins) against
			 * an activation of +1 and -1: the int16 pair sums at their largest */
			for (int sat = 0; sat < 2; sat++) {
				/* rows 1 .. 22: five groups of four and one row alone (K formats) */
				const int64_t rows = 22, cols = colss[ci];
				uint8_t *w = rand_matrix(q, rows, cols);
				float *x = randv(cols);
				if (sat) {
					const size_t bb = quant_block_bytes(q);
					memset(w, 0xff, quant_row_bytes(q, cols) * rows);
					const bool two = q != FKV_Q6_K && q != FKV_Q8_0 &&
							 q != FKV_Q4_0 && q != FKV_Q5_0;
					for (uint8_t *b = w; b < w + quant_row_bytes(q, cols) * rows; b += bb) {
						const uint16_t h[2] = { f32_to_f16(0.01f),
									f32_to_f16(0.01f) };
						/* d, and dmin or m */
						memcpy(q == FKV_Q6_K ? b + 208 : b, h, two ? 4 : 2);
					}
					if (q == FKV_Q8_0) /* -128 · -127: the largest |product| */
						for (uint8_t *b = w; b < w + quant_row_bytes(q, cols) * rows;
						     b += bb)
							memset(b + 2, 0x80, 32);
					for (int64_t i = 0; i < cols; i++)
						x[i] = i % 3 ? 1.0f : -1.0f;
				}
				float *wd = malloc(sizeof(float) * (size_t)(rows * cols));
				float *y = malloc(sizeof(float) * rows), *yr = malloc(sizeof(float) * rows);
				assert_non_null(wd);
				assert_non_null(y);
				assert_non_null(yr);
				quant_dequant(q, wd, w, rows * cols);
				void *xq = quantize_act(x, cols, q);
				float *xv = act_values(xq, cols, q);
				cpu_qdot8_rows_ref(yr, xq, w, q, cols, 0, rows);
				double e = dot_err(yr, wd, xv, rows, cols);
				if (!(e < 1e-5))
					fail_msg("%s, %lld columns%s: reference error %g", quant_name(q),
						 (long long)cols, sat ? ", saturating" : "", e);
				if (cpu_qdot8_usable(q)) {
					y[0] = NAN;
					cpu_qdot8_rows(y, xq, w, q, cols, 1, rows);
					assert_true(isnan(y[0]));
					assert_memory_equal(y + 1, yr + 1, sizeof(float) * (rows - 1));
				}
				free(w);
				free(x);
				free(wd);
				free(y);
				free(yr);
				free(xq);
				free(xv);
			}
		}
	}
	if (!cpu_qdot8_usable(FKV_Q8_0))
		fprintf(stderr, "note: no AVX2 here (or FREEKV_CPU_QDOT8=0): the integer kernel "
			"itself was not run, only its reference\n");
}

/* matmul (n = 1 and n = 5) and embed through the ops table, 1 and 2 threads. */
/* The prefill GEMM (cpu_gemm.c) on every format against its scalar reference: the same bits,
 * for one block, several blocks inside a column chunk and several chunks, every short register
 * tile of activation rows, and a short group of weight rows. */
static void test_gemm_kernels(void **state)
{
	(void)state;
	for (size_t f = 0; f < N_FMT; f++) {
		const enum fkv_quant q = formats[f];
		if (!cpu_gemm_usable(FKV_F32, q)) {
			printf("skipped: no AVX-512 here, so prefill takes converted tiles + sgemm\n");
			return;
		}
		const int be = quant_block_elems(q);
		const int64_t colss[] = { be, 3 * be, 3 * CPU_GEMM_KCQ };
		for (size_t ci = 0; ci < 3; ci++)
			for (int64_t n = 3; n <= 8; n++) {
				const int64_t rows = 9, cols = colss[ci];
				uint8_t *w = rand_matrix(q, rows, cols);
				float *x = randv(n * cols);
				float *ya = malloc(sizeof(float) * (size_t)(n * rows));
				float *yb = malloc(sizeof(float) * (size_t)(n * rows));
				assert_true(ya && yb);
				assert_int_equal(cpu_gemm_ref(ya, rows, x, n, w, FKV_F32, q, cols, 0, rows), 0);
				cpu_gemm_rows(yb, rows, x, n, w, FKV_F32, q, cols, 0, 5);
				cpu_gemm_rows(yb, rows, x, n, w, FKV_F32, q, cols, 5, rows);
				for (int64_t k = 0; k < n * rows; k++)
					if (memcmp(&ya[k], &yb[k], sizeof(float)))
						fail_msg("gemm %s %lldx%lld n=%lld: element %lld is %a in "
							 "the reference, %a by the kernel", quant_name(q),
							 (long long)rows, (long long)cols, (long long)n,
							 (long long)k, ya[k], yb[k]);
				free(w);
				free(x);
				free(ya);
				free(yb);
			}
	}
}

/* The Q4_K kernel with AVX-512 VNNI (cpu_q4k.c) against its scalar reference: the same bits for
 * one block, several and a 4096-column row, 1 to 11 activation rows (every tile of up to six and
 * a second tile; one row takes the four-weight-row decode path, with rows left alone), and within
 * 1e-5 of float64 on the quantized activation. */
static void test_q4k_kernels(void **state)
{
	(void)state;
	cpu_q4k_enable(true);
	if (!cpu_q4k_usable()) {
		printf("skipped: no AVX-512 VNNI here, so Q4_K takes cpu_qdot8 and cpu_gemm\n");
		return;
	}
	const int64_t colss[] = { QK_K, 3 * QK_K, 4096 };
	for (size_t ci = 0; ci < 3; ci++)
		for (int64_t n = 1; n <= 11; n++) {
			/* rows [0, 3) and [3, 13): alone, then (decode) two groups of four and two
			 * alone */
			const int64_t rows = 13, cols = colss[ci];
			const size_t ab = cpu_q4k_act_bytes(cols);
			uint8_t *w = rand_matrix(FKV_Q4_K, rows, cols);
			float *x = randv(n * cols), *wd = malloc(sizeof(float) * (size_t)(rows * cols));
			float *ya = malloc(sizeof(float) * (size_t)(n * rows));
			float *yb = malloc(sizeof(float) * (size_t)(n * rows));
			char *act = malloc(ab * (size_t)n);
			assert_true(wd && ya && yb && act);
			quant_dequant(FKV_Q4_K, wd, w, rows * cols);
			for (int64_t j = 0; j < n; j++)
				cpu_q4k_quantize(act + j * ab, x + j * cols, cols);
			cpu_q4k_rows_ref(ya, rows, act, n, w, cols, 0, rows);
			cpu_q4k_rows(yb, rows, act, n, w, cols, 0, 3);
			cpu_q4k_rows(yb, rows, act, n, w, cols, 3, rows);
			for (int64_t k = 0; k < n * rows; k++)
				if (memcmp(&ya[k], &yb[k], sizeof(float)))
					fail_msg("q4k %lld columns n=%lld: element %lld is %a in the "
						 "reference, %a by the kernel", (long long)cols,
						 (long long)n, (long long)k, ya[k], yb[k]);
			/* the quantized activation is cpu_qdot8's for Q4_K */
			for (int64_t j = 0; j < n; j++) {
				void *xq = quantize_act(x + j * cols, cols, FKV_Q4_K);
				float *xv = act_values(xq, cols, FKV_Q4_K);
				double e = dot_err(ya + j * rows, wd, xv, rows, cols);
				if (!(e < 1e-5))
					fail_msg("q4k %lld columns row %lld: error %g", (long long)cols,
						 (long long)j, e);
				free(xv);
				free(xq);
			}
			free(w);
			free(x);
			free(wd);
			free(ya);
			free(yb);
			free(act);
		}
}

static void test_backend_ops(void **state)
{
	(void)state;
	for (size_t f = 0; f < N_FMT; f++) {
		const enum fkv_quant q = formats[f];
		const int64_t rows = 300, cols = 512, n = 5;
		uint8_t *w = rand_matrix(q, rows, cols);
		float *wd = malloc(sizeof(float) * (size_t)(rows * cols)), *x = randv(n * cols);
		float *y[2], *e[2];
		assert_non_null(wd);
		quant_dequant(q, wd, w, rows * cols);
		struct fkv_tensor t = { .data = w, .dtype = FKV_F32, .n_dims = 2, .shape = { rows, cols }, .quant = q };
		struct backend_mat m;
		assert_int_equal(be->ops->weight_load(be->ctx, &t, &m), 0);
		assert_int_equal(m.quant, q);
		int32_t ids[3] = { 7, 0, 299 };
		for (int th = 0; th < 2; th++) {
			assert_int_equal(be->ops->set_threads(be->ctx, th + 1), 0);
			y[th] = malloc(sizeof(float) * (size_t)((n + 1) * rows));
			e[th] = malloc(sizeof(float) * (size_t)(3 * cols));
			assert_non_null(y[th]);
			assert_non_null(e[th]);
			assert_int_equal(be->ops->matmul(be->ctx, y[th], x, &m, 1), 0);
			assert_int_equal(be->ops->matmul(be->ctx, y[th] + rows, x, &m, n), 0);
			assert_int_equal(be->ops->embed(be->ctx, e[th], &m, ids, 3), 0);
			for (int64_t i = 0; i < n; i++) {
				/* Q4_K with AVX-512 VNNI quantizes every activation row (cpu_q4k.c) */
				const bool q8 = q == FKV_Q4_K && cpu_q4k_usable();
				void *xq = q8 ? quantize_act(x + i * cols, cols, q) : NULL;
				float *xv = q8 ? act_values(xq, cols, q) : NULL;
				double err = dot_err(y[th] + rows + i * rows, wd, q8 ? xv : x + i * cols,
						     rows, cols);
				if (!(err < 1e-5))
					fail_msg("%s matmul row %lld: error %g", quant_name(q), (long long)i, err);
				free(xv);
				free(xq);
			}
			if (cpu_qdot8_usable(q)) {
				/* one row takes the integer path: exact on the quantized activation,
				 * within its rounding of the f32 one */
				void *xq = quantize_act(x, cols, q);
				float *xv = act_values(xq, cols, q);
				assert_true(dot_err(y[th], wd, xv, rows, cols) < 1e-5);
				assert_true(dot_err(y[th], wd, x, rows, cols) < 1e-2);
				free(xv);
				free(xq);
			} else {
				assert_true(dot_err(y[th], wd, x, rows, cols) < 1e-5);
			}
			for (int i = 0; i < 3; i++)
				assert_memory_equal(e[th] + i * cols, wd + ids[i] * cols, sizeof(float) * cols);
		}
		assert_memory_equal(y[0], y[1], sizeof(float) * (size_t)((n + 1) * rows));
		be->ops->weight_release(be->ctx, &m);
		for (int th = 0; th < 2; th++) {
			free(y[th]);
			free(e[th]);
		}
		free(w);
		free(wd);
		free(x);
	}
	/* a row of partial blocks is refused, not read past */
	uint8_t blk[64] = { 0 };
	struct fkv_tensor bad = { .data = blk, .dtype = FKV_F32, .n_dims = 2, .shape = { 1, 48 }, .quant = FKV_Q8_0 };
	struct backend_mat m;
	assert_int_equal(be->ops->weight_load(be->ctx, &bad, &m), -EINVAL);
	assert_int_equal(be->ops->set_threads(be->ctx, 2), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_kernels),
		cmocka_unit_test(test_q8k_quantize),
		cmocka_unit_test(test_qdot8_kernels),
		cmocka_unit_test(test_gemm_kernels),
		cmocka_unit_test(test_q4k_kernels),
		cmocka_unit_test(test_backend_ops),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
