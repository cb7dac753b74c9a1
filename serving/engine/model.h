/* model: a Llama-family model's config and weights, placed in execution order.
 *
 * Architectures (general.architecture; metadata keys under that prefix, "qwen2.block_count"):
 *   llama  Llama 1-3.x, Mistral: interleaved-pair RoPE; optional q/k/v biases; optional
 *          rope_freqs.weight (Llama 3.1 scaling); head dimension from key_length (Mistral Nemo)
 *   qwen2  q/k/v biases (required), NeoX RoPE (pairs i, i + head_dim/2)
 *   qwen3  per-head RMSNorm of q and k before RoPE, NeoX RoPE, head dimension from key_length
 * Anything else is refused with one line naming it and these three (docs/engine.md).
 *
 * model_plan() reads the config from GGUF metadata and checks every tensor the architecture needs:
 * name, type, and shape against the config, with messages like
 *   "model.gguf: tensor blk.3.attn_q.weight: shape 64x65 does not match dim 64".
 * It then lays the tensors out in execution order into one weight image:
 *   span 0      : token_embd
 *   span 1+l    : block l: attn_norm, attn_q, attn_k, attn_v, [attn_q/k/v.bias], [attn_q_norm,
 *                 attn_k_norm], [rope_freqs], attn_output, ffn_norm, ffn_gate, ffn_down, ffn_up
 *                 (bracketed: where the config has them), l = 0 .. n_layers-1
 *   span L+1    : output_norm, output (absent output = tied to token_embd, nothing stored)
 * A layer's span holds everything that layer needs, so a node holding layers [0, k) runs them
 * before the other spans arrive: the file's one rope_freqs.weight (n_rot/2 floats) is copied into
 * every layer's span, as llama.cpp hands the same tensor to every layer.
 * Each span is a contiguous byte range of the image, so weights can be streamed and made resident
 * one layer at a time. Spans start on 4096-byte boundaries (a span can be mapped, registered or
 * sent on its own) and tensors on 64-byte boundaries (SIMD loads). model_plan() does not touch
 * tensor data; model_fill() copies a span's tensors from the GGUF buffer into the image (the
 * loader) and model_bind() points the tensor structs into an image that is already filled (e.g.
 * received from a peer). */
#ifndef STRATA_MODEL_H
#define STRATA_MODEL_H

#include "serving/engine/gguf.h"

#include <stddef.h>
#include <stdint.h>

#define MODEL_MAX_LAYERS 256

enum model_arch { ARCH_LLAMA, ARCH_QWEN2, ARCH_QWEN3, N_ARCHS };
/* Which elements of a head RoPE rotates together: (2i, 2i+1) as llama2.c and ggml's "normal"
 * mode, or (i, i + head_dim/2) as GPT-NeoX and ggml's NEOX mode. */
enum rope_style { ROPE_PAIRS, ROPE_HALVES };

struct model_config {
    int arch;       /* enum model_arch */
    int dim;        /* embedding width */
    int hidden_dim; /* FFN width */
    int n_layers;
    int n_heads;
    int n_kv_heads; /* < n_heads for grouped-query attention */
    int head_dim;   /* ARCH.attention.key_length, else dim / n_heads */
    int q_dim;      /* n_heads * head_dim: may differ from dim (Mistral Nemo, Qwen3) */
    int kv_dim;     /* n_kv_heads * head_dim */
    int vocab_size;
    int seq_len;    /* trained context length */
    float norm_eps; /* RMSNorm epsilon (also of the q/k norms) */
    float rope_theta;
    float rope_scale; /* every angle times this: 1 / rope.scaling.factor (linear scaling), else 1 */
    int rope_style;   /* enum rope_style */
    int qkv_bias;     /* 1: q, k, v = W x + b (layer_weights bq, bk, bv) */
    int qk_norm;      /* 1: per-head RMSNorm of q and k before RoPE (q_norm, k_norm) */
    int rope_freqs;   /* 1: pair i's frequency is divided by rope_freqs[i] */
};

/* "llama", "qwen2", "qwen3". */
const char *model_arch_name(int arch);

/* A weight matrix or vector. Matrices are row-major with `rows` output rows of `cols` inputs
 * (GGUF ne[0] = cols, ne[1] = rows). */
struct tensor {
    const void *data;
    uint32_t type; /* enum ggml_type */
    int rows, cols;
    size_t nbytes;
};

struct layer_weights {
    struct tensor attn_norm;  /* (dim) f32 */
    struct tensor wq;         /* (q_dim, dim) */
    struct tensor wk;         /* (kv_dim, dim) */
    struct tensor wv;         /* (kv_dim, dim) */
    struct tensor bq, bk, bv; /* (q_dim), (kv_dim), (kv_dim) f32; with cfg.qkv_bias */
    struct tensor q_norm;     /* (head_dim) f32, shared by the heads; with cfg.qk_norm */
    struct tensor k_norm;     /* (head_dim) f32 */
    struct tensor rope_freqs; /* (head_dim/2) f32, this layer's copy; with cfg.rope_freqs */
    struct tensor wo;         /* (dim, q_dim) */
    struct tensor ffn_norm;   /* (dim) f32 */
    struct tensor w_gate;     /* (hidden_dim, dim) */
    struct tensor w_down;     /* (dim, hidden_dim) */
    struct tensor w_up;       /* (hidden_dim, dim) */
};

/* A layer's tensors in execution order (the order of its span), the one list of them: the file's
 * name of each is "blk.N." + layer_tensor_name[k] ("attn_q.weight"), but for rope_freqs, the
 * file's one "rope_freqs.weight" that every layer gets a copy of. The CUDA plan, the converter
 * and the synthetic-model writer name the tensors from here. */
enum layer_tensor {
    LT_ATTN_NORM,
    LT_ATTN_Q,
    LT_ATTN_K,
    LT_ATTN_V,
    LT_Q_BIAS, /* cfg.qkv_bias */
    LT_K_BIAS,
    LT_V_BIAS,
    LT_Q_NORM, /* cfg.qk_norm */
    LT_K_NORM,
    LT_ROPE_FREQS, /* cfg.rope_freqs */
    LT_ATTN_OUT,
    LT_FFN_NORM,
    LT_FFN_GATE,
    LT_FFN_DOWN,
    LT_FFN_UP,
    LAYER_TENSORS
};
extern const char *const layer_tensor_name[LAYER_TENSORS];
/* 1 when a layer of config c has tensor k (the bracketed ones above only where c says). */
int layer_tensor_present(const struct model_config *c, int k);
/* What an f32 vector is for messages ("norm weights", "biases", "rope frequency factors"); NULL
 * for a matrix. */
const char *layer_tensor_vector(int k);
/* Tensor k of a layer (w->wq for LT_ATTN_Q). */
const struct tensor *layer_tensor(const struct layer_weights *w, int k);

struct span {
    uint64_t offset, size; /* in the weight image */
};

/* Where one tensor goes. */
struct model_slot {
    const struct gguf_tensor *src; /* in the GGUF */
    uint64_t image_offset;         /* in the weight image */
    int span;                      /* 0 .. n_layers+1 */
};

struct model {
    struct model_config cfg;
    struct tensor token_embd;  /* (vocab, dim) */
    struct tensor output_norm; /* (dim) f32 */
    struct tensor output;      /* (vocab, dim); == token_embd when tied */
    int tied_output;
    struct layer_weights layers[MODEL_MAX_LAYERS];

    int n_spans; /* n_layers + 2 */
    struct span spans[MODEL_MAX_LAYERS + 2];
    /* Where each span's tensors lie in the GGUF file: [offset, offset+size) covers them all
     * (absolute file offsets). file_in_order is 1 when these ranges are disjoint and ascending,
     * i.e. the file itself is in execution order (as `strata convert`, synth_model and llama.cpp
     * write it), so a span can be read or sent straight from the file. */
    struct span file_spans[MODEL_MAX_LAYERS + 2];
    int file_in_order;
    uint64_t image_size;
    int n_slots;
    struct model_slot *slots;
    const struct gguf *gguf;
};

/* Read config, validate tensors, compute the layout. `what` names the file in messages. */
int model_plan(struct model *m, const struct gguf *g, const char *what, char *err);
/* Copy span `s` from the GGUF data into `image` (image_size bytes). */
int model_fill(struct model *m, uint8_t *image, int s, char *err);
/* Point every tensor into `image`. Safe to call before the spans are filled. */
void model_bind(struct model *m, const uint8_t *image);
void model_free(struct model *m);

#endif
