/* cuda_attn_limits: the shape constants k_attention (k_attention.cuh) is compiled with and the
 * host launches it with (cuda_plan.h). Plain macros: included by nvcc and by the C compiler. */
#ifndef STRATA_CUDA_ATTN_LIMITS_H
#define STRATA_CUDA_ATTN_LIMITS_H

#define CUDA_ATTN_THREADS   128 /* 4 warps a block */
#define CUDA_ATTN_MAX_HD    256 /* head_dim at most */
#define CUDA_ATTN_TILE      256 /* positions a block scores at once */
#define CUDA_ATTN_MAX_SPLIT 32  /* ranges a token's positions split into, at most */

#endif
