/* crc32c: CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of every fabric
 * payload and of every span in a weight manifest.
 *
 * crc32c(0, p, n) is the standard CRC-32C of the bytes ("123456789" -> 0xE3069283). Passing a
 * previous result as `crc` continues it, so crc32c(crc32c(0, a, n), b, m) == crc32c(0, a||b, n+m).
 * Uses the SSE4.2 crc32 instruction (x86-64) or Armv8's crc32c ones (aarch64) when the CPU has
 * them (checked once at run time), and a slicing-by-8 table otherwise; both give identical
 * results (the unit test compares them). */
#ifndef STRATA_CRC32C_H
#define STRATA_CRC32C_H

#include <stddef.h>
#include <stdint.h>

uint32_t crc32c(uint32_t crc, const void *buf, size_t len);
/* The portable table implementation, exported so tests can compare it with the hardware path. */
uint32_t crc32c_sw(uint32_t crc, const void *buf, size_t len);
/* 1 when crc32c() uses the CPU's instructions (SSE4.2, Armv8 CRC32). */
int crc32c_hw_available(void);

#endif
