#include "serving/api/api_request.h"

#include "serving/api/utf8.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int api_error_set(struct api_error *e, int status, const char *type, const char *param,
                  const char *fmt, ...)
{
    e->status = status;
    e->type = type;
    e->code = NULL;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

char *api_error_json(const struct api_error *e)
{
    cJSON *root = cJSON_CreateObject(), *err = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(err, "message", e->message);
    cJSON_AddStringToObject(err, "type", e->type ? e->type : "invalid_request_error");
    if (e->param[0])
        cJSON_AddStringToObject(err, "param", e->param);
    else
        cJSON_AddNullToObject(err, "param");
    if (e->code)
        cJSON_AddStringToObject(err, "code", e->code);
    else
        cJSON_AddNullToObject(err, "code");
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

static const char *json_type_name(const cJSON *v)
{
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsNumber(v)) return "a number";
    if (cJSON_IsBool(v)) return "a boolean";
    if (cJSON_IsNull(v)) return "null";
    if (cJSON_IsArray(v)) return "an array";
    if (cJSON_IsObject(v)) return "an object";
    return "an invalid value";
}

static int bad_type(struct api_error *e, const char *name, const char *want, const cJSON *v)
{
    return api_error_set(e, 400, "invalid_request_error", name,
                         "Invalid type for '%s': expected %s, but got %s instead.", name, want,
                         json_type_name(v));
}

static int out_of_range(struct api_error *e, const char *name, const char *range)
{
    return api_error_set(e, 400, "invalid_request_error", name,
                         "Invalid value for '%s': must be %s.", name, range);
}

static int is_integer(const cJSON *v)
{
    double d = v->valuedouble;
    return cJSON_IsNumber(v) && isfinite(d) && floor(d) == d;
}

/* Present and not null? (OpenAI treats an explicit null as "not given".) */
static const cJSON *field(const cJSON *o, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

static int get_int(const cJSON *o, const char *name, long long lo, long long hi, const char *range,
                   int *out, struct api_error *e)
{
    const cJSON *v = field(o, name);
    if (!v) return 0;
    if (!is_integer(v)) return bad_type(e, name, "an integer", v);
    if (v->valuedouble < (double)lo || v->valuedouble > (double)hi)
        return out_of_range(e, name, range);
    *out = (int)v->valuedouble;
    return 0;
}

static int get_num(const cJSON *o, const char *name, double lo, double hi, int lo_open,
                   const char *range, double *out, struct api_error *e)
{
    const cJSON *v = field(o, name);
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) return bad_type(e, name, "a number", v);
    double d = v->valuedouble;
    if (d < lo || d > hi || (lo_open && d == lo)) return out_of_range(e, name, range);
    *out = d;
    return 0;
}

static int get_bool(const cJSON *o, const char *name, int *out, struct api_error *e)
{
    const cJSON *v = field(o, name);
    if (!v) return 0;
    if (!cJSON_IsBool(v)) return bad_type(e, name, "a boolean", v);
    *out = cJSON_IsTrue(v);
    return 0;
}

/* A string that must be valid UTF-8 (cJSON decodes \u escapes, including lone surrogates into
 * invalid bytes, and passes raw bytes through). */
static int dup_text(const cJSON *v, const char *name, char **out, struct api_error *e)
{
    size_t n = strlen(v->valuestring);
    if (!utf8_valid(v->valuestring, n))
        return api_error_set(e, 400, "invalid_request_error", name,
                             "Invalid value for '%s': the string is not valid UTF-8.", name);
    *out = strdup(v->valuestring);
    if (!*out) return api_error_set(e, 500, "server_error", NULL, "out of memory");
    return 0;
}

static int parse_prompt(const cJSON *root, struct completion_request *r, struct api_error *e)
{
    const cJSON *p = field(root, "prompt");
    if (!p)
        return api_error_set(e, 400, "invalid_request_error", "prompt",
                             "Missing required parameter: 'prompt'.");
    if (cJSON_IsString(p)) return dup_text(p, "prompt", &r->prompt, e);
    if (!cJSON_IsArray(p)) return bad_type(e, "prompt", "a string or an array", p);
    int n = cJSON_GetArraySize(p);
    if (n == 0)
        return api_error_set(e, 400, "invalid_request_error", "prompt",
                             "Invalid value for 'prompt': the array is empty.");
    const cJSON *first = cJSON_GetArrayItem(p, 0);
    if (cJSON_IsString(first)) {
        /* A batch of prompts; n=1 only, so exactly one. */
        if (n != 1)
            return api_error_set(e, 400, "invalid_request_error", "prompt",
                                 "Only one prompt per request is supported (got %d).", n);
        return dup_text(first, "prompt", &r->prompt, e);
    }
    r->prompt_ids = malloc((size_t)n * sizeof *r->prompt_ids);
    if (!r->prompt_ids) return api_error_set(e, 500, "server_error", NULL, "out of memory");
    int i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, p)
    {
        if (!is_integer(t) || t->valuedouble < 0 || t->valuedouble > 2147483647.0)
            return api_error_set(e, 400, "invalid_request_error", "prompt",
                                 "Invalid value for 'prompt': element %d is not a token id.", i);
        r->prompt_ids[i++] = (int)t->valuedouble;
    }
    r->n_prompt_ids = n;
    return 0;
}

/* Message content: a string, or an array of {"type":"text","text":...} parts (joined). */
static int parse_content(const cJSON *c, int idx, char **out, struct api_error *e)
{
    char name[48];
    snprintf(name, sizeof name, "messages[%d].content", idx);
    if (!c) {
        *out = strdup("");
        return *out ? 0 : api_error_set(e, 500, "server_error", NULL, "out of memory");
    }
    if (cJSON_IsString(c)) return dup_text(c, name, out, e);
    if (!cJSON_IsArray(c)) return bad_type(e, name, "a string or an array", c);
    size_t total = 1;
    const cJSON *part;
    cJSON_ArrayForEach(part, c)
    {
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsObject(part) || !cJSON_IsString(text))
            return api_error_set(e, 400, "invalid_request_error", name,
                                 "Invalid value for '%s': only text parts are supported.", name);
        size_t n = strlen(text->valuestring);
        if (!utf8_valid(text->valuestring, n))
            return api_error_set(e, 400, "invalid_request_error", name,
                                 "Invalid value for '%s': the string is not valid UTF-8.", name);
        total += n;
    }
    char *s = malloc(total);
    if (!s) return api_error_set(e, 500, "server_error", NULL, "out of memory");
    size_t o = 0;
    cJSON_ArrayForEach(part, c)
    {
        const char *t = cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring;
        size_t n = strlen(t);
        memcpy(s + o, t, n);
        o += n;
    }
    s[o] = 0;
    *out = s;
    return 0;
}

static int parse_messages(const cJSON *root, struct completion_request *r, struct api_error *e)
{
    const cJSON *m = field(root, "messages");
    if (!m)
        return api_error_set(e, 400, "invalid_request_error", "messages",
                             "Missing required parameter: 'messages'.");
    if (!cJSON_IsArray(m)) return bad_type(e, "messages", "an array", m);
    int n = cJSON_GetArraySize(m);
    if (n == 0)
        return api_error_set(e, 400, "invalid_request_error", "messages",
                             "Invalid 'messages': empty array. Expected an array with minimum "
                             "length 1, but got an empty array instead.");
    if (n > API_MAX_MESSAGES)
        return api_error_set(e, 400, "invalid_request_error", "messages",
                             "Invalid 'messages': at most %d messages are accepted, got %d.",
                             API_MAX_MESSAGES, n);
    r->messages = calloc((size_t)n, sizeof *r->messages);
    if (!r->messages) return api_error_set(e, 500, "server_error", NULL, "out of memory");
    const cJSON *msg;
    int i = 0;
    cJSON_ArrayForEach(msg, m)
    {
        char name[48];
        snprintf(name, sizeof name, "messages[%d]", i);
        if (!cJSON_IsObject(msg)) return bad_type(e, name, "an object", msg);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(msg, "role");
        snprintf(name, sizeof name, "messages[%d].role", i);
        if (!role)
            return api_error_set(e, 400, "invalid_request_error", name,
                                 "Missing required parameter: '%s'.", name);
        if (!cJSON_IsString(role)) return bad_type(e, name, "a string", role);
        const char *rs = role->valuestring;
        if (strcmp(rs, "system") && strcmp(rs, "user") && strcmp(rs, "assistant") &&
            strcmp(rs, "developer") && strcmp(rs, "tool"))
            return api_error_set(e, 400, "invalid_request_error", name,
                                 "Invalid value for '%s': expected one of 'system', 'user', "
                                 "'assistant', 'developer', 'tool'.",
                                 name);
        r->messages[i].role = strdup(rs);
        r->n_messages = i + 1;
        if (!r->messages[i].role) return api_error_set(e, 500, "server_error", NULL, "oom");
        if (parse_content(field(msg, "content"), i, &r->messages[i].content, e)) return -1;
        i++;
    }
    return 0;
}

static int parse_stop(const cJSON *root, struct completion_request *r, struct api_error *e)
{
    const cJSON *s = field(root, "stop");
    if (!s) return 0;
    if (cJSON_IsString(s)) {
        if (!s->valuestring[0]) return 0;
        if (dup_text(s, "stop", &r->stop[0], e)) return -1;
        r->n_stop = 1;
        return 0;
    }
    if (!cJSON_IsArray(s)) return bad_type(e, "stop", "a string or an array of strings", s);
    if (cJSON_GetArraySize(s) > API_MAX_STOP)
        return api_error_set(e, 400, "invalid_request_error", "stop",
                             "Invalid 'stop': at most %d stop sequences are accepted.",
                             API_MAX_STOP);
    const cJSON *t;
    cJSON_ArrayForEach(t, s)
    {
        if (!cJSON_IsString(t)) return bad_type(e, "stop", "an array of strings", t);
        if (!t->valuestring[0]) continue;
        if (dup_text(t, "stop", &r->stop[r->n_stop], e)) return -1;
        r->n_stop++;
    }
    return 0;
}

static int parse_fields(const cJSON *root, int chat, struct completion_request *r,
                        struct api_error *e)
{
    const cJSON *model = field(root, "model");
    if (model) {
        if (!cJSON_IsString(model)) return bad_type(e, "model", "a string", model);
        snprintf(r->model, sizeof r->model, "%s", model->valuestring);
    }
    if (chat ? parse_messages(root, r, e) : parse_prompt(root, r, e)) return -1;
    const char *max_name = "max_tokens";
    if (chat && field(root, "max_completion_tokens")) max_name = "max_completion_tokens";
    if (get_int(root, max_name, 1, 1 << 30, "an integer >= 1", &r->max_tokens, e)) return -1;
    if (get_int(root, "min_tokens", 0, 1 << 30, "an integer >= 0", &r->min_tokens, e)) return -1;
    double d;
    d = r->temperature;
    if (get_num(root, "temperature", 0, 2, 0, "a number between 0 and 2", &d, e)) return -1;
    r->temperature = (float)d;
    d = r->top_p;
    if (get_num(root, "top_p", 0, 1, 1, "a number in (0, 1]", &d, e)) return -1;
    r->top_p = (float)d;
    d = r->min_p;
    if (get_num(root, "min_p", 0, 1, 0, "a number in [0, 1]", &d, e)) return -1;
    r->min_p = (float)d;
    if (get_int(root, "top_k", -1, 1 << 30, "an integer >= -1", &r->top_k, e)) return -1;
    if (r->top_k < 0) r->top_k = 0;
    const cJSON *seed = field(root, "seed");
    if (seed) {
        if (!is_integer(seed)) return bad_type(e, "seed", "an integer", seed);
        if (fabs(seed->valuedouble) > 9.2e18) return out_of_range(e, "seed", "a 64-bit integer");
        r->seed = (uint64_t)(int64_t)seed->valuedouble;
        r->has_seed = 1;
    }
    int n = 1;
    if (get_int(root, "n", 1, 1 << 30, "an integer >= 1", &n, e)) return -1;
    if (n != 1)
        return api_error_set(e, 400, "invalid_request_error", "n",
                             "Invalid value for 'n': only n=1 is supported.");
    if (get_bool(root, "stream", &r->stream, e)) return -1;
    const cJSON *so = field(root, "stream_options");
    if (so) {
        if (!cJSON_IsObject(so)) return bad_type(e, "stream_options", "an object", so);
        if (get_bool(so, "include_usage", &r->include_usage, e)) return -1;
    }
    if (get_bool(root, "ignore_eos", &r->ignore_eos, e)) return -1;
    if (parse_stop(root, r, e)) return -1;
    if (get_num(root, "ttft_ms", 0, 3.6e6, 1, "a number of milliseconds > 0", &r->ttft_ms, e))
        return -1;
    if (get_num(root, "tpot_ms", 0, 3.6e6, 1, "a number of milliseconds > 0", &r->tpot_ms, e))
        return -1;
    return 0;
}

int api_request_parse(const char *body, size_t len, int chat, struct completion_request *r,
                      struct api_error *e)
{
    memset(r, 0, sizeof *r);
    r->chat = chat;
    r->max_tokens = -1;
    r->temperature = 1.0f;
    r->top_p = 1.0f;
    cJSON *root = cJSON_ParseWithLength(body, len);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return api_error_set(e, 400, "invalid_request_error", NULL,
                             "We could not parse the JSON body of your request. (HINT: This likely "
                             "means you aren't using your HTTP library correctly. The OpenAI API "
                             "expects a JSON payload, but what was sent was not valid JSON.)");
    }
    int rc = parse_fields(root, chat, r, e);
    cJSON_Delete(root);
    if (rc) api_request_free(r);
    return rc;
}

void api_request_free(struct completion_request *r)
{
    free(r->prompt);
    free(r->prompt_ids);
    for (int i = 0; i < r->n_messages; i++) {
        free(r->messages[i].role);
        free(r->messages[i].content);
    }
    free(r->messages);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    memset(r, 0, sizeof *r);
}
