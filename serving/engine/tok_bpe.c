/* tok_bpe: byte-level BPE, llama.cpp's semantics. See tok_bpe.h for the contract. */
#include "serving/engine/tok_bpe.h"

#include "os/common/errmsg.h"
#include "serving/engine/pretokenize.h"
#include "serving/engine/unicode.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct merge {
    uint32_t a, b; /* the ids of the two parts */
    int32_t rank;  /* position in tokenizer.ggml.merges; -1: empty slot */
    int32_t id;    /* the merged token */
};

struct bpe {
    int pre, ignore_merges;
    int byte_id[256];       /* the token spelled as the byte's character, or -1 */
    char chr[256][3];       /* GPT-2 character of each byte, UTF-8, NUL-terminated */
    uint8_t chr_len[256];   /* 1 or 2 */
    int16_t byte_of[0x144]; /* the byte of each character of the alphabet, or -1 */
    struct merge *m;
    uint32_t mask;
    char *dec_blob; /* storage of tokenizer.dec */
};

/* ---------------------------------------------------------------------------------------------
 * GPT-2's byte <-> character table: printable Latin-1 bytes (! to ~, inverted ! to not-sign,
 * registered-sign to y-diaeresis) are themselves, the other 68 bytes U+0100.. in byte order. */

static int printable(int b)
{
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

static void byte_table(struct bpe *p)
{
    int next = 256;
    memset(p->byte_of, 0xff, sizeof p->byte_of);
    for (int b = 0; b < 256; b++) {
        uint32_t cp = printable(b) ? (uint32_t)b : (uint32_t)next++;
        uint8_t u[4];
        int n = unicode_encode(cp, u);
        memcpy(p->chr[b], u, (size_t)n);
        p->chr[b][n] = 0;
        p->chr_len[b] = (uint8_t)n;
        p->byte_of[cp] = (int16_t)b;
    }
}

/* ---------------------------------------------------------------------------------------------
 * Merges by the ids of their parts */

static uint32_t merge_slot(uint32_t a, uint32_t b, uint32_t mask)
{
    uint64_t k = ((uint64_t)a << 32 | b) * 0x9E3779B97F4A7C15ull;
    return (uint32_t)(k >> 32) & mask;
}

static const struct merge *find_merge(const struct bpe *p, int a, int b)
{
    for (uint32_t i = merge_slot((uint32_t)a, (uint32_t)b, p->mask);; i = (i + 1) & p->mask) {
        const struct merge *m = &p->m[i];
        if (m->rank < 0) return NULL;
        if (m->a == (uint32_t)a && m->b == (uint32_t)b) return m;
    }
}

static int load_merges(struct tokenizer *t, struct bpe *p, const struct gguf *g, char *err)
{
    const struct gguf_kv *kv;
    if (!gguf_find(g, "tokenizer.ggml.merges"))
        return errmsg_set(err, "tokenizer.ggml.merges: missing (a \"gpt2\" vocabulary needs its "
                               "merges)");
    if (gguf_get_arr(g, "tokenizer.ggml.merges", GGUF_STRING, &kv, err) < 0) return -1;
    uint64_t n = kv->v.arr.n;
    if (n > (1u << 26))
        return errmsg_set(err, "tokenizer.ggml.merges: %llu merges", (unsigned long long)n);
    uint32_t cap = 16;
    while (cap < n + n / 2 + 1) cap <<= 1;
    p->m = malloc((size_t)cap * sizeof *p->m);
    if (!p->m)
        return errmsg_set(err, "tokenizer: out of memory for %llu merges", (unsigned long long)n);
    for (uint32_t i = 0; i < cap; i++) p->m[i].rank = -1;
    p->mask = cap - 1;
    const uint8_t *q = kv->v.arr.data;
    for (uint64_t r = 0; r < n; r++) {
        struct gguf_str s;
        q = gguf_next_str(q, &s);
        /* "A B": the parts split at the first space after the first byte */
        const char *sp = s.len > 1 ? memchr(s.p + 1, ' ', s.len - 1) : NULL;
        if (!sp || s.len > (1u << 20)) continue;
        int la = (int)(sp - s.p), lb = (int)(s.len - (uint64_t)la - 1);
        int a = tokenizer_find(t, s.p, (size_t)la), b = tokenizer_find(t, sp + 1, (size_t)lb);
        int id = tokenizer_find2(t, s.p, la, sp + 1, lb);
        if (a < 0 || b < 0 || id < 0) continue;
        uint32_t i = merge_slot((uint32_t)a, (uint32_t)b, p->mask);
        while (p->m[i].rank >= 0 && !(p->m[i].a == (uint32_t)a && p->m[i].b == (uint32_t)b))
            i = (i + 1) & p->mask;
        if (p->m[i].rank >= 0) continue; /* the first (lowest) rank of a pair wins */
        p->m[i] = (struct merge){(uint32_t)a, (uint32_t)b, (int32_t)r, id};
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Decoding tables */

/* llama.cpp's llama_decode_text: each character of the piece back to its byte. With out NULL,
 * only the length. */
static size_t decode_text(const struct bpe *p, const char *s, size_t n, char *out)
{
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp = unicode_decode((const uint8_t *)s, n, &i);
        if (cp < 0x144 && p->byte_of[cp] >= 0) {
            if (out) out[o] = (char)p->byte_of[cp];
            o++;
            continue;
        }
        uint8_t u[4];
        int ul = unicode_encode(cp, u);
        if (out) {
            memcpy(out + o, "[UNK_BYTE_0x", 12);
            for (int k = 0; k < ul; k++) snprintf(out + o + 12 + 2 * k, 3, "%02x", u[k]);
            memcpy(out + o + 12 + 2 * ul, s, n);
            out[o + 12 + 2 * ul + n] = ']';
        }
        o += 12 + 2 * (size_t)ul + n + 1;
    }
    return o;
}

static int build_dec(struct tokenizer *t, struct bpe *p, char *err)
{
    size_t bytes = 0;
    for (int i = 0; i < t->vocab_size; i++) {
        size_t n = (size_t)t->piece_len[i];
        bytes += (t->type[i] == TOKT_NORMAL ? decode_text(p, t->pieces[i], n, NULL) : n) + 1;
        if (bytes > (1u << 30))
            return errmsg_set(err, "tokenizer: token %d: the pieces decode to over 1 GiB", i);
    }
    t->dec = calloc((size_t)t->vocab_size, sizeof *t->dec);
    t->dec_len = calloc((size_t)t->vocab_size, sizeof *t->dec_len);
    p->dec_blob = malloc(bytes);
    if (!t->dec || !t->dec_len || !p->dec_blob)
        return errmsg_set(err, "tokenizer: out of memory for the decoding tables");
    char *o = p->dec_blob;
    for (int i = 0; i < t->vocab_size; i++) {
        t->dec[i] = o;
        switch (t->type[i]) {
        case TOKT_NORMAL:
            t->dec_len[i] = (int)decode_text(p, t->pieces[i], (size_t)t->piece_len[i], o);
            break;
        case TOKT_USER_DEFINED:
            memcpy(o, t->pieces[i], (size_t)t->piece_len[i]);
            t->dec_len[i] = t->piece_len[i];
            break;
        default: /* control and unknown render only on request; unused, byte: nothing */
            t->dec_len[i] = 0;
        }
        o[t->dec_len[i]] = 0;
        o += t->dec_len[i] + 1;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Loading */

int bpe_load(struct tokenizer *t, const struct gguf *g, int pre, int ignore_merges, char *err)
{
    struct bpe *p = calloc(1, sizeof *p);
    if (!p) return errmsg_set(err, "tokenizer: out of memory");
    t->bpe = p;
    p->pre = pre;
    p->ignore_merges = ignore_merges;
    byte_table(p);
    for (int b = 0; b < 256; b++) p->byte_id[b] = tokenizer_find(t, p->chr[b], p->chr_len[b]);
    if (load_merges(t, p, g, err) < 0) return -1;
    return build_dec(t, p, err);
}

void bpe_free(struct tokenizer *t)
{
    if (t->bpe) {
        free(t->bpe->m);
        free(t->bpe->dec_blob);
    }
    free(t->bpe);
    free(t->dec);
    free(t->dec_len);
    t->bpe = NULL;
    t->dec = NULL;
    t->dec_len = NULL;
}

/* ---------------------------------------------------------------------------------------------
 * Encoding */

struct cand {
    uint64_t key; /* rank above, left below: the smallest key merges first */
    int left, right, id_l, id_r, id;
};

/* Buffers for one stretch, grown to its longest word. */
struct work {
    uint8_t *wb;           /* the word's bytes */
    char *gs;              /* the word in GPT-2 characters (ignore_merges) */
    int *id, *prev, *next; /* symbols */
    struct cand *heap;
    size_t cap; /* bytes of the longest word they hold */
};

static int work_grow(struct work *w, size_t need)
{
    if (need <= w->cap) return 0;
    size_t cap = need < 64 ? 64 : need;
    uint8_t *wb = realloc(w->wb, cap);
    if (wb) w->wb = wb;
    char *gs = realloc(w->gs, 2 * cap + 1);
    if (gs) w->gs = gs;
    int *id = realloc(w->id, cap * sizeof *id);
    if (id) w->id = id;
    int *pv = realloc(w->prev, cap * sizeof *pv);
    if (pv) w->prev = pv;
    int *nx = realloc(w->next, cap * sizeof *nx);
    if (nx) w->next = nx;
    struct cand *h = realloc(w->heap, 3 * cap * sizeof *h);
    if (h) w->heap = h;
    if (!wb || !gs || !id || !pv || !nx || !h) return -1;
    w->cap = cap;
    return 0;
}

static void heap_push(struct cand *h, int *n, struct cand c)
{
    int i = (*n)++;
    while (i > 0) {
        int p = (i - 1) / 2;
        if (h[p].key <= c.key) break;
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
        if (c + 1 < *n && h[c + 1].key < h[c].key) c++;
        if (last.key <= h[c].key) break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0) h[i] = last;
    return top;
}

static void try_pair(const struct bpe *p, struct work *w, int l, int *nh)
{
    if (l < 0) return;
    int r = w->next[l];
    if (r < 0 || w->id[l] < 0 || w->id[r] < 0) return;
    const struct merge *m = find_merge(p, w->id[l], w->id[r]);
    if (!m) return;
    heap_push(w->heap, nh,
              (struct cand){(uint64_t)(uint32_t)m->rank << 32 | (uint32_t)l, l, r, w->id[l],
                            w->id[r], m->id});
}

static void emit(int id, int *out, int cap, int *o)
{
    if (*o < cap) out[*o] = id;
    (*o)++;
}

/* One word of nb bytes in w->wb. */
static void encode_word(const struct tokenizer *t, const struct bpe *p, struct work *w, int nb,
                        int *out, int cap, int *o)
{
    if (nb == 1 && p->byte_id[w->wb[0]] >= 0) {
        emit(p->byte_id[w->wb[0]], out, cap, o);
        return;
    }
    if (p->ignore_merges) {
        size_t gl = 0;
        for (int i = 0; i < nb; i++) {
            memcpy(w->gs + gl, p->chr[w->wb[i]], p->chr_len[w->wb[i]]);
            gl += p->chr_len[w->wb[i]];
        }
        int id = tokenizer_find(t, w->gs, gl);
        if (id >= 0) {
            emit(id, out, cap, o);
            return;
        }
    }
    for (int i = 0; i < nb; i++) {
        w->id[i] = p->byte_id[w->wb[i]];
        w->prev[i] = i - 1;
        w->next[i] = i + 1 < nb ? i + 1 : -1;
    }
    int nh = 0;
    for (int i = 0; i + 1 < nb; i++) try_pair(p, w, i, &nh);
    while (nh > 0) {
        struct cand c = heap_pop(w->heap, &nh);
        /* stale if either side has merged since the candidate was pushed */
        if (w->id[c.left] != c.id_l || w->next[c.left] != c.right || w->id[c.right] != c.id_r)
            continue;
        w->id[c.left] = c.id;
        int r = w->next[c.right];
        w->next[c.left] = r;
        if (r >= 0) w->prev[r] = c.left;
        w->id[c.right] = -2;
        w->next[c.right] = w->prev[c.right] = -2; /* dead */
        try_pair(p, w, w->prev[c.left], &nh);
        try_pair(p, w, c.left, &nh);
    }
    for (int i = 0; i >= 0; i = w->next[i])
        if (w->id[i] >= 0) emit(w->id[i], out, cap, o);
}

int bpe_encode(const struct tokenizer *t, const char *text, size_t len, int *out, int cap, int *o,
               char *err)
{
    if (len == 0) return 0;
    const struct bpe *p = t->bpe;
    uint32_t *cps = malloc(len * sizeof *cps);
    uint8_t *fl = malloc(len);
    int *ends = malloc(len * sizeof *ends);
    int *tmp = p->pre == PRETOK_DEFAULT ? malloc(len * sizeof *tmp) : NULL;
    struct work w = {0};
    int rc = 0;
    if (!cps || !fl || !ends || (p->pre == PRETOK_DEFAULT && !tmp)) {
        rc = errmsg_set(err, "tokenizer: out of memory for %zu bytes of text", len);
        goto out;
    }
    int n = 0;
    for (size_t i = 0; i < len;) {
        cps[n] = unicode_decode((const uint8_t *)text, len, &i);
        fl[n] = (uint8_t)unicode_flags(cps[n]);
        n++;
    }
    int nw = pretok_split((enum pretok)p->pre, cps, fl, n, ends, tmp);
    for (int k = 0, s = 0; k < nw; s = ends[k++]) {
        size_t need = 4 * (size_t)(ends[k] - s);
        if (work_grow(&w, need) < 0) {
            rc = errmsg_set(err, "tokenizer: out of memory for a word of %zu bytes", need);
            goto out;
        }
        int nb = 0;
        for (int i = s; i < ends[k]; i++) nb += unicode_encode(cps[i], w.wb + nb);
        encode_word(t, p, &w, nb, out, cap, o);
    }
out:
    free(cps);
    free(fl);
    free(ends);
    free(tmp);
    free(w.wb);
    free(w.gs);
    free(w.id);
    free(w.prev);
    free(w.next);
    free(w.heap);
    return rc;
}
