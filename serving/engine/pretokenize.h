/* pretokenize: the pre-tokenizers of byte-level BPE vocabularies (GGUF tokenizer.ggml.pre), which
 * cut text into words before merges run, each exactly as llama.cpp (the oracle's commit) cuts:
 *
 *   llama3 (llama-bpe, ...): (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
 *                       ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 *   qwen2:              the same with \p{N} (one digit per word)
 *   tekken:             [^\r\n\p{L}\p{N}]?UPPER*LOWER+|[^\r\n\p{L}\p{N}]?UPPER+LOWER*|\p{N}|
 *                       ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
 *                       where, as llama.cpp runs it, UPPER is a letter other than a-z and LOWER
 *                       a letter other than A-Z: every letter outside ASCII counts as both, and
 *                       marks (\p{M}) are not letters (Mistral's regex has \p{Lu}/\p{Ll}/\p{M}
 *                       classes there; docs/tokenizer.md lists where the two differ)
 *   gpt2:               's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *   default:            llama.cpp's chain for files without a pre-tokenizer: runs of
 *                       [\p{P}$+<=>^~|] apart, then gpt2 on each piece, then \p{N}+ runs apart,
 *                       then ASCII digits in threes ([0-9][0-9][0-9])
 *
 * Alternatives are tried in order at each position and the first that matches wins (ECMAScript
 * and Oniguruma semantics), quantifiers greedy with backtracking, each written out as a matcher
 * over code points and their classes (unicode.h) rather than run by a regex engine. Contractions
 * are ASCII case-insensitive (no other code point lower-cases to one of their letters). */
#ifndef STRATA_PRETOKENIZE_H
#define STRATA_PRETOKENIZE_H

#include <stddef.h>
#include <stdint.h>

enum pretok {
    PRETOK_DEFAULT,
    PRETOK_GPT2,
    PRETOK_LLAMA3,
    PRETOK_QWEN2,
    PRETOK_TEKKEN,
};

/* The pre-tokenizer a GGUF tokenizer.ggml.pre names (len bytes, not NUL-terminated), or -1;
 * with llama.cpp's defaults for such a vocabulary: ignore_merges, and whether it adds BOS. */
int pretok_by_name(const char *name, size_t len, int *ignore_merges, int *add_bos);
/* The names accepted, for error messages ("llama-bpe, llama3, ..."). */
const char *pretok_names(void);

/* Cut cps[0..n), whose classes are fl[i] = unicode_flags(cps[i]), into words: writes the end of
 * each word (exclusive, a code point index) to ends[] in order and returns the number of words
 * (at most n; ends[last] == n). The default pre-tokenizer needs scratch room for n ints in tmp
 * (NULL is allowed for the others). */
int pretok_split(enum pretok p, const uint32_t *cps, const uint8_t *fl, int n, int *ends, int *tmp);

#endif
