/* bench_cuda: the CUDA backend's speed, each figure beside the limit measured in the same run.
 *
 *   device-to-device copy GB/s (read + write)   the HBM bandwidth a kernel can reach
 *   host-to-device GB/s from pinned memory      the PCIe rate
 *   per shape (synthetic 1B = TinyLlama-1.1B, 7B = Llama-2-7B) and type (F16, Q8_0, Q4_0):
 *     upload: all spans on the copy stream, GB/s and ms per layer, vs the PCIe rate
 *     decode batch 1: tokens/s and the weight bandwidth it implies (bytes read per token / time),
 *                     as % of the copy bandwidth (target >= 90%)
 *     decode batch 64 (64 sequences at position 128): tokens/s
 *     prefill (one 512-token prompt chunk): tokens/s
 * Times are GPU time between events on the compute stream (embed, all layers, head), averaged
 * over several steps after a warm-up. Without a GPU it prints "skip - bench_cuda: <why>".
 * Options: --quick (1B only), --shape 1b|7b, --type f16|q8_0|q4_0. */
#include "serving/engine/cuda/cuda_backend.h"
#include "os/common/errmsg.h"
#include "os/runtime/log.h"
#include "tests/unit/cuda_synth.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    const char *name;
    struct synth_shape sh;
} shapes[] = {
    {"1b", {2048, 5632, 22, 32, 4, 32000, 2048}},   /* TinyLlama-1.1B */
    {"7b", {4096, 11008, 32, 32, 32, 32000, 4096}}, /* Llama-2-7B */
};
static const struct {
    const char *name;
    uint32_t type;
} types[] = {{"f16", GGML_F16}, {"q8_0", GGML_Q8_0}, {"q4_0", GGML_Q4_0}};

enum { CTX = 512, BS = 16, NSEQ = 64, DECODE_POS = 128, PREFILL = 512 };

static double d2d_gbs, h2d_gbs;

/* Weight bytes a decode step reads: every matrix and norm once, one embedding row. */
static uint64_t decode_bytes(const struct model *m)
{
    uint64_t b = m->token_embd.nbytes / (uint64_t)m->token_embd.rows;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const struct layer_weights *w = &m->layers[l];
        const struct tensor *ts[] = {&w->attn_norm, &w->wq,     &w->wk,     &w->wv,  &w->wo,
                                     &w->ffn_norm,  &w->w_gate, &w->w_down, &w->w_up};
        for (int i = 0; i < 9; i++) b += ts[i]->nbytes;
    }
    b += m->output_norm.nbytes + m->output.nbytes;
    return b;
}

static int run_one(int si, int ti, char *err)
{
    const struct synth_shape *sh = &shapes[si].sh;
    struct synth s;
    if (synth_build(&s, sh, types[ti].type, 0, 0, 42)) return errmsg_set(err, "out of host memory");
    /* Prefill's sequence uses the last 32 blocks; the 64 decode sequences 9 blocks each. */
    struct engine_limits lim = {.max_tokens = PREFILL,
                                .max_seqs = NSEQ,
                                .ctx = CTX,
                                .kv_block_size = BS,
                                .kv_blocks = NSEQ * 9 + CTX / BS};
    struct cuda_engine *ce;
    int rc = -1;
    if (cuda_engine_open(&ce, &s.m, &lim, err)) goto out_synth;
    if (cuda_engine_register_host(ce, s.image, (s.image_size + 4095) / 4096 * 4096, err))
        fprintf(stderr, "bench_cuda: %s (uploads from pageable memory)\n", err);
    double up_s;
    uint64_t up_bytes;
    if (cuda_time_upload(ce, &up_s, &up_bytes, err)) goto out;

    static int tok[PREFILL], pos[PREFILL], rows[NSEQ];
    static const int *tabs[PREFILL];
    static int blocks[NSEQ * 9 + CTX / BS];
    for (int i = 0; i < NSEQ * 9 + CTX / BS; i++) blocks[i] = i;
    /* decode, batch 1 */
    int row0 = 0;
    tok[0] = 1, pos[0] = DECODE_POS, tabs[0] = blocks;
    struct batch b1 = {1, tok, pos, tabs, 1, &row0};
    double t1, t64, tp;
    if (cuda_time_forward(ce, &b1, 20, &t1, err)) goto out;
    /* decode, batch 64 */
    for (int i = 0; i < NSEQ; i++)
        tok[i] = 1 + i, pos[i] = DECODE_POS, tabs[i] = blocks + i * 9, rows[i] = i;
    struct batch b64 = {NSEQ, tok, pos, tabs, NSEQ, rows};
    if (cuda_time_forward(ce, &b64, 10, &t64, err)) goto out;
    /* prefill: one 512-token chunk of one sequence */
    for (int i = 0; i < PREFILL; i++)
        tok[i] = 1 + i % 1000, pos[i] = i, tabs[i] = blocks + NSEQ * 9;
    int last = PREFILL - 1;
    struct batch bp = {PREFILL, tok, pos, tabs, 1, &last};
    if (cuda_time_forward(ce, &bp, 3, &tp, err)) goto out;

    uint64_t db = decode_bytes(&s.m);
    double implied = db / t1 / 1e9;
    double per_layer_ms = up_s * 1e3 / (sh->layers + 2);
    printf("%-3s %-5s weights %6.2f GB | upload %6.2f GB/s (%5.1f%% of PCIe), %6.2f ms/layer | "
           "decode b1 %8.1f tok/s = %7.1f GB/s (%5.1f%% of copy bw) | decode b64 %9.1f tok/s | "
           "prefill %9.1f tok/s\n",
           shapes[si].name, types[ti].name, db / 1e9, up_bytes / up_s / 1e9,
           100.0 * up_bytes / up_s / 1e9 / h2d_gbs, per_layer_ms, 1.0 / t1, implied,
           100.0 * implied / d2d_gbs, NSEQ / t64, PREFILL / tp);
    fflush(stdout);
    rc = 0;
out:
    cuda_engine_close(ce);
out_synth:
    synth_free(&s);
    return rc;
}

int main(int argc, char **argv)
{
    int quick = 0;
    const char *only_shape = NULL, *only_type = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--shape") && i + 1 < argc)
            only_shape = argv[++i];
        else if (!strcmp(argv[i], "--type") && i + 1 < argc)
            only_type = argv[++i];
        else {
            fprintf(stderr, "usage: bench_cuda [--quick] [--shape 1b|7b] [--type f16|q8_0|q4_0]\n");
            return 2;
        }
    }
    log_set_quiet(1);
    char err[ERRMSG_LEN];
    if (cuda_probe(err)) {
        printf("skip - bench_cuda: %s\n", err);
        return 0;
    }
    /* The baselines need an open engine: a tiny one. */
    struct synth tiny;
    struct synth_shape tsh = {256, 768, 1, 8, 8, 512, 64};
    struct cuda_engine *ce;
    if (synth_build(&tiny, &tsh, GGML_F16, 1, 0, 1) ||
        cuda_engine_open(&ce, &tiny.m, &(struct engine_limits){.max_tokens = 8}, err)) {
        printf("not ok - bench_cuda: %s\n", err);
        return 1;
    }
    struct cuda_device_info info;
    cuda_engine_info(ce, &info);
    if (cuda_measure_d2d(ce, (size_t)1 << 30, 5, &d2d_gbs, err) ||
        cuda_measure_h2d(ce, (size_t)256 << 20, 5, &h2d_gbs, err)) {
        printf("not ok - bench_cuda: %s\n", err);
        return 1;
    }
    printf("device: %s, sm_%d%d, %d SMs, %.1f GiB, driver %d\n", info.name, info.cc_major,
           info.cc_minor, info.sms, info.total_mem / 1073741824.0, info.driver_version);
    printf("device-to-device copy: %.1f GB/s (read+write; datasheet peak %.0f GB/s) | "
           "host-to-device from pinned memory: %.1f GB/s\n",
           d2d_gbs, info.peak_gbs, h2d_gbs);
    cuda_engine_close(ce);
    synth_free(&tiny);
    int fails = 0;
    for (int si = 0; si < 2; si++) {
        if (quick && si > 0) break;
        if (only_shape && strcmp(only_shape, shapes[si].name)) continue;
        for (int ti = 0; ti < 3; ti++) {
            if (only_type && strcmp(only_type, types[ti].name)) continue;
            if (run_one(si, ti, err)) {
                printf("%-3s %-5s failed: %s\n", shapes[si].name, types[ti].name, err);
                fails++;
            }
        }
    }
    return fails ? 1 : 0;
}
