/* libFuzzer target: the API's JSON request bodies and what follows their parsing. The first byte
 * picks the body: bit 1 clear: completions (bit 0 set: chat), validated into struct
 * completion_request, a chat rendered with every template (bit 2: with the generation prompt),
 * the error JSON; bit 1 set: /tokenize (bit 0 set: /detokenize), parsed and answered with a
 * made-up vocabulary (a token is its byte; ids from 256 up are multi-byte pieces), whose answer
 * must be valid JSON and valid UTF-8. The whole input also goes through chat_template_detect, the
 * parser of a GGUF's tokenizer.chat_template. */
#include "serving/api/api_request.h"
#include "serving/api/chat_template.h"
#include "serving/api/tokenize_api.h"
#include "serving/api/utf8.h"

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define VOCAB 300

static const char *piece(void *tok, int id, char *scratch, size_t *len)
{
    (void)tok;
    if (id >= 256) { /* the character U+0100 + id - 256, or half of it */
        unsigned c = 0x100 + (unsigned)id - 256;
        scratch[0] = (char)(0xc0 | c >> 6);
        scratch[1] = (char)(0x80 | (c & 0x3f));
        *len = id & 1 ? 1 : 2;
        return scratch;
    }
    scratch[0] = (char)id;
    *len = 1;
    return scratch;
}

static int tokenize(void *tok, const char *text, size_t len, int add_special, int parse_special,
                    int *out, int cap, int *n, char *err)
{
    (void)tok, (void)err;
    if ((size_t)cap < 2 * len + 3) abort(); /* the room tokenize_api promises */
    *n = 0;
    if (add_special) out[(*n)++] = 256;
    for (size_t i = 0; i < len; i++)
        out[(*n)++] = parse_special && text[i] == '@' ? 299 : (unsigned char)text[i];
    return 0;
}

static void check_json(const char *s, size_t n)
{
    if (strlen(s) != n || !utf8_valid(s, n)) abort();
    cJSON *j = cJSON_ParseWithLength(s, n);
    if (!j) abort();
    cJSON_Delete(j);
}

static void tokenize_body(int detok, const char *body, size_t len)
{
    struct tokenize_request r;
    struct api_error e;
    if (tokenize_request_parse(detok, body, len, &r, &e)) {
        if (e.status != 400 && e.status != 500) abort();
        return;
    }
    if (tokenize_request_estimate(&r) < 0) abort();
    struct token_ops ops = {NULL, VOCAB, tokenize, piece};
    char *out = NULL;
    size_t n = 0;
    if (tokenize_request_answer(&r, &ops, &out, &n, &e) == 0) {
        check_json(out, n);
        free(out);
    } else if (e.status != 400 && e.status != 500) {
        abort();
    }
    tokenize_request_free(&r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    chat_template_detect((const char *)data, size);
    int chat = data[0] & 1, tok = data[0] & 2, add_gen = (data[0] >> 2) & 1;
    char *buf = malloc(size);
    if (!buf) return 0;
    memcpy(buf, data + 1, size - 1);
    if (tok) {
        tokenize_body(chat, buf, size - 1);
        free(buf);
        return 0;
    }
    struct completion_request r;
    struct api_error e;
    if (api_request_parse(buf, size - 1, chat, &r, &e) == 0) {
        if (chat) {
            if (r.n_messages < 1) abort();
            for (int t = 0; t < CHAT_N_TEMPLATES; t++) {
                char *p =
                    chat_template_render((enum chat_template)t, r.messages, r.n_messages, add_gen);
                if (p && !utf8_valid(p, strlen(p))) abort();
                free(p);
            }
        } else if (!r.prompt && !r.n_prompt_ids) {
            abort();
        }
        if (r.n_stop > API_MAX_STOP) abort();
        api_request_free(&r);
    } else {
        if (e.status < 400) abort();
        char *j = api_error_json(&e);
        free(j);
    }
    free(buf);
    return 0;
}
