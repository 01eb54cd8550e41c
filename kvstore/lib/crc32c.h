/* crc32c — CRC-32C (Castagnoli) checksums of pool blocks.
 *
 * kvstored records a crc32c per block when the block is committed or written to the NVMe tier
 * and verifies it on every read from the tier. crc32c() uses the SSE4.2 instruction when the
 * CPU has it and a table-driven software path otherwise; crc32c_sw() is the simple reference
 * the fast path is tested against. Pure functions: nothing is allocated or owned. */
#ifndef FREEKV_CRC32C_H
#define FREEKV_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Continue a checksum: crc32c(0, buf, n) starts one; crc32c(crc32c(0, a, n), b, m) equals the
 * checksum of a followed by b. */
uint32_t crc32c(uint32_t crc, const void *buf, size_t len);

/* Bitwise-table reference implementation (no CPU features). */
uint32_t crc32c_sw(uint32_t crc, const void *buf, size_t len);

#endif
