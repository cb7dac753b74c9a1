/* api_response: the JSON bodies Strata sends, in the exact shapes of the OpenAI API.
 *
 *   completion        {"id":"cmpl-..","object":"text_completion","created":..,"model":..,
 *                      "choices":[{"text":..,"index":0,"logprobs":null,"finish_reason":..}],
 *                      "usage":{"prompt_tokens":..,"completion_tokens":..,"total_tokens":..,
 *                               "prompt_tokens_details":{"cached_tokens":..}}}
 *   chat completion   "object":"chat.completion", choices[0].message
 *                      {"role":"assistant","content":..}
 *   stream chunks     "object":"text_completion" / "chat.completion.chunk", with
 *                      choices[0].text or choices[0].delta, finish_reason null until the last;
 *                      an optional usage chunk (stream_options.include_usage) with
 *                      "choices":[] before "data: [DONE]".
 *
 * Text is sanitized to valid UTF-8 (U+FFFD for stray bytes). All results are malloc'd strings. */
#ifndef STRATA_API_RESPONSE_H
#define STRATA_API_RESPONSE_H

#include <stddef.h>

struct api_reply {
    int chat;
    const char *id;    /* "cmpl-<n>" / "chatcmpl-<n>" */
    long long created; /* unix seconds */
    const char *model;
    const char *finish_reason; /* "stop", "length" or NULL (still running) */
    int prompt_tokens, completion_tokens;
    int cached_tokens; /* of prompt_tokens, from the prefix cache: usage.prompt_tokens_details */
};

char *api_completion_json(const struct api_reply *r, const char *text, size_t len);
/* One streamed chunk; `first` adds the chat delta's role. */
char *api_chunk_json(const struct api_reply *r, const char *text, size_t len, int first);
char *api_usage_chunk_json(const struct api_reply *r);
char *api_models_json(const char *model, long long created);

#endif
