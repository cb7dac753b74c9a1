/* synth: write a small random Llama model as GGUF for tests (deterministic from a seed).
 * Weights ~ U(-a, a) with a = 1/sqrt(cols) so activations stay O(1); norms ~ 1 +/- 0.1.
 * A synthetic vocabulary: <unk>, <s>, </s>, the 256 byte tokens, then "a".."z" and " a".." z"
 * style pieces until vocab_size. Matrices are quantized to `type`. */
#ifndef STRATA_TEST_SYNTH_H
#define STRATA_TEST_SYNTH_H

#include "os/common/errmsg.h"
#include "serving/engine/gguf.h"
#include "serving/engine/quant.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct synth_cfg {
    int dim, hidden, layers, heads, kv_heads, vocab, seq;
};

static uint64_t synth_rng;
static float synth_uniform(void)
{
    synth_rng ^= synth_rng << 13;
    synth_rng ^= synth_rng >> 7;
    synth_rng ^= synth_rng << 17;
    return (float)((synth_rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

/* Returns a malloc'd buffer of the tensor in `type` (caller frees after writing). */
static void *synth_tensor(uint32_t type, int rows, int cols, float scale, float offset)
{
    size_t rb = ggml_row_bytes(type, (uint64_t)cols);
    uint8_t *out = malloc(rb * rows);
    float *row = malloc(sizeof(float) * cols);
    for (int r = 0; r < rows; r++) {
        for (int c = 0; c < cols; c++) row[c] = offset + scale * synth_uniform();
        quantize_row(type, row, out + rb * r, cols);
    }
    free(row);
    return out;
}

static int synth_write(const char *path, const struct synth_cfg *c, uint32_t type, uint64_t seed)
{
    synth_rng = seed * 2654435761u + 88172645463325252ull;
    struct gguf_writer *w = gguf_writer_new();
    gguf_w_str(w, "general.architecture", "llama");
    gguf_w_str(w, "general.name", "synthetic");
    gguf_w_u32(w, "llama.embedding_length", c->dim);
    gguf_w_u32(w, "llama.feed_forward_length", c->hidden);
    gguf_w_u32(w, "llama.block_count", c->layers);
    gguf_w_u32(w, "llama.attention.head_count", c->heads);
    gguf_w_u32(w, "llama.attention.head_count_kv", c->kv_heads);
    gguf_w_u32(w, "llama.context_length", c->seq);
    gguf_w_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    gguf_w_f32(w, "llama.rope.freq_base", 10000.0f);
    gguf_w_str(w, "tokenizer.ggml.model", "llama");
    char **toks = calloc(c->vocab, sizeof *toks);
    float *scores = calloc(c->vocab, sizeof *scores);
    for (int i = 0; i < c->vocab; i++) {
        char buf[32];
        if (i == 0)
            snprintf(buf, sizeof buf, "<unk>");
        else if (i == 1)
            snprintf(buf, sizeof buf, "<s>");
        else if (i == 2)
            snprintf(buf, sizeof buf, "</s>");
        else if (i < 259)
            snprintf(buf, sizeof buf, "<0x%02X>", i - 3);
        else {
            int k = i - 259; /* "a".."z", then "\xe2\x96\x81a" style with a space prefix */
            if (k < 26)
                snprintf(buf, sizeof buf, "%c", 'a' + k);
            else
                snprintf(buf, sizeof buf, " %c%c", 'a' + (k / 26 - 1) % 26, 'a' + k % 26);
        }
        toks[i] = strdup(buf);
        scores[i] = -(float)i;
    }
    gguf_w_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)toks, c->vocab);
    gguf_w_arr_f32(w, "tokenizer.ggml.scores", scores, c->vocab);
    gguf_w_u32(w, "tokenizer.ggml.bos_token_id", 1);
    gguf_w_u32(w, "tokenizer.ggml.eos_token_id", 2);

    int hd = c->dim / c->heads, kvd = c->kv_heads * hd;
    void *bufs[256];
    int nb = 0;
#define T2(name, ty, rows, cols, scale, off)                                                       \
    do {                                                                                           \
        uint64_t ne[2] = {(uint64_t)(cols), (uint64_t)(rows)};                                     \
        bufs[nb] = synth_tensor(ty, rows, cols, scale, off);                                       \
        gguf_w_tensor(w, name, ty, (rows) == 1 ? 1 : 2, ne, bufs[nb]);                             \
        nb++;                                                                                      \
    } while (0)
    T2("token_embd.weight", type, c->vocab, c->dim, 1.0f, 0);
    char n[64];
    float sd = 1.0f / sqrtf((float)c->dim), sh = 1.0f / sqrtf((float)c->hidden);
    for (int l = 0; l < c->layers; l++) {
        snprintf(n, sizeof n, "blk.%d.attn_norm.weight", l);
        T2(n, GGML_F32, 1, c->dim, 0.1f, 1.0f);
        snprintf(n, sizeof n, "blk.%d.attn_q.weight", l);
        T2(n, type, c->dim, c->dim, sd * 2, 0);
        snprintf(n, sizeof n, "blk.%d.attn_k.weight", l);
        T2(n, type, kvd, c->dim, sd * 2, 0);
        snprintf(n, sizeof n, "blk.%d.attn_v.weight", l);
        T2(n, type, kvd, c->dim, sd, 0);
        snprintf(n, sizeof n, "blk.%d.attn_output.weight", l);
        T2(n, type, c->dim, c->dim, sd, 0);
        snprintf(n, sizeof n, "blk.%d.ffn_norm.weight", l);
        T2(n, GGML_F32, 1, c->dim, 0.1f, 1.0f);
        snprintf(n, sizeof n, "blk.%d.ffn_gate.weight", l);
        T2(n, type, c->hidden, c->dim, sd, 0);
        snprintf(n, sizeof n, "blk.%d.ffn_down.weight", l);
        T2(n, type, c->dim, c->hidden, sh, 0);
        snprintf(n, sizeof n, "blk.%d.ffn_up.weight", l);
        T2(n, type, c->hidden, c->dim, sd, 0);
    }
    T2("output_norm.weight", GGML_F32, 1, c->dim, 0.1f, 1.0f);
    T2("output.weight", type, c->vocab, c->dim, sd * 4, 0);
#undef T2
    FILE *f = fopen(path, "wb");
    char err[ERRMSG_LEN];
    int rc = f ? gguf_writer_write(w, f, err) : -1;
    if (f) fclose(f);
    if (rc) fprintf(stderr, "synth_write %s: %s\n", path, f ? err : "cannot open");
    gguf_writer_free(w);
    for (int i = 0; i < nb; i++) free(bufs[i]);
    for (int i = 0; i < c->vocab; i++) free(toks[i]);
    free(toks);
    free(scores);
    return rc;
}

#endif
