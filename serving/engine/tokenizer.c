/* tokenizer: vocabulary, special tokens, end of generation, dispatch and decoding. See tokenizer.h
 * for the contract; the models are tok_spm.c and tok_bpe.c. */
#include "serving/engine/tokenizer.h"

#include "os/common/errmsg.h"
#include "serving/engine/pretokenize.h"
#include "serving/engine/tok_bpe.h"
#include "serving/engine/tok_spm.h"

#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_VOCAB (1 << 24)
#define SPM_SPACE "\xe2\x96\x81" /* U+2581, SentencePiece's space */

/* ---------------------------------------------------------------------------------------------
 * Lookup */

static uint32_t fnv_step(uint32_t h, const char *p, int n)
{
    for (int i = 0; i < n; i++) h = (h ^ (uint8_t)p[i]) * 16777619u;
    return h;
}
#define FNV_INIT 2166136261u

int tokenizer_find2(const struct tokenizer *t, const char *a, int la, const char *b, int lb)
{
    if (la + lb > t->max_piece_len) return -1;
    uint32_t h = fnv_step(fnv_step(FNV_INIT, a, la), b, lb);
    for (uint32_t i = h & t->hash_mask;; i = (i + 1) & t->hash_mask) {
        int id = t->hash[i];
        if (id < 0) return -1;
        if (t->piece_len[id] == la + lb && memcmp(t->pieces[id], a, (size_t)la) == 0 &&
            (lb == 0 || memcmp(t->pieces[id] + la, b, (size_t)lb) == 0))
            return id;
    }
}

int tokenizer_find(const struct tokenizer *t, const char *text, size_t len)
{
    if (len > (size_t)t->max_piece_len) return -1;
    return tokenizer_find2(t, text, (int)len, "", 0);
}

/* "<0xNN>" -> NN, else -1. */
static int byte_piece(const char *p, int len)
{
    static const char hex[] = "0123456789ABCDEF";
    if (len != 6 || memcmp(p, "<0x", 3) != 0 || p[5] != '>') return -1;
    const char *h = strchr(hex, p[3]), *l = strchr(hex, p[4]);
    if (!p[3] || !p[4] || !h || !l) return -1;
    return (int)((h - hex) * 16 + (l - hex));
}

/* Build the hash, byte table and limits once pieces, lengths and scores are in place. */
static int finish(struct tokenizer *t, char *err)
{
    unsigned cap = 1;
    while (cap < 2u * (unsigned)t->vocab_size) cap <<= 1;
    t->hash = malloc(cap * sizeof *t->hash);
    if (!t->hash) return errmsg_set(err, "tokenizer: out of memory");
    memset(t->hash, 0xff, cap * sizeof *t->hash);
    t->hash_mask = cap - 1;
    t->max_piece_len = 0;
    for (int id = 0; id < t->vocab_size; id++)
        if (t->piece_len[id] > t->max_piece_len) t->max_piece_len = t->piece_len[id];
    for (int b = 0; b < 256; b++) t->byte_ids[b] = -1;
    t->space_split = 1;
    for (int id = 0; id < t->vocab_size; id++) {
        int len = t->piece_len[id];
        if (tokenizer_find2(t, t->pieces[id], len, "", 0) >= 0)
            continue; /* duplicate: lowest id wins */
        uint32_t h = fnv_step(FNV_INIT, t->pieces[id], len);
        uint32_t i = h & t->hash_mask;
        while (t->hash[i] >= 0) i = (i + 1) & t->hash_mask;
        t->hash[i] = id;
        for (int j = 1; j < len; j++)
            if (t->pieces[id][j] == ' ' && t->pieces[id][j - 1] != ' ') t->space_split = 0;
        int b = byte_piece(t->pieces[id], len);
        if (b >= 0 && t->byte_ids[b] < 0) t->byte_ids[b] = id;
    }
    t->unk_id = 0;
    return 0;
}

/* Allocate the per-id arrays and the blob for `n` pieces of `bytes` total. */
static int alloc_vocab(struct tokenizer *t, int n, size_t bytes, char *err)
{
    memset(t, 0, sizeof *t);
    t->vocab_size = n;
    t->bos_id = t->eos_id = t->eot_id = t->eom_id = -1;
    t->pieces = calloc((size_t)n, sizeof *t->pieces);
    t->piece_len = calloc((size_t)n, sizeof *t->piece_len);
    t->scores = calloc((size_t)n, sizeof *t->scores);
    t->type = malloc((size_t)n);
    t->eog = calloc((size_t)n, 1);
    t->blob = malloc(bytes + (size_t)n + 1);
    if (!t->pieces || !t->piece_len || !t->scores || !t->type || !t->eog || !t->blob) {
        tokenizer_free(t);
        return errmsg_set(err, "tokenizer: out of memory for %d pieces", n);
    }
    memset(t->type, TOKT_NORMAL, (size_t)n);
    return 0;
}

void tokenizer_free(struct tokenizer *t)
{
    bpe_free(t);
    free(t->pieces);
    free(t->piece_len);
    free(t->scores);
    free(t->type);
    free(t->blob);
    free(t->hash);
    free(t->special_ids);
    free(t->eog_ids);
    free(t->eog);
    memset(t, 0, sizeof *t);
}

/* The end-of-generation list from the eog flags. */
static int list_eog(struct tokenizer *t, char *err)
{
    t->n_eog = 0;
    for (int i = 0; i < t->vocab_size; i++) t->n_eog += t->eog[i];
    free(t->eog_ids);
    t->eog_ids = malloc(((size_t)t->n_eog + 1) * sizeof *t->eog_ids);
    if (!t->eog_ids) return errmsg_set(err, "tokenizer: out of memory");
    for (int i = 0, k = 0; i < t->vocab_size; i++)
        if (t->eog[i]) t->eog_ids[k++] = i;
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Loading a llama2.c tokenizer.bin */

int tokenizer_from_llama2c(struct tokenizer *t, const void *buf, size_t size, int vocab_size,
                           char *err)
{
    const uint8_t *p = buf, *end = p + size;
    if (size < 4) return errmsg_set(err, "tokenizer: file of %zu bytes is too short", size);
    /* First pass: count and validate (the format has no count; vocab_size <= 0 means all). */
    const uint8_t *q = p + 4;
    int n = 0;
    size_t bytes = 0;
    while (q < end && (vocab_size <= 0 || n < vocab_size)) {
        int32_t len;
        if (end - q < 8)
            return errmsg_set(err, "tokenizer: truncated at byte %zu (token %d)", (size_t)(q - p),
                              n);
        memcpy(&len, q + 4, 4);
        if (len < 0 || (uint64_t)len > (uint64_t)(end - q - 8))
            return errmsg_set(err,
                              "tokenizer: token %d at byte %zu: length %d exceeds the %zu "
                              "bytes left",
                              n, (size_t)(q - p), len, (size_t)(end - q - 8));
        if (n >= MAX_VOCAB) return errmsg_set(err, "tokenizer: more than %d tokens", MAX_VOCAB);
        q += 8 + len;
        bytes += (size_t)len;
        n++;
    }
    if (vocab_size > 0 && n < vocab_size)
        return errmsg_set(err, "tokenizer: has %d tokens, the model needs %d", n, vocab_size);
    if (q != end)
        return errmsg_set(err,
                          "tokenizer: %zu bytes left after %d tokens (a tokenizer for a "
                          "larger vocabulary?)",
                          (size_t)(end - q), n);
    if (n == 0) return errmsg_set(err, "tokenizer: no tokens");
    if (alloc_vocab(t, n, bytes, err) < 0) return -1;
    char *b = t->blob;
    q = p + 4;
    for (int i = 0; i < n; i++) {
        int32_t len;
        memcpy(&t->scores[i], q, 4);
        memcpy(&len, q + 4, 4);
        memcpy(b, q + 8, (size_t)len);
        b[len] = 0;
        t->pieces[i] = b;
        t->piece_len[i] = len;
        b += len + 1;
        q += 8 + len;
    }
    t->model = TOK_SPM;
    t->bos_id = n > 1 ? 1 : -1;
    t->eos_id = n > 2 ? 2 : -1;
    t->add_bos = 1;
    t->add_space_prefix = 1;
    if (t->eos_id >= 0) t->eog[t->eos_id] = 1;
    if (finish(t, err) < 0 || list_eog(t, err) < 0) {
        tokenizer_free(t);
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Loading from GGUF */

/* Copy a GGUF piece, turning each U+2581 into ' '. Returns the new length. */
static int copy_unescape(char *dst, const char *src, uint64_t len)
{
    int o = 0;
    for (uint64_t i = 0; i < len;) {
        if (len - i >= 3 && memcmp(src + i, SPM_SPACE, 3) == 0) {
            dst[o++] = ' ';
            i += 3;
        } else
            dst[o++] = src[i++];
    }
    dst[o] = 0;
    return o;
}

static const struct tokenizer *sort_tok;

static int by_length_desc(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    int lx = sort_tok->piece_len[x], ly = sort_tok->piece_len[y];
    if (lx != ly) return ly - lx;
    return x - y;
}

/* The token types (tokenizer.ggml.token_type; absent: all normal). */
static int load_types(struct tokenizer *t, const struct gguf *g, char *err)
{
    if (!gguf_find(g, "tokenizer.ggml.token_type")) return 0;
    const struct gguf_kv *tt;
    if (gguf_get_arr(g, "tokenizer.ggml.token_type", GGUF_INT32, &tt, err) < 0) return -1;
    if (tt->v.arr.n != (uint64_t)t->vocab_size)
        return errmsg_set(err, "tokenizer.ggml.token_type has %llu entries, tokens has %d",
                          (unsigned long long)tt->v.arr.n, t->vocab_size);
    for (int i = 0; i < t->vocab_size; i++) {
        int32_t type;
        memcpy(&type, (const uint8_t *)tt->v.arr.data + 4 * (size_t)i, 4);
        t->type[i] = type >= TOKT_NORMAL && type <= TOKT_BYTE ? (uint8_t)type : TOKT_UNDEFINED;
    }
    return 0;
}

/* The special tokens, longest first (llama.cpp's special token cache). */
static int list_special(struct tokenizer *t, char *err)
{
    t->special_ids = malloc(((size_t)t->vocab_size + 1) * sizeof *t->special_ids);
    if (!t->special_ids) return errmsg_set(err, "tokenizer: out of memory");
    t->n_special = 0;
    for (int i = 0; i < t->vocab_size; i++)
        if ((t->type[i] == TOKT_UNKNOWN || t->type[i] == TOKT_CONTROL ||
             t->type[i] == TOKT_USER_DEFINED) &&
            t->piece_len[i] > 0)
            t->special_ids[t->n_special++] = i;
    /* single-threaded load; the comparator needs the lengths */
    sort_tok = t;
    qsort(t->special_ids, (size_t)t->n_special, sizeof *t->special_ids, by_length_desc);
    sort_tok = NULL;
    return 0;
}

/* An optional token id key: *id unchanged if absent or outside the vocabulary (llama.cpp keeps
 * its default then). */
static int opt_id(const struct gguf *g, const char *key, int n, int *id, char *err)
{
    uint32_t v;
    if (!gguf_find(g, key)) return 0;
    if (gguf_get_u32(g, key, &v, err) < 0) return -1;
    if (v < (uint32_t)n) *id = (int)v;
    return 0;
}

static int opt_bool(const struct gguf *g, const char *key, int *out, char *err)
{
    const struct gguf_kv *kv = gguf_find(g, key);
    if (!kv) return 0;
    if (kv->type != GGUF_BOOL) return errmsg_set(err, "%s: not a bool", key);
    *out = kv->v.u != 0;
    return 0;
}

/* The id of the first of the NULL-terminated texts that is a piece, or -1. (llama.cpp takes
 * whichever its hash map yields first; only eot_id itself can differ, never the EOG set.) */
static int find_any(const struct tokenizer *t, const char *const *texts)
{
    for (; *texts; texts++) {
        int id = tokenizer_find(t, *texts, strlen(*texts));
        if (id >= 0) return id;
    }
    return -1;
}

/* llama.cpp's end-of-generation set and the ids it finds by text. */
static int load_eog(struct tokenizer *t, const struct gguf *g, char *err)
{
    static const char *const eot_texts[] = {"<|eot_id|>",
                                            "<|im_end|>",
                                            "<|end|>",
                                            "<end_of_turn>",
                                            "<|endoftext|>",
                                            "<|end_of_text|>",
                                            "<EOT>",
                                            "_<EOT>",
                                            "<\xef\xbd\x9c"
                                            "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
                                            "<end_of_utterance>",
                                            NULL};
    static const char *const eom_texts[] = {"<|eom_id|>", NULL};
    static const char *const fim_pad[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", NULL};
    static const char *const fim_rep[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>",
                                          "<REPO>",       "<reponame>",    NULL};
    static const char *const fim_sep[] = {"<|file_sep|>", NULL};
    static const char *const fim_pre[] = {"<|fim_prefix|>",
                                          "<fim-prefix>",
                                          "<fim_prefix>",
                                          "<\xef\xbd\x9c"
                                          "fim\xe2\x96\x81"
                                          "begin\xef\xbd\x9c>",
                                          "<PRE>",
                                          "\xe2\x96\x81<PRE>",
                                          "<|code_prefix|>",
                                          NULL};
    static const char *const fim_suf[] = {"<|fim_suffix|>",
                                          "<fim-suffix>",
                                          "<fim_suffix>",
                                          "<\xef\xbd\x9c"
                                          "fim\xe2\x96\x81"
                                          "hole\xef\xbd\x9c>",
                                          "<SUF>",
                                          "\xe2\x96\x81<SUF>",
                                          "<|code_suffix|>",
                                          NULL};
    static const char *const fim_mid[] = {"<|fim_middle|>",
                                          "<fim-middle>",
                                          "<fim_middle>",
                                          "<\xef\xbd\x9c"
                                          "fim\xe2\x96\x81"
                                          "end\xef\xbd\x9c>",
                                          "<MID>",
                                          "\xe2\x96\x81<MID>",
                                          "<|code_middle|>",
                                          NULL};
    static const char *const eog_texts[] = {
        "<|eot_id|>",      "<|im_end|>",         "<|end|>",    "<|return|>", "<|call|>",
        "<end_of_turn>",   "<|endoftext|>",      "<|eom_id|>", "<EOT>",      "_<EOT>",
        "<|end_of_text|>", "<end_of_utterance>", NULL};
    const int n = t->vocab_size;
    struct {
        const char *key;
        const char *const *texts;
        int id;
    } found[] = {
        {"tokenizer.ggml.eot_token_id", eot_texts, -1},
        {"tokenizer.ggml.eom_token_id", eom_texts, -1},
        {"tokenizer.ggml.fim_pre_token_id", fim_pre, -1},
        {"tokenizer.ggml.fim_suf_token_id", fim_suf, -1},
        {"tokenizer.ggml.fim_mid_token_id", fim_mid, -1},
        {"tokenizer.ggml.fim_pad_token_id", fim_pad, -1},
        {"tokenizer.ggml.fim_rep_token_id", fim_rep, -1},
        {"tokenizer.ggml.fim_sep_token_id", fim_sep, -1},
    };
    for (size_t k = 0; k < sizeof found / sizeof found[0]; k++) {
        if (opt_id(g, found[k].key, n, &found[k].id, err) < 0) return -1;
        if (found[k].id < 0) { /* found by text: a control token from now on */
            found[k].id = find_any(t, found[k].texts);
            if (found[k].id >= 0) t->type[found[k].id] = TOKT_CONTROL;
        }
    }
    t->eot_id = found[0].id;
    t->eom_id = found[1].id;
    for (size_t k = 5; k < 8; k++) /* fim pad, repo, sep */
        if (found[k].id >= 0) t->eog[found[k].id] = 1;
    for (const char *const *s = eog_texts; *s; s++) {
        int id = tokenizer_find(t, *s, strlen(*s));
        if (id >= 0) t->eog[id] = 1, t->type[id] = TOKT_CONTROL;
    }
    if (t->eos_id >= 0) t->eog[t->eos_id] = 1;
    if (t->eot_id >= 0) t->eog[t->eot_id] = 1;
    if (t->eom_id >= 0) t->eog[t->eom_id] = 1;
    /* gpt-oss: <|end|> ends a message, not the generation, where <|return|> and <|call|> exist */
    int ret = tokenizer_find(t, "<|return|>", 10), call = tokenizer_find(t, "<|call|>", 8),
        end = tokenizer_find(t, "<|end|>", 7);
    if (ret >= 0 && call >= 0 && end >= 0 && t->eog[ret] && t->eog[call] && t->eog[end]) {
        t->eog[end] = 0;
        t->type[end] = TOKT_USER_DEFINED;
    }
    static const char *const always_rendered[] = {"<|channel|>", "<|message|>", "<|start|>",
                                                  "<|constrain|>", NULL};
    for (const char *const *s = always_rendered; *s; s++) {
        int id = tokenizer_find(t, *s, strlen(*s));
        if (id >= 0) t->type[id] = TOKT_USER_DEFINED;
    }
    return list_eog(t, err);
}

/* tokenizer.ggml.model and .pre: the model, and for BPE the pre-tokenizer with llama.cpp's
 * defaults for it (ignore_merges, add_bos). */
static int read_model(const struct gguf *g, int *model, int *pre, int *ignore_merges, int *add_bos,
                      char *err)
{
    struct gguf_str s;
    char buf[64];
    *model = TOK_SPM, *pre = PRETOK_DEFAULT, *ignore_merges = 0, *add_bos = 1;
    if (!gguf_find(g, "tokenizer.ggml.model")) return 0;
    if (gguf_get_str(g, "tokenizer.ggml.model", &s, err) < 0) return -1;
    if (gguf_str_eq(s, "llama")) return 0;
    if (!gguf_str_eq(s, "gpt2"))
        return errmsg_set(err,
                          "tokenizer.ggml.model \"%s\" is not supported (supported: \"llama\" "
                          "(SentencePiece), \"gpt2\" (byte-level BPE))",
                          gguf_str_printable(s, buf, sizeof buf));
    *model = TOK_BPE;
    *add_bos = 0;
    if (!gguf_find(g, "tokenizer.ggml.pre")) return 0; /* llama.cpp: "default" */
    if (gguf_get_str(g, "tokenizer.ggml.pre", &s, err) < 0) return -1;
    *pre = pretok_by_name(s.p, s.len, ignore_merges, add_bos);
    if (*pre < 0)
        return errmsg_set(err, "tokenizer.ggml.pre \"%s\" is not supported (supported: %s)",
                          gguf_str_printable(s, buf, sizeof buf), pretok_names());
    return 0;
}

int tokenizer_from_gguf(struct tokenizer *t, const struct gguf *g, char *err)
{
    int model, pre, ignore_merges, add_bos;
    if (read_model(g, &model, &pre, &ignore_merges, &add_bos, err) < 0) return -1;
    const struct gguf_kv *tokens, *scores = NULL;
    if (gguf_get_arr(g, "tokenizer.ggml.tokens", GGUF_STRING, &tokens, err) < 0) return -1;
    uint64_t n = tokens->v.arr.n;
    if (n == 0 || n > MAX_VOCAB)
        return errmsg_set(err, "tokenizer.ggml.tokens: %llu tokens (1..%d)", (unsigned long long)n,
                          MAX_VOCAB);
    if (gguf_find(g, "tokenizer.ggml.scores")) {
        if (gguf_get_arr(g, "tokenizer.ggml.scores", GGUF_FLOAT32, &scores, err) < 0) return -1;
        if (scores->v.arr.n != n)
            return errmsg_set(err, "tokenizer.ggml.scores has %llu entries, tokens has %llu",
                              (unsigned long long)scores->v.arr.n, (unsigned long long)n);
    }
    size_t bytes = 0;
    const uint8_t *p = tokens->v.arr.data;
    for (uint64_t i = 0; i < n; i++) {
        struct gguf_str s;
        p = gguf_next_str(p, &s);
        if (s.len > (1 << 20))
            return errmsg_set(err, "tokenizer.ggml.tokens: token %llu is %llu bytes long",
                              (unsigned long long)i, (unsigned long long)s.len);
        bytes += s.len ? s.len : 24; /* room for "[EMPTY_i]" */
    }
    if (alloc_vocab(t, (int)n, bytes, err) < 0) return -1;
    t->model = model;
    char *b = t->blob;
    p = tokens->v.arr.data;
    for (uint64_t i = 0; i < n; i++) {
        struct gguf_str s;
        p = gguf_next_str(p, &s);
        t->pieces[i] = b;
        if (model == TOK_SPM)
            t->piece_len[i] = copy_unescape(b, s.p, s.len);
        else if (s.len == 0) /* llama.cpp names empty BPE tokens */
            t->piece_len[i] = snprintf(b, 24, "[EMPTY_%llu]", (unsigned long long)i);
        else {
            memcpy(b, s.p, s.len);
            b[s.len] = 0;
            t->piece_len[i] = (int)s.len;
        }
        b += t->piece_len[i] + 1;
        if (scores) memcpy(&t->scores[i], scores->v.arr.data + 4 * i, 4);
    }
    /* llama.cpp's defaults: SentencePiece bos 1, eos 2; byte-level BPE 11 and 11 */
    uint32_t bos = model == TOK_SPM ? 1 : 11, eos = model == TOK_SPM ? 2 : 11;
    if ((gguf_find(g, "tokenizer.ggml.bos_token_id") &&
         gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &bos, err) < 0) ||
        (gguf_find(g, "tokenizer.ggml.eos_token_id") &&
         gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &eos, err) < 0))
        goto fail;
    if ((bos >= n || eos >= n) &&
        (model == TOK_SPM || gguf_find(g, "tokenizer.ggml.bos_token_id") ||
         gguf_find(g, "tokenizer.ggml.eos_token_id"))) {
        errmsg_set(err, "tokenizer: bos %u / eos %u outside the vocabulary of %llu", bos, eos,
                   (unsigned long long)n);
        goto fail;
    }
    t->bos_id = bos < n ? (int)bos : -1;
    t->eos_id = eos < n ? (int)eos : -1;
    t->add_bos = add_bos;
    t->add_eos = 0;
    t->add_space_prefix = model == TOK_SPM;
    if (opt_bool(g, "tokenizer.ggml.add_bos_token", &t->add_bos, err) < 0 ||
        opt_bool(g, "tokenizer.ggml.add_eos_token", &t->add_eos, err) < 0 ||
        opt_bool(g, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix, err) < 0)
        goto fail;
    if (t->bos_id < 0) t->add_bos = 0;
    if (t->eos_id < 0) t->add_eos = 0;
    if (finish(t, err) < 0 || load_types(t, g, err) < 0 || load_eog(t, g, err) < 0 ||
        list_special(t, err) < 0)
        goto fail;
    if (model == TOK_BPE && bpe_load(t, g, pre, ignore_merges, err) < 0) goto fail;
    return 0;
fail:
    tokenizer_free(t);
    return -1;
}

/* ---------------------------------------------------------------------------------------------
 * Encoding with special tokens */

struct frag {
    size_t off, len; /* raw text in the concatenation */
    int id;          /* a special token, or -1 for raw text */
};

struct frags {
    struct frag *f;
    int n;
};

static void add_raw(struct frags *fs, size_t off, size_t len)
{
    if (!len) return;
    struct frag *last = fs->n ? &fs->f[fs->n - 1] : NULL;
    if (last && last->id < 0 && last->off + last->len == off) {
        last->len += len; /* stretches run across spans */
        return;
    }
    fs->f[fs->n++] = (struct frag){off, len, -1};
}

/* Cut [a, b) of cat at the specials from index k on: the first (longest) one that occurs is cut
 * out everywhere and the gaps go on with the next ones, as llama.cpp's per-token passes do.
 * all = 0: user-defined tokens only (parse_special off). */
static void split_specials(const struct tokenizer *t, const char *cat, size_t a, size_t b, int k,
                           int all, struct frags *fs)
{
    for (; k < t->n_special && a < b; k++) {
        int id = t->special_ids[k];
        size_t pl = (size_t)t->piece_len[id];
        if (pl > b - a || (!all && t->type[id] != TOKT_USER_DEFINED)) continue;
        const char *hit = memmem(cat + a, b - a, t->pieces[id], pl);
        if (!hit) continue;
        size_t s = a;
        while (hit) {
            size_t h = (size_t)(hit - cat);
            split_specials(t, cat, s, h, k + 1, all, fs);
            fs->f[fs->n++] = (struct frag){h, 0, id};
            s = h + pl;
            hit = s < b ? memmem(cat + s, b - s, t->pieces[id], pl) : NULL;
        }
        split_specials(t, cat, s, b, k + 1, all, fs);
        return;
    }
    add_raw(fs, a, b - a);
}

static void put(int id, int *out, int cap, int *o)
{
    if (*o < cap) out[*o] = id;
    (*o)++;
}

/* Encode the spans; *o counts every id, also those past cap. */
static int encode_all(const struct tokenizer *t, const struct tok_span *spans, int n_spans,
                      int add_special, int *out, int cap, int *o, char *err)
{
    size_t total = 0;
    for (int i = 0; i < n_spans; i++) {
        if (spans[i].len > (size_t)(INT32_MAX / 4) - total)
            return errmsg_set(err, "tokenizer: text is too long");
        total += spans[i].len;
    }
    char *cat = malloc(total + 1);
    /* every fragment but the last raw one holds at least one byte of its own */
    struct frags fs = {malloc((total + 1) * sizeof *fs.f), 0};
    if (!cat || !fs.f) {
        free(cat);
        free(fs.f);
        return errmsg_set(err, "tokenizer: out of memory for %zu bytes of text", total);
    }
    size_t pos = 0;
    for (int i = 0; i < n_spans; i++) {
        if (spans[i].len) memcpy(cat + pos, spans[i].text, spans[i].len);
        split_specials(t, cat, pos, pos + spans[i].len, 0, spans[i].parse_special != 0, &fs);
        pos += spans[i].len;
    }
    int rc = 0;
    if (add_special && t->add_bos) put(t->bos_id, out, cap, o);
    for (int i = 0; i < fs.n && !rc; i++) {
        if (fs.f[i].id >= 0)
            put(fs.f[i].id, out, cap, o);
        else if (t->model == TOK_BPE)
            rc = bpe_encode(t, cat + fs.f[i].off, fs.f[i].len, out, cap, o, err);
        else
            rc = spm_encode(t, cat + fs.f[i].off, fs.f[i].len, out, cap, o, err);
    }
    if (add_special && t->add_eos) put(t->eos_id, out, cap, o);
    free(cat);
    free(fs.f);
    return rc;
}

int tokenizer_encode_spans(const struct tokenizer *t, const struct tok_span *spans, int n_spans,
                           int add_special, int *out, int cap, int *n, char *err)
{
    int o = 0;
    *n = 0;
    if (encode_all(t, spans, n_spans, add_special, out, cap, &o, err) < 0) return -1;
    if (o > cap) return errmsg_set(err, "tokenizer: text needs %d tokens, room for %d", o, cap);
    *n = o;
    return 0;
}

int tokenizer_encode(const struct tokenizer *t, const char *text, size_t len, int add_special,
                     int *out, int cap, int *n, char *err)
{
    struct tok_span sp = {text, len, 0};
    int o = 0;
    *n = 0;
    if (encode_all(t, &sp, 1, add_special, out, cap, &o, err) < 0) return -1;
    *n = o;
    if (o > cap) return errmsg_set(err, "tokenizer: text needs %d tokens, room for %d", o, cap);
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Decoding and end of generation */

const char *tokenizer_decode_ex(const struct tokenizer *t, int prev, int id, int flags,
                                char *scratch, size_t *len)
{
    *len = 0;
    if (id < 0 || id >= t->vocab_size) return "";
    if (t->model == TOK_BPE) {
        if ((flags & TOK_RENDER_SPECIAL) &&
            (t->type[id] == TOKT_CONTROL || t->type[id] == TOKT_UNKNOWN)) {
            *len = (size_t)t->piece_len[id];
            return t->pieces[id];
        }
        *len = (size_t)t->dec_len[id];
        return t->dec[id];
    }
    if (id == t->bos_id || id == t->eos_id) return "";
    const char *p = t->pieces[id];
    int n = t->piece_len[id];
    if (prev == t->bos_id && prev >= 0 && n > 0 && p[0] == ' ') {
        p++;
        n--;
    }
    int b = byte_piece(p, n);
    if (b >= 0) {
        scratch[0] = (char)b;
        *len = 1;
        return scratch;
    }
    *len = (size_t)n;
    return p;
}

const char *tokenizer_decode(const struct tokenizer *t, int prev, int id, char *scratch,
                             size_t *len)
{
    return tokenizer_decode_ex(t, prev, id, 0, scratch, len);
}

int tokenizer_is_eog(const struct tokenizer *t, int id)
{
    return id >= 0 && id < t->vocab_size && t->eog[id];
}
