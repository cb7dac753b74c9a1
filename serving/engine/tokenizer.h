/* tokenizer: the vocabulary of a GGUF file (or a llama2.c tokenizer.bin) and text <-> token ids,
 * exactly as llama.cpp (the oracle's commit) tokenizes the same file. Two models:
 *
 *   "llama" (SentencePiece, tok_spm.h): Llama 2, Mistral 7B, TinyLlama; llama2.c's merge rules.
 *   "gpt2"  (byte-level BPE, tok_bpe.h): Llama 3, Qwen2/2.5/3, Mistral Nemo/Small 3, chosen by
 *           tokenizer.ggml.pre (pretokenize.h); merges from tokenizer.ggml.merges in rank order.
 *
 * This file owns what both share: loading tokens and their types, the special ids and flags
 * (bos, eos, eot, eom; add_bos_token, add_eos_token, add_space_prefix with llama.cpp's defaults),
 * the set of end-of-generation tokens as llama.cpp builds it (eos, eot, eom, the fim pad/repo/sep
 * tokens and every token whose text is one of <|eot_id|>, <|im_end|>, <|end|>, <|return|>,
 * <|call|>, <end_of_turn>, <|endoftext|>, <|eom_id|>, <EOT>, _<EOT>, <|end_of_text|>,
 * <end_of_utterance>; such tokens become control tokens), the cutting of special tokens out of
 * text (llama.cpp's parse_special), and decoding.
 *
 * Special tokens: control, unknown and user-defined tokens (tokenizer.ggml.token_type 3, 2, 4),
 * longest first. Text that may hold them (a chat template's markers) has them cut out and
 * replaced by their ids; in plain text (message content) only user-defined tokens are, as
 * llama.cpp does with parse_special off. Raw text between them is encoded by the model.
 *
 * Decoding: a token's bytes. SentencePiece: the piece with <0xNN> as its byte, the leading space
 * of the first piece after BOS dropped, BOS and EOS as nothing (llama2.c). Byte-level BPE: the
 * piece mapped back through GPT-2's byte <-> character table; control and unknown tokens are
 * nothing unless TOK_RENDER_SPECIAL asks for their text; user-defined tokens are their text. A
 * character may span tokens: the streamer holds partial UTF-8 back (serving/api/utf8.h).
 *
 * Pieces are held with ' ' for SentencePiece's U+2581 (translated on load and by the converter on
 * the way out, so Strata's GGUF files tokenize the same in llama.cpp); BPE pieces are the file's
 * text as is. Any file that loads can be encoded and decoded without reading out of bounds;
 * anything unsupported (another tokenizer model or pre-tokenizer) is one error naming it and the
 * supported ones. */
#ifndef STRATA_TOKENIZER_H
#define STRATA_TOKENIZER_H

#include "serving/engine/gguf.h"

#include <stddef.h>
#include <stdint.h>

enum tok_model { TOK_SPM, TOK_BPE };

/* tokenizer.ggml.token_type values (llama.cpp's) */
enum tok_type {
    TOKT_UNDEFINED = 0,
    TOKT_NORMAL = 1,
    TOKT_UNKNOWN = 2,
    TOKT_CONTROL = 3,
    TOKT_USER_DEFINED = 4,
    TOKT_UNUSED = 5,
    TOKT_BYTE = 6,
};

struct bpe;

struct tokenizer {
    int vocab_size;
    int model;     /* enum tok_model */
    char **pieces; /* NUL-terminated piece of each id */
    int *piece_len;
    float *scores;
    uint8_t *type; /* enum tok_type of each id (NORMAL where the file has none) */
    int bos_id, eos_id;
    int eot_id, eom_id; /* -1 if none */
    int add_bos, add_eos;
    int add_space_prefix; /* SentencePiece's dummy prefix before each raw stretch */
    int unk_id;           /* 0: used for a byte whose <0xNN> token is missing */
    int byte_ids[256];    /* id of <0xNN>, or -1 */
    /* piece -> id: open addressing over FNV-1a hashes, hash_mask + 1 slots of ids (-1 empty).
     * A hash rather than llama2.c's sorted array so that a merge candidate (a, b) is looked up
     * without building the string a+b. Duplicate pieces resolve to the lowest id. */
    int *hash;
    unsigned hash_mask;
    int max_piece_len;
    int space_split; /* no piece has a space after a non-space: words merge independently */
    char *blob;      /* storage of all pieces */
    /* Special tokens (types 2 unknown, 3 control, 4 user-defined, as llama.cpp's parse_special):
     * ids by piece length, longest first. None without token types (llama2.c tokenizer.bin). */
    int *special_ids;
    int n_special;
    /* End-of-generation tokens, ascending; eog[id] is 1 for them. */
    int *eog_ids;
    int n_eog;
    uint8_t *eog;
    /* Byte-level BPE: the decoded bytes of each token, the merges and the pre-tokenizer. */
    char **dec;
    int *dec_len;
    struct bpe *bpe;
};

/* A piece of text to encode; in spans with parse_special the pieces of special tokens become
 * those tokens (chat template markers), elsewhere only user-defined ones do (message content). */
struct tok_span {
    const char *text;
    size_t len;
    int parse_special;
};

/* From GGUF metadata: tokenizer.ggml.model, .pre, .tokens, .scores, .token_type, .merges,
 * .bos/.eos/.eot/.eom/.unknown_token_id, .add_bos_token, .add_eos_token, .add_space_prefix. */
int tokenizer_from_gguf(struct tokenizer *t, const struct gguf *g, char *err);
/* From a llama2.c tokenizer.bin image (for the converter). */
int tokenizer_from_llama2c(struct tokenizer *t, const void *buf, size_t size, int vocab_size,
                           char *err);
void tokenizer_free(struct tokenizer *t);

/* Encode `len` bytes of plain text. add_special (llama.cpp's add_special): BOS first if the
 * vocabulary adds one (add_bos), EOS last if it adds one (add_eos). Writes at most `cap` ids to
 * `out` and sets *n. Fails (with the count needed in err and *n) if cap is too small. */
int tokenizer_encode(const struct tokenizer *t, const char *text, size_t len, int add_special,
                     int *out, int cap, int *n, char *err);
/* Encode the concatenation of spans as llama.cpp does with parse_special: special-token pieces
 * found in parse_special spans (user-defined ones anywhere) are cut out (longest special first,
 * every occurrence, then the next special in the gaps) and become their tokens; each stretch of
 * text between them is encoded as by tokenizer_encode (SentencePiece adds its dummy-prefix space
 * to the first stretch and after every special token). Stretches run across span boundaries.
 * Without special tokens this is tokenizer_encode of the concatenation. At most 3 * bytes + 2
 * ids (byte-level BPE reads each invalid byte as U+FFFD, three bytes). */
int tokenizer_encode_spans(const struct tokenizer *t, const struct tok_span *spans, int n_spans,
                           int add_special, int *out, int cap, int *n, char *err);

/* The bytes of token `id` when it follows token `prev` (-1 at the start). Sets *len. Returns a
 * pointer into the tokenizer or into `scratch` (at least 1 byte) for byte tokens. */
const char *tokenizer_decode(const struct tokenizer *t, int prev, int id, char *scratch,
                             size_t *len);
/* tokenizer_decode with flags: TOK_RENDER_SPECIAL renders control and unknown tokens as their
 * text (llama.cpp's token_to_piece with special = true). */
#define TOK_RENDER_SPECIAL 1
const char *tokenizer_decode_ex(const struct tokenizer *t, int prev, int id, int flags,
                                char *scratch, size_t *len);

/* 1 if generating `id` ends a completion (llama.cpp's llama_vocab_is_eog). */
int tokenizer_is_eog(const struct tokenizer *t, int id);
/* The id whose piece is text[0..len) (SentencePiece: spaces as ' '; BPE: the file's text), or
 * -1. tokenizer_find2 looks up the concatenation a + b without building it. */
int tokenizer_find(const struct tokenizer *t, const char *text, size_t len);
int tokenizer_find2(const struct tokenizer *t, const char *a, int la, const char *b, int lb);

#endif
