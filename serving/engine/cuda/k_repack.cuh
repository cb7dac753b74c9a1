/* k_repack: ggml bytes (in the staging buffer) -> device layout. Runs once per uploaded span on
 * the copy stream, so its speed only has to beat PCIe, which byte loads easily do. */
#pragma once

/* Rows of row_bytes bytes to rows of ld_bytes bytes, zero padded (F32/F16/BF16, norm vectors). */
extern "C" __global__ void k_repack_rows(const uint8_t *src, uint8_t *dst, int rows, int row_bytes,
                                         int ld_bytes)
{
    size_t n = (size_t)rows * ld_bytes;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / ld_bytes, c = i % ld_bytes;
        dst[i] = c < (size_t)row_bytes ? src[r * row_bytes + c] : 0;
    }
}

/* One thread per 32-element block. ggml block: f16 d, then 32 int8 (Q8_0) or 16 nibble bytes
 * (Q4_0). qbytes = 32 or 16. */
extern "C" __global__ void k_repack_blocks(const uint8_t *src, uint8_t *qs, __half *d,
                                           long long n_blocks, int qbytes)
{
    for (long long b = blockIdx.x * (long long)blockDim.x + threadIdx.x; b < n_blocks;
         b += (long long)gridDim.x * blockDim.x) {
        const uint8_t *s = src + b * (2 + qbytes);
        uint16_t bits = (uint16_t)(s[0] | (s[1] << 8));
        d[b] = __ushort_as_half(bits);
        for (int j = 0; j < qbytes; j++) qs[b * qbytes + j] = s[2 + j];
    }
}
