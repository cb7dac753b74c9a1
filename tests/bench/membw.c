/* membw: a streaming-read bandwidth probe (see membw.h). The read loop is what the GEMV kernels
 * do to weights, minus the arithmetic: sequential 32-byte loads, several in flight. */
#include "os/common/errmsg.h"
#include "tests/bench/membw.h"

#include "os/runtime/clock.h"
#include "serving/engine/threadpool.h"

#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define MEMBW_BYTES  (1ull << 30)
#define MEMBW_PASSES 4

struct membw_job {
    const uint8_t *buf;
    size_t size;
    int avx2;
    uint64_t sink[64]; /* per-thread results, so the reads cannot be optimized away */
};

__attribute__((target("avx2"))) static uint64_t read_avx2(const uint8_t *p, size_t n)
{
    __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
    for (size_t i = 0; i + 128 <= n; i += 128) {
        a = _mm256_xor_si256(a, _mm256_load_si256((const __m256i *)(p + i)));
        b = _mm256_xor_si256(b, _mm256_load_si256((const __m256i *)(p + i + 32)));
        c = _mm256_xor_si256(c, _mm256_load_si256((const __m256i *)(p + i + 64)));
        d = _mm256_xor_si256(d, _mm256_load_si256((const __m256i *)(p + i + 96)));
    }
    a = _mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_xor_si256(c, d));
    return (uint64_t)_mm256_extract_epi64(a, 0) ^ (uint64_t)_mm256_extract_epi64(a, 3);
}

static uint64_t read_plain(const uint8_t *p, size_t n)
{
    const uint64_t *q = (const uint64_t *)p;
    uint64_t a = 0, b = 0, c = 0, d = 0;
    for (size_t i = 0; i + 4 <= n / 8; i += 4) {
        a ^= q[i];
        b ^= q[i + 1];
        c ^= q[i + 2];
        d ^= q[i + 3];
    }
    return a ^ b ^ c ^ d;
}

static void slice(const struct membw_job *j, int ith, int nth, size_t *off, size_t *len)
{
    size_t chunk = j->size / (size_t)nth / 4096 * 4096;
    *off = chunk * (size_t)ith;
    *len = chunk;
}

static void touch_worker(void *arg, int ith, int nth)
{
    struct membw_job *j = arg;
    size_t off, len;
    slice(j, ith, nth, &off, &len);
    memset((uint8_t *)j->buf + off, ith + 1, len); /* fault pages in on this thread's node */
}

static void read_worker(void *arg, int ith, int nth)
{
    struct membw_job *j = arg;
    size_t off, len;
    slice(j, ith, nth, &off, &len);
    uint64_t s = j->avx2 ? read_avx2(j->buf + off, len) : read_plain(j->buf + off, len);
    if (ith < 64) j->sink[ith] ^= s;
}

struct membw {
    struct threadpool *tp;
    struct membw_job j;
    int threads;
};

struct membw *membw_open(int threads, size_t bytes)
{
    char err[ERRMSG_LEN];
    struct membw *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->threads = threads;
    bytes = bytes / 4096 * 4096;
    void *buf = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED || !(m->tp = threadpool_new(threads, err))) {
        if (buf != MAP_FAILED) munmap(buf, bytes);
        free(m);
        return NULL;
    }
    madvise(buf, bytes, MADV_HUGEPAGE); /* fewer TLB misses, as the weight arena has */
    m->j = (struct membw_job){.buf = buf, .size = bytes, .avx2 = __builtin_cpu_supports("avx2")};
    threadpool_run(m->tp, touch_worker, &m->j);
    return m;
}

double membw_pass(struct membw *m)
{
    double t0 = clock_now();
    threadpool_run(m->tp, read_worker, &m->j);
    double dt = clock_now() - t0;
    size_t bytes = m->j.size / (size_t)m->threads / 4096 * 4096 * (size_t)m->threads;
    return (double)bytes / dt / 1e9;
}

void membw_close(struct membw *m)
{
    if (!m) return;
    munmap((void *)m->j.buf, m->j.size);
    threadpool_free(m->tp);
    free(m);
}

double membw_read_gbs(int threads)
{
    struct membw *m = membw_open(threads, MEMBW_BYTES);
    if (!m) return -1;
    double best = 0;
    for (int p = 0; p < MEMBW_PASSES; p++) {
        double gbs = membw_pass(m);
        if (gbs > best) best = gbs;
    }
    membw_close(m);
    return best;
}
