/* cuda_fatbin: the kernels' fatbin (build/cuda/kernels.fatbin, made by nvcc) embedded in the
 * binary with .incbin, so the driver loads it from memory (cuModuleLoadData) and no file or
 * libcudart ships beside strata. Built without nvcc, the fatbin is empty and the backend says
 * "built without CUDA kernels". */
#include "drivers/cuda/cuda_fatbin.h"

#ifdef STRATA_CUDA_FATBIN
__asm__(".section .rodata.strata_cuda_fatbin,\"a\",@progbits\n"
        ".balign 64\n"
        ".globl strata_cuda_fatbin_start\n"
        "strata_cuda_fatbin_start:\n"
        ".incbin \"" STRATA_CUDA_FATBIN "\"\n"
        ".globl strata_cuda_fatbin_end\n"
        "strata_cuda_fatbin_end:\n"
        ".byte 0\n"
        ".previous\n");
extern const unsigned char strata_cuda_fatbin_start[], strata_cuda_fatbin_end[];

const void *cuda_fatbin(size_t *size)
{
    *size = (size_t)(strata_cuda_fatbin_end - strata_cuda_fatbin_start);
    return strata_cuda_fatbin_start;
}
#else
const void *cuda_fatbin(size_t *size)
{
    *size = 0;
    return 0;
}
#endif
