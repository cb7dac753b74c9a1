/* cuda_backend: the engine on an NVIDIA GPU (engine.h's contract), through the driver API that
 * cu_api.h loads at run time and the kernels embedded by cuda_fatbin.c.
 *
 * Start-up: engine_init (backends.c) asks cuda_probe(), the backend's probe, whether CUDA can
 * serve: the kernels are embedded, libcuda.so.1 loads and a device exists.
 * A cuda_engine owns a context (the device's primary context), a compute stream and a copy
 * stream, all weights resident in device memory (laid out by cuda_plan), the paged KV cache in
 * device memory (same block ids as the host kv_cache, so the scheduler's block tables apply
 * unchanged) and activation buffers for lim->max_tokens tokens. Nothing is allocated per step.
 *
 * Weights: cuda_upload_span() queues one span's copy (pinned arena -> staging, then repack) on
 * the copy stream and records an event; a layer waits on its span's event on the compute stream,
 * so it runs as soon as its weights have landed while later spans are still in flight.
 * cuda_engine_register_host() registers the arena once (cuMemHostRegister) so those copies are
 * true DMA. One thread drives a cuda_engine (the GPU driver thread). */
#ifndef STRATA_CUDA_BACKEND_H
#define STRATA_CUDA_BACKEND_H

#include "serving/engine/engine.h"
#include "serving/engine/sampler.h"

#include <stddef.h>
#include <stdint.h>

struct cuda_engine;

/* 0 when CUDA can serve; else -1 and why: "no CUDA device (libcuda.so.1 not found)",
 * "no CUDA device (cuInit: ...)"; a build without kernels still loads the driver and says
 * "built without CUDA kernels; <the driver's why>" or "built without CUDA kernels (the driver
 * sees a device: rebuild with nvcc)". */
int cuda_probe(char *why);

/* The name of device 0 ("?" when it cannot be read); after cuda_probe() succeeded. */
void cuda_device_name(char *name, size_t cap);

/* engine.h's backend over a cuda_engine (in engine.backend_state); its errors say "cuda: ...". */
extern const struct engine_backend cuda_backend;

struct cuda_device_info {
    char name[128];
    int cc_major, cc_minor, sms, driver_version;
    size_t total_mem, free_mem;
    double peak_gbs; /* memory clock x bus width, the datasheet figure */
};

/* Open the device and allocate everything for model m under lim (0 fields get the engine's
 * defaults, engine_limits_resolve; a context over the model's fails). Weights are not uploaded
 * yet. */
int cuda_engine_open(struct cuda_engine **out, const struct model *m,
                     const struct engine_limits *lim, char *err);
void cuda_engine_close(struct cuda_engine *ce);
void cuda_engine_info(const struct cuda_engine *ce, struct cuda_device_info *info);
/* Register host memory (the arena) with the driver once; copies from it become DMA. */
int cuda_engine_register_host(struct cuda_engine *ce, void *base, size_t size, char *err);

/* Queue span s (0 .. n_layers+1) for upload; returns at once. */
int cuda_upload_span(struct cuda_engine *ce, int s, char *err);
int cuda_upload_all(struct cuda_engine *ce, char *err);
/* 1 when span s has landed, 0 when queued or not queued. */
int cuda_span_ready(struct cuda_engine *ce, int s);
/* Block until everything queued on the copy stream has landed. */
int cuda_upload_wait(struct cuda_engine *ce, char *err);

/* The engine's operations with host buffers (engine.h): x is n x dim f32, logits n_logits x
 * vocab. Each returns when the results are in host memory. */
int cuda_embed(struct cuda_engine *ce, const struct batch *b, float *x, char *err);
int cuda_layers(struct cuda_engine *ce, const struct batch *b, int l0, int l1, float *x, char *err);
int cuda_head(struct cuda_engine *ce, const struct batch *b, const float *x, float *logits,
              char *err);
/* embed + all layers + head with the hidden states kept on the device. */
int cuda_forward(struct cuda_engine *ce, const struct batch *b, float *logits, char *err);
/* cuda_forward, then sampling on the device: tokens[i] for row b->logit_rows[i] drawn with
 * samplers[i]'s parameters and generator (whose state advances as sampler_sample's would).
 * Only the tokens and generator states cross PCIe. */
int cuda_forward_sample(struct cuda_engine *ce, const struct batch *b,
                        struct sampler *const *samplers, int *tokens, char *err);

/* Replay steps as CUDA graphs (default on; $STRATA_CUDA_GRAPHS=0 turns it off): a decode step
 * is ~13 launches per layer, and at batch 1 on a fast GPU the CPU's launch rate, not HBM, would
 * set the token time. Graphs are used only once every span has landed. */
void cuda_set_graphs(struct cuda_engine *ce, int on);

/* For benchmarks: device-to-device copy rate (GB/s, read + write counted) over `bytes`, and the
 * host-to-device rate from pinned memory; each the best of `iters` runs. */
int cuda_measure_d2d(struct cuda_engine *ce, size_t bytes, int iters, double *gbs, char *err);
int cuda_measure_h2d(struct cuda_engine *ce, size_t bytes, int iters, double *gbs, char *err);
/* Upload every span and time it on the copy stream: seconds and bytes moved over PCIe. */
int cuda_time_upload(struct cuda_engine *ce, double *seconds, uint64_t *bytes, char *err);
/* Time `iters` calls of cuda_forward_sample-equivalent device work for batch b (no host copies
 * of logits): seconds per step, measured with events on the compute stream. */
int cuda_time_forward(struct cuda_engine *ce, const struct batch *b, int iters, double *seconds,
                      char *err);
/* The kernel entry points the host looks up in the fatbin (for the build test). Returns the
 * count; writes at most cap names. */
int cuda_kernel_names(const char **names, int cap);
/* For tests: y (n x rows) = x (n x cols) W^T for the plan's matrix `mat` (cuda_plan.h's order),
 * with the kernels a step would use for n tokens (GEMV below CUDA_GEMM_MIN_TOKENS, else the
 * tensor cores); host buffers in and out. */
int cuda_matmul_mat(struct cuda_engine *ce, int mat, const float *x, int n, float *y, char *err);
/* Device bytes of resident weights (what a decode step reads once). */
uint64_t cuda_weight_bytes(const struct cuda_engine *ce);

/* With STRATA_CUDA_PROFILE=1 in the environment at open (graphs off, every launch timed alone on
 * the device): print the time per kernel since the last report to stderr under `label`, and start
 * again from zero. Without it: nothing. */
void cuda_engine_profile_report(struct cuda_engine *ce, const char *label);

#endif
