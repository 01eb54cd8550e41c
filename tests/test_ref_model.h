/* The layers of a float64 reference forward pass of a Llama-family model, written from the model's
 * description and sharing nothing with worker/ (tensors are read only through model.h and
 * dtype.h): element access, linear layers, RMSNorm, rotary embedding. Used by the float64
 * references of test_engine.c (the whole model) and test_specache_ref.h (the specache policy).
 * Header-only; include after test_util.h. */
#ifndef FREEKV_TEST_REF_MODEL_H
#define FREEKV_TEST_REF_MODEL_H

#include <math.h>

#include "dtype.h"
#include "model.h"

static inline double ref_el(const struct fkv_tensor *t, int64_t i)
{
	float f;
	dtype_to_f32(&f, (const char *)t->data + (size_t)i * dtype_size(t->dtype), t->dtype, 1);
	return f;
}

/* y (rows) = W (rows, cols) x (cols) */
static inline void ref_linear(double *y, const struct fkv_tensor *w, const double *x)
{
	int64_t rows = w->shape[0], cols = w->shape[1];
	for (int64_t r = 0; r < rows; r++) {
		double s = 0;
		for (int64_t c = 0; c < cols; c++)
			s += ref_el(w, r * cols + c) * x[c];
		y[r] = s;
	}
}

static inline void ref_norm(double *y, const double *x, const struct fkv_tensor *w, int n, double eps)
{
	double ss = 0;
	for (int i = 0; i < n; i++)
		ss += x[i] * x[i];
	double r = 1.0 / sqrt(ss / n + eps);
	for (int i = 0; i < n; i++)
		y[i] = x[i] * r * ref_el(w, i);
}

static inline double ref_inv_freq(const struct fkv_model_config *c, int i)
{
	double f = 1.0 / pow(c->rope_theta, 2.0 * i / c->head_dim);
	if (c->rope_scaling_factor <= 0)
		return f;
	double wl = 2 * M_PI / f;
	double lo = c->rope_original_ctx / c->rope_low_freq_factor;
	double hi = c->rope_original_ctx / c->rope_high_freq_factor;
	if (wl < hi)
		return f;
	if (wl > lo)
		return f / c->rope_scaling_factor;
	double sm = (c->rope_original_ctx / wl - c->rope_low_freq_factor) /
		    (c->rope_high_freq_factor - c->rope_low_freq_factor);
	return (1 - sm) * f / c->rope_scaling_factor + sm * f;
}

static inline void ref_rotate(double *v, int heads, const struct fkv_model_config *c, int pos)
{
	int d = c->head_dim;
	for (int h = 0; h < heads; h++)
		for (int i = 0; i < d / 2; i++) {
			int a = c->rope_style == FKV_ROPE_HALVES ? i : 2 * i;
			int b = c->rope_style == FKV_ROPE_HALVES ? i + d / 2 : 2 * i + 1;
			double th = pos * ref_inv_freq(c, i), x0 = v[h * d + a], x1 = v[h * d + b];
			v[h * d + a] = x0 * cos(th) - x1 * sin(th);
			v[h * d + b] = x0 * sin(th) + x1 * cos(th);
		}
}

#endif
