/* tok_spm: SentencePiece-style BPE, llama2.c semantics. See tok_spm.h for the contract. */
#include "serving/engine/tok_spm.h"

#include "os/common/errmsg.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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
    int id = tokenizer_find2(t, t->pieces[a], t->piece_len[a], t->pieces[b], t->piece_len[b]);
    /* llama2.c starts its search at -1e10 with a strict '>': lower (or NaN) scores never merge. */
    if (id < 0 || !(t->scores[id] > -1e10f)) return;
    heap_push(h, nh, (struct cand){cand_key(t->scores[id], l), l, r, a, b, id});
}

int spm_encode(const struct tokenizer *t, const char *text, size_t len, int *out, int cap, int *o,
               char *err)
{
    if (len > (size_t)(INT32_MAX / 4))
        return errmsg_set(err, "tokenizer: text of %zu bytes is too long", len);
    /* llama.cpp cuts the text into units after escaping each ' ' as U+2581 (e2 96 81), the
     * vocabulary's spelling of a space: on invalid UTF-8 a unit can end inside an escaped space,
     * so the units are cut from the escaped text. At most one symbol per escaped byte, plus the
     * dummy prefix. */
    size_t elen = 0;
    for (size_t i = 0; i < len; i++) elen += text[i] == ' ' ? 3 : 1;
    size_t max_syms = elen + 1;
    struct sym *s = malloc(max_syms * sizeof *s);
    struct cand *h = malloc(3 * max_syms * sizeof *h);
    char *esc = malloc(elen + 1);
    if (!s || !h || !esc) {
        free(s);
        free(h);
        free(esc);
        return errmsg_set(err, "tokenizer: out of memory for %zu bytes of text", len);
    }
    for (size_t i = 0, k = 0; i < len; i++) {
        if (text[i] == ' ')
            esc[k++] = (char)0xe2, esc[k++] = (char)0x96, esc[k++] = (char)0x81;
        else
            esc[k++] = text[i];
    }
    int ns = 0;
#define PUSH(tok)     (s[ns].id = (tok), s[ns].prev = ns - 1, s[ns].next = ns + 1, ns++)
#define BYTE_TOKEN(c) (t->byte_ids[(uint8_t)(c)] >= 0 ? t->byte_ids[(uint8_t)(c)] : t->unk_id)
    if (len > 0 && t->add_space_prefix) {
        int sp = tokenizer_find2(t, " ", 1, "", 0);
        PUSH(sp >= 0 ? sp : BYTE_TOKEN(' '));
    }
    for (size_t i = 0; i < elen;) {
        /* One unit: as many bytes as the lead byte announces (1 for ASCII and for a stray
         * continuation byte, 2 for 110xxxxx, 3 for 1110xxxx, 4 for 1111xxxx), cut at the end of
         * the text, whatever the bytes after it are: llama.cpp's segmentation (llama2.c ended a
         * unit at the next byte that is not a continuation byte; the same on valid UTF-8). */
        static const uint8_t unit_len[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
        size_t j = i + unit_len[(uint8_t)esc[i] >> 4];
        if (j > elen) j = elen;
        /* The unit in the vocabulary's spelling here: whole escaped spaces back to ' '. */
        char key[4];
        int kl = 0;
        for (size_t k = i; k < j; k++) {
            if (k + 3 <= j && !memcmp(esc + k, "\xe2\x96\x81", 3)) {
                key[kl++] = ' ';
                k += 2;
            } else
                key[kl++] = esc[k];
        }
        int id = tokenizer_find2(t, key, kl, "", 0);
        if (id >= 0)
            PUSH(id);
        else
            for (size_t k = i; k < j; k++) PUSH(BYTE_TOKEN(esc[k]));
        i = j;
    }
    free(esc);
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
    for (int i = ns ? 0 : -1; i >= 0; i = s[i].next) {
        if (*o < cap) out[*o] = s[i].id;
        (*o)++;
    }
    free(s);
    free(h);
    return 0;
}
