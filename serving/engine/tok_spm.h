/* tok_spm: SentencePiece-style BPE with scores and byte fallback (GGUF tokenizer.ggml.model =
 * "llama"), tokenizing exactly as llama2.c and llama.cpp do for llama vocabularies. Internal to
 * the tokenizer (tokenizer.c calls it for each raw stretch of text).
 *
 * Encoding: the dummy-prefix space (a leading ' ' before the text, as SentencePiece adds, when the
 * vocabulary's add_space_prefix is on), then each UTF-8 code point becomes its token or, if the
 * vocabulary lacks it, its bytes as <0xNN> tokens; then the best-scoring adjacent pair is merged
 * while any merge exists. Invalid UTF-8 is never rejected and never read past the end. The merge
 * loop is llama2.c's (best score wins, leftmost on ties, a merge must score above -1e10) run with
 * a heap over a linked list, O(n log n) instead of llama2.c's O(n^2) rescans. Segmentation into
 * "code points" is llama.cpp's: a unit takes as many bytes as its lead byte announces (a stray
 * continuation byte is a unit of one), cut at the end of the text. On valid UTF-8 this is
 * llama2.c's segmentation too; on invalid UTF-8 llama2.c differs (it ends a unit at the next
 * byte that is not a continuation byte), and llama.cpp is the reference for GGUF files. */
#ifndef STRATA_TOK_SPM_H
#define STRATA_TOK_SPM_H

#include "serving/engine/tokenizer.h"

#include <stddef.h>

/* Encode one raw stretch, appending to out[*o..cap); *o counts every id, also past cap. */
int spm_encode(const struct tokenizer *t, const char *text, size_t len, int *out, int cap, int *o,
               char *err);

#endif
