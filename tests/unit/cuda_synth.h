/* cuda_synth: models for the CUDA tests and benchmark, built in-process (no GGUF needed).
 *
 * synth_build() lays out a Llama-shaped model of the given weight type in execution order (span 0
 * token_embd, span 1+l block l, span L+1 output_norm + output), 32-byte aligned like GGUF, with
 * random weights from a fixed seed: exact=1 quantizes real floats with quant.c (tests compare
 * against a reference that dequantizes the same bytes); exact=0 writes valid random bytes
 * directly (benchmarks: 7B shapes in seconds). Norms are F32. synth_build_arch adds another
 * architecture's parts (model.h): q/k/v biases, q/k norms, rope_freqs (factors from 1 to 8), a
 * head dimension of its own. (The real tiny model comes through convert.c and model.c instead,
 * as the server loads it: test_cuda's load_stories.) */
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

static inline int synth_items(struct model *m, uint32_t type, int tied, struct synth_item *it)
{
    const struct model_config *c = &m->cfg;
    int n = 0, qd = c->n_heads * c->head_dim, hd = c->head_dim;
    it[n++] = (struct synth_item){&m->token_embd, type, c->vocab_size, c->dim, 0, 0};
    for (int l = 0; l < c->n_layers; l++) {
        struct layer_weights *w = &m->layers[l];
        it[n++] = (struct synth_item){&w->attn_norm, GGML_F32, 1, c->dim, 1 + l, 1};
        it[n++] = (struct synth_item){&w->wq, type, qd, c->dim, 1 + l, 0};
        it[n++] = (struct synth_item){&w->wk, type, c->kv_dim, c->dim, 1 + l, 0};
        it[n++] = (struct synth_item){&w->wv, type, c->kv_dim, c->dim, 1 + l, 0};
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
        it[n++] = (struct synth_item){&w->wo, type, c->dim, qd, 1 + l, 0};
        it[n++] = (struct synth_item){&w->ffn_norm, GGML_F32, 1, c->dim, 1 + l, 1};
        it[n++] = (struct synth_item){&w->w_gate, type, c->hidden_dim, c->dim, 1 + l, 0};
        it[n++] = (struct synth_item){&w->w_down, type, c->dim, c->hidden_dim, 1 + l, 0};
        it[n++] = (struct synth_item){&w->w_up, type, c->hidden_dim, c->dim, 1 + l, 0};
    }
    it[n++] = (struct synth_item){&m->output_norm, GGML_F32, 1, c->dim, c->n_layers + 1, 1};
    if (!tied)
        it[n++] = (struct synth_item){&m->output, type, c->vocab_size, c->dim, c->n_layers + 1, 0};
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
        /* Fast fill (benchmarks): one ~1 MiB pattern of valid random values of the type, tiled
         * over the tensor; whole blocks, so every copy lands on a block boundary. */
        int bsz = (int)ggml_row_bytes(t->type, (uint64_t)ggml_block_elems(t->type));
        size_t plen = (size_t)bsz * 32768;
        uint8_t *pat = malloc(plen);
        if (!pat) return free(row), free(it), -1;
        if (t->type == GGML_Q8_0 || t->type == GGML_Q4_0) {
            uint16_t dh = f32_to_fp16(scale / (t->type == GGML_Q8_0 ? 64.f : 4.f));
            for (size_t b = 0; b < plen / bsz; b++) {
                uint8_t *blk = pat + b * bsz;
                memcpy(blk, &dh, 2);
                for (int j = 2; j < bsz; j++) blk[j] = (uint8_t)synth_rng(&rng);
            }
        } else {
            for (size_t e = 0; e < plen / bsz; e++) {
                float f = scale * synth_uniform(&rng);
                if (t->type == GGML_F32)
                    memcpy(pat + e * 4, &f, 4);
                else {
                    uint16_t h = t->type == GGML_F16 ? f32_to_fp16(f) : f32_to_bf16(f);
                    memcpy(pat + e * 2, &h, 2);
                }
            }
        }
        for (uint64_t o = 0; o < t->nbytes; o += plen)
            memcpy(d + o, pat, t->nbytes - o < plen ? t->nbytes - o : plen);
        free(pat);
    }
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
