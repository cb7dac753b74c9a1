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

/* The k_quant.cuh types: each ggml block of `block_bytes` bytes split into up to 4 planes,
 * segment i being bytes [off[i], off[i] + len[i]) of every block, written to dst[i] + b * len[i].
 * A CUDA block takes 256 ggml blocks at a time and its threads walk their bytes in order, so the
 * reads are coalesced and each plane's writes nearly so. */
struct repack_planes {
    uint8_t *dst[4];
    int off[4], len[4];
    int n;
};

extern "C" __global__ void k_repack_planes(const uint8_t *src, repack_planes rp, long long n_blocks,
                                           int block_bytes)
{
    for (long long b0 = 256LL * blockIdx.x; b0 < n_blocks; b0 += 256LL * gridDim.x) {
        int nb = n_blocks - b0 < 256 ? (int)(n_blocks - b0) : 256;
        const uint8_t *s = src + b0 * block_bytes;
        for (int i = threadIdx.x; i < nb * block_bytes; i += blockDim.x) {
            int b = i / block_bytes, o = i - b * block_bytes;
#pragma unroll
            for (int k = 0; k < 4; k++)
                if (k < rp.n && o >= rp.off[k] && o < rp.off[k] + rp.len[k])
                    rp.dst[k][(b0 + b) * rp.len[k] + (o - rp.off[k])] = s[i];
        }
    }
}
