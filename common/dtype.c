/* dtype — see dtype.h. */
#include "dtype.h"

#include <errno.h>
#include <string.h>

size_t dtype_size(enum fkv_dtype t)
{
	return t == FKV_F32 ? 4 : 2;
}

const char *dtype_name(enum fkv_dtype t)
{
	switch (t) {
	case FKV_F32: return "f32";
	case FKV_F16: return "f16";
	case FKV_BF16: return "bf16";
	}
	return "?";
}

int dtype_parse(const char *s, enum fkv_dtype *out)
{
	if (!strcmp(s, "f32"))
		*out = FKV_F32;
	else if (!strcmp(s, "f16"))
		*out = FKV_F16;
	else if (!strcmp(s, "bf16"))
		*out = FKV_BF16;
	else
		return -EINVAL;
	return 0;
}

static inline uint32_t f32_bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

static inline float bits_f32(uint32_t u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}

float f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16;
	uint32_t exp = (h >> 10) & 0x1f;
	uint32_t man = h & 0x3ff;
	if (exp == 0x1f)
		return bits_f32(sign | 0x7f800000u | (man << 13));
	if (exp == 0) {
		/* zero or subnormal: man * 2^-24 */
		float v = (float)man * 5.9604644775390625e-8f;
		return sign ? -v : v;
	}
	return bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t f32_to_f16(float f)
{
	uint32_t u = f32_bits(f);
	uint32_t sign = (u >> 16) & 0x8000;
	uint32_t abs = u & 0x7fffffffu;
	if (abs >= 0x7f800000u) /* Inf or NaN (keep a quiet NaN bit) */
		return (uint16_t)(sign | 0x7c00 | (abs > 0x7f800000u ? 0x200 | ((abs >> 13) & 0x3ff) : 0));
	if (abs >= 0x477ff000u) /* rounds to >= 65520: overflow to Inf */
		return (uint16_t)(sign | 0x7c00);
	if (abs < 0x38800000u) {
		/* subnormal half (or zero): round abs * 2^24 to nearest even */
		if (abs < 0x33000000u)
			return (uint16_t)sign;
		uint32_t e = abs >> 23;
		uint32_t m = (abs & 0x7fffff) | 0x800000;
		uint32_t shift = 126 - e; /* 14..24 */
		uint32_t r = m >> shift;
		uint32_t rem = m & ((1u << shift) - 1);
		uint32_t half = 1u << (shift - 1);
		if (rem > half || (rem == half && (r & 1)))
			r++;
		return (uint16_t)(sign | r);
	}
	uint32_t r = abs - 0x38000000u; /* rebias 127 -> 15 */
	uint32_t lsb = (r >> 13) & 1;
	r += 0xfff + lsb;
	return (uint16_t)(sign | (r >> 13));
}

float bf16_to_f32(uint16_t b)
{
	return bits_f32((uint32_t)b << 16);
}

uint16_t f32_to_bf16(float f)
{
	uint32_t u = f32_bits(f);
	if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it a NaN after truncation */
		return (uint16_t)((u >> 16) | 0x40);
	u += 0x7fff + ((u >> 16) & 1);
	return (uint16_t)(u >> 16);
}

void dtype_to_f32(float *dst, const void *src, enum fkv_dtype t, size_t n)
{
	const uint16_t *s16 = src;
	switch (t) {
	case FKV_F32:
		memcpy(dst, src, n * 4);
		break;
	case FKV_F16:
		for (size_t i = 0; i < n; i++)
			dst[i] = f16_to_f32(s16[i]);
		break;
	case FKV_BF16:
		for (size_t i = 0; i < n; i++)
			dst[i] = bf16_to_f32(s16[i]);
		break;
	}
}

void dtype_from_f32(void *dst, const float *src, enum fkv_dtype t, size_t n)
{
	uint16_t *d16 = dst;
	switch (t) {
	case FKV_F32:
		memcpy(dst, src, n * 4);
		break;
	case FKV_F16:
		for (size_t i = 0; i < n; i++)
			d16[i] = f32_to_f16(src[i]);
		break;
	case FKV_BF16:
		for (size_t i = 0; i < n; i++)
			d16[i] = f32_to_bf16(src[i]);
		break;
	}
}

void dtype_round(float *x, enum fkv_dtype t, size_t n)
{
	uint16_t tmp[256];
	if (t == FKV_F32)
		return;
	for (size_t i = 0; i < n; i += 256) {
		size_t m = n - i < 256 ? n - i : 256;
		dtype_from_f32(tmp, x + i, t, m);
		dtype_to_f32(x + i, tmp, t, m);
	}
}
