#include "transport/crc32c.h"

#include <pthread.h>
#include <string.h>

#if defined(__x86_64__)
#include <nmmintrin.h>
#elif defined(__aarch64__)
#include <arm_acle.h>
#include <sys/auxv.h>
#endif

#define POLY 0x82F63B78u

static uint32_t table[8][256];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void table_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ POLY : c >> 1;
        table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xff];
}

uint32_t crc32c_sw(uint32_t crc, const void *buf, size_t len)
{
    pthread_once(&table_once, table_init);
    const uint8_t *p = buf;
    crc = ~crc;
    while (len && ((uintptr_t)p & 7)) {
        crc = (crc >> 8) ^ table[0][(crc ^ *p++) & 0xff];
        len--;
    }
    while (len >= 8) {
        /* Assemble little-endian words byte by byte: no alignment or host-order assumptions. */
        uint32_t lo = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                             (uint32_t)p[3] << 24);
        uint32_t hi =
            (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 | (uint32_t)p[7] << 24;
        crc = table[7][lo & 0xff] ^ table[6][(lo >> 8) & 0xff] ^ table[5][(lo >> 16) & 0xff] ^
              table[4][lo >> 24] ^ table[3][hi & 0xff] ^ table[2][(hi >> 8) & 0xff] ^
              table[1][(hi >> 16) & 0xff] ^ table[0][hi >> 24];
        p += 8;
        len -= 8;
    }
    while (len--) crc = (crc >> 8) ^ table[0][(crc ^ *p++) & 0xff];
    return ~crc;
}

/* The CPU's CRC-32C instructions (the Castagnoli polynomial, reflected, as above): SSE4.2's crc32
 * on x86-64, Armv8's crc32cb/crc32cd (optional in Armv8.0) on aarch64. Each architecture gives
 * its target, one step for a byte and one for 8 little-endian bytes, and how to ask the CPU; the
 * loop is one. */
#if defined(__x86_64__)
#define HW_CRC    1
#define HW_TARGET __attribute__((target("sse4.2")))
HW_TARGET static inline uint32_t hw_u8(uint32_t c, uint8_t b)
{
    return _mm_crc32_u8(c, b);
}
HW_TARGET static inline uint32_t hw_u64(uint32_t c, uint64_t w)
{
    return (uint32_t)_mm_crc32_u64(c, w);
}
static int hw_probe(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("sse4.2");
}
#elif defined(__aarch64__)
#define HW_CRC    1
#define HW_TARGET __attribute__((target("+crc")))
HW_TARGET static inline uint32_t hw_u8(uint32_t c, uint8_t b)
{
    return __crc32cb(c, b);
}
HW_TARGET static inline uint32_t hw_u64(uint32_t c, uint64_t w)
{
    return __crc32cd(c, w);
}
static int hw_probe(void)
{
    return (getauxval(AT_HWCAP) & HWCAP_CRC32) != 0;
}
#endif

#ifdef HW_CRC
HW_TARGET static uint32_t crc32c_hw(uint32_t crc, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    uint32_t c = ~crc;
    while (len && ((uintptr_t)p & 7)) {
        c = hw_u8(c, *p++);
        len--;
    }
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = hw_u64(c, w);
        p += 8;
        len -= 8;
    }
    while (len--) c = hw_u8(c, *p++);
    return ~c;
}

int crc32c_hw_available(void)
{
    static int have = -1;
    if (have < 0) have = hw_probe() ? 1 : 0;
    return have;
}

uint32_t crc32c(uint32_t crc, const void *buf, size_t len)
{
    if (crc32c_hw_available()) return crc32c_hw(crc, buf, len);
    return crc32c_sw(crc, buf, len);
}
#else
int crc32c_hw_available(void)
{
    return 0;
}

uint32_t crc32c(uint32_t crc, const void *buf, size_t len)
{
    return crc32c_sw(crc, buf, len);
}
#endif
