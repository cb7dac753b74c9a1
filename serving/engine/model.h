/* model: a Llama-family model's config and weights, placed in execution order.
 *
 * model_plan() reads the config from GGUF metadata (llama.* keys) and checks every tensor the
 * architecture needs: name, type, and shape against the config, with messages like
 *   "model.gguf: tensor blk.3.attn_q.weight: shape 64x65 does not match dim 64".
 * It then lays the tensors out in execution order into one weight image:
 *   span 0      : token_embd
 *   span 1+l    : block l (attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm, ffn_gate,
 *                 ffn_down, ffn_up), l = 0 .. n_layers-1
 *   span L+1    : output_norm, output (absent output = tied to token_embd, nothing stored)
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

struct model_config {
    int dim;        /* embedding width */
    int hidden_dim; /* FFN width */
    int n_layers;
    int n_heads;
    int n_kv_heads; /* < n_heads for grouped-query attention */
    int head_dim;   /* dim / n_heads */
    int kv_dim;     /* n_kv_heads * head_dim */
    int vocab_size;
    int seq_len;    /* trained context length */
    float norm_eps; /* RMSNorm epsilon */
    float rope_theta;
};

/* A weight matrix or vector. Matrices are row-major with `rows` output rows of `cols` inputs
 * (GGUF ne[0] = cols, ne[1] = rows). */
struct tensor {
    const void *data;
    uint32_t type; /* enum ggml_type */
    int rows, cols;
    size_t nbytes;
};

struct layer_weights {
    struct tensor attn_norm; /* (dim) f32 */
    struct tensor wq;        /* (n_heads*head_dim, dim) */
    struct tensor wk;        /* (kv_dim, dim) */
    struct tensor wv;        /* (kv_dim, dim) */
    struct tensor wo;        /* (dim, n_heads*head_dim) */
    struct tensor ffn_norm;  /* (dim) f32 */
    struct tensor w_gate;    /* (hidden_dim, dim) */
    struct tensor w_down;    /* (dim, hidden_dim) */
    struct tensor w_up;      /* (hidden_dim, dim) */
};

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
