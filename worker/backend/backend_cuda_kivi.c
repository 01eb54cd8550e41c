/* backend_cuda_kivi — the KIVI ops of the CUDA backend (docs/design.md §5 `specache`): the
 * quantisation and dequantisation kernels of kernels/kivi.cu, and attn_kivi composed of tested
 * kernels on the compute stream: the quantised positions dequantised into a workspace, the
 * exact rows put over them, the residual and the step's rows widened after them, then
 * prefill_attention over the whole (f32) and attn_probs for the last row. That costs a write
 * and a read of f32 rows for every position each step, which a fused kernel reading the codes
 * would not (not built yet). The workspace is replaced in stream order like the backend's
 * others. The positions of the exact rows are device memory and are not checked here (the CPU
 * twin checks them). Only built with CUDA. */
#include "backend.h"

#include <errno.h>

#include "attn_probs.cuh"
#include "cuda_check.h"
#include "kivi.cuh"
#include "prefill_attention.cuh"

#include "backend_cuda_priv.h"

static int kivi_check(const struct backend_kivi *q)
{
	if (!q || (q->bits != 1 && q->bits != 2) || q->p <= 0 || q->d <= 0 || q->n_kv <= 0 ||
	    (q->d * q->bits) % 8 || q->gv != (q->p < q->d ? q->p : q->d))
		return -EINVAL;
	return 0;
}

int cuda_kivi_quant(void *ctx, const struct backend_kivi *q, int64_t t0, const void *k,
		    const void *v, int64_t n, enum fkv_dtype dt)
{
	struct cuda_ctx *c = ctx;
	if (kivi_check(q))
		return -EINVAL;
	CUDA_CHECK(kivi_quant(q->kc, q->kzs, q->vc, q->vzs, k, v, dt, t0, n, q->n_kv, q->d, q->p,
			      q->bits, c->stream));
	return 0;
}

int cuda_kivi_dequant(void *ctx, float *k, float *v, const struct backend_kivi *q, int64_t t0,
		      int64_t n)
{
	struct cuda_ctx *c = ctx;
	if (kivi_check(q))
		return -EINVAL;
	CUDA_CHECK(kivi_dequant(k, v, q->kc, q->kzs, q->vc, q->vzs, t0, n, q->n_kv, q->d, q->p,
				q->bits, c->stream));
	return 0;
}

int cuda_attn_kivi(void *ctx, float *out, const float *q, int n_q,
		   const struct backend_kivi_attn *ka, const struct backend_attn *a)
{
	struct cuda_ctx *c = ctx;
	const int64_t n_ctx = ka->n_quant + ka->n_dense;
	const int H = a->n_heads, KV = a->n_kv_heads, d = a->head_dim;
	if (KV <= 0 || d <= 0 || H % KV || a->window || n_q < 1 || ka->n_quant < 0 ||
	    ka->n_dense < n_q || ka->n_f < 0 || n_ctx > INT32_MAX ||
	    (ka->n_quant && (kivi_check(ka->q) || ka->q->n_kv != KV || ka->q->d != d)) ||
	    (ka->n_f && ka->n_quant && (!ka->fk || !ka->fv || !ka->fpos)) ||
	    (ka->probs && (ka->n_prob < 0 || ka->n_prob > n_ctx)))
		return -EINVAL;
	const size_t row = (size_t)KV * d, rows = (size_t)n_ctx * row;
	const bool probs = ka->probs && ka->n_prob;
	const size_t bytes = (2 * rows + (probs ? (size_t)H * (n_ctx + 2) : 0)) * sizeof(float);
	int ret = cuda_ws_reserve(c, &c->kivi_ws, &c->kivi_ws_bytes, bytes);
	if (ret)
		return ret;
	float *dk = c->kivi_ws, *dv = dk + rows, *sc = dv + rows;
	const struct backend_kivi *kq = ka->q;
	if (ka->n_quant) {
		CUDA_CHECK(kivi_dequant(dk, dv, kq->kc, kq->kzs, kq->vc, kq->vzs, 0, ka->n_quant, KV,
					d, kq->p, kq->bits, c->stream));
		CUDA_CHECK(kivi_put_rows(dk, ka->fk, a->kv_dtype, ka->fpos, KV, ka->n_f, d,
					 c->stream));
		CUDA_CHECK(kivi_put_rows(dv, ka->fv, a->kv_dtype, ka->fpos, KV, ka->n_f, d,
					 c->stream));
	}
	const size_t at = (size_t)ka->n_quant * row, dense = (size_t)ka->n_dense * row;
	CUDA_CHECK(kivi_widen(dk + at, ka->k, a->kv_dtype, (long long)dense, c->stream));
	CUDA_CHECK(kivi_widen(dv + at, ka->v, a->kv_dtype, (long long)dense, c->stream));
	CUDA_CHECK(prefill_attention(out, q, dk, dv, FKV_F32, n_q, (int)n_ctx, H, KV, d, a->scale,
				     0, c->stream));
	if (probs)
		CUDA_CHECK(attn_probs(ka->probs, sc, q + (size_t)(n_q - 1) * H * d, dk, n_ctx,
				      ka->n_prob, H, KV, d, a->scale, c->stream));
	return 0;
}
