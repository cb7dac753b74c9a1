/* cu_api: dlopen/dlsym of the CUDA driver (see cu_api.h for why). */
#include "drivers/cuda/cu_api.h"

#include "os/common/errmsg.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct cu_api cu;

static int load_state; /* 0 not tried, 1 loaded, -1 failed */
static char load_err[ERRMSG_LEN];

/* Versioned names first: the unversioned symbols are the CUDA 2.x/3.x ABI with 32-bit sizes. */
struct sym {
    void **slot;
    const char *names[3];
};

#define S(field, ...)                                                                              \
    {                                                                                              \
        (void **)&cu.field,                                                                        \
        {                                                                                          \
            __VA_ARGS__                                                                            \
        }                                                                                          \
    }

static const struct sym syms[] = {
    S(Init, "cuInit"),
    S(DriverGetVersion, "cuDriverGetVersion"),
    S(GetErrorString, "cuGetErrorString"),
    S(DeviceGetCount, "cuDeviceGetCount"),
    S(DeviceGet, "cuDeviceGet"),
    S(DeviceGetName, "cuDeviceGetName"),
    S(DeviceGetAttribute, "cuDeviceGetAttribute"),
    S(DeviceTotalMem, "cuDeviceTotalMem_v2"),
    S(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"),
    S(DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"),
    S(CtxSetCurrent, "cuCtxSetCurrent"),
    S(CtxSynchronize, "cuCtxSynchronize"),
    S(MemGetInfo, "cuMemGetInfo_v2"),
    S(ModuleLoadData, "cuModuleLoadData"),
    S(ModuleUnload, "cuModuleUnload"),
    S(ModuleGetFunction, "cuModuleGetFunction"),
    S(FuncSetAttribute, "cuFuncSetAttribute"),
    S(LaunchKernel, "cuLaunchKernel"),
    S(MemAlloc, "cuMemAlloc_v2"),
    S(MemFree, "cuMemFree_v2"),
    S(MemAllocHost, "cuMemAllocHost_v2"),
    S(MemFreeHost, "cuMemFreeHost"),
    S(MemHostRegister, "cuMemHostRegister_v2", "cuMemHostRegister"),
    S(MemHostUnregister, "cuMemHostUnregister"),
    S(MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2"),
    S(MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2"),
    S(MemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2"),
    S(MemsetD8Async, "cuMemsetD8Async"),
    S(StreamCreate, "cuStreamCreate"),
    S(StreamDestroy, "cuStreamDestroy_v2"),
    S(StreamSynchronize, "cuStreamSynchronize"),
    S(StreamWaitEvent, "cuStreamWaitEvent"),
    S(EventCreate, "cuEventCreate"),
    S(EventDestroy, "cuEventDestroy_v2"),
    S(EventRecord, "cuEventRecord"),
    S(EventSynchronize, "cuEventSynchronize"),
    S(EventQuery, "cuEventQuery"),
    /* _v2 exists from CUDA 12.8 drivers on; older drivers only have the original. */
    S(EventElapsedTime, "cuEventElapsedTime_v2", "cuEventElapsedTime"),
    S(StreamBeginCapture, "cuStreamBeginCapture_v2"),
    S(StreamEndCapture, "cuStreamEndCapture"),
    S(GraphInstantiate, "cuGraphInstantiateWithFlags"),
    S(GraphLaunch, "cuGraphLaunch"),
    S(GraphExecDestroy, "cuGraphExecDestroy"),
    S(GraphDestroy, "cuGraphDestroy"),
};

/* Names of the results a start-up can meet, for when the driver cannot say (the toolkit's stub
 * library answers every call, cuGetErrorString included, with CUDA_ERROR_STUB_LIBRARY). */
static const struct {
    int code;
    const char *name;
} known[] = {
    {2, "CUDA_ERROR_OUT_OF_MEMORY"},
    {3, "CUDA_ERROR_NOT_INITIALIZED"},
    {34, "CUDA_ERROR_STUB_LIBRARY: libcuda.so.1 is the toolkit's stub, not a driver"},
    {36, "CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER"},
    {100, "CUDA_ERROR_NO_DEVICE"},
    {200, "CUDA_ERROR_INVALID_IMAGE"},
    {209, "CUDA_ERROR_NO_BINARY_FOR_GPU"},
    {222, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION: the driver is older than the toolkit"},
    {803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"},
    {804, "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE"},
};

const char *cu_errstr(CUresult r)
{
    const char *s = NULL;
    if (cu.GetErrorString && cu.GetErrorString(r, &s) == CUX_SUCCESS && s) return s;
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (known[i].code == (int)r) return known[i].name;
    static __thread char buf[32];
    snprintf(buf, sizeof buf, "CUDA error %d", r);
    return buf;
}

int cu_check(CUresult r, const char *what, char *err)
{
    if (r == CUX_SUCCESS) return 0;
    return errmsg_set(err, "%s: %s (%d)", what, cu_errstr(r), r);
}

static int load(char *err)
{
    const char *path = getenv("STRATA_LIBCUDA");
    if (!path || !*path) path = "libcuda.so.1";
    cu.lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!cu.lib) return errmsg_set(err, "no CUDA device (%s not found)", path);
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        void *p = NULL;
        for (int j = 0; j < 3 && syms[i].names[j] && !p; j++) p = dlsym(cu.lib, syms[i].names[j]);
        if (!p) return errmsg_set(err, "%s: missing symbol %s", path, syms[i].names[0]);
        *syms[i].slot = p;
    }
    CUresult r = cu.Init(0);
    if (r != CUX_SUCCESS) return errmsg_set(err, "no CUDA device (cuInit: %s)", cu_errstr(r));
    int n = 0;
    r = cu.DeviceGetCount(&n);
    if (r != CUX_SUCCESS)
        return errmsg_set(err, "no CUDA device (cuDeviceGetCount: %s)", cu_errstr(r));
    if (n < 1) return errmsg_set(err, "no CUDA device (the driver sees 0 devices)");
    return 0;
}

int cu_api_load(char *err)
{
    if (load_state == 0) {
        if (load(load_err) == 0) {
            load_state = 1;
        } else {
            load_state = -1;
            /* Keep the GetErrorString pointer usable only while the library stays open. */
            if (cu.lib) dlclose(cu.lib);
            memset(&cu, 0, sizeof cu);
        }
    }
    if (load_state == 1) return 0;
    return errmsg_set(err, "%s", load_err);
}

void cu_api_unload(void)
{
    if (load_state == 1 && cu.lib) dlclose(cu.lib);
    memset(&cu, 0, sizeof cu);
    load_state = 0;
    load_err[0] = 0;
}
