/* cu_api_check: compiled only by the Makefile's cu_api_check rule (-DSTRATA_CU_API_CHECK, with
 * cuda.h on the include path): every function pointer in struct cu_api must have the type of the
 * cuda.h function that cu_api.c resolves into it, and every constant its value. In libstrata this
 * file is empty. */
#ifdef STRATA_CU_API_CHECK
#include "drivers/cuda/cu_api.h"

#define SAME(field, fn)                                                                            \
    _Static_assert(                                                                                \
        __builtin_types_compatible_p(__typeof__(((struct cu_api *)0)->field), __typeof__(&fn)),    \
        #field " does not match " #fn)

SAME(Init, cuInit);
SAME(DriverGetVersion, cuDriverGetVersion);
SAME(GetErrorString, cuGetErrorString);
SAME(DeviceGetCount, cuDeviceGetCount);
SAME(DeviceGet, cuDeviceGet);
SAME(DeviceGetName, cuDeviceGetName);
SAME(DeviceGetAttribute, cuDeviceGetAttribute);
SAME(DeviceTotalMem, cuDeviceTotalMem_v2);
SAME(DevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain);
SAME(DevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2);
SAME(CtxSetCurrent, cuCtxSetCurrent);
SAME(CtxSynchronize, cuCtxSynchronize);
SAME(MemGetInfo, cuMemGetInfo_v2);
SAME(ModuleLoadData, cuModuleLoadData);
SAME(ModuleUnload, cuModuleUnload);
SAME(ModuleGetFunction, cuModuleGetFunction);
SAME(FuncSetAttribute, cuFuncSetAttribute);
SAME(LaunchKernel, cuLaunchKernel);
SAME(MemAlloc, cuMemAlloc_v2);
SAME(MemFree, cuMemFree_v2);
SAME(MemAllocHost, cuMemAllocHost_v2);
SAME(MemFreeHost, cuMemFreeHost);
SAME(MemHostRegister, cuMemHostRegister_v2);
SAME(MemHostUnregister, cuMemHostUnregister);
SAME(MemcpyHtoDAsync, cuMemcpyHtoDAsync_v2);
SAME(MemcpyDtoHAsync, cuMemcpyDtoHAsync_v2);
SAME(MemcpyDtoDAsync, cuMemcpyDtoDAsync_v2);
SAME(MemsetD8Async, cuMemsetD8Async);
SAME(StreamCreate, cuStreamCreate);
SAME(StreamDestroy, cuStreamDestroy_v2);
SAME(StreamSynchronize, cuStreamSynchronize);
SAME(StreamWaitEvent, cuStreamWaitEvent);
SAME(EventCreate, cuEventCreate);
SAME(EventDestroy, cuEventDestroy_v2);
SAME(EventRecord, cuEventRecord);
SAME(EventSynchronize, cuEventSynchronize);
SAME(EventQuery, cuEventQuery);
SAME(EventElapsedTime, cuEventElapsedTime);
SAME(StreamBeginCapture, cuStreamBeginCapture_v2);
SAME(StreamEndCapture, cuStreamEndCapture);
SAME(GraphInstantiate, cuGraphInstantiateWithFlags);
SAME(GraphLaunch, cuGraphLaunch);
SAME(GraphExecDestroy, cuGraphExecDestroy);
SAME(GraphDestroy, cuGraphDestroy);
_Static_assert(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL == CUX_STREAM_CAPTURE_MODE_THREAD_LOCAL, "");

_Static_assert(CUDA_SUCCESS == CUX_SUCCESS, "");
_Static_assert(CUDA_ERROR_NO_DEVICE == CUX_ERROR_NO_DEVICE, "");
_Static_assert(CU_STREAM_NON_BLOCKING == CUX_STREAM_NON_BLOCKING, "");
_Static_assert(CU_EVENT_DISABLE_TIMING == CUX_EVENT_DISABLE_TIMING, "");
_Static_assert(CU_MEMHOSTREGISTER_PORTABLE == CUX_MEMHOSTREGISTER_PORTABLE, "");
_Static_assert(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT == CUX_ATTR_MULTIPROCESSOR_COUNT, "");
_Static_assert(CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE == CUX_ATTR_MEMORY_CLOCK_RATE, "");
_Static_assert(CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH == CUX_ATTR_GLOBAL_MEMORY_BUS_WIDTH, "");
_Static_assert(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR == CUX_ATTR_CC_MAJOR, "");
_Static_assert(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR == CUX_ATTR_CC_MINOR, "");
_Static_assert(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN ==
                   CUX_ATTR_MAX_SHARED_PER_BLOCK_OPTIN,
               "");
_Static_assert(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES == CUX_FUNC_ATTR_MAX_DYNAMIC_SHARED,
               "");
#endif
