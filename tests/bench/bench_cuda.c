/* bench_cuda: the CUDA backend's speed, each figure beside the limit it is measured against.
 *
 *   the card: its name, and the HBM peak for it (H100 SXM 3350 GB/s, H200 4800 GB/s, ...: a table
 *     by name; for a card not in it, memory clock x bus width as the driver reports them)
 *   device-to-device copy GB/s (read + write)   the HBM bandwidth a kernel can reach
 *   host-to-device GB/s from pinned memory      the PCIe rate
 *   per shape (synthetic 1b = TinyLlama-1.1B, 7b = Llama-2-7B, 8b = Llama-3-8B) and weight type:
 *     upload: every span host -> device from the registered (pinned) image, seconds and GB/s
 *     decode batch 1: tokens/s and the weight bandwidth it implies (bytes a step reads / time),
 *                     as % of the HBM peak and of the measured copy rate
 *     decode batch N (N sequences at position 128, --batches): tokens/s and x batch 1
 *     prefill (one --prefill-token prompt chunk, default 1024): tokens/s
 * Times are GPU time between events on the compute stream (embed, all layers, head), averaged
 * over several steps after a warm-up. One line per shape and type, "bench SHAPE TYPE: ..." or
 * "bench SHAPE TYPE: failed: why" (a type the kernels lack fails at open; the others still run).
 * Without a GPU it prints "skip - bench_cuda: <why>". Exit status 1 if any shape/type failed.
 *
 * Options: --shape LIST (1b,7b,8b; default 1b,7b), --type LIST (any `strata convert` type;
 * default f16,q8_0,q4_0), --batches LIST (default 8,32,64,128), --prefill N (default 1024),
 * --quick (1b only). LIST is comma-separated. */
#include "serving/engine/cuda/cuda_backend.h"
#include "os/common/errmsg.h"
#include "os/runtime/log.h"
#include "serving/engine/convert.h"
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
    {"8b", {4096, 14336, 32, 32, 8, 128256, 8192}}, /* Llama-3-8B */
};
enum { N_SHAPES = sizeof shapes / sizeof shapes[0] };

/* HBM peaks from the datasheets, by the driver's device name (the first match wins, so the more
 * specific names come first). */
static const struct {
    const char *match;
    double gbs;
} hbm_peaks[] = {
    {"GH200", 4000},           {"H200", 4800},
    {"H100 NVL", 3900},        {"H100 PCIe", 2000},
    {"H100", 3350} /* SXM5 */, {"A100-SXM4-80GB", 2039},
    {"A100 80GB PCIe", 1935},  {"A100", 1555},
};

enum { BS = 16, DECODE_POS = 128, DECODE_BLOCKS = DECODE_POS / BS + 1, MAX_BATCHES = 16 };

static double d2d_gbs, h2d_gbs, peak_gbs;
static int batches[MAX_BATCHES] = {8, 32, 64, 128}, n_batches = 4, max_batch = 128;
static int prefill = 1024;

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

static int run_one(int si, uint32_t type, char *err)
{
    const struct synth_shape *sh = &shapes[si].sh;
    /* a mixture's widest block is Q6_K's, as its base K-quant's: 256 */
    uint32_t bt = type == SYNTH_Q4_K_M || type == SYNTH_Q5_K_M ? GGML_Q6_K : type;
    if (!ggml_row_bytes(bt, (uint64_t)sh->dim) || !ggml_row_bytes(bt, (uint64_t)sh->hidden))
        return errmsg_set(err, "rows of %d and %d are not whole %s blocks", sh->dim, sh->hidden,
                          synth_type_name(type));
    struct synth s;
    if (synth_build(&s, sh, type, 0, 0, 42)) return errmsg_set(err, "out of host memory");
    int ctx = 2 * prefill > 2 * DECODE_POS ? 2 * prefill : 2 * DECODE_POS;
    if (ctx > sh->seq_len) ctx = sh->seq_len;
    /* The prefill sequence uses the last blocks; each decode sequence DECODE_BLOCKS of its own. */
    int pf_blocks = (prefill + BS - 1) / BS, n_blocks = max_batch * DECODE_BLOCKS + pf_blocks;
    int max_tokens = prefill > max_batch ? prefill : max_batch;
    struct engine_limits lim = {.max_tokens = max_tokens,
                                .max_seqs = max_batch,
                                .ctx = ctx,
                                .kv_block_size = BS,
                                .kv_blocks = n_blocks};
    struct cuda_engine *ce = NULL;
    int *tok = calloc((size_t)max_tokens, sizeof(int)),
        *pos = calloc((size_t)max_tokens, sizeof(int));
    int *rows = calloc((size_t)max_tokens, sizeof(int)),
        *blocks = calloc((size_t)n_blocks, sizeof(int));
    const int **tabs = calloc((size_t)max_tokens, sizeof(int *));
    int rc = -1;
    if (!tok || !pos || !rows || !blocks || !tabs) {
        errmsg_set(err, "out of host memory");
        goto out;
    }
    if (prefill > ctx) {
        errmsg_set(err, "a %d-token prompt does not fit the shape's context (%d)", prefill, ctx);
        goto out;
    }
    if (cuda_engine_open(&ce, &s.m, &lim, err)) goto out;
    if (cuda_engine_register_host(ce, s.image, (s.image_size + 4095) / 4096 * 4096, err))
        fprintf(stderr, "bench_cuda: %s (uploads from pageable memory)\n", err);
    double up_s;
    uint64_t up_bytes;
    if (cuda_time_upload(ce, &up_s, &up_bytes, err)) goto out;
    cuda_engine_profile_report(ce, "upload");
    for (int i = 0; i < n_blocks; i++) blocks[i] = i;

    /* decode, batch 1 */
    tok[0] = 1, pos[0] = DECODE_POS, tabs[0] = blocks, rows[0] = 0;
    struct batch b1 = {1, tok, pos, tabs, 1, rows};
    double t1, tb[MAX_BATCHES], tp;
    if (cuda_time_forward(ce, &b1, 20, &t1, err)) goto out;
    cuda_engine_profile_report(ce, "decode batch 1");
    /* decode, batch N: N sequences at DECODE_POS, one token each */
    for (int k = 0; k < n_batches; k++) {
        int n = batches[k];
        for (int i = 0; i < n; i++)
            tok[i] = 1 + i, pos[i] = DECODE_POS, tabs[i] = blocks + i * DECODE_BLOCKS, rows[i] = i;
        struct batch bn = {n, tok, pos, tabs, n, rows};
        if (cuda_time_forward(ce, &bn, 10, &tb[k], err)) goto out;
        char label[32];
        snprintf(label, sizeof label, "decode batch %d", n);
        cuda_engine_profile_report(ce, label);
    }
    /* prefill: one chunk of one sequence, logits for its last token */
    for (int i = 0; i < prefill; i++)
        tok[i] = 1 + i % 1000, pos[i] = i, tabs[i] = blocks + max_batch * DECODE_BLOCKS;
    rows[0] = prefill - 1;
    struct batch bp = {prefill, tok, pos, tabs, 1, rows};
    if (cuda_time_forward(ce, &bp, 3, &tp, err)) goto out;
    cuda_engine_profile_report(ce, "prefill");

    uint64_t db = decode_bytes(&s.m);
    double gbs = db / t1 / 1e9;
    printf("bench %s %s: weights %.2f GB | upload %.3f s = %.1f GB/s (%.0f%% of pinned "
           "host-to-device) "
           "| decode b1 %.1f tok/s = %.0f GB/s = %.1f%% of HBM peak (%.1f%% of d2d copy)",
           shapes[si].name, synth_type_name(type), db / 1e9, up_s, up_bytes / up_s / 1e9,
           100.0 * up_bytes / up_s / 1e9 / h2d_gbs, 1.0 / t1, gbs, 100.0 * gbs / peak_gbs,
           100.0 * gbs / d2d_gbs);
    for (int k = 0; k < n_batches; k++)
        printf(" | b%d %.0f tok/s (%.1fx)", batches[k], batches[k] / tb[k],
               batches[k] / tb[k] * t1);
    printf(" | prefill %d: %.0f tok/s\n", prefill, prefill / tp);
    fflush(stdout);
    rc = 0;
out:
    if (ce) cuda_engine_close(ce);
    synth_free(&s);
    free(tok), free(pos), free(rows), free(blocks), free(tabs);
    return rc;
}

/* Split a comma-separated list in place: at most cap items. */
static int split(char *s, char **items, int cap)
{
    int n = 0;
    for (char *p = strtok(s, ","); p && n < cap; p = strtok(NULL, ",")) items[n++] = p;
    return n;
}

static int usage(void)
{
    fprintf(stderr, "usage: bench_cuda [--quick] [--shape 1b,7b,8b] [--type f16,q8_0,q4_0,...] "
                    "[--batches 8,32,64,128] [--prefill N]\n");
    return 2;
}

int main(int argc, char **argv)
{
    char shape_arg[256] = "1b,7b", type_arg[256] = "f16,q8_0,q4_0", batch_arg[256] = "";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--quick"))
            strcpy(shape_arg, "1b");
        else if (!strcmp(a, "--shape") && v)
            snprintf(shape_arg, sizeof shape_arg, "%s", argv[++i]);
        else if (!strcmp(a, "--type") && v)
            snprintf(type_arg, sizeof type_arg, "%s", argv[++i]);
        else if (!strcmp(a, "--batches") && v)
            snprintf(batch_arg, sizeof batch_arg, "%s", argv[++i]);
        else if (!strcmp(a, "--prefill") && v)
            prefill = atoi(argv[++i]);
        else
            return usage();
    }
    char *sh_items[8], *ty_items[16], *b_items[MAX_BATCHES];
    int n_sh = split(shape_arg, sh_items, 8), n_ty = split(type_arg, ty_items, 16);
    int shape_idx[8];
    uint32_t type_ids[16];
    for (int i = 0; i < n_sh; i++) {
        shape_idx[i] = -1;
        for (int k = 0; k < N_SHAPES; k++)
            if (!strcmp(sh_items[i], shapes[k].name)) shape_idx[i] = k;
        if (shape_idx[i] < 0)
            return fprintf(stderr, "bench_cuda: unknown shape '%s'\n", sh_items[i]), usage();
    }
    for (int i = 0; i < n_ty; i++)
        if (!strcmp(ty_items[i], "q4_k_m") || !strcmp(ty_items[i], "q5_k_m"))
            type_ids[i] = ty_items[i][1] == '4' ? SYNTH_Q4_K_M : SYNTH_Q5_K_M;
        else if (convert_parse_type(ty_items[i], &type_ids[i]))
            return fprintf(stderr, "bench_cuda: unknown type '%s'\n", ty_items[i]), usage();
    if (batch_arg[0]) {
        n_batches = split(batch_arg, b_items, MAX_BATCHES);
        max_batch = 1;
        for (int k = 0; k < n_batches; k++) {
            batches[k] = atoi(b_items[k]);
            if (batches[k] < 1 || batches[k] > 4096) return usage();
            if (batches[k] > max_batch) max_batch = batches[k];
        }
    }
    if (prefill < 1 || prefill > 65536) return usage();

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
    const char *peak_from = "memory clock x bus width";
    peak_gbs = info.peak_gbs;
    for (size_t k = 0; k < sizeof hbm_peaks / sizeof hbm_peaks[0]; k++)
        if (strstr(info.name, hbm_peaks[k].match)) {
            peak_gbs = hbm_peaks[k].gbs;
            peak_from = "datasheet, by name";
            break;
        }
    if (peak_gbs <= 0) peak_gbs = d2d_gbs, peak_from = "unknown: the measured copy rate";
    printf("device: %s, sm_%d%d, %d SMs, %.1f GiB, driver %d\n", info.name, info.cc_major,
           info.cc_minor, info.sms, info.total_mem / 1073741824.0, info.driver_version);
    printf("HBM peak %.0f GB/s (%s; clock x width says %.0f) | device-to-device copy %.1f GB/s "
           "(read+write, %.0f%% of peak) | host-to-device from pinned memory %.1f GB/s\n",
           peak_gbs, peak_from, info.peak_gbs, d2d_gbs, 100.0 * d2d_gbs / peak_gbs, h2d_gbs);
    fflush(stdout);
    cuda_engine_close(ce);
    synth_free(&tiny);
    int fails = 0;
    for (int i = 0; i < n_sh; i++)
        for (int j = 0; j < n_ty; j++)
            if (run_one(shape_idx[i], type_ids[j], err)) {
                printf("bench %s %s: failed: %s\n", shapes[shape_idx[i]].name,
                       synth_type_name(type_ids[j]), err);
                fflush(stdout);
                fails++;
            }
    return fails ? 1 : 0;
}
