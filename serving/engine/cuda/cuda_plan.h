/* cuda_plan: where every weight lives on the GPU and how it gets there, and the launch shapes of
 * the kernels. Pure arithmetic on the model's tensors: no driver calls, so it is tested on
 * machines without a GPU.
 *
 * Upload schedule: span s (model.h: 0 = token_embd, 1+l = block l, L+1 = output) is one host
 * byte range [host, host+bytes) holding its tensors (the weight image is in execution order, so
 * the range is contiguous). It is copied to the staging buffer (the size of the largest span) on
 * the copy stream, then each tensor is repacked from staging offset src_off into the device
 * layout (kernels.cu) at dst_off of the resident weight memory, and an event marks the span
 * ready; the compute stream waits on that event before running the layer. A tied output reuses
 * token_embd's device copy. A layer's vectors (biases, q/k norms, rope_freqs: model.h) travel in
 * its span like its matrices and are copied as f32 arrays. */
#ifndef STRATA_CUDA_PLAN_H
#define STRATA_CUDA_PLAN_H

#include "serving/engine/cuda/cuda_attn_limits.h"
#include "serving/engine/model.h"

#include <stddef.h>
#include <stdint.h>

#define CUDA_DEV_ALIGN 256 /* every device array starts on a 256-byte boundary */

/* A layer's tensors on the device: the nine every architecture has, then the ones the config may
 * add (model.h's enum layer_tensor names each: cuda_plan.c's slot_tensor). */
enum {
    CM_ATTN_NORM,
    CM_Q,
    CM_K,
    CM_V,
    CM_O,
    CM_FFN_NORM,
    CM_GATE,
    CM_DOWN,
    CM_UP,
    CM_BQ, /* cfg.qkv_bias */
    CM_BK,
    CM_BV,
    CM_Q_NORM, /* cfg.qk_norm */
    CM_K_NORM,
    CM_ROPE_FREQS, /* cfg.rope_freqs */
    CUDA_LAYER_TENSORS
};

struct cuda_mat {
    const struct tensor *t; /* host tensor */
    const char *name;       /* "blk.3.attn_q.weight", the file's name, for messages */
    int span;
    uint32_t type;
    int rows, cols, ld; /* ld: elements per device row (F32/F16/BF16), else cols */
    uint64_t src_off;   /* in the span's staging copy */
    uint64_t dst_off;   /* in resident device weight memory: quants/elements */
    uint64_t qs_bytes;  /* quants or elements, padded rows included */
    /* The other planes of a block type (cuda_block_format), each at dst_off + *_off, in the
     * order qs, e, s, d; a plane the type lacks has 0 bytes. */
    uint64_t e_off, e_bytes; /* high bits */
    uint64_t s_off, s_bytes; /* sub-block scales */
    uint64_t d_off, d_bytes; /* scales */
};

/* A ggml block type on the device: which bytes of each block go to which plane (qs, e, s, d;
 * k_quant.cuh's table). Q8_0 and Q4_0 are here too (qs and d), with the layout their own repack
 * kernel makes. */
enum { CUDA_PLANE_QS, CUDA_PLANE_E, CUDA_PLANE_S, CUDA_PLANE_D, CUDA_PLANES };
struct cuda_block_format {
    uint32_t type;
    int elems, bytes;     /* per block */
    int off[CUDA_PLANES]; /* where plane p's bytes start in a ggml block */
    int len[CUDA_PLANES]; /* bytes per block in plane p; 0: no such plane */
};
/* NULL for F32/F16/BF16 and for types the kernels lack. */
const struct cuda_block_format *cuda_block_format(uint32_t type);

struct cuda_span {
    const uint8_t *host; /* first byte of the span in host memory */
    uint64_t bytes;      /* bytes to copy */
    int first_mat, n_mats;
};

struct cuda_plan {
    int n_mats;
    struct cuda_mat *mats;              /* 1 + layer_stride L + 2, in span order */
    int layer_stride;                   /* mats per layer: 9 + the config's optional ones */
    int layer_slot[CUDA_LAYER_TENSORS]; /* where CM_x sits among a layer's mats; -1: absent */
    int n_spans;
    struct cuda_span spans[MODEL_MAX_LAYERS + 2];
    uint64_t staging_bytes;  /* the largest span */
    uint64_t device_bytes;   /* resident weights, all spans */
    int embd, out_norm, out; /* mat indices; out == embd when tied */
};

/* Lay out m's weights. Fails naming the tensor for types the CUDA kernels lack (anything but
 * F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K..Q6_K, IQ4_XS), norms and other
 * vectors that are not F32, block types whose cols are not a whole number of blocks, or tensors
 * whose bytes do not match their shape. */
int cuda_plan_weights(struct cuda_plan *p, const struct model *m, char *err);
void cuda_plan_free(struct cuda_plan *p);
/* Index in mats of layer l's tensor f (CM_*), or -1 where the model has none. */
static inline int cuda_plan_layer_mat(const struct cuda_plan *p, int l, int f)
{
    int slot = p->layer_slot[f];
    return slot < 0 ? -1 : 1 + p->layer_stride * l + slot;
}

/* Bytes of one ggml row of `cols` elements (0 if unsupported or not a whole number of blocks). */
uint64_t cuda_ggml_row_bytes(uint32_t type, int cols);

/* ---- launch shapes ---- */
#define CUDA_GEMV_THREADS    256 /* 8 warps: one row each */
#define CUDA_GEMV_MAX_NT     8   /* tokens per GEMV pass */
#define CUDA_GEMM_MIN_TOKENS 16
#define CUDA_GEMM_TILE       64
#define CUDA_GEMM_THREADS    128
#define CUDA_SAMPLE_THREADS  1024

/* Blocks for a GEMV over `rows` rows: a warp per row, 8 per block (every type). */
static inline unsigned cuda_gemv_blocks(uint32_t type, int rows)
{
    int per_block = CUDA_GEMV_THREADS / 32;
    (void)type;
    return (unsigned)((rows + per_block - 1) / per_block);
}

/* The GEMV kernel family of a type: matrices of one family and one input share a launch (q, k
 * and v; gate and up). The block types quantize the activations in the kernel as the CPU does:
 * Q8_K for the super-blocks (Q2_K..Q6_K, IQ4_XS: k_gemvq_k_*), Q8_0/Q8_1 for Q8_0, Q4_0, Q4_1,
 * Q5_0, Q5_1, IQ4_NL (k_gemvq_32_*); F32, F16, BF16 are each their own (k_gemv_<type>_*). */
enum { CUDA_FAM_SUPER = 1000, CUDA_FAM_32 = 1001 };
static inline int cuda_gemv_family(uint32_t type)
{
    switch (type) {
    case 10:
    case 11:
    case 12:
    case 13:
    case 14:
    case 23: /* Q2_K..Q6_K, IQ4_XS */
        return CUDA_FAM_SUPER;
    case 2:
    case 3:
    case 6:
    case 7:
    case 8:
    case 20: /* Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL */
        return CUDA_FAM_32;
    }
    return (int)type;
}
/* Dynamic shared memory of k_gemvq for nt tokens of `cols` (0 for the other kernels): the int8
 * values, then Q8_K's scale per 256 and sums per 16, or Q8_0/1's {d, s, sum, 0} per 32. */
static inline size_t cuda_gemvq_smem(uint32_t type, int cols, int nt)
{
    int fam = cuda_gemv_family(type);
    size_t per = fam == CUDA_FAM_SUPER ? (size_t)cols + cols / 256 * 4 + cols / 16 * 2
                 : fam == CUDA_FAM_32  ? (size_t)cols + cols / 32 * 16
                                       : 0;
    return (per * (size_t)nt + 15) / 16 * 16; /* copied in 16-byte vectors */
}
/* Rows each warp of a quantized GEMV takes: enough that the grid is one wave of the blocks an SM
 * holds (3 for one token, 2 for more: k_gemvq's launch bounds), so each block copies its quantized
 * activations into shared memory once for many rows; at least 1. */
static inline int cuda_gemvq_rpw(int total_rows, int nt, int sms)
{
    long long resident =
        (long long)(nt <= 1 ? 3 : 2) * (sms > 0 ? sms : 1) * (CUDA_GEMV_THREADS / 32);
    long long r = (total_rows + resident - 1) / resident;
    return r < 1 ? 1 : (int)r;
}
/* Shared memory a k_gemvq launch may ask for: more would leave too few blocks per SM. */
#define CUDA_GEMVQ_SMEM_MAX (96 * 1024)
/* Tokens per GEMV launch (1..CUDA_GEMV_MAX_NT) for `cols` under a shared-memory limit. */
static inline int cuda_gemv_pass(uint32_t type, int cols, size_t smem_limit)
{
    int nt = CUDA_GEMV_MAX_NT;
    while (nt > 1 && cuda_gemvq_smem(type, cols, nt) > smem_limit) nt /= 2;
    return nt;
}
/* Whether the RMSNorm before a GEMV of `type` over `dim` columns and n tokens is one launch with
 * the activations' quantization (k_rmsnorm_quant_*): a block type, dim a whole number of 256
 * (the super family's shared-memory permutation works on whole groups), the row in the default
 * 48 KiB of shared memory, and all n tokens in one GEMV pass. */
static inline int cuda_rmsnorm_fuses(uint32_t type, int dim, int n, size_t smem_limit)
{
    int fam = cuda_gemv_family(type);
    return (fam == CUDA_FAM_SUPER || fam == CUDA_FAM_32) && dim > 0 && dim % 256 == 0 &&
           (size_t)dim * 4 <= 48 * 1024 && n <= cuda_gemv_pass(type, dim, smem_limit);
}
/* The GEMV template (1, 2, 4, 8) that covers nt tokens (1 <= nt <= 8). */
static inline int cuda_gemv_nt(int nt)
{
    return nt <= 1 ? 1 : nt <= 2 ? 2 : nt <= 4 ? 4 : 8;
}
/* Tensor cores pay once a weight tile is shared by enough tokens; F32 weights always take GEMV
 * (exact f32 products for the small F32 models). */
static inline int cuda_use_gemm_from(uint32_t type, int n_tok, int min_tokens)
{
    return type != 0 /* F32 */ && n_tok >= min_tokens;
}
static inline int cuda_use_gemm(uint32_t type, int n_tok)
{
    return cuda_use_gemm_from(type, n_tok, CUDA_GEMM_MIN_TOKENS);
}
static inline unsigned cuda_gemm_blocks(int n)
{
    return (unsigned)((n + CUDA_GEMM_TILE - 1) / CUDA_GEMM_TILE);
}
/* k_attention (k_attention.cuh): head_dim up to CUDA_ATTN_MAX_HD; positions in tiles of
 * CUDA_ATTN_TILE. A step of few tokens splits each token's positions into n_split ranges so that
 * about 4 blocks per SM run (flash-decoding); at least 64 positions a range at full context, at
 * most CUDA_ATTN_MAX_SPLIT ranges. The partials take n_tok * n_split * n_heads * (head_dim + 2)
 * floats (cuda_attention_part_floats: the most any step of up to max_tokens tokens needs). */
static inline int cuda_attention_splits(int n_tok, int n_heads, int ctx, int sms)
{
    long long blocks = (long long)n_tok * n_heads, want = 4LL * (sms > 0 ? sms : 1);
    if (blocks >= want) return 1;
    long long s = (want + blocks - 1) / blocks, by_ctx = (ctx + 63) / 64;
    if (s > by_ctx) s = by_ctx;
    if (s > CUDA_ATTN_MAX_SPLIT) s = CUDA_ATTN_MAX_SPLIT;
    return s < 1 ? 1 : (int)s;
}
static inline size_t cuda_attention_part_floats(int max_tokens, int n_heads, int head_dim, int ctx,
                                                int sms)
{
    size_t most = 0;
    for (int n = 1; n <= max_tokens; n++) {
        int s = cuda_attention_splits(n, n_heads, ctx, sms);
        if (s > 1 && (size_t)n * s > most) most = (size_t)n * s;
        if (s == 1) break; /* more tokens never split again */
    }
    return most * (size_t)n_heads * (size_t)(head_dim + 2);
}
/* Grid for a grid-stride elementwise kernel over n elements: enough blocks to fill a large GPU,
 * never more than the work. */
static inline unsigned cuda_elementwise_blocks(long long n, int threads)
{
    long long b = (n + threads - 1) / threads;
    return (unsigned)(b < 1 ? 1 : b > 4096 ? 4096 : b);
}

#endif
