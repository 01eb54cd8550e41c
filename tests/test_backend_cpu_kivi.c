/* Tests for worker/backend/backend_cpu_kivi.c, the KIVI ops of the CPU backend (docs/design.md §5
 * `specache`):
 *   - kivi_quant against a float64 reference of the design's formulas written here, bit for bit
 *     on the packed codes and on the f32 zeros and scales, for both bit widths, every KV dtype,
 *     value groups that divide the head dimension and one that does not, groups wider than a
 *     head, constant groups (s = 0) and values exactly half-way between two codes; one group
 *     worked out by hand;
 *   - kivi_dequant: every value is fmaf(s, code, z) bit for bit, and near the float64 formula;
 *   - attn_kivi against a float64 attention over the dequantised rows with exact rows in their
 *     place (outputs and the last row's group-mean probabilities), one and two query rows,
 *     threaded and not; bit for bit equal to attn_prefill over the same rows when nothing is
 *     quantised, and when every quantised position has its exact row; refusals. */
#include "test_util.h"

#include <errno.h>
#include <math.h>

#include "test_backend.h"

static uint64_t seed = 0x4b1f1;

static const enum fkv_dtype dtypes[] = { FKV_F32, FKV_F16, FKV_BF16 };

struct kbuf {
	struct backend_kivi q;
	int64_t cap;
};

static void kbuf_init(struct kbuf *b, int bits, int p, int d, int n_kv, int64_t cap)
{
	b->cap = cap;
	int cb = d * bits / 8, gv = p < d ? p : d, nvg = (d + gv - 1) / gv;
	b->q = (struct backend_kivi){
		.kc = calloc((size_t)cap * n_kv * cb, 1),
		.kzs = calloc((size_t)(cap / p) * n_kv * d * 2, sizeof(float)),
		.vc = calloc((size_t)cap * n_kv * cb, 1),
		.vzs = calloc((size_t)cap * n_kv * nvg * 2, sizeof(float)),
		.bits = bits, .p = p, .gv = gv, .n_kv = n_kv, .d = d,
	};
	assert_true(b->q.kc && b->q.kzs && b->q.vc && b->q.vzs);
}

static void kbuf_free(struct kbuf *b)
{
	free(b->q.kc);
	free(b->q.kzs);
	free(b->q.vc);
	free(b->q.vzs);
}

/* n values of dtype t: random in [-scale, scale), exact in t; their f32 values in *f. */
static void *rand_rows(enum fkv_dtype t, int64_t n, float scale, float **f)
{
	*f = malloc((size_t)n * sizeof **f);
	void *r = malloc((size_t)n * dtype_size(t));
	assert_true(*f && r);
	for (int64_t i = 0; i < n; i++)
		(*f)[i] = test_randf(&seed) * scale;
	dtype_from_f32(r, *f, t, (size_t)n);
	dtype_to_f32(*f, r, t, (size_t)n);
	return r;
}

/* ---- float64 reference of the quantisation (docs/design.md §5 `specache`, "KIVI") ---- */

/* Zero, scale and codes of one group of n values x (stride apart). */
static void ref_group(const float *x, int n, size_t stride, int bits, double *z, double *s,
		      unsigned *codes)
{
	double mn = x[0], mx = x[0];
	for (int i = 1; i < n; i++) {
		mn = fmin(mn, x[i * stride]);
		mx = fmax(mx, x[i * stride]);
	}
	*z = bits == 2 ? mn : (3 * mn + mx) / 4;
	*s = bits == 2 ? (mx - mn) / 3 : (mx - mn) / 2;
	for (int i = 0; i < n; i++) {
		double c = *s == 0 ? 0 : floor((x[i * stride] - *z) / *s + 0.5);
		codes[i] = c < 0 ? 0u : c > (1 << bits) - 1 ? (unsigned)((1 << bits) - 1) : (unsigned)c;
	}
}

static void ref_put(uint8_t *row, int c, int bits, unsigned code)
{
	row[c * bits / 8] |= (uint8_t)(code << (c * bits % 8));
}

/* Expected codes and (z, s) for positions [t0, t0 + n) of kf, vf (n, n_kv, d) into r. */
static void ref_quant(struct kbuf *r, int64_t t0, const float *kf, const float *vf, int64_t n)
{
	const struct backend_kivi *q = &r->q;
	const int p = q->p, d = q->d, H = q->n_kv, cb = d * q->bits / 8, gv = q->gv;
	const int nvg = (d + gv - 1) / gv;
	unsigned codes[256];
	double z, s;
	for (int64_t g = 0; g < n / p; g++)
		for (int h = 0; h < H; h++)
			for (int c = 0; c < d; c++) {
				ref_group(kf + (g * p * H + h) * d + c, p, (size_t)H * d, q->bits, &z,
					  &s, codes);
				float *zs = q->kzs + ((t0 / p + g) * H + h) * 2 * d + c;
				zs[0] = (float)z;
				zs[d] = (float)s;
				for (int i = 0; i < p; i++)
					ref_put(q->kc + ((t0 + g * p + i) * H + h) * cb, c, q->bits,
						codes[i]);
			}
	for (int64_t t = 0; t < n; t++)
		for (int h = 0; h < H; h++)
			for (int gi = 0; gi < nvg; gi++) {
				int c0 = gi * gv, w = c0 + gv < d ? gv : d - c0;
				ref_group(vf + (t * H + h) * d + c0, w, 1, q->bits, &z, &s, codes);
				float *zs = q->vzs + ((t0 + t) * H + h) * 2 * nvg + gi;
				zs[0] = (float)z;
				zs[nvg] = (float)s;
				for (int i = 0; i < w; i++)
					ref_put(q->vc + ((t0 + t) * H + h) * cb, c0 + i, q->bits,
						codes[i]);
			}
}

static void expect_same_copy(const struct kbuf *a, const struct kbuf *b, const char *what)
{
	const struct backend_kivi *q = &a->q;
	const int cb = q->d * q->bits / 8, nvg = (q->d + q->gv - 1) / q->gv;
	const size_t codes = (size_t)a->cap * q->n_kv * cb;
	if (memcmp(a->q.kc, b->q.kc, codes) || memcmp(a->q.vc, b->q.vc, codes))
		fail_msg("%s: codes differ from the float64 reference", what);
	if (memcmp(a->q.kzs, b->q.kzs, (size_t)(a->cap / q->p) * q->n_kv * q->d * 8) ||
	    memcmp(a->q.vzs, b->q.vzs, (size_t)a->cap * q->n_kv * nvg * 8))
		fail_msg("%s: zeros or scales differ from the float64 reference", what);
}

/* Positions [2p, 2p + n) of a 4p + n copy, so the op must leave the others alone. */
static void check_quant(int bits, int p, int d, int H, int64_t n, enum fkv_dtype t)
{
	const int64_t t0 = 2 * p, cap = t0 + n + 2 * p;
	float *kf, *vf;
	void *k = rand_rows(t, n * H * d, 3.0f, &kf), *v = rand_rows(t, n * H * d, 0.5f, &vf);
	/* A constant channel (s = 0) in the first key group, a constant value group in row 0,
	 * and half-way values: x = z + (c + 1/2)s exactly, for bits 2 with mn 0 and mx 3. */
	for (int i = 0; i < p; i++)
		kf[(size_t)i * H * d + 1] = 0.25f;
	for (int c = 0; c < (p < d ? p : d); c++)
		vf[c] = -0.75f;
	if (bits == 2 && p >= 5)
		for (int i = 0; i < p; i++)
			kf[(size_t)i * H * d] = i < 5 ? (float[]){ 0.0f, 0.5f, 1.5f, 2.5f, 3.0f }[i]
						      : 1.0f;
	dtype_from_f32(k, kf, t, (size_t)(n * H * d));
	dtype_from_f32(v, vf, t, (size_t)(n * H * d));
	struct kbuf got, want;
	kbuf_init(&got, bits, p, d, H, cap);
	kbuf_init(&want, bits, p, d, H, cap);
	assert_int_equal(be->ops->kivi_quant(be->ctx, &got.q, t0, k, v, n, t), 0);
	ref_quant(&want, t0, kf, vf, n);
	char what[96];
	snprintf(what, sizeof what, "kivi_quant bits %d p %d d %d n_kv %d n %lld %s", bits, p, d, H,
		 (long long)n, dtype_name(t));
	expect_same_copy(&got, &want, what);
	/* Dequantised: fmaf(s, code, z) exactly, and the float64 formula to f32 rounding. */
	float *dk = malloc((size_t)n * H * d * 4), *dv = malloc((size_t)n * H * d * 4);
	assert_true(dk && dv);
	assert_int_equal(be->ops->kivi_dequant(be->ctx, dk, dv, &got.q, t0, n), 0);
	const int cb = d * bits / 8, gv = p < d ? p : d, nvg = (d + gv - 1) / gv;
	for (int64_t tt = 0; tt < n; tt++)
		for (int h = 0; h < H; h++)
			for (int c = 0; c < d; c++) {
				const int64_t pos = t0 + tt;
				const size_t at = ((size_t)tt * H + h) * d + c;
				unsigned ck = want.q.kc[(pos * H + h) * cb + c * bits / 8] >>
					      (c * bits % 8) & ((1u << bits) - 1);
				unsigned cv = want.q.vc[(pos * H + h) * cb + c * bits / 8] >>
					      (c * bits % 8) & ((1u << bits) - 1);
				const float *kz = want.q.kzs + ((pos / p) * H + h) * 2 * d + c;
				const float *vz = want.q.vzs + (pos * H + h) * 2 * nvg + c / gv;
				float ek = fmaf(kz[d], (float)ck, kz[0]);
				float ev = fmaf(vz[nvg], (float)cv, vz[0]);
				if (memcmp(&ek, &dk[at], 4) || memcmp(&ev, &dv[at], 4))
					fail_msg("%s: dequantised value differs at %lld/%d/%d", what,
						 (long long)pos, h, c);
				double fk = (double)kz[0] + (double)kz[d] * ck;
				assert_true(fabs(dk[at] - fk) <= 1e-6 * (fabs(fk) + 1e-30) + 1e-37);
			}
	free(dk);
	free(dv);
	kbuf_free(&got);
	kbuf_free(&want);
	free(k);
	free(v);
	free(kf);
	free(vf);
}

static void test_quant_vs_reference(void **state)
{
	(void)state;
	/* bits, p, d, n_kv, tokens */
	static const int geo[][5] = {
		{ 2, 8, 8, 4, 24 }, { 1, 8, 8, 4, 24 },	    /* stories260K's heads */
		{ 2, 32, 128, 2, 64 }, { 1, 32, 128, 2, 64 }, /* Llama's, p = 32 */
		{ 2, 12, 16, 3, 36 }, { 1, 12, 16, 3, 36 },   /* gv = 12: groups of 12 and 4 */
		{ 2, 64, 32, 2, 128 }, { 1, 4, 16, 1, 8 },    /* gv = d; short groups */
	};
	for (size_t i = 0; i < sizeof geo / sizeof *geo; i++)
		for (size_t t = 0; t < 3; t++)
			check_quant(geo[i][0], geo[i][1], geo[i][2], geo[i][3], geo[i][4], dtypes[t]);
	/* Enough values for the threaded loops. */
	check_quant(2, 32, 128, 8, 256, FKV_BF16);
}

/* One key group and one value row worked out by hand (p 4, d 8, one head). */
static void test_quant_by_hand(void **state)
{
	(void)state;
	float k[4 * 8] = { 0 }, v[4 * 8] = { 0 };
	/* Key channel 0 over the group: 0, 1, 2, 3 with bits 2: mn 0, mx 3, z 0, s 1, codes =
	 * the values. Channel 1: 10, 10, 10, 10: s 0, every code 0, z 10. */
	for (int i = 0; i < 4; i++) {
		k[i * 8] = (float)i;
		k[i * 8 + 1] = 10.0f;
	}
	/* Value row 0, channels 0..3 (a group of gv = 4): -1, 0, 0.5, 1: bits 2: z -1, s 2/3;
	 * (x - z)/s + 1/2 = 0.5, 2, 2.75, 3.5: codes 0, 2, 2, 3 (floor). */
	v[0] = -1.0f;
	v[1] = 0.0f;
	v[2] = 0.5f;
	v[3] = 1.0f;
	struct kbuf b;
	kbuf_init(&b, 2, 4, 8, 1, 4);
	assert_int_equal(be->ops->kivi_quant(be->ctx, &b.q, 0, k, v, 4, FKV_F32), 0);
	for (int i = 0; i < 4; i++)
		assert_int_equal(b.q.kc[i * 2] & 0xf, (unsigned)i); /* channel 0 code i, channel 1 0 */
	/* (z, s) of channels 0 and 1: z row (8 channels), then s row. */
	assert_true(b.q.kzs[0] == 0.0f && b.q.kzs[8] == 1.0f);
	assert_true(b.q.kzs[1] == 10.0f && b.q.kzs[9] == 0.0f);
	assert_int_equal(b.q.vc[0], 0 | 2 << 2 | 2 << 4 | 3 << 6);
	/* Two value groups of 4 channels: z of both, then s of both. */
	assert_true(b.q.vzs[0] == -1.0f && b.q.vzs[2] == (float)(2.0 / 3.0));
	/* bits 1, the same value group: z = (3·(-1) + 1)/4 = -0.5, s = 1: codes
	 * floor(-0.5/1 + 0.5) = 0, floor(0.5 + 0.5) = 1, floor(1.5) = 1, floor(2) = 1. */
	struct kbuf b1;
	kbuf_init(&b1, 1, 4, 8, 1, 4);
	assert_int_equal(be->ops->kivi_quant(be->ctx, &b1.q, 0, k, v, 4, FKV_F32), 0);
	assert_int_equal(b1.q.vc[0] & 0xf, 0 | 1 << 1 | 1 << 2 | 1 << 3);
	assert_true(b1.q.vzs[0] == -0.5f && b1.q.vzs[2] == 1.0f);
	kbuf_free(&b);
	kbuf_free(&b1);
}

static void test_quant_refusals(void **state)
{
	(void)state;
	float k[64] = { 0 };
	struct kbuf b;
	kbuf_init(&b, 2, 8, 8, 1, 16);
	const struct backend_ops *o = be->ops;
	assert_int_equal(o->kivi_quant(be->ctx, &b.q, 4, k, k, 8, FKV_F32), -EINVAL); /* t0 */
	assert_int_equal(o->kivi_quant(be->ctx, &b.q, 0, k, k, 5, FKV_F32), -EINVAL); /* n */
	b.q.bits = 3;
	assert_int_equal(o->kivi_quant(be->ctx, &b.q, 0, k, k, 8, FKV_F32), -EINVAL);
	b.q.bits = 2;
	b.q.gv = 4; /* not min(p, d) */
	assert_int_equal(o->kivi_quant(be->ctx, &b.q, 0, k, k, 8, FKV_F32), -EINVAL);
	b.q.gv = 8;
	b.q.d = 6; /* 6 · 2 bits is not whole bytes */
	assert_int_equal(o->kivi_dequant(be->ctx, k, k, &b.q, 0, 8), -EINVAL);
	kbuf_free(&b);
}

/* ---- attention ---- */

struct attn_case {
	int H, KV, d, p, bits;
	int64_t n_quant, n_dense;
	int n_q, n_f;
	enum fkv_dtype t;
};

/* A KIVI copy of n_quant random positions, exact rows (their true rows, or random ones) at
 * n_f positions per head (some unused), dense rows and queries; the op against float64. */
static void check_attn(const struct attn_case *c, bool full_cover)
{
	const int H = c->H, KV = c->KV, d = c->d, G = H / KV;
	const int64_t nq = c->n_quant, nd = c->n_dense, n_ctx = nq + nd, row = (int64_t)KV * d;
	const int n_f = full_cover ? (int)nq : c->n_f;
	float *kf, *vf, *df_k, *df_v, *ff_k, *ff_v;
	void *k = rand_rows(c->t, nq * row, 2.0f, &kf), *v = rand_rows(c->t, nq * row, 1.0f, &vf);
	void *dk = rand_rows(c->t, nd * row, 2.0f, &df_k), *dv = rand_rows(c->t, nd * row, 1.0f, &df_v);
	void *fk = rand_rows(c->t, (int64_t)KV * (n_f ? n_f : 1) * d, 2.0f, &ff_k);
	void *fv = rand_rows(c->t, (int64_t)KV * (n_f ? n_f : 1) * d, 1.0f, &ff_v);
	int32_t *fpos = malloc((size_t)KV * (n_f ? n_f : 1) * sizeof *fpos);
	assert_non_null(fpos);
	/* Positions: distinct per head, shuffled; every third row unused unless full cover; full
	 * cover takes each position's true row. */
	for (int h = 0; h < KV; h++) {
		int32_t *fp = fpos + (size_t)h * n_f;
		for (int i = 0; i < n_f; i++)
			fp[i] = full_cover ? (int32_t)(nq - 1 - i) : (int32_t)((i * 7 + h * 3) % nq);
		for (int i = 0; !full_cover && i < n_f; i++)
			for (int j = 0; j < i; j++)
				assert_true(fp[i] != fp[j]); /* the formula gives distinct ones */
		if (!full_cover && n_f > 2)
			fp[2] = -1;
		if (full_cover)
			for (int i = 0; i < n_f; i++) {
				size_t src = ((size_t)fp[i] * KV + h) * d, dst = ((size_t)h * n_f + i) * d;
				size_t es = dtype_size(c->t);
				memcpy((char *)fk + dst * es, (char *)k + src * es, d * es);
				memcpy((char *)fv + dst * es, (char *)v + src * es, d * es);
				memcpy(ff_k + dst, kf + src, d * 4);
				memcpy(ff_v + dst, vf + src, d * 4);
			}
	}
	struct kbuf b;
	kbuf_init(&b, c->bits, c->p, d, KV, nq ? nq : c->p);
	assert_int_equal(be->ops->kivi_quant(be->ctx, &b.q, 0, k, v, nq, c->t), 0);
	const size_t deq = (size_t)(nq ? nq : 1) * row * 4;
	float *deq_k = malloc(deq), *deq_v = malloc(deq);
	assert_true(deq_k && deq_v);
	assert_int_equal(be->ops->kivi_dequant(be->ctx, deq_k, deq_v, &b.q, 0, nq), 0);
	float *q = malloc((size_t)c->n_q * H * d * 4), *out = malloc((size_t)c->n_q * H * d * 4);
	const int64_t n_prob = nq + 3 <= n_ctx - c->n_q ? nq + 3 : nq;
	float *probs = malloc((size_t)KV * (n_prob ? n_prob : 1) * 4);
	double *ref = malloc((size_t)c->n_q * H * d * 8), *rp = calloc((size_t)KV * (n_prob + 1), 8);
	double *sc = malloc((size_t)n_ctx * 8);
	assert_true(q && out && probs && ref && rp && sc);
	for (int i = 0; i < c->n_q * H * d; i++)
		q[i] = test_randf(&seed) * 2.0f;
	/* float64: each position's row (exact row where the head has one, else dequantised). */
	for (int i = 0; i < c->n_q; i++)
		for (int h = 0; h < H; h++) {
			const int kvh = h / G;
			const int64_t last = n_ctx - c->n_q + i;
			const float *qh = q + ((size_t)i * H + h) * d;
			double mx = -INFINITY, z = 0;
			for (int64_t j = 0; j <= last; j++) {
				const float *kr = j < nq ? deq_k + (j * KV + kvh) * d
							 : df_k + ((j - nq) * KV + kvh) * d;
				for (int f = 0; j < nq && f < n_f; f++)
					if (fpos[kvh * n_f + f] == j)
						kr = ff_k + ((size_t)kvh * n_f + f) * d;
				double s = 0;
				for (int e = 0; e < d; e++)
					s += (double)qh[e] * kr[e];
				sc[j] = s / sqrt((double)d);
				mx = fmax(mx, sc[j]);
			}
			for (int64_t j = 0; j <= last; j++)
				z += (sc[j] = exp(sc[j] - mx));
			double *o = ref + ((size_t)i * H + h) * d;
			for (int e = 0; e < d; e++)
				o[e] = 0;
			for (int64_t j = 0; j <= last; j++) {
				const float *vr = j < nq ? deq_v + (j * KV + kvh) * d
							 : df_v + ((j - nq) * KV + kvh) * d;
				for (int f = 0; j < nq && f < n_f; f++)
					if (fpos[kvh * n_f + f] == j)
						vr = ff_v + ((size_t)kvh * n_f + f) * d;
				for (int e = 0; e < d; e++)
					o[e] += sc[j] / z * vr[e];
			}
			for (int64_t j = 0; i == c->n_q - 1 && j < n_prob; j++)
				rp[kvh * n_prob + j] += sc[j] / z / G;
		}
	struct backend_attn a = { H, KV, d, c->t, 1.0f / sqrtf((float)d), 0 };
	struct backend_kivi_attn ka = {
		.q = &b.q, .n_quant = nq, .fk = fk, .fv = fv, .fpos = fpos, .n_f = n_f,
		.k = dk, .v = dv, .n_dense = nd, .probs = probs, .n_prob = n_prob,
	};
	assert_int_equal(be->ops->attn_kivi(be->ctx, out, q, c->n_q, &ka, &a), 0);
	char what[128];
	snprintf(what, sizeof what, "attn_kivi H %d KV %d d %d bits %d quant %lld dense %lld "
		 "rows %d exact %d %s", H, KV, d, c->bits, (long long)nq, (long long)nd, c->n_q,
		 n_f, dtype_name(c->t));
	double e = nerr(out, ref, (int64_t)c->n_q * H * d), ep = nerr(probs, rp, KV * n_prob);
	if (e > 1e-5 || ep > 1e-5)
		fail_msg("%s: error %g, probabilities %g", what, e, ep);
	if (full_cover || !nq) {
		/* Every row exact: attn_prefill over them, bit for bit. */
		size_t es = dtype_size(c->t);
		char *all_k = malloc((size_t)n_ctx * row * es), *all_v = malloc((size_t)n_ctx * row * es);
		float *out2 = malloc((size_t)c->n_q * H * d * 4);
		assert_true(all_k && all_v && out2);
		memcpy(all_k, k, (size_t)nq * row * es);
		memcpy(all_v, v, (size_t)nq * row * es);
		memcpy(all_k + (size_t)nq * row * es, dk, (size_t)nd * row * es);
		memcpy(all_v + (size_t)nq * row * es, dv, (size_t)nd * row * es);
		assert_int_equal(be->ops->attn_prefill(be->ctx, out2, q, c->n_q, all_k, all_v, n_ctx,
						       &a), 0);
		if (memcmp(out, out2, (size_t)c->n_q * H * d * 4))
			fail_msg("%s: differs from attn_prefill over the same exact rows", what);
		free(all_k);
		free(all_v);
		free(out2);
	}
	kbuf_free(&b);
	free(k);
	free(v);
	free(kf);
	free(vf);
	free(dk);
	free(dv);
	free(df_k);
	free(df_v);
	free(fk);
	free(fv);
	free(ff_k);
	free(ff_v);
	free(fpos);
	free(deq_k);
	free(deq_v);
	free(q);
	free(out);
	free(probs);
	free(ref);
	free(rp);
	free(sc);
}

static void test_attn_vs_reference(void **state)
{
	(void)state;
	for (size_t t = 0; t < 3; t++)
		for (int bits = 1; bits <= 2; bits++)
			for (int n_q = 1; n_q <= 2; n_q++) {
				/* stories260K's geometry; a wider one; GQA 1 */
				struct attn_case cs[] = {
					{ 8, 4, 8, 8, bits, 48, 19, n_q, 5, dtypes[t] },
					{ 8, 2, 16, 8, bits, 64, 13, n_q, 9, dtypes[t] },
					{ 4, 4, 32, 16, bits, 32, 2, n_q, 0, dtypes[t] },
				};
				for (size_t i = 0; i < sizeof cs / sizeof *cs; i++)
					check_attn(&cs[i], false);
			}
	/* Threaded: n_q · H · keys · d above the threshold. */
	struct attn_case big = { 8, 2, 64, 32, 2, 2048, 70, 2, 64, FKV_BF16 };
	check_attn(&big, false);
}

static void test_attn_exact_rows_equal_prefill(void **state)
{
	(void)state;
	for (size_t t = 0; t < 3; t++)
		for (int n_q = 1; n_q <= 2; n_q++) {
			struct attn_case none = { 8, 4, 8, 8, 2, 0, 40, n_q, 0, dtypes[t] };
			check_attn(&none, false);
			struct attn_case all = { 8, 4, 8, 8, 2, 40, 21, n_q, 0, dtypes[t] };
			check_attn(&all, true);
		}
	struct attn_case big = { 8, 2, 64, 32, 1, 1024, 70, 2, 0, FKV_F32 };
	check_attn(&big, true);
}

static void test_attn_refusals(void **state)
{
	(void)state;
	enum { H = 2, KV = 1, d = 8, P = 8 };
	float rows[32 * d] = { 0 }, q[2 * H * d] = { 0 }, out[2 * H * d];
	struct kbuf b;
	kbuf_init(&b, 2, P, d, KV, 16);
	assert_int_equal(be->ops->kivi_quant(be->ctx, &b.q, 0, rows, rows, 16, FKV_F32), 0);
	int32_t fpos[2] = { 3, 3 };
	struct backend_attn a = { H, KV, d, FKV_F32, 0.3f, 0 };
	struct backend_kivi_attn ka = { .q = &b.q, .n_quant = 16, .fk = rows, .fv = rows,
					.fpos = fpos, .n_f = 2, .k = rows, .v = rows, .n_dense = 4 };
	const struct backend_ops *o = be->ops;
	assert_int_equal(o->attn_kivi(be->ctx, out, q, 1, &ka, &a), -EINVAL); /* 3 twice */
	fpos[1] = 16;
	assert_int_equal(o->attn_kivi(be->ctx, out, q, 1, &ka, &a), -EINVAL); /* not quantised */
	fpos[1] = -1;
	assert_int_equal(o->attn_kivi(be->ctx, out, q, 1, &ka, &a), 0);
	assert_int_equal(o->attn_kivi(be->ctx, out, q, 5, &ka, &a), -EINVAL); /* rows > dense */
	a.window = 4;
	assert_int_equal(o->attn_kivi(be->ctx, out, q, 1, &ka, &a), -EINVAL);
	a.window = 0;
	ka.probs = out;
	ka.n_prob = 21;
	assert_int_equal(o->attn_kivi(be->ctx, out, q, 1, &ka, &a), -EINVAL); /* past the keys */
	kbuf_free(&b);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_quant_vs_reference),
		cmocka_unit_test(test_quant_by_hand),
		cmocka_unit_test(test_quant_refusals),
		cmocka_unit_test(test_attn_vs_reference),
		cmocka_unit_test(test_attn_exact_rows_equal_prefill),
		cmocka_unit_test(test_attn_refusals),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
