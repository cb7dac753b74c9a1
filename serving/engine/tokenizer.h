/* tokenizer: SentencePiece-style BPE with scores and byte fallback (GGUF tokenizer.ggml.model =
 * "llama"), tokenizing exactly as llama2.c and llama.cpp do for llama vocabularies.
 *
 * Encoding: optional BOS, the dummy-prefix space (a leading ' ' before the text, as SentencePiece
 * adds), then each UTF-8 code point becomes its token or, if the vocabulary lacks it, its bytes as
 * <0xNN> tokens; then the best-scoring adjacent pair is merged while any merge exists.
 * Invalid UTF-8 is treated byte by byte (byte fallback), never rejected, never read past the end.
 * Decoding: a token's piece with <0xNN> turned into the raw byte; after BOS the leading space of
 * the first piece is dropped (as llama2.c does). */
#ifndef STRATA_TOKENIZER_H
#define STRATA_TOKENIZER_H

#include "serving/engine/gguf.h"

#include <stddef.h>

struct tokenizer {
    int vocab_size;
    char **pieces;   /* NUL-terminated piece of each id */
    int *piece_len;
    float *scores;
    int bos_id, eos_id;
    int byte_ids[256];   /* id of <0xNN>, or -1 */
    /* sorted index for piece -> id lookup */
    int *sorted;
    int max_piece_len;
};

/* From GGUF metadata: tokenizer.ggml.tokens, .scores, .bos_token_id, .eos_token_id. */
int tokenizer_from_gguf(struct tokenizer *t, const struct gguf *g, char *err);
/* From a llama2.c tokenizer.bin image (for the converter). */
int tokenizer_from_llama2c(struct tokenizer *t, const void *buf, size_t size, int vocab_size,
                           char *err);
void tokenizer_free(struct tokenizer *t);

/* Encode `len` bytes of text. Writes at most `cap` ids to `out` and sets *n. Fails (with the
 * count needed in err) if cap is too small. */
int tokenizer_encode(const struct tokenizer *t, const char *text, size_t len, int add_bos,
                     int *out, int cap, int *n, char *err);
/* The bytes of token `id` when it follows token `prev` (-1 at the start). Sets *len. Returns a
 * pointer into the tokenizer or into `scratch` (at least 1 byte) for byte tokens. */
const char *tokenizer_decode(const struct tokenizer *t, int prev, int id, char *scratch,
                             size_t *len);

#endif
