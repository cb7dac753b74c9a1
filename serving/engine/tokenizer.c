/* tokenizer: SentencePiece-style BPE, llama2.c semantics. See tokenizer.h for the contract. */
#include "serving/engine/tokenizer.h"

#include "os/common/errmsg.h"

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

/* Id of the piece a+b (b may be empty), or -1. */
static int lookup2(const struct tokenizer *t, const char *a, int la, const char *b, int lb)
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
    for (int b = 0; b < 256; b++) t->byte_ids[b] = -1;
    t->space_split = 1;
    for (int id = 0; id < t->vocab_size; id++) {
        int len = t->piece_len[id];
        if (len > t->max_piece_len) t->max_piece_len = len;
        if (lookup2(t, t->pieces[id], len, "", 0) >= 0) continue; /* duplicate: lowest id wins */
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
    t->pieces = calloc((size_t)n, sizeof *t->pieces);
    t->piece_len = calloc((size_t)n, sizeof *t->piece_len);
    t->scores = calloc((size_t)n, sizeof *t->scores);
    t->blob = malloc(bytes + (size_t)n + 1);
    if (!t->pieces || !t->piece_len || !t->scores || !t->blob) {
        tokenizer_free(t);
        return errmsg_set(err, "tokenizer: out of memory for %d pieces", n);
    }
    return 0;
}

void tokenizer_free(struct tokenizer *t)
{
    free(t->pieces);
    free(t->piece_len);
    free(t->scores);
    free(t->blob);
    free(t->hash);
    free(t->special_ids);
    memset(t, 0, sizeof *t);
}

/* ---------------------------------------------------------------------------------------------
 * Loading */

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
    t->bos_id = n > 1 ? 1 : -1;
    t->eos_id = n > 2 ? 2 : -1;
    if (finish(t, err) < 0) {
        tokenizer_free(t);
        return -1;
    }
    return 0;
}

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

/* The special tokens from tokenizer.ggml.token_type (absent: none). */
static int load_special(struct tokenizer *t, const struct gguf *g, char *err)
{
    if (!gguf_find(g, "tokenizer.ggml.token_type")) return 0;
    const struct gguf_kv *tt;
    if (gguf_get_arr(g, "tokenizer.ggml.token_type", GGUF_INT32, &tt, err) < 0) return -1;
    if (tt->v.arr.n != (uint64_t)t->vocab_size)
        return errmsg_set(err, "tokenizer.ggml.token_type has %llu entries, tokens has %d",
                          (unsigned long long)tt->v.arr.n, t->vocab_size);
    t->special_ids = malloc((size_t)t->vocab_size * sizeof *t->special_ids);
    if (!t->special_ids) return errmsg_set(err, "tokenizer: out of memory");
    for (int i = 0; i < t->vocab_size; i++) {
        int32_t type;
        memcpy(&type, (const uint8_t *)tt->v.arr.data + 4 * (size_t)i, 4);
        if ((type == 2 || type == 3 || type == 4) && t->piece_len[i] > 0)
            t->special_ids[t->n_special++] = i;
    }
    /* single-threaded load; the comparator needs the lengths */
    sort_tok = t;
    qsort(t->special_ids, (size_t)t->n_special, sizeof *t->special_ids, by_length_desc);
    sort_tok = NULL;
    return 0;
}

int tokenizer_from_gguf(struct tokenizer *t, const struct gguf *g, char *err)
{
    struct gguf_str model;
    if (gguf_find(g, "tokenizer.ggml.model")) {
        if (gguf_get_str(g, "tokenizer.ggml.model", &model, err) < 0) return -1;
        char buf[48];
        if (!gguf_str_eq(model, "llama"))
            return errmsg_set(err, "tokenizer.ggml.model \"%s\" is not supported (only \"llama\")",
                              gguf_str_printable(model, buf, sizeof buf));
    }
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
        bytes += s.len;
    }
    if (alloc_vocab(t, (int)n, bytes, err) < 0) return -1;
    char *b = t->blob;
    p = tokens->v.arr.data;
    for (uint64_t i = 0; i < n; i++) {
        struct gguf_str s;
        p = gguf_next_str(p, &s);
        t->pieces[i] = b;
        t->piece_len[i] = copy_unescape(b, s.p, s.len);
        b += t->piece_len[i] + 1;
        if (scores) memcpy(&t->scores[i], scores->v.arr.data + 4 * i, 4);
    }
    uint32_t bos = 1, eos = 2;
    if ((gguf_find(g, "tokenizer.ggml.bos_token_id") &&
         gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &bos, err) < 0) ||
        (gguf_find(g, "tokenizer.ggml.eos_token_id") &&
         gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &eos, err) < 0))
        goto fail;
    if (bos >= n || eos >= n) {
        errmsg_set(err, "tokenizer: bos %u / eos %u outside the vocabulary of %llu", bos, eos,
                   (unsigned long long)n);
        goto fail;
    }
    t->bos_id = (int)bos;
    t->eos_id = (int)eos;
    if (finish(t, err) < 0) goto fail;
    if (load_special(t, g, err) < 0) goto fail;
    return 0;
fail:
    tokenizer_free(t);
    return -1;
}

/* ---------------------------------------------------------------------------------------------
 * Encoding */

struct sym {
    int id, prev, next; /* list of live symbols; -1 ends */
};

struct cand {
    uint64_t key; /* score (order-preserving bits) above, ~left below: the larger key wins */
    int left, right, id_l, id_r, id;
};

/* A key that orders candidates as llama2.c does: higher score first, then the leftmost pair.
 * One integer compare instead of float compares with NaN branches; -0 is folded into +0 because
 * llama2.c's '>' treats them as equal. */
static uint64_t cand_key(float score, int left)
{
    if (score == 0) score = 0;
    uint32_t u;
    memcpy(&u, &score, 4);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return (uint64_t)u << 32 | (uint32_t) ~(uint32_t)left;
}

static void heap_push(struct cand *h, int *n, struct cand c)
{
    int i = (*n)++;
    while (i > 0) {
        int p = (i - 1) / 2;
        if (c.key <= h[p].key) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = c;
}

static struct cand heap_pop(struct cand *h, int *n)
{
    struct cand top = h[0], last = h[--*n];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && h[c + 1].key > h[c].key) c++;
        if (h[c].key <= last.key) break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0) h[i] = last;
    return top;
}

static void try_pair(const struct tokenizer *t, const struct sym *s, int l, struct cand *h, int *nh)
{
    int r = s[l].next;
    if (l < 0 || r < 0) return;
    int a = s[l].id, b = s[r].id;
    int id = lookup2(t, t->pieces[a], t->piece_len[a], t->pieces[b], t->piece_len[b]);
    /* llama2.c starts its search at -1e10 with a strict '>': lower (or NaN) scores never merge. */
    if (id < 0 || !(t->scores[id] > -1e10f)) return;
    heap_push(h, nh, (struct cand){cand_key(t->scores[id], l), l, r, a, b, id});
}

int tokenizer_encode(const struct tokenizer *t, const char *text, size_t len, int add_bos, int *out,
                     int cap, int *n, char *err)
{
    *n = 0;
    if (len > (size_t)(INT32_MAX / 4))
        return errmsg_set(err, "tokenizer: text of %zu bytes is too long", len);
    /* At most one symbol per byte, plus the dummy prefix. */
    size_t max_syms = len + 1;
    struct sym *s = malloc(max_syms * sizeof *s);
    struct cand *h = malloc(3 * max_syms * sizeof *h);
    if (!s || !h) {
        free(s);
        free(h);
        return errmsg_set(err, "tokenizer: out of memory for %zu bytes of text", len);
    }
    int ns = 0;
#define PUSH(tok)     (s[ns].id = (tok), s[ns].prev = ns - 1, s[ns].next = ns + 1, ns++)
#define BYTE_TOKEN(c) (t->byte_ids[(uint8_t)(c)] >= 0 ? t->byte_ids[(uint8_t)(c)] : t->unk_id)
    if (len > 0) {
        int sp = lookup2(t, " ", 1, "", 0);
        PUSH(sp >= 0 ? sp : BYTE_TOKEN(' '));
    }
    for (size_t i = 0; i < len;) {
        /* One unit: a byte, then the continuation bytes after it, 4 bytes at most. */
        size_t j = i + 1;
        while (j < len && j - i < 4 && ((uint8_t)text[j] & 0xC0) == 0x80) j++;
        int id = lookup2(t, text + i, (int)(j - i), "", 0);
        if (id >= 0)
            PUSH(id);
        else
            for (size_t k = i; k < j; k++) PUSH(BYTE_TOKEN(text[k]));
        i = j;
    }
#undef PUSH
#undef BYTE_TOKEN
    if (ns) s[ns - 1].next = -1;
    /* With a vocabulary whose pieces never hold a space after a non-space (llama's), no merge can
     * join a symbol ending in a non-space to one starting with a space: the text falls apart into
     * words that merge independently. Same result as one global pass (merges in one word never
     * change another's candidates; ties stay leftmost within the word), with small heaps. */
    int nh = 0;
    for (int w0 = 0; w0 < ns;) {
        int w1 = w0 + 1;
        if (t->space_split)
            while (w1 < ns && !(t->pieces[s[w1].id][0] == ' ' && t->piece_len[s[w1 - 1].id] > 0 &&
                                t->pieces[s[w1 - 1].id][t->piece_len[s[w1 - 1].id] - 1] != ' '))
                w1++;
        else
            w1 = ns;
        for (int i = w0; i + 1 < w1; i++) try_pair(t, s, i, h, &nh);
        while (nh > 0) {
            struct cand c = heap_pop(h, &nh);
            /* Stale if either side has merged since the candidate was pushed. */
            if (s[c.left].id != c.id_l || s[c.left].next != c.right || s[c.right].id != c.id_r ||
                s[c.right].prev != c.left)
                continue;
            s[c.left].id = c.id;
            int r = s[c.right].next;
            s[c.left].next = r;
            if (r >= 0) s[r].prev = c.left;
            s[c.right].id = -1;
            s[c.right].prev = s[c.right].next = -2; /* dead */
            if (s[c.left].prev >= w0) try_pair(t, s, s[c.left].prev, h, &nh);
            if (r >= 0 && r < w1) try_pair(t, s, c.left, h, &nh);
        }
        w0 = w1;
    }
    int need = (add_bos && t->bos_id >= 0) ? 1 : 0;
    for (int i = ns ? 0 : -1; i >= 0; i = s[i].next) need++;
    if (need > cap) {
        free(s);
        free(h);
        *n = need;
        return errmsg_set(err, "tokenizer: text needs %d tokens, room for %d", need, cap);
    }
    int o = 0;
    if (add_bos && t->bos_id >= 0) out[o++] = t->bos_id;
    for (int i = ns ? 0 : -1; i >= 0; i = s[i].next) out[o++] = s[i].id;
    *n = o;
    free(s);
    free(h);
    return 0;
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
 * out everywhere and the gaps go on with the next ones, as llama.cpp's per-token passes do. */
static void split_specials(const struct tokenizer *t, const char *cat, size_t a, size_t b, int k,
                           struct frags *fs)
{
    for (; k < t->n_special && a < b; k++) {
        int id = t->special_ids[k];
        size_t pl = (size_t)t->piece_len[id];
        if (pl > b - a) continue;
        const char *hit = memmem(cat + a, b - a, t->pieces[id], pl);
        if (!hit) continue;
        size_t s = a;
        while (hit) {
            size_t h = (size_t)(hit - cat);
            split_specials(t, cat, s, h, k + 1, fs);
            fs->f[fs->n++] = (struct frag){h, 0, id};
            s = h + pl;
            hit = s < b ? memmem(cat + s, b - s, t->pieces[id], pl) : NULL;
        }
        split_specials(t, cat, s, b, k + 1, fs);
        return;
    }
    add_raw(fs, a, b - a);
}

int tokenizer_encode_spans(const struct tokenizer *t, const struct tok_span *spans, int n_spans,
                           int add_bos, int *out, int cap, int *n, char *err)
{
    *n = 0;
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
        if (spans[i].parse_special)
            split_specials(t, cat, pos, pos + spans[i].len, 0, &fs);
        else
            add_raw(&fs, pos, spans[i].len);
        pos += spans[i].len;
    }
    int o = 0, rc = 0;
    if (add_bos && t->bos_id >= 0) {
        if (cap < 1)
            rc = errmsg_set(err, "tokenizer: room for %d tokens", cap);
        else
            out[o++] = t->bos_id;
    }
    for (int i = 0; i < fs.n && !rc; i++) {
        if (fs.f[i].id >= 0) {
            if (o >= cap)
                rc = errmsg_set(err, "tokenizer: text needs more than %d tokens", cap);
            else
                out[o++] = fs.f[i].id;
            continue;
        }
        int k = 0;
        rc = tokenizer_encode(t, cat + fs.f[i].off, fs.f[i].len, 0, out + o, cap - o, &k, err);
        o += k;
    }
    free(cat);
    free(fs.f);
    *n = rc ? 0 : o;
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * Decoding */

const char *tokenizer_decode(const struct tokenizer *t, int prev, int id, char *scratch,
                             size_t *len)
{
    *len = 0;
    if (id < 0 || id >= t->vocab_size || id == t->bos_id || id == t->eos_id) return "";
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
