/* pretokenize: byte-level BPE pre-tokenizers as hand-written matchers. See pretokenize.h. */
#include "serving/engine/pretokenize.h"

#include "serving/engine/unicode.h"

#include <string.h>

/* The names llama.cpp gives these pre-tokenizers, with its defaults for the vocabulary. */
static const struct {
    const char *name;
    enum pretok p;
    int ignore_merges, add_bos;
} names[] = {
    {"llama-bpe", PRETOK_LLAMA3, 1, 1}, {"llama3", PRETOK_LLAMA3, 1, 1},
    {"llama-v3", PRETOK_LLAMA3, 1, 1},  {"pixtral", PRETOK_LLAMA3, 1, 1},
    {"smaug-bpe", PRETOK_LLAMA3, 0, 0}, {"dbrx", PRETOK_LLAMA3, 0, 0},
    {"qwen2", PRETOK_QWEN2, 0, 0},      {"deepseek-r1-qwen", PRETOK_QWEN2, 0, 0},
    {"megrez", PRETOK_QWEN2, 0, 0},     {"stablelm2", PRETOK_QWEN2, 0, 0},
    {"tekken", PRETOK_TEKKEN, 1, 1},    {"gpt-2", PRETOK_GPT2, 0, 0},
    {"default", PRETOK_DEFAULT, 0, 0},
};

int pretok_by_name(const char *name, size_t len, int *ignore_merges, int *add_bos)
{
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strlen(names[i].name) == len && memcmp(names[i].name, name, len) == 0) {
            *ignore_merges = names[i].ignore_merges;
            *add_bos = names[i].add_bos;
            return (int)names[i].p;
        }
    return -1;
}

const char *pretok_names(void)
{
    return "llama-bpe, llama3, llama-v3, pixtral, smaug-bpe, dbrx, qwen2, deepseek-r1-qwen, "
           "megrez, stablelm2, tekken, gpt-2, default";
}

/* ---------------------------------------------------------------------------------------------
 * Shared pieces of the regexes. A matcher sees [0, n): positions past n have no class at all. */

struct text {
    const uint32_t *cp;
    const uint8_t *fl;
    int n;
};

static int is_crlf(uint32_t c)
{
    return c == '\r' || c == '\n';
}

static uint32_t ascii_lower(uint32_t c)
{
    return c >= 'A' && c <= 'Z' ? c + 32 : c;
}

/* (?i:'s|'t|'re|'ve|'m|'ll|'d) at p (icase = 0: the lower-case letters only): its end, or -1. */
static int contraction(const struct text *t, int p, int icase)
{
    if (t->cp[p] != '\'' || p + 1 >= t->n) return -1;
    uint32_t a = icase ? ascii_lower(t->cp[p + 1]) : t->cp[p + 1];
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return p + 2;
    if (p + 2 >= t->n) return -1;
    uint32_t b = icase ? ascii_lower(t->cp[p + 2]) : t->cp[p + 2];
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return p + 3;
    return -1;
}

/* [^\s\p{L}\p{N}] */
static int is_other(const struct text *t, int p)
{
    return p < t->n && !(t->fl[p] & (UF_SPACE | UF_LETTER | UF_NUMBER));
}

/*  ?[^\s\p{L}\p{N}]+ followed by any run of the characters in tail (NUL-terminated ASCII): its
 * end, or -1. */
static int punct_run(const struct text *t, int p, const char *tail)
{
    int q = t->cp[p] == ' ' ? p + 1 : p;
    if (!is_other(t, q)) return -1;
    while (is_other(t, q)) q++;
    while (q < t->n && t->cp[q] < 0x80 && t->cp[q] && strchr(tail, (int)t->cp[q])) q++;
    return q;
}

/* \s*[\r\n]+|\s+(?!\S)|\s+ at p: the end of the first that matches, or -1 (no space at p). */
static int space_run(const struct text *t, int p, int newline_alt)
{
    int q = p, last_nl = -1;
    while (q < t->n && (t->fl[q] & UF_SPACE)) {
        if (is_crlf(t->cp[q])) last_nl = q + 1;
        q++;
    }
    if (q == p) return -1;
    /* \s*[\r\n]+: \s* backs off to the last CR/LF of the run, which [\r\n]+ takes alone */
    if (newline_alt && last_nl > 0) return last_nl;
    /* \s+(?!\S): all of a run that ends the text, else all but its last space (if any remain) */
    if (q < t->n && q - p > 1) return q - 1;
    return q; /* \s+ */
}

/* ---------------------------------------------------------------------------------------------
 * llama3 / qwen2 */

static int split_llama3(const struct text *t, int max_digits, int *ends)
{
    int nw = 0;
    for (int p = 0; p < t->n;) {
        uint32_t c = t->cp[p];
        uint8_t f = t->fl[p];
        int e = contraction(t, p, 1);
        /* [^\r\n\p{L}\p{N}]?\p{L}+ */
        if (e < 0 && !is_crlf(c) && !(f & UF_NUMBER) &&
            ((f & UF_LETTER) || (p + 1 < t->n && (t->fl[p + 1] & UF_LETTER)))) {
            e = p + 1;
            while (e < t->n && (t->fl[e] & UF_LETTER)) e++;
        }
        /* \p{N}{1,3}: a run of digits goes out in groups of max_digits */
        if (e < 0 && (f & UF_NUMBER)) {
            e = p + 1;
            while (e < t->n && e - p < max_digits && (t->fl[e] & UF_NUMBER)) e++;
        }
        if (e < 0) e = punct_run(t, p, "\r\n");
        if (e < 0) e = space_run(t, p, 1);
        if (e < 0) e = p + 1; /* unreachable: every class is matched above */
        ends[nw++] = p = e;
    }
    return nw;
}

/* ---------------------------------------------------------------------------------------------
 * tekken, as llama.cpp's std::regex runs its adaptation of Mistral's regex on text where every
 * code point outside ASCII is replaced by its class */

static int is_letter(const struct text *t, int p)
{
    return p < t->n && (t->fl[p] & UF_LETTER);
}
static int is_upper(const struct text *t, int p) /* (?=[\p{L}])[^a-z] */
{
    return is_letter(t, p) && !(t->cp[p] >= 'a' && t->cp[p] <= 'z');
}
static int is_lower(const struct text *t, int p) /* (?=[\p{L}])[^A-Z] */
{
    return is_letter(t, p) && !(t->cp[p] >= 'A' && t->cp[p] <= 'Z');
}

/* UPPER*LOWER+ from s: its end, or -1. UPPER* takes its run, then gives characters back until
 * LOWER+ can start: where the run stops (a-z next), else at its last non-ASCII letter. */
static int upper_lower(const struct text *t, int s)
{
    int u = s;
    while (is_upper(t, u)) u++;
    int k = u;
    if (!is_lower(t, k))
        for (k = u - 1; k >= s && !is_lower(t, k); k--) {
        }
    if (k < s) return -1;
    int e = k + 1;
    while (is_lower(t, e)) e++;
    return e;
}

static int split_tekken(const struct text *t, int *ends)
{
    int nw = 0;
    for (int p = 0; p < t->n;) {
        uint32_t c = t->cp[p];
        uint8_t f = t->fl[p];
        int lead = !is_crlf(c) && !(f & (UF_LETTER | UF_NUMBER)); /* [^\r\n\p{L}\p{N}]? */
        int e = upper_lower(t, p + lead);
        if (e < 0 && is_upper(t, p + lead)) { /* UPPER+LOWER* */
            e = p + lead;
            while (is_upper(t, e)) e++;
            while (is_lower(t, e)) e++;
        }
        if (e < 0 && (f & UF_NUMBER)) e = p + 1;
        if (e < 0) e = punct_run(t, p, "\r\n/");
        if (e < 0) e = space_run(t, p, 1);
        if (e < 0) e = p + 1;
        ends[nw++] = p = e;
    }
    return nw;
}

/* ---------------------------------------------------------------------------------------------
 * gpt2 (llama.cpp's matcher of 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|
 * \s+(?!\S), with \s+ for what is left) and the default chain */

static int split_gpt2(const struct text *t, int *ends)
{
    int nw = 0;
    for (int p = 0; p < t->n;) {
        int e = contraction(t, p, 0);
        int q = t->cp[p] == ' ' ? p + 1 : p;
        uint8_t f2 = q < t->n ? t->fl[q] : 0;
        if (e < 0 && q < t->n && (f2 & (UF_LETTER | UF_NUMBER))) {
            uint8_t cls = f2 & UF_LETTER ? UF_LETTER : UF_NUMBER;
            e = q + 1;
            while (e < t->n && (t->fl[e] & cls)) e++;
        }
        if (e < 0) e = punct_run(t, p, "");
        if (e < 0) e = space_run(t, p, 0);
        if (e < 0) e = p + 1;
        ends[nw++] = p = e;
    }
    return nw;
}

/* [\p{P}$+<=>^~|] as llama.cpp matches it: on ASCII its own list of punctuation (everything
 * printable but letters, digits, space and `), beyond ASCII the category P (a space is not). */
static int default_punct(uint32_t c, uint8_t f)
{
    if (c < 0x80) return c > 0x20 && c < 0x7F && c != '`' && !(f & (UF_LETTER | UF_NUMBER));
    return (f & UF_PUNCT) && !(f & UF_SPACE);
}

/* Apply one splitting pass to the words ends[0..nw): each word [s, e) is cut by cut(), which
 * writes its own ends; returns the new count. The words move to tmp while being cut. */
static int refine(const struct text *t, int *ends, int nw, int *tmp,
                  int (*cut)(const struct text *, int, int, int *))
{
    memcpy(tmp, ends, (size_t)nw * sizeof *ends);
    int out = 0;
    for (int i = 0, s = 0; i < nw; s = tmp[i++]) out += cut(t, s, tmp[i], ends + out);
    return out;
}

/* A regex of runs (class run) applied to [s, e): matches and the gaps between them are words. */
static int cut_runs(const struct text *t, int s, int e, int *ends, int which)
{
    int n = 0;
    for (int p = s; p < e;) {
        int q = p;
        if (which == 0)
            while (q < e && default_punct(t->cp[q], t->fl[q])) q++;
        else
            while (q < e && (t->fl[q] & UF_NUMBER)) q++;
        if (q == p) /* a gap: up to the next match */
            while (q < e &&
                   !(which == 0 ? default_punct(t->cp[q], t->fl[q]) : (t->fl[q] & UF_NUMBER) != 0))
                q++;
        ends[n++] = p = q;
    }
    return n;
}
static int cut_punct(const struct text *t, int s, int e, int *ends)
{
    return cut_runs(t, s, e, ends, 0);
}
static int cut_numbers(const struct text *t, int s, int e, int *ends)
{
    return cut_runs(t, s, e, ends, 1);
}
static int cut_gpt2(const struct text *t, int s, int e, int *ends)
{
    struct text sub = {t->cp + s, t->fl + s, e - s};
    int n = split_gpt2(&sub, ends);
    for (int i = 0; i < n; i++) ends[i] += s;
    return n;
}
/* [0-9][0-9][0-9]: leftmost non-overlapping triples of ASCII digits, the rest between them */
static int cut_triples(const struct text *t, int s, int e, int *ends)
{
    int n = 0, gap = s;
    for (int p = s; p + 3 <= e;) {
        int d = 0;
        while (d < 3 && t->cp[p + d] >= '0' && t->cp[p + d] <= '9') d++;
        if (d < 3) {
            p += d + 1;
            continue;
        }
        if (p > gap) ends[n++] = p;
        ends[n++] = gap = p + 3;
        p += 3;
    }
    if (gap < e) ends[n++] = e;
    return n;
}

static int split_default(const struct text *t, int *ends, int *tmp)
{
    if (t->n == 0) return 0;
    ends[0] = t->n;
    int nw = refine(t, ends, 1, tmp, cut_punct);
    nw = refine(t, ends, nw, tmp, cut_gpt2);
    nw = refine(t, ends, nw, tmp, cut_numbers);
    return refine(t, ends, nw, tmp, cut_triples);
}

int pretok_split(enum pretok p, const uint32_t *cps, const uint8_t *fl, int n, int *ends, int *tmp)
{
    struct text t = {cps, fl, n};
    switch (p) {
    case PRETOK_LLAMA3:
        return split_llama3(&t, 3, ends);
    case PRETOK_QWEN2:
        return split_llama3(&t, 1, ends);
    case PRETOK_TEKKEN:
        return split_tekken(&t, ends);
    case PRETOK_GPT2:
        return split_gpt2(&t, ends);
    case PRETOK_DEFAULT:
        return split_default(&t, ends, tmp);
    }
    return 0;
}
