#include "serving/api/tokenize_api.h"

#include "os/common/errmsg.h"
#include "serving/api/utf8.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- the request */

static const cJSON *field(const cJSON *o, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

static const char *type_name(const cJSON *v)
{
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsNumber(v)) return "a number";
    if (cJSON_IsBool(v)) return "a boolean";
    if (cJSON_IsArray(v)) return "an array";
    if (cJSON_IsObject(v)) return "an object";
    return "an invalid value";
}

static int bad_type(struct api_error *e, const char *name, const char *want, const cJSON *v)
{
    return api_error_set(e, 400, "invalid_request_error", name,
                         "Invalid type for '%s': expected %s, but got %s instead.", name, want,
                         type_name(v));
}

static int get_bool(const cJSON *o, const char *name, int *out, struct api_error *e)
{
    const cJSON *v = field(o, name);
    if (!v) return 0;
    if (!cJSON_IsBool(v)) return bad_type(e, name, "a boolean", v);
    *out = cJSON_IsTrue(v);
    return 0;
}

/* A token id as JSON gives it: an integer in [0, 2^31). */
static int get_id(const cJSON *v, const char *name, int i, int *out, struct api_error *e)
{
    double d = v->valuedouble;
    if (!cJSON_IsNumber(v) || !isfinite(d) || floor(d) != d || d < 0 || d > 2147483647.0)
        return api_error_set(e, 400, "invalid_request_error", name,
                             "Invalid value for '%s': element %d is not a token id.", name, i);
    *out = (int)d;
    return 0;
}

static int add_text(struct tokenize_part *p, const cJSON *v, struct api_error *e)
{
    size_t n = strlen(v->valuestring);
    if (!utf8_valid(v->valuestring, n))
        return api_error_set(e, 400, "invalid_request_error", "content",
                             "Invalid value for 'content': the string is not valid UTF-8.");
    if (!(p->text = malloc(n + 1))) return api_error_set(e, 500, "server_error", NULL, "oom");
    memcpy(p->text, v->valuestring, n + 1);
    p->len = n;
    return 0;
}

static int parse_content(const cJSON *root, struct tokenize_request *r, struct api_error *e)
{
    const cJSON *c = field(root, "content");
    if (!c) return 0;
    if (!cJSON_IsString(c) && !cJSON_IsArray(c))
        return bad_type(e, "content", "a string or an array", c);
    int n = cJSON_IsString(c) ? 1 : cJSON_GetArraySize(c);
    if (n && !(r->parts = calloc((size_t)n, sizeof *r->parts)))
        return api_error_set(e, 500, "server_error", NULL, "out of memory");
    if (cJSON_IsString(c)) {
        r->n_parts = 1;
        return add_text(&r->parts[0], c, e);
    }
    const cJSON *v;
    cJSON_ArrayForEach(v, c)
    {
        struct tokenize_part *p = &r->parts[r->n_parts++];
        if (cJSON_IsString(v)) {
            if (add_text(p, v, e)) return -1;
        } else if (!cJSON_IsNumber(v)) {
            return api_error_set(e, 400, "invalid_request_error", "content",
                                 "Invalid value for 'content': element %d is neither text nor a "
                                 "token id.",
                                 r->n_parts - 1);
        } else if (get_id(v, "content", r->n_parts - 1, &p->id, e)) {
            return -1;
        }
    }
    return 0;
}

static int parse_tokens(const cJSON *root, struct tokenize_request *r, struct api_error *e)
{
    const cJSON *t = field(root, "tokens");
    if (!t) return 0;
    if (!cJSON_IsArray(t)) return bad_type(e, "tokens", "an array of token ids", t);
    int n = cJSON_GetArraySize(t);
    if (n && !(r->ids = malloc((size_t)n * sizeof *r->ids)))
        return api_error_set(e, 500, "server_error", NULL, "out of memory");
    const cJSON *v;
    cJSON_ArrayForEach(v, t)
    {
        if (get_id(v, "tokens", r->n_ids, &r->ids[r->n_ids], e)) return -1;
        r->n_ids++;
    }
    return 0;
}

int tokenize_request_parse(int detokenize, const char *body, size_t len, struct tokenize_request *r,
                           struct api_error *e)
{
    memset(r, 0, sizeof *r);
    r->detokenize = detokenize;
    r->parse_special = 1;
    cJSON *root = cJSON_ParseWithLength(body, len);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return api_error_set(e, 400, "invalid_request_error", NULL,
                             "We could not parse the JSON body of your request. (HINT: This likely "
                             "means you aren't using your HTTP library correctly. The OpenAI API "
                             "expects a JSON payload, but what was sent was not valid JSON.)");
    }
    int rc = 0;
    const cJSON *model = field(root, "model");
    if (model && !cJSON_IsString(model))
        rc = bad_type(e, "model", "a string", model);
    else if (model)
        snprintf(r->model, sizeof r->model, "%s", model->valuestring);
    if (!rc && detokenize)
        rc = parse_tokens(root, r, e);
    else if (!rc)
        rc = parse_content(root, r, e) || get_bool(root, "add_special", &r->add_special, e) ||
             get_bool(root, "parse_special", &r->parse_special, e) ||
             get_bool(root, "with_pieces", &r->with_pieces, e);
    cJSON_Delete(root);
    if (rc) tokenize_request_free(r);
    return rc ? -1 : 0;
}

void tokenize_request_free(struct tokenize_request *r)
{
    for (int i = 0; i < r->n_parts; i++) free(r->parts[i].text);
    free(r->parts);
    free(r->ids);
    memset(r, 0, sizeof *r);
}

int tokenize_request_estimate(const struct tokenize_request *r)
{
    size_t n = (size_t)r->n_ids;
    for (int i = 0; i < r->n_parts; i++) n += r->parts[i].text ? r->parts[i].len / 4 + 1 : 1;
    return n < (size_t)1 << 30 ? (int)n : 1 << 30;
}

/* ---------------------------------------------------------------- the answer */

struct jbuf {
    char *p;
    size_t n, cap;
    int oom;
};

static void put(struct jbuf *b, const char *s, size_t k)
{
    if (b->oom) return;
    if (b->n + k + 1 > b->cap) {
        size_t cap = (b->n + k + 1) * 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, k);
    b->n += k;
    b->p[b->n] = 0;
}

static void puts_(struct jbuf *b, const char *s)
{
    put(b, s, strlen(s));
}

static void put_int(struct jbuf *b, int v)
{
    char num[16];
    put(b, num, (size_t)snprintf(num, sizeof num, "%d", v));
}

/* A JSON string of valid UTF-8 s[0..n) (NUL bytes included), escaped as cJSON and llama.cpp's
 * JSON library do: the two-character forms where JSON has one, \u00xx for other control bytes. */
static void put_str(struct jbuf *b, const char *s, size_t n)
{
    put(b, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        put(b, s + run, i - run);
        run = i + 1;
        char esc[8];
        const char *two = c == '"'    ? "\\\""
                          : c == '\\' ? "\\\\"
                          : c == '\n' ? "\\n"
                          : c == '\r' ? "\\r"
                          : c == '\t' ? "\\t"
                          : c == '\b' ? "\\b"
                          : c == '\f' ? "\\f"
                                      : NULL;
        if (two)
            puts_(b, two);
        else
            put(b, esc, (size_t)snprintf(esc, sizeof esc, "\\u%04x", c));
    }
    put(b, s + run, n - run);
    put(b, "\"", 1);
}

static int check_id(const struct token_ops *ops, const char *name, int i, int id,
                    struct api_error *e)
{
    if (id < ops->vocab_size) return 0;
    return api_error_set(e, 400, "invalid_request_error", name,
                         "Invalid value for '%s': token id %d at index %d is outside the "
                         "vocabulary (%d tokens).",
                         name, id, i, ops->vocab_size);
}

static int finish(struct jbuf *b, char **out, size_t *out_len, struct api_error *e)
{
    if (b->oom) {
        free(b->p);
        return api_error_set(e, 500, "server_error", NULL, "out of memory");
    }
    *out = b->p;
    *out_len = b->n;
    return 0;
}

static int answer_detokenize(const struct tokenize_request *r, const struct token_ops *ops,
                             char **out, size_t *out_len, struct api_error *e)
{
    struct jbuf text = {0}, b = {0};
    put(&text, "", 0);
    for (int i = 0; i < r->n_ids; i++) {
        if (check_id(ops, "tokens", i, r->ids[i], e)) {
            free(text.p);
            return -1;
        }
        char scratch[8];
        size_t k = 0;
        const char *p = ops->piece(ops->tok, r->ids[i], scratch, &k);
        put(&text, p, k);
    }
    char *clean = text.oom ? NULL : malloc(3 * text.n + 1);
    if (clean) {
        size_t k = utf8_replace_invalid(text.p, text.n, clean);
        puts_(&b, "{\"content\":");
        put_str(&b, clean, k);
        puts_(&b, "}");
    } else {
        b.oom = 1;
    }
    free(clean);
    free(text.p);
    return finish(&b, out, out_len, e);
}

int tokenize_request_answer(const struct tokenize_request *r, const struct token_ops *ops,
                            char **out, size_t *out_len, struct api_error *e)
{
    if (r->detokenize) return answer_detokenize(r, ops, out, out_len, e);
    /* room for what every part can become (a text part: at most 2 * len + 3 ids) */
    size_t cap = 0;
    for (int i = 0; i < r->n_parts; i++) {
        const struct tokenize_part *p = &r->parts[i];
        if (p->text && p->len > (size_t)INT32_MAX / 4)
            return api_error_set(e, 400, "invalid_request_error", "content",
                                 "Invalid value for 'content': the text is too long.");
        cap += p->text ? 2 * p->len + 3 : 1;
        if (cap > (size_t)INT32_MAX / 2)
            return api_error_set(e, 400, "invalid_request_error", "content",
                                 "Invalid value for 'content': the text is too long.");
    }
    int *ids = malloc((cap ? cap : 1) * sizeof *ids);
    if (!ids) return api_error_set(e, 500, "server_error", NULL, "out of memory");
    int n = 0, first = 1;
    char err[ERRMSG_LEN];
    for (int i = 0; i < r->n_parts; i++) {
        const struct tokenize_part *p = &r->parts[i];
        int k = 0;
        if (!p->text) {
            if (check_id(ops, "content", i, p->id, e)) goto fail;
            ids[n++] = p->id;
        } else if (ops->tokenize(ops->tok, p->text, p->len, first && r->add_special,
                                 r->parse_special, ids + n, (int)cap - n, &k, err)) {
            api_error_set(e, 500, "server_error", NULL, "%s", err);
            goto fail;
        } else {
            n += k;
        }
        first = 0;
    }
    struct jbuf b = {0};
    puts_(&b, "{\"tokens\":[");
    for (int i = 0; i < n; i++) {
        if (i) puts_(&b, ",");
        if (!r->with_pieces) {
            put_int(&b, ids[i]);
            continue;
        }
        char scratch[8];
        size_t k = 0;
        const char *piece = ops->piece(ops->tok, ids[i], scratch, &k);
        puts_(&b, "{\"id\":");
        put_int(&b, ids[i]);
        puts_(&b, ",\"piece\":");
        if (utf8_valid(piece, k)) {
            put_str(&b, piece, k);
        } else {
            puts_(&b, "[");
            for (size_t j = 0; j < k; j++) {
                if (j) puts_(&b, ",");
                put_int(&b, (unsigned char)piece[j]);
            }
            puts_(&b, "]");
        }
        puts_(&b, "}");
    }
    puts_(&b, "]}");
    free(ids);
    return finish(&b, out, out_len, e);
fail:
    free(ids);
    return -1;
}
