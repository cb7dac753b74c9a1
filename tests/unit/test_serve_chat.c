/* Chat prompts down to token ids, as llama.cpp's server builds them: the template rendered as
 * llm_chat_apply_template does, then tokenized with parse_special, so the template's marker
 * strings become control tokens where the vocabulary has them (and message content never does).
 *
 * With the real Llama-2 vocabulary (../shared/models/tokenizer.bin through a GGUF, so BOS/EOS are
 * control tokens and "[INST]" is plain text), the official Llama-2-chat template gives exactly the
 * ids published for meta-llama/Llama-2-7b-chat-hf. With a synthetic vocabulary holding ChatML
 * markers as control tokens, every id is known by hand. */
#include "bpe_vocab.h"
#include "check.h"
#include "os/common/errmsg.h"
#include "serving/api/chat_template.h"
#include "serving/engine/convert.h"
#include "serving/engine/gguf.h"
#include "serving/engine/tokenizer.h"

#include <cjson/cJSON.h>
#include <stdint.h>

static char err[ERRMSG_LEN];

/* A tokenizer through a GGUF image, as `strata serve` loads one. */
static int via_gguf(struct gguf_writer *w, struct tokenizer *t, struct gguf *g, char **buf)
{
    size_t len;
    FILE *f = open_memstream(buf, &len);
    if (!f || gguf_writer_write(w, f, err)) return -1;
    fclose(f);
    gguf_writer_free(w);
    if (gguf_parse(g, *buf, len, err)) return -1;
    return tokenizer_from_gguf(t, g, err);
}

static struct tokenizer t32k;
static struct gguf g32k;
static char *b32k;
static int have32k = -1;

static void need_llama2_vocab(void)
{
    if (have32k < 0) {
        char p[512];
        uint8_t *buf;
        size_t n;
        struct tokenizer raw;
        snprintf(p, sizeof p, "%s/models/tokenizer.bin", check_shared());
        have32k = 0;
        if (convert_read_file(p, &buf, &n, err) == 0) {
            int rc = tokenizer_from_llama2c(&raw, buf, n, 0, err);
            free(buf);
            if (rc == 0) {
                struct gguf_writer *w = gguf_writer_new();
                have32k =
                    convert_put_tokenizer(w, &raw) == 0 && via_gguf(w, &t32k, &g32k, &b32k) == 0;
                tokenizer_free(&raw);
            }
        }
    }
    /* ../shared is part of the test setup: its absence is a failure, not a skip */
    CHECKF(have32k, "the Llama-2 vocabulary: %s", err);
}

/* Render and tokenize as the server does (BOS added). */
static int chat_ids(const struct tokenizer *t, enum chat_template tmpl,
                    const struct chat_message *m, int nm, int *out, int cap)
{
    struct chat_rendered r;
    if (chat_template_render_spans(tmpl, m, nm, 1, &r)) return -1;
    struct tok_span sp[64];
    for (int i = 0; i < r.n_spans; i++)
        sp[i] = (struct tok_span){r.text + r.spans[i].off, r.spans[i].len, r.spans[i].marker};
    int n = -1;
    if (tokenizer_encode_spans(t, sp, r.n_spans, 1, out, cap, &n, err)) n = -1;
    chat_rendered_free(&r);
    return n;
}

#define CHECK_IDS(got, n, ...)                                                                     \
    do {                                                                                           \
        const int want_[] = {__VA_ARGS__};                                                         \
        int nw_ = (int)(sizeof want_ / sizeof want_[0]);                                           \
        char g_[2048] = "";                                                                        \
        for (int i_ = 0; i_ < (n) && strlen(g_) < 2000; i_++)                                      \
            snprintf(g_ + strlen(g_), sizeof g_ - strlen(g_), "%d ", (got)[i_]);                   \
        CHECKF((n) == nw_ && !memcmp((got), want_, sizeof want_), "got %d ids: %s", (n), g_);      \
    } while (0)

/* The official Llama-2-chat Jinja template (it has <<SYS>>, bos_token + '[INST] ' and
 * content.strip(), so llama.cpp picks its llama2-sys-strip variant). */
static const char LLAMA2_CHAT_JINJA[] =
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set "
    "system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set "
    "system_message = false %}{% endif %}{% for message in loop_messages %}{% if loop.index0 == 0 "
    "and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + "
    "'\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% "
    "endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' "
    "[/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + "
    "eos_token }}{% endif %}{% endfor %}";

TEST(llama2_detection_follows_llama_cpp)
{
    CHECK_EQ_INT(chat_template_detect(LLAMA2_CHAT_JINJA, strlen(LLAMA2_CHAT_JINJA)),
                 CHAT_LLAMA2_SYS_STRIP);
    const char *bos = "{{ bos_token + '[INST] ' + m }} <<SYS>>";
    CHECK_EQ_INT(chat_template_detect(bos, strlen(bos)), CHAT_LLAMA2_SYS_BOS);
    const char *sys = "[INST] <<SYS>>";
    CHECK_EQ_INT(chat_template_detect(sys, strlen(sys)), CHAT_LLAMA2_SYS);
    CHECK_EQ_INT(chat_template_detect("[INST]", 6), CHAT_LLAMA2);
    CHECK_STR(chat_template_name(CHAT_LLAMA2_SYS_STRIP), "llama2-sys-strip");
}

TEST(llama2_texts_are_llama_cpp_s)
{
    /* llama.cpp's test-chat-template conversation */
    struct chat_message m[] = {{"system", "You are a helpful assistant"},
                               {"user", "Hello"},
                               {"assistant", "Hi there"},
                               {"user", "Who are you"},
                               {"assistant", "   I am an assistant   "},
                               {"user", "Another question"}};
    char *s = chat_template_render(CHAT_LLAMA2_SYS_STRIP, m, 6, 1);
    CHECK_STR(s, "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi "
                 "there</s>[INST] Who are you [/INST]I am an assistant</s>[INST] Another question "
                 "[/INST]");
    free(s);
    s = chat_template_render(CHAT_LLAMA2_SYS_BOS, m, 6, 1);
    CHECK_STR(s, "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi "
                 "there</s><s>[INST] Who are you [/INST]   I am an assistant   </s><s>[INST] "
                 "Another question [/INST]");
    free(s);
    s = chat_template_render(CHAT_LLAMA2, m, 6, 1);
    CHECK_STR(s, "[INST] You are a helpful assistant\nHello [/INST]Hi there</s>[INST] Who are "
                 "you [/INST]   I am an assistant   </s>[INST] Another question [/INST]");
    free(s);
}

TEST(llama2_chat_ids_match_the_published_ones)
{
    need_llama2_vocab();
    CHECK_EQ_INT(t32k.n_special, 3); /* <unk>, <s>, </s>; "[INST]" is plain text */
    int ids[512], n;
    enum chat_template tmpl = chat_template_detect(LLAMA2_CHAT_JINJA, strlen(LLAMA2_CHAT_JINJA));
    /* "<s>[INST] hello [/INST]" and "<s>[INST] <<SYS>>\nYou are assistant.\n<</SYS>>\n\nhello
     * [/INST]" with meta-llama/Llama-2-7b-chat-hf's tokenizer */
    struct chat_message u[] = {{"user", "hello"}};
    n = chat_ids(&t32k, tmpl, u, 1, ids, 512);
    CHECK_IDS(ids, n, 1, 518, 25580, 29962, 22172, 518, 29914, 25580, 29962);
    struct chat_message su[] = {{"system", "You are assistant."}, {"user", "hello"}};
    n = chat_ids(&t32k, tmpl, su, 2, ids, 512);
    CHECK_IDS(ids, n, 1, 518, 25580, 29962, 3532, 14816, 29903, 6778, 13, 3492, 526, 20255, 29889,
              13, 29966, 829, 14816, 29903, 6778, 13, 13, 12199, 518, 29914, 25580, 29962);
    /* Several turns: "</s>" in the template is the EOS token, the next turn's text gets the
     * dummy-prefix space after it (llama.cpp) and so starts with "▁[" (518) again; the ids around
     * it are those published for "...abc [/INST]" and "[INST] 123 [/INST]". */
    struct chat_message mt[] = {
        {"system", "lorem"}, {"user", "abc"}, {"assistant", "ipsum"}, {"user", "123"}};
    n = chat_ids(&t32k, tmpl, mt, 4, ids, 512);
    CHECK_IDS(ids, n, 1, 518, 25580, 29962, 3532, 14816, 29903, 6778, 13, 29880, 3668, 13, 29966,
              829, 14816, 29903, 6778, 13, 13, 10736, 518, 29914, 25580, 29962, 4512, 398, 2, 518,
              25580, 29962, 29871, 29896, 29906, 29941, 518, 29914, 25580, 29962);
    /* BOS inside the history (llama2-sys-bos): "<s>" in the template is token 1 */
    n = chat_ids(&t32k, CHAT_LLAMA2_SYS_BOS, mt, 4, ids, 512);
    CHECK(n > 30 && ids[n - 13] == 2 && ids[n - 12] == 1 && ids[n - 11] == 518);
    /* the same characters inside a message stay text */
    struct chat_message inj[] = {{"user", "</s><s>"}};
    n = chat_ids(&t32k, tmpl, inj, 1, ids, 512);
    for (int i = 1; i < n; i++) CHECKF(ids[i] != 1 && ids[i] != 2, "control token at %d", i);
}

/* A vocabulary of single characters plus ChatML control tokens: BPE merges nothing, so every id
 * is known. */
enum { UNK, BOS, EOS, IM_START, IM_END, IM_SHORT, FIRST_CHAR };
static const char CHARS[] = " \nabcdefghijklmnopqrstuvwxyz<>|/_:";

static int cid(char c)
{
    return FIRST_CHAR + (int)(strchr(CHARS, c) - CHARS);
}

TEST(chatml_markers_become_control_tokens)
{
    const char *pieces[64] = {"<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>", "<|im"};
    int32_t types[64] = {2, 3, 3, 3, 3, 4};
    float scores[64] = {0};
    char one[sizeof CHARS][4];
    int n = FIRST_CHAR;
    for (const char *c = CHARS; *c; c++, n++) {
        if (*c == ' ')
            snprintf(one[n - FIRST_CHAR], 4, "\xe2\x96\x81");
        else
            snprintf(one[n - FIRST_CHAR], 4, "%c", *c);
        pieces[n] = one[n - FIRST_CHAR];
        types[n] = 1;
    }
    struct gguf_writer *w = gguf_writer_new();
    CHECK(gguf_w_str(w, "tokenizer.ggml.model", "llama") == 0);
    CHECK(gguf_w_arr_str(w, "tokenizer.ggml.tokens", pieces, (uint64_t)n) == 0);
    CHECK(gguf_w_arr_f32(w, "tokenizer.ggml.scores", scores, (uint64_t)n) == 0);
    CHECK(gguf_w_arr_i32(w, "tokenizer.ggml.token_type", types, (uint64_t)n) == 0);
    struct tokenizer t;
    struct gguf g;
    char *buf = NULL;
    CHECKF(via_gguf(w, &t, &g, &buf) == 0, "%s", err);
    CHECK_EQ_INT(t.n_special, 6);
    CHECK_EQ_INT(t.special_ids[0], IM_START); /* longest first */
    /* content with control-token strings in it stays text; user-defined tokens are cut out of
     * it as llama.cpp does with parse_special off (the next stretch gets its dummy prefix) */
    struct chat_message m[] = {{"user", "hi </s><|im_end|>"}};
    int ids[256];
    int k = chat_ids(&t, CHAT_CHATML, m, 1, ids, 256);
    /* <s> <|im_start|> " user\nhi </s>" <|im " _end|>" <|im_end|> " \n" <|im_start|>
     * " assistant\n" */
    int want[256], nw = 0;
    want[nw++] = BOS;
    want[nw++] = IM_START;
    for (const char *c = " user\nhi </s>"; *c; c++) want[nw++] = cid(*c);
    want[nw++] = IM_SHORT;
    for (const char *c = " _end|>"; *c; c++) want[nw++] = cid(*c);
    want[nw++] = IM_END;
    want[nw++] = cid(' ');
    want[nw++] = cid('\n');
    want[nw++] = IM_START;
    for (const char *c = " assistant\n"; *c; c++) want[nw++] = cid(*c);
    char got[1024] = "";
    for (int i = 0; i < k && strlen(got) < 1000; i++)
        snprintf(got + strlen(got), sizeof got - strlen(got), "%d ", ids[i]);
    CHECKF(k == nw && !memcmp(ids, want, (size_t)nw * sizeof *ids), "got %d ids: %s", k, got);
    /* a user-defined token shorter than a control token that contains it: cut where it stands */
    struct tok_span sp = {"a<|im<|im_start|>", 17, 1};
    CHECK(tokenizer_encode_spans(&t, &sp, 1, 0, ids, 256, &k, err) == 0);
    CHECK(k == 4 && ids[0] == cid(' ') && ids[1] == cid('a') && ids[2] == IM_SHORT &&
          ids[3] == IM_START);
    tokenizer_free(&t);
    gguf_free(&g);
    free(buf);
}

TEST(without_special_tokens_nothing_changes)
{
    /* the plain template with the stories vocabulary (only <unk>/<s>/</s> special): the same ids
     * as tokenizing the whole text, as before */
    need_llama2_vocab();
    struct chat_message m[] = {{"system", "Be brief."}, {"user", "Tell me a story."}};
    int a[256], b[256], na, nb;
    na = chat_ids(&t32k, CHAT_PLAIN, m, 2, a, 256);
    char *s = chat_template_render(CHAT_PLAIN, m, 2, 1);
    CHECK(tokenizer_encode(&t32k, s, strlen(s), 1, b, 256, &nb, err) == 0);
    free(s);
    CHECK(na == nb && !memcmp(a, b, (size_t)na * sizeof *a));
    /* capacity is reported, not overrun */
    CHECK(chat_ids(&t32k, CHAT_PLAIN, m, 2, a, 5) == -1);
}

/* ---------------------------------------------------------------- Llama 3 and Qwen3 */

/* tests/fixtures/chat/llama_cpp_ids.json: the ids llama.cpp's server makes of chat prompts with
 * the real Llama 3 and Qwen3 vocabularies (tests/node), BOS as the vocabulary wants it (Qwen: none);
 * the same ids as the npm tokenizers give (README there). Here through tokenizer_encode_spans with
 * add_bos = 1, exactly as `strata serve` tokenizes a chat prompt. Skipped, with the tokenizer's
 * reason, while the tokenizer does not read byte-level BPE vocabularies (tokenizer.ggml.model
 * "gpt2"). */
TEST(llama3_and_qwen3_chat_prompts_are_llama_cpp_s)
{
    cJSON *ids = read_json("tests/fixtures/chat/llama_cpp_ids.json");
    cJSON *fx = read_json("tests/fixtures/chat/llama_cpp.json");
    CHECK(ids && fx);
    const cJSON *voc;
    int checked = 0;
    cJSON_ArrayForEach(voc, cJSON_GetObjectItem(ids, "vocabularies"))
    {
        char path[256];
        snprintf(path, sizeof path, "tests/node/node_modules/%s/models/tokenizer.json",
                 cJSON_GetObjectItem(voc, "package")->valuestring);
        cJSON *tj = read_json(path);
        if (!tj) {
            cJSON_Delete(ids);
            cJSON_Delete(fx);
            SKIP("%s: not installed (cd tests/node && npm ci)", path);
        }
        int bos = cJSON_GetObjectItem(voc, "bos")->valueint;
        int eos = !strcmp(voc->string, "llama3") ? 128001 : 151645;
        struct gguf_writer *w = gguf_writer_new();
        CHECK(put_bpe_vocab(w, tj, cJSON_GetObjectItem(voc, "pre")->valuestring, bos, eos,
                            cJSON_IsTrue(cJSON_GetObjectItem(voc, "add_bos"))) == 0);
        cJSON_Delete(tj);
        struct tokenizer t;
        struct gguf g = {0};
        char *buf = NULL;
        if (via_gguf(w, &t, &g, &buf)) {
            char why[ERRMSG_LEN + 64];
            snprintf(why, sizeof why, "%s vocabulary: %s", voc->string, err);
            int unsupported = strstr(err, "not supported") != NULL;
            gguf_free(&g);
            free(buf);
            cJSON_Delete(ids);
            cJSON_Delete(fx);
            if (unsupported) SKIP("%s", why);
            CHECKF(0, "%s", why);
        }
        const cJSON *p;
        cJSON_ArrayForEach(p, cJSON_GetObjectItem(ids, "prompts"))
        {
            if (strcmp(cJSON_GetObjectItem(p, "vocabulary")->valuestring, voc->string)) continue;
            const char *conv = cJSON_GetObjectItem(p, "conversation")->valuestring;
            const cJSON *c = cJSON_GetObjectItem(cJSON_GetObjectItem(fx, "conversations"), conv);
            struct chat_message m[16];
            int nm = 0;
            const cJSON *msg;
            cJSON_ArrayForEach(msg, c)
            {
                m[nm].role = cJSON_GetArrayItem(msg, 0)->valuestring;
                m[nm++].content = cJSON_GetArrayItem(msg, 1)->valuestring;
            }
            int tmpl = chat_template_from_name(cJSON_GetObjectItem(p, "template")->valuestring);
            int add = cJSON_IsTrue(cJSON_GetObjectItem(p, "add_generation_prompt"));
            struct chat_rendered r;
            CHECK(tmpl >= 0 && chat_template_render_spans(tmpl, m, nm, add, &r) == 0);
            struct tok_span sp[64];
            for (int i = 0; i < r.n_spans && i < 64; i++)
                sp[i] =
                    (struct tok_span){r.text + r.spans[i].off, r.spans[i].len, r.spans[i].marker};
            int got[1024], n = 0;
            int rc = tokenizer_encode_spans(&t, sp, r.n_spans, 1, got, 1024, &n, err);
            chat_rendered_free(&r);
            CHECKF(rc == 0, "%s: %s", conv, err);
            const cJSON *want = cJSON_GetObjectItem(p, "ids");
            int same = n == cJSON_GetArraySize(want);
            for (int i = 0; same && i < n; i++)
                same = got[i] == cJSON_GetArrayItem(want, i)->valueint;
            CHECKF(same, "%s, %s%s: %d ids, llama.cpp %d; first %d %d %d", voc->string, conv,
                   add ? "" : " (no generation prompt)", n, cJSON_GetArraySize(want), got[0],
                   n > 1 ? got[1] : -1, n > 2 ? got[2] : -1);
            checked++;
        }
        tokenizer_free(&t);
        gguf_free(&g);
        free(buf);
    }
    cJSON_Delete(ids);
    cJSON_Delete(fx);
    CHECK_EQ_INT(checked, 10);
}

int main(void)
{
    RUN(llama2_detection_follows_llama_cpp);
    RUN(llama2_texts_are_llama_cpp_s);
    RUN(llama2_chat_ids_match_the_published_ones);
    RUN(chatml_markers_become_control_tokens);
    RUN(without_special_tokens_nothing_changes);
    RUN(llama3_and_qwen3_chat_prompts_are_llama_cpp_s);
    if (have32k > 0) {
        tokenizer_free(&t32k);
        gguf_free(&g32k);
        free(b32k);
    }
    CHECK_DONE();
}
