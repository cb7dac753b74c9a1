/* quant_preset: llama.cpp's quantizer presets (llama-quantize's file types: Q4_K_M, Q3_K_S, ...)
 * and the type each of a llama model's tensors gets under one, as llama-quantize decides it
 * without an importance matrix (output.weight Q6_K, attn_v and ffn_down of some layers one or two
 * types up, ...), so a tool can write the files people download. Policy only: the bytes come from
 * quant.h's quantizers. */
#ifndef STRATA_QUANT_PRESET_H
#define STRATA_QUANT_PRESET_H

#include <stdint.h>

struct quant_preset {
    const char *name;   /* "Q4_K_M", as llama-quantize spells it */
    uint32_t base;      /* the type of the tensors nothing moves up (ggml type) */
    uint32_t file_type; /* general.file_type (llama_ftype) */
};

/* The preset of that name (case-insensitive: q4_k_m, Q4_K_M), or NULL. F32, F16 and BF16 are
 * presets too (every matrix that type). */
const struct quant_preset *quant_preset_find(const char *name);
/* The names, for messages: "Q2_K, Q3_K_S, ...". */
const char *quant_preset_list(void);

/* Where a tensor sits, as the preset rules look at it. */
enum quant_tensor_kind {
    QT_TOKEN_EMBD,
    QT_OUTPUT, /* output.weight, or token_embd.weight when the model has no output.weight */
    QT_ATTN_Q,
    QT_ATTN_K,
    QT_ATTN_V,
    QT_ATTN_OUTPUT,
    QT_FFN_GATE,
    QT_FFN_DOWN,
    QT_FFN_UP,
};

/* The type of a matrix of `cols` columns in layer `layer` of `n_layers` (n_gqa = heads / kv
 * heads), including llama-quantize's fallbacks when cols is not a multiple of the chosen type's
 * block (IQ4_NL, Q5_0, Q5_1, Q8_0, then F16). */
uint32_t quant_preset_type(const struct quant_preset *p, enum quant_tensor_kind kind, int layer,
                           int n_layers, int n_gqa, uint64_t cols);

#endif
