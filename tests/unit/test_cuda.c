/* test_cuda: the CUDA backend.
 *
 * Everywhere (no GPU needed): the fatbin is embedded and holds every kernel the host looks up;
 * backend selection falls back to the CPU with the reason (no libcuda.so.1, the toolkit's stub
 * driver whose cuInit fails, STRATA_BACKEND=cpu); the weight plan (device layout, span upload
 * schedule) and the launch shapes.
 * On a GPU (else "skip - ...: no CUDA device (libcuda.so.1 not found)"): logits against a plain
 * C reference forward (llama2.c's, dequantizing the same weight bytes) per weight type, within
 *   F32 1e-4 (GEMV, f32 throughout);
 *   F16/BF16/Q8_0/Q4_0 decode (GEMV, f32 activations) 1e-3;
 *   prefill on the tensor cores (activations rounded to f16; bf16 for BF16) 3e-2 (BF16 6e-2),
 * all as max |gpu - ref| / max(1, max |ref|) over every logit; through engine.h against the
 * CPU engine (Q8 activations on the CPU side): F32 1e-3, F16 3e-2, BF16 6e-2, Q8_0/Q4_0 5e-2;
 * greedy tokens of stories260K equal the reference's exactly; 16 sequences decoded in one batch =
 * each alone; weights must be uploaded before use; the device sampler's greedy and top_k=1 paths.
 */
#include "drivers/cuda/cu_api.h"
#include "serving/engine/cuda/cuda_backend.h"
#include "drivers/cuda/cuda_fatbin.h"
#include "serving/engine/cuda/cuda_plan.h"
#include "serving/engine/convert.h"
#include "serving/engine/repack.h"
#include "os/common/errmsg.h"
#include "os/runtime/log.h"
#include "tests/unit/check.h"
#include "tests/unit/cuda_synth.h"

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
    const char *names[64];
    int n = cuda_kernel_names(names, 64);
    CHECK(n > 20 && n <= 64);
    for (int i = 0; i < n; i++) {
        size_t len = strlen(names[i]) + 1; /* with the NUL: k_gemv_f16_1 is not k_gemv_f16_16 */
        CHECKF(memmem(fb, size, names[i], len) != NULL, "kernel %s not in the fatbin", names[i]);
    }
}

static const struct engine_backend fake_cpu = {.name = "cpu"};

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
    CHECK(engine_pick_backend(&fake_cpu) == &fake_cpu);
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
    CHECK(engine_pick_backend(&fake_cpu) == &fake_cpu);
    unsetenv("STRATA_LIBCUDA");
    cu_api_unload();
}

TEST(backend_forced_cpu)
{
    setenv("STRATA_BACKEND", "cpu", 1);
    CHECK(engine_pick_backend(&fake_cpu) == &fake_cpu);
    unsetenv("STRATA_BACKEND");
}

static const struct synth_shape tiny = {256, 768, 2, 8, 4, 512, 128};

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
    uint32_t types[] = {GGML_F32, GGML_F16, GGML_BF16, GGML_Q8_0, GGML_Q4_0};
    for (int ti = 0; ti < 5; ti++) {
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
                    if (mt->type == GGML_Q8_0 || mt->type == GGML_Q4_0) {
                        CHECK_EQ_INT(mt->qs_bytes, (uint64_t)mt->rows * mt->cols /
                                                       (mt->type == GGML_Q8_0 ? 1 : 2));
                        CHECK_EQ_INT(mt->d_bytes, (uint64_t)mt->rows * mt->cols / 32 * 2);
                        CHECK_EQ_INT(mt->d_off % CUDA_DEV_ALIGN, 0);
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
    s.m.layers[1].wk.type = GGML_Q4_K;
    CHECK(cuda_plan_weights(&p, &s.m, err) == -1);
    CHECK_STR(err, "cuda: tensor blk.1.attn_k: type q4_k is not supported by the CUDA kernels");
    s.m.layers[1].wk.type = TENSOR_Q8_0_X16; /* what a CPU engine leaves in a shared model */
    CHECK(cuda_plan_weights(&p, &s.m, err) == -1);
    CHECK_STR(err, "cuda: tensor blk.1.attn_k: type q8_0x16 is not supported by the CUDA kernels");
    s.m.layers[1].wk.type = GGML_Q8_0;
    s.m.layers[0].ffn_norm.type = GGML_F16;
    CHECK(cuda_plan_weights(&p, &s.m, err) == -1);
    CHECK_STR(err, "cuda: tensor blk.0.ffn_norm: norm weights must be f32, not f16");
    s.m.layers[0].ffn_norm.type = GGML_F32;
    s.m.layers[0].wq.cols = 48;
    CHECK(cuda_plan_weights(&p, &s.m, err) == -1);
    CHECK_STR(err, "cuda: tensor blk.0.attn_q: 48 columns is not a multiple of 32");
    s.m.layers[0].wq.cols = 256;
    s.m.layers[0].wq.nbytes -= 34;
    CHECK(cuda_plan_weights(&p, &s.m, err) == -1);
    CHECKF(strstr(err, "blk.0.attn_q: 69598 bytes, expected 69632") != NULL, "%s", err);
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
    CHECK_EQ_INT(cuda_gemv_blocks(GGML_Q4_0, 4096), 256); /* half a warp per row */
    CHECK_EQ_INT(cuda_gemv_blocks(GGML_Q4_0, 4097), 257);
    CHECK_EQ_INT(cuda_gemv_blocks(GGML_Q4_0, 64 + 64 + 1), 9); /* q, k, v of a tiny model */
    int want[9] = {0, 1, 2, 4, 4, 8, 8, 8, 8};
    for (int n = 1; n <= 8; n++) CHECK_EQ_INT(cuda_gemv_nt(n), want[n]);
    CHECK(!cuda_use_gemm(GGML_F16, 1) && !cuda_use_gemm(GGML_Q4_0, 15));
    CHECK(cuda_use_gemm(GGML_F16, 16) && cuda_use_gemm(GGML_Q8_0, 512));
    CHECK(!cuda_use_gemm(GGML_F32, 512)); /* F32 models keep exact f32 products */
    CHECK_EQ_INT(cuda_gemm_blocks(11008), 172);
    CHECK_EQ_INT(cuda_gemm_blocks(65), 2);
    CHECK_EQ_INT(cuda_attention_smem(4096, 128), (4096 + 128) * 4);
    CHECK_EQ_INT(cuda_elementwise_blocks(1, 256), 1);
    CHECK_EQ_INT(cuda_elementwise_blocks(1000, 256), 4);
    CHECK_EQ_INT(cuda_elementwise_blocks(1LL << 40, 256), 4096);
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
           tensor_type_name(type), e, tol_prefill);
    /* decode: one token per step (GEMV), attending over the prefilled cache */
    for (int step = 0; step < 4; step++) {
        int t = argmax(want, V), p = n + step, row0 = 0;
        struct batch d = {1, &t, &p, tabs, 1, &row0};
        CHECKF(cuda_forward(ce, &d, got, err) == 0, "%s", err);
        ref_forward(&r, t, p, want);
        e = rel_err(got, want, (size_t)V);
        CHECKF(e <= tol_decode, "%s, %s decode step %d: relative error %.3g > %.3g", name,
               tensor_type_name(type), step, e, tol_decode);
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
           tensor_type_name(type), ep, ed, tol);
    CHECKF(ep <= tol && ed <= tol, "%s, %s: prefill error %.3g, decode %.3g > %.3g", name,
           tensor_type_name(type), ep, ed, tol);
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
        logits_match_arch(&arch_cases[i], GGML_Q8_0, 3e-2, 1e-3);
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
    logits_match(GGML_BF16, 6e-2, 1e-3);
}
TEST(logits_match_q8_0)
{
    logits_match(GGML_Q8_0, 3e-2, 1e-3);
}
TEST(logits_match_q4_0)
{
    logits_match(GGML_Q4_0, 3e-2, 1e-3);
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
