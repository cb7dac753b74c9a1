/* tokenize_api: POST /tokenize and POST /detokenize, in llama.cpp server's shapes.
 *
 *   /tokenize    {"content": TEXT or [TEXT or ID, ...], "add_special": false,
 *                 "parse_special": true, "with_pieces": false}
 *             -> {"tokens":[ID,...]}, with_pieces: {"tokens":[{"id":ID,"piece":PIECE},...]}
 *   /detokenize  {"tokens": [ID, ...]}  ->  {"content":TEXT}
 *
 * add_special adds BOS (as the vocabulary wants it); parse_special lets the pieces of special
 * tokens in the text become those tokens. In a content array the ids are taken as they are and
 * add_special applies only when the first element is text (llama.cpp's tokenize_mixed). A PIECE
 * is the token's text as llama.cpp shows it (token_to_piece with special tokens spelled out: "<s>"
 * for BOS, " Hello" for "▁Hello", a byte token's byte): a JSON string when it is valid UTF-8, else
 * the array of its byte values. /detokenize concatenates the same pieces (llama.cpp's
 * tokens_to_str: BOS shows as "<s>"; no space is dropped), invalid UTF-8 replaced by U+FFFD.
 * No content gives no tokens and no tokens an empty content, as in llama.cpp.
 * Strata is stricter than llama.cpp (which ignores a mistyped flag and crashes on an id outside the
 * vocabulary): a wrong type, invalid UTF-8, or an id outside [0, vocabulary) is a 400 in the API's
 * error shape naming the parameter. An optional "model" names the model whose tokenizer is meant
 * (the cluster routes by it). The parser needs no model, so a node without one can validate and
 * forward; tokenize_request_answer needs the tokenizer (struct token_ops). */
#ifndef STRATA_TOKENIZE_API_H
#define STRATA_TOKENIZE_API_H

#include "serving/api/api_request.h"

#include <stddef.h>

/* One element of /tokenize's content: text (text != NULL) or a token id. */
struct tokenize_part {
    char *text;
    size_t len;
    int id;
};

struct tokenize_request {
    int detokenize;              /* the /detokenize body */
    struct tokenize_part *parts; /* /tokenize: the content */
    int n_parts;
    int *ids; /* /detokenize: the tokens */
    int n_ids;
    int add_special, parse_special, with_pieces;
    char model[128]; /* "" when not given */
};

/* What the answer needs of the model's tokenizer. */
struct token_ops {
    void *tok;
    int vocab_size;
    /* text -> ids: BOS first when add_special, special tokens found when parse_special; out has
     * room for 2 * len + 3 ids */
    int (*tokenize)(void *tok, const char *text, size_t len, int add_special, int parse_special,
                    int *out, int cap, int *n, char *err);
    /* the token's piece (token_piece.h); *len its length */
    const char *(*piece)(void *tok, int id, char *scratch, size_t *len);
};

/* 0, or -1 with e (400: the body; 500: out of memory) and nothing to free. */
int tokenize_request_parse(int detokenize, const char *body, size_t len, struct tokenize_request *r,
                           struct api_error *e);
void tokenize_request_free(struct tokenize_request *r);
/* About how many tokens the request is (for routing before a tokenizer is at hand). */
int tokenize_request_estimate(const struct tokenize_request *r);
/* The answer's body: 0 with *out (malloc'd JSON) and *out_len, or -1 with e (400: an id outside
 * the vocabulary; 500: the tokenizer failed, out of memory). */
int tokenize_request_answer(const struct tokenize_request *r, const struct token_ops *ops,
                            char **out, size_t *out_len, struct api_error *e);

#endif
