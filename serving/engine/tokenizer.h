/* tokenizer: SentencePiece-style BPE with scores and byte fallback (GGUF tokenizer.ggml.model =
 * "llama"), tokenizing exactly as llama2.c and llama.cpp do for llama vocabularies.
 *
 * Encoding: optional BOS, the dummy-prefix space (a leading ' ' before the text, as SentencePiece
 * adds), then each UTF-8 code point becomes its token or, if the vocabulary lacks it, its bytes as
 * <0xNN> tokens; then the best-scoring adjacent pair is merged while any merge exists.
 * Invalid UTF-8 is treated byte by byte (byte fallback), never rejected, never read past the end.
 * The merge loop is llama2.c's (best score wins, leftmost on ties, a merge must score above
 * -1e10) run with a heap over a linked list, O(n log n) instead of llama2.c's O(n^2) rescans; BOS
 * never merges. Segmentation into "code points" follows llama2.c byte for byte: a unit starts at
 * every byte that is not a continuation byte (10xxxxxx) and holds at most 4 bytes.
 * Decoding: a token's piece with <0xNN> turned into the raw byte; after BOS the leading space of
 * the first piece is dropped (as llama2.c does); BOS and EOS decode to nothing.
 * Pieces are held with ' ' for spaces as in llama2.c's tokenizer.bin; GGUF vocabularies spell the
 * space U+2581 ("\xe2\x96\x81", SentencePiece's meta symbol) and are translated on load (and by the
 * converter on the way out), so Strata's GGUF files tokenize the same in llama.cpp. */
#ifndef STRATA_TOKENIZER_H
#define STRATA_TOKENIZER_H

#include "serving/engine/gguf.h"

#include <stddef.h>

struct tokenizer {
    int vocab_size;
    char **pieces; /* NUL-terminated piece of each id */
    int *piece_len;
    float *scores;
    int bos_id, eos_id;
    int unk_id;        /* 0: used for a byte whose <0xNN> token is missing */
    int byte_ids[256]; /* id of <0xNN>, or -1 */
    /* piece -> id: open addressing over FNV-1a hashes, hash_mask + 1 slots of ids (-1 empty).
     * A hash rather than llama2.c's sorted array so that a merge candidate (a, b) is looked up
     * without building the string a+b. Duplicate pieces resolve to the lowest id. */
    int *hash;
    unsigned hash_mask;
    int max_piece_len;
    int space_split; /* no piece has a space after a non-space: words merge independently */
    char *blob;      /* storage of all pieces */
    /* Special tokens (GGUF tokenizer.ggml.token_type 2 unknown, 3 control, 4 user-defined, as
     * llama.cpp's parse_special): ids by piece length, longest first. None without token types
     * (llama2.c tokenizer.bin). */
    int *special_ids;
    int n_special;
};

/* A piece of text to encode; in spans with parse_special the pieces of special tokens become
 * those tokens (chat template markers), elsewhere all text is plain (message content). */
struct tok_span {
    const char *text;
    size_t len;
    int parse_special;
};

/* From GGUF metadata: tokenizer.ggml.tokens, .scores, .token_type, .bos_token_id,
 * .eos_token_id. */
int tokenizer_from_gguf(struct tokenizer *t, const struct gguf *g, char *err);
/* From a llama2.c tokenizer.bin image (for the converter). */
int tokenizer_from_llama2c(struct tokenizer *t, const void *buf, size_t size, int vocab_size,
                           char *err);
void tokenizer_free(struct tokenizer *t);

/* Encode `len` bytes of text. Writes at most `cap` ids to `out` and sets *n. Fails (with the
 * count needed in err) if cap is too small. */
int tokenizer_encode(const struct tokenizer *t, const char *text, size_t len, int add_bos, int *out,
                     int cap, int *n, char *err);
/* Encode the concatenation of spans as llama.cpp does with parse_special: special-token pieces
 * found in parse_special spans are cut out (longest special first, every occurrence, then the
 * next special in the gaps) and become their tokens; each stretch of text between them is
 * encoded as by tokenizer_encode, with the dummy-prefix space (llama.cpp adds it to the first
 * stretch and after every special token). Stretches run across span boundaries. Without special
 * tokens this is tokenizer_encode of the concatenation. At most 2 * bytes + 2 ids. */
int tokenizer_encode_spans(const struct tokenizer *t, const struct tok_span *spans, int n_spans,
                           int add_bos, int *out, int cap, int *n, char *err);
/* The bytes of token `id` when it follows token `prev` (-1 at the start). Sets *len. Returns a
 * pointer into the tokenizer or into `scratch` (at least 1 byte) for byte tokens. */
const char *tokenizer_decode(const struct tokenizer *t, int prev, int id, char *scratch,
                             size_t *len);

#endif
