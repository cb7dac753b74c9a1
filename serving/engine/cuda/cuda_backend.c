/* cuda_backend: the forward pass on the GPU (see cuda_backend.h). Laid out in the order data
 * flows: device set-up, weight upload, the step's metadata, the kernels' launch wrappers, the
 * forward pass, sampling, the engine_backend adapter, backend selection, measurements. */
#include "serving/engine/cuda/cuda_backend.h"

#include "drivers/cuda/cu_api.h"
#include "drivers/cuda/cuda_fatbin.h"
#include "serving/engine/cuda/cuda_plan.h"
#include "os/common/errmsg.h"
#include "os/runtime/log.h"
#include "serving/engine/gguf.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------------
 * Kernels by name (kernels.cu). The GEMV/GEMM tables are indexed by weight type. */

enum {
    WI_F32,
    WI_F16,
    WI_BF16,
    WI_Q8_0,
    WI_Q4_0, /* from Q8_0 on the block types: GEMV by family (k_gemvq_k/32_*) */
    WI_Q4_1,
    WI_Q5_0,
    WI_Q5_1,
    WI_IQ4_NL,
    WI_Q2_K,
    WI_Q3_K,
    WI_Q4_K,
    WI_Q5_K,
    WI_Q6_K,
    WI_IQ4_XS,
    WI_N
};
static const char *const wi_name[WI_N] = {"f32",  "f16",  "bf16", "q8_0",   "q4_0",
                                          "q4_1", "q5_0", "q5_1", "iq4_nl", "q2_k",
                                          "q3_k", "q4_k", "q5_k", "q6_k",   "iq4_xs"};
static const uint32_t wi_type[WI_N] = {GGML_F32,  GGML_F16,  GGML_BF16, GGML_Q8_0,   GGML_Q4_0,
                                       GGML_Q4_1, GGML_Q5_0, GGML_Q5_1, GGML_IQ4_NL, GGML_Q2_K,
                                       GGML_Q3_K, GGML_Q4_K, GGML_Q5_K, GGML_Q6_K,   GGML_IQ4_XS};
static const int gemv_nts[4] = {1, 2, 4, 8};
/* The two quantized GEMV families (k_gemvq.cuh): kernel name stem per family. */
enum { GQ_SUPER, GQ_32, GQ_N };
static const char *const gq_name[GQ_N] = {"k", "32"};
static int gq_of(uint32_t type)
{
    return cuda_gemv_family(type) == CUDA_FAM_SUPER ? GQ_SUPER
           : cuda_gemv_family(type) == CUDA_FAM_32  ? GQ_32
                                                    : -1;
}

enum {
    K_REPACK_ROWS,
    K_REPACK_BLOCKS,
    K_REPACK_PLANES,
    K_EMBED,
    K_RMSNORM,
    K_QK_PREP,
    K_ROPE_STORE,
    K_SWIGLU,
    K_ADD,
    K_ATTENTION,
    K_GEMVQ_QUANT_K,
    K_GEMVQ_QUANT_32,
    K_RMSNORM_QUANT_K,
    K_RMSNORM_QUANT_32,
    K_SAMPLE,
    K_N
};
static const char *const k_name[K_N] = {
    "k_repack_rows",     "k_repack_blocks",    "k_repack_planes",
    "k_embed",           "k_rmsnorm",          "k_qk_prep",
    "k_rope_store",      "k_swiglu",           "k_add",
    "k_attention",       "k_gemvq_quant_k",    "k_gemvq_quant_32",
    "k_rmsnorm_quant_k", "k_rmsnorm_quant_32", "k_sample",
};

/* The GEMV kernel of weight index t for template j (k_gemv_<type>_<nt> or k_gemvq_<fam>_<nt>). */
static void gemv_kernel_name(int t, int j, char *out, size_t cap)
{
    if (gq_of(wi_type[t]) >= 0)
        snprintf(out, cap, "k_gemvq_%s_%d", gq_name[gq_of(wi_type[t])], gemv_nts[j]);
    else
        snprintf(out, cap, "k_gemv_%s_%d", wi_name[t], gemv_nts[j]);
}

static const char *const q4k_name[4] = {"k_gemvq_q4k_1", "k_gemvq_q4k_2", "k_gemvq_q4k_4",
                                        "k_gemvq_q4k_8"};

int cuda_kernel_names(const char **names, int cap)
{
    static char gemv_names[WI_N][4][32], gemm_names[WI_N][32];
    int n = 0;
    for (int i = 0; i < K_N; i++)
        if (n < cap) names[n++] = k_name[i];
    for (int j = 0; j < 4; j++)
        if (n < cap) names[n++] = q4k_name[j];
    for (int t = 0; t < WI_N; t++) {
        for (int j = 0; j < 4; j++) {
            gemv_kernel_name(t, j, gemv_names[t][j], 32);
            /* a family's kernels once (its first type) */
            if (gq_of(wi_type[t]) >= 0 && t != WI_Q8_0 && t != WI_Q2_K) continue;
            if (n < cap) names[n++] = gemv_names[t][j];
        }
        if (t == WI_F32) continue;
        snprintf(gemm_names[t], 32, "k_gemm_%s", wi_name[t]);
        if (n < cap) names[n++] = gemm_names[t];
    }
    return n;
}

static int wi_of(uint32_t type)
{
    for (int i = 0; i < WI_N; i++)
        if (wi_type[i] == type) return i;
    return -1;
}

/* Mirrors of the kernels' by-value structs (k_common.cuh dmat, k_sample.cuh sample_param,
 * k_repack.cuh repack_planes). */
struct dmat {
    CUdeviceptr qs, d, e, s;
    int rows, cols, ld, type;
};
struct repack_planes {
    CUdeviceptr dst[4];
    int off[4], len[4];
    int n, pad;
};
_Static_assert(sizeof(struct repack_planes) == 72, "repack_planes layout");
struct sample_param {
    float temperature, top_p, min_p;
    int top_k;
    uint64_t rng;
    int token, pad;
};
_Static_assert(sizeof(struct dmat) == 48, "dmat layout");
_Static_assert(sizeof(struct sample_param) == 32, "sample_param layout");

/* A captured step: the launches of one (tokens, logit rows, sampling) shape. */
#define GRAPH_CACHE 16
struct step_graph {
    int n, n_logits, sample;
    CUgraphExec exec;
};

struct cuda_engine {
    const struct model *m;
    struct model_config cfg;
    struct engine_limits lim;
    int max_blocks_per_seq, max_logits;
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction fn[K_N], gemv[WI_N][4], gemm[WI_N];
    CUfunction gemvq4k[4];   /* k_gemvq_q4k_<nt>: launches whose matrices are all Q4_K */
    size_t gemvq_smem_limit; /* dynamic shared memory a k_gemvq launch may use */
    CUstream compute, copy;
    CUevent *span_ev; /* one per span */
    int *span_queued;
    CUevent t0, t1; /* timing */
    struct cuda_plan plan;
    struct dmat *w; /* per plan mat: device pointers */
    CUdeviceptr weights, staging, kc, vc, act;
    /* activations (inside act) */
    CUdeviceptr x, xb, xb2, q, k, v, att, hb, hb2, logits, tok, pos, bt, rows, sparams;
    CUdeviceptr apart; /* k_attention's partials when a step splits positions */
    CUdeviceptr acnt;  /* k_attention's finished-split counts, a token x head (zero between) */
    CUdeviceptr xq;    /* a GEMV pass's quantized activations (k_gemvq_quant_*) */
    /* pinned host staging for the step's metadata and results */
    void *hmeta;
    int *h_tok, *h_pos, *h_bt, *h_rows;
    struct sample_param *h_sp;
    void *registered;
    struct cuda_device_info info;
    int graphs_on, capturing, all_ready, n_graphs, next_evict;
    struct step_graph graphs[GRAPH_CACHE];
    /* STRATA_CUDA_PROFILE=1: each launch timed alone (graphs off), totals on stderr at close */
    int prof, n_prof;
    CUevent pa, pb;
    struct kprof {
        const char *what;
        double ms;
        long calls;
    } kp[32];
};

/* Tokens from which a matrix product takes the tensor-core GEMM rather than GEMV passes:
 * CUDA_GEMM_MIN_TOKENS, or STRATA_CUDA_GEMM_MIN (read at engine open; a tuning knob). */
static int gemm_min_tokens = CUDA_GEMM_MIN_TOKENS;
/* STRATA_CUDA_GEMVQ=chunks: Q4_K-only launches take k_gemvq_k_* (16-byte chunks) instead of
 * k_gemvq_q4k_* (32-byte units): the kernel before, kept to compare (read at engine open). */
static int gemvq_chunks;

#define CK(call, what)                                                                             \
    do {                                                                                           \
        if (cu_check((call), (what), err)) return -1;                                              \
    } while (0)

/* ---------------------------------------------------------------------------------------------
 * Device set-up */

static uint64_t align256(uint64_t v)
{
    return (v + 255) & ~(uint64_t)255;
}

static int load_module(struct cuda_engine *ce, char *err)
{
    size_t size;
    const void *fb = cuda_fatbin(&size);
    if (!size) return errmsg_set(err, "cuda: built without CUDA kernels");
    CK(cu.ModuleLoadData(&ce->mod, fb), "cuda: cuModuleLoadData (embedded fatbin)");
    char name[64];
    for (int i = 0; i < K_N; i++)
        if (cu.ModuleGetFunction(&ce->fn[i], ce->mod, k_name[i]))
            return errmsg_set(err, "cuda: kernel %s missing from the fatbin", k_name[i]);
    for (int j = 0; j < 4; j++)
        if (cu.ModuleGetFunction(&ce->gemvq4k[j], ce->mod, q4k_name[j]))
            return errmsg_set(err, "cuda: kernel %s missing from the fatbin", q4k_name[j]);
    for (int t = 0; t < WI_N; t++) {
        for (int j = 0; j < 4; j++) {
            gemv_kernel_name(t, j, name, sizeof name);
            if (cu.ModuleGetFunction(&ce->gemv[t][j], ce->mod, name))
                return errmsg_set(err, "cuda: kernel %s missing from the fatbin", name);
        }
        if (t == WI_F32) continue; /* F32 always takes GEMV */
        snprintf(name, sizeof name, "k_gemm_%s", wi_name[t]);
        if (cu.ModuleGetFunction(&ce->gemm[t], ce->mod, name))
            return errmsg_set(err, "cuda: kernel %s missing from the fatbin", name);
    }
    return 0;
}

/* The shared-memory budget of the quantized GEMVs (k_gemvq.cuh): up to CUDA_GEMVQ_SMEM_MAX where
 * the device allows it (an opt-in above 48 KiB); one token of every such matrix must fit. */
static int gemvq_setup(struct cuda_engine *ce, char *err)
{
    const size_t dflt = 48 * 1024;
    int optin = 0;
    cu.DeviceGetAttribute(&optin, CUX_ATTR_MAX_SHARED_PER_BLOCK_OPTIN, ce->dev);
    size_t lim = CUDA_GEMVQ_SMEM_MAX;
    if ((size_t)optin < lim) lim = (size_t)optin > dflt ? (size_t)optin : dflt;
    for (int i = 0; i < ce->plan.n_mats; i++) {
        const struct cuda_mat *mt = &ce->plan.mats[i];
        size_t need = cuda_gemvq_smem(mt->type, mt->cols, 1);
        if (need > lim)
            return errmsg_set(err,
                              "cuda: tensor %s: %d columns need %zu bytes of shared memory per "
                              "token in the GEMV; %s allows %zu",
                              mt->name, mt->cols, need, ce->info.name, lim);
    }
    ce->gemvq_smem_limit = lim;
    if (lim <= dflt) return 0;
    const int first[GQ_N] = {WI_Q2_K, WI_Q8_0}; /* a type of each family */
    for (int j = 0; j < 4; j++) {
        for (int f = 0; f < GQ_N; f++)
            CK(cu.FuncSetAttribute(ce->gemv[first[f]][j], CUX_FUNC_ATTR_MAX_DYNAMIC_SHARED,
                                   (int)lim),
               "cuda: cuFuncSetAttribute(k_gemvq)");
        CK(cu.FuncSetAttribute(ce->gemvq4k[j], CUX_FUNC_ATTR_MAX_DYNAMIC_SHARED, (int)lim),
           "cuda: cuFuncSetAttribute(k_gemvq_q4k)");
    }
    return 0;
}

static int device_info(struct cuda_engine *ce, char *err)
{
    struct cuda_device_info *in = &ce->info;
    int clock_khz = 0, bus_bits = 0;
    CK(cu.DeviceGetName(in->name, sizeof in->name, ce->dev), "cuda: cuDeviceGetName");
    CK(cu.DeviceGetAttribute(&in->cc_major, CUX_ATTR_CC_MAJOR, ce->dev), "cuda: attribute");
    CK(cu.DeviceGetAttribute(&in->cc_minor, CUX_ATTR_CC_MINOR, ce->dev), "cuda: attribute");
    CK(cu.DeviceGetAttribute(&in->sms, CUX_ATTR_MULTIPROCESSOR_COUNT, ce->dev), "cuda: attribute");
    /* Memory clock and bus width may be reported as 0 by newer drivers; peak is then unknown. */
    cu.DeviceGetAttribute(&clock_khz, CUX_ATTR_MEMORY_CLOCK_RATE, ce->dev);
    cu.DeviceGetAttribute(&bus_bits, CUX_ATTR_GLOBAL_MEMORY_BUS_WIDTH, ce->dev);
    in->peak_gbs = 2.0 * clock_khz * 1e3 * (bus_bits / 8) / 1e9; /* double data rate */
    CK(cu.DeviceTotalMem(&in->total_mem, ce->dev), "cuda: cuDeviceTotalMem");
    cu.DriverGetVersion(&in->driver_version);
    if (in->cc_major < 8)
        return errmsg_set(err, "cuda: %s is compute capability %d.%d; the kernels need 8.0+",
                          in->name, in->cc_major, in->cc_minor);
    return 0;
}

static int alloc_buffers(struct cuda_engine *ce, char *err)
{
    const struct model_config *c = &ce->cfg;
    const struct engine_limits *lim = &ce->lim;
    size_t T = (size_t)lim->max_tokens, NL = (size_t)ce->max_logits;
    size_t qdim = (size_t)c->n_heads * c->head_dim;
    size_t widest = (size_t)(c->hidden_dim > c->dim ? c->hidden_dim : c->dim);
    if (qdim > widest) widest = qdim;
    size_t kv = (size_t)c->n_layers * lim->kv_blocks * lim->kv_block_size * c->kv_dim * 4;
    size_t sizes[] = {
        T * c->dim * 4,
        T * c->dim * 4,
        T * c->dim * 4,
        T * qdim * 4,
        T * c->kv_dim * 4,
        T * c->kv_dim * 4,
        T * qdim * 4,
        T * c->hidden_dim * 4,
        T * c->hidden_dim * 4,
        NL * c->vocab_size * 4,
        T * 4,
        T * 4,
        T * ce->max_blocks_per_seq * 4,
        T * 4,
        NL * sizeof(struct sample_param),
        4 * cuda_attention_part_floats(lim->max_tokens, c->n_heads, c->head_dim, lim->ctx,
                                       ce->info.sms),
        T * c->n_heads * 4,
        /* at most 8 tokens of the widest input, 2 bytes a value bounds both families */
        (size_t)CUDA_GEMV_MAX_NT * 2 * widest + 64,
    };
    CUdeviceptr *slots[] = {&ce->x,   &ce->xb,   &ce->xb2,     &ce->q,      &ce->k,    &ce->v,
                            &ce->att, &ce->hb,   &ce->hb2,     &ce->logits, &ce->tok,  &ce->pos,
                            &ce->bt,  &ce->rows, &ce->sparams, &ce->apart,  &ce->acnt, &ce->xq};
    size_t total = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) total += align256(sizes[i]);
    size_t free_b = 0, total_b = 0;
    cu.MemGetInfo(&free_b, &total_b);
    ce->info.free_mem = free_b;
    size_t need = ce->plan.device_bytes + ce->plan.staging_bytes + 2 * kv + total;
    if (free_b && need > free_b)
        return errmsg_set(err,
                          "cuda: need %zu MiB of device memory (weights %llu, KV %zu, "
                          "activations %zu MiB) but %zu MiB are free",
                          need >> 20, (unsigned long long)(ce->plan.device_bytes >> 20),
                          (2 * kv) >> 20, total >> 20, free_b >> 20);
    CK(cu.MemAlloc(&ce->weights, ce->plan.device_bytes ? ce->plan.device_bytes : 256),
       "cuda: cuMemAlloc(weights)");
    CK(cu.MemAlloc(&ce->staging, ce->plan.staging_bytes ? ce->plan.staging_bytes : 256),
       "cuda: cuMemAlloc(staging)");
    CK(cu.MemAlloc(&ce->kc, kv), "cuda: cuMemAlloc(kv keys)");
    CK(cu.MemAlloc(&ce->vc, kv), "cuda: cuMemAlloc(kv values)");
    CK(cu.MemAlloc(&ce->act, total), "cuda: cuMemAlloc(activations)");
    /* Zeroed once: a never-written KV slot must read as 0, not NaN garbage. */
    CK(cu.MemsetD8Async(ce->kc, 0, kv, ce->compute), "cuda: memset");
    CK(cu.MemsetD8Async(ce->vc, 0, kv, ce->compute), "cuda: memset");
    CK(cu.MemsetD8Async(ce->act, 0, total, ce->compute), "cuda: memset");
    CUdeviceptr p = ce->act;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        *slots[i] = p;
        p += align256(sizes[i]);
    }
    size_t hbytes =
        (T * 3 + T * ce->max_blocks_per_seq) * 4 + NL * sizeof(struct sample_param) + 64;
    CK(cu.MemAllocHost(&ce->hmeta, hbytes), "cuda: cuMemAllocHost(step metadata)");
    ce->h_sp = ce->hmeta; /* first: 8-byte aligned */
    ce->h_tok = (int *)(ce->h_sp + NL);
    ce->h_pos = ce->h_tok + T;
    ce->h_rows = ce->h_pos + T;
    ce->h_bt = ce->h_rows + T;

    /* Device pointers of every weight. */
    ce->w = calloc((size_t)ce->plan.n_mats, sizeof *ce->w);
    if (!ce->w) return errmsg_set(err, "cuda: out of memory");
    for (int i = 0; i < ce->plan.n_mats; i++) {
        const struct cuda_mat *mt = &ce->plan.mats[i];
        ce->w[i] = (struct dmat){
            .qs = ce->weights + mt->dst_off,
            .d = mt->d_bytes ? ce->weights + mt->dst_off + mt->d_off : 0,
            .e = mt->e_bytes ? ce->weights + mt->dst_off + mt->e_off : 0,
            .s = mt->s_bytes ? ce->weights + mt->dst_off + mt->s_off : 0,
            .rows = mt->rows,
            .cols = mt->cols,
            .ld = mt->ld,
            .type = (int)mt->type,
        };
    }
    return 0;
}

int cuda_engine_open(struct cuda_engine **out, const struct model *m,
                     const struct engine_limits *lim_in, char *err)
{
    *out = NULL;
    if (cuda_probe(err)) return -1;
    struct cuda_engine *ce = calloc(1, sizeof *ce);
    if (!ce) return errmsg_set(err, "cuda: out of memory");
    ce->m = m;
    ce->cfg = m->cfg;
    const char *g = getenv("STRATA_CUDA_GRAPHS");
    ce->graphs_on = !(g && !strcmp(g, "0"));
    const char *pr = getenv("STRATA_CUDA_PROFILE");
    ce->prof = pr && *pr && strcmp(pr, "0");
    if (ce->prof) ce->graphs_on = 0;
    const char *gm = getenv("STRATA_CUDA_GEMM_MIN");
    if (gm && atoi(gm) > 0) gemm_min_tokens = atoi(gm);
    const char *gq = getenv("STRATA_CUDA_GEMVQ");
    gemvq_chunks = gq && !strcmp(gq, "chunks");
    ce->lim = *lim_in;
    if (engine_limits_resolve(&ce->lim, &ce->cfg, err)) goto fail;
    ce->max_blocks_per_seq = (ce->lim.ctx + ce->lim.kv_block_size - 1) / ce->lim.kv_block_size;
    ce->max_logits = ce->lim.max_seqs > 0 ? ce->lim.max_seqs : 1;
    if (ce->max_logits > ce->lim.max_tokens) ce->max_logits = ce->lim.max_tokens;
    const struct model_config *c = &ce->cfg;
    if (c->n_heads <= 0 || c->n_kv_heads <= 0 || c->n_heads % c->n_kv_heads || c->head_dim % 2 ||
        c->head_dim * c->n_heads <= 0) {
        errmsg_set(err, "cuda: unsupported head shape (%d heads, %d kv heads, head_dim %d)",
                   c->n_heads, c->n_kv_heads, c->head_dim);
        goto fail;
    }
    if (cuda_plan_weights(&ce->plan, m, err)) goto fail;
    if (cu_check(cu.DeviceGet(&ce->dev, 0), "cuda: cuDeviceGet", err)) goto fail;
    if (cu_check(cu.DevicePrimaryCtxRetain(&ce->ctx, ce->dev), "cuda: cuDevicePrimaryCtxRetain",
                 err))
        goto fail;
    if (cu_check(cu.CtxSetCurrent(ce->ctx), "cuda: cuCtxSetCurrent", err)) goto fail;
    if (device_info(ce, err) || load_module(ce, err) || gemvq_setup(ce, err)) goto fail;
    if (cu_check(cu.StreamCreate(&ce->compute, CUX_STREAM_NON_BLOCKING), "cuda: stream", err) ||
        cu_check(cu.StreamCreate(&ce->copy, CUX_STREAM_NON_BLOCKING), "cuda: stream", err) ||
        cu_check(cu.EventCreate(&ce->t0, 0), "cuda: event", err) ||
        cu_check(cu.EventCreate(&ce->t1, 0), "cuda: event", err) ||
        cu_check(cu.EventCreate(&ce->pa, 0), "cuda: event", err) ||
        cu_check(cu.EventCreate(&ce->pb, 0), "cuda: event", err))
        goto fail;
    ce->span_ev = calloc((size_t)ce->plan.n_spans, sizeof *ce->span_ev);
    ce->span_queued = calloc((size_t)ce->plan.n_spans, sizeof *ce->span_queued);
    if (!ce->span_ev || !ce->span_queued) {
        errmsg_set(err, "cuda: out of memory");
        goto fail;
    }
    for (int s = 0; s < ce->plan.n_spans; s++)
        if (cu_check(cu.EventCreate(&ce->span_ev[s], CUX_EVENT_DISABLE_TIMING), "cuda: event", err))
            goto fail;
    if (c->head_dim > CUDA_ATTN_MAX_HD) {
        errmsg_set(err, "cuda: attention heads of %d exceed the kernel's %d", c->head_dim,
                   CUDA_ATTN_MAX_HD);
        goto fail;
    }
    if (alloc_buffers(ce, err)) goto fail;
    if (cu_check(cu.StreamSynchronize(ce->compute), "cuda: set-up", err)) goto fail;
    *out = ce;
    return 0;
fail:
    cuda_engine_close(ce);
    return -1;
}

void cuda_engine_close(struct cuda_engine *ce)
{
    if (!ce) return;
    if (ce->ctx) {
        cu.CtxSetCurrent(ce->ctx);
        if (ce->compute) cu.StreamSynchronize(ce->compute);
        if (ce->copy) cu.StreamSynchronize(ce->copy);
        for (int i = 0; i < ce->n_graphs; i++) cu.GraphExecDestroy(ce->graphs[i].exec);
        if (ce->registered) cu.MemHostUnregister(ce->registered);
        if (ce->hmeta) cu.MemFreeHost(ce->hmeta);
        CUdeviceptr bufs[] = {ce->weights, ce->staging, ce->kc, ce->vc, ce->act};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
            if (bufs[i]) cu.MemFree(bufs[i]);
        if (ce->span_ev)
            for (int s = 0; s < ce->plan.n_spans; s++)
                if (ce->span_ev[s]) cu.EventDestroy(ce->span_ev[s]);
        if (ce->t0) cu.EventDestroy(ce->t0);
        if (ce->t1) cu.EventDestroy(ce->t1);
        if (ce->pa) cu.EventDestroy(ce->pa);
        if (ce->pb) cu.EventDestroy(ce->pb);
        if (ce->prof) cuda_engine_profile_report(ce, "at close");
        if (ce->compute) cu.StreamDestroy(ce->compute);
        if (ce->copy) cu.StreamDestroy(ce->copy);
        if (ce->mod) cu.ModuleUnload(ce->mod);
        cu.DevicePrimaryCtxRelease(ce->dev);
    }
    free(ce->span_ev);
    free(ce->span_queued);
    free(ce->w);
    cuda_plan_free(&ce->plan);
    free(ce);
}

void cuda_engine_info(const struct cuda_engine *ce, struct cuda_device_info *info)
{
    *info = ce->info;
}

uint64_t cuda_weight_bytes(const struct cuda_engine *ce)
{
    return ce->plan.device_bytes;
}

int cuda_engine_register_host(struct cuda_engine *ce, void *base, size_t size, char *err)
{
    if (ce->registered) return errmsg_set(err, "cuda: host memory is already registered");
    CK(cu.CtxSetCurrent(ce->ctx), "cuda: cuCtxSetCurrent");
    CK(cu.MemHostRegister(base, size, CUX_MEMHOSTREGISTER_PORTABLE),
       "cuda: cuMemHostRegister(arena)");
    ce->registered = base;
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Launch wrappers */

/* A launch timed on its own stream (STRATA_CUDA_PROFILE): events around it, then wait. */
static int launch_timed(struct cuda_engine *ce, CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                        unsigned bx, unsigned smem, CUstream s, void **args, const char *what,
                        char *err)
{
    float ms = 0;
    CK(cu.EventRecord(ce->pa, s), "cuda: profile event");
    CK(cu.LaunchKernel(f, gx, gy, gz, bx, 1, 1, smem, s, args, NULL), what);
    CK(cu.EventRecord(ce->pb, s), "cuda: profile event");
    CK(cu.EventSynchronize(ce->pb), what);
    CK(cu.EventElapsedTime(&ms, ce->pa, ce->pb), "cuda: profile event");
    int i = 0;
    while (i < ce->n_prof && ce->kp[i].what != what) i++;
    if (i == ce->n_prof && i < (int)(sizeof ce->kp / sizeof ce->kp[0]))
        ce->kp[ce->n_prof++] = (struct kprof){what, 0, 0};
    if (i < ce->n_prof) ce->kp[i].ms += ms, ce->kp[i].calls++;
    return 0;
}

static int launch3(struct cuda_engine *ce, CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                   unsigned bx, unsigned smem, CUstream s, void **args, const char *what, char *err)
{
    if (ce->prof && !ce->capturing)
        return launch_timed(ce, f, gx, gy, gz, bx, smem, s, args, what, err);
    return cu_check(cu.LaunchKernel(f, gx, gy, gz, bx, 1, 1, smem, s, args, NULL), what, err);
}

static int launch(struct cuda_engine *ce, CUfunction f, unsigned gx, unsigned gy, unsigned bx,
                  unsigned smem, CUstream s, void **args, const char *what, char *err)
{
    return launch3(ce, f, gx, gy, 1, bx, smem, s, args, what, err);
}

static int kprof_cmp(const void *a, const void *b)
{
    double x = ((const struct kprof *)a)->ms, y = ((const struct kprof *)b)->ms;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* The totals of STRATA_CUDA_PROFILE since the last report, largest first; then from zero. */
void cuda_engine_profile_report(struct cuda_engine *ce, const char *label)
{
    double all = 0;
    for (int i = 0; i < ce->n_prof; i++) all += ce->kp[i].ms;
    if (all <= 0) return;
    qsort(ce->kp, (size_t)ce->n_prof, sizeof ce->kp[0], kprof_cmp);
    fprintf(stderr, "cuda profile, %s (%s; each launch timed alone, graphs off): %.3f ms\n", label,
            ce->info.name, all);
    for (int i = 0; i < ce->n_prof; i++)
        fprintf(stderr, "  %-24s %8ld calls %10.3f ms %9.2f us each %5.1f%%\n", ce->kp[i].what,
                ce->kp[i].calls, ce->kp[i].ms, 1e3 * ce->kp[i].ms / (double)ce->kp[i].calls,
                100 * ce->kp[i].ms / all);
    ce->n_prof = 0;
}

static int elementwise(struct cuda_engine *ce, int k, CUdeviceptr a, CUdeviceptr b, long long n,
                       char *err)
{
    void *args[] = {&a, &b, &n};
    return launch(ce, ce->fn[k], cuda_elementwise_blocks(n, 256), 1, 256, 0, ce->compute, args,
                  k_name[k], err);
}

/* k_gemv's argument block (k_gemv.cuh gemv_args). */
enum { GEMV_STORE = 0, GEMV_ADD = 1, GEMV_SWIGLU = 2 };
struct gemv_args {
    struct dmat w[3];
    CUdeviceptr y[3];
    int rows_end[3];
    int n_mats, mode;
};
_Static_assert(sizeof(struct gemv_args) == 192, "gemv_args layout");

/* GEMV over n tokens, CUDA_GEMV_MAX_NT per launch: y_i = x W_i^T for n_mats matrices of one type
 * and cols (q, k, v in one launch), or with mode GEMV_ADD y_0 += x W_0^T, or with GEMV_SWIGLU
 * y_0 = silu(x W_0^T) * (x W_1^T). xq_ready: x is already quantized in ce->xq (rmsnorm_gemv: one
 * pass of n tokens). */
static int dev_gemv_q(struct cuda_engine *ce, int n_mats, const struct dmat *const *w,
                      const CUdeviceptr *y, int mode, CUdeviceptr x, int n, int xq_ready, char *err)
{
    struct gemv_args a;
    memset(&a, 0, sizeof a);
    int total = 0, all_q4k = !gemvq_chunks; /* every matrix Q4_K: k_gemvq_q4k_* */
    for (int i = 0; i < 3; i++) {
        if (i < n_mats || (mode == GEMV_SWIGLU && i == 1)) {
            a.w[i] = *w[i];
            all_q4k &= w[i]->type == GGML_Q4_K;
        }
        if (i < n_mats) total += w[i]->rows;
        a.rows_end[i] = total;
    }
    a.n_mats = n_mats;
    a.mode = mode;
    uint32_t type = (uint32_t)w[0]->type;
    int wi = wi_of(type), cols = w[0]->cols;
    /* the quantized GEMVs hold the pass's activations in shared memory: fewer tokens per pass
     * for long rows */
    int pass = cuda_gemv_pass(type, cols, ce->gemvq_smem_limit);
    for (int t0 = 0; t0 < n; t0 += pass) {
        int nt = n - t0 < pass ? n - t0 : pass;
        int NT = cuda_gemv_nt(nt), j = NT == 1 ? 0 : NT == 2 ? 1 : NT == 4 ? 2 : 3;
        for (int i = 0; i < n_mats; i++) a.y[i] = y[i] + (size_t)t0 * w[i]->rows * 4;
        CUdeviceptr xx = x + (size_t)t0 * cols * 4;
        const char *what = mode == GEMV_SWIGLU ? "k_gemv gate,up"
                           : mode == GEMV_ADD  ? "k_gemv wo|down (+x)"
                           : n_mats == 3       ? "k_gemv q,k,v"
                                               : "k_gemv";
        int fam = gq_of(type);
        if (fam < 0) { /* F32/F16/BF16: f32 activations straight from x */
            void *args[] = {&a, &xx, &nt};
            if (launch(ce, ce->gemv[wi][j], cuda_gemv_blocks(type, total), 1, CUDA_GEMV_THREADS, 0,
                       ce->compute, args, what, err))
                return -1;
            continue;
        }
        /* the block types: the pass's tokens quantized once into xq, then the GEMV */
        CUdeviceptr xq = ce->xq;
        const int wpb = CUDA_GEMV_THREADS / 32; /* warps a block */
        /* a warp's step: one 256-block (Q8_K) or eight 32-blocks (Q8_0/1), k_gemvq_quant's */
        int steps = fam == GQ_SUPER ? nt * (cols / 256) : (nt * (cols / 32) + 7) / 8;
        int qblocks = (steps + wpb - 1) / wpb, rpw = cuda_gemvq_rpw(total, nt, ce->info.sms);
        void *qargs[] = {&xx, &nt, &cols, &xq};
        if (!xq_ready && launch(ce, ce->fn[fam == GQ_SUPER ? K_GEMVQ_QUANT_K : K_GEMVQ_QUANT_32],
                                (unsigned)qblocks, 1, CUDA_GEMV_THREADS, 0, ce->compute, qargs,
                                "k_gemvq_quant", err))
            return -1;
        void *args[] = {&a, &xq, &nt, &rpw};
        unsigned grid = (unsigned)((total + wpb * rpw - 1) / (wpb * rpw));
        if (launch(ce, all_q4k ? ce->gemvq4k[j] : ce->gemv[wi][j], grid, 1, CUDA_GEMV_THREADS,
                   (unsigned)cuda_gemvq_smem(type, cols, nt), ce->compute, args, what, err))
            return -1;
    }
    return 0;
}

static int dev_gemv(struct cuda_engine *ce, int n_mats, const struct dmat *const *w,
                    const CUdeviceptr *y, int mode, CUdeviceptr x, int n, char *err)
{
    return dev_gemv_q(ce, n_mats, w, y, mode, x, n, 0, err);
}

static int use_gemm(uint32_t type, int n)
{
    return cuda_use_gemm_from(type, n, gemm_min_tokens);
}

/* y (n x rows) = x (n x cols) W^T: tensor cores for many tokens, else GEMV. */
static int dev_matmul(struct cuda_engine *ce, const struct dmat *w, CUdeviceptr x, CUdeviceptr y,
                      int n, char *err)
{
    if (use_gemm((uint32_t)w->type, n)) {
        struct dmat dm = *w;
        void *args[] = {&dm, &x, &y, &n};
        return launch(ce, ce->gemm[wi_of((uint32_t)w->type)], cuda_gemm_blocks(w->rows),
                      cuda_gemm_blocks(n), CUDA_GEMM_THREADS, 0, ce->compute, args, "k_gemm", err);
    }
    return dev_gemv(ce, 1, &w, &y, GEMV_STORE, x, n, err);
}

/* Whether matrices a and b can share one GEMV launch at n tokens: the same kernel family (one
 * type, or types whose kernel dispatches per matrix: Q4_K_M's Q4_K and Q6_K) and input. */
static int gemv_pair(const struct dmat *a, const struct dmat *b, int n)
{
    return !use_gemm((uint32_t)a->type, n) && !use_gemm((uint32_t)b->type, n) &&
           cuda_gemv_family((uint32_t)a->type) == cuda_gemv_family((uint32_t)b->type) &&
           a->cols == b->cols;
}

static int dev_rmsnorm(struct cuda_engine *ce, CUdeviceptr x, const struct dmat *w, CUdeviceptr out,
                       int n, CUdeviceptr rows, char *err)
{
    int dim = ce->cfg.dim;
    float eps = ce->cfg.norm_eps;
    CUdeviceptr wp = w->qs;
    void *args[] = {&x, &wp, &out, &dim, &eps, &rows};
    return launch(ce, ce->fn[K_RMSNORM], (unsigned)n, 1, 1024, 0, ce->compute, args, "k_rmsnorm",
                  err);
}

/* xb = rmsnorm(x), then the GEMV of matrices w (one launch: q, k, v or gate, up): with a block
 * type and all n tokens in one GEMV pass, the norm and the activations' quantization are one
 * launch (k_rmsnorm_quant_*: the same floats and integers as the two), else as before. */
static int rmsnorm_gemv(struct cuda_engine *ce, const struct dmat *norm, int n_mats,
                        const struct dmat *const *w, const CUdeviceptr *y, int mode, int n,
                        char *err)
{
    uint32_t type = (uint32_t)w[0]->type;
    int fam = gq_of(type), dim = ce->cfg.dim;
    if (w[0]->cols != dim || !cuda_rmsnorm_fuses(type, dim, n, ce->gemvq_smem_limit)) {
        return dev_rmsnorm(ce, ce->x, norm, ce->xb, n, 0, err) ||
               dev_gemv(ce, n_mats, w, y, mode, ce->xb, n, err);
    }
    CUdeviceptr x = ce->x, wp = norm->qs, out = ce->xb, xq = ce->xq;
    float eps = ce->cfg.norm_eps;
    void *args[] = {&x, &wp, &out, &dim, &eps, &xq, &n};
    return launch(ce, ce->fn[fam == GQ_SUPER ? K_RMSNORM_QUANT_K : K_RMSNORM_QUANT_32], (unsigned)n,
                  1, 1024, (unsigned)dim * 4, ce->compute, args, "k_rmsnorm_quant", err) ||
           dev_gemv_q(ce, n_mats, w, y, mode, ce->xb, n, 1, err);
}

/* ---------------------------------------------------------------------------------------------
 * Weight upload: pinned host -> staging -> device layout, per span, on the copy stream. */

int cuda_upload_span(struct cuda_engine *ce, int s, char *err)
{
    if (s < 0 || s >= ce->plan.n_spans)
        return errmsg_set(err, "cuda: span %d out of range (0..%d)", s, ce->plan.n_spans - 1);
    const struct cuda_span *sp = &ce->plan.spans[s];
    CK(cu.CtxSetCurrent(ce->ctx), "cuda: cuCtxSetCurrent");
    CK(cu.MemcpyHtoDAsync(ce->staging, sp->host, sp->bytes, ce->copy), "cuda: upload span");
    for (int i = sp->first_mat; i < sp->first_mat + sp->n_mats; i++) {
        const struct cuda_mat *mt = &ce->plan.mats[i];
        CUdeviceptr src = ce->staging + mt->src_off, dst = ce->w[i].qs;
        const struct cuda_block_format *bf = cuda_block_format(mt->type);
        if (bf && mt->type != GGML_Q8_0 && mt->type != GGML_Q4_0) {
            /* the k_quant.cuh types: each block's fields to their planes */
            struct repack_planes rp;
            memset(&rp, 0, sizeof rp);
            const CUdeviceptr plane[CUDA_PLANES] = {ce->w[i].qs, ce->w[i].e, ce->w[i].s,
                                                    ce->w[i].d};
            for (int k = 0; k < CUDA_PLANES; k++) {
                if (!bf->len[k]) continue;
                rp.dst[rp.n] = plane[k];
                rp.off[rp.n] = bf->off[k];
                rp.len[rp.n] = bf->len[k];
                rp.n++;
            }
            long long nb = (long long)mt->rows * (mt->cols / bf->elems);
            int bb = bf->bytes;
            void *args[] = {&src, &rp, &nb, &bb};
            if (launch(ce, ce->fn[K_REPACK_PLANES], cuda_elementwise_blocks((nb + 255) / 256, 1), 1,
                       256, 0, ce->copy, args, "k_repack_planes", err))
                return -1;
        } else if (mt->type == GGML_Q8_0 || mt->type == GGML_Q4_0) {
            CUdeviceptr d = ce->w[i].d;
            long long nb = (long long)mt->rows * (mt->cols / 32);
            int qbytes = mt->type == GGML_Q8_0 ? 32 : 16;
            void *args[] = {&src, &dst, &d, &nb, &qbytes};
            if (launch(ce, ce->fn[K_REPACK_BLOCKS], cuda_elementwise_blocks(nb, 256), 1, 256, 0,
                       ce->copy, args, "k_repack_blocks", err))
                return -1;
        } else {
            int esz = mt->type == GGML_F32 ? 4 : 2;
            int rows = mt->rows, row_bytes = mt->cols * esz, ld_bytes = mt->ld * esz;
            void *args[] = {&src, &dst, &rows, &row_bytes, &ld_bytes};
            if (launch(ce, ce->fn[K_REPACK_ROWS],
                       cuda_elementwise_blocks((long long)mt->qs_bytes, 256), 1, 256, 0, ce->copy,
                       args, "k_repack_rows", err))
                return -1;
        }
    }
    CK(cu.EventRecord(ce->span_ev[s], ce->copy), "cuda: cuEventRecord(span)");
    ce->span_queued[s] = 1;
    ce->all_ready = 0; /* captured steps do not wait for spans: none until this one lands */
    return 0;
}

int cuda_upload_all(struct cuda_engine *ce, char *err)
{
    for (int s = 0; s < ce->plan.n_spans; s++)
        if (cuda_upload_span(ce, s, err)) return -1;
    return 0;
}

int cuda_span_ready(struct cuda_engine *ce, int s)
{
    if (s < 0 || s >= ce->plan.n_spans || !ce->span_queued[s]) return 0;
    cu.CtxSetCurrent(ce->ctx);
    return cu.EventQuery(ce->span_ev[s]) == CUX_SUCCESS;
}

int cuda_upload_wait(struct cuda_engine *ce, char *err)
{
    CK(cu.CtxSetCurrent(ce->ctx), "cuda: cuCtxSetCurrent");
    CK(cu.StreamSynchronize(ce->copy), "cuda: weight upload");
    return 0;
}

/* The compute stream waits (on the device, not the host) for span s. */
static int need_span(struct cuda_engine *ce, int s, char *err)
{
    if (ce->capturing) return 0; /* capture only starts once every span has landed */
    if (!ce->span_queued[s])
        return errmsg_set(err, "cuda: span %d (%s) has not been uploaded", s,
                          s == 0                      ? "token_embd"
                          : s == ce->plan.n_spans - 1 ? "output"
                                                      : "layer");
    CK(cu.StreamWaitEvent(ce->compute, ce->span_ev[s], 0), "cuda: cuStreamWaitEvent(span)");
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * The step's metadata: tokens, positions, block tables, logit rows -> device. */

static int upload_batch(struct cuda_engine *ce, const struct batch *b, int with_tokens, char *err)
{
    const struct engine_limits *lim = &ce->lim;
    if (b->n < 1 || b->n > lim->max_tokens)
        return errmsg_set(err, "cuda: batch of %d tokens (1..%d)", b->n, lim->max_tokens);
    if (b->n_logits < 0 || b->n_logits > b->n)
        return errmsg_set(err, "cuda: %d logit rows for %d tokens", b->n_logits, b->n);
    int mb = ce->max_blocks_per_seq, bs = lim->kv_block_size;
    for (int i = 0; i < b->n; i++) {
        int p = b->pos[i];
        if (p < 0 || p >= lim->ctx)
            return errmsg_set(err, "cuda: token %d: position %d outside the context (%d)", i, p,
                              lim->ctx);
        for (int j = 0; j <= p / bs; j++) {
            int blk = b->blocks[i][j];
            /* A bad id would make the kernels write outside the cache. */
            if (blk < 0 || blk >= lim->kv_blocks)
                return errmsg_set(err, "cuda: token %d: block %d of its table is %d (0..%d)", i, j,
                                  blk, lim->kv_blocks - 1);
            ce->h_bt[(size_t)i * mb + j] = blk;
        }
        ce->h_pos[i] = p;
        if (with_tokens) ce->h_tok[i] = b->token[i];
    }
    for (int i = 0; i < b->n_logits; i++) {
        if (b->logit_rows[i] < 0 || b->logit_rows[i] >= b->n)
            return errmsg_set(err, "cuda: logit row %d is %d (0..%d)", i, b->logit_rows[i],
                              b->n - 1);
        ce->h_rows[i] = b->logit_rows[i];
    }
    CUstream s = ce->compute;
    CK(cu.MemcpyHtoDAsync(ce->pos, ce->h_pos, (size_t)b->n * 4, s), "cuda: upload positions");
    CK(cu.MemcpyHtoDAsync(ce->bt, ce->h_bt, (size_t)b->n * mb * 4, s), "cuda: upload blocks");
    if (with_tokens)
        CK(cu.MemcpyHtoDAsync(ce->tok, ce->h_tok, (size_t)b->n * 4, s), "cuda: upload tokens");
    if (b->n_logits)
        CK(cu.MemcpyHtoDAsync(ce->rows, ce->h_rows, (size_t)b->n_logits * 4, s),
           "cuda: upload logit rows");
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * The forward pass on device buffers. Reads like llama2.c's forward(). */

static int dev_embed(struct cuda_engine *ce, int n, char *err)
{
    if (need_span(ce, 0, err)) return -1;
    struct dmat w = ce->w[ce->plan.embd];
    CUdeviceptr tok = ce->tok, x = ce->x;
    void *args[] = {&w, &tok, &x};
    return launch(ce, ce->fn[K_EMBED], (unsigned)n, 1, 256, 0, ce->compute, args, "k_embed", err);
}

/* x += in W^T */
static int residual(struct cuda_engine *ce, const struct dmat *w, CUdeviceptr in, int n, char *err)
{
    if (!use_gemm((uint32_t)w->type, n)) {
        CUdeviceptr x = ce->x;
        return dev_gemv(ce, 1, &w, &x, GEMV_ADD, in, n, err);
    }
    return dev_matmul(ce, w, in, ce->xb2, n, err) ||
           elementwise(ce, K_ADD, ce->x, ce->xb2, (long long)n * ce->cfg.dim, err);
}

/* The device address of layer l's optional vector f (CM_BQ ...), 0 where the model has none. */
static CUdeviceptr layer_vec(struct cuda_engine *ce, int l, int f)
{
    int i = cuda_plan_layer_mat(&ce->plan, l, f);
    return i < 0 ? 0 : ce->w[i].qs;
}

static int dev_layer(struct cuda_engine *ce, int l, int n, char *err)
{
    const struct model_config *c = &ce->cfg;
    const struct engine_limits *lim = &ce->lim;
    const struct dmat *w = &ce->w[cuda_plan_layer_mat(&ce->plan, l, CM_ATTN_NORM)];
    /* w[CM_ATTN_NORM .. CM_UP]: the nine every layer has, in that order (cuda_plan.h) */
    if (need_span(ce, 1 + l, err)) return -1;

    /* attention: xb = rmsnorm(x); q, k, v = xb Wq, Wk, Wv; [+ biases; per-head q/k norms];
     * RoPE, k and v into the cache; attend */
    if (gemv_pair(&w[CM_Q], &w[CM_K], n) && gemv_pair(&w[CM_Q], &w[CM_V], n)) {
        const struct dmat *m3[3] = {&w[CM_Q], &w[CM_K], &w[CM_V]};
        CUdeviceptr y3[3] = {ce->q, ce->k, ce->v};
        if (rmsnorm_gemv(ce, &w[CM_ATTN_NORM], 3, m3, y3, GEMV_STORE, n, err)) return -1;
    } else if (dev_rmsnorm(ce, ce->x, &w[CM_ATTN_NORM], ce->xb, n, 0, err) ||
               dev_matmul(ce, &w[CM_Q], ce->xb, ce->q, n, err) ||
               dev_matmul(ce, &w[CM_K], ce->xb, ce->k, n, err) ||
               dev_matmul(ce, &w[CM_V], ce->xb, ce->v, n, err)) {
        return -1;
    }
    if (c->qkv_bias || c->qk_norm) {
        CUdeviceptr q = ce->q, k = ce->k, v = ce->v, bq = layer_vec(ce, l, CM_BQ),
                    bk = layer_vec(ce, l, CM_BK), bv = layer_vec(ce, l, CM_BV),
                    qn = layer_vec(ce, l, CM_Q_NORM), kn = layer_vec(ce, l, CM_K_NORM);
        int nh = c->n_heads, nkv = c->n_kv_heads, hd = c->head_dim;
        float eps = c->norm_eps;
        void *args[] = {&q, &k, &v, &bq, &bk, &bv, &qn, &kn, &nh, &nkv, &hd, &eps};
        if (launch(ce, ce->fn[K_QK_PREP], (unsigned)n, (unsigned)(nh + nkv), 32, 0, ce->compute,
                   args, "k_qk_prep", err))
            return -1;
    }
    {
        CUdeviceptr q = ce->q, k = ce->k, v = ce->v, kc = ce->kc, vc = ce->vc, pos = ce->pos,
                    bt = ce->bt, ff = layer_vec(ce, l, CM_ROPE_FREQS);
        int mb = ce->max_blocks_per_seq, layer = l, nblk = lim->kv_blocks, bs = lim->kv_block_size,
            nh = c->n_heads, nkv = c->n_kv_heads, hd = c->head_dim,
            neox = c->rope_style == ROPE_HALVES;
        float theta = c->rope_theta > 0 ? c->rope_theta : 10000.0f, scale = c->rope_scale;
        void *args[] = {&q,    &k,  &v,  &kc,  &vc, &pos,   &bt,   &mb, &layer,
                        &nblk, &bs, &nh, &nkv, &hd, &theta, &neox, &ff, &scale};
        /* a step of few tokens: a pair a thread over as many blocks as that takes (8B: 20) */
        int pairs = (nh + nkv) * (hd / 2);
        unsigned gy = n >= 64 ? 1 : (unsigned)((pairs + 127) / 128);
        if (launch(ce, ce->fn[K_ROPE_STORE], (unsigned)n, gy, 128, 0, ce->compute, args,
                   "k_rope_store", err))
            return -1;
    }
    {
        CUdeviceptr q = ce->q, kc = ce->kc, vc = ce->vc, out = ce->att, part = ce->apart,
                    cnt = ce->acnt, pos = ce->pos, bt = ce->bt;
        int mb = ce->max_blocks_per_seq, layer = l, nblk = lim->kv_blocks, bs = lim->kv_block_size,
            nh = c->n_heads, nkv = c->n_kv_heads, hd = c->head_dim,
            ns = cuda_attention_splits(n, nh, lim->ctx, ce->info.sms);
        float scale = 1.0f / sqrtf((float)c->head_dim);
        void *args[] = {&q,  &kc,    &vc,   &out, &part, &cnt, &pos, &bt,
                        &mb, &layer, &nblk, &bs,  &nh,   &nkv, &hd,  &scale};
        if (launch3(ce, ce->fn[K_ATTENTION], (unsigned)nh, (unsigned)n, (unsigned)ns,
                    CUDA_ATTN_THREADS, 0, ce->compute, args, "k_attention", err))
            return -1;
    }
    /* x += att Wo (GEMV adds in place; the tensor-core path adds after) */
    if (residual(ce, &w[CM_O], ce->att, n, err)) return -1;

    /* FFN: x += (silu(xb Wgate) * (xb Wup)) Wdown, xb = rmsnorm(x) */
    if (gemv_pair(&w[CM_GATE], &w[CM_UP], n)) {
        const struct dmat *gu[2] = {&w[CM_GATE], &w[CM_UP]};
        CUdeviceptr y = ce->hb;
        if (rmsnorm_gemv(ce, &w[CM_FFN_NORM], 1, gu, &y, GEMV_SWIGLU, n, err)) return -1;
    } else if (dev_rmsnorm(ce, ce->x, &w[CM_FFN_NORM], ce->xb, n, 0, err) ||
               dev_matmul(ce, &w[CM_GATE], ce->xb, ce->hb, n, err) ||
               dev_matmul(ce, &w[CM_UP], ce->xb, ce->hb2, n, err) ||
               elementwise(ce, K_SWIGLU, ce->hb, ce->hb2, (long long)n * c->hidden_dim, err)) {
        return -1;
    }
    return residual(ce, &w[CM_DOWN], ce->hb, n, err);
}

/* Final norm of the logit rows (gathered into xb) and the output matrix, max_logits rows at a
 * time: logits rows [r0, r0+nr) of this chunk land at ce->logits. */
static int dev_head_chunk(struct cuda_engine *ce, int r0, int nr, char *err)
{
    CUdeviceptr rows = ce->rows + (size_t)r0 * 4;
    if (dev_rmsnorm(ce, ce->x, &ce->w[ce->plan.out_norm], ce->xb, nr, rows, err)) return -1;
    return dev_matmul(ce, &ce->w[ce->plan.out], ce->xb, ce->logits, nr, err);
}

static int head_spans(struct cuda_engine *ce, char *err)
{
    if (need_span(ce, ce->plan.n_spans - 1, err)) return -1;
    if (ce->plan.out == ce->plan.embd && need_span(ce, 0, err)) return -1;
    return 0;
}

static int sync_compute(struct cuda_engine *ce, const char *what, char *err)
{
    return cu_check(cu.StreamSynchronize(ce->compute), what, err);
}

/* ---------------------------------------------------------------------------------------------
 * Host-buffer operations (engine.h) */

static int check_layers(struct cuda_engine *ce, int l0, int l1, char *err)
{
    if (l0 < 0 || l1 > ce->cfg.n_layers || l0 > l1)
        return errmsg_set(err, "cuda: layer range [%d, %d) outside [0, %d)", l0, l1,
                          ce->cfg.n_layers);
    return 0;
}

int cuda_embed(struct cuda_engine *ce, const struct batch *b, float *x, char *err)
{
    CK(cu.CtxSetCurrent(ce->ctx), "cuda: cuCtxSetCurrent");
    if (upload_batch(ce, b, 1, err) || dev_embed(ce, b->n, err)) return -1;
    CK(cu.MemcpyDtoHAsync(x, ce->x, (size_t)b->n * ce->cfg.dim * 4, ce->compute),
       "cuda: download hidden states");
    return sync_compute(ce, "cuda: embed", err);
}

int cuda_layers(struct cuda_engine *ce, const struct batch *b, int l0, int l1, float *x, char *err)
{
    CK(cu.CtxSetCurrent(ce->ctx), "cuda: cuCtxSetCurrent");
    if (check_layers(ce, l0, l1, err) || upload_batch(ce, b, 0, err)) return -1;
    size_t bytes = (size_t)b->n * ce->cfg.dim * 4;
    CK(cu.MemcpyHtoDAsync(ce->x, x, bytes, ce->compute), "cuda: upload hidden states");
    for (int l = l0; l < l1; l++)
        if (dev_layer(ce, l, b->n, err)) return -1;
    CK(cu.MemcpyDtoHAsync(x, ce->x, bytes, ce->compute), "cuda: download hidden states");
    return sync_compute(ce, "cuda: layers", err);
}

int cuda_head(struct cuda_engine *ce, const struct batch *b, const float *x, float *logits,
              char *err)
{
    CK(cu.CtxSetCurrent(ce->ctx), "cuda: cuCtxSetCurrent");
    if (upload_batch(ce, b, 0, err) || head_spans(ce, err)) return -1;
    CK(cu.MemcpyHtoDAsync(ce->x, x, (size_t)b->n * ce->cfg.dim * 4, ce->compute),
       "cuda: upload hidden states");
    size_t V = (size_t)ce->cfg.vocab_size;
    for (int r0 = 0; r0 < b->n_logits; r0 += ce->max_logits) {
        int nr = b->n_logits - r0 < ce->max_logits ? b->n_logits - r0 : ce->max_logits;
        if (dev_head_chunk(ce, r0, nr, err)) return -1;
        CK(cu.MemcpyDtoHAsync(logits + (size_t)r0 * V, ce->logits, (size_t)nr * V * 4, ce->compute),
           "cuda: download logits");
        /* the next chunk reuses ce->logits: the copy must be done first (same stream: it is) */
    }
    return sync_compute(ce, "cuda: head", err);
}

static int dev_forward_body(struct cuda_engine *ce, int n, char *err)
{
    if (dev_embed(ce, n, err)) return -1;
    for (int l = 0; l < ce->cfg.n_layers; l++)
        if (dev_layer(ce, l, n, err)) return -1;
    return head_spans(ce, err);
}

static int dev_sample(struct cuda_engine *ce, int r0, int nr, char *err);

/* The device work of a step whose metadata is uploaded: embed, layers, the head of the first
 * n_logits rows (<= max_logits) and, with `sample`, the sampler. */
static int dev_step(struct cuda_engine *ce, int n, int n_logits, int sample, char *err)
{
    if (dev_forward_body(ce, n, err)) return -1;
    if (n_logits && dev_head_chunk(ce, 0, n_logits, err)) return -1;
    if (sample && n_logits && dev_sample(ce, 0, n_logits, err)) return -1;
    return 0;
}

static int all_spans_ready(struct cuda_engine *ce)
{
    if (ce->all_ready) return 1;
    for (int s = 0; s < ce->plan.n_spans; s++)
        if (!ce->span_queued[s] || cu.EventQuery(ce->span_ev[s]) != CUX_SUCCESS) return 0;
    return ce->all_ready = 1;
}

/* dev_step through a CUDA graph: captured on first use of a shape, replayed after. Every kernel
 * argument is a device pointer or a shape, and the step's tokens, positions and tables live in
 * device buffers refreshed before each replay, so one graph serves every step of its shape. */
static int run_step(struct cuda_engine *ce, int n, int n_logits, int sample, char *err)
{
    if (!ce->graphs_on || !all_spans_ready(ce)) return dev_step(ce, n, n_logits, sample, err);
    for (int i = 0; i < ce->n_graphs; i++) {
        struct step_graph *g = &ce->graphs[i];
        if (g->n == n && g->n_logits == n_logits && g->sample == sample)
            return cu_check(cu.GraphLaunch(g->exec, ce->compute), "cuda: cuGraphLaunch", err);
    }
    CK(cu.StreamBeginCapture(ce->compute, CUX_STREAM_CAPTURE_MODE_THREAD_LOCAL),
       "cuda: cuStreamBeginCapture");
    ce->capturing = 1;
    int rc = dev_step(ce, n, n_logits, sample, err);
    ce->capturing = 0;
    CUgraph graph = NULL;
    CUresult r = cu.StreamEndCapture(ce->compute, &graph);
    CUgraphExec exec = NULL;
    if (rc == 0 && r == CUX_SUCCESS) r = cu.GraphInstantiate(&exec, graph, 0);
    if (graph) cu.GraphDestroy(graph);
    if (rc) return -1;
    if (r != CUX_SUCCESS) { /* still correct without graphs, only slower */
        log_warn("cuda", "CUDA graphs disabled: capture failed: %s", cu_errstr(r));
        ce->graphs_on = 0;
        return dev_step(ce, n, n_logits, sample, err);
    }
    struct step_graph *g;
    if (ce->n_graphs < GRAPH_CACHE) {
        g = &ce->graphs[ce->n_graphs++];
    } else {
        g = &ce->graphs[ce->next_evict];
        ce->next_evict = (ce->next_evict + 1) % GRAPH_CACHE;
        cu.GraphExecDestroy(g->exec);
    }
    *g = (struct step_graph){n, n_logits, sample, exec};
    return cu_check(cu.GraphLaunch(exec, ce->compute), "cuda: cuGraphLaunch", err);
}

void cuda_set_graphs(struct cuda_engine *ce, int on)
{
    ce->graphs_on = on;
}

int cuda_forward(struct cuda_engine *ce, const struct batch *b, float *logits, char *err)
{
    CK(cu.CtxSetCurrent(ce->ctx), "cuda: cuCtxSetCurrent");
    if (upload_batch(ce, b, 1, err)) return -1;
    size_t V = (size_t)ce->cfg.vocab_size;
    if (b->n_logits <= ce->max_logits) {
        if (run_step(ce, b->n, b->n_logits, 0, err)) return -1;
        if (b->n_logits)
            CK(cu.MemcpyDtoHAsync(logits, ce->logits, (size_t)b->n_logits * V * 4, ce->compute),
               "cuda: download logits");
        return sync_compute(ce, "cuda: forward", err);
    }
    if (dev_forward_body(ce, b->n, err)) return -1;
    for (int r0 = 0; r0 < b->n_logits; r0 += ce->max_logits) {
        int nr = b->n_logits - r0 < ce->max_logits ? b->n_logits - r0 : ce->max_logits;
        if (dev_head_chunk(ce, r0, nr, err)) return -1;
        CK(cu.MemcpyDtoHAsync(logits + (size_t)r0 * V, ce->logits, (size_t)nr * V * 4, ce->compute),
           "cuda: download logits");
    }
    return sync_compute(ce, "cuda: forward", err);
}

/* ---------------------------------------------------------------------------------------------
 * Sampling on the device */

static int dev_sample(struct cuda_engine *ce, int r0, int nr, char *err)
{
    CUdeviceptr logits = ce->logits, sp = ce->sparams + (size_t)r0 * sizeof(struct sample_param);
    int vocab = ce->cfg.vocab_size;
    void *args[] = {&logits, &vocab, &sp};
    return launch(ce, ce->fn[K_SAMPLE], (unsigned)nr, 1, CUDA_SAMPLE_THREADS, 0, ce->compute, args,
                  "k_sample", err);
}

int cuda_forward_sample(struct cuda_engine *ce, const struct batch *b,
                        struct sampler *const *samplers, int *tokens, char *err)
{
    CK(cu.CtxSetCurrent(ce->ctx), "cuda: cuCtxSetCurrent");
    if (b->n_logits > ce->max_logits)
        return errmsg_set(err, "cuda: %d rows to sample, at most %d (max_seqs)", b->n_logits,
                          ce->max_logits);
    for (int i = 0; i < b->n_logits; i++) {
        const struct sampler *s = samplers[i];
        ce->h_sp[i] = (struct sample_param){
            .temperature = s->p.temperature,
            .top_p = s->p.top_p,
            .min_p = s->p.min_p,
            .top_k = s->p.top_k,
            .rng = s->rng,
            .token = -1,
        };
    }
    if (upload_batch(ce, b, 1, err)) return -1;
    size_t spb = (size_t)b->n_logits * sizeof(struct sample_param);
    CK(cu.MemcpyHtoDAsync(ce->sparams, ce->h_sp, spb, ce->compute), "cuda: upload sampling");
    if (run_step(ce, b->n, b->n_logits, 1, err)) return -1;
    CK(cu.MemcpyDtoHAsync(ce->h_sp, ce->sparams, spb, ce->compute), "cuda: download tokens");
    if (sync_compute(ce, "cuda: forward+sample", err)) return -1;
    for (int i = 0; i < b->n_logits; i++) {
        tokens[i] = ce->h_sp[i].token;
        samplers[i]->rng = ce->h_sp[i].rng;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * engine_backend adapter: the engine keeps a cuda_engine in backend_state. */

static int be_init(struct engine *e, struct arena *a, char *err)
{
    struct cuda_engine *ce;
    if (cuda_engine_open(&ce, e->model, &e->lim, err)) return -1;
    if (a && a->base && cuda_engine_register_host(ce, a->base, a->size, err)) {
        /* Still correct without it, only slower: the driver stages pageable copies itself. */
        log_warn("cuda", "%s; weight uploads will not be DMA", err);
    }
    /* The loader has filled the image before engine_init; a node that streams weights in
     * re-uploads each span as it lands (upload_span). */
    if (cuda_upload_all(ce, err)) {
        cuda_engine_close(ce);
        return -1;
    }
    e->backend_state = ce;
    /* The device cache is f32 whatever the host's kv_type (an f16 device cache is not written
     * yet): say so when the host asked for f16. */
    log_info("cuda",
             "%s (sm_%d%d, %d SMs, %zu MiB), weights %llu MiB on the device, f32 KV cache%s",
             ce->info.name, ce->info.cc_major, ce->info.cc_minor, ce->info.sms,
             ce->info.total_mem >> 20, (unsigned long long)(ce->plan.device_bytes >> 20),
             e->lim.kv_type == KV_F16 ? " (--kv-type f16 applies to the CPU backend)" : "");
    return 0;
}

static void be_free(struct engine *e)
{
    cuda_engine_close(e->backend_state);
    e->backend_state = NULL;
}

static int be_embed(struct engine *e, const struct batch *b, float *x, char *err)
{
    return cuda_embed(e->backend_state, b, x, err);
}

static int be_layers(struct engine *e, const struct batch *b, int l0, int l1, float *x, char *err)
{
    return cuda_layers(e->backend_state, b, l0, l1, x, err);
}

static int be_head(struct engine *e, const struct batch *b, const float *x, float *logits,
                   char *err)
{
    return cuda_head(e->backend_state, b, x, logits, err);
}

static int be_forward_sample(struct engine *e, const struct batch *b,
                             struct sampler *const *samplers, int *tokens, char *err)
{
    return cuda_forward_sample(e->backend_state, b, samplers, tokens, err);
}

static int be_upload_span(struct engine *e, int span, char *err)
{
    return cuda_upload_span(e->backend_state, span, err);
}

static int be_span_ready(struct engine *e, int span)
{
    return cuda_span_ready(e->backend_state, span);
}

const struct engine_backend cuda_backend = {
    .name = "cuda",
    /* 0: a matrix product takes the GEMV or the tensor-core GEMM path by the batch's row count
     * (cuda_use_gemm), and the two round differently */
    .batch_invariant = 0,
    .kv_on_device = 1,
    .probe = cuda_probe,
    .device_name = cuda_device_name,
    .embed = be_embed,
    .layers = be_layers,
    .head = be_head,
    .init = be_init,
    .free = be_free,
    .forward_sample = be_forward_sample,
    .upload_span = be_upload_span,
    .span_ready = be_span_ready,
};

/* ---------------------------------------------------------------------------------------------
 * The probe (backends.c asks it before init) */

int cuda_probe(char *why)
{
    /* The driver first, kernels or not: on a GPU server the log then says what the driver
     * thinks (found, no device, wrong version) even from a binary built without nvcc. */
    size_t size;
    cuda_fatbin(&size);
    int rc = cu_api_load(why);
    if (size) return rc;
    if (rc) return errmsg_prefix(why, "built without CUDA kernels; ");
    return errmsg_set(why,
                      "built without CUDA kernels (the driver sees a device: rebuild with nvcc)");
}

void cuda_device_name(char *name, size_t cap)
{
    CUdevice d;
    snprintf(name, cap, "?");
    if (cu.DeviceGet(&d, 0) == CUX_SUCCESS) cu.DeviceGetName(name, (int)cap, d);
}

/* ---------------------------------------------------------------------------------------------
 * Measurements for the benchmarks */

static int elapsed(struct cuda_engine *ce, CUstream s, double *seconds, char *err)
{
    float ms = 0;
    CK(cu.EventRecord(ce->t1, s), "cuda: cuEventRecord");
    CK(cu.EventSynchronize(ce->t1), "cuda: cuEventSynchronize");
    CK(cu.EventElapsedTime(&ms, ce->t0, ce->t1), "cuda: cuEventElapsedTime");
    *seconds = ms / 1e3;
    return 0;
}

int cuda_measure_d2d(struct cuda_engine *ce, size_t bytes, int iters, double *gbs, char *err)
{
    CUdeviceptr a = 0, b = 0;
    int rc = -1;
    double best = 0;
    CK(cu.CtxSetCurrent(ce->ctx), "cuda: cuCtxSetCurrent");
    if (cu_check(cu.MemAlloc(&a, bytes), "cuda: cuMemAlloc(copy test)", err) ||
        cu_check(cu.MemAlloc(&b, bytes), "cuda: cuMemAlloc(copy test)", err))
        goto out;
    for (int i = 0; i <= iters; i++) { /* the first run warms up */
        double s;
        if (cu_check(cu.EventRecord(ce->t0, ce->compute), "cuda: event", err) ||
            cu_check(cu.MemcpyDtoDAsync(b, a, bytes, ce->compute), "cuda: cuMemcpyDtoD", err) ||
            elapsed(ce, ce->compute, &s, err))
            goto out;
        double r = 2.0 * bytes / s / 1e9; /* each byte is read and written */
        if (i && r > best) best = r;
    }
    *gbs = best;
    rc = 0;
out:
    if (a) cu.MemFree(a);
    if (b) cu.MemFree(b);
    return rc;
}

int cuda_measure_h2d(struct cuda_engine *ce, size_t bytes, int iters, double *gbs, char *err)
{
    void *h = NULL;
    CUdeviceptr d = 0;
    int rc = -1;
    double best = 0;
    CK(cu.CtxSetCurrent(ce->ctx), "cuda: cuCtxSetCurrent");
    if (cu_check(cu.MemAllocHost(&h, bytes), "cuda: cuMemAllocHost(copy test)", err) ||
        cu_check(cu.MemAlloc(&d, bytes), "cuda: cuMemAlloc(copy test)", err))
        goto out;
    memset(h, 1, bytes);
    for (int i = 0; i <= iters; i++) {
        double s;
        if (cu_check(cu.EventRecord(ce->t0, ce->copy), "cuda: event", err) ||
            cu_check(cu.MemcpyHtoDAsync(d, h, bytes, ce->copy), "cuda: cuMemcpyHtoD", err) ||
            elapsed(ce, ce->copy, &s, err))
            goto out;
        double r = bytes / s / 1e9;
        if (i && r > best) best = r;
    }
    *gbs = best;
    rc = 0;
out:
    if (d) cu.MemFree(d);
    if (h) cu.MemFreeHost(h);
    return rc;
}

int cuda_time_upload(struct cuda_engine *ce, double *seconds, uint64_t *bytes, char *err)
{
    CK(cu.CtxSetCurrent(ce->ctx), "cuda: cuCtxSetCurrent");
    CK(cu.StreamSynchronize(ce->compute), "cuda: sync");
    CK(cu.StreamSynchronize(ce->copy), "cuda: sync");
    CK(cu.EventRecord(ce->t0, ce->copy), "cuda: event");
    if (cuda_upload_all(ce, err)) return -1;
    if (elapsed(ce, ce->copy, seconds, err)) return -1;
    uint64_t n = 0;
    for (int s = 0; s < ce->plan.n_spans; s++) n += ce->plan.spans[s].bytes;
    *bytes = n;
    return 0;
}

int cuda_time_forward(struct cuda_engine *ce, const struct batch *b, int iters, double *seconds,
                      char *err)
{
    CK(cu.CtxSetCurrent(ce->ctx), "cuda: cuCtxSetCurrent");
    if (upload_batch(ce, b, 1, err)) return -1;
    int nl = b->n_logits < ce->max_logits ? b->n_logits : ce->max_logits;
    if (run_step(ce, b->n, nl, 0, err)) return -1; /* warm-up (and capture) */
    CK(cu.EventRecord(ce->t0, ce->compute), "cuda: event");
    for (int i = 0; i < iters; i++)
        if (run_step(ce, b->n, nl, 0, err)) return -1;
    if (elapsed(ce, ce->compute, seconds, err)) return -1;
    *seconds /= iters > 0 ? iters : 1;
    return 0;
}

int cuda_matmul_mat(struct cuda_engine *ce, int mat, const float *x, int n, float *y, char *err)
{
    CK(cu.CtxSetCurrent(ce->ctx), "cuda: cuCtxSetCurrent");
    if (mat < 0 || mat >= ce->plan.n_mats || n < 1)
        return errmsg_set(err, "cuda: matrix %d of %d, %d tokens", mat, ce->plan.n_mats, n);
    const struct dmat *w = &ce->w[mat];
    if (need_span(ce, ce->plan.mats[mat].span, err)) return -1;
    size_t xb = (size_t)n * w->cols * 4, yb = (size_t)n * w->rows * 4;
    CUdeviceptr dx = 0, dy = 0;
    int rc = -1;
    if (cu_check(cu.MemAlloc(&dx, xb), "cuda: cuMemAlloc(test input)", err) ||
        cu_check(cu.MemAlloc(&dy, yb), "cuda: cuMemAlloc(test output)", err) ||
        cu_check(cu.MemcpyHtoDAsync(dx, x, xb, ce->compute), "cuda: upload test input", err) ||
        dev_matmul(ce, w, dx, dy, n, err) ||
        cu_check(cu.MemcpyDtoHAsync(y, dy, yb, ce->compute), "cuda: download test output", err) ||
        sync_compute(ce, "cuda: matmul", err))
        goto out;
    rc = 0;
out:
    if (dx) cu.MemFree(dx);
    if (dy) cu.MemFree(dy);
    return rc;
}
