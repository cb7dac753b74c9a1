/* bench_matmul: kernel speed beside the machine's memory bandwidth, measured in the same run.
 *
 * decode: batch-1 GEMV through a stack of TinyLlama-1.1B FFN-shaped matrices (5632 x 2048) that
 *         together hold ~256 MiB of weights (8x the last-level cache), one matmul() per matrix
 *         as the forward pass does; GB/s = weight bytes / time, beside the streaming-read
 *         bandwidth of a 1 GiB buffer with the same thread count (membw.c).
 * prefill: 64 tokens x one 2048 x 2048 matrix; GFLOP/s = 2 * rows * cols * 64 / time.
 * Best of several runs (others share this machine: figures are noisy).
 * TYPEx16 are the same weights in repack.h's 16-row records (what the engine stores for the SIMD
 * kernels), beside the ggml rows they came from.
 * Usage: [BENCH_TYPES=Q8_0,Q4_0] [BENCH_ISAS=avx2] [BENCH_SHAPE=ROWSxCOLS] [BENCH_HOT=1]
 *        bench_matmul [threads...]
 * (default: 1 2 threads, 5632x2048; e.g. BENCH_SHAPE=768x768 for stories110M's attention
 * matrices, each decode pass then crossing many small matrices as the engine does). BENCH_HOT=1
 * runs the decode pass over one matrix again and again, from cache: the kernel's compute ceiling,
 * which tells whether a decode figure below the memory's is the kernel's or the memory's
 * (BENCH_SHAPE=512x2048 fits a 1 MiB L2 in Q4_0). */
#include "os/common/errmsg.h"
#include "os/runtime/clock.h"
#include "serving/engine/gguf.h"
#include "serving/engine/matmul.h"
#include "serving/engine/matmul_kernels.h"
#include "tests/bench/membw.h"
#include "serving/engine/quant.h"
#include "serving/engine/repack.h"
#include "serving/engine/threadpool.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static const struct {
    uint32_t type;
    const char *name;
} types[] = {{GGML_F32, "F32"},
             {GGML_F16, "F16"},
             {GGML_BF16, "BF16"},
             {GGML_Q8_0, "Q8_0"},
             {TENSOR_Q8_0_X16, "Q8_0x16"},
             {GGML_Q4_0, "Q4_0"},
             {TENSOR_Q4_0_X16, "Q4_0x16"},
             {GGML_Q4_1, "Q4_1"},
             {TENSOR_Q4_1_X16, "Q4_1x16"},
             {GGML_Q5_0, "Q5_0"},
             {TENSOR_Q5_0_X16, "Q5_0x16"},
             {GGML_Q5_1, "Q5_1"},
             {TENSOR_Q5_1_X16, "Q5_1x16"},
             {GGML_IQ4_NL, "IQ4_NL"},
             {TENSOR_IQ4_NL_X16, "IQ4_NLx16"},
             {GGML_Q2_K, "Q2_K"},
             {TENSOR_Q2_K_X16, "Q2_Kx16"},
             {GGML_Q3_K, "Q3_K"},
             {TENSOR_Q3_K_X16, "Q3_Kx16"},
             {GGML_Q4_K, "Q4_K"},
             {TENSOR_Q4_K_X16, "Q4_Kx16"},
             {GGML_Q5_K, "Q5_K"},
             {TENSOR_Q5_K_X16, "Q5_Kx16"},
             {GGML_Q6_K, "Q6_K"},
             {TENSOR_Q6_K_X16, "Q6_Kx16"},
             {GGML_IQ4_XS, "IQ4_XS"},
             {TENSOR_IQ4_XS_X16, "IQ4_XSx16"}};

static size_t row_size(uint32_t t, int cols)
{
    return (size_t)ggml_row_bytes(repack_base_type(t), (uint64_t)cols);
}

/* A buffer of `bytes` filled with rows quantized from random floats (64 distinct rows, copied:
 * the values do not matter for speed, and quantizing 256 MiB of Q4_K would take minutes); for a
 * repacked type (repack.h), then repacked as matrices of `rows` rows, as the engine does. */
static uint8_t *make_weights(uint32_t type, int rows, int cols, size_t bytes)
{
    uint32_t base = repack_base_type(type);
    size_t rb = row_size(type, cols);
    uint8_t *w = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (w == MAP_FAILED) return NULL;
    madvise(w, bytes, MADV_HUGEPAGE);
    float *row = malloc(sizeof(float) * cols);
    uint64_t s = 88172645463325252ull;
    for (int r = 0; r < 64 && (r + 1) * rb <= bytes; r++) {
        for (int c = 0; c < cols; c++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            row[c] = (float)((int32_t)(s >> 32)) / 2147483648.0f * 0.05f;
        }
        quantize_row(base, row, w + r * rb, cols);
    }
    for (size_t off = 64 * rb; off + rb <= bytes; off += rb)
        memcpy(w + off, w + off % (64 * rb), rb);
    free(row);
    char err[ERRMSG_LEN];
    for (size_t off = 0; type != base && off + rb * rows <= bytes; off += rb * rows) {
        struct tensor t = {w + off, base, rows, cols, rb * rows};
        if (repack_tensor(&t, err)) {
            fprintf(stderr, "%s\n", err);
            munmap(w, bytes);
            return NULL;
        }
    }
    return w;
}

static void empty_job(void *ctx, int ith, int nth)
{
    (void)ctx, (void)ith, (void)nth;
}

int main(int argc, char **argv)
{
    int thread_counts[8] = {1, 2}, n_counts = 2;
    if (argc > 1) {
        n_counts = 0;
        for (int i = 1; i < argc && n_counts < 8; i++) thread_counts[n_counts++] = atoi(argv[i]);
    }
    int rows = 5632, cols = 2048;
    const int pf_dim = 2048, pf_tok = 64;
    const char *shape = getenv("BENCH_SHAPE"); /* e.g. BENCH_SHAPE=768x768 */
    if (shape && (sscanf(shape, "%dx%d", &rows, &cols) != 2 || rows < 16 || cols < 256 ||
                  rows % 16 || cols % 256)) {
        fprintf(stderr, "BENCH_SHAPE=%s: want ROWSxCOLS, rows a multiple of 16, cols of 256\n",
                shape);
        return 2;
    }
    const size_t target = 256ull << 20;
    char err[ERRMSG_LEN];

    double load[3] = {0};
    FILE *la = fopen("/proc/loadavg", "r");
    if (la) {
        if (fscanf(la, "%lf %lf %lf", &load[0], &load[1], &load[2]) != 3) load[0] = -1;
        fclose(la);
    }
    printf("bench_matmul: best ISA %s; load average %.1f on %ld CPUs (others' work makes the "
           "figures noisy)\n",
           matmul_isa(), load[0], sysconf(_SC_NPROCESSORS_ONLN));
    for (int i = 0; i < n_counts; i++) {
        struct threadpool *tp = threadpool_new(thread_counts[i], err);
        if (!tp) continue;
        const int jobs = 20000;
        threadpool_run(tp, empty_job, NULL);
        double t0 = clock_now();
        for (int j = 0; j < jobs; j++) threadpool_run(tp, empty_job, NULL);
        printf("threadpool dispatch, %d thread%s: %.2f us per empty job\n", thread_counts[i],
               thread_counts[i] > 1 ? "s" : "", (clock_now() - t0) / jobs * 1e6);
        threadpool_free(tp);
    }
    double bw[8];
    for (int i = 0; i < n_counts; i++) {
        bw[i] = membw_read_gbs(thread_counts[i]);
        printf("memory read bandwidth, %d thread%s: %.1f GB/s (1 GiB streaming read)\n",
               thread_counts[i], thread_counts[i] > 1 ? "s" : "", bw[i]);
    }
    printf("%-9s %-7s %3s  %13s %8s  %17s\n", "type", "isa", "thr", "decode GB/s", "of mem",
           "prefill64 GFLOP/s");

    size_t scratch_size = matmul_scratch_size(pf_tok, cols > pf_dim ? cols : pf_dim);
    void *scratch = aligned_alloc(64, (scratch_size + 63) / 64 * 64);
    float *x = malloc(sizeof(float) * pf_tok * pf_dim);
    float *y = malloc(sizeof(float) * pf_tok * (rows > pf_dim ? rows : pf_dim));
    for (int i = 0; i < pf_tok * pf_dim; i++) x[i] = (float)((i * 7919) % 2001 - 1000) / 1000.0f;

    const char *only = getenv("BENCH_TYPES"); /* e.g. BENCH_TYPES=Q8_0,Q4_0 */
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++) {
        uint32_t type = types[ti].type;
        /* BENCH_TYPES=Q4_0 also runs Q4_0x16 (the layout the engine uses) */
        if (only && !strcasestr(only, types[ti].name) &&
            !(repack_base_type(type) != type &&
              strcasestr(only, ggml_type_name(repack_base_type(type)))))
            continue;
        size_t mat_bytes = row_size(type, cols) * rows;
        int n_mats = (int)(target / mat_bytes);
        if (n_mats < 1) n_mats = 1;
        const int hot = getenv("BENCH_HOT") && atoi(getenv("BENCH_HOT")); /* one matrix, cached */
        const size_t w_bytes = mat_bytes * (hot ? 1 : n_mats);
        uint8_t *w = make_weights(type, rows, cols, w_bytes);
        uint8_t *pw = make_weights(type, pf_dim, pf_dim, row_size(type, pf_dim) * pf_dim);
        if (!w || !pw) {
            printf("%-5s: cannot map %zu MiB of weights\n", types[ti].name, w_bytes >> 20);
            return 1;
        }
        struct tensor pf = {pw, type, pf_dim, pf_dim, row_size(type, pf_dim) * pf_dim};
        const char *only_isas = getenv("BENCH_ISAS");  /* e.g. BENCH_ISAS=avx2,avx512 */
        for (int ii = 0; ii < kernel_tables_n; ii++) { /* this architecture's tables */
            const char *isa = kernel_tables[ii]->name;
            if (only_isas && !strstr(only_isas, isa)) continue;
            for (int ci = 0; ci < n_counts; ci++) {
                int nth = thread_counts[ci];
                struct threadpool *tp = threadpool_new(nth, err);
                if (!tp) {
                    printf("%s\n", err);
                    return 1;
                }
                struct matmul_ctx k;
                setenv("STRATA_ISA", isa, 1);
                int rc = matmul_init(&k, tp, scratch, pf_tok, cols > pf_dim ? cols : pf_dim, err);
                unsetenv("STRATA_ISA");
                if (rc) {
                    printf("%s\n", err);
                    return 1;
                }
                if (strcmp(matmul_isa_of(&k), isa)) { /* CPU lacks it */
                    threadpool_free(tp);
                    continue;
                }
                int scalar = ii == 0;
                /* decode: one pass through all matrices, best of a few */
                double best = 1e30;
                for (int rep = 0; rep < (scalar ? 2 : 5); rep++) {
                    double t0 = clock_now();
                    for (int m = 0; m < n_mats; m++) {
                        struct tensor t = {w + mat_bytes * (hot ? 0 : m), type, rows, cols,
                                           mat_bytes};
                        matmul(&k, y, &t, x, 1);
                    }
                    double dt = clock_now() - t0;
                    if (dt < best) best = dt;
                }
                double gbs = (double)mat_bytes * n_mats / best / 1e9;
                double pbest = 1e30;
                for (int rep = 0; rep < (scalar ? 1 : 4); rep++) {
                    double t0 = clock_now();
                    matmul(&k, y, &pf, x, pf_tok);
                    double dt = clock_now() - t0;
                    if (dt < pbest) pbest = dt;
                }
                double gflops = 2.0 * pf_dim * pf_dim * pf_tok / pbest / 1e9;
                printf("%-9s %-7s %3d  %13.1f %7.0f%%  %17.1f\n", types[ti].name, isa, nth, gbs,
                       100 * gbs / bw[ci], gflops);
                fflush(stdout);
                threadpool_free(tp);
            }
        }
        munmap(w, w_bytes);
        munmap(pw, row_size(type, pf_dim) * pf_dim);
    }
    free(scratch);
    free(x);
    free(y);
    return 0;
}
