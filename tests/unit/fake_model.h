/* fake_model: a stand-in for the engine in scheduler and server tests.
 *
 * The "model" writes each token id into its KV slot (through the sequence's block table, as the
 * engine does) and predicts the next token as a hash of every token the KV cache holds for
 * positions 0..pos. A scheduler that pages, batches, preempts or recomputes wrongly reads the
 * wrong slots and produces a different continuation than fake_oracle(), which computes the same
 * hash over the plain token list: "batched output == output alone" becomes an exact check.
 * Its cache must be KV_F32 (the ids are stored as floats). */
#ifndef STRATA_FAKE_MODEL_H
#define STRATA_FAKE_MODEL_H

#include "serving/engine/engine.h"
#include "serving/engine/kv_cache.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FAKE_VOCAB 40
#define FAKE_EOS   1

static const char fake_chars[FAKE_VOCAB + 1] = "#$abcdefghijklmnopqrstuvwxyz0123456789 .";

struct fake_model {
    struct kv_cache *kv;
    int steps, max_tokens_seen, last_n; /* last_n: tokens in the last step */
    int sleep_us_per_token;
};

static inline unsigned fake_hash_next(unsigned h, int tok)
{
    return (h ^ (unsigned)tok) * 16777619u;
}

static inline int fake_pick(unsigned h, int len)
{
    int t = (int)((h >> 7) % FAKE_VOCAB);
    /* EOS only rarely and never before 4 tokens, so most requests run to max_tokens */
    if (t == FAKE_EOS && (len < 4 || (h >> 20) % 4)) t = 2 + (int)((h >> 3) % (FAKE_VOCAB - 2));
    if (t == 0) t = 2;
    return t;
}

static inline int fake_forward(void *ctx, const struct batch *b, float *logits, char *err)
{
    (void)err; /* the fake never fails */
    struct fake_model *f = ctx;
    struct kv_cache *kv = f->kv;
    int bs = kv->block_size;
    f->steps++;
    f->last_n = b->n;
    if (b->n > f->max_tokens_seen) f->max_tokens_seen = b->n;
    for (int i = 0; i < b->n; i++)
        *(float *)kv_value_at(kv, 0, b->blocks[i][b->pos[i] / bs], b->pos[i] % bs, 0) =
            (float)b->token[i];
    for (int j = 0; j < b->n_logits; j++) {
        int i = b->logit_rows[j];
        unsigned h = 2166136261u;
        for (int p = 0; p <= b->pos[i]; p++)
            h = fake_hash_next(
                h, (int)*(const float *)kv_value_at(kv, 0, b->blocks[i][p / bs], p % bs, 0));
        float *row = logits + (size_t)j * FAKE_VOCAB;
        for (int v = 0; v < FAKE_VOCAB; v++) row[v] = 0;
        row[fake_pick(h, b->pos[i] + 1)] = 1;
    }
    if (f->sleep_us_per_token) usleep((useconds_t)(f->sleep_us_per_token * b->n));
    return 0;
}

static inline const char *fake_decode(void *ctx, int prev, int id, char *scratch, size_t *len)
{
    (void)ctx, (void)prev;
    scratch[0] = fake_chars[id % FAKE_VOCAB];
    *len = 1;
    return scratch;
}

/* Greedy continuation of prompt[0..n) alone: up to max_tokens, stopping at EOS (which is not
 * part of the text). Returns the text length; *finished_by_eos says why it ended. */
static inline int fake_oracle(const int *prompt, int n, int max_tokens, int ctx, char *text,
                              int *finished_by_eos)
{
    int toks[4096];
    memcpy(toks, prompt, (size_t)n * sizeof *toks);
    int len = 0;
    *finished_by_eos = 0;
    while (len < max_tokens && n < ctx) {
        unsigned h = 2166136261u;
        for (int p = 0; p < n; p++) h = fake_hash_next(h, toks[p]);
        int t = fake_pick(h, n);
        if (t == FAKE_EOS) {
            *finished_by_eos = 1;
            break;
        }
        toks[n++] = t;
        text[len++] = fake_chars[t];
    }
    text[len] = 0;
    return len;
}

/* "Tokenizer": BOS (0) then one token per byte. */
static inline int fake_encode(void *tok, const char *text, size_t len, int *out, int cap, int *n,
                              char *err)
{
    (void)tok, (void)err;
    if ((int)len + 1 > cap) return -1;
    out[0] = 0;
    for (size_t i = 0; i < len; i++) out[i + 1] = 2 + (unsigned char)text[i] % (FAKE_VOCAB - 2);
    *n = (int)len + 1;
    return 0;
}

#endif
