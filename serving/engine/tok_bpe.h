/* tok_bpe: byte-level BPE (GGUF tokenizer.ggml.model = "gpt2"), as llama.cpp's BPE session runs
 * it. Internal to the tokenizer (tokenizer.c loads and calls it).
 *
 * Encoding one stretch of raw text (no special tokens in it): read it as code points the way
 * llama.cpp does (unicode.h: an invalid byte is U+FFFD), cut it into words with the vocabulary's
 * pre-tokenizer (pretokenize.h), write each word back as UTF-8 and spell each byte as its GPT-2
 * character (the 256-character alphabet of printable Latin-1 plus U+0100.. for the rest). With
 * ignore_merges (llama-bpe, tekken) a word that is a token is that token. Otherwise each byte
 * starts as its own symbol and the adjacent pair whose merge has the lowest rank in
 * tokenizer.ggml.merges is merged (leftmost among equal ranks) until no pair has a merge; the
 * symbols are the ids. Merges are held by the ids of their two parts, so a merge whose parts or
 * result are not tokens never applies (llama.cpp could still apply it to strings, in vocabularies
 * that no converter writes); a byte whose character is not a token is dropped, as llama.cpp drops
 * it. Words merge independently; the work is O(w log w) in a word of w bytes.
 *
 * Decoding tables: each token's bytes (tokenizer.dec), llama.cpp's token_to_piece: a normal token
 * is its characters mapped back to bytes (a character outside the alphabet is written as
 * "[UNK_BYTE_0x<hex>" + the token's text + "]", as llama.cpp writes it); user-defined tokens,
 * and control and unknown ones when rendered, are their text; unused and byte tokens are
 * nothing. */
#ifndef STRATA_TOK_BPE_H
#define STRATA_TOK_BPE_H

#include "serving/engine/gguf.h"
#include "serving/engine/tokenizer.h"

/* After tokens, types and the piece hash are loaded: the merges, the pre-tokenizer `pre`
 * (enum pretok), ignore_merges and the decoding tables. */
int bpe_load(struct tokenizer *t, const struct gguf *g, int pre, int ignore_merges, char *err);
void bpe_free(struct tokenizer *t);
/* Encode one raw stretch, appending to out[*o..cap); *o counts every id, also past cap. */
int bpe_encode(const struct tokenizer *t, const char *text, size_t len, int *out, int cap, int *o,
               char *err);

#endif
