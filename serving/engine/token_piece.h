/* token_piece: one token's text as llama.cpp shows it (llama_token_to_piece with special = true:
 * what its server's /tokenize "piece" and /detokenize, and llama-tokenize, print).
 *
 * A special token (control, user-defined or unknown in GGUF tokenizer.ggml.token_type; BOS and
 * EOS always) is its own text, "<s>" or "<|eot_id|>"; any other token is what tokenizer_decode
 * gives after a non-BOS token: its text with SentencePiece's U+2581 as a space, a byte token's
 * single byte (pieces may therefore be partial UTF-8). Unlike generated text, no space is dropped
 * after BOS and BOS/EOS are not hidden. An id outside the vocabulary is "" (len 0). */
#ifndef STRATA_TOKEN_PIECE_H
#define STRATA_TOKEN_PIECE_H

#include "serving/engine/tokenizer.h"

#include <stddef.h>

/* Returns a pointer into the tokenizer or into scratch (at least 8 bytes); sets *len. */
const char *token_piece(const struct tokenizer *t, int id, char *scratch, size_t *len);

#endif
