/* dtype — the element types freekv stores (f32, f16, bf16) and conversions to and from f32.
 *
 * Weights are kept in their file dtype and KV blocks in the sequence's dtype; the CPU backend
 * computes in f32 and converts with these functions. Conversions round to nearest even and keep
 * NaN/Inf. Pure functions: nothing is allocated or owned. */
#ifndef FREEKV_DTYPE_H
#define FREEKV_DTYPE_H

#include <stddef.h>
#include <stdint.h>

enum fkv_dtype {
	FKV_F32 = 0,
	FKV_F16 = 1,
	FKV_BF16 = 2,
};

size_t dtype_size(enum fkv_dtype t);
const char *dtype_name(enum fkv_dtype t);
/* Parses "f32", "f16", "bf16"; returns 0 or -EINVAL. */
int dtype_parse(const char *s, enum fkv_dtype *out);

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
float bf16_to_f32(uint16_t b);
uint16_t f32_to_bf16(float f);

/* Converts n elements of src (type t) to f32 in dst. */
void dtype_to_f32(float *dst, const void *src, enum fkv_dtype t, size_t n);
/* Converts n f32 elements of src to type t in dst. */
void dtype_from_f32(void *dst, const float *src, enum fkv_dtype t, size_t n);
/* Rounds n f32 values in place to the nearest values type t holds (a round trip through t). */
void dtype_round(float *x, enum fkv_dtype t, size_t n);

#endif
