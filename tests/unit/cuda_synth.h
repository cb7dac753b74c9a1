/* cuda_synth: models for the CUDA tests and benchmark, built in-process (no GGUF needed).
 *
 * synth_build() lays out a Llama-shaped model of the given weight type in execution order (span 0
 * token_embd, span 1+l block l, span L+1 output_norm + output), 32-byte aligned like GGUF, with
 * random weights from a fixed seed, every matrix of one type or a preset's mixture
 * (SYNTH_Q4_K_M): exact=1 quantizes real floats with quant.c row by row (tests compare against
 * a reference that dequantizes the same bytes); exact=0 tiles each tensor with a pattern of
 * quant.c-quantized blocks made once per (type, scale) (benchmarks: 8B shapes in seconds, every
 * type). Norms are F32. synth_build_arch adds another architecture's parts (model.h): q/k/v
 * biases, q/k norms, rope_freqs (factors from 1 to 8), a head dimension of its own. (The real
 * tiny model comes through convert.c and model.c instead, as the server loads it: test_cuda's
 * load_stories.) */
#ifndef STRATA_TEST_CUDA_SYNTH_H
#define STRATA_TEST_CUDA_SYNTH_H

#include "serving/engine/gguf.h"
#include "serving/engine/model.h"
#include "serving/engine/quant.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct synth_shape {
    int dim, hidden, layers, heads, kv_heads, vocab, seq_len;
};

struct synth {
    struct model m;
    uint8_t *image;
    size_t image_size;
};

static inline uint64_t synth_rng(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static inline float synth_uniform(uint64_t *s) /* [-1, 1) */
{
    return (float)((synth_rng(s) >> 40) / 8388608.0 - 1.0);
}

/* An architecture's parts (all 0: Llama 2). */
struct synth_arch_opts {
    int arch, head_dim, qkv_bias, qk_norm, rope_freqs, neox;
};

/* The tensors of a model in image order: (tensor, type, rows, cols, span, kind). */
enum { SYNTH_MATRIX, SYNTH_NORM, SYNTH_BIAS, SYNTH_FACTORS };
struct synth_item {
    struct tensor *t;
    uint32_t type;
    int rows, cols, span, norm; /* norm: an SYNTH_* vector kind, 0 for a matrix */
};

/* Mixtures as llama-quantize's presets make them (llama.cpp's Q4_K_M / Q5_K_M without an
 * importance matrix): the base type everywhere but Q6_K for the output matrix and for attn_v
 * and ffn_down in the layers that get more bits (the first and last eighth, and every third in
 * between). Pass one as synth_build's type. */
enum { SYNTH_Q4_K_M = 0x10000, SYNTH_Q5_K_M };

static inline const char *synth_type_name(uint32_t type)
{
    return type == SYNTH_Q4_K_M ? "q4_k_m" : type == SYNTH_Q5_K_M ? "q5_k_m" : ggml_type_name(type);
}

/* The type of a matrix: f = 0 token_embd, 1 q, 2 k, 3 v, 4 o, 5 gate, 6 down, 7 up, 8 output. */
static inline uint32_t synth_matrix_type(uint32_t type, int f, int layer, int n_layers)
{
    if (type != SYNTH_Q4_K_M && type != SYNTH_Q5_K_M) return type;
    int more = layer < n_layers / 8 || layer >= 7 * n_layers / 8 || (layer - n_layers / 8) % 3 == 2;
    if (f == 8 || ((f == 3 || f == 6) && more)) return GGML_Q6_K;
    return type == SYNTH_Q4_K_M ? GGML_Q4_K : GGML_Q5_K;
}

static inline int synth_items(struct model *m, uint32_t type, int tied, struct synth_item *it)
{
    const struct model_config *c = &m->cfg;
    int n = 0, qd = c->n_heads * c->head_dim, hd = c->head_dim, L = c->n_layers;
    it[n++] = (struct synth_item){
        &m->token_embd, synth_matrix_type(type, 0, 0, L), c->vocab_size, c->dim, 0, 0};
    for (int l = 0; l < L; l++) {
        struct layer_weights *w = &m->layers[l];
#define MT(f) synth_matrix_type(type, f, l, L)
        it[n++] = (struct synth_item){&w->attn_norm, GGML_F32, 1, c->dim, 1 + l, 1};
        it[n++] = (struct synth_item){&w->wq, MT(1), qd, c->dim, 1 + l, 0};
        it[n++] = (struct synth_item){&w->wk, MT(2), c->kv_dim, c->dim, 1 + l, 0};
        it[n++] = (struct synth_item){&w->wv, MT(3), c->kv_dim, c->dim, 1 + l, 0};
        if (c->qkv_bias) {
            it[n++] = (struct synth_item){&w->bq, GGML_F32, 1, qd, 1 + l, SYNTH_BIAS};
            it[n++] = (struct synth_item){&w->bk, GGML_F32, 1, c->kv_dim, 1 + l, SYNTH_BIAS};
            it[n++] = (struct synth_item){&w->bv, GGML_F32, 1, c->kv_dim, 1 + l, SYNTH_BIAS};
        }
        if (c->qk_norm) {
            it[n++] = (struct synth_item){&w->q_norm, GGML_F32, 1, hd, 1 + l, SYNTH_NORM};
            it[n++] = (struct synth_item){&w->k_norm, GGML_F32, 1, hd, 1 + l, SYNTH_NORM};
        }
        if (c->rope_freqs)
            it[n++] =
                (struct synth_item){&w->rope_freqs, GGML_F32, 1, hd / 2, 1 + l, SYNTH_FACTORS};
        it[n++] = (struct synth_item){&w->wo, MT(4), c->dim, qd, 1 + l, 0};
        it[n++] = (struct synth_item){&w->ffn_norm, GGML_F32, 1, c->dim, 1 + l, 1};
        it[n++] = (struct synth_item){&w->w_gate, MT(5), c->hidden_dim, c->dim, 1 + l, 0};
        it[n++] = (struct synth_item){&w->w_down, MT(6), c->dim, c->hidden_dim, 1 + l, 0};
        it[n++] = (struct synth_item){&w->w_up, MT(7), c->hidden_dim, c->dim, 1 + l, 0};
#undef MT
    }
    it[n++] = (struct synth_item){&m->output_norm, GGML_F32, 1, c->dim, c->n_layers + 1, 1};
    if (!tied)
        it[n++] = (struct synth_item){&m->output,      synth_matrix_type(type, 8, 0, L),
                                      c->vocab_size,   c->dim,
                                      c->n_layers + 1, 0};
    return n;
}

static inline void synth_config(struct model *m, const struct synth_shape *sh,
                                const struct synth_arch_opts *a)
{
    struct model_config *c = &m->cfg;
    c->arch = a->arch;
    c->dim = sh->dim;
    c->hidden_dim = sh->hidden;
    c->n_layers = sh->layers;
    c->n_heads = sh->heads;
    c->n_kv_heads = sh->kv_heads;
    c->head_dim = a->head_dim ? a->head_dim : sh->dim / sh->heads;
    c->q_dim = c->head_dim * sh->heads;
    c->kv_dim = c->head_dim * sh->kv_heads;
    c->vocab_size = sh->vocab;
    c->seq_len = sh->seq_len;
    c->norm_eps = 1e-5f;
    c->rope_theta = 10000.0f;
    c->rope_scale = 1.0f;
    c->rope_style = a->neox ? ROPE_HALVES : ROPE_PAIRS;
    c->qkv_bias = a->qkv_bias;
    c->qk_norm = a->qk_norm;
    c->rope_freqs = a->rope_freqs;
}

/* Lay the items out (32-byte aligned, spans contiguous) and allocate the image. */
static inline int synth_layout(struct synth *s, struct synth_item *it, int n)
{
    uint64_t off = 0;
    for (int i = 0; i < n; i++)
        off = (off + 31) / 32 * 32 + ggml_row_bytes(it[i].type, it[i].cols) * it[i].rows;
    s->image_size = off;
    s->image = aligned_alloc(4096, (off + 4095) / 4096 * 4096);
    if (!s->image) return -1;
    off = 0;
    s->m.n_spans = s->m.cfg.n_layers + 2;
    int cur = -1;
    for (int i = 0; i < n; i++) {
        off = (off + 31) / 32 * 32;
        if (it[i].span != cur) {
            cur = it[i].span;
            s->m.spans[cur].offset = off;
        }
        struct tensor *t = it[i].t;
        t->data = s->image + off;
        t->type = it[i].type;
        t->rows = it[i].rows;
        t->cols = it[i].cols;
        t->nbytes = ggml_row_bytes(it[i].type, it[i].cols) * it[i].rows;
        off += t->nbytes;
        s->m.spans[cur].size = off - s->m.spans[cur].offset;
    }
    s->m.image_size = s->image_size;
    return 0;
}

/* The fast fill's patterns, one per (type, scale): the embedding's, and one per row length. */
#define SYNTH_PATTERNS 8
struct synth_pattern {
    uint32_t type;
    float scale;
    uint8_t *bytes;
    size_t len;
};

static inline void synth_pats_free(struct synth_pattern *p, int n)
{
    for (int i = 0; i < n; i++) free(p[i].bytes);
}

static inline int synth_build_arch(struct synth *s, const struct synth_shape *sh,
                                   const struct synth_arch_opts *a, uint32_t type, int tied,
                                   int exact, uint64_t seed)
{
    memset(s, 0, sizeof *s);
    synth_config(&s->m, sh, a);
    s->m.tied_output = tied;
    struct synth_item *it = calloc((size_t)sh->layers * 15 + 3, sizeof *it);
    if (!it) return -1;
    int n = synth_items(&s->m, type, tied, it);
    if (synth_layout(s, it, n)) return free(it), -1;
    if (tied) s->m.output = s->m.token_embd;
    uint64_t rng = seed | 1;
    int widest = sh->hidden > sh->dim ? sh->hidden : sh->dim;
    if (s->m.cfg.q_dim > widest) widest = s->m.cfg.q_dim;
    float *row = malloc(sizeof(float) * (size_t)widest);
    struct synth_pattern pats[SYNTH_PATTERNS];
    int npats = 0;
    for (int i = 0; i < n; i++) {
        struct tensor *t = it[i].t;
        uint8_t *d = (uint8_t *)t->data;
        uint64_t rb = ggml_row_bytes(t->type, t->cols);
        float scale = it[i].norm ? 0.1f : i == 0 ? 0.5f : 1.0f / sqrtf((float)t->cols);
        if (exact || it[i].norm) {
            for (int r = 0; r < t->rows; r++) {
                for (int c = 0; c < t->cols; c++)
                    row[c] = it[i].norm == SYNTH_FACTORS
                                 ? 1.0f + 7.0f * c / (t->cols - 1 + !(t->cols - 1))
                             : it[i].norm == SYNTH_BIAS
                                 ? 0.2f * synth_uniform(&rng) * 1.7f
                                 : (it[i].norm ? 1.0f : 0.f) + scale * synth_uniform(&rng) * 1.7f;
                quantize_row(t->type, row, d + r * rb, t->cols);
            }
            continue;
        }
        /* Fast fill (benchmarks): a pattern of valid random values of the type, tiled over the
         * tensor; whole blocks, so every copy lands on a block boundary. Block types: ~1M random
         * floats quantized by quant.c (the K-quant fits are slow: each distinct pattern is made
         * once per build and kept in pats[]); F32/F16/BF16: 32768 random values; no more than the
         * first tensor that uses the pattern holds. */
        int be = ggml_block_elems(t->type);
        int bsz = (int)ggml_row_bytes(t->type, (uint64_t)be);
        int nblk = be > 1 ? (1 << 20) / be : 32768;
        if ((uint64_t)nblk * bsz > t->nbytes) nblk = (int)(t->nbytes / bsz); /* small models */
        size_t plen = (size_t)bsz * nblk;
        uint8_t *pat = NULL;
        for (int k = 0; k < npats; k++)
            if (pats[k].type == t->type && pats[k].scale == scale)
                pat = pats[k].bytes, plen = pats[k].len;
        if (!pat) {
            pat = npats < SYNTH_PATTERNS ? malloc(plen) : NULL;
            float *f = be > 1 ? malloc(sizeof(float) * (size_t)be * nblk) : NULL;
            if (!pat || (be > 1 && !f)) {
                free(pat);
                free(f);
                synth_pats_free(pats, npats);
                free(row);
                free(it);
                return -1;
            }
            pats[npats++] = (struct synth_pattern){t->type, scale, pat, plen};
            if (be > 1) {
                for (size_t e = 0; e < (size_t)be * nblk; e++) f[e] = scale * synth_uniform(&rng);
                quantize_row(t->type, f, pat, be * nblk);
                free(f);
            } else {
                for (int e = 0; e < nblk; e++) {
                    float v = scale * synth_uniform(&rng);
                    if (t->type == GGML_F32)
                        memcpy(pat + (size_t)e * 4, &v, 4);
                    else {
                        uint16_t h = t->type == GGML_F16 ? f32_to_fp16(v) : f32_to_bf16(v);
                        memcpy(pat + (size_t)e * 2, &h, 2);
                    }
                }
            }
        }
        for (uint64_t o = 0; o < t->nbytes; o += plen)
            memcpy(d + o, pat, t->nbytes - o < plen ? t->nbytes - o : plen);
    }
    synth_pats_free(pats, npats);
    free(row);
    free(it);
    return 0;
}

static inline int synth_build(struct synth *s, const struct synth_shape *sh, uint32_t type,
                              int tied, int exact, uint64_t seed)
{
    const struct synth_arch_opts llama2 = {0};
    return synth_build_arch(s, sh, &llama2, type, tied, exact, seed);
}

static inline void synth_free(struct synth *s)
{
    model_free(&s->m); /* a model planned from a GGUF has slots; a synth_build one has none */
    free(s->image);
    memset(s, 0, sizeof *s);
}

#endif
