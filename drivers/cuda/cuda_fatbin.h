/* cuda_fatbin: the embedded CUDA kernels. cuda_fatbin() returns the fatbin image and its size;
 * size 0 means the binary was built without nvcc (no kernels). */
#ifndef STRATA_CUDA_FATBIN_H
#define STRATA_CUDA_FATBIN_H

#include <stddef.h>

const void *cuda_fatbin(size_t *size);

#endif
