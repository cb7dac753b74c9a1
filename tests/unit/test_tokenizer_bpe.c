/* Byte-level BPE (GGUF model "gpt2") on a small vocabulary made here: pre-tokenizer cuts written
 * out from the regexes, merges by rank, ignore_merges, special tokens with and without
 * parse_special, add_bos/add_eos, the end-of-generation set, decoding as the exact inverse
 * (invalid UTF-8 read as llama.cpp reads it) and streaming across a character split over tokens,
 * the Unicode tables, and load errors. The real vocabularies (Llama 3, Qwen, Mistral Nemo) are
 * checked against llama.cpp and the npm tokenizers in tests/integration/tokenizer_exact.sh. */
#include "check.h"
#include "os/common/errmsg.h"
#include "serving/api/utf8.h"
#include "serving/engine/gguf.h"
#include "serving/engine/pretokenize.h"
#include "serving/engine/tokenizer.h"
#include "serving/engine/unicode.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char err[ERRMSG_LEN];

/* ---------------------------------------------------------------------------------------------
 * Pre-tokenizers */

/* The words of text under p, joined with '|' (text is UTF-8). */
static const char *cut(enum pretok p, const char *text)
{
    static char out[4096];
    uint32_t cps[512];
    uint8_t fl[512];
    int ends[512], tmp[512], n = 0;
    size_t len = strlen(text), i = 0, starts[513];
    while (i < len) {
        starts[n] = i;
        cps[n] = unicode_decode((const uint8_t *)text, len, &i);
        fl[n] = (uint8_t)unicode_flags(cps[n]);
        n++;
    }
    starts[n] = len;
    int nw = pretok_split(p, cps, fl, n, ends, tmp);
    size_t o = 0;
    for (int w = 0, s = 0; w < nw; s = ends[w++]) {
        if (w) out[o++] = '|';
        size_t a = starts[s], b = starts[ends[w]];
        memcpy(out + o, text + a, b - a);
        o += b - a;
    }
    out[o] = 0;
    return out;
}

#define CUT(p, text, want) CHECK_STR(cut(p, text), want)

TEST(llama3_cuts)
{
    CUT(PRETOK_LLAMA3, "Hello world", "Hello| world");
    /* contractions are case-insensitive; the apostrophe starts its own word */
    CUT(PRETOK_LLAMA3, "I'VE it's they'Re", "I|'VE| it|'s| they|'Re");
    CUT(PRETOK_LLAMA3, "'sup", "'s|up");
    /* digits in threes */
    CUT(PRETOK_LLAMA3, "1234567 x12", "123|456|7| x|12");
    /* a non-letter, non-digit, non-newline char leads letters */
    CUT(PRETOK_LLAMA3, "\tab.cd", "\tab|.cd");
    /* whitespace: \s+(?!\S) leaves the last space to the next word */
    CUT(PRETOK_LLAMA3, "a   b", "a|  | b");
    CUT(PRETOK_LLAMA3, "a   ", "a|   ");
    /* \s*[\r\n]+ ends at the last newline of the run */
    CUT(PRETOK_LLAMA3, "a \n\n  b", "a| \n\n| | b");
    CUT(PRETOK_LLAMA3, "x  \n", "x|  \n");
    /*  ?[^\s\p{L}\p{N}]+[\r\n]* */
    CUT(PRETOK_LLAMA3, "a ... !!\n\nb", "a| ...| !!\n\n|b");
    /* beyond ASCII: letters, numbers (fullwidth digits, superscripts), U+3000 as space */
    CUT(PRETOK_LLAMA3, "\xc3\xa9t\xc3\xa9 \xef\xbc\x91\xef\xbc\x92\xef\xbc\x93\xef\xbc\x94",
        "\xc3\xa9t\xc3\xa9| |\xef\xbc\x91\xef\xbc\x92\xef\xbc\x93|\xef\xbc\x94");
    CUT(PRETOK_LLAMA3,
        "a\xe3\x80\x80\xe3\x80\x80"
        "b",
        "a|\xe3\x80\x80|\xe3\x80\x80"
        "b");
    /* U+0085 is White_Space (llama.cpp), U+FEFF is not */
    CUT(PRETOK_LLAMA3,
        "a\xc2\x85\xc2\x85"
        "b",
        "a|\xc2\x85|\xc2\x85"
        "b");
    CUT(PRETOK_LLAMA3,
        "a\xef\xbb\xbf\xef\xbb\xbf"
        "b",
        "a|\xef\xbb\xbf\xef\xbb\xbf|b");
}

TEST(qwen2_cuts)
{
    CUT(PRETOK_QWEN2, "1234567 x12", "1|2|3|4|5|6|7| x|1|2");
    CUT(PRETOK_QWEN2, "I'LL go", "I|'LL| go");
}

TEST(gpt2_cuts)
{
    /* case-sensitive contractions; a space leads letters, digits or punctuation */
    CUT(PRETOK_GPT2, "I'VE it's 12345 ..x", "I|'|VE| it|'s| 12345| ..|x");
    CUT(PRETOK_GPT2, "a \n\n  b", "a| \n\n | b");
}

TEST(tekken_cuts)
{
    /* UPPER*LOWER+ | UPPER+LOWER*, single digits, '/' joins punctuation runs */
    CUT(PRETOK_TEKKEN, "HTTPServer XMLHttpRequest", "HTTPServer| XMLHttp|Request");
    CUT(PRETOK_TEKKEN, "helloWorld ABC 123", "hello|World| ABC| |1|2|3");
    CUT(PRETOK_TEKKEN, "a//b\n/", "a|//|b|\n|/");
    CUT(PRETOK_TEKKEN, "a?\n/b", "a|?\n/|b");
    /* as llama.cpp runs it: a letter beyond ASCII is both upper and lower, marks are not letters */
    CUT(PRETOK_TEKKEN, "\xd0\xbf\xd1\x80\xd0\xb8\xd0\x92\xd0\x95\xd0\xa2",
        "\xd0\xbf\xd1\x80\xd0\xb8\xd0\x92\xd0\x95\xd0\xa2");
    CUT(PRETOK_TEKKEN, "e\xcc\x81t", "e|\xcc\x81t");
    CUT(PRETOK_TEKKEN,
        "AB\xc3\x89"
        "c",
        "AB\xc3\x89"
        "c");
}

TEST(default_cuts)
{
    /* punctuation runs apart first, then gpt2, then digit runs, then ASCII digits in threes */
    CUT(PRETOK_DEFAULT, "a+b 1234567,x", "a|+|b| |123|456|7|,|x");
    CUT(PRETOK_DEFAULT, "it's", "it|'|s");
}

TEST(unicode_tables)
{
    CHECK_EQ_INT(unicode_category('A'), UC_Lu);
    CHECK_EQ_INT(unicode_category(0xE9), UC_Ll);
    CHECK_EQ_INT(unicode_category(0x301), UC_Mn);
    CHECK_EQ_INT(unicode_category(0x663), UC_Nd);
    CHECK_EQ_INT(unicode_category(0x2163), UC_Nl);
    CHECK_EQ_INT(unicode_category(0x1F600), UC_So);
    CHECK_EQ_INT(unicode_category(0xFEFF), UC_Cf);
    CHECK_EQ_INT(unicode_category(0x10FFFF), UC_Cn);
    CHECK_EQ_INT(unicode_category(0x110000), UC_Cn);
    CHECK_EQ_INT(unicode_category(0x2EBF0), UC_Lo); /* CJK Extension I: Unicode 15.1 */
    CHECK_EQ_INT(unicode_category(0x1C89), UC_Cn);  /* Unicode 16.0: not in llama.cpp's tables */
    CHECK(unicode_flags(0x2028) & UF_SPACE);
    CHECK(unicode_flags(0x85) & UF_SPACE);
    CHECK(!(unicode_flags(0xFEFF) & UF_SPACE));
    CHECK(!(unicode_flags(0x1C) & UF_SPACE));
    for (uint32_t c = 0; c < 0x80; c++) { /* the ASCII fast path agrees with the tables */
        enum unicode_cat k = unicode_category(c);
        unsigned f = k >= UC_Lu && k <= UC_Lo   ? UF_LETTER
                     : k >= UC_Nd && k <= UC_No ? UF_NUMBER
                     : k >= UC_Pc && k <= UC_Po ? UF_PUNCT
                     : k >= UC_Sm && k <= UC_So ? UF_SYMBOL
                                                : 0;
        CHECK_EQ_INT(unicode_flags(c) & ~UF_SPACE, f);
    }
    CHECK_EQ_INT(unicode_flags('$'), UF_SYMBOL);
    CHECK_EQ_INT(unicode_flags('_'), UF_PUNCT);
    /* llama.cpp's reading of bytes */
    size_t i = 0;
    CHECK_EQ_INT(unicode_decode((const uint8_t *)"\xc1\x81", 2, &i), 'A'); /* overlong */
    CHECK_EQ_INT(i, 2);
    i = 0;
    CHECK_EQ_INT(unicode_decode((const uint8_t *)"\xed\xa0\x80", 3, &i), 0xD800);
    i = 0;
    CHECK_EQ_INT(unicode_decode((const uint8_t *)"\xf4\x90\x80\x80", 4, &i), 0xFFFD);
    CHECK_EQ_INT(i, 1);
    i = 0;
    CHECK_EQ_INT(unicode_decode((const uint8_t *)"\xe2\x82", 2, &i), 0xFFFD);
    CHECK_EQ_INT(i, 1);
}

/* ---------------------------------------------------------------------------------------------
 * A small vocabulary: the 256 byte characters (id = byte), merged words, special tokens */

static const char *const MERGES[] = {
    "h e", "l l",          "he ll", "hell o",         "\xc4\xa0 w",
    "o r", "\xc4\xa0w or", "l d",   "\xc4\xa0wor ld", "x y",
};
enum {
    HE = 256,
    LL,
    HELL,
    HELLO,
    GW,
    OR,
    GWOR,
    LD,
    GWORLD,
    XY,
    XYZ, /* a token no merge reaches */
    BOT,
    EOT_TEXT,
    EOT_ID,
    IM_END,
    THINK,
    FIM_PAD,
    UNUSED,
    NV
};

static char chr[256][3];

static void byte_chars(void)
{
    int next = 256;
    for (int b = 0; b < 256; b++) {
        int cp = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE ? b : next++;
        if (cp < 0x80)
            chr[b][0] = (char)cp, chr[b][1] = 0;
        else
            chr[b][0] = (char)(0xC0 | cp >> 6), chr[b][1] = (char)(0x80 | (cp & 0x3F)),
            chr[b][2] = 0;
    }
}

struct vocab {
    struct tokenizer t;
    struct gguf g;
    char *buf;
};

/* pre: tokenizer.ggml.pre or NULL; add_bos/add_eos: -1 absent. */
static int make(struct vocab *v, const char *model, const char *pre, int add_bos, int add_eos,
                int with_merges)
{
    byte_chars();
    const char *tok[NV];
    int32_t type[NV];
    for (int b = 0; b < 256; b++) tok[b] = chr[b], type[b] = 1;
    const char *words[] = {"he",
                           "ll",
                           "hell",
                           "hello",
                           "\xc4\xa0w",
                           "or",
                           "\xc4\xa0wor",
                           "ld",
                           "\xc4\xa0world",
                           "xy",
                           "xyz",
                           "<|begin_of_text|>",
                           "<|end_of_text|>",
                           "<|eot_id|>",
                           "<|im_end|>",
                           "<think>",
                           "<|fim_pad|>",
                           "[PAD274]"};
    int32_t types[] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 3, 3, 3, 1, 4, 1, 5};
    for (int k = HE; k < NV; k++) tok[k] = words[k - HE], type[k] = types[k - HE];
    struct gguf_writer *w = gguf_writer_new();
    gguf_w_str(w, "tokenizer.ggml.model", model);
    if (pre) gguf_w_str(w, "tokenizer.ggml.pre", pre);
    gguf_w_arr_str(w, "tokenizer.ggml.tokens", tok, NV);
    gguf_w_arr_i32(w, "tokenizer.ggml.token_type", type, NV);
    if (with_merges)
        gguf_w_arr_str(w, "tokenizer.ggml.merges", MERGES, sizeof MERGES / sizeof *MERGES);
    gguf_w_u32(w, "tokenizer.ggml.bos_token_id", BOT);
    gguf_w_u32(w, "tokenizer.ggml.eos_token_id", EOT_TEXT);
    uint8_t b;
    if (add_bos >= 0)
        b = (uint8_t)add_bos, gguf_w_val(w, "tokenizer.ggml.add_bos_token", GGUF_BOOL, &b);
    if (add_eos >= 0)
        b = (uint8_t)add_eos, gguf_w_val(w, "tokenizer.ggml.add_eos_token", GGUF_BOOL, &b);
    size_t len;
    FILE *f = open_memstream(&v->buf, &len);
    int rc = gguf_writer_write(w, f, err);
    fclose(f);
    gguf_writer_free(w);
    if (rc == 0) rc = gguf_parse(&v->g, v->buf, len, err);
    if (rc == 0 && (rc = tokenizer_from_gguf(&v->t, &v->g, err)) < 0) gguf_free(&v->g);
    if (rc < 0) free(v->buf);
    return rc;
}

static void drop(struct vocab *v)
{
    tokenizer_free(&v->t);
    gguf_free(&v->g);
    free(v->buf);
}

/* ids of text as a string "1 2 3" */
static const char *ids_of(const struct tokenizer *t, const char *text, size_t len, int special,
                          int add)
{
    static char out[8192];
    int ids[1024], n;
    struct tok_span sp = {text, len, special};
    if (tokenizer_encode_spans(t, &sp, 1, add, ids, 1024, &n, err) < 0) return err;
    size_t o = 0;
    out[0] = 0;
    for (int i = 0; i < n; i++)
        o += (size_t)snprintf(out + o, sizeof out - o, i ? " %d" : "%d", ids[i]);
    return out;
}

static char want[256];
#define WANT(...) (snprintf(want, sizeof want, __VA_ARGS__), want)

TEST(merges_by_rank)
{
    struct vocab v;
    CHECKF(make(&v, "gpt2", "qwen2", -1, -1, 1) == 0, "%s", err);
    /* "hello" merges h+e, l+l, he+ll, hell+o; " world" Ġ+w, o+r, Ġw+or, l+d, Ġwor+ld */
    CHECK_STR(ids_of(&v.t, "hello world", 11, 0, 0), WANT("%d %d", HELLO, GWORLD));
    /* no merge for "xyz" as a whole: xy + z */
    CHECK_STR(ids_of(&v.t, "xyz", 3, 0, 0), WANT("%d %d", XY, 'z'));
    /* a character without a token: its bytes */
    CHECK_STR(ids_of(&v.t, "\xc3\xa9", 2, 0, 0), "195 169");
    drop(&v);
}

TEST(ignore_merges_and_add_bos)
{
    struct vocab v;
    /* llama-bpe: a word that is a token is that token; BOS added by default */
    CHECKF(make(&v, "gpt2", "llama-bpe", -1, -1, 1) == 0, "%s", err);
    CHECK_STR(ids_of(&v.t, "xyz", 3, 0, 1), WANT("%d %d", BOT, XYZ));
    CHECK(v.t.add_bos == 1 && v.t.add_eos == 0);
    drop(&v);
    /* the file's add_bos_token / add_eos_token win */
    CHECKF(make(&v, "gpt2", "llama-bpe", 0, 1, 1) == 0, "%s", err);
    CHECK_STR(ids_of(&v.t, "xy", 2, 0, 1), WANT("%d %d", XY, EOT_TEXT));
    drop(&v);
    /* qwen2: no BOS unless the file says so */
    CHECKF(make(&v, "gpt2", "qwen2", -1, -1, 1) == 0, "%s", err);
    CHECK_STR(ids_of(&v.t, "xy", 2, 0, 1), WANT("%d", XY));
    drop(&v);
}

TEST(special_tokens_and_eog)
{
    struct vocab v;
    CHECKF(make(&v, "gpt2", "llama-bpe", 0, -1, 1) == 0, "%s", err);
    const char *s = "hello<|eot_id|><think><|im_end|>";
    /* parse_special: control tokens become their ids (<|im_end|> is one by its text) */
    CHECK_STR(ids_of(&v.t, s, strlen(s), 1, 0), WANT("%d %d %d %d", HELLO, EOT_ID, THINK, IM_END));
    /* plain text: control tokens stay text, user-defined ones are cut out (llama.cpp) */
    const char *plain = ids_of(&v.t, s, strlen(s), 0, 0);
    CHECK(strstr(plain, WANT(" %d ", THINK)) && !strstr(plain, WANT("%d", EOT_ID)));
    /* the end-of-generation set: eos, <|eot_id|>, <|im_end|>, <|fim_pad|> */
    CHECK_EQ_INT(v.t.n_eog, 4);
    CHECK(tokenizer_is_eog(&v.t, EOT_TEXT) && tokenizer_is_eog(&v.t, EOT_ID) &&
          tokenizer_is_eog(&v.t, IM_END) && tokenizer_is_eog(&v.t, FIM_PAD));
    CHECK(!tokenizer_is_eog(&v.t, BOT) && !tokenizer_is_eog(&v.t, THINK) &&
          !tokenizer_is_eog(&v.t, -1) && !tokenizer_is_eog(&v.t, NV));
    CHECK_EQ_INT(v.t.eot_id, EOT_ID);
    /* decoding: control tokens are nothing unless rendered, user-defined ones their text */
    char sc[4];
    size_t l;
    const char *p = tokenizer_decode(&v.t, -1, EOT_ID, sc, &l);
    CHECK(l == 0);
    p = tokenizer_decode_ex(&v.t, -1, EOT_ID, TOK_RENDER_SPECIAL, sc, &l);
    CHECK(l == 10 && !memcmp(p, "<|eot_id|>", 10));
    p = tokenizer_decode(&v.t, -1, THINK, sc, &l);
    CHECK(l == 7 && !memcmp(p, "<think>", 7));
    p = tokenizer_decode(&v.t, -1, GWORLD, sc, &l);
    CHECK(l == 6 && !memcmp(p, " world", 6));
    p = tokenizer_decode(&v.t, -1, UNUSED, sc, &l);
    CHECK(l == 0);
    drop(&v);
}

/* What llama.cpp tokenizes for bytes s: each code point as it reads them, written back. */
static size_t llama_read(const uint8_t *s, size_t n, uint8_t *out)
{
    size_t o = 0;
    for (size_t i = 0; i < n;) o += (size_t)unicode_encode(unicode_decode(s, n, &i), out + o);
    return o;
}

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static uint32_t rnd(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

TEST(decode_is_the_inverse)
{
    struct vocab v;
    CHECKF(make(&v, "gpt2", "llama-bpe", 0, -1, 1) == 0, "%s", err);
    static const char *const bits[] = {"hello",
                                       " world",
                                       "\xc3\xa9",
                                       "\xf0\x9f\x98\x80",
                                       " ",
                                       "\n",
                                       "12",
                                       "\x80",
                                       "\xff",
                                       "\xc3",
                                       "\xed\xa0\x80",
                                       "\xc1\x81",
                                       "\xf4\x90\x80\x80",
                                       "'s",
                                       "\t",
                                       "\xe2\x80\xa8"};
    uint8_t text[512], norm[2048];
    char got[4096];
    int ids[2048], n;
    for (int iter = 0; iter < 2000; iter++) {
        size_t len = 0;
        for (int k = (int)(rnd() % 12); k >= 0; k--) {
            const char *b = bits[rnd() % (sizeof bits / sizeof *bits)];
            memcpy(text + len, b, strlen(b));
            len += strlen(b);
        }
        CHECK(tokenizer_encode(&v.t, (char *)text, len, 0, ids, 2048, &n, err) == 0);
        size_t gl = 0;
        for (int i = 0; i < n; i++) {
            char sc[4];
            size_t l;
            const char *p = tokenizer_decode(&v.t, i ? ids[i - 1] : -1, ids[i], sc, &l);
            memcpy(got + gl, p, l);
            gl += l;
        }
        size_t nl = llama_read(text, len, norm);
        CHECKF(gl == nl && !memcmp(got, norm, nl), "iteration %d: %zu bytes back, want %zu", iter,
               gl, nl);
    }
    drop(&v);
}

TEST(streamed_characters_stay_whole)
{
    /* an emoji is four byte tokens here: the streamer holds its partial bytes back */
    struct vocab v;
    CHECKF(make(&v, "gpt2", "llama-bpe", 0, -1, 1) == 0, "%s", err);
    const char *s = "a\xf0\x9f\x98\x80\xc3\xa9 hello";
    int ids[64], n;
    CHECK(tokenizer_encode(&v.t, s, strlen(s), 0, ids, 64, &n, err) == 0);
    CHECK(n >= 7);
    char buf[64];
    size_t len = 0, sent = 0;
    char out[64];
    size_t ol = 0;
    for (int i = 0; i < n; i++) {
        char sc[4];
        size_t l;
        const char *p = tokenizer_decode(&v.t, i ? ids[i - 1] : -1, ids[i], sc, &l);
        memcpy(buf + len, p, l);
        len += l;
        size_t upto = utf8_complete_prefix(buf, len);
        CHECK(upto >= sent);
        CHECK(utf8_valid(buf + sent, upto - sent));
        memcpy(out + ol, buf + sent, upto - sent);
        ol += upto - sent;
        sent = upto;
    }
    CHECK(sent == len && ol == strlen(s) && !memcmp(out, s, ol));
    drop(&v);
}

TEST(load_errors)
{
    struct vocab v;
    CHECK(make(&v, "gpt2", "falcon", -1, -1, 1) < 0);
    CHECK_STR(err,
              "tokenizer.ggml.pre \"falcon\" is not supported (supported: llama-bpe, llama3, "
              "llama-v3, pixtral, smaug-bpe, dbrx, qwen2, deepseek-r1-qwen, megrez, stablelm2, "
              "tekken, gpt-2, default)");
    /* smaug-bpe: llama3's cuts without ignore_merges or a default BOS */
    CHECKF(make(&v, "gpt2", "smaug-bpe", -1, -1, 1) == 0, "%s", err);
    CHECK_STR(ids_of(&v.t, "xyz", 3, 0, 1), WANT("%d %d", XY, 'z'));
    drop(&v);
    CHECK(make(&v, "gpt2", "qwen2", -1, -1, 0) < 0);
    CHECK_STR(err, "tokenizer.ggml.merges: missing (a \"gpt2\" vocabulary needs its merges)");
    CHECK(make(&v, "t5", NULL, -1, -1, 1) < 0);
    CHECK_STR(err, "tokenizer.ggml.model \"t5\" is not supported (supported: \"llama\" "
                   "(SentencePiece), \"gpt2\" (byte-level BPE))");
    /* no pre-tokenizer: llama.cpp's default */
    CHECKF(make(&v, "gpt2", NULL, -1, -1, 1) == 0, "%s", err);
    CHECK_STR(ids_of(&v.t, "hello world", 11, 0, 1), WANT("%d %d", HELLO, GWORLD));
    drop(&v);
}

TEST(capacity)
{
    struct vocab v;
    CHECKF(make(&v, "gpt2", "qwen2", -1, -1, 1) == 0, "%s", err);
    int ids[2], n = -1;
    CHECK(tokenizer_encode(&v.t, "hello world x", 13, 0, ids, 2, &n, err) < 0);
    CHECK_STR(err, "tokenizer: text needs 4 tokens, room for 2");
    CHECK_EQ_INT(n, 4);
    CHECK(tokenizer_encode(&v.t, "", 0, 0, NULL, 0, &n, err) == 0 && n == 0);
    drop(&v);
}

int main(void)
{
    RUN(llama3_cuts);
    RUN(qwen2_cuts);
    RUN(gpt2_cuts);
    RUN(tekken_cuts);
    RUN(default_cuts);
    RUN(unicode_tables);
    RUN(merges_by_rank);
    RUN(ignore_merges_and_add_bos);
    RUN(special_tokens_and_eog);
    RUN(decode_is_the_inverse);
    RUN(streamed_characters_stay_whole);
    RUN(load_errors);
    RUN(capacity);
    CHECK_DONE();
}
