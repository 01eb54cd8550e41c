/* crc32c — see crc32c.h. */
#include "crc32c.h"

#include <pthread.h>
#include <stdbool.h>

#define CRC32C_POLY_REFLECTED 0x82F63B78u
/* The hardware path runs three independent streams of CRC32C_STRIDE bytes at once (the crc32
 * instruction has a latency of three cycles and a throughput of one) and joins them with
 * crc_shift, which advances a CRC register over CRC32C_STRIDE zero bytes. */
#define CRC32C_STRIDE 1024u

static uint32_t crc_table[256];
static uint32_t shift_table[4][256]; /* byte j of the register -> its image after STRIDE zeros */
static bool have_sse42;
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc32c_init(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;
		for (int k = 0; k < 8; k++)
			c = (c & 1) ? (c >> 1) ^ CRC32C_POLY_REFLECTED : c >> 1;
		crc_table[i] = c;
	}
#if defined(__x86_64__)
	__builtin_cpu_init();
	have_sse42 = __builtin_cpu_supports("sse4.2");
#endif
	/* Feeding zeros is linear in the register: the image of each single bit, then of each
	 * byte value at each byte position, by XOR of bit images. */
	uint32_t bit_image[32];
	for (int b = 0; b < 32; b++) {
		uint32_t c = 1u << b;
		for (unsigned i = 0; i < CRC32C_STRIDE; i++)
			c = crc_table[c & 0xff] ^ (c >> 8);
		bit_image[b] = c;
	}
	for (int j = 0; j < 4; j++) {
		for (uint32_t v = 0; v < 256; v++) {
			uint32_t c = 0;
			for (int b = 0; b < 8; b++)
				if (v & (1u << b))
					c ^= bit_image[8 * j + b];
			shift_table[j][v] = c;
		}
	}
}

/* The register after CRC32C_STRIDE zero bytes, starting from c. */
static inline uint32_t crc_shift(uint32_t c)
{
	return shift_table[0][c & 0xff] ^ shift_table[1][(c >> 8) & 0xff] ^ shift_table[2][(c >> 16) & 0xff] ^
	       shift_table[3][c >> 24];
}

uint32_t crc32c_sw(uint32_t crc, const void *buf, size_t len)
{
	pthread_once(&crc_once, crc32c_init);
	const unsigned char *p = buf;
	crc = ~crc;
	while (len--)
		crc = crc_table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
	return ~crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t crc32c_hw(uint32_t crc, const void *buf,
							      size_t len)
{
	const unsigned char *p = buf;
	uint64_t c = ~crc;
	while (len && ((uintptr_t)p & 7)) {
		c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
		len--;
	}
	/* Stream a continues the register; b and c start from 0 and are joined by linearity:
	 * crc(x, A B) = shift(crc(x, A)) ^ crc(0, B) for |B| = STRIDE. */
	while (len >= 3 * CRC32C_STRIDE) {
		uint64_t ca = c, cb = 0, cc = 0;
		for (unsigned i = 0; i < CRC32C_STRIDE; i += 8) {
			uint64_t va, vb, vc;
			__builtin_memcpy(&va, p + i, 8);
			__builtin_memcpy(&vb, p + CRC32C_STRIDE + i, 8);
			__builtin_memcpy(&vc, p + 2 * CRC32C_STRIDE + i, 8);
			ca = __builtin_ia32_crc32di(ca, va);
			cb = __builtin_ia32_crc32di(cb, vb);
			cc = __builtin_ia32_crc32di(cc, vc);
		}
		c = crc_shift(crc_shift((uint32_t)ca) ^ (uint32_t)cb) ^ (uint32_t)cc;
		p += 3 * CRC32C_STRIDE;
		len -= 3 * CRC32C_STRIDE;
	}
	while (len >= 8) {
		uint64_t v;
		__builtin_memcpy(&v, p, 8);
		c = __builtin_ia32_crc32di(c, v);
		p += 8;
		len -= 8;
	}
	while (len--)
		c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
	return ~(uint32_t)c;
}
#endif

uint32_t crc32c(uint32_t crc, const void *buf, size_t len)
{
	pthread_once(&crc_once, crc32c_init);
#if defined(__x86_64__)
	if (have_sse42)
		return crc32c_hw(crc, buf, len);
#endif
	return crc32c_sw(crc, buf, len);
}
