/* Tokenizer: reference ids (from tests/tools/ref_tokenize.py, a literal transcription of llama2.c's
 * encode), agreement with a naive in-test llama2.c encoder on random text, UTF-8 round trips,
 * GGUF round trip, errors. */
#include "os/common/errmsg.h"
#include "serving/engine/convert.h"
#include "serving/engine/tokenizer.h"
#include "tests/unit/check.h"

#include <stdint.h>
#include <time.h>

static char err[ERRMSG_LEN];
static struct tokenizer t512, t32k;
static int loaded = -1;

static int load_one(struct tokenizer *t, const char *name)
{
    char p[512];
    uint8_t *buf;
    size_t n;
    snprintf(p, sizeof p, "%s/models/%s", check_shared(), name);
    if (convert_read_file(p, &buf, &n, err) < 0) return -1;
    int rc = tokenizer_from_llama2c(t, buf, n, 0, err);
    free(buf);
    return rc;
}

#define NEED_VOCABS()                                                                              \
    do {                                                                                           \
        if (loaded < 0)                                                                            \
            loaded = load_one(&t512, "tok512.bin") == 0 && load_one(&t32k, "tokenizer.bin") == 0;  \
        if (!loaded) SKIP("test data missing: %s", err);                                           \
    } while (0)

/* Keep in sync with CASES in tests/tools/ref_tokenize.py. */
static const char *const cases[] = {
    "Once upon a time",
    "Hello world",
    "",
    " leading space",
    "trailing space ",
    "  double  spaces",
    "Lily's ball was red, blue and green!",
    "\n newline\ttab",
    "na\xc3\xafve caf\xc3\xa9",
    "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xae\xe3\x83\x86\xe3\x82\xad\xe3\x82\xb9\xe3\x83"
    "\x88",
    "emoji \xf0\x9f\x98\x80\xf0\x9f\x9a\x80",
    "\xff\xfe abc \x80\x80\x80\x80\x80 x",
    "A\x80",
    "12345 67.89",
    "aaaaaaaaaaaaaaaa",
    "One day, a little girl named Lily found a needle in her room.",
};
#define N_CASES (int)(sizeof cases / sizeof cases[0])

/* python3 tests/tools/ref_tokenize.py ../shared/models/tok512.bin */
static const int ref512[N_CASES][32] = {
    {1, 403, 407, 261, 378},
    {1, 346, 306, 414, 263, 304, 341},
    {1},
    {1, 410, 278, 411, 380, 299, 262, 427, 412, 331},
    {1, 259, 420, 412, 290, 299, 262, 427, 412, 331, 410},
    {1, 410, 410, 279, 277, 430, 305, 410, 262, 427, 412, 331, 419},
    {1, 317, 439, 419, 268, 388, 286, 352, 266, 432, 268, 421, 425, 411, 269, 298, 276, 302, 443},
    {1, 410, 13, 404, 424, 421, 271, 411, 12, 413, 412, 430},
    {1, 297, 412, 198, 178, 360, 280, 412, 431, 485},
    {1,   410, 233, 154, 168, 233, 159, 175, 235, 173, 161, 230, 132,
     177, 230, 134, 137, 230, 133, 176, 230, 133, 188, 230, 134, 139},
    {1, 344, 423, 414, 449, 417, 410, 243, 162, 155, 131, 243, 162, 157, 131},
    {1, 410, 258, 257, 229, 153, 132, 412, 430, 429, 410, 131, 131, 131, 131, 131, 410, 444},
    {1, 410, 447, 131},
    {1, 410, 475, 479, 472, 484, 480, 410, 490, 491, 426, 487, 483},
    {1, 261, 412, 412, 412, 412, 412, 412, 412, 412, 412, 412, 412, 412, 412, 412, 412},
    {1,   385, 328, 432, 261, 376, 298, 315, 421, 395, 317, 272,
     277, 264, 261, 404, 266, 305, 322, 311, 352, 414, 287, 426},
};

/* python3 tests/tools/ref_tokenize.py ../shared/models/tokenizer.bin */
static const int ref32k[N_CASES][32] = {
    {1, 9038, 2501, 263, 931},
    {1, 15043, 3186},
    {1},
    {1, 29871, 8236, 2913},
    {1, 25053, 2913, 29871},
    {1, 259, 3765, 29871, 8162},
    {1, 365, 2354, 29915, 29879, 8287, 471, 2654, 29892, 7254, 322, 7933, 29991},
    {1, 29871, 13, 25899, 12, 3891},
    {1, 1055, 30085, 345, 274, 28059},
    {1, 29871, 30325, 30346, 30968, 30199, 30572, 30454, 30255, 30279},
    {1, 953, 29877, 2397, 29871, 243, 162, 155, 131, 243, 162, 157, 131},
    {1, 29871, 258, 257, 229, 153, 132, 10736, 29871, 131, 131, 131, 131, 131, 921},
    {1, 319, 131},
    {1, 29871, 29896, 29906, 29941, 29946, 29945, 29871, 29953, 29955, 29889, 29947, 29929},
    {1, 263, 27137, 27137, 27137, 7340, 29874},
    {1, 3118, 2462, 29892, 263, 2217, 7826, 4257, 365, 2354, 1476, 263, 817, 280, 297, 902, 5716,
     29889},
};

static int ref_len(const int *r)
{
    int n = 1;
    while (n < 32 && r[n]) n++;
    return n;
}

static void check_refs(const struct tokenizer *t, const int (*ref)[32], const char *vocab)
{
    int out[256], n;
    for (int c = 0; c < N_CASES; c++) {
        CHECKF(tokenizer_encode(t, cases[c], strlen(cases[c]), 1, out, 256, &n, err) == 0, "%s",
               err);
        int rn = ref_len(ref[c]);
        CHECKF(n == rn, "%s case %d: %d tokens, expected %d", vocab, c, n, rn);
        for (int i = 0; i < n; i++)
            CHECKF(out[i] == ref[c][i], "%s case %d token %d: %d, expected %d", vocab, c, i, out[i],
                   ref[c][i]);
    }
}

TEST(reference_ids_tok512)
{
    NEED_VOCABS();
    check_refs(&t512, ref512, "tok512");
}

TEST(reference_ids_tokenizer_bin)
{
    NEED_VOCABS();
    check_refs(&t32k, ref32k, "tokenizer.bin");
}

/* Cross-check of a few reference ids by reading the pieces themselves. */
TEST(reference_ids_by_hand)
{
    NEED_VOCABS();
    CHECK_STR(t512.pieces[403], " Once");
    CHECK_STR(t512.pieces[407], " upon");
    CHECK_STR(t512.pieces[261], " a");
    CHECK_STR(t512.pieces[378], " time");
    CHECK_STR(t32k.pieces[9038], " Once");
    CHECK_STR(t32k.pieces[15043], " Hello");
    CHECK_STR(t32k.pieces[3186], " world");
    CHECK_STR(t32k.pieces[29871], " ");
    CHECK_STR(t32k.pieces[68], "<0x41>"); /* byte fallback: 'A' + 3 */
    CHECK_STR(t32k.pieces[131], "<0x80>");
    CHECK_EQ_INT(t32k.byte_ids[0x41], 68);
    CHECK_EQ_INT(t512.byte_ids[0xff], 258);
    CHECK_EQ_INT(t32k.bos_id, 1);
    CHECK_EQ_INT(t32k.eos_id, 2);
}

/* llama2.c's encode, transcribed naively (linear lookup, rescans), for random cross-checks, with
 * llama.cpp's segmentation of invalid UTF-8 (spaces escaped as U+2581, then a unit is as long as
 * its lead byte announces). */
static int naive_lookup(const struct tokenizer *t, const char *s, size_t n)
{
    for (int i = 0; i < t->vocab_size; i++)
        if ((size_t)t->piece_len[i] == n && memcmp(t->pieces[i], s, n) == 0) return i;
    return -1;
}

static int naive_encode(const struct tokenizer *t, const char *text, size_t len, int *tok)
{
    int n = 0;
    if (len) tok[n++] = naive_lookup(t, " ", 1);
    char esc[3 * 160];
    size_t el = 0;
    for (size_t i = 0; i < len && el + 3 <= sizeof esc; i++) {
        if (text[i] == ' ')
            memcpy(esc + el, "\xe2\x96\x81", 3), el += 3;
        else
            esc[el++] = text[i];
    }
    for (size_t i = 0; i < el;) {
        uint8_t c = (uint8_t)esc[i];
        size_t bl = c < 0xC0 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
        if (bl > el - i) bl = el - i;
        char key[4];
        size_t kl = 0;
        for (size_t k = i; k < i + bl; k++)
            if (k + 3 <= i + bl && !memcmp(esc + k, "\xe2\x96\x81", 3))
                key[kl++] = ' ', k += 2;
            else
                key[kl++] = esc[k];
        int id = naive_lookup(t, key, kl);
        if (id >= 0)
            tok[n++] = id;
        else
            for (size_t k = i; k < i + bl; k++) tok[n++] = (uint8_t)esc[k] + 3;
        i += bl;
    }
    char cat[512];
    for (;;) {
        float best = -1e10f;
        int best_id = -1, best_i = -1;
        for (int i = 0; i + 1 < n; i++) {
            int la = t->piece_len[tok[i]], lb = t->piece_len[tok[i + 1]];
            if (la + lb > (int)sizeof cat) continue;
            memcpy(cat, t->pieces[tok[i]], (size_t)la);
            memcpy(cat + la, t->pieces[tok[i + 1]], (size_t)lb);
            int id = naive_lookup(t, cat, (size_t)(la + lb));
            if (id >= 0 && t->scores[id] > best) best = t->scores[id], best_id = id, best_i = i;
        }
        if (best_i < 0) break;
        tok[best_i] = best_id;
        memmove(tok + best_i + 1, tok + best_i + 2, (size_t)(n - best_i - 2) * sizeof *tok);
        n--;
    }
    return n;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

/* Text mixing vocabulary pieces, ASCII, multi-byte UTF-8 and invalid bytes. */
static size_t random_text(const struct tokenizer *t, char *s, size_t cap)
{
    size_t n = 0, want = rnd() % (cap / 2);
    while (n < want) {
        uint32_t k = rnd() % 6;
        if (k < 3) { /* a piece of the vocabulary */
            int id = (int)(rnd() % (uint32_t)t->vocab_size);
            if ((size_t)t->piece_len[id] + n >= cap || t->pieces[id][0] == '<' ||
                t->pieces[id][0] == '\n')
                continue;
            memcpy(s + n, t->pieces[id], (size_t)t->piece_len[id]);
            n += (size_t)t->piece_len[id];
        } else if (k == 3)
            s[n++] = (char)(' ' + rnd() % 95);
        else if (k == 4 && n + 4 < cap) { /* a code point, 2 to 4 bytes */
            static const char *const cps[] = {"\xc3\xa9", "\xe6\x97\xa5", "\xf0\x9f\x98\x80",
                                              "\xe2\x80\x94", "\xd0\xb4"};
            const char *c = cps[rnd() % 5];
            memcpy(s + n, c, strlen(c));
            n += strlen(c);
        } else
            s[n++] = (char)(0x80 + rnd() % 128); /* stray continuation / lead bytes */
    }
    return n;
}

TEST(matches_naive_llama2c_on_random_text)
{
    NEED_VOCABS();
    const struct tokenizer *ts[2] = {&t512, &t32k};
    char text[160];
    int a[400], b[400], n;
    for (int v = 0; v < 2; v++)
        for (int iter = 0; iter < (v ? 60 : 1500); iter++) {
            size_t len = random_text(ts[v], text, sizeof text);
            CHECKF(tokenizer_encode(ts[v], text, len, 0, a, 400, &n, err) == 0, "%s", err);
            int m = naive_encode(ts[v], text, len, b);
            CHECKF(n == m, "vocab %d iter %d: %d tokens vs naive %d", v, iter, n, m);
            for (int i = 0; i < n; i++)
                CHECKF(a[i] == b[i], "vocab %d iter %d token %d", v, iter, i);
        }
}

/* A vocabulary with spaces inside pieces ("a b") disables the word split: the global merge order
 * must still match llama2.c, ties included. */
TEST(vocab_with_inner_spaces_matches_naive)
{
    static uint8_t img[8192];
    size_t n = 4;
    uint32_t maxlen = 8;
    memcpy(img, &maxlen, 4);
#define ADD(piece, score)                                                                          \
    do {                                                                                           \
        float sc_ = (score);                                                                       \
        int32_t l_ = (int32_t)strlen(piece);                                                       \
        memcpy(img + n, &sc_, 4), memcpy(img + n + 4, &l_, 4), memcpy(img + n + 8, piece, l_);     \
        n += 8 + (size_t)l_;                                                                       \
    } while (0)
    ADD("<unk>", 0);
    ADD("\n<s>\n", 0);
    ADD("\n</s>\n", 0);
    for (int b = 0; b < 256; b++) {
        char bp[8];
        snprintf(bp, sizeof bp, "<0x%02X>", b);
        ADD(bp, 0);
    }
    const char *pieces[] = {"a", "b", " ", "a b", " a", "b ", "ab", "ba", " b", "a a", "  ", "aa"};
    const float scores[] = {-1, -1, -1, -2, -3, -2, -3, -4, -2, -3, -5, -2};
    for (int i = 0; i < 12; i++) ADD(pieces[i], scores[i]);
#undef ADD
    struct tokenizer t;
    CHECKF(tokenizer_from_llama2c(&t, img, n, 0, err) == 0, "%s", err);
    CHECK_EQ_INT(t.space_split, 0);
    char text[64];
    int a[128], b[128], na;
    for (int iter = 0; iter < 3000; iter++) {
        size_t len = rnd() % 40;
        for (size_t i = 0; i < len; i++) text[i] = "ab c"[rnd() % 4];
        CHECK(tokenizer_encode(&t, text, len, 0, a, 128, &na, err) == 0);
        int nb = naive_encode(&t, text, len, b);
        CHECKF(na == nb, "iter %d: %d tokens vs naive %d", iter, na, nb);
        for (int i = 0; i < na; i++) CHECKF(a[i] == b[i], "iter %d token %d", iter, i);
    }
    tokenizer_free(&t);
    NEED_VOCABS();
    CHECK_EQ_INT(t512.space_split, 1);
    CHECK_EQ_INT(t32k.space_split, 1);
}

static void decode_all(const struct tokenizer *t, const int *ids, int n, char *out, size_t *len)
{
    size_t o = 0;
    for (int i = 0; i < n; i++) {
        char scratch[4];
        size_t l;
        const char *p = tokenizer_decode(t, i ? ids[i - 1] : -1, ids[i], scratch, &l);
        memcpy(out + o, p, l);
        o += l;
    }
    *len = o;
}

/* Decoding inverts encoding byte for byte, except where invalid UTF-8 cut a unit inside a space:
 * llama.cpp cuts units after spelling spaces U+2581 (e2 96 81), so such a space comes back as
 * that spelling's bytes, as it does from llama.cpp. Compare with every e2 96 81 read as ' '. */
static size_t unescape_spaces(char *s, size_t n)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++)
        if (i + 3 <= n && !memcmp(s + i, "\xe2\x96\x81", 3))
            s[o++] = ' ', i += 2;
        else
            s[o++] = s[i];
    return o;
}

TEST(round_trip_utf8_and_invalid_bytes)
{
    NEED_VOCABS();
    const struct tokenizer *ts[2] = {&t512, &t32k};
    char text[200], back[1024];
    int ids[400], n;
    size_t bl;
    for (int v = 0; v < 2; v++) {
        for (int c = 0; c < N_CASES; c++) {
            size_t len = strlen(cases[c]);
            CHECK(tokenizer_encode(ts[v], cases[c], len, 1, ids, 400, &n, err) == 0);
            decode_all(ts[v], ids, n, back, &bl);
            memcpy(text, cases[c], len);
            size_t tl = unescape_spaces(text, len);
            bl = unescape_spaces(back, bl);
            CHECKF(bl == tl && memcmp(back, text, tl) == 0, "vocab %d case %d", v, c);
        }
        for (int iter = 0; iter < 500; iter++) {
            size_t len = rnd() % 100;
            for (size_t i = 0; i < len; i++) text[i] = (char)(1 + rnd() % 255);
            if (iter % 2) len = random_text(ts[v], text, sizeof text);
            CHECK(tokenizer_encode(ts[v], text, len, 1, ids, 400, &n, err) == 0);
            decode_all(ts[v], ids, n, back, &bl);
            len = unescape_spaces(text, len);
            bl = unescape_spaces(back, bl);
            CHECKF(bl == len && memcmp(back, text, len) == 0, "vocab %d iter %d", v, iter);
        }
    }
}

TEST(empty_and_capacity)
{
    NEED_VOCABS();
    int ids[4], n = -1;
    CHECK(tokenizer_encode(&t512, "", 0, 1, ids, 4, &n, err) == 0 && n == 1 && ids[0] == 1);
    CHECK(tokenizer_encode(&t512, "", 0, 0, ids, 4, &n, err) == 0 && n == 0);
    CHECK(tokenizer_encode(&t512, "", 0, 0, NULL, 0, &n, err) == 0 && n == 0);
    CHECK(tokenizer_encode(&t32k, "Once upon a time", 16, 1, ids, 4, &n, err) < 0);
    CHECK_STR(err, "tokenizer: text needs 5 tokens, room for 4");
    CHECK_EQ_INT(n, 5);
    /* Embedded NUL bytes are text like any other byte (byte fallback). */
    CHECK(tokenizer_encode(&t32k, "a\0b", 3, 0, ids, 4, &n, err) == 0);
    CHECK(n == 3 && ids[1] == 3);
}

TEST(decode_specials)
{
    NEED_VOCABS();
    char s[4];
    size_t l;
    const char *p = tokenizer_decode(&t32k, -1, 1, s, &l);
    CHECK(l == 0);
    p = tokenizer_decode(&t32k, 5, 2, s, &l);
    CHECK(l == 0);
    p = tokenizer_decode(&t32k, 5, 32000, s, &l);
    CHECK(l == 0);
    p = tokenizer_decode(&t32k, 5, -7, s, &l);
    CHECK(l == 0);
    p = tokenizer_decode(&t32k, 1, 15043, s, &l); /* leading space dropped after BOS */
    CHECK(l == 5 && !memcmp(p, "Hello", 5));
    p = tokenizer_decode(&t32k, 100, 15043, s, &l);
    CHECK(l == 6 && !memcmp(p, " Hello", 6));
    p = tokenizer_decode(&t32k, 100, 13, s, &l); /* <0x0A> */
    CHECK(l == 1 && p[0] == '\n');
    p = tokenizer_decode(&t32k, 100, 0, s, &l);
    CHECK(l == 5 && !memcmp(p, "<unk>", 5));
}

TEST(gguf_round_trip)
{
    NEED_VOCABS();
    struct gguf_writer *w = gguf_writer_new();
    CHECK(convert_put_tokenizer(w, &t32k) == 0);
    char *buf = NULL;
    size_t len;
    FILE *f = open_memstream(&buf, &len);
    CHECK(gguf_writer_write(w, f, err) == 0);
    fclose(f);
    gguf_writer_free(w);
    struct gguf g;
    CHECKF(gguf_parse(&g, buf, len, err) == 0, "%s", err);
    struct tokenizer t;
    CHECKF(tokenizer_from_gguf(&t, &g, err) == 0, "%s", err);
    CHECK_EQ_INT(t.vocab_size, 32000);
    CHECK_STR(t.pieces[1], "<s>");
    CHECK_STR(t.pieces[15043], " Hello");
    int a[300], b[300], n, m;
    for (int c = 0; c < N_CASES; c++) {
        CHECK(tokenizer_encode(&t, cases[c], strlen(cases[c]), 1, a, 300, &n, err) == 0);
        CHECK(tokenizer_encode(&t32k, cases[c], strlen(cases[c]), 1, b, 300, &m, err) == 0);
        CHECK(n == m && !memcmp(a, b, (size_t)n * sizeof *a));
    }
    tokenizer_free(&t);
    gguf_free(&g);
    free(buf);
}

TEST(load_errors)
{
    uint8_t buf[64] = {0};
    struct tokenizer t;
    CHECK(tokenizer_from_llama2c(&t, buf, 2, 0, err) < 0);
    CHECK_STR(err, "tokenizer: file of 2 bytes is too short");
    int32_t len = 100;
    memcpy(buf + 8, &len, 4);
    CHECK(tokenizer_from_llama2c(&t, buf, 20, 0, err) < 0);
    CHECK_STR(err, "tokenizer: token 0 at byte 4: length 100 exceeds the 8 bytes left");
    len = 2;
    memcpy(buf + 8, &len, 4);
    CHECK(tokenizer_from_llama2c(&t, buf, 14, 0, err) == 0 && t.vocab_size == 1);
    tokenizer_free(&t);
    CHECK(tokenizer_from_llama2c(&t, buf, 14, 3, err) < 0);
    CHECK_STR(err, "tokenizer: has 1 tokens, the model needs 3");
    CHECK(tokenizer_from_llama2c(&t, buf, 15, 0, err) < 0);
    CHECK_STR(err, "tokenizer: truncated at byte 14 (token 1)");
    struct gguf_writer *w = gguf_writer_new();
    gguf_w_str(w, "tokenizer.ggml.model", "bert");
    char *out = NULL;
    size_t n;
    FILE *f = open_memstream(&out, &n);
    CHECK(gguf_writer_write(w, f, err) == 0);
    fclose(f);
    gguf_writer_free(w);
    struct gguf g;
    CHECK(gguf_parse(&g, out, n, err) == 0);
    CHECK(tokenizer_from_gguf(&t, &g, err) < 0);
    CHECK_STR(err, "tokenizer.ggml.model \"bert\" is not supported (supported: \"llama\" "
                   "(SentencePiece), \"gpt2\" (byte-level BPE))");
    gguf_free(&g);
    free(out);
}

TEST(encode_speed)
{
    NEED_VOCABS();
    /* ~2000 tokens of story text; the figure is printed, never a pass/fail criterion. */
    static char text[16384];
    const char *para = "Once upon a time, there was a little girl named Lily. She loved to play "
                       "outside in the park. One day, she saw a big, red ball. ";
    size_t n = 0;
    while (n + strlen(para) < 9000) {
        memcpy(text + n, para, strlen(para));
        n += strlen(para);
    }
    static int ids[8192];
    int cnt;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int i = 0; i < 10; i++)
        CHECK(tokenizer_encode(&t32k, text, n, 1, ids, 8192, &cnt, err) == 0);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double ms = ((double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) / 1e6) / 10;
    fprintf(stderr, "# encode: %zu bytes -> %d tokens in %.3f ms (32000-token vocab)\n", n, cnt,
            ms);
    CHECK(cnt > 1500);
}

int main(void)
{
    RUN(reference_ids_tok512);
    RUN(reference_ids_tokenizer_bin);
    RUN(reference_ids_by_hand);
    RUN(matches_naive_llama2c_on_random_text);
    RUN(vocab_with_inner_spaces_matches_naive);
    RUN(round_trip_utf8_and_invalid_bytes);
    RUN(empty_and_capacity);
    RUN(decode_specials);
    RUN(gguf_round_trip);
    RUN(load_errors);
    RUN(encode_speed);
    if (loaded > 0) {
        tokenizer_free(&t512);
        tokenizer_free(&t32k);
    }
    CHECK_DONE();
}
