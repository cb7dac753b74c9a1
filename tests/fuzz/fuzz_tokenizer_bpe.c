/* libFuzzer target: byte-level BPE vocabularies built from the input (a pre-tokenizer, extra
 * tokens of any type, merges between any tokens, add_bos/add_eos), written as GGUF and loaded,
 * then the rest of the input encoded with and without parse_special and decoded. Loading either
 * works or fails with a message; encoding never fails for want of room; when every extra token is
 * normal (after loading), decoding gives back the text as llama.cpp reads it (invalid bytes as
 * U+FFFD). The
 * loader of arbitrary GGUF bytes is fuzz_gguf's.
 *
 * Input: [pre/flags] [n_extra] then n_extra tokens, each [type] [len] bytes, then [n_merges]
 * pairs of token indices (2 bytes each), then the text. */
#include "os/common/errmsg.h"
#include "serving/engine/gguf.h"
#include "serving/engine/tokenizer.h"
#include "serving/engine/unicode.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_EXTRA 32

static char chr[256][3];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    for (int b = 0, next = 256; b < 256; b++) {
        int cp = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE ? b : next++;
        if (cp < 0x80)
            chr[b][0] = (char)cp;
        else
            chr[b][0] = (char)(0xC0 | cp >> 6), chr[b][1] = (char)(0x80 | (cp & 0x3F));
    }
    return 0;
}

struct in {
    const uint8_t *p;
    size_t n;
};

static int take(struct in *in)
{
    if (!in->n) return 0;
    in->n--;
    return *in->p++;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const pres[] = {"llama-bpe", "qwen2", "tekken", "gpt-2", "default"};
    struct in in = {data, size};
    char err[ERRMSG_LEN];
    int flags = take(&in), n_extra = take(&in) % (MAX_EXTRA + 1), all_normal = 1;
    const char *tok[256 + MAX_EXTRA];
    char extra[MAX_EXTRA][33];
    int32_t type[256 + MAX_EXTRA];
    for (int b = 0; b < 256; b++) tok[b] = chr[b], type[b] = 1;
    for (int k = 0; k < n_extra; k++) {
        int t = take(&in) % 7, len = take(&in) % 33;
        if (len > (int)in.n) len = (int)in.n;
        memcpy(extra[k], in.p, (size_t)len);
        extra[k][len] = 0; /* a NUL inside cuts the token short: still a token */
        in.p += len, in.n -= (size_t)len;
        tok[256 + k] = extra[k];
        type[256 + k] = t;
        if (t != 1) all_normal = 0;
    }
    int nv = 256 + n_extra, n_merges = take(&in);
    char(*merges)[80] = malloc((size_t)(n_merges + 1) * sizeof *merges);
    const char **mp = malloc((size_t)(n_merges + 1) * sizeof *mp);
    for (int k = 0; k < n_merges; k++) {
        int a = (take(&in) << 8 | take(&in)) % nv, b = (take(&in) << 8 | take(&in)) % nv;
        snprintf(merges[k], sizeof merges[k], "%s %s", tok[a], tok[b]);
        mp[k] = merges[k];
    }
    struct gguf_writer *w = gguf_writer_new();
    gguf_w_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_w_str(w, "tokenizer.ggml.pre", pres[(flags & 7) % 5]);
    gguf_w_arr_str(w, "tokenizer.ggml.tokens", tok, (uint64_t)nv);
    gguf_w_arr_i32(w, "tokenizer.ggml.token_type", type, (uint64_t)nv);
    gguf_w_arr_str(w, "tokenizer.ggml.merges", mp, (uint64_t)n_merges);
    uint8_t yes = 1;
    if (flags & 8) gguf_w_val(w, "tokenizer.ggml.add_eos_token", GGUF_BOOL, &yes);
    if (flags & 16) gguf_w_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)(nv - 1));
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (gguf_writer_write(w, f, err) < 0) abort();
    fclose(f);
    gguf_writer_free(w);
    free(merges);
    free(mp);
    struct gguf g;
    struct tokenizer t;
    if (gguf_parse(&g, buf, len, err) < 0) abort();
    if (tokenizer_from_gguf(&t, &g, err) == 0) {
        /* a normal token whose text is an end-of-generation marker has become a control one */
        for (int k = 256; k < nv; k++) all_normal &= t.type[k] == TOKT_NORMAL;
        const char *text = (const char *)in.p;
        int cap = 3 * (int)in.n + 2, n;
        int *ids = malloc((size_t)cap * sizeof *ids);
        uint8_t *back = malloc(4 * in.n + 1), *want = malloc(4 * in.n + 1);
        for (int special = 0; special < 2; special++) {
            struct tok_span sp = {text, in.n, special};
            if (tokenizer_encode_spans(&t, &sp, 1, 0, ids, cap, &n, err) < 0) abort();
            size_t bl = 0;
            for (int i = 0; i < n; i++) {
                if (ids[i] < 0 || ids[i] >= t.vocab_size) abort();
                char sc[4];
                size_t l;
                const char *p = tokenizer_decode(&t, i ? ids[i - 1] : -1, ids[i], sc, &l);
                if (bl + l <= 4 * in.n) memcpy(back + bl, p, l);
                bl += l;
            }
            if (all_normal && !special) {
                size_t wl = 0;
                for (size_t i = 0; i < in.n;)
                    wl += (size_t)unicode_encode(unicode_decode(in.p, in.n, &i), want + wl);
                if (bl != wl || memcmp(back, want, wl)) abort();
            }
        }
        free(ids);
        free(back);
        free(want);
        tokenizer_free(&t);
    }
    gguf_free(&g);
    free(buf);
    return 0;
}
