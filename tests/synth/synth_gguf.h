/* synth_gguf: the one generator of synthetic Llama-family models (llama, qwen2, qwen3), as
 * complete GGUF files with random weights, deterministic in the seed. The unit tests (tests/unit/synth.h), the benchmarks and the
 * synth_model tool all write their models through it.
 *
 * Weights: each tensor has its own stream, so they do not depend on the order they are generated
 * in: matrices ~ N(0, 0.02) (an Irwin-Hall approximation), norm weights ~ 1 + N(0, 0.05), so
 * activations stay in a sane range through many layers; q/k/v biases ~ N(0, 0.2), q/k norm weights
 * as norms; rope_freqs holds Llama 3.1's factors as llama.cpp's converter computes them from
 * rope_scaling {factor 8, low_freq_factor 1, high_freq_factor 4, original context 8192} and is
 * written first, as that converter does. Matrices whose rows are not a multiple of
 * the type's block stay f32 (as `strata convert` does). Without a tokenizer the vocabulary is
 * synthetic: <unk>, <s>, </s>, the 256 <0xNN> byte tokens, printable ASCII, " x" and letter pairs,
 * so the file is a complete model the tokenizer accepts; with vocab_json it is a real one (a
 * Hugging Face tokenizer.json written as llama.cpp's converter does: tests/synth/vocab_json.h),
 * and the model's vocabulary size is that tokenizer's, whatever `vocab` says. Tensors are generated one at a time while
 * the file is written (a 1.1B f32 model needs one tensor's memory, not the model's), rows split
 * over the threads; the bytes do not depend on the number of threads.
 *
 * The shape is the caller's to check (synth_model does, with its own message); the linker pulls
 * this file in beside libstrata (see the Makefile's test, tool and benchmark rules). */
#ifndef STRATA_TEST_SYNTH_GGUF_H
#define STRATA_TEST_SYNTH_GGUF_H

#include <stdint.h>

struct synth_spec {
    const char *name; /* general.name is "synth-NAME-TYPE" */
    int dim, hidden, layers, heads, kv_heads, vocab, seq;
    int tied;              /* 1: no output.weight (the embedding is the classifier) */
    uint32_t type;         /* ggml type of the matrices */
    uint64_t seed;         /* the weights are a function of the seed and the shape */
    int threads;           /* 1..16; more are clamped to 16 */
    const char *tokenizer; /* a llama2.c tokenizer.bin, or NULL for the synthetic vocabulary */
    const char *warn_as;   /* prefix for the "kept in f32" warning on stderr; NULL: no warning */
    /* The architecture (all 0: a Llama 2 file). */
    int arch;           /* enum model_arch (model.h); qwen2 always has biases, qwen3 q/k norms */
    int head_dim;       /* 0: dim / heads; else written as key_length (heads * head_dim may
                           differ from dim) */
    int qkv_bias;       /* blk.N.attn_{q,k,v}.bias in a llama file */
    int rope_freqs;     /* rope_freqs.weight (llama) */
    float rope_theta;   /* 0: 10000 */
    float output_scale; /* 0: 1; output.weight (when tied: output_norm.weight, which scales the
                           logits alike without touching the input) times this, so the next-token
                           distribution is peaked as a trained model's */
    float qk_scale;     /* 0: 1; attn_q and attn_k times this: attention scores with a spread
                           (random q . k are near 0, every position weighs alike and position
                           encodings barely matter), as a trained model's */
    /* A llama.cpp quantizer preset (quant_preset.h: "Q4_K_M", ...) or NULL. With one, `type` is
     * ignored and each matrix gets the type llama-quantize gives it under that preset (output
     * Q6_K, some layers' attn_v/ffn_down more bits, ...); the quantizers being llama.cpp's, the
     * tensors are the bytes llama-quantize would write from the same f32 weights. */
    const char *preset;
    const char *vocab_json;   /* a tokenizer.json (Llama 3, Qwen...) instead of `tokenizer` */
    const char *vocab_config; /* its tokenizer_config.json (chat template, add_bos), or NULL */
};

/* Write the model to path (through path.tmp, renamed when complete). Returns 0, or -1 with err
 * (ERRMSG_LEN bytes) naming the file and the reason. */
int synth_gguf_write(const char *path, const struct synth_spec *s, char *err);

#endif
