/* kernels: every step of the forward pass on the GPU, compiled by nvcc into one fatbin
 * (build/cuda/kernels.fatbin: sm_80, sm_90 and compute_90 PTX) that libstrata embeds and loads
 * with cuModuleLoadData. All entry points are extern "C" so the host looks them up by name.
 *
 * Device weight layout (made by the repack kernels from the ggml bytes uploaded into staging):
 *   F32/F16/BF16: rows x ld elements, ld = cols rounded up to 8, zero padded, so every row starts
 *                 16-byte aligned and a lane can load 8 halves (or 4 floats) at once;
 *   Q8_0: qs rows x cols int8, then d rows x cols/32 halves (scales split from the quants so the
 *         quants are 16-byte aligned: ggml's 34-byte blocks are only 2-byte aligned);
 *   Q4_0: qs rows x cols/2 bytes (one block = one 16-byte load, ggml nibble order), d likewise;
 *   Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS: each block's fields in up to
 *         four planes (quants, high bits, sub-block scales, scales), see k_quant.cuh.
 * Activations are f32 rows; the KV cache is f32 in the CPU cache's layout. */
#include "k_common.cuh"
#include "k_repack.cuh"
#include "k_embed.cuh"
#include "k_gemv.cuh"
#include "k_gemvq.cuh"
#include "k_gemm.cuh"
#include "k_pointwise.cuh"
#include "k_attention.cuh"
#include "k_sample.cuh"
