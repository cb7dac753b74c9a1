/* cu_api: the CUDA driver API, loaded at run time.
 *
 * Strata never links libcuda or libcudart, so one binary runs on machines with and without a GPU.
 * cu_api_load() dlopen()s libcuda.so.1 and resolves the few driver calls the backend uses through
 * dlsym into the table `cu`. The types below are the driver's (cuda.h), declared here so the host
 * code compiles where the toolkit is absent; build/cuda/cu_api_check (a compile-only check, run
 * when cuda.h exists) asserts that every prototype matches cuda.h.
 *
 * cu_api_load() is idempotent and thread-safe only in the sense that it is called once at
 * start-up from the thread that picks the backend. On failure it writes why (no libcuda.so.1, a
 * missing symbol, cuInit's error) and every later call returns the same answer. */
#ifndef STRATA_CU_API_H
#define STRATA_CU_API_H

#include <stddef.h>

#ifdef STRATA_CU_API_CHECK
/* cu_api_check.c: the real types, so a prototype that differs from cuda.h fails to compile. */
#include <cuda.h>
#define CUX_ENUM(cuda_h_type) cuda_h_type
#else
typedef int CUresult; /* 0 = CUDA_SUCCESS */
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;
#define CUX_ENUM(cuda_h_type) int
#endif

/* The few constants used, named CUX_ so they never collide with cuda.h's enumerators. */
#define CUX_SUCCESS                          0
#define CUX_ERROR_NO_DEVICE                  100
#define CUX_STREAM_NON_BLOCKING              0x1
#define CUX_EVENT_DISABLE_TIMING             0x2
#define CUX_MEMHOSTREGISTER_PORTABLE         0x1
#define CUX_ATTR_MULTIPROCESSOR_COUNT        16
#define CUX_ATTR_MEMORY_CLOCK_RATE           36 /* kHz */
#define CUX_ATTR_GLOBAL_MEMORY_BUS_WIDTH     37
#define CUX_ATTR_CC_MAJOR                    75
#define CUX_ATTR_CC_MINOR                    76
#define CUX_ATTR_MAX_SHARED_PER_BLOCK_OPTIN  97
#define CUX_FUNC_ATTR_MAX_DYNAMIC_SHARED     8
#define CUX_STREAM_CAPTURE_MODE_THREAD_LOCAL 1

struct cu_api {
    void *lib;
    CUresult (*Init)(unsigned flags);
    CUresult (*DriverGetVersion)(int *version);
    CUresult (*GetErrorString)(CUresult e, const char **s);
    CUresult (*DeviceGetCount)(int *n);
    CUresult (*DeviceGet)(CUdevice *d, int ordinal);
    CUresult (*DeviceGetName)(char *name, int len, CUdevice d);
    CUresult (*DeviceGetAttribute)(int *v, CUX_ENUM(CUdevice_attribute) attr, CUdevice d);
    CUresult (*DeviceTotalMem)(size_t *bytes, CUdevice d);
    CUresult (*DevicePrimaryCtxRetain)(CUcontext *c, CUdevice d);
    CUresult (*DevicePrimaryCtxRelease)(CUdevice d);
    CUresult (*CtxSetCurrent)(CUcontext c);
    CUresult (*CtxSynchronize)(void);
    CUresult (*MemGetInfo)(size_t *free_bytes, size_t *total);
    CUresult (*ModuleLoadData)(CUmodule *m, const void *image);
    CUresult (*ModuleUnload)(CUmodule m);
    CUresult (*ModuleGetFunction)(CUfunction *f, CUmodule m, const char *name);
    CUresult (*FuncSetAttribute)(CUfunction f, CUX_ENUM(CUfunction_attribute) attr, int value);
    CUresult (*LaunchKernel)(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                             unsigned by, unsigned bz, unsigned shared, CUstream s, void **params,
                             void **extra);
    CUresult (*MemAlloc)(CUdeviceptr *p, size_t bytes);
    CUresult (*MemFree)(CUdeviceptr p);
    CUresult (*MemAllocHost)(void **p, size_t bytes);
    CUresult (*MemFreeHost)(void *p);
    CUresult (*MemHostRegister)(void *p, size_t bytes, unsigned flags);
    CUresult (*MemHostUnregister)(void *p);
    CUresult (*MemcpyHtoDAsync)(CUdeviceptr dst, const void *src, size_t bytes, CUstream s);
    CUresult (*MemcpyDtoHAsync)(void *dst, CUdeviceptr src, size_t bytes, CUstream s);
    CUresult (*MemcpyDtoDAsync)(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream s);
    CUresult (*MemsetD8Async)(CUdeviceptr dst, unsigned char v, size_t n, CUstream s);
    CUresult (*StreamCreate)(CUstream *s, unsigned flags);
    CUresult (*StreamDestroy)(CUstream s);
    CUresult (*StreamSynchronize)(CUstream s);
    CUresult (*StreamWaitEvent)(CUstream s, CUevent e, unsigned flags);
    CUresult (*EventCreate)(CUevent *e, unsigned flags);
    CUresult (*EventDestroy)(CUevent e);
    CUresult (*EventRecord)(CUevent e, CUstream s);
    CUresult (*EventSynchronize)(CUevent e);
    CUresult (*EventQuery)(CUevent e);
    CUresult (*EventElapsedTime)(float *ms, CUevent start, CUevent end);
    /* CUDA graphs: a decode step is ~13 launches per layer; replaying them as one graph takes
     * the CPU's launch rate out of the token time. */
    CUresult (*StreamBeginCapture)(CUstream s, CUX_ENUM(CUstreamCaptureMode) mode);
    CUresult (*StreamEndCapture)(CUstream s, CUgraph *g);
    CUresult (*GraphInstantiate)(CUgraphExec *e, CUgraph g, unsigned long long flags);
    CUresult (*GraphLaunch)(CUgraphExec e, CUstream s);
    CUresult (*GraphExecDestroy)(CUgraphExec e);
    CUresult (*GraphDestroy)(CUgraph g);
};

extern struct cu_api cu;

/* Load libcuda.so.1 (or $STRATA_LIBCUDA, which tests use to force a missing library) and cuInit.
 * Fails with "no CUDA device (libcuda.so.1 not found)", "no CUDA device (cuInit: ...)" or
 * "libcuda.so.1: missing symbol cuX". */
int cu_api_load(char *err);

/* Forget a load attempt (tests point $STRATA_LIBCUDA elsewhere and load again). */
void cu_api_unload(void);

/* "cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY (out of memory)"-style text for a result. */
const char *cu_errstr(CUresult r);

/* Write "what: <error text>" into err and return -1 when r is not CU_SUCCESS; 0 otherwise. */
int cu_check(CUresult r, const char *what, char *err);

#endif
