/* The forward pass against a plain reference: a straightforward f32 Llama (llama2.c's
 * equations, contiguous KV, one token at a time, double-precision dot products) on the
 * dequantized weights of the same model, with each architecture's parts as llama.cpp defines them
 * (q/k/v biases, per-head q/k RMSNorm, NeoX or interleaved RoPE, rope_freqs, head dimensions
 * apart from dim / heads). Synthetic GQA models of every weight type and architecture; batched
 * prefill, batched decode of several sequences and layer-range execution must all agree with it. */
#include "check.h"
#include "synth.h"

#include "os/common/errmsg.h"
#include "os/runtime/log.h"
#include "serving/engine/loader.h"
#include "serving/engine/repack.h"
#include "serving/engine/sampler.h"

#include <math.h>

// ----------------------------------------------------------------------------
// the reference model

struct ref {
    struct model_config c;
    float *emb, *out, *onorm;
    struct {
        float *an, *wq, *wk, *wv, *wo, *fn, *wg, *wd, *wu;
        float *bq, *bk, *bv, *qn, *kn, *ff; /* NULL where the architecture has none */
    } l[8];
    float *kc, *vc; /* [layer][pos][kv_dim] */
    int kv_f16;     /* the engine's cache holds halves: store keys and values rounded so */
};

/* What an f16 cache holds of x: the compiler's _Float16 rounding, not the engine's code. */
static float half_of(float x)
{
    return (float)(_Float16)x;
}

/* The engine may have repacked a matrix (repack.h): tensor_get_row reads any layout. */
static float *deq(const struct tensor *t)
{
    float *o = malloc(sizeof(float) * (size_t)t->rows * t->cols);
    for (int r = 0; r < t->rows; r++) tensor_get_row(t, r, o + (size_t)r * t->cols);
    return o;
}

static void ref_init(struct ref *R, const struct model *m, int kv_type)
{
    R->c = m->cfg;
    R->kv_f16 = kv_type == KV_F16;
    R->emb = deq(&m->token_embd);
    R->out = deq(&m->output);
    R->onorm = deq(&m->output_norm);
    for (int i = 0; i < m->cfg.n_layers; i++) {
        const struct layer_weights *w = &m->layers[i];
        R->l[i].an = deq(&w->attn_norm), R->l[i].wq = deq(&w->wq), R->l[i].wk = deq(&w->wk);
        R->l[i].wv = deq(&w->wv), R->l[i].wo = deq(&w->wo), R->l[i].fn = deq(&w->ffn_norm);
        R->l[i].wg = deq(&w->w_gate), R->l[i].wd = deq(&w->w_down), R->l[i].wu = deq(&w->w_up);
        const struct model_config *c = &m->cfg;
        R->l[i].bq = c->qkv_bias ? deq(&w->bq) : NULL;
        R->l[i].bk = c->qkv_bias ? deq(&w->bk) : NULL;
        R->l[i].bv = c->qkv_bias ? deq(&w->bv) : NULL;
        R->l[i].qn = c->qk_norm ? deq(&w->q_norm) : NULL;
        R->l[i].kn = c->qk_norm ? deq(&w->k_norm) : NULL;
        R->l[i].ff = c->rope_freqs ? deq(&w->rope_freqs) : NULL;
    }
    size_t kv = (size_t)m->cfg.n_layers * m->cfg.seq_len * m->cfg.kv_dim;
    R->kc = calloc(kv, sizeof(float));
    R->vc = calloc(kv, sizeof(float));
}

static void ref_free(struct ref *R)
{
    free(R->emb), free(R->out), free(R->onorm), free(R->kc), free(R->vc);
    for (int i = 0; i < R->c.n_layers; i++) {
        free(R->l[i].an), free(R->l[i].wq), free(R->l[i].wk), free(R->l[i].wv);
        free(R->l[i].wo), free(R->l[i].fn), free(R->l[i].wg), free(R->l[i].wd), free(R->l[i].wu);
        free(R->l[i].bq), free(R->l[i].bk), free(R->l[i].bv), free(R->l[i].qn), free(R->l[i].kn);
        free(R->l[i].ff);
    }
}

static void ref_mv(float *y, const float *W, const float *x, int rows, int cols)
{
    for (int r = 0; r < rows; r++) {
        double s = 0;
        for (int c = 0; c < cols; c++) s += (double)W[(size_t)r * cols + c] * x[c];
        y[r] = (float)s;
    }
}

static void ref_norm(float *o, const float *x, const float *w, int n, float eps)
{
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float s = (float)(1.0 / sqrt(ss / n + eps));
    for (int i = 0; i < n; i++) o[i] = w[i] * (s * x[i]);
}

/* RoPE of one head at pos, in double: pair i is (2i, 2i+1) (llama) or (i, i + hd/2) (NeoX),
 * turned by pos * theta^(-2i/hd) / ff[i] * scale. */
static void ref_rope(float *v, int hd, int pos, const struct model_config *c, const float *ff)
{
    for (int i = 0; i < hd / 2; i++) {
        double a = pos * pow(c->rope_theta, -2.0 * i / hd) / (ff ? ff[i] : 1.0) * c->rope_scale;
        int i0 = c->rope_style == ROPE_PAIRS ? 2 * i : i,
            i1 = c->rope_style == ROPE_PAIRS ? i0 + 1 : i + hd / 2;
        double v0 = v[i0], v1 = v[i1];
        v[i0] = (float)(v0 * cos(a) - v1 * sin(a));
        v[i1] = (float)(v0 * sin(a) + v1 * cos(a));
    }
}

/* Logits for `token` at `pos`, with its own contiguous cache (one sequence). */
static void ref_forward(struct ref *R, int token, int pos, float *logits)
{
    const struct model_config *c = &R->c;
    int dim = c->dim, hd = c->head_dim, qd = c->q_dim, kvd = c->kv_dim, hid = c->hidden_dim;
    float *x = malloc(sizeof(float) * dim), *xb = malloc(sizeof(float) * dim),
          *q = malloc(sizeof(float) * qd), *att = malloc(sizeof(float) * qd),
          *t = malloc(sizeof(float) * dim), *hb = malloc(sizeof(float) * hid),
          *hb2 = malloc(sizeof(float) * hid), *sc = malloc(sizeof(float) * (pos + 1));
    memcpy(x, R->emb + (size_t)token * dim, sizeof(float) * dim);
    for (int l = 0; l < c->n_layers; l++) {
        float *kr = R->kc + ((size_t)l * c->seq_len + pos) * kvd;
        float *vr = R->vc + ((size_t)l * c->seq_len + pos) * kvd;
        ref_norm(xb, x, R->l[l].an, dim, c->norm_eps);
        ref_mv(q, R->l[l].wq, xb, qd, dim);
        ref_mv(kr, R->l[l].wk, xb, kvd, dim);
        ref_mv(vr, R->l[l].wv, xb, kvd, dim);
        for (int i = 0; i < qd && R->l[l].bq; i++) q[i] += R->l[l].bq[i];
        for (int i = 0; i < kvd && R->l[l].bk; i++) kr[i] += R->l[l].bk[i], vr[i] += R->l[l].bv[i];
        for (int h = 0; h < c->n_heads; h++) {
            if (R->l[l].qn) ref_norm(q + h * hd, q + h * hd, R->l[l].qn, hd, c->norm_eps);
            ref_rope(q + h * hd, hd, pos, c, R->l[l].ff);
        }
        for (int h = 0; h < c->n_kv_heads; h++) {
            if (R->l[l].kn) ref_norm(kr + h * hd, kr + h * hd, R->l[l].kn, hd, c->norm_eps);
            ref_rope(kr + h * hd, hd, pos, c, R->l[l].ff);
        }
        for (int i = 0; i < kvd && R->kv_f16; i++) kr[i] = half_of(kr[i]), vr[i] = half_of(vr[i]);
        for (int h = 0; h < c->n_heads; h++) {
            int kh = h / (c->n_heads / c->n_kv_heads);
            double mx = -1e30, sum = 0;
            for (int p = 0; p <= pos; p++) {
                const float *k = R->kc + ((size_t)l * c->seq_len + p) * kvd + kh * hd;
                double s = 0;
                for (int i = 0; i < hd; i++) s += (double)q[h * hd + i] * k[i];
                sc[p] = (float)(s / sqrt(hd));
                if (sc[p] > mx) mx = sc[p];
            }
            for (int p = 0; p <= pos; p++) sum += exp(sc[p] - mx);
            for (int i = 0; i < hd; i++) {
                double o = 0;
                for (int p = 0; p <= pos; p++)
                    o += exp(sc[p] - mx) / sum *
                         R->vc[((size_t)l * c->seq_len + p) * kvd + kh * hd + i];
                att[h * hd + i] = (float)o;
            }
        }
        ref_mv(t, R->l[l].wo, att, dim, qd);
        for (int i = 0; i < dim; i++) x[i] += t[i];
        ref_norm(xb, x, R->l[l].fn, dim, c->norm_eps);
        ref_mv(hb, R->l[l].wg, xb, hid, dim);
        ref_mv(hb2, R->l[l].wu, xb, hid, dim);
        for (int i = 0; i < hid; i++) hb[i] = (float)(hb[i] / (1.0 + exp(-hb[i]))) * hb2[i];
        ref_mv(t, R->l[l].wd, hb, dim, hid);
        for (int i = 0; i < dim; i++) x[i] += t[i];
    }
    ref_norm(xb, x, R->onorm, dim, c->norm_eps);
    ref_mv(logits, R->out, xb, c->vocab_size, dim);
    free(x), free(xb), free(q), free(att), free(t), free(hb), free(hb2), free(sc);
}

// ----------------------------------------------------------------------------
// helpers

static const struct synth_cfg gqa = {64, 160, 3, 8, 2, 300, 64}; /* head_dim 8, 4 q per kv */
/* rows of 256 for the super-block types (K-quants, IQ4_XS) */
static const struct synth_cfg gqa256 = {256, 512, 2, 8, 2, 300, 64};

static struct loaded_model *open_model_kv(const char *path, int max_seqs, int max_tokens,
                                          int kv_type)
{
    static char err[ERRMSG_LEN];
    struct loaded_model *lm = calloc(1, sizeof *lm);
    struct loader_opts o = {.limits = {.max_seqs = max_seqs,
                                       .max_tokens = max_tokens,
                                       .threads = 2,
                                       .kv_type = kv_type},
                            .arena_flags = ARENA_NO_HUGEPAGES | ARENA_NO_LOCK};
    if (loader_open(lm, path, &o, err)) {
        fprintf(stderr, "%s\n", err);
        free(lm);
        return NULL;
    }
    return lm;
}

static struct loaded_model *open_model(const char *path, int max_seqs, int max_tokens)
{
    return open_model_kv(path, max_seqs, max_tokens, KV_DEFAULT);
}

static void close_model(struct loaded_model *lm)
{
    if (lm) loader_close(lm);
    free(lm);
}

static double rel_err(const float *a, const float *b, int n)
{
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(b[i])) return INFINITY;
        num += (double)(a[i] - b[i]) * (a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return sqrt(num / (den + 1e-30));
}

/* Tolerance on ||engine - ref|| / ||ref|| of the logits, per weight type. The reference uses the
 * same dequantized weights, so the only differences are: f32 accumulation order (~1e-6), and for
 * quantized types the Q8 rounding of the activations before the integer dot products (ggml does
 * the same): ~0.4% per matmul for 8-bit activations, compounding over 3 layers. */
static double tolerance(uint32_t type)
{
    switch (type) {
    case GGML_F32:
        return 1e-4;
    case GGML_F16:
    case GGML_BF16:
        return 1e-3; /* f16/bf16 weights are exact after dequantization */
    default:
        return 3e-2;
    }
}

/* The architectures beside Llama 2 (model.h), each on the gqa shape with its parts; attention
 * made sharp (qk_scale) so that positions, and so RoPE, decide the outputs. */
static const struct arch_case {
    const char *name;
    struct synth_arch a;
} arch_cases[] = {
    {"llama 3.1 (rope_freqs, head_dim 16 on dim 64)",
     {.arch = ARCH_LLAMA, .head_dim = 16, .rope_freqs = 1, .rope_theta = 500000, .qk_scale = 4}},
    {"llama with q/k/v biases", {.arch = ARCH_LLAMA, .qkv_bias = 1, .qk_scale = 4}},
    {"qwen2 (biases, NeoX RoPE, tied)", {.arch = ARCH_QWEN2, .tied = 1, .qk_scale = 4}},
    {"qwen3 (q/k norms, NeoX RoPE, head_dim 16, tied)",
     {.arch = ARCH_QWEN3, .head_dim = 16, .tied = 1, .rope_theta = 1000000, .qk_scale = 4}},
};
#define N_ARCH_CASES ((int)(sizeof arch_cases / sizeof arch_cases[0]))
static const struct synth_arch llama2 = {0};

/* Prefill an n-token prompt as one batch (logits at every row), compare each row with the
 * reference run token by token; the reference stores keys and values as the cache type does
 * (KV_DEFAULT: f16). */
static void check_model(const struct synth_cfg *cfg, const struct synth_arch *a, const char *name,
                        uint32_t type, int kv_type, int n)
{
    char path[128];
    snprintf(path, sizeof path, "build/test-engine-%s.gguf", ggml_type_name(type));
    CHECK(synth_write_arch(path, cfg, a, type, 7) == 0);
    const int sharp = a->qk_scale > 1;
    struct loaded_model *lm = open_model_kv(path, 2, 48, kv_type);
    CHECK(lm);
    if (!lm) return;
    struct engine *e = &lm->engine;
    CHECK(e->kv.type == (kv_type == KV_F32 ? KV_F32 : KV_F16));
    CHECK(lm->model.cfg.arch == a->arch);
    /* The SIMD kernels want Q4_0 (and with VNNI Q8_0) matrices in 16-row groups: the engine
     * stored them so, except the 300-row output, which stays in rows. */
    const int blk = ggml_block_elems(type);
    if (repack_type_of(type) &&
        matmul_wants_repack(&e->mm, &(struct tensor){.type = type, .rows = 16, .cols = blk})) {
        CHECK(lm->model.layers[0].w_gate.type == repack_type_of(type));
        CHECK(lm->model.layers[cfg->layers - 1].wk.type == repack_type_of(type));
        CHECK(lm->model.output.type == type);
    }
    int V = cfg->vocab;
    int toks[48], pos[48], rows[48];
    int table[64];
    for (int i = 0; i < kv_blocks_for(&e->kv, 64); i++) table[i] = kv_block_alloc(&e->kv);
    const int *blocks[48];
    for (int i = 0; i < n; i++)
        toks[i] = i ? (i * 97 + 5) % V : 1, pos[i] = i, rows[i] = i, blocks[i] = table;
    float *logits = malloc(sizeof(float) * V * n), *ref = malloc(sizeof(float) * V);
    struct batch b = {n, toks, pos, blocks, n, rows};
    CHECK(engine_forward(e, &b, logits) == 0);
    struct ref R;
    ref_init(&R, &lm->model, e->kv.type);
    double worst = 0;
    for (int i = 0; i < n; i++) {
        ref_forward(&R, toks[i], i, ref);
        double r = rel_err(logits + (size_t)i * V, ref, V);
        if (r > worst) worst = r;
    }
    ref_free(&R);
    free(logits), free(ref);
    close_model(lm);
    remove(path);
    /* Sharp attention (qk_scale) over an f16 cache: a key element the engine and the reference
     * compute 1e-7 apart may round to neighbouring halves (5e-4 apart), which the softmax
     * amplifies; with an f32 cache the bound is f32's. */
    double tol = sharp && kv_type != KV_F32 && type == GGML_F32 ? 1e-3 : tolerance(type);
    printf("# %s, %s, %s cache: worst relative logit error %.3g (tolerance %.3g)\n", name,
           ggml_type_name(type), kv_type_name(kv_type), worst, tol);
    CHECKF(worst <= tol, "%s, %s, %s cache: relative logit error %.3g > %.3g", name,
           ggml_type_name(type), kv_type_name(kv_type), worst, tol);
}

static void check_type_cfg(uint32_t type, int kv_type, const struct synth_cfg *cfg)
{
    check_model(cfg, &llama2, "llama 2", type, kv_type, 9);
}

static void check_type_kv(uint32_t type, int kv_type)
{
    check_type_cfg(type, kv_type, &gqa);
}

static void check_type(uint32_t type)
{
    check_type_kv(type, KV_DEFAULT);
}

TEST(prefill_matches_reference_f32)
{
    check_type(GGML_F32);
}
/* The exact cache: the same bound, with the reference keeping floats. */
TEST(prefill_matches_reference_f32_kv_f32)
{
    check_type_kv(GGML_F32, KV_F32);
}
TEST(prefill_matches_reference_q8_0_kv_f32)
{
    check_type_kv(GGML_Q8_0, KV_F32);
}
TEST(prefill_matches_reference_f16)
{
    check_type(GGML_F16);
}
TEST(prefill_matches_reference_bf16)
{
    check_type(GGML_BF16);
}
TEST(prefill_matches_reference_q8_0)
{
    check_type(GGML_Q8_0);
}
TEST(prefill_matches_reference_q4_0)
{
    check_type(GGML_Q4_0);
}
/* The types of llama.cpp's presets beyond those (the super-block ones at dim 256; every matrix
 * repacked but the 300-row output). */
TEST(prefill_matches_reference_every_preset_type)
{
    const uint32_t t32[] = {GGML_Q4_1, GGML_Q5_0, GGML_Q5_1, GGML_IQ4_NL};
    const uint32_t t256[] = {GGML_Q2_K, GGML_Q3_K, GGML_Q4_K, GGML_Q5_K, GGML_Q6_K, GGML_IQ4_XS};
    for (size_t i = 0; i < sizeof t32 / sizeof t32[0]; i++)
        check_type_cfg(t32[i], KV_DEFAULT, &gqa);
    for (size_t i = 0; i < sizeof t256 / sizeof t256[0]; i++)
        check_type_cfg(t256[i], KV_DEFAULT, &gqa256);
}

/* Greedy continuation of one sequence, decoding one token per step. */
static void greedy_alone(struct engine *e, const int *prompt, int np, int n_gen, int *out)
{
    int V = e->cfg->vocab_size, table[16], pos[16], rows[16];
    const int *blocks[16];
    for (int i = 0; i < kv_blocks_for(&e->kv, 64); i++) table[i] = kv_block_alloc(&e->kv);
    float *logits = malloc(sizeof(float) * V);
    int last = np - 1;
    for (int i = 0; i < np; i++) pos[i] = i, blocks[i] = table;
    rows[0] = last;
    struct batch b = {np, prompt, pos, blocks, 1, rows};
    CHECK(engine_forward(e, &b, logits) == 0);
    int cur = np;
    for (int g = 0; g < n_gen; g++) {
        out[g] = sampler_argmax(logits, V);
        int p = cur++, z = 0;
        const int *bt = table;
        struct batch d = {1, &out[g], &p, &bt, 1, &z};
        CHECK(engine_forward(e, &d, logits) == 0);
    }
    for (int i = 0; i < kv_blocks_for(&e->kv, 64); i++) kv_block_free(&e->kv, table[i]);
    free(logits);
}

/* Three sequences with different prompts decoded together, one token each per step, mixed with
 * the third sequence's prefill arriving late: the same greedy tokens as each alone. */
static void batched_vs_alone(const struct synth_arch *a, const char *name, uint32_t type)
{
    const char *path = "build/test-engine-batch.gguf";
    CHECK(synth_write_arch(path, &gqa, a, type, 11) == 0);
    struct loaded_model *lm = open_model(path, 4, 16);
    CHECK(lm);
    if (!lm) return;
    struct engine *e = &lm->engine;
    int V = gqa.vocab;
    int p0[] = {1, 270, 5}, p1[] = {1, 9, 33, 290, 12, 260}, p2[] = {1, 299};
    const int *prompts[3] = {p0, p1, p2};
    int np[3] = {3, 6, 2}, alone[3][8], together[3][8];
    for (int s = 0; s < 3; s++) greedy_alone(e, prompts[s], np[s], 8, alone[s]);

    int tables[3][16];
    for (int s = 0; s < 3; s++)
        for (int i = 0; i < kv_blocks_for(&e->kv, 64); i++) tables[s][i] = kv_block_alloc(&e->kv);
    float *logits = malloc(sizeof(float) * V * 3);
    int toks[16], pos[16], rows[3], cur[3], ngen[3] = {0, 0, 0};
    const int *blocks[16];
    // step 0: prefill of sequences 0 and 1 in one batch
    int n = 0;
    for (int s = 0; s < 2; s++) {
        for (int i = 0; i < np[s]; i++)
            toks[n] = prompts[s][i], pos[n] = i, blocks[n] = tables[s], n++;
        rows[s] = n - 1;
        cur[s] = np[s];
    }
    struct batch b = {n, toks, pos, blocks, 2, rows};
    CHECK(engine_forward(e, &b, logits) == 0);
    for (int s = 0; s < 2; s++) together[s][ngen[s]++] = sampler_argmax(logits + s * V, V);
    // step 1: decode 0 and 1, prefill 2; then all three decode together
    for (int step = 1; step < 9; step++) {
        n = 0;
        int nr = 0, who[3];
        for (int s = 0; s < 3; s++) {
            if (s == 2 && step == 1) {
                for (int i = 0; i < np[2]; i++)
                    toks[n] = p2[i], pos[n] = i, blocks[n] = tables[2], n++;
                cur[2] = np[2];
            } else {
                if (ngen[s] >= 8) continue;
                toks[n] = together[s][ngen[s] - 1], pos[n] = cur[s]++, blocks[n] = tables[s], n++;
            }
            rows[nr] = n - 1, who[nr++] = s;
        }
        if (!n) break;
        struct batch d = {n, toks, pos, blocks, nr, rows};
        CHECK(engine_forward(e, &d, logits) == 0);
        for (int r = 0; r < nr; r++)
            if (ngen[who[r]] < 8)
                together[who[r]][ngen[who[r]]++] = sampler_argmax(logits + r * V, V);
    }
    free(logits);
    close_model(lm);
    remove(path);
    for (int s = 0; s < 3; s++)
        for (int g = 0; g < 8; g++)
            CHECKF(alone[s][g] == together[s][g], "%s, %s: seq %d token %d: alone %d, batched %d",
                   name, ggml_type_name(type), s, g, alone[s][g], together[s][g]);
}

TEST(batched_decode_equals_one_by_one)
{
    batched_vs_alone(&llama2, "llama 2", GGML_Q8_0);
    batched_vs_alone(&llama2, "llama 2", GGML_Q4_0);
}

/* embed + layers [0,k) + layers [k,L) + head == forward, for every split point k: what a node
 * holding only the first k layers computes, handed to a node with the rest. Each layer runs from
 * its own span: the weight image is bound span by span into separate buffers, so a layer that
 * reached into another span's bytes (rope_freqs: model.h) would read zeros. */
static void split_equals_full(const struct synth_arch *a, const char *name)
{
    const char *path = "build/test-engine-split.gguf";
    CHECK(synth_write_arch(path, &gqa, a, GGML_F32, 3) == 0);
    struct loaded_model *lm = open_model(path, 1, 16);
    CHECK(lm);
    if (!lm) return;
    struct engine *e = &lm->engine;
    int V = gqa.vocab, dim = gqa.dim, n = 4;
    int toks[4] = {1, 300 - 1, 77, 261}, pos[4] = {0, 1, 2, 3}, rows[1] = {3}, table[16];
    for (int i = 0; i < kv_blocks_for(&e->kv, 64); i++) table[i] = kv_block_alloc(&e->kv);
    const int *blocks[4] = {table, table, table, table};
    struct batch b = {n, toks, pos, blocks, 1, rows};
    float *full = malloc(sizeof(float) * V), *split = malloc(sizeof(float) * V);
    float *x = malloc(sizeof(float) * dim * n);
    CHECK(engine_forward(e, &b, full) == 0);
    for (int k = 0; k <= gqa.layers; k++) {
        CHECK(engine_embed(e, &b, x) == 0);
        CHECK(engine_layers(e, &b, 0, k, x) == 0);
        CHECK(engine_layers(e, &b, k, gqa.layers, x) == 0);
        CHECK(engine_head(e, &b, x, split) == 0);
        CHECKF(memcmp(full, split, sizeof(float) * V) == 0, "%s: split at %d differs", name, k);
    }
    /* Layer l bound to an image holding only its own span (zeros elsewhere) computes what it
     * computes from the whole image. */
    struct model *m = &lm->model;
    uint8_t *own = aligned_alloc(4096, m->image_size);
    float *y = malloc(sizeof(float) * dim * n);
    for (int l = 0; l < gqa.layers; l++) {
        CHECK(engine_embed(e, &b, x) == 0 && engine_layers(e, &b, 0, l, x) == 0);
        memcpy(y, x, sizeof(float) * dim * n);
        CHECK(engine_layers(e, &b, l, l + 1, x) == 0);
        memset(own, 0, m->image_size);
        memcpy(own + m->spans[1 + l].offset, lm->weights + m->spans[1 + l].offset,
               m->spans[1 + l].size);
        model_bind(m, own);
        CHECK(engine_layers(e, &b, l, l + 1, y) == 0);
        model_bind(m, lm->weights);
        CHECKF(memcmp(x, y, sizeof(float) * dim * n) == 0,
               "%s: layer %d needs bytes outside its span", name, l);
    }
    free(own), free(y);
    CHECK(engine_layers(e, &b, 2, 1, x) == -1);
    CHECK_STR(engine_error(e), "engine: layers [2, 1) of 3");
    CHECK(engine_layers(e, &b, 0, gqa.layers + 1, x) == -1);
    /* Errors are values with their reason: a bad batch names what is wrong. */
    int far[4] = {0, 1, 2, 64};
    struct batch bad = {n, toks, far, blocks, 1, rows};
    CHECK(engine_forward(e, &bad, full) == -1);
    CHECK_STR(engine_error(e), "engine: token 3 at position 64, outside the context (64)");
    int unknown[4] = {1, 2, 3, V};
    struct batch oov = {n, unknown, pos, blocks, 1, rows};
    CHECK(engine_forward(e, &oov, full) == -1);
    CHECKF(strstr(engine_error(e), "outside the vocabulary"), "%s", engine_error(e));
    free(full), free(split), free(x);
    close_model(lm);
    remove(path);
}

TEST(layer_range_split_equals_full)
{
    split_equals_full(&llama2, "llama 2");
}

/* Each architecture: prefill against the reference (f32, and q8_0 whose rows are all multiples
 * of 32), batched decode equal to each sequence alone, and layer ranges equal to the whole. */
TEST(architectures_match_reference)
{
    for (int i = 0; i < N_ARCH_CASES; i++) {
        check_model(&gqa, &arch_cases[i].a, arch_cases[i].name, GGML_F32, KV_DEFAULT, 40);
        check_model(&gqa, &arch_cases[i].a, arch_cases[i].name, GGML_F32, KV_F32, 40);
        check_model(&gqa, &arch_cases[i].a, arch_cases[i].name, GGML_Q8_0, KV_DEFAULT, 40);
    }
}

TEST(architectures_batch_invariant)
{
    for (int i = 0; i < N_ARCH_CASES; i++) {
        batched_vs_alone(&arch_cases[i].a, arch_cases[i].name, GGML_F32);
        batched_vs_alone(&arch_cases[i].a, arch_cases[i].name, GGML_Q8_0);
    }
}

TEST(architectures_layer_range_split)
{
    for (int i = 0; i < N_ARCH_CASES; i++) split_equals_full(&arch_cases[i].a, arch_cases[i].name);
}

/* A helper's fused step, as cluster/coop_fuse.c runs it: its own rows (embedding, then the layers one
 * at a time) with other nodes' rows joining before the layer they start at (0, 1, 2; their inputs
 * computed by a joiner's engine), one of them late (it starts at layer 1 and joins before layer 2,
 * running layer 1 alone first), and one head for all; against the same rows as separate steps
 * (engine_forward for the own rows, engine_layers(k, L) + engine_head per remote step) on another
 * engine. Every logit and every KV row the helper keeps are the same bytes, for a prefill step and
 * the decode step after it (whose attention reads that KV): what a batch_invariant backend
 * promises. */
static void fused_vs_separate(uint32_t type)
{
    const char *path = "build/test-engine-fused.gguf";
    CHECK(synth_write(path, &gqa, type, 13) == 0);
    struct loaded_model *lj = open_model(path, 8, 32), *la = open_model(path, 8, 32),
                        *lb = open_model(path, 8, 32);
    CHECK(lj && la && lb);
    if (!lj || !la || !lb) return close_model(lj), close_model(la), close_model(lb), (void)0;
    struct engine *J = &lj->engine, *A = &la->engine, *B = &lb->engine;
    enum { NS = 6, MAXR = 32 };
    const int L = gqa.layers, V = gqa.vocab, dim = gqa.dim;
    /* own sequences first; the remote ones' first layers out of order, two at layer 1 */
    const int own[NS] = {1, 1, 0, 0, 0, 0}, k[NS] = {0, 0, 2, 1, 0, 1}, n0[NS] = {5, 3, 3, 4, 2, 2};
    /* where each joins the pass: the own rows at the embedding, sequence 5 late */
    const int join_at[NS] = {0, 0, 2, 1, 0, 2};
    const int order[NS] = {0, 1, 4, 3, 5, 2}; /* the fused batch's rows */
    int tj[NS][4], ta[NS][4], tb[NS][4], next[NS];
    for (int q = 0; q < NS; q++)
        for (int i = 0; i < 4; i++)
            tj[q][i] = kv_block_alloc(&J->kv), ta[q][i] = kv_block_alloc(&A->kv),
            tb[q][i] = kv_block_alloc(&B->kv);
    float *xin = malloc(sizeof(float) * MAXR * dim), *x = malloc(sizeof(float) * MAXR * dim);
    float *sep = malloc(sizeof(float) * NS * V), *fused = malloc(sizeof(float) * NS * V);
    int tok[MAXR], pos[MAXR], rows[NS], lrow[NS];
    const int *blocks[MAXR];
    for (int step = 0; step < 2; step++) {
        /* the rows of each sequence this step: its prompt, then one decode token */
        int r0[NS], nr[NS], n = 0;
        for (int q = 0; q < NS; q++) {
            r0[q] = n, nr[q] = step ? 1 : n0[q];
            for (int i = 0; i < nr[q]; i++, n++) {
                pos[n] = step ? n0[q] : i;
                tok[n] = step ? next[q] : (q * 31 + i * 7 + 3) % V;
            }
        }
        /* the joiner's layers [0, k) give the remote rows' inputs */
        for (int q = 0; q < NS; q++) {
            if (own[q]) continue;
            for (int i = 0; i < nr[q]; i++) blocks[r0[q] + i] = tj[q];
            struct batch jb = {nr[q], tok + r0[q], pos + r0[q], blocks + r0[q], 0, NULL};
            float *xq = xin + (size_t)r0[q] * dim;
            CHECK(engine_embed(J, &jb, xq) == 0 && engine_layers(J, &jb, 0, k[q], xq) == 0);
        }
        /* separate: the own step, then each remote step */
        int n_own = r0[2];
        for (int i = 0; i < n_own; i++) blocks[i] = i < r0[1] ? ta[0] : ta[1];
        rows[0] = r0[1] - 1, rows[1] = n_own - 1;
        struct batch ob = {n_own, tok, pos, blocks, 2, rows};
        CHECK(engine_forward(A, &ob, sep) == 0);
        for (int q = 2; q < NS; q++) {
            for (int i = 0; i < nr[q]; i++) blocks[r0[q] + i] = ta[q];
            int last[1] = {nr[q] - 1};
            struct batch rb = {nr[q], tok + r0[q], pos + r0[q], blocks + r0[q], 1, last};
            memcpy(x, xin + (size_t)r0[q] * dim, sizeof(float) * nr[q] * dim);
            CHECK(engine_layers(A, &rb, k[q], L, x) == 0);
            CHECK(engine_head(A, &rb, x, sep + (size_t)q * V) == 0);
        }
        /* fused: the same rows in one pass, joining on the way */
        int ftok[MAXR], fpos[MAXR], m = 0;
        const int *fbl[MAXR];
        for (int o = 0; o < NS; o++) {
            int q = order[o];
            for (int i = 0; i < nr[q]; i++, m++) {
                ftok[m] = tok[r0[q] + i], fpos[m] = pos[r0[q] + i], fbl[m] = tb[q];
                if (!own[q])
                    memcpy(x + (size_t)m * dim, xin + (size_t)(r0[q] + i) * dim,
                           sizeof(float) * dim);
            }
            lrow[o] = m - 1;
        }
        struct batch fo = {n_own, ftok, fpos, fbl, 2, lrow};
        CHECK(engine_embed(B, &fo, x) == 0);
        int in = n_own, at = 2;
        for (int l = 0; l < L; l++) {
            for (; at < NS && join_at[order[at]] == l; at++) {
                int q = order[at];
                struct batch late = {nr[q], ftok + in, fpos + in, fbl + in, 0, NULL};
                if (k[q] < l) CHECK(engine_layers(B, &late, k[q], l, x + (size_t)in * dim) == 0);
                in += nr[q];
            }
            struct batch now = {in, ftok, fpos, fbl, 0, NULL};
            CHECK(engine_layers(B, &now, l, l + 1, x) == 0);
        }
        CHECK(in == m);
        struct batch fb = {m, ftok, fpos, fbl, NS, lrow};
        CHECK(engine_head(B, &fb, x, fused) == 0);
        for (int o = 0; o < NS; o++) {
            int q = order[o];
            CHECKF(!memcmp(fused + (size_t)o * V, sep + (size_t)q * V, sizeof(float) * V),
                   "%s step %d: sequence %d (%s, from layer %d): fused logits differ",
                   ggml_type_name(type), step, q, own[q] ? "own" : "remote", k[q]);
            next[q] = sampler_argmax(sep + (size_t)q * V, V);
        }
    }
    /* the KV the helper keeps: every layer of its own sequences, [k, L) of the remote ones */
    size_t row = (size_t)A->kv.kv_dim * A->kv.elt;
    uint8_t *ka = malloc(row * 8), *va = malloc(row * 8), *kb = malloc(row * 8),
            *vb = malloc(row * 8);
    for (int q = 0; q < NS; q++)
        for (int l = k[q]; l < L; l++) {
            kv_rows_read(&A->kv, l, ta[q], 0, n0[q] + 1, ka, va);
            kv_rows_read(&B->kv, l, tb[q], 0, n0[q] + 1, kb, vb);
            CHECKF(!memcmp(ka, kb, row * (n0[q] + 1)) && !memcmp(va, vb, row * (n0[q] + 1)),
                   "%s: sequence %d layer %d: fused KV differs", ggml_type_name(type), q, l);
        }
    free(ka), free(va), free(kb), free(vb);
    free(xin), free(x), free(sep), free(fused);
    close_model(lj), close_model(la), close_model(lb);
    remove(path);
}

TEST(fused_step_equals_separate_steps)
{
    fused_vs_separate(GGML_F32);
    fused_vs_separate(GGML_Q8_0);
    fused_vs_separate(GGML_Q4_0);
}

/* Cooperative execution's KV handover (cluster/coop.h): node B holds layers [0, k) of a sequence
 * computed on node A too; the rows of layers [k, L) read out of A's blocks (kv_rows_read) and
 * written into B's (kv_rows_write, other block ids) make B's next token exactly A's. */
static void kv_handover(int kv_type)
{
    const char *path = "build/test-engine-kvrows.gguf";
    CHECK(synth_write(path, &gqa, GGML_F32, 5) == 0);
    struct loaded_model *la = open_model_kv(path, 1, 64, kv_type);
    struct loaded_model *lb = open_model_kv(path, 2, 64, kv_type); /* room for a spare block */
    CHECK(la && lb);
    if (!la || !lb) return close_model(la), close_model(lb), (void)remove(path);
    struct engine *a = &la->engine, *b = &lb->engine;
    enum { N = 37 }; /* three blocks of 16, the last one partial */
    int toks[N + 1], pos[N + 1], ta[4], tb[4], last[1] = {N - 1}, one[1] = {0};
    for (int i = 0; i <= N; i++) toks[i] = (i * 37 + 11) % gqa.vocab, pos[i] = i;
    kv_block_alloc(&b->kv); /* B's blocks are not A's */
    for (int i = 0; i < 4; i++) ta[i] = kv_block_alloc(&a->kv), tb[3 - i] = kv_block_alloc(&b->kv);
    CHECK(ta[3] >= 0 && tb[0] >= 0);
    const int *ba[N + 1], *bb[N + 1];
    for (int i = 0; i <= N; i++) ba[i] = ta, bb[i] = tb;
    float *la_out = malloc(sizeof(float) * gqa.vocab), *lb_out = malloc(sizeof(float) * gqa.vocab);
    float *x = malloc(sizeof(float) * gqa.dim * N);
    size_t row = (size_t)a->kv.kv_dim * a->kv.elt;
    uint8_t *k = malloc(row * N), *v = malloc(row * N);
    struct batch pa = {N, toks, pos, ba, 1, last};
    CHECK(engine_forward(a, &pa, la_out) == 0);
    for (int kk = 0; kk <= gqa.layers; kk++) {
        struct batch pb = {N, toks, pos, bb, 0, NULL};
        CHECK(engine_embed(b, &pb, x) == 0 && engine_layers(b, &pb, 0, kk, x) == 0);
        for (int l = kk; l < gqa.layers; l++) {
            kv_rows_read(&a->kv, l, ta, 0, 20, k, v); /* in two pieces, as chunks come */
            kv_rows_read(&a->kv, l, ta, 20, N - 20, k + 20 * row, v + 20 * row);
            kv_rows_write(&b->kv, l, tb, 0, 11, k, v);
            kv_rows_write(&b->kv, l, tb, 11, N - 11, k + 11 * row, v + 11 * row);
        }
        /* the next token at position N on both */
        struct batch da = {1, toks + N, pos + N, ba, 1, one},
                     db = {1, toks + N, pos + N, bb, 1, one};
        CHECK(engine_forward(a, &da, la_out) == 0 && engine_forward(b, &db, lb_out) == 0);
        CHECKF(!memcmp(la_out, lb_out, sizeof(float) * gqa.vocab),
               "kv %s: the next token's logits differ after handing over layers [%d, %d)",
               kv_type_name(kv_type), kk, gqa.layers);
    }
    free(la_out), free(lb_out), free(x), free(k), free(v);
    close_model(la), close_model(lb);
    remove(path);
}

TEST(kv_rows_hand_over_exactly)
{
    kv_handover(KV_F16);
    kv_handover(KV_F32);
}

TEST(sampler_seeded_and_filters)
{
    int V = 50;
    float logits[50], work[50];
    for (int i = 0; i < V; i++) logits[i] = sinf((float)i) * 3;
    struct sampler a, b;
    struct sampler_params p = {
        .temperature = 0.9f, .top_p = 0.9f, .top_k = 20, .min_p = 0.01f, .seed = 42};
    CHECK(sampler_init(&a, &p, V, NULL) == 0);
    CHECK(sampler_init(&b, &p, V, NULL) == 0);
    int differ = 0, seen_other = 0, first = -1;
    for (int i = 0; i < 200; i++) {
        memcpy(work, logits, sizeof work);
        int x = sampler_sample(&a, work);
        memcpy(work, logits, sizeof work);
        int y = sampler_sample(&b, work);
        differ |= x != y;
        if (first < 0)
            first = x;
        else if (x != first)
            seen_other = 1;
        /* top-k 20: only the 20 best may ever come out */
        int better = 0;
        for (int j = 0; j < V; j++) better += logits[j] > logits[x];
        CHECKF(better < 20, "token %d has %d better tokens", x, better);
    }
    CHECK(!differ);    /* same seed, same stream */
    CHECK(seen_other); /* and it is not constant */
    sampler_free(&a), sampler_free(&b);
    // top_k 1 and temperature 0 are greedy
    struct sampler_params g = {.temperature = 1.0f, .top_p = 1.0f, .top_k = 1, .seed = 1};
    CHECK(sampler_init(&a, &g, V, NULL) == 0);
    memcpy(work, logits, sizeof work);
    CHECK_EQ_INT(sampler_sample(&a, work), sampler_argmax(logits, V));
    sampler_free(&a);
    // min_p near 1 keeps only the best
    struct sampler_params mp = {.temperature = 1.0f, .top_p = 1.0f, .min_p = 0.999f, .seed = 5};
    CHECK(sampler_init(&a, &mp, V, NULL) == 0);
    for (int i = 0; i < 20; i++) {
        memcpy(work, logits, sizeof work);
        CHECK_EQ_INT(sampler_sample(&a, work), sampler_argmax(logits, V));
    }
    sampler_free(&a);
}

/* argmax: the first index of the largest logit, wherever it is (blocks of 64 and their tails),
 * NaNs skipped; the same as the plain loop on random rows. */
TEST(sampler_argmax_first_index)
{
    float v[200];
    for (int n = 1; n <= 200; n += 13) {
        for (int at = 0; at < n; at += 7) {
            for (int i = 0; i < n; i++) v[i] = (float)((i * 37) % 101) * 0.01f - 2.0f;
            v[at] = 5.0f;
            if (at + 65 < n) v[at + 65] = 5.0f; /* a later tie, in another block */
            CHECKF(sampler_argmax(v, n) == at, "n %d: max at %d, argmax %d", n, at,
                   sampler_argmax(v, n));
        }
    }
    for (int i = 0; i < 200; i++) v[i] = -1.0f;
    v[0] = NAN, v[130] = NAN, v[131] = 3.0f, v[199] = 3.0f;
    CHECK_EQ_INT(sampler_argmax(v, 200), 131);
    uint64_t r = 99;
    for (int k = 0; k < 50; k++) {
        int best = 0;
        for (int i = 0; i < 200; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            v[i] = (float)(r >> 40) / 16777216.0f;
            if (v[i] > v[best]) best = i;
        }
        CHECK_EQ_INT(sampler_argmax(v, 200), best);
    }
}

int main(void)
{
    log_set_quiet(1);
    RUN(prefill_matches_reference_f32);
    RUN(prefill_matches_reference_f32_kv_f32);
    RUN(prefill_matches_reference_q8_0_kv_f32);
    RUN(prefill_matches_reference_f16);
    RUN(prefill_matches_reference_bf16);
    RUN(prefill_matches_reference_q8_0);
    RUN(prefill_matches_reference_q4_0);
    RUN(prefill_matches_reference_every_preset_type);
    RUN(batched_decode_equals_one_by_one);
    RUN(layer_range_split_equals_full);
    RUN(architectures_match_reference);
    RUN(architectures_batch_invariant);
    RUN(architectures_layer_range_split);
    RUN(fused_step_equals_separate_steps);
    RUN(kv_rows_hand_over_exactly);
    RUN(sampler_seeded_and_filters);
    RUN(sampler_argmax_first_index);
    CHECK_DONE();
}
