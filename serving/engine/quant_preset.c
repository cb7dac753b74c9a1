/* quant_preset: llama-quantize's per-tensor choices for the llama architecture without an
 * importance matrix (llama.cpp's llama-quant.cpp, llama_tensor_get_type, read for the rules). */
#include "serving/engine/quant_preset.h"

#include "serving/engine/gguf.h"

#include <stddef.h>
#include <strings.h>

static const struct quant_preset presets[] = {
    {"F32", GGML_F32, 0},        {"F16", GGML_F16, 1},      {"BF16", GGML_BF16, 32},
    {"Q2_K", GGML_Q2_K, 10},     {"Q3_K_S", GGML_Q3_K, 11}, {"Q3_K_M", GGML_Q3_K, 12},
    {"Q3_K_L", GGML_Q3_K, 13},   {"Q4_K_S", GGML_Q4_K, 14}, {"Q4_K_M", GGML_Q4_K, 15},
    {"Q5_K_S", GGML_Q5_K, 16},   {"Q5_K_M", GGML_Q5_K, 17}, {"Q6_K", GGML_Q6_K, 18},
    {"Q4_0", GGML_Q4_0, 2},      {"Q4_1", GGML_Q4_1, 3},    {"Q5_0", GGML_Q5_0, 8},
    {"Q5_1", GGML_Q5_1, 9},      {"Q8_0", GGML_Q8_0, 7},    {"IQ4_NL", GGML_IQ4_NL, 25},
    {"IQ4_XS", GGML_IQ4_XS, 30},
};

const struct quant_preset *quant_preset_find(const char *name)
{
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (!strcasecmp(name, presets[i].name)) return &presets[i];
    return NULL;
}

const char *quant_preset_list(void)
{
    return "F32, F16, BF16, Q2_K, Q3_K_S, Q3_K_M, Q3_K_L, Q4_K_S, Q4_K_M, Q5_K_S, Q5_K_M, Q6_K, "
           "Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, IQ4_XS";
}

static int is(const struct quant_preset *p, const char *name)
{
    return !strcasecmp(p->name, name);
}

/* The layers that get more bits: the first and last eighth and every third between. */
static int more_bits(int layer, int n)
{
    return layer < n / 8 || layer >= 7 * n / 8 || (layer - n / 8) % 3 == 2;
}

static uint32_t chosen(const struct quant_preset *p, enum quant_tensor_kind kind, int i, int n,
                       int n_gqa, uint64_t cols)
{
    const uint32_t t = p->base;
    switch (kind) {
    case QT_OUTPUT:
        if (cols % (uint64_t)ggml_block_elems(t)) return GGML_Q8_0;
        return t == GGML_Q8_0 ? GGML_Q8_0 : GGML_Q6_K;
    case QT_ATTN_V:
        if (is(p, "Q2_K")) return n_gqa >= 4 ? GGML_Q4_K : GGML_Q3_K;
        if (is(p, "Q3_K_M")) return i < 2 ? GGML_Q5_K : GGML_Q4_K;
        if (is(p, "Q3_K_L")) return GGML_Q5_K;
        if ((is(p, "IQ4_NL") || is(p, "IQ4_XS")) && n_gqa >= 4) return GGML_Q5_K;
        if ((is(p, "Q4_K_M") || is(p, "Q5_K_M")) && more_bits(i, n)) return GGML_Q6_K;
        if (is(p, "Q4_K_S") && i < 4) return GGML_Q5_K;
        return t;
    case QT_FFN_DOWN:
        if (is(p, "Q2_K")) return GGML_Q3_K;
        if (is(p, "Q3_K_M")) return i < n / 16 ? GGML_Q5_K : GGML_Q4_K;
        if (is(p, "Q3_K_L")) return GGML_Q5_K;
        if (is(p, "Q4_K_M")) return more_bits(i, n) ? GGML_Q6_K : t;
        if (i < n / 8 && (is(p, "IQ4_NL") || is(p, "IQ4_XS"))) return GGML_Q5_K;
        if (is(p, "Q5_K_M") && more_bits(i, n)) return GGML_Q6_K;
        if (is(p, "Q4_K_S") && i < n / 8) return GGML_Q5_K;
        return t;
    case QT_ATTN_OUTPUT:
        if (is(p, "Q2_K")) return GGML_Q3_K;
        if (is(p, "Q3_K_M")) return GGML_Q4_K;
        if (is(p, "Q3_K_L")) return GGML_Q5_K;
        return t;
    default:
        return t;
    }
}

uint32_t quant_preset_type(const struct quant_preset *p, enum quant_tensor_kind kind, int layer,
                           int n_layers, int n_gqa, uint64_t cols)
{
    /* F32, F16, BF16: every matrix that type (llama-quantize moves nothing for them) */
    if (ggml_block_elems(p->base) == 1) return p->base;
    uint32_t t = chosen(p, kind, layer, n_layers, n_gqa, cols);
    if (cols % (uint64_t)ggml_block_elems(t) == 0) return t;
    switch (t) {
    case GGML_Q2_K:
    case GGML_Q3_K:
    case GGML_IQ4_XS:
        t = GGML_IQ4_NL;
        break;
    case GGML_Q4_K:
        t = GGML_Q5_0;
        break;
    case GGML_Q5_K:
        t = GGML_Q5_1;
        break;
    case GGML_Q6_K:
        t = GGML_Q8_0;
        break;
    }
    return cols % (uint64_t)ggml_block_elems(t) == 0 ? t : GGML_F16;
}
