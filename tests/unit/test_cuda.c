/* test_cuda: the CUDA backend.
 *
 * Everywhere (no GPU needed): the fatbin is embedded and holds every kernel the host looks up;
 * backend selection falls back to the CPU with the reason (no libcuda.so.1, the toolkit's stub
 * driver whose cuInit fails, STRATA_BACKEND=cpu); the weight plan (device layout, span upload
 * schedule) and the launch shapes; the block types' device code (k_quant.cuh, which is C too)
 * run on the CPU: planes as the repack kernel makes them, dequantization bit-identical to
 * quant.c, each chunk's integer dot against the exact dot (1e-5 of sum |w x|).
 * On a GPU (else "skip - ...: no CUDA device (libcuda.so.1 not found)"): logits against a plain
 * C reference forward (llama2.c's, dequantizing the same weight bytes) per weight type, within
 *   F32 1e-4 (GEMV, f32 throughout);
 *   F16/BF16 decode (GEMV, f32 activations) 1e-3;
 *   block types decode (GEMV, activations quantized to Q8 as the CPU's) 5e-2;
 *   prefill on the tensor cores (activations rounded to f16; bf16 for BF16) 3e-2 (BF16 6e-2),
 * all as max |gpu - ref| / max(1, max |ref|) over every logit; through engine.h against the
 * CPU engine (Q8 activations on the CPU side): F32 1e-3, F16 3e-2, BF16 6e-2, block types 5e-2,
 * and decoding alone (the same integers on both sides) 5e-3; per block type the kernels on three
 * matrices (GEMV to 1e-5 of sum |w x| against the exact dot with the CPU's quantized
 * activations, tensor cores to 1e-3) and the embedding rows bit for bit;
 * greedy tokens of stories260K equal the reference's exactly; 16 sequences decoded in one batch =
 * each alone; weights must be uploaded before use; the device sampler's greedy and top_k=1 paths.
 */
#include "drivers/cuda/cu_api.h"
#include "serving/engine/backends.h"
#include "serving/engine/cuda/cuda_backend.h"
#include "drivers/cuda/cuda_fatbin.h"
#include "serving/engine/cuda/cuda_plan.h"
#include "serving/engine/convert.h"
#include "serving/engine/repack.h"
#include "os/common/errmsg.h"
#include "os/runtime/log.h"
#include "tests/unit/check.h"
#include "tests/unit/cuda_synth.h"

/* The device's block-format code, run here on the CPU (k_quant.cuh is C and CUDA). */
#include "serving/engine/cuda/k_quant.cuh"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- reference forward: llama2.c's, one token at a time, weights dequantized row by row ---- */

struct ref {
    const struct model *m;
    int max_pos;
    float *kc, *vc; /* [layer][pos][kv_dim] */
    float *x, *xb, *xb2, *q, *k, *v, *att, *hb, *hb2, *sc, *row;
};

static void ref_open(struct ref *r, const struct model *m, int max_pos)
{
    const struct model_config *c = &m->cfg;
    memset(r, 0, sizeof *r);
    r->m = m;
    r->max_pos = max_pos;
    size_t kv = (size_t)c->n_layers * max_pos * c->kv_dim;
    r->kc = calloc(kv, 4);
    r->vc = calloc(kv, 4);
    int big = c->hidden_dim > c->dim ? c->hidden_dim : c->dim;
    if (c->n_heads * c->head_dim > big) big = c->n_heads * c->head_dim;
    float **bufs[] = {&r->x, &r->xb,  &r->xb2, &r->q,   &r->k,
                      &r->v, &r->att, &r->hb,  &r->hb2, &r->row};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) *bufs[i] = calloc((size_t)big, 4);
    r->sc = calloc((size_t)max_pos, 4);
}

static void ref_close(struct ref *r)
{
    float *bufs[] = {r->kc, r->vc,  r->x,  r->xb,  r->xb2, r->q, r->k,
                     r->v,  r->att, r->hb, r->hb2, r->row, r->sc};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
}

static void ref_matvec(struct ref *r, float *y, const struct tensor *w, const float *x)
{
    for (int i = 0; i < w->rows; i++) {
        tensor_get_row(w, i, r->row); /* any layout (a CPU engine may have repacked it) */
        double s = 0;
        for (int j = 0; j < w->cols; j++) s += (double)r->row[j] * x[j];
        y[i] = (float)s;
    }
}

static void ref_rmsnorm(float *o, const float *x, const struct tensor *w, int n, float eps)
{
    const float *wv = w->data;
    float ss = 0;
    for (int j = 0; j < n; j++) ss += x[j] * x[j];
    ss = 1.0f / sqrtf(ss / n + eps);
    for (int j = 0; j < n; j++) o[j] = wv[j] * (ss * x[j]);
}

static void ref_forward(struct ref *r, int token, int pos, float *logits)
{
    const struct model *m = r->m;
    const struct model_config *c = &m->cfg;
    int D = c->dim, hd = c->head_dim, kvd = c->kv_dim, qd = c->n_heads * hd;
    tensor_get_row(&m->token_embd, token, r->x);
    for (int l = 0; l < c->n_layers; l++) {
        const struct layer_weights *w = &m->layers[l];
        ref_rmsnorm(r->xb, r->x, &w->attn_norm, D, c->norm_eps);
        ref_matvec(r, r->q, &w->wq, r->xb);
        ref_matvec(r, r->k, &w->wk, r->xb);
        ref_matvec(r, r->v, &w->wv, r->xb);
        if (c->qkv_bias) {
            const float *bq = w->bq.data, *bk = w->bk.data, *bv = w->bv.data;
            for (int i = 0; i < qd; i++) r->q[i] += bq[i];
            for (int i = 0; i < kvd; i++) r->k[i] += bk[i], r->v[i] += bv[i];
        }
        if (c->qk_norm) {
            for (int h = 0; h < c->n_heads; h++)
                ref_rmsnorm(r->q + h * hd, r->q + h * hd, &w->q_norm, hd, c->norm_eps);
            for (int h = 0; h < c->n_kv_heads; h++)
                ref_rmsnorm(r->k + h * hd, r->k + h * hd, &w->k_norm, hd, c->norm_eps);
        }
        /* RoPE: pair j of each head, (2j, 2j+1) or NeoX (j, j + hd/2) */
        const float *ff = c->rope_freqs ? w->rope_freqs.data : NULL;
        for (int h = 0; h < c->n_heads; h++)
            for (int j = 0; j < hd / 2; j++) {
                float freq = 1.0f / powf(c->rope_theta, (float)(2 * j) / (float)hd);
                float a = pos * freq;
                if (ff) a /= ff[j];
                a *= c->rope_scale;
                float co = cosf(a), si = sinf(a);
                int e0 = h * hd + (c->rope_style == ROPE_HALVES ? j : 2 * j),
                    e1 = e0 + (c->rope_style == ROPE_HALVES ? hd / 2 : 1);
                for (int t = 0; t < (h < c->n_kv_heads ? 2 : 1); t++) {
                    float *v = t == 0 ? r->q : r->k;
                    float v0 = v[e0], v1 = v[e1];
                    v[e0] = v0 * co - v1 * si;
                    v[e1] = v0 * si + v1 * co;
                }
            }
        float *kc = r->kc + ((size_t)l * r->max_pos + pos) * kvd;
        float *vc = r->vc + ((size_t)l * r->max_pos + pos) * kvd;
        memcpy(kc, r->k, (size_t)kvd * 4);
        memcpy(vc, r->v, (size_t)kvd * 4);
        for (int h = 0; h < c->n_heads; h++) {
            int kh = h / (c->n_heads / c->n_kv_heads);
            const float *q = r->q + h * hd;
            float mx = -INFINITY;
            for (int t = 0; t <= pos; t++) {
                const float *k = r->kc + ((size_t)l * r->max_pos + t) * kvd + kh * hd;
                float s = 0;
                for (int i = 0; i < hd; i++) s += q[i] * k[i];
                r->sc[t] = s / sqrtf((float)hd);
                if (r->sc[t] > mx) mx = r->sc[t];
            }
            float sum = 0;
            for (int t = 0; t <= pos; t++) sum += r->sc[t] = expf(r->sc[t] - mx);
            float *o = r->att + h * hd;
            for (int i = 0; i < hd; i++) o[i] = 0;
            for (int t = 0; t <= pos; t++) {
                const float *v = r->vc + ((size_t)l * r->max_pos + t) * kvd + kh * hd;
                for (int i = 0; i < hd; i++) o[i] += r->sc[t] / sum * v[i];
            }
        }
        ref_matvec(r, r->xb2, &w->wo, r->att);
        for (int i = 0; i < D; i++) r->x[i] += r->xb2[i];
        ref_rmsnorm(r->xb, r->x, &w->ffn_norm, D, c->norm_eps);
        ref_matvec(r, r->hb, &w->w_gate, r->xb);
        ref_matvec(r, r->hb2, &w->w_up, r->xb);
        for (int i = 0; i < c->hidden_dim; i++)
            r->hb[i] = r->hb[i] / (1.0f + expf(-r->hb[i])) * r->hb2[i];
        ref_matvec(r, r->xb2, &w->w_down, r->hb);
        for (int i = 0; i < D; i++) r->x[i] += r->xb2[i];
    }
    ref_rmsnorm(r->xb, r->x, &m->output_norm, D, c->norm_eps);
    ref_matvec(r, logits, &m->output, r->xb);
}

static int argmax(const float *v, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

/* ---- no GPU needed ---- */

static double rel_err(const float *a, const float *ref, size_t n)
{
    double mx = 1, d = 0;
    for (size_t i = 0; i < n; i++) {
        if (fabs(ref[i]) > mx) mx = fabs(ref[i]);
        double e = fabs((double)a[i] - ref[i]);
        if (!(e <= d)) d = e; /* NaN propagates */
    }
    return d / mx;
}

TEST(fatbin_embedded)
{
    size_t size;
    const unsigned char *fb = cuda_fatbin(&size);
#ifdef STRATA_NVCC_BUILD
    CHECKF(size > 1000, "built with nvcc but the embedded fatbin is %zu bytes", size);
#else
    if (!size) SKIP("built without nvcc: no kernels to check");
#endif
    uint32_t magic;
    memcpy(&magic, fb, 4);
    CHECKF(magic == 0xBA55ED50u, "fatbin magic %08x", magic);
    /* Every kernel the host looks up by name is in the image (names are stored uncompressed in
     * the ELF string tables; a mismatch here would fail at cuModuleGetFunction on a GPU). */
    const char *names[128];
    int n = cuda_kernel_names(names, 128);
    CHECK(n > 20 && n < 128);
    for (int i = 0; i < n; i++) {
        size_t len = strlen(names[i]) + 1; /* with the NUL: k_gemv_f16_1 is not k_gemv_f16_16 */
        CHECKF(memmem(fb, size, names[i], len) != NULL, "kernel %s not in the fatbin", names[i]);
    }
}

/* backends_pick over the real list chose cpu, and its line is "backend cpu: <why>". */
static void picked_cpu(const char *why)
{
    char line[ERRMSG_LEN];
    CHECK_STR(backends_pick(backends_all, NULL, line)->name, "cpu");
    CHECKF(!strncmp(line, "backend cpu: ", 13) && !strcmp(line + 13, why), "line: %s", line);
}

TEST(backend_falls_back_without_libcuda)
{
    char why[ERRMSG_LEN];
    setenv("STRATA_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
    cu_api_unload();
    size_t size;
    cuda_fatbin(&size);
    CHECK(cuda_probe(why) == -1);
    if (size)
        CHECK_STR(why, "no CUDA device (/nonexistent/libcuda.so.1 not found)");
    else
        CHECK_STR(why, "built without CUDA kernels; no CUDA device (/nonexistent/libcuda.so.1 not "
                       "found)");
    picked_cpu(why);
    unsetenv("STRATA_LIBCUDA");
    cu_api_unload();
}

TEST(backend_stub_driver_resolves_and_fails_init)
{
    const char *stub = "/usr/local/cuda/lib64/stubs/libcuda.so";
    FILE *f = fopen(stub, "rb");
    if (!f) SKIP("no CUDA toolkit stub driver at %s", stub);
    fclose(f);
    size_t size;
    cuda_fatbin(&size);
    if (!size) SKIP("built without nvcc: the probe stops before loading the driver");
    char why[ERRMSG_LEN];
    setenv("STRATA_LIBCUDA", stub, 1);
    cu_api_unload();
    /* Every symbol resolves (no "missing symbol"), and the stub's cuInit refuses. */
    CHECK(cuda_probe(why) == -1);
    CHECKF(strncmp(why, "no CUDA device (cuInit: ", 24) == 0, "why: %s", why);
    picked_cpu(why);
    unsetenv("STRATA_LIBCUDA");
    cu_api_unload();
}

TEST(backend_forced_cpu)
{
    setenv("STRATA_BACKEND", "cpu", 1);
    picked_cpu("STRATA_BACKEND=cpu");
    unsetenv("STRATA_BACKEND");
}

static const struct synth_shape tiny = {256, 768, 2, 8, 4, 512, 128};

/* Every type the CUDA kernels take; the k_quant.cuh ones last. */
static const uint32_t all_types[] = {GGML_F32,  GGML_F16,  GGML_BF16, GGML_Q8_0,   GGML_Q4_0,
                                     GGML_Q4_1, GGML_Q5_0, GGML_Q5_1, GGML_IQ4_NL, GGML_Q2_K,
                                     GGML_Q3_K, GGML_Q4_K, GGML_Q5_K, GGML_Q6_K,   GGML_IQ4_XS};
enum { N_ALL_TYPES = sizeof all_types / sizeof all_types[0], FIRST_BLOCK = 3 };
/* The architectures beside Llama 2 (model.h), on the tiny shape; every row a multiple of 32. */
static const struct arch_case {
    const char *name;
    struct synth_arch_opts a;
} arch_cases[] = {
    {"llama 3.1 (rope_freqs, heads of 48 on dim 256)",
     {.arch = ARCH_LLAMA, .head_dim = 48, .rope_freqs = 1}},
    {"llama with q/k/v biases", {.arch = ARCH_LLAMA, .qkv_bias = 1}},
    {"qwen2 (biases, NeoX)", {.arch = ARCH_QWEN2, .qkv_bias = 1, .neox = 1}},
    {"qwen3 (q/k norms, NeoX, heads of 64)",
     {.arch = ARCH_QWEN3, .head_dim = 64, .qk_norm = 1, .neox = 1}},
};
#define N_ARCH_CASES ((int)(sizeof arch_cases / sizeof arch_cases[0]))

TEST(plan_layout_and_upload_schedule)
{
    const uint32_t *types = all_types;
    for (int ti = 0; ti < N_ALL_TYPES; ti++) {
        for (int tied = 0; tied < 2; tied++) {
            struct synth s;
            CHECK(synth_build(&s, &tiny, types[ti], tied, 0, 7) == 0);
            struct cuda_plan p;
            char err[ERRMSG_LEN];
            CHECKF(cuda_plan_weights(&p, &s.m, err) == 0, "%s", err);
            CHECK_EQ_INT(p.n_spans, tiny.layers + 2);
            CHECK_EQ_INT(p.n_mats, 1 + 9 * tiny.layers + 1 + !tied);
            CHECK(tied ? p.out == p.embd : p.out == p.n_mats - 1);
            uint64_t max_span = 0, prev_end = 0;
            for (int sp = 0; sp < p.n_spans; sp++) {
                const struct cuda_span *c = &p.spans[sp];
                /* the host range is exactly the model's span: one contiguous copy per layer */
                CHECK(c->host == s.image + s.m.spans[sp].offset);
                CHECK_EQ_INT(c->bytes, s.m.spans[sp].size);
                if (c->bytes > max_span) max_span = c->bytes;
                for (int i = c->first_mat; i < c->first_mat + c->n_mats; i++) {
                    const struct cuda_mat *mt = &p.mats[i];
                    CHECK_EQ_INT(mt->span, sp);
                    CHECK(c->host + mt->src_off == mt->t->data);
                    CHECK(mt->src_off + mt->t->nbytes <= c->bytes);
                    CHECK_EQ_INT(mt->dst_off % CUDA_DEV_ALIGN, 0);
                    CHECK(mt->dst_off >= prev_end); /* in order, no overlap */
                    prev_end = mt->dst_off + (mt->d_bytes ? mt->d_off + mt->d_bytes : mt->qs_bytes);
                    const struct cuda_block_format *bf = cuda_block_format(mt->type);
                    if (mt->type == GGML_Q8_0 || mt->type == GGML_Q4_0) {
                        CHECK_EQ_INT(mt->qs_bytes, (uint64_t)mt->rows * mt->cols /
                                                       (mt->type == GGML_Q8_0 ? 1 : 2));
                        CHECK_EQ_INT(mt->d_bytes, (uint64_t)mt->rows * mt->cols / 32 * 2);
                        CHECK_EQ_INT(mt->d_off % CUDA_DEV_ALIGN, 0);
                    } else if (bf) {
                        /* planes qs, e, s, d in order, aligned, as big as the blocks' fields */
                        uint64_t nb = (uint64_t)mt->rows * (mt->cols / bf->elems);
                        CHECK_EQ_INT(mt->qs_bytes, nb * bf->len[CUDA_PLANE_QS]);
                        CHECK_EQ_INT(mt->e_bytes, nb * bf->len[CUDA_PLANE_E]);
                        CHECK_EQ_INT(mt->s_bytes, nb * bf->len[CUDA_PLANE_S]);
                        CHECK_EQ_INT(mt->d_bytes, nb * bf->len[CUDA_PLANE_D]);
                        uint64_t at = mt->qs_bytes;
                        const uint64_t offs[3] = {mt->e_off, mt->s_off, mt->d_off},
                                       lens[3] = {mt->e_bytes, mt->s_bytes, mt->d_bytes};
                        for (int k = 0; k < 3; k++) {
                            if (!lens[k]) continue;
                            CHECK_EQ_INT(offs[k] % CUDA_DEV_ALIGN, 0);
                            CHECK(offs[k] >= at);
                            at = offs[k] + lens[k];
                        }
                        CHECK_EQ_INT(at, mt->d_off + mt->d_bytes); /* d is the last plane */
                    } else if (mt->rows > 1) {
                        CHECK_EQ_INT(mt->ld % 8, 0); /* 16-byte aligned rows */
                        CHECK(mt->ld >= mt->cols && mt->ld < mt->cols + 8);
                    }
                }
            }
            CHECK_EQ_INT(p.staging_bytes, max_span);
            CHECK(p.device_bytes >= prev_end && p.device_bytes < prev_end + CUDA_DEV_ALIGN);
            cuda_plan_free(&p);
            synth_free(&s);
        }
    }
}

/* A layer's biases, q/k norms and rope_freqs are planned in its span, as f32 vectors. */
TEST(plan_lays_out_each_architecture)
{
    for (int i = 0; i < N_ARCH_CASES; i++) {
        const struct synth_arch_opts *a = &arch_cases[i].a;
        struct synth s;
        CHECK(synth_build_arch(&s, &tiny, a, GGML_Q8_0, i & 1, 1, 7) == 0);
        struct cuda_plan p;
        char err[ERRMSG_LEN];
        CHECKF(cuda_plan_weights(&p, &s.m, err) == 0, "%s: %s", arch_cases[i].name, err);
        int extra = 3 * a->qkv_bias + 2 * a->qk_norm + a->rope_freqs;
        CHECK_EQ_INT(p.layer_stride, 9 + extra);
        CHECK_EQ_INT(p.n_mats, 1 + (9 + extra) * tiny.layers + 1 + !(i & 1));
        for (int l = 0; l < tiny.layers; l++) {
            const struct layer_weights *w = &s.m.layers[l];
            const struct {
                int f, present;
                const struct tensor *t;
            } want[] = {{CM_Q, 1, &w->wq},
                        {CM_O, 1, &w->wo},
                        {CM_UP, 1, &w->w_up},
                        {CM_BQ, a->qkv_bias, &w->bq},
                        {CM_BV, a->qkv_bias, &w->bv},
                        {CM_K_NORM, a->qk_norm, &w->k_norm},
                        {CM_ROPE_FREQS, a->rope_freqs, &w->rope_freqs}};
            for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
                int m = cuda_plan_layer_mat(&p, l, want[k].f);
                if (!want[k].present) {
                    CHECK_EQ_INT(m, -1);
                    continue;
                }
                CHECK(m > 0 && p.mats[m].t == want[k].t && p.mats[m].span == 1 + l);
                if (want[k].f >= CM_BQ) /* vectors: f32, rows as they are */
                    CHECK(p.mats[m].type == GGML_F32 && p.mats[m].ld == p.mats[m].cols &&
                          p.mats[m].rows == 1);
            }
        }
        const struct cuda_mat *o = &p.mats[cuda_plan_layer_mat(&p, 0, CM_O)];
        CHECK_EQ_INT(o->cols, s.m.cfg.q_dim);
        CHECK_EQ_INT(o->rows, tiny.dim);
        cuda_plan_free(&p);
        synth_free(&s);
    }
}

TEST(plan_pads_ragged_rows)
{
    /* stories260K's hidden_dim is 172: F32 rows of 172 floats are padded to 176 on the device */
    struct synth_shape sh = {64, 172, 1, 8, 4, 512, 64};
    struct synth s;
    CHECK(synth_build(&s, &sh, GGML_F16, 1, 0, 3) == 0);
    struct cuda_plan p;
    char err[ERRMSG_LEN];
    CHECKF(cuda_plan_weights(&p, &s.m, err) == 0, "%s", err);
    const struct cuda_mat *down = &p.mats[cuda_plan_layer_mat(&p, 0, CM_DOWN)];
    CHECK_EQ_INT(down->cols, 172);
    CHECK_EQ_INT(down->ld, 176);
    CHECK_EQ_INT(down->qs_bytes, 64 * 176 * 2);
    cuda_plan_free(&p);
    synth_free(&s);
}

TEST(plan_rejects_what_the_kernels_lack)
{
    struct synth s;
    struct cuda_plan p;
    char err[ERRMSG_LEN];
    CHECK(synth_build(&s, &tiny, GGML_Q8_0, 0, 0, 5) == 0);
    s.m.layers[1].wk.type = 9; /* Q8_1: ggml's activation type, never a weight */
    s.m.layers[1].wk.nbytes = ggml_row_bytes(9, 256) * s.m.layers[1].wk.rows;
    CHECK(cuda_plan_weights(&p, &s.m, err) == -1);
    CHECK_STR(err,
              "cuda: tensor blk.1.attn_k.weight: type q8_1 is not supported by the CUDA kernels");
    s.m.layers[1].wk.nbytes = ggml_row_bytes(GGML_Q8_0, 256) * s.m.layers[1].wk.rows;
    s.m.layers[1].wk.type = TENSOR_Q8_0_X16; /* what a CPU engine leaves in a shared model */
    CHECK(cuda_plan_weights(&p, &s.m, err) == -1);
    CHECK_STR(
        err, "cuda: tensor blk.1.attn_k.weight: type q8_0x16 is not supported by the CUDA kernels");
    s.m.layers[1].wk.type = GGML_Q8_0;
    s.m.layers[0].ffn_norm.type = GGML_F16;
    CHECK(cuda_plan_weights(&p, &s.m, err) == -1);
    CHECK_STR(err, "cuda: tensor blk.0.ffn_norm.weight: norm weights must be f32, not f16");
    s.m.layers[0].ffn_norm.type = GGML_F32;
    s.m.layers[0].wq.cols = 48;
    CHECK(cuda_plan_weights(&p, &s.m, err) == -1);
    CHECK_STR(err, "cuda: tensor blk.0.attn_q.weight: 48 columns is not a multiple of 32");
    s.m.layers[0].wq.type = GGML_Q6_K;
    s.m.layers[0].wq.cols = 288;
    CHECK(cuda_plan_weights(&p, &s.m, err) == -1);
    CHECK_STR(err, "cuda: tensor blk.0.attn_q.weight: 288 columns is not a multiple of 256");
    s.m.layers[0].wq.type = GGML_Q8_0;
    s.m.layers[0].wq.cols = 256;
    s.m.layers[0].wq.nbytes -= 34;
    CHECK(cuda_plan_weights(&p, &s.m, err) == -1);
    CHECKF(strstr(err, "blk.0.attn_q.weight: 69598 bytes, expected 69632") != NULL, "%s", err);
    s.m.layers[0].wq.nbytes += 34;
    /* a tensor of layer 0 somewhere else in memory: the span would not be one copy */
    static uint8_t elsewhere[256 * 4];
    s.m.layers[0].attn_norm.data = elsewhere;
    CHECK(cuda_plan_weights(&p, &s.m, err) == -1);
    CHECKF(strstr(err, "span 1: tensors spread over") != NULL, "%s", err);
    synth_free(&s);
}

TEST(launch_shapes)
{
    CHECK_EQ_INT(cuda_gemv_blocks(GGML_F16, 4096), 512); /* 8 rows (warps) per 256 threads */
    CHECK_EQ_INT(cuda_gemv_blocks(GGML_Q8_0, 4097), 513);
    CHECK_EQ_INT(cuda_gemv_blocks(GGML_F32, 1), 1);
    CHECK_EQ_INT(cuda_gemv_blocks(GGML_Q4_0, 64 + 64 + 1), 17); /* q, k, v of a tiny model */
    int want[9] = {0, 1, 2, 4, 4, 8, 8, 8, 8};
    for (int n = 1; n <= 8; n++) CHECK_EQ_INT(cuda_gemv_nt(n), want[n]);
    CHECK(!cuda_use_gemm(GGML_F16, 1) && !cuda_use_gemm(GGML_Q4_0, 15));
    CHECK(cuda_use_gemm(GGML_F16, 16) && cuda_use_gemm(GGML_Q8_0, 512));
    CHECK(!cuda_use_gemm(GGML_F32, 512)); /* F32 models keep exact f32 products */
    CHECK_EQ_INT(cuda_gemm_blocks(11008), 172);
    CHECK_EQ_INT(cuda_gemm_blocks(65), 2);
    /* attention: a batch-1 decode on 132 SMs splits its positions 17 ways (4 blocks an SM), a
     * 64-token step not at all; never past 32 ranges nor under 64 positions a range of ctx */
    /* RMSNorm fused with the quantization: decode of the block types, one pass, rows that fit */
    CHECK(cuda_rmsnorm_fuses(GGML_Q4_K, 4096, 1, 96 * 1024));
    CHECK(cuda_rmsnorm_fuses(GGML_Q8_0, 2048, 8, 96 * 1024));
    CHECK(!cuda_rmsnorm_fuses(GGML_F16, 4096, 1, 96 * 1024));   /* f32 activations: no quant */
    CHECK(!cuda_rmsnorm_fuses(GGML_Q4_0, 288, 1, 96 * 1024));   /* not whole 256s */
    CHECK(!cuda_rmsnorm_fuses(GGML_Q4_K, 16384, 1, 96 * 1024)); /* 64 KiB row */
    CHECK(!cuda_rmsnorm_fuses(GGML_Q4_K, 8192, 8, 48 * 1024));  /* two passes of 4 */
    CHECK(cuda_rmsnorm_fuses(GGML_Q4_K, 8192, 4, 48 * 1024));
    CHECK_EQ_INT(cuda_attention_splits(1, 32, 4096, 132), 17);
    CHECK_EQ_INT(cuda_attention_splits(8, 32, 4096, 132), 3);
    CHECK_EQ_INT(cuda_attention_splits(64, 32, 4096, 132), 1);
    CHECK_EQ_INT(cuda_attention_splits(1, 8, 64, 132), 1);
    CHECK_EQ_INT(cuda_attention_splits(1, 4, 8192, 132), 32);
    CHECK_EQ_INT((int)cuda_attention_part_floats(8, 32, 128, 4096, 132), 24 * 32 * 130);
    CHECK_EQ_INT((int)cuda_attention_part_floats(64, 8, 64, 64, 132), 0);
    CHECK_EQ_INT(cuda_elementwise_blocks(1, 256), 1);
    CHECK_EQ_INT(cuda_elementwise_blocks(1000, 256), 4);
    CHECK_EQ_INT(cuda_elementwise_blocks(1LL << 40, 256), 4096);
    /* the quantized GEMVs: one warp per row; families share launches; shared memory */
    CHECK_EQ_INT(cuda_gemv_blocks(GGML_Q4_K, 4096), 512);
    CHECK_EQ_INT(cuda_gemv_blocks(GGML_IQ4_NL, 9), 2);
    /* rows a warp takes: one wave of 3 blocks (1 token) or 2 (more) an SM of 8 warps */
    CHECK_EQ_INT(cuda_gemvq_rpw(14336, 1, 132), 5);
    CHECK_EQ_INT(cuda_gemvq_rpw(4096, 1, 132), 2);
    CHECK_EQ_INT(cuda_gemvq_rpw(4096, 8, 132), 2);
    CHECK_EQ_INT(cuda_gemvq_rpw(9, 1, 132), 1);
    CHECK_EQ_INT((int)cuda_gemvq_smem(GGML_Q4_K, 256, 1), 304); /* 292 rounded to 16 */
    CHECK(cuda_gemv_family(GGML_Q4_K) == cuda_gemv_family(GGML_Q6_K));
    CHECK(cuda_gemv_family(GGML_Q2_K) == cuda_gemv_family(GGML_IQ4_XS));
    CHECK(cuda_gemv_family(GGML_Q4_1) == cuda_gemv_family(GGML_IQ4_NL));
    CHECK(cuda_gemv_family(GGML_Q4_1) != cuda_gemv_family(GGML_Q4_K));
    CHECK(cuda_gemv_family(GGML_Q4_0) == cuda_gemv_family(GGML_Q8_0));
    CHECK(cuda_gemv_family(GGML_Q8_0) == cuda_gemv_family(GGML_Q5_1));
    CHECK(cuda_gemv_family(GGML_Q8_0) != cuda_gemv_family(GGML_F16));
    CHECK(cuda_gemv_family(GGML_F16) != cuda_gemv_family(GGML_BF16));
    CHECK_EQ_INT(cuda_gemvq_smem(GGML_F16, 4096, 8), 0);
    CHECK_EQ_INT(cuda_gemvq_smem(GGML_Q8_0, 64, 8), 8 * (64 + 2 * 16));
    CHECK_EQ_INT(cuda_gemvq_smem(GGML_Q4_K, 4096, 1), 4096 + 16 * 4 + 256 * 2);
    CHECK_EQ_INT(cuda_gemvq_smem(GGML_Q6_K, 4096, 2), 2 * (4096 + 16 * 4 + 256 * 2));
    CHECK_EQ_INT(cuda_gemvq_smem(GGML_Q5_0, 4096, 1), 4096 + 128 * 16);
    CHECK_EQ_INT(cuda_gemv_pass(GGML_Q4_K, 4096, CUDA_GEMVQ_SMEM_MAX), 8);
    CHECK_EQ_INT(cuda_gemv_pass(GGML_Q4_K, 14336, CUDA_GEMVQ_SMEM_MAX), 4); /* 8B ffn_down */
    CHECK_EQ_INT(cuda_gemv_pass(GGML_Q4_K, 14336, 48 * 1024), 2);
    CHECK_EQ_INT(cuda_gemv_pass(GGML_F16, 1 << 20, 48 * 1024), 8);
}

/* ---- the block formats' device code, on the CPU (k_quant.cuh) ---- */

/* ggml bytes of rows x cols in the device layout, split into planes as k_repack_planes does. */
struct host_planes {
    uint8_t *buf[CUDA_PLANES];
    struct kq_planes p;
};

static void planes_make(uint32_t type, const uint8_t *src, int rows, int cols,
                        struct host_planes *hp)
{
    const struct cuda_block_format *bf = cuda_block_format(type);
    long long nb = (long long)rows * (cols / bf->elems);
    for (int k = 0; k < CUDA_PLANES; k++) {
        /* a plane the type lacks stays NULL, so a stray read crashes here */
        hp->buf[k] = bf->len[k] ? malloc((size_t)(nb * bf->len[k])) : NULL;
        for (long long b = 0; bf->len[k] && b < nb; b++)
            memcpy(hp->buf[k] + b * bf->len[k], src + b * bf->bytes + bf->off[k],
                   (size_t)bf->len[k]);
    }
    hp->p = (struct kq_planes){hp->buf[0], hp->buf[1], hp->buf[2], hp->buf[3]};
}

static void planes_free(struct host_planes *hp)
{
    for (int k = 0; k < CUDA_PLANES; k++) free(hp->buf[k]);
}

/* Random rows of a type: values of mixed magnitudes (a row of zeros and a row of tiny values
 * too, whose scales are subnormal halves), quantized by quant.c. */
static uint8_t *random_rows(uint32_t type, int rows, int cols, uint64_t seed)
{
    uint64_t rb = ggml_row_bytes(type, (uint64_t)cols), rng = seed | 1;
    uint8_t *w = malloc(rb * rows);
    float *x = malloc(sizeof(float) * cols);
    for (int r = 0; r < rows; r++) {
        float scale = r == 0 ? 0.f : r == 1 ? 1e-7f : (float)(1 + r % 5) / 16;
        for (int c = 0; c < cols; c++)
            x[c] = scale * synth_uniform(&rng) * (c % 37 == 0 ? 4.f : 1.f);
        quantize_row(type, x, w + r * rb, cols);
    }
    free(x);
    return w;
}

TEST(block_formats_match_the_kernels)
{
    for (int ti = FIRST_BLOCK; ti < N_ALL_TYPES; ti++) {
        uint32_t t = all_types[ti];
        const struct cuda_block_format *bf = cuda_block_format(t);
        CHECKF(bf != NULL, "%s has no device format", ggml_type_name(t));
        CHECK_EQ_INT(bf->elems, ggml_block_elems(t));
        CHECK_EQ_INT(bf->bytes, ggml_row_bytes(t, (uint64_t)bf->elems));
        CHECK(kq_is_block((int)t) && kq_block_elems((int)t) == bf->elems);
        const int lens[CUDA_PLANES] = {kq_qs_bytes((int)t), kq_e_bytes((int)t), kq_s_bytes((int)t),
                                       kq_d_bytes((int)t)};
        int sum = 0;
        unsigned char used[256] = {0};
        for (int k = 0; k < CUDA_PLANES; k++) {
            CHECKF(bf->len[k] == lens[k], "%s plane %d: %d bytes, the kernels read %d",
                   ggml_type_name(t), k, bf->len[k], lens[k]);
            sum += bf->len[k];
            for (int i = bf->off[k]; i < bf->off[k] + bf->len[k]; i++) {
                CHECK(i < bf->bytes && !used[i]);
                used[i] = 1;
            }
        }
        CHECK_EQ_INT(sum, bf->bytes); /* every byte of a block lands in exactly one plane */
        CHECK_EQ_INT(kq_chunks((int)t) * 16, bf->len[CUDA_PLANE_QS]);
    }
    for (int i = 0; i < 16; i++) CHECK_EQ_INT(kq_iq4_level(i), kvalues_iq4nl[i]);
    for (uint32_t v = 0; v < 0x10000; v += 7) {
        uint32_t idx = (v & 15) | (v >> 4 & 15) << 8 | (v >> 8 & 15) << 16 | (v >> 12 & 15) << 24;
        uint32_t got = kq_iq4_lut(idx);
        for (int b = 0; b < 4; b++)
            CHECK_EQ_INT((int8_t)(got >> (8 * b)), kvalues_iq4nl[(idx >> (8 * b)) & 15]);
    }
}

/* kq_deq16 (the embedding and the tensor-core tiles) gives quant.c's dequantize_row exactly. */
TEST(block_dequant_bit_exact)
{
    enum { ROWS = 7, COLS = 512 };
    float *want = malloc(sizeof(float) * COLS), got[16];
    for (int ti = FIRST_BLOCK; ti < N_ALL_TYPES; ti++) {
        uint32_t t = all_types[ti];
        uint8_t *w = random_rows(t, ROWS, COLS, 100 + ti);
        struct host_planes hp;
        planes_make(t, w, ROWS, COLS, &hp);
        uint64_t rb = ggml_row_bytes(t, COLS);
        int bad = 0;
        for (int r = 0; r < ROWS; r++) {
            CHECK(dequantize_row(t, w + r * rb, want, COLS) == 0);
            for (int c = 0; c < COLS; c += 16) {
                kq_deq16((int)t, &hp.p, r, COLS, c, got);
                if (memcmp(got, want + c, sizeof got) && !bad++)
                    CHECKF(0, "%s row %d elements %d..%d: %g, want %g", ggml_type_name(t), r, c,
                           c + 15, got[0], want[c]);
            }
        }
        planes_free(&hp);
        free(w);
    }
    free(want);
}

/* Activations quantized as k_gemvq's prologue quantizes them (and the CPU engine), one token of
 * `cols`: q, and Q8_K's d per 256 and sums per 16, or Q8_0/1's {d, s, sum} per 32. */
struct host_act {
    int8_t *q;
    float *d;
    int16_t *bs;
    float (*m)[3];
};

static void act_quantize(uint32_t type, const float *x, int cols, struct host_act *a)
{
    a->q = calloc((size_t)cols, 1);
    a->d = calloc((size_t)cols / 256 + 1, sizeof(float));
    a->bs = calloc((size_t)cols / 16, sizeof(int16_t));
    a->m = calloc((size_t)cols / 32, sizeof *a->m);
    int be = kq_is_super((int)type) ? 256 : 32;
    for (int b = 0; b < cols / be; b++) {
        const float *v = x + b * be;
        float am = 0;
        for (int i = 0; i < be; i++) am = fmaxf(am, fabsf(v[i]));
        if (be == 256) {
            if (am > 0) {
                float is = kq_q8k_iscale(am);
                for (int i = 0; i < 256; i++) a->q[256 * b + i] = (int8_t)kq_q8k_q(is, v[i]);
                a->d[b] = kq_div(1.f, is);
            }
            for (int g = 0; g < 16; g++) {
                int s = 0;
                for (int i = 0; i < 16; i++) s += a->q[256 * b + 16 * g + i];
                a->bs[16 * b + g] = (int16_t)s;
            }
        } else {
            float id = kq_q8_id(am);
            int s = 0;
            for (int i = 0; i < 32; i++) s += a->q[32 * b + i] = (int8_t)kq_q8_q(id, v[i]);
            a->m[b][0] = kq_q8_d(am);
            a->m[b][1] = kq_q8_s(am, s);
            a->m[b][2] = (float)s;
        }
    }
}

static void act_free(struct host_act *a)
{
    free(a->q);
    free(a->d);
    free(a->bs);
    free(a->m);
}

/* Row r against one quantized token as a warp computes it: lane l sums chunks l, l+32, ...,
 * then the lanes are added as the butterfly does. */
static float warp_row_dot(uint32_t t, const struct kq_planes *p, int r, int cols,
                          const struct host_act *a)
{
    int be = kq_block_elems((int)t), ch = kq_chunks((int)t), nb = cols / be;
    float lane[32] = {0};
    for (int c = 0; c < nb * ch; c++) {
        struct kq_chunk k;
        memset(&k, 0, sizeof k); /* a type's load leaves the fields it does not use alone */
        int b = c / ch;
        kq_load((int)t, p, (long long)r * nb + b, c % ch, &k);
        lane[c % 32] +=
            be == 256 ? kq_dot_super((int)t, &k, c % ch, a->q + 256 * b, a->d[b], a->bs + 16 * b)
                      : kq_dot_32((int)t, &k, c % ch, a->q + 32 * b, a->m[b][0], a->m[b][1],
                                  (int)a->m[b][2]);
    }
    for (int o = 16; o > 0; o >>= 1)
        for (int l = 0; l < 32; l++)
            if (!(l & o)) lane[l] = lane[l] + lane[l + o]; /* l's partner l^o, as shfl_xor */
    return lane[0];
}

/* What the quantized activations stand for, element i (the reference's x): Q8_K d*q; Q8_0/1
 * d*q with d as stored (f16), the minimum's term through s as ggml's Q8_1 has it. */
static double act_value(uint32_t t, const struct host_act *a, int i)
{
    return kq_is_super((int)t) ? (double)a->d[i / 256] * a->q[i]
                               : (double)a->m[i / 32][0] * a->q[i];
}

/* The reference dot of dequantized row w with the quantized token, and sum |w x| (the scale the
 * error is measured against). For Q4_1/Q5_1 the minimum m meets sum(x) through s. */
static double ref_row_dot(uint32_t t, const float *w, const uint8_t *row, int cols,
                          const struct host_act *a, double *mag)
{
    double s = 0;
    *mag = 0;
    int bb = (int)ggml_row_bytes(t, 32);
    for (int i = 0; i < cols; i++) {
        double wi = w[i];
        if (t == GGML_Q4_1 || t == GGML_Q5_1) { /* w = d q + m: the m part through s */
            double m =
                fp16_to_f32((uint16_t)(row[(i / 32) * bb + 2] | row[(i / 32) * bb + 3] << 8));
            wi -= m;
            if (i % 32 == 0) s += m * a->m[i / 32][1];
        }
        s += wi * act_value(t, a, i);
        *mag += fabs(w[i] * act_value(t, a, i));
    }
    return s;
}

/* The CPU engine's matmul (this host's kernels, as loaded and repacked) adds the same integers as
 * the exact block dot the GPU's kernels are held to (block_dot_matches_reference), every type: so
 * a GPU/CPU difference in decoding never comes from the products themselves. */
TEST(cpu_matmul_matches_block_dot)
{
    enum { ROWS = 16, COLS = 768 };
    float *w = malloc(sizeof(float) * COLS), *x = malloc(sizeof(float) * COLS), y[ROWS];
    uint64_t rng = 77;
    for (int c = 0; c < COLS; c++) x[c] = synth_uniform(&rng) * (c % 11 == 0 ? 3.f : 1.f);
    char err[ERRMSG_LEN];
    struct matmul_ctx k;
    void *scr = malloc(matmul_scratch_size(1, COLS));
    CHECK(matmul_init(&k, NULL, scr, 1, COLS, err) == 0);
    for (int ti = FIRST_BLOCK; ti < N_ALL_TYPES; ti++) {
        uint32_t t = all_types[ti];
        uint8_t *wq = random_rows(t, ROWS, COLS, 300 + ti);
        struct host_act a;
        act_quantize(t, x, COLS, &a);
        uint64_t rb = ggml_row_bytes(t, COLS);
        struct tensor tt = {wq, t, ROWS, COLS, rb * ROWS};
        uint8_t *cp = malloc(rb * ROWS);
        memcpy(cp, wq, rb * ROWS);
        struct tensor tr = {cp, t, ROWS, COLS, rb * ROWS};
        int rp = matmul_wants_repack(&k, &tr);
        CHECK(!rp || repack_tensor(&tr, err) == 0);
        double worst = 0;
        for (int pass = 0; pass < 1 + rp; pass++) { /* as loaded, then repacked */
            matmul(&k, y, pass ? &tr : &tt, x, 1);
            for (int r = 0; r < ROWS; r++) {
                CHECK(dequantize_row(t, wq + r * rb, w, COLS) == 0);
                double mag, want = ref_row_dot(t, w, wq + r * rb, COLS, &a, &mag);
                double e = fabs(y[r] - want) / (mag > 0 ? mag : 1);
                if (e > worst) worst = e;
            }
        }
        printf("# %s: CPU matmul (%s%s) vs the exact block dot %.2g of sum |w x|\n",
               ggml_type_name(t), matmul_isa_of(&k), rp ? ", and repacked" : "", worst);
        CHECKF(worst <= 1e-5, "%s: CPU matmul differs from the exact block dot by %.3g",
               ggml_type_name(t), worst);
        free(cp);
        act_free(&a);
        free(wq);
    }
    free(scr);
    free(w), free(x);
}

/* The GEMV's chunk arithmetic against the exact reference, every type, rows of every kind. */
TEST(block_dot_matches_reference)
{
    enum { ROWS = 9, COLS = 768 };
    float *w = malloc(sizeof(float) * COLS), *x = malloc(sizeof(float) * COLS);
    uint64_t rng = 77;
    for (int c = 0; c < COLS; c++) x[c] = synth_uniform(&rng) * (c % 11 == 0 ? 3.f : 1.f);
    x[5] = 0; /* and a block of zeros */
    memset(x + 256, 0, sizeof(float) * 256);
    for (int ti = FIRST_BLOCK; ti < N_ALL_TYPES; ti++) {
        uint32_t t = all_types[ti];
        uint8_t *wq = random_rows(t, ROWS, COLS, 300 + ti);
        struct host_planes hp;
        planes_make(t, wq, ROWS, COLS, &hp);
        struct host_act a;
        act_quantize(t, x, COLS, &a);
        uint64_t rb = ggml_row_bytes(t, COLS);
        double worst = 0;
        for (int r = 0; r < ROWS; r++) {
            CHECK(dequantize_row(t, wq + r * rb, w, COLS) == 0);
            double mag, want = ref_row_dot(t, w, wq + r * rb, COLS, &a, &mag);
            double got = warp_row_dot(t, &hp.p, r, COLS, &a);
            double e = fabs(got - want) / (mag > 1e-30 ? mag : 1);
            if (e > worst) worst = e;
            CHECKF(e <= 1e-5, "%s row %d: %.9g, reference %.9g (error %.3g of sum |w x|)",
                   ggml_type_name(t), r, got, want, e);
        }
        printf("# %s: chunk dot vs reference %.2g of sum |w x|\n", ggml_type_name(t), worst);
        act_free(&a);
        planes_free(&hp);
        free(wq);
    }
    free(w);
    free(x);
}

/* Q4_K by units as k_gemvq_q4k_* takes it (lane l: units l, l + 32, ...; a unit is sub-blocks
 * 2g and 2g+1 of a block, kq_dot_q4k_unit), held to the reference as the chunk loop is and to
 * the chunk loop itself: the same integers, the block's floats applied once per two chunks. */
TEST(q4k_unit_dot_matches_reference)
{
    enum { ROWS = 9, COLS = 768, NB = COLS / 256 };
    float *w = malloc(sizeof(float) * COLS), *x = malloc(sizeof(float) * COLS);
    uint64_t rng = 78;
    for (int c = 0; c < COLS; c++) x[c] = synth_uniform(&rng) * (c % 7 == 0 ? 4.f : 1.f);
    memset(x + 256, 0, sizeof(float) * 256);
    uint32_t t = GGML_Q4_K;
    uint8_t *wq = random_rows(t, ROWS, COLS, 311);
    struct host_planes hp;
    planes_make(t, wq, ROWS, COLS, &hp);
    struct host_act a;
    act_quantize(t, x, COLS, &a);
    uint64_t rb = ggml_row_bytes(t, COLS);
    for (int r = 0; r < ROWS; r++) {
        float lane[32] = {0};
        for (int u = 0; u < 4 * NB; u++) {
            int b = u / 4, g = u % 4;
            uint32_t q[8], h[4];
            memcpy(q, hp.p.qs + ((size_t)r * NB + b) * 128 + 32 * g, 32);
            memcpy(h, hp.p.d + ((size_t)r * NB + b) * 16, 16);
            lane[u % 32] += kq_dot_q4k_unit(q, h, g, a.q + 256 * b, a.d[b], a.bs + 16 * b);
        }
        for (int o = 16; o > 0; o >>= 1)
            for (int l = 0; l < 32; l++)
                if (!(l & o)) lane[l] = lane[l] + lane[l + o];
        CHECK(dequantize_row(t, wq + r * rb, w, COLS) == 0);
        double mag, want = ref_row_dot(t, w, wq + r * rb, COLS, &a, &mag);
        double chunks = warp_row_dot(t, &hp.p, r, COLS, &a);
        double e = fabs(lane[0] - want) / (mag > 1e-30 ? mag : 1),
               ec = fabs(lane[0] - chunks) / (mag > 1e-30 ? mag : 1);
        CHECKF(e <= 1e-5 && ec <= 1e-6,
               "q4_K row %d: units %.9g, chunks %.9g, reference %.9g (%.3g, %.3g of sum |w x|)", r,
               lane[0], chunks, want, e, ec);
    }
    act_free(&a);
    planes_free(&hp);
    free(wq);
    free(w);
    free(x);
}

/* stories260K converted to GGUF (`strata convert`'s code, in memory), planned and filled by
 * model.c into the execution-order image the loader makes: the path a served model takes. */
struct gguf_model {
    struct synth s; /* image and model */
    struct gguf g;
    char *file;
    size_t file_size;
};

static int load_gguf_stories(struct gguf_model *gm, uint32_t type, char *err)
{
    memset(gm, 0, sizeof *gm);
    char ck[512], tk[512];
    snprintf(ck, sizeof ck, "%s/models/stories260K.bin", check_shared());
    snprintf(tk, sizeof tk, "%s/models/tok512.bin", check_shared());
    uint8_t *cb = NULL, *tb = NULL;
    size_t cs, ts;
    if (convert_read_file(ck, &cb, &cs, err) || convert_read_file(tk, &tb, &ts, err)) {
        free(cb);
        return -1;
    }
    FILE *f = open_memstream(&gm->file, &gm->file_size);
    int rc = convert_llama2c(cb, cs, tb, ts, type, "stories260K", ck, f, err);
    fclose(f);
    free(cb);
    free(tb);
    if (rc) return -1;
    if (gguf_parse(&gm->g, gm->file, gm->file_size, err) ||
        model_plan(&gm->s.m, &gm->g, "stories260K.gguf", err))
        return -1;
    gm->s.image_size = gm->s.m.image_size;
    gm->s.image = aligned_alloc(4096, (gm->s.image_size + 4095) / 4096 * 4096);
    for (int sp = 0; sp < gm->s.m.n_spans; sp++)
        if (model_fill(&gm->s.m, gm->s.image, sp, err)) return -1;
    model_bind(&gm->s.m, gm->s.image);
    return 0;
}

static void free_gguf_stories(struct gguf_model *gm)
{
    model_free(&gm->s.m);
    gguf_free(&gm->g);
    free(gm->file);
    free(gm->s.image);
}

/* stories260K in F32 as a synth (synth_free releases it): the GGUF bytes are not kept, the image
 * holds every weight. */
static int load_stories(struct synth *s, char *err)
{
    struct gguf_model gm;
    if (load_gguf_stories(&gm, GGML_F32, err)) return -1;
    *s = gm.s;
    gguf_free(&gm.g);
    free(gm.file);
    return 0;
}

TEST(plan_accepts_the_loaders_image)
{
    uint32_t types[] = {GGML_F32, GGML_F16, GGML_Q8_0, GGML_Q4_0};
    for (int i = 0; i < 4; i++) {
        struct gguf_model gm;
        char err[ERRMSG_LEN];
        log_set_quiet(1);
        if (load_gguf_stories(&gm, types[i], err)) SKIP("%s", err);
        struct cuda_plan p;
        CHECKF(cuda_plan_weights(&p, &gm.s.m, err) == 0, "%s", err);
        for (int sp = 0; sp < p.n_spans; sp++) {
            CHECK(p.spans[sp].host >= gm.s.image);
            CHECK(p.spans[sp].host + p.spans[sp].bytes <= gm.s.image + gm.s.image_size);
        }
        /* stories260K: dim 64 takes the block types; hidden 172 does not, so ffn_down is F32 */
        const struct cuda_mat *q = &p.mats[cuda_plan_layer_mat(&p, 0, CM_Q)];
        const struct cuda_mat *down = &p.mats[cuda_plan_layer_mat(&p, 0, CM_DOWN)];
        CHECK_EQ_INT(q->type, types[i]);
        CHECK(down->type == (types[i] == GGML_F16 ? GGML_F16 : GGML_F32));
        CHECK(p.out == p.embd); /* tied classifier */
        cuda_plan_free(&p);
        free_gguf_stories(&gm);
    }
}

/* The reference the GPU is held to: stories260K greedy from BOS through the span-ordered image
 * must tell the README's story (checks the llama2.c loader and the reference forward). */
TEST(reference_forward_tells_the_story)
{
    struct synth s;
    char err[ERRMSG_LEN], path[512];
    if (load_stories(&s, err)) SKIP("%s (shared models missing)", err);
    snprintf(path, sizeof path, "%s/models/tok512.bin", check_shared());
    FILE *f = fopen(path, "rb");
    CHECKF(f != NULL, "%s: cannot open", path);
    int V = s.m.cfg.vocab_size;
    char **piece = calloc((size_t)V, sizeof *piece);
    uint32_t maxlen;
    CHECK(fread(&maxlen, 4, 1, f) == 1);
    for (int i = 0; i < V; i++) {
        float score;
        int32_t len;
        CHECK(fread(&score, 4, 1, f) == 1 && fread(&len, 4, 1, f) == 1 && len >= 0 && len < 64);
        piece[i] = calloc((size_t)len + 1, 1);
        CHECK(fread(piece[i], 1, (size_t)len, f) == (size_t)len);
    }
    fclose(f);
    struct ref r;
    ref_open(&r, &s.m, 64);
    float *logits = malloc(sizeof(float) * V);
    char text[512] = "";
    int tok = 1;
    for (int p = 0; p < 12; p++) {
        ref_forward(&r, tok, p, logits);
        tok = argmax(logits, V);
        const char *pc = piece[tok];
        if (p == 0 && pc[0] == ' ') pc++; /* no leading space after BOS */
        strncat(text, pc, sizeof text - strlen(text) - 1);
    }
    CHECKF(strncmp(text, "Once upon a time", 16) == 0, "reference says \"%s\"", text);
    free(logits);
    ref_close(&r);
    for (int i = 0; i < V; i++) free(piece[i]);
    free(piece);
    synth_free(&s);
}

/* An engine through engine.h on its own arena; cpu=1 forces the CPU backend. */
struct eng {
    struct arena a;
    struct engine e;
};

static int eng_open(struct eng *g, struct model *m, const struct engine_limits *lim_in, int cpu,
                    char *err)
{
    struct engine_limits lim = *lim_in;
    /* The device keeps f32 keys and values (drivers/cuda); the CPU engines compared with it and
     * with the f32 reference here do too. */
    if (lim.kv_type == KV_DEFAULT) lim.kv_type = KV_F32;
    if (engine_limits_resolve(&lim, &m->cfg, err) ||
        arena_open(&g->a, engine_arena_bytes(&m->cfg, &lim), ARENA_NO_HUGEPAGES | ARENA_NO_LOCK,
                   err))
        return -1;
    if (cpu) setenv("STRATA_BACKEND", "cpu", 1);
    int rc = engine_init(&g->e, m, &lim, &g->a, err);
    unsetenv("STRATA_BACKEND");
    return rc;
}

static void eng_close(struct eng *g)
{
    engine_free(&g->e);
    arena_close(&g->a);
}

/* The reference the GPU tests use agrees with the CPU engine (no GPU needed): so a GPU that
 * matches the reference matches the engine. */
TEST(reference_matches_cpu_engine)
{
    uint32_t types[] = {GGML_F32, GGML_F16, GGML_Q8_0, GGML_Q4_0};
    for (int ti = 0; ti < 4; ti++) {
        struct synth s;
        char err[ERRMSG_LEN];
        CHECK(synth_build(&s, &tiny, types[ti], ti & 1, 1, 17) == 0);
        struct engine_limits lim = {
            .max_tokens = 16, .max_seqs = 1, .ctx = 32, .kv_block_size = 16, .threads = 1};
        struct eng cpu;
        CHECKF(eng_open(&cpu, &s.m, &lim, 1, err) == 0, "%s", err);
        struct ref r;
        ref_open(&r, &s.m, 32);
        int V = tiny.vocab, n = 12, blocks[2] = {0, 1}, tok[12], pos[12], rows[12];
        const int *tabs[12];
        float *lc = malloc(sizeof(float) * V * n), *lr = malloc(sizeof(float) * V * n);
        uint64_t rng = 21;
        for (int i = 0; i < n; i++)
            tok[i] = (int)(synth_rng(&rng) % V), pos[i] = i, rows[i] = i, tabs[i] = blocks;
        struct batch b = {n, tok, pos, tabs, n, rows};
        CHECK(engine_forward(&cpu.e, &b, lc) == 0);
        for (int i = 0; i < n; i++) ref_forward(&r, tok[i], i, lr + (size_t)i * V);
        double e = rel_err(lc, lr, (size_t)n * V);
        double tol = types[ti] == GGML_F32 ? 1e-4 : 3e-2;
        printf("# %s: CPU engine vs reference %.2g (tolerance %.2g)\n", tensor_type_name(types[ti]),
               e, tol);
        CHECKF(e <= tol, "%s: CPU engine vs reference %.3g > %.3g", tensor_type_name(types[ti]), e,
               tol);
        free(lc);
        free(lr);
        ref_close(&r);
        eng_close(&cpu);
        synth_free(&s);
    }
}

/* The same for each architecture: the reference's biases, q/k norms, NeoX RoPE and rope_freqs
 * are the CPU engine's. */
TEST(reference_matches_cpu_engine_architectures)
{
    for (int i = 0; i < N_ARCH_CASES; i++)
        for (int q8 = 0; q8 < 2; q8++) {
            uint32_t type = q8 ? GGML_Q8_0 : GGML_F32;
            struct synth s;
            char err[ERRMSG_LEN];
            CHECK(synth_build_arch(&s, &tiny, &arch_cases[i].a, type, i & 1, 1, 19) == 0);
            struct engine_limits lim = {
                .max_tokens = 16, .max_seqs = 1, .ctx = 32, .kv_block_size = 16, .threads = 1};
            struct eng cpu;
            CHECKF(eng_open(&cpu, &s.m, &lim, 1, err) == 0, "%s", err);
            struct ref r;
            ref_open(&r, &s.m, 32);
            int V = tiny.vocab, n = 12, blocks[2] = {0, 1}, tok[12], pos[12], rows[12];
            const int *tabs[12];
            float *lc = malloc(sizeof(float) * V * n), *lr = malloc(sizeof(float) * V * n);
            uint64_t rng = 23;
            for (int j = 0; j < n; j++)
                tok[j] = (int)(synth_rng(&rng) % V), pos[j] = j, rows[j] = j, tabs[j] = blocks;
            struct batch b = {n, tok, pos, tabs, n, rows};
            CHECK(engine_forward(&cpu.e, &b, lc) == 0);
            for (int j = 0; j < n; j++) ref_forward(&r, tok[j], j, lr + (size_t)j * V);
            double e = rel_err(lc, lr, (size_t)n * V), tol = q8 ? 3e-2 : 1e-4;
            printf("# %s, %s: CPU engine vs reference %.2g (tolerance %.2g)\n", arch_cases[i].name,
                   tensor_type_name(type), e, tol);
            CHECKF(e <= tol, "%s, %s: CPU engine vs reference %.3g > %.3g", arch_cases[i].name,
                   tensor_type_name(type), e, tol);
            free(lc);
            free(lr);
            ref_close(&r);
            eng_close(&cpu);
            synth_free(&s);
        }
}

/* engine_forward_sample on the CPU backend (gpu = 0): engine_forward + sampler_sample, row by
 * row; on cuda (gpu = 1) the device samples: the same tokens (greedy and seeded top_p) as the CPU
 * engine with the CPU sampler. */
static void forward_sample_equals(int gpu)
{
    struct synth s;
    char err[ERRMSG_LEN];
    if (load_stories(&s, err)) SKIP("%s (shared models missing)", err);
    struct engine_limits lim = {
        .max_tokens = 8, .max_seqs = 2, .ctx = 32, .kv_block_size = 16, .threads = 1};
    struct eng a, b;
    CHECKF(eng_open(&a, &s.m, &lim, !gpu, err) == 0, "%s", err);
    CHECKF(eng_open(&b, &s.m, &lim, 1, err) == 0, "%s", err);
    CHECK_STR(a.e.be->name, gpu ? "cuda" : "cpu");
    int V = s.m.cfg.vocab_size, blocks[2][2] = {{0, 1}, {2, 3}};
    int tok[2] = {1, 1}, pos[2] = {0, 0}, rows[2] = {0, 1}, got[2];
    const int *tabs[2] = {blocks[0], blocks[1]};
    struct sampler_params pg = {.temperature = 0, .top_p = 1},
                          pt = {.temperature = 0.9f, .top_p = 0.9f, .seed = 3};
    struct sampler sa[2], sb[2];
    CHECK(sampler_init(&sa[0], &pg, V, err) == 0 && sampler_init(&sa[1], &pt, V, err) == 0);
    CHECK(sampler_init(&sb[0], &pg, V, err) == 0 && sampler_init(&sb[1], &pt, V, err) == 0);
    struct sampler *sp[2] = {&sa[0], &sa[1]};
    float *logits = malloc(sizeof(float) * V * 2);
    struct batch bt = {2, tok, pos, tabs, 2, rows};
    for (int step = 0; step < 6; step++) {
        CHECK(engine_forward_sample(&a.e, &bt, sp, got, logits) == 0);
        CHECK(engine_forward(&b.e, &bt, logits) == 0);
        for (int i = 0; i < 2; i++)
            CHECK_EQ_INT(got[i], sampler_sample(&sb[i], logits + (size_t)i * V));
        for (int i = 0; i < 2; i++) tok[i] = got[i], pos[i]++;
    }
    for (int i = 0; i < 2; i++) sampler_free(&sa[i]), sampler_free(&sb[i]);
    free(logits);
    eng_close(&a);
    eng_close(&b);
    synth_free(&s);
}

TEST(engine_forward_sample_cpu_path)
{
    forward_sample_equals(0);
}

/* ---- on a GPU ---- */

static char gpu_why[ERRMSG_LEN];
static int gpu_ok = -1;

#define NEED_GPU()                                                                                 \
    do {                                                                                           \
        if (gpu_ok < 0) gpu_ok = cuda_probe(gpu_why) == 0;                                         \
        if (!gpu_ok) SKIP("%s", gpu_why);                                                          \
    } while (0)

/* Block tables: sequence i owns blocks [i*mb, (i+1)*mb). */
struct seqs {
    int mb;
    int *blocks;
    const int **tab;
};

static void seqs_init(struct seqs *s, int n_seqs, int ctx, int bs)
{
    s->mb = (ctx + bs - 1) / bs;
    s->blocks = malloc(sizeof(int) * (size_t)n_seqs * s->mb);
    s->tab = malloc(sizeof(int *) * (size_t)n_seqs);
    for (int i = 0; i < n_seqs * s->mb; i++) s->blocks[i] = i;
    for (int i = 0; i < n_seqs; i++) s->tab[i] = s->blocks + (size_t)i * s->mb;
}

static void seqs_free(struct seqs *s)
{
    free(s->blocks);
    free(s->tab);
}

static void logits_match_arch(const struct arch_case *ac, uint32_t type, double tol_prefill,
                              double tol_decode)
{
    NEED_GPU();
    struct synth s;
    char err[ERRMSG_LEN];
    const struct synth_arch_opts llama2 = {0};
    CHECK(synth_build_arch(&s, &tiny, ac ? &ac->a : &llama2, type, 0, 1, 11) == 0);
    const char *name = ac ? ac->name : "llama 2";
    struct engine_limits lim = {.max_tokens = 64, .max_seqs = 1, .ctx = 64, .kv_block_size = 16};
    struct cuda_engine *ce;
    CHECKF(cuda_engine_open(&ce, &s.m, &lim, err) == 0, "%s", err);
    CHECKF(cuda_upload_all(ce, err) == 0, "%s", err);
    struct ref r;
    ref_open(&r, &s.m, 64);
    struct seqs sq;
    seqs_init(&sq, 1, 64, 16);
    int V = tiny.vocab, n = 24;
    float *got = malloc(sizeof(float) * V * n), *want = malloc(sizeof(float) * V * n);
    int tok[24], pos[24], rows[24];
    const int *tabs[24];
    uint64_t rng = 99;
    for (int i = 0; i < n; i++)
        tok[i] = (int)(synth_rng(&rng) % V), pos[i] = i, rows[i] = i, tabs[i] = sq.tab[0];
    /* prefill: 24 tokens in one step (tensor cores except for F32) */
    struct batch b = {n, tok, pos, tabs, n, rows};
    CHECKF(cuda_forward(ce, &b, got, err) == 0, "%s", err);
    for (int i = 0; i < n; i++) ref_forward(&r, tok[i], i, want + (size_t)i * V);
    double e = rel_err(got, want, (size_t)n * V);
    CHECKF(e <= tol_prefill, "%s, %s prefill: relative error %.3g > %.3g", name,
           synth_type_name(type), e, tol_prefill);
    /* decode: one token per step (GEMV), attending over the prefilled cache */
    for (int step = 0; step < 4; step++) {
        int t = argmax(want, V), p = n + step, row0 = 0;
        struct batch d = {1, &t, &p, tabs, 1, &row0};
        CHECKF(cuda_forward(ce, &d, got, err) == 0, "%s", err);
        ref_forward(&r, t, p, want);
        e = rel_err(got, want, (size_t)V);
        CHECKF(e <= tol_decode, "%s, %s decode step %d: relative error %.3g > %.3g", name,
               synth_type_name(type), step, e, tol_decode);
    }
    free(got);
    free(want);
    seqs_free(&sq);
    ref_close(&r);
    cuda_engine_close(ce);
    synth_free(&s);
}

static void logits_match(uint32_t type, double tol_prefill, double tol_decode)
{
    logits_match_arch(NULL, type, tol_prefill, tol_decode);
}

/* The same through engine.h: engine_init picks cuda on its own (and uploads through the arena
 * it registers); its logits against engine_init on the CPU (STRATA_BACKEND=cpu), whose
 * quantized matmuls use Q8 activations, hence the wider tolerance for block types. */
static void engine_logits_match_arch(const struct arch_case *ac, uint32_t type, double tol)
{
    NEED_GPU();
    struct synth s;
    char err[ERRMSG_LEN];
    const struct synth_arch_opts llama2 = {0};
    CHECK(synth_build_arch(&s, &tiny, ac ? &ac->a : &llama2, type, 0, 1, 13) == 0);
    const char *name = ac ? ac->name : "llama 2";
    struct engine_limits lim = {
        .max_tokens = 32, .max_seqs = 1, .ctx = 64, .kv_block_size = 16, .threads = 1};
    struct eng cpu, gpu;
    /* The GPU engine first: it uploads the ggml bytes at init; the CPU engine then repacks the
     * shared image for its kernels (repack.h), which a later upload would refuse. */
    CHECKF(eng_open(&gpu, &s.m, &lim, 0, err) == 0, "gpu engine: %s", err);
    CHECKF(eng_open(&cpu, &s.m, &lim, 1, err) == 0, "cpu engine: %s", err);
    CHECK_STR(cpu.e.be->name, "cpu");
    CHECK_STR(gpu.e.be->name, "cuda");
    int V = tiny.vocab, n = 24, blocks[4] = {0, 1, 2, 3};
    float *lc = malloc(sizeof(float) * V * n), *lg = malloc(sizeof(float) * V * n);
    int tok[24], pos[24], rows[24];
    const int *tabs[24];
    uint64_t rng = 5;
    for (int i = 0; i < n; i++)
        tok[i] = (int)(synth_rng(&rng) % V), pos[i] = i, rows[i] = i, tabs[i] = blocks;
    struct batch b = {n, tok, pos, tabs, n, rows};
    CHECK(engine_forward(&cpu.e, &b, lc) == 0);
    CHECK(engine_forward(&gpu.e, &b, lg) == 0);
    double ep = rel_err(lg, lc, (size_t)n * V), ed = 0;
    for (int step = 0; step < 4; step++) {
        int t = argmax(lc, V), p = n + step, r0 = 0;
        struct batch d = {1, &t, &p, tabs, 1, &r0};
        CHECK(engine_forward(&cpu.e, &d, lc) == 0);
        CHECK(engine_forward(&gpu.e, &d, lg) == 0);
        double e = rel_err(lg, lc, (size_t)V);
        if (e > ed) ed = e;
    }
    printf("# %s, %s vs the CPU engine: prefill %.2g, decode %.2g (tolerance %.2g)\n", name,
           synth_type_name(type), ep, ed, tol);
    CHECKF(ep <= tol && ed <= tol, "%s, %s: prefill error %.3g, decode %.3g > %.3g", name,
           synth_type_name(type), ep, ed, tol);
    free(lc);
    free(lg);
    eng_close(&gpu);
    eng_close(&cpu);
    synth_free(&s);
}

static void engine_logits_match(uint32_t type, double tol)
{
    engine_logits_match_arch(NULL, type, tol);
}

/* Each architecture on the device: against the reference (F32 through GEMV and, for the 24-token
 * prefill of Q8_0, the tensor cores) and through engine.h against the CPU engine. */
TEST(logits_match_architectures)
{
    for (int i = 0; i < N_ARCH_CASES; i++) {
        logits_match_arch(&arch_cases[i], GGML_F32, 1e-4, 1e-4);
        /* decode attends over the keys and values the tensor-core prefill wrote */
        logits_match_arch(&arch_cases[i], GGML_Q8_0, 3e-2, 5e-2);
    }
}

TEST(engine_cuda_matches_cpu_architectures)
{
    for (int i = 0; i < N_ARCH_CASES; i++) {
        engine_logits_match_arch(&arch_cases[i], GGML_F32, 1e-3);
        engine_logits_match_arch(&arch_cases[i], GGML_Q8_0, 5e-2);
    }
}

TEST(engine_cuda_matches_cpu_f32)
{
    engine_logits_match(GGML_F32, 1e-3);
}
TEST(engine_cuda_matches_cpu_f16)
{
    engine_logits_match(GGML_F16, 3e-2);
}
TEST(engine_cuda_matches_cpu_bf16)
{
    engine_logits_match(GGML_BF16, 6e-2);
}
TEST(engine_cuda_matches_cpu_q8_0)
{
    engine_logits_match(GGML_Q8_0, 5e-2);
}
TEST(engine_cuda_matches_cpu_q4_0)
{
    engine_logits_match(GGML_Q4_0, 5e-2);
}

TEST(engine_forward_sample_cuda_equals_cpu)
{
    NEED_GPU();
    forward_sample_equals(1);
}

TEST(logits_match_f32)
{
    logits_match(GGML_F32, 1e-4, 1e-4);
}
TEST(logits_match_f16)
{
    logits_match(GGML_F16, 3e-2, 1e-3);
}
TEST(logits_match_bf16)
{
    /* decode reads the keys and values the bf16 prefill wrote (8-bit mantissas on the tensor
     * cores: 4e-3 of relative error), so it cannot be closer than that prefill */
    logits_match(GGML_BF16, 6e-2, 1e-2);
}
TEST(logits_match_q8_0)
{
    logits_match(GGML_Q8_0, 3e-2, 5e-2);
}
TEST(logits_match_q4_0)
{
    logits_match(GGML_Q4_0, 3e-2, 5e-2);
}

/* The block types: decode through the quantized GEMV (Q8 activations, as the CPU's), so against
 * the f32 reference the error is the activations' rounding, like the CPU engine's. BLOCK_TESTS:
 * every block type; KQ_TESTS: those added after Q8_0 and Q4_0, which have their tests above. */
#define BLOCK_TESTS(X)                                                                             \
    X(q8_0, GGML_Q8_0)                                                                             \
    X(q4_0, GGML_Q4_0)                                                                             \
    KQ_TESTS(X)
#define KQ_TESTS(X)                                                                                \
    X(q4_1, GGML_Q4_1)                                                                             \
    X(q5_0, GGML_Q5_0)                                                                             \
    X(q5_1, GGML_Q5_1)                                                                             \
    X(iq4_nl, GGML_IQ4_NL)                                                                         \
    X(q2_k, GGML_Q2_K)                                                                             \
    X(q3_k, GGML_Q3_K)                                                                             \
    X(q4_k, GGML_Q4_K)                                                                             \
    X(q5_k, GGML_Q5_K)                                                                             \
    X(q6_k, GGML_Q6_K)                                                                             \
    X(iq4_xs, GGML_IQ4_XS)

/* One type's kernels on a tiny model: the embedding rows equal dequantize_row bit for bit; the
 * GEMV (1, 3 and 8 tokens) equals the exact dot with the activations quantized as the CPU does
 * (to float summation order); the tensor cores (24 tokens) the f32 dot within f16 rounding. On
 * q (dim columns), ffn_down (hidden) and the output matrix. */
static void kernels_match(uint32_t type)
{
    NEED_GPU();
    struct synth s;
    char err[ERRMSG_LEN];
    CHECK(synth_build(&s, &tiny, type, 0, 1, 21) == 0);
    struct engine_limits lim = {.max_tokens = 32, .max_seqs = 1, .ctx = 64, .kv_block_size = 16};
    struct cuda_engine *ce;
    CHECKF(cuda_engine_open(&ce, &s.m, &lim, err) == 0, "%s", err);
    CHECKF(cuda_upload_all(ce, err) == 0, "%s", err);
    struct seqs sq;
    seqs_init(&sq, 1, 64, 16);
    int V = tiny.vocab, D = tiny.dim;
    {
        int tok[4] = {0, 1, V - 1, 123}, pos[4] = {0, 1, 2, 3};
        const int *tabs[4] = {sq.tab[0], sq.tab[0], sq.tab[0], sq.tab[0]};
        struct batch b = {4, tok, pos, tabs, 0, NULL};
        float *x = malloc(sizeof(float) * 4 * D), *want = malloc(sizeof(float) * D);
        CHECKF(cuda_embed(ce, &b, x, err) == 0, "%s", err);
        uint64_t rb = ggml_row_bytes(type, (uint64_t)D);
        for (int i = 0; i < 4; i++) {
            dequantize_row(type, (const uint8_t *)s.m.token_embd.data + tok[i] * rb, want, D);
            CHECKF(!memcmp(x + (size_t)i * D, want, sizeof(float) * D),
                   "%s: embedding row %d differs from dequantize_row", ggml_type_name(type),
                   tok[i]);
        }
        free(x);
        free(want);
    }
    struct cuda_plan p;
    CHECKF(cuda_plan_weights(&p, &s.m, err) == 0, "%s", err);
    const int mats[3] = {cuda_plan_layer_mat(&p, 0, CM_Q), cuda_plan_layer_mat(&p, 1, CM_DOWN),
                         p.out};
    const int ns[4] = {1, 3, 8, 24};
    for (int mi = 0; mi < 3; mi++) {
        const struct tensor *t = p.mats[mats[mi]].t;
        int rows = t->rows, cols = t->cols;
        uint64_t rb = ggml_row_bytes(type, (uint64_t)cols);
        float *w = malloc(sizeof(float) * cols);
        for (int ni = 0; ni < 4; ni++) {
            int n = ns[ni];
            float *x = malloc(sizeof(float) * n * cols), *y = malloc(sizeof(float) * n * rows);
            uint64_t rng = 1000 + 10 * mi + ni;
            for (int i = 0; i < n * cols; i++) x[i] = synth_uniform(&rng);
            CHECKF(cuda_matmul_mat(ce, mats[mi], x, n, y, err) == 0, "%s", err);
            double worst = 0;
            for (int tk = 0; tk < n; tk++) {
                struct host_act a;
                act_quantize(type, x + (size_t)tk * cols, cols, &a);
                for (int r = 0; r < rows; r++) {
                    const uint8_t *row = (const uint8_t *)t->data + r * rb;
                    dequantize_row(type, row, w, cols);
                    double mag = 0, want = 0;
                    if (n < CUDA_GEMM_MIN_TOKENS) {
                        want = ref_row_dot(type, w, row, cols, &a, &mag);
                    } else {
                        for (int c = 0; c < cols; c++) {
                            want += (double)w[c] * x[(size_t)tk * cols + c];
                            mag += fabs((double)w[c] * x[(size_t)tk * cols + c]);
                        }
                    }
                    double e = fabs(y[(size_t)tk * rows + r] - want) / (mag > 0 ? mag : 1);
                    if (e > worst) worst = e;
                }
                act_free(&a);
            }
            double tol = n < CUDA_GEMM_MIN_TOKENS ? 1e-5 : 1e-3;
            CHECKF(worst <= tol, "%s %s, %d tokens: error %.3g of sum |w x| > %.3g",
                   ggml_type_name(type), p.mats[mats[mi]].name, n, worst, tol);
            free(x);
            free(y);
        }
        free(w);
    }
    cuda_plan_free(&p);
    seqs_free(&sq);
    cuda_engine_close(ce);
    synth_free(&s);
}

/* Decoding one token at a time from position 0 (no tensor cores), the GPU engine and the CPU
 * engine quantize activations the same way and add the same integers for the same inputs
 * (kernels_<type>, cpu_matmul_matches_block_dot: 1e-5). The inputs are not bit-identical, since
 * RMSNorm and attention sum in another order, and now and then that flips one activation's
 * rounding; one flipped integer moves this random-weight model's logits by about 1e-2. The CPU's
 * own kernels do the same to each other (AVX2 against scalar, this test's model: q4_0 0.0059,
 * q4_1 0.012, q5_0 0.0039, q5_1 0.0014), so the bound is that noise, not "the same floats":
 * measured on an H200 GPU against the CPU <= 0.021, most types ~4e-7 (no flip). */
static void decode_matches_cpu(uint32_t type, double tol)
{
    NEED_GPU();
    struct synth s;
    char err[ERRMSG_LEN];
    CHECK(synth_build(&s, &tiny, type, 0, 1, 31) == 0);
    struct engine_limits lim = {
        .max_tokens = 8, .max_seqs = 1, .ctx = 64, .kv_block_size = 16, .threads = 1};
    struct eng cpu, gpu;
    CHECKF(eng_open(&gpu, &s.m, &lim, 0, err) == 0, "gpu engine: %s", err);
    CHECKF(eng_open(&cpu, &s.m, &lim, 1, err) == 0, "cpu engine: %s", err);
    CHECK_STR(gpu.e.be->name, "cuda");
    int V = tiny.vocab, blocks[4] = {0, 1, 2, 3}, t = 1;
    const int *tabs[1] = {blocks};
    float *lc = malloc(sizeof(float) * V), *lg = malloc(sizeof(float) * V);
    double worst = 0;
    for (int p = 0; p < 12; p++) {
        int r0 = 0;
        struct batch d = {1, &t, &p, tabs, 1, &r0};
        CHECK(engine_forward(&cpu.e, &d, lc) == 0);
        CHECK(engine_forward(&gpu.e, &d, lg) == 0);
        double e = rel_err(lg, lc, (size_t)V);
        if (e > worst) worst = e;
        t = argmax(lc, V);
    }
    printf("# %s decode vs the CPU engine: %.2g (tolerance %.2g)\n", synth_type_name(type), worst,
           tol);
    CHECKF(worst <= tol, "%s: decode logits differ from the CPU engine's by %.3g > %.3g",
           synth_type_name(type), worst, tol);
    free(lc);
    free(lg);
    eng_close(&gpu);
    eng_close(&cpu);
    synth_free(&s);
}

#define BLOCK_TEST_FNS(name, T)                                                                    \
    TEST(kernels_##name)                                                                           \
    {                                                                                              \
        kernels_match(T);                                                                          \
    }                                                                                              \
    TEST(decode_matches_cpu_##name)                                                                \
    {                                                                                              \
        decode_matches_cpu(T, 3e-2);                                                               \
    }
BLOCK_TESTS(BLOCK_TEST_FNS)
#define KQ_TEST_FNS(name, T)                                                                       \
    TEST(logits_match_##name)                                                                      \
    {                                                                                              \
        logits_match(T, 3e-2, 5e-2);                                                               \
    }                                                                                              \
    TEST(engine_cuda_matches_cpu_##name)                                                           \
    {                                                                                              \
        engine_logits_match(T, 5e-2);                                                              \
    }
KQ_TESTS(KQ_TEST_FNS)

/* Llama.cpp's Q4_K_M and Q5_K_M mixtures (cuda_synth.h): layer 1's v and ffn_down and the output
 * are Q6_K, so q, k and v of one launch have two types. */
KQ_TEST_FNS(q4_k_m, SYNTH_Q4_K_M)
KQ_TEST_FNS(q5_k_m, SYNTH_Q5_K_M)
TEST(decode_matches_cpu_q4_k_m)
{
    decode_matches_cpu(SYNTH_Q4_K_M, 3e-2);
}
TEST(synth_q4_k_m_mixes_like_llama_quantize)
{
    /* 32 layers: Q6_K v/down in 0-3, 28-31 and every third from 6 (llama.cpp's use_more_bits) */
    int want[32] = {0};
    for (int l = 0; l < 32; l++) want[l] = l < 4 || l >= 28 || (l - 4) % 3 == 2;
    for (int l = 0; l < 32; l++) {
        CHECK_EQ_INT(synth_matrix_type(SYNTH_Q4_K_M, 3, l, 32), want[l] ? GGML_Q6_K : GGML_Q4_K);
        CHECK_EQ_INT(synth_matrix_type(SYNTH_Q4_K_M, 6, l, 32), want[l] ? GGML_Q6_K : GGML_Q4_K);
        CHECK_EQ_INT(synth_matrix_type(SYNTH_Q5_K_M, 1, l, 32), GGML_Q5_K);
    }
    CHECK_EQ_INT(synth_matrix_type(SYNTH_Q4_K_M, 8, 0, 32), GGML_Q6_K);
    CHECK_EQ_INT(synth_matrix_type(SYNTH_Q4_K_M, 0, 0, 32), GGML_Q4_K);
    CHECK_EQ_INT(synth_matrix_type(GGML_Q8_0, 8, 0, 32), GGML_Q8_0);
    /* the tiny test model: layer 0 all Q4_K, layer 1's v and down Q6_K; the plan takes it */
    struct synth s;
    struct cuda_plan p;
    char err[ERRMSG_LEN];
    CHECK(synth_build(&s, &tiny, SYNTH_Q4_K_M, 0, 1, 3) == 0);
    CHECK_EQ_INT(s.m.layers[0].wv.type, GGML_Q4_K);
    CHECK_EQ_INT(s.m.layers[1].wv.type, GGML_Q6_K);
    CHECK_EQ_INT(s.m.layers[1].w_down.type, GGML_Q6_K);
    CHECK_EQ_INT(s.m.layers[1].wq.type, GGML_Q4_K);
    CHECK_EQ_INT(s.m.output.type, GGML_Q6_K);
    CHECKF(cuda_plan_weights(&p, &s.m, err) == 0, "%s", err);
    cuda_plan_free(&p);
    synth_free(&s);
}

TEST(weights_must_land_before_use)
{
    NEED_GPU();
    struct synth s;
    char err[ERRMSG_LEN];
    CHECKF(load_stories(&s, err) == 0, "%s", err);
    struct engine_limits lim = {.max_tokens = 8, .max_seqs = 1, .ctx = 64};
    struct cuda_engine *ce;
    CHECKF(cuda_engine_open(&ce, &s.m, &lim, err) == 0, "%s", err);
    struct seqs sq;
    seqs_init(&sq, 1, 64, 16);
    int t = 1, p = 0, row = 0;
    float *logits = malloc(sizeof(float) * s.m.cfg.vocab_size);
    struct batch b = {1, &t, &p, sq.tab, 1, &row};
    CHECK(cuda_forward(ce, &b, logits, err) == -1);
    CHECKF(strstr(err, "has not been uploaded") != NULL, "%s", err);
    /* spans land one at a time; each layer can run once its own span is in */
    for (int sp = 0; sp < s.m.n_spans; sp++) {
        CHECK(!cuda_span_ready(ce, sp));
        CHECKF(cuda_upload_span(ce, sp, err) == 0, "%s", err);
    }
    CHECKF(cuda_upload_wait(ce, err) == 0, "%s", err);
    for (int sp = 0; sp < s.m.n_spans; sp++) CHECK(cuda_span_ready(ce, sp));
    CHECKF(cuda_forward(ce, &b, logits, err) == 0, "%s", err);
    /* layer-range execution with host hidden states = the fused forward */
    float *x = malloc(sizeof(float) * s.m.cfg.dim),
          *l2 = malloc(sizeof(float) * s.m.cfg.vocab_size);
    CHECKF(cuda_embed(ce, &b, x, err) == 0, "%s", err);
    CHECKF(cuda_layers(ce, &b, 0, 2, x, err) == 0, "%s", err);
    CHECKF(cuda_layers(ce, &b, 2, s.m.cfg.n_layers, x, err) == 0, "%s", err);
    CHECKF(cuda_head(ce, &b, x, l2, err) == 0, "%s", err);
    CHECKF(rel_err(l2, logits, (size_t)s.m.cfg.vocab_size) < 1e-5, "split != fused");
    free(x);
    free(l2);
    free(logits);
    seqs_free(&sq);
    cuda_engine_close(ce);
    synth_free(&s);
}

/* Greedy generation of n tokens after BOS on the GPU (sampling on the device) and in the
 * reference: the same tokens, exactly. */
static void stories_greedy(int graphs)
{
    NEED_GPU();
    struct synth s;
    char err[ERRMSG_LEN];
    CHECKF(load_stories(&s, err) == 0, "%s", err);
    int V = s.m.cfg.vocab_size, n = 80;
    struct engine_limits lim = {.max_tokens = 16, .max_seqs = 1, .ctx = 128};
    struct cuda_engine *ce;
    CHECKF(cuda_engine_open(&ce, &s.m, &lim, err) == 0, "%s", err);
    cuda_set_graphs(ce, graphs);
    CHECKF(cuda_upload_all(ce, err) == 0, "%s", err);
    struct ref r;
    ref_open(&r, &s.m, 128);
    struct seqs sq;
    seqs_init(&sq, 1, 128, 16);
    float *logits = malloc(sizeof(float) * V);
    int ref_tok = 1, gpu_tok = 1;
    struct sampler smp = {.p = {.temperature = 0, .top_p = 1}, .vocab_size = V, .rng = 1};
    struct sampler *sp = &smp;
    for (int p = 0; p < n; p++) {
        ref_forward(&r, ref_tok, p, logits);
        int row = 0, next_gpu;
        struct batch b = {1, &gpu_tok, &p, sq.tab, 1, &row};
        CHECKF(cuda_forward_sample(ce, &b, &sp, &next_gpu, err) == 0, "%s", err);
        ref_tok = argmax(logits, V);
        CHECKF(next_gpu == ref_tok, "position %d: gpu token %d, reference %d", p, next_gpu,
               ref_tok);
        gpu_tok = next_gpu;
    }
    free(logits);
    seqs_free(&sq);
    ref_close(&r);
    cuda_engine_close(ce);
    synth_free(&s);
}

/* CUDA graphs replay the captured launches: the same tokens with and without them. */
TEST(stories260k_greedy_equals_reference)
{
    stories_greedy(1);
}
TEST(stories260k_greedy_without_graphs)
{
    stories_greedy(0);
}

/* The same through the GGUF loader's image (F32 and F16 conversions): greedy tokens equal the
 * reference on the same weights. */
static void gguf_greedy(uint32_t type)
{
    NEED_GPU();
    struct gguf_model gm;
    char err[ERRMSG_LEN];
    CHECKF(load_gguf_stories(&gm, type, err) == 0, "%s", err);
    const struct model *m = &gm.s.m;
    int V = m->cfg.vocab_size, n = 60;
    struct engine_limits lim = {.max_tokens = 16, .max_seqs = 1, .ctx = 64};
    struct cuda_engine *ce;
    CHECKF(cuda_engine_open(&ce, m, &lim, err) == 0, "%s", err);
    CHECKF(cuda_engine_register_host(ce, gm.s.image, (gm.s.image_size + 4095) / 4096 * 4096, err) ==
               0,
           "%s", err);
    CHECKF(cuda_upload_all(ce, err) == 0, "%s", err);
    struct ref r;
    ref_open(&r, m, 64);
    struct seqs sq;
    seqs_init(&sq, 1, 64, 16);
    float *logits = malloc(sizeof(float) * V);
    int tok = 1;
    struct sampler smp = {.p = {.temperature = 0, .top_p = 1}, .vocab_size = V};
    struct sampler *sp = &smp;
    for (int p = 0; p < n; p++) {
        ref_forward(&r, tok, p, logits);
        int row = 0, next;
        struct batch b = {1, &tok, &p, sq.tab, 1, &row};
        CHECKF(cuda_forward_sample(ce, &b, &sp, &next, err) == 0, "%s", err);
        CHECKF(next == argmax(logits, V), "position %d: gpu %d, reference %d", p, next,
               argmax(logits, V));
        tok = next;
    }
    free(logits);
    seqs_free(&sq);
    ref_close(&r);
    cuda_engine_close(ce);
    free_gguf_stories(&gm);
}

TEST(gguf_stories260k_f32_greedy)
{
    gguf_greedy(GGML_F32);
}
TEST(gguf_stories260k_f16_greedy)
{
    gguf_greedy(GGML_F16);
}

/* 16 sequences with prompts of different lengths, decoded greedily together (one step = one
 * token of each) and each alone: the same tokens. */
TEST(batched_decode_equals_one_at_a_time)
{
    NEED_GPU();
    enum { NS = 16, STEPS = 24 };
    struct synth s;
    char err[ERRMSG_LEN];
    CHECKF(load_stories(&s, err) == 0, "%s", err);
    struct engine_limits lim = {.max_tokens = 64, .max_seqs = NS, .ctx = 64};
    struct cuda_engine *ce;
    CHECKF(cuda_engine_open(&ce, &s.m, &lim, err) == 0, "%s", err);
    CHECKF(cuda_upload_all(ce, err) == 0, "%s", err);
    struct seqs sq;
    seqs_init(&sq, NS, 64, 16);
    int alone[NS][STEPS], together[NS][STEPS], cur[NS], pos[NS], plen[NS];
    struct sampler smp[NS];
    struct sampler *sps[NS];
    for (int i = 0; i < NS; i++) {
        smp[i] = (struct sampler){.p = {.temperature = 0, .top_p = 1}, .vocab_size = 512};
        sps[i] = &smp[i];
    }
    /* each alone: prompt [1, 100+i, ...] of i%5+1 tokens as one prefill step, then decode */
    for (int i = 0; i < NS; i++) {
        int prompt[8], pp[8], rows = 0;
        const int *tabs[8];
        plen[i] = i % 5 + 1;
        for (int j = 0; j < plen[i]; j++)
            prompt[j] = j == 0 ? 1 : 100 + i + j, pp[j] = j, tabs[j] = sq.tab[i];
        rows = plen[i] - 1;
        struct batch b = {plen[i], prompt, pp, tabs, 1, &rows};
        int t;
        CHECKF(cuda_forward_sample(ce, &b, sps, &t, err) == 0, "%s", err);
        for (int step = 0; step < STEPS; step++) {
            alone[i][step] = t;
            int p = plen[i] + step, row = 0;
            struct batch d = {1, &t, &p, &sq.tab[i], 1, &row};
            CHECKF(cuda_forward_sample(ce, &d, sps, &t, err) == 0, "%s", err);
        }
    }
    /* together: all prompts in one prefill step, then one decode step for all 16 */
    {
        int tok[64], pp[64], rows[NS], n = 0;
        const int *tabs[64];
        for (int i = 0; i < NS; i++) {
            for (int j = 0; j < plen[i]; j++, n++)
                tok[n] = j == 0 ? 1 : 100 + i + j, pp[n] = j, tabs[n] = sq.tab[i];
            rows[i] = n - 1;
        }
        struct batch b = {n, tok, pp, tabs, NS, rows};
        CHECKF(cuda_forward_sample(ce, &b, sps, cur, err) == 0, "%s", err);
    }
    for (int step = 0; step < STEPS; step++) {
        int rows[NS];
        for (int i = 0; i < NS; i++)
            together[i][step] = cur[i], pos[i] = plen[i] + step, rows[i] = i;
        struct batch d = {NS, cur, pos, sq.tab, NS, rows};
        CHECKF(cuda_forward_sample(ce, &d, sps, cur, err) == 0, "%s", err);
    }
    for (int i = 0; i < NS; i++)
        for (int step = 0; step < STEPS; step++)
            CHECKF(alone[i][step] == together[i][step], "sequence %d step %d: alone %d, batched %d",
                   i, step, alone[i][step], together[i][step]);
    seqs_free(&sq);
    cuda_engine_close(ce);
    synth_free(&s);
}

/* The device sampler against serving/engine/sampler.c on the same logits, same seed: the same
 * tokens and generator states, draw after draw, for each filter combination; top_k = 1 at any
 * temperature is the argmax. */
TEST(device_sampler_matches_cpu_sampler)
{
    NEED_GPU();
    struct synth s;
    char err[ERRMSG_LEN];
    CHECKF(load_stories(&s, err) == 0, "%s", err);
    struct engine_limits lim = {.max_tokens = 4, .max_seqs = 1, .ctx = 16};
    struct cuda_engine *ce;
    CHECKF(cuda_engine_open(&ce, &s.m, &lim, err) == 0, "%s", err);
    CHECKF(cuda_upload_all(ce, err) == 0, "%s", err);
    struct seqs sq;
    seqs_init(&sq, 1, 16, 16);
    int V = s.m.cfg.vocab_size, t = 1, p = 0, row = 0, got;
    float *logits = malloc(sizeof(float) * V), *copy = malloc(sizeof(float) * V);
    struct batch b = {1, &t, &p, sq.tab, 1, &row};
    CHECKF(cuda_forward(ce, &b, logits, err) == 0, "%s", err);
    const struct sampler_params cfgs[] = {
        {.temperature = 1.0f, .top_p = 1.0f, .seed = 42},                /* no filter */
        {.temperature = 0.8f, .top_p = 1.0f, .top_k = 40, .seed = 7},    /* top_k */
        {.temperature = 1.0f, .top_p = 0.9f, .seed = 9},                 /* top_p */
        {.temperature = 0.7f, .top_p = 1.0f, .min_p = 0.05f, .seed = 3}, /* min_p */
        {.temperature = 0.9f, .top_p = 0.8f, .top_k = 20, .min_p = 0.02f, .seed = 11},
        {.temperature = 1.3f, .top_p = 1.0f, .top_k = 1, .seed = 5}, /* = argmax */
    };
    for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
        struct sampler cpu, gpu;
        CHECK(sampler_init(&cpu, &cfgs[c], V, err) == 0 &&
              sampler_init(&gpu, &cfgs[c], V, err) == 0);
        struct sampler *gp = &gpu;
        for (int draw = 0; draw < 30; draw++) {
            memcpy(copy, logits, sizeof(float) * V);
            int want = sampler_sample(&cpu, copy);
            CHECKF(cuda_forward_sample(ce, &b, &gp, &got, err) == 0, "%s", err);
            CHECKF(got == want && gpu.rng == cpu.rng,
                   "config %zu draw %d: gpu token %d rng %llx, cpu token %d rng %llx", c, draw, got,
                   (unsigned long long)gpu.rng, want, (unsigned long long)cpu.rng);
            if (cfgs[c].top_k == 1) CHECK_EQ_INT(got, argmax(logits, V));
        }
        sampler_free(&cpu);
        sampler_free(&gpu);
    }
    free(logits);
    free(copy);
    seqs_free(&sq);
    cuda_engine_close(ce);
    synth_free(&s);
}

int main(void)
{
    log_set_quiet(1);
    RUN(fatbin_embedded);
    RUN(backend_falls_back_without_libcuda);
    RUN(backend_stub_driver_resolves_and_fails_init);
    RUN(backend_forced_cpu);
    RUN(plan_layout_and_upload_schedule);
    RUN(plan_lays_out_each_architecture);
    RUN(plan_pads_ragged_rows);
    RUN(plan_rejects_what_the_kernels_lack);
    RUN(launch_shapes);
    RUN(block_formats_match_the_kernels);
    RUN(block_dequant_bit_exact);
    RUN(block_dot_matches_reference);
    RUN(q4k_unit_dot_matches_reference);
    RUN(cpu_matmul_matches_block_dot);
    RUN(synth_q4_k_m_mixes_like_llama_quantize);
    RUN(plan_accepts_the_loaders_image);
    RUN(reference_forward_tells_the_story);
    RUN(reference_matches_cpu_engine);
    RUN(reference_matches_cpu_engine_architectures);
    RUN(engine_forward_sample_cpu_path);
    RUN(logits_match_f32);
    RUN(logits_match_f16);
    RUN(logits_match_bf16);
    RUN(logits_match_q8_0);
    RUN(logits_match_q4_0);
    RUN(engine_cuda_matches_cpu_f32);
    RUN(engine_cuda_matches_cpu_f16);
    RUN(engine_cuda_matches_cpu_bf16);
    RUN(engine_cuda_matches_cpu_q8_0);
    RUN(engine_cuda_matches_cpu_q4_0);
    RUN(engine_forward_sample_cuda_equals_cpu);
#define BLOCK_RUN(name, T)                                                                         \
    RUN(kernels_##name);                                                                           \
    RUN(decode_matches_cpu_##name);
    BLOCK_TESTS(BLOCK_RUN)
#define KQ_RUN(name, T)                                                                            \
    RUN(logits_match_##name);                                                                      \
    RUN(engine_cuda_matches_cpu_##name);
    KQ_TESTS(KQ_RUN)
    KQ_RUN(q4_k_m, SYNTH_Q4_K_M)
    KQ_RUN(q5_k_m, SYNTH_Q5_K_M)
    RUN(decode_matches_cpu_q4_k_m);
    RUN(logits_match_architectures);
    RUN(engine_cuda_matches_cpu_architectures);
    RUN(weights_must_land_before_use);
    RUN(stories260k_greedy_equals_reference);
    RUN(stories260k_greedy_without_graphs);
    RUN(gguf_stories260k_f32_greedy);
    RUN(gguf_stories260k_f16_greedy);
    RUN(batched_decode_equals_one_at_a_time);
    RUN(device_sampler_matches_cpu_sampler);
    CHECK_DONE();
}
