#include "serving/api/api_response.h"

#include "serving/api/utf8.h"

#include <cjson/cJSON.h>
#include <stdlib.h>

static cJSON *head(const struct api_reply *r, const char *object)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", r->id);
    cJSON_AddStringToObject(o, "object", object);
    cJSON_AddNumberToObject(o, "created", (double)r->created);
    cJSON_AddStringToObject(o, "model", r->model);
    return o;
}

static cJSON *text_value(const char *text, size_t len)
{
    char *clean = malloc(3 * len + 1);
    if (!clean) return cJSON_CreateString("");
    utf8_sanitize(text, len, clean);
    cJSON *s = cJSON_CreateString(clean);
    free(clean);
    return s;
}

static void add_finish(cJSON *choice, const char *finish)
{
    if (finish)
        cJSON_AddStringToObject(choice, "finish_reason", finish);
    else
        cJSON_AddNullToObject(choice, "finish_reason");
}

static void add_usage(cJSON *o, const struct api_reply *r)
{
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", r->prompt_tokens);
    cJSON_AddNumberToObject(u, "completion_tokens", r->completion_tokens);
    cJSON_AddNumberToObject(u, "total_tokens", r->prompt_tokens + r->completion_tokens);
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", r->cached_tokens);
}

static char *print(cJSON *o)
{
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

char *api_completion_json(const struct api_reply *r, const char *text, size_t len)
{
    cJSON *o = head(r, r->chat ? "chat.completion" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    cJSON *c = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, c);
    if (r->chat) {
        cJSON_AddNumberToObject(c, "index", 0);
        cJSON *m = cJSON_AddObjectToObject(c, "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        cJSON_AddItemToObject(m, "content", text_value(text, len));
        cJSON_AddNullToObject(c, "logprobs");
    } else {
        cJSON_AddItemToObject(c, "text", text_value(text, len));
        cJSON_AddNumberToObject(c, "index", 0);
        cJSON_AddNullToObject(c, "logprobs");
    }
    add_finish(c, r->finish_reason);
    add_usage(o, r);
    return print(o);
}

char *api_chunk_json(const struct api_reply *r, const char *text, size_t len, int first)
{
    cJSON *o = head(r, r->chat ? "chat.completion.chunk" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    cJSON *c = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, c);
    if (r->chat) {
        cJSON_AddNumberToObject(c, "index", 0);
        cJSON *d = cJSON_AddObjectToObject(c, "delta");
        if (first) cJSON_AddStringToObject(d, "role", "assistant");
        if (len || first || !r->finish_reason)
            cJSON_AddItemToObject(d, "content", text_value(text, len));
        cJSON_AddNullToObject(c, "logprobs");
    } else {
        cJSON_AddItemToObject(c, "text", text_value(text, len));
        cJSON_AddNumberToObject(c, "index", 0);
        cJSON_AddNullToObject(c, "logprobs");
    }
    add_finish(c, r->finish_reason);
    return print(o);
}

char *api_usage_chunk_json(const struct api_reply *r)
{
    cJSON *o = head(r, r->chat ? "chat.completion.chunk" : "text_completion");
    cJSON_AddArrayToObject(o, "choices");
    add_usage(o, r);
    return print(o);
}

char *api_models_json(const char *model, long long created)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(o, "data");
    cJSON *m = cJSON_CreateObject();
    cJSON_AddItemToArray(data, m);
    cJSON_AddStringToObject(m, "id", model);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)created);
    cJSON_AddStringToObject(m, "owned_by", "strata");
    return print(o);
}
