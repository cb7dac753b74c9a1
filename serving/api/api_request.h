/* api_request: the JSON body of /v1/completions and /v1/chat/completions, parsed and validated.
 *
 * api_request_parse() accepts exactly what the OpenAI API accepts for the fields Strata
 * serves and ignores unknown fields. Any wrong type, out-of-range value or invalid UTF-8 gives an
 * api_error with status 400, the offending parameter and a message in OpenAI's wording, which
 * api_error_json() renders in OpenAI's error shape. Checks that need the model (prompt length
 * against the context, token ids against the vocabulary) are the caller's.
 *
 * Extensions for load generators and SLOs: ignore_eos, min_tokens, ttft_ms, tpot_ms; prompt may be
 * an array of token ids (as in the OpenAI API). */
#ifndef STRATA_API_REQUEST_H
#define STRATA_API_REQUEST_H

#include "os/common/errmsg.h"

#include <stddef.h>
#include <stdint.h>

#define API_MAX_STOP     4
#define API_MAX_MESSAGES 256

struct api_error {
    int status;       /* HTTP status */
    const char *type; /* "invalid_request_error", "authentication_error", "server_error", ... */
    char param[48];   /* "" when none */
    const char *code; /* NULL or e.g. "context_length_exceeded" */
    char message[ERRMSG_LEN];
};

struct chat_message {
    char *role; /* "system", "user", "assistant" (others: "tool", "developer" as user) */
    char *content;
};

struct completion_request {
    int chat;
    char *prompt;    /* completions: the text (NULL when token ids) */
    int *prompt_ids; /* completions: token ids given directly */
    int n_prompt_ids;
    struct chat_message *messages; /* chat */
    int n_messages;
    char model[128];
    int max_tokens; /* -1 = not given */
    int min_tokens;
    int ignore_eos;
    float temperature, top_p, min_p;
    int top_k;
    uint64_t seed;
    int has_seed;
    char *stop[API_MAX_STOP];
    int n_stop;
    int stream, include_usage;
    double ttft_ms, tpot_ms; /* 0 = server default */
};

/* 0 on success; -1 with *e filled (and r freed) otherwise. */
int api_request_parse(const char *body, size_t len, int chat, struct completion_request *r,
                      struct api_error *e);
void api_request_free(struct completion_request *r);

/* Fill e (status, type, param) and format its message; returns -1. */
int api_error_set(struct api_error *e, int status, const char *type, const char *param,
                  const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* {"error":{"message":...,"type":...,"param":...,"code":...}}; malloc'd. */
char *api_error_json(const struct api_error *e);

#endif
