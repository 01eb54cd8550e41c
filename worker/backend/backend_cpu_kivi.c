/* backend_cpu_kivi — the CPU twins of the KIVI ops (docs/design.md §3 "KIVI copy", §5
 * `specache`): quantisation of whole key groups, dequantisation, and decode attention over a
 * KIVI copy in which some positions of each KV head read exact rows instead.
 *
 * Codes are computed in double from the group's min and max, exactly as the design writes the
 * formulas, so that the CUDA kernel and the float64 reference of the tests get the same codes;
 * z and s are then kept as f32 and a value is fmaf(s, code, z) (one rounding on every backend);
 * the codes are widened through a table of every byte's codes.
 * Attention goes through cpu_attn_run (backend_cpu.c) with a row callback for the quantised
 * positions (the fmaf gets the x86-64-v3 clone's FMA instruction, CPU_HOT): an exact
 * row where the KV head has one, else the row dequantised into the caller's scratch; the
 * residual and the step's rows are one span. So the arithmetic of a row is attn_prefill's,
 * and with no quantised position (or an exact row at every one) the result is its bits. */
#include "backend_cpu_priv.h"

#include <errno.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"

/* Below this many values quantisation runs on one thread. */
#define KIVI_PAR_MIN (1 << 16)

void cpu_kivi_free(struct cpu_ctx *c)
{
	free(c->kivi_map);
	free(c->kivi_pr);
	c->kivi_map = NULL;
	c->kivi_pr = NULL;
	c->kivi_map_len = c->kivi_pr_len = 0;
}

static int kivi_check(const struct backend_kivi *q)
{
	if (!q || (q->bits != 1 && q->bits != 2) || q->p <= 0 || q->d <= 0 || q->n_kv <= 0 ||
	    (q->d * q->bits) % 8 || q->gv != (q->p < q->d ? q->p : q->d))
		return -EINVAL;
	return 0;
}

static inline int kivi_cb(const struct backend_kivi *q)
{
	return q->d * q->bits / 8;
}

static inline int kivi_vg(const struct backend_kivi *q)
{
	return (q->d + q->gv - 1) / q->gv;
}

/* The design's zero and scale of a group with min mn and max mx. */
static inline void kivi_zs(double mn, double mx, int bits, double *z, double *s)
{
	if (bits == 2) {
		*z = mn;
		*s = (mx - mn) / 3.0;
	} else {
		*z = (3.0 * mn + mx) / 4.0;
		*s = (mx - mn) / 2.0;
	}
}

static inline unsigned kivi_code(double x, double z, double s, int bits)
{
	if (s == 0.0)
		return 0;
	double c = floor((x - z) / s + 0.5), top = (double)((1 << bits) - 1);
	if (!(c >= 0.0)) /* NaN included */
		return 0;
	return c > top ? (unsigned)top : (unsigned)c;
}

static inline void put_code(uint8_t *row, int c, int bits, unsigned code)
{
	const int per = 8 / bits;
	row[c / per] |= (uint8_t)(code << (c % per * bits));
}

static inline unsigned get_code(const uint8_t *row, int c, int bits)
{
	const int per = 8 / bits;
	return (unsigned)(row[c / per] >> (c % per * bits)) & ((1u << bits) - 1u);
}

int cpu_kivi_quant(void *ctx, const struct backend_kivi *q, int64_t t0, const void *k,
		   const void *v, int64_t n, enum fkv_dtype dt)
{
	(void)ctx;
	if (kivi_check(q) || t0 < 0 || n < 0 || t0 % q->p || n % q->p ||
	    (dt != FKV_F32 && dt != FKV_F16 && dt != FKV_BF16))
		return -EINVAL;
	const int p = q->p, d = q->d, H = q->n_kv, bits = q->bits, cb = kivi_cb(q);
	const int nvg = kivi_vg(q);
	const int64_t groups = n / p;
	const size_t row = (size_t)H * d;
	const bool par = (int64_t)n * (int64_t)row > KIVI_PAR_MIN;
	/* 16-bit rows are widened once (exactly), so the loops below read f32. */
	float *wide = NULL;
	const float *kf = k, *vf = v;
	if (dt != FKV_F32) {
		if (!(wide = malloc(2 * (size_t)n * row * sizeof *wide)))
			return -ENOMEM;
		dtype_to_f32(wide, k, dt, (size_t)n * row);
		dtype_to_f32(wide + (size_t)n * row, v, dt, (size_t)n * row);
		kf = wide;
		vf = wide + (size_t)n * row;
	}
	memset(q->kc + (size_t)t0 * H * cb, 0, (size_t)n * H * cb);
	memset(q->vc + (size_t)t0 * H * cb, 0, (size_t)n * H * cb);
	/* Keys: per (group, head), each channel over the group's p tokens. */
	#pragma omp parallel for schedule(static) if (par)
	for (int64_t gh = 0; gh < groups * H; gh++) {
		const int64_t g = gh / H;
		const int h = (int)(gh % H);
		float *zs = q->kzs + ((size_t)(t0 / p + g) * H + h) * 2 * d;
		for (int c = 0; c < d; c++) {
			double mn = INFINITY, mx = -INFINITY, z, s;
			for (int i = 0; i < p; i++) {
				double x = kf[(size_t)(g * p + i) * row + (size_t)h * d + c];
				mn = x < mn ? x : mn;
				mx = x > mx ? x : mx;
			}
			kivi_zs(mn, mx, bits, &z, &s);
			zs[c] = (float)z;
			zs[d + c] = (float)s;
			for (int i = 0; i < p; i++) {
				const size_t at = (size_t)(g * p + i) * row + (size_t)h * d + c;
				uint8_t *codes = q->kc + ((size_t)(t0 + g * p + i) * H + h) * cb;
				put_code(codes, c, bits, kivi_code(kf[at], z, s, bits));
			}
		}
	}
	/* Values: per (token, head), each group of gv channels. */
	#pragma omp parallel for schedule(static) if (par)
	for (int64_t th = 0; th < n * H; th++) {
		const int64_t t = th / H;
		const int h = (int)(th % H);
		const size_t base = (size_t)t * row + (size_t)h * d;
		uint8_t *codes = q->vc + ((size_t)(t0 + t) * H + h) * cb;
		float *zs = q->vzs + ((size_t)(t0 + t) * H + h) * 2 * nvg;
		for (int gi = 0; gi < nvg; gi++) {
			const int c0 = gi * q->gv, c1 = c0 + q->gv < d ? c0 + q->gv : d;
			double mn = INFINITY, mx = -INFINITY, z, s;
			for (int c = c0; c < c1; c++) {
				double x = vf[base + c];
				mn = x < mn ? x : mn;
				mx = x > mx ? x : mx;
			}
			kivi_zs(mn, mx, bits, &z, &s);
			zs[gi] = (float)z;
			zs[nvg + gi] = (float)s;
			for (int c = c0; c < c1; c++)
				put_code(codes, c, bits, kivi_code(vf[base + c], z, s, bits));
		}
	}
	free(wide);
	return 0;
}

/* The codes of every byte as floats: lut2[b][i] = (b >> 2i) & 3, lut1[b][i] = (b >> i) & 1
 * (channel c of a row is in byte c·bits/8 at bit (c % (8/bits))·bits). */
static float lut2[256][4], lut1[256][8];
static pthread_once_t lut_once = PTHREAD_ONCE_INIT;

static void lut_init(void)
{
	for (int b = 0; b < 256; b++) {
		for (int i = 0; i < 4; i++)
			lut2[b][i] = (float)((b >> (2 * i)) & 3);
		for (int i = 0; i < 8; i++)
			lut1[b][i] = (float)((b >> i) & 1);
	}
}

/* Key (pass 0) or value (pass 1) row of position t, head h, dequantised into out (d): the codes
 * widened through the table, then fmaf(s, code, z) per channel. */
CPU_HOT static void dequant_row(const struct backend_kivi *q, int pass, int64_t t, int h,
				 float *out)
{
	const int d = q->d, H = q->n_kv, cb = kivi_cb(q);
	const uint8_t *codes = (pass ? q->vc : q->kc) + ((size_t)t * H + h) * cb;
	if (q->bits == 2)
		for (int i = 0; i < cb; i++)
			memcpy(out + 4 * i, lut2[codes[i]], sizeof lut2[0]);
	else
		for (int i = 0; i < cb; i++)
			memcpy(out + 8 * i, lut1[codes[i]], sizeof lut1[0]);
	if (!pass) {
		const float *z = q->kzs + ((size_t)(t / q->p) * H + h) * 2 * d, *s = z + d;
		#pragma omp simd
		for (int c = 0; c < d; c++)
			out[c] = fmaf(s[c], out[c], z[c]);
		return;
	}
	const int nvg = kivi_vg(q);
	const float *z = q->vzs + ((size_t)t * H + h) * 2 * nvg, *s = z + nvg;
	for (int gi = 0; gi < nvg; gi++) {
		const int c0 = gi * q->gv, c1 = c0 + q->gv < d ? c0 + q->gv : d;
		const float zg = z[gi], sg = s[gi];
		#pragma omp simd
		for (int c = c0; c < c1; c++)
			out[c] = fmaf(sg, out[c], zg);
	}
}

int cpu_kivi_dequant(void *ctx, float *k, float *v, const struct backend_kivi *q, int64_t t0,
		     int64_t n)
{
	(void)ctx;
	if (kivi_check(q) || t0 < 0 || n < 0)
		return -EINVAL;
	pthread_once(&lut_once, lut_init);
	const int H = q->n_kv, d = q->d;
	#pragma omp parallel for schedule(static) if (n * H * d > KIVI_PAR_MIN)
	for (int64_t th = 0; th < n * H; th++) {
		const int64_t t = th / H;
		const int h = (int)(th % H);
		dequant_row(q, 0, t0 + t, h, k + ((size_t)t * H + h) * d);
		dequant_row(q, 1, t0 + t, h, v + ((size_t)t * H + h) * d);
	}
	return 0;
}

/* What kivi_row reads: the copy, the exact rows and which of them each position takes. */
struct kivi_src {
	const struct backend_kivi *q;
	const int32_t *map; /* (n_kv, n_quant) */
	int64_t n_quant;
	const void *fk, *fv; /* (n_kv, n_f, d) in dt */
	int n_f;
	enum fkv_dtype dt;
};

static const float *kivi_row(const void *arg, int pass, int64_t key, int kvh, float *tmp)
{
	const struct kivi_src *s = arg;
	const int d = s->q->d;
	const int32_t i = s->map[(size_t)kvh * (size_t)s->n_quant + (size_t)key];
	if (i < 0) {
		dequant_row(s->q, pass, key, kvh, tmp);
		return tmp;
	}
	/* The conversion every attention op uses (backend_cpu_priv.h): an exact row gives the
	 * bits it gives there. */
	return row_f32(tmp, pass ? s->fv : s->fk, s->dt, (int64_t)kvh * s->n_f + i, d);
}

static int grow(void **p, size_t *len, size_t n, size_t size)
{
	if (n <= *len)
		return 0;
	void *np = realloc(*p, n * size);
	if (!np)
		return -ENOMEM;
	*p = np;
	*len = n;
	return 0;
}

int cpu_attn_kivi(void *ctx, float *out, const float *q, int n_q,
		  const struct backend_kivi_attn *ka, const struct backend_attn *a)
{
	struct cpu_ctx *c = ctx;
	int ret = cpu_check_attn(a);
	if (ret)
		return ret;
	pthread_once(&lut_once, lut_init);
	const int64_t n_ctx = ka->n_quant + ka->n_dense;
	const int H = a->n_heads, KV = a->n_kv_heads, G = H / KV, d = a->head_dim;
	if (a->window || n_q < 1 || ka->n_quant < 0 || ka->n_dense < n_q || ka->n_f < 0 ||
	    (ka->n_quant && (kivi_check(ka->q) || ka->q->n_kv != KV || ka->q->d != d)) ||
	    (ka->n_f && (!ka->fk || !ka->fv || !ka->fpos)) ||
	    (ka->probs && (ka->n_prob < 0 || ka->n_prob > n_ctx)))
		return -EINVAL;
	const size_t map_len = (size_t)KV * (size_t)ka->n_quant;
	if ((ret = grow((void **)&c->kivi_map, &c->kivi_map_len, map_len ? map_len : 1,
			sizeof *c->kivi_map)))
		return ret;
	memset(c->kivi_map, 0xff, map_len * sizeof *c->kivi_map);
	for (int h = 0; h < KV && ka->n_quant; h++)
		for (int i = 0; i < ka->n_f; i++) {
			const int32_t pos = ka->fpos[(size_t)h * ka->n_f + i];
			if (pos == -1)
				continue;
			int32_t *m = c->kivi_map + (size_t)h * ka->n_quant + (pos >= 0 ? pos : 0);
			if (pos < 0 || pos >= ka->n_quant || *m >= 0)
				return -EINVAL;
			*m = i;
		}
	if (ka->n_f && !ka->n_quant)
		for (int i = 0; i < KV * ka->n_f; i++)
			if (ka->fpos[i] != -1)
				return -EINVAL;
	float *pr = NULL;
	if (ka->probs && ka->n_prob) {
		if ((ret = grow((void **)&c->kivi_pr, &c->kivi_pr_len, (size_t)H * ka->n_prob,
				sizeof *c->kivi_pr)))
			return ret;
		pr = c->kivi_pr;
	}
	const struct kivi_src ks = { ka->q, c->kivi_map, ka->n_quant, ka->fk, ka->fv, ka->n_f,
				     a->kv_dtype };
	const struct backend_kv_span span = { ka->k, ka->v, ka->n_dense, (int64_t)KV * d };
	struct attn_src *src = malloc((size_t)KV * sizeof *src);
	if (!src)
		return -ENOMEM;
	for (int h = 0; h < KV; h++)
		src[h] = (struct attn_src){ .spans = &span, .n_spans = 1, .n = n_ctx,
					    .row = ka->n_quant ? kivi_row : NULL, .arg = &ks,
					    .n_row = ka->n_quant };
	ret = cpu_attn_run(c, out, q, n_q, src, n_ctx, true, a, pr, pr ? ka->n_prob : 0);
	free(src);
	if (ret || !pr)
		return ret;
	for (int h = 0; h < KV; h++)
		for (int64_t j = 0; j < ka->n_prob; j++) {
			double m = 0.0;
			for (int g = 0; g < G; g++)
				m += pr[(size_t)(h * G + g) * ka->n_prob + j];
			ka->probs[(size_t)h * ka->n_prob + j] = (float)(m / G);
		}
	return 0;
}
