/* engine: runs the model on batches of tokens, whole or by layer range.
 *
 * A step is a batch of tokens from any number of sequences: prompt chunks (prefill) and single
 * decode tokens together. Each token carries its sequence's block table and its position; the
 * engine writes the token's key/value at that position and attends over positions 0..pos of its
 * own sequence, so prefill and decode are one code path.
 *
 *   engine_embed   tokens -> hidden states x[n][dim]
 *   engine_layers  x -> x through layers [l0, l1)  (what a node that holds only some layers runs,
 *                  and what it ships to the next node; a helper runs its own rows and other
 *                  nodes' one layer at a time, theirs joining at the layer they start at, each
 *                  layer's weights read once for all: cluster/coop.h)
 *   engine_head    final norm + output matrix for the rows that want logits
 *   engine_forward all three
 *
 * Backends (the CPU in engine.c, CUDA in cuda/) implement the same operations behind struct
 * engine_backend; engine_init takes the first of backends.h's list that can serve. All buffers
 * are carved from the arena at init: a step allocates nothing. */
#ifndef STRATA_ENGINE_H
#define STRATA_ENGINE_H

#include "os/common/errmsg.h"
#include "os/runtime/arena.h"
#include "serving/engine/kv_cache.h"
#include "serving/engine/matmul.h"
#include "serving/engine/model.h"

struct fwd_kernels;
struct attn_args;

/* The engine's limits, for every backend; engine_limits_resolve() is the one place that gives a 0
 * field its default (the value after the colon). */
struct engine_limits {
    int max_tokens;    /* tokens per step (prefill chunk + decodes): 256 */
    int max_seqs;      /* sequences in flight: 1 */
    int ctx;           /* positions per sequence: the model's seq_len (more is an error) */
    int kv_block_size; /* positions per KV block: 16 */
    int kv_blocks;     /* enough for max_seqs full contexts */
    int kv_type;       /* enum kv_type: KV_DEFAULT = f16 */
    int threads;       /* the online CPUs */
    int attn;          /* enum attn_mode (fwd_kernels.h): $STRATA_ATTN, else ATTN_EXACT (CPU) */
    /* 1: the weight image keeps GGUF's layout (no CPU repack): it is shared with fabric peers
     * that read it one-sided (rdma), or still arriving (a joiner repacks each span as it lands:
     * engine_repack_span), or a fabric source repacks it once it took its CRCs (stream_loader.h). */
    int keep_layout;
};

struct batch {
    int n;                    /* tokens in this step */
    const int *token;         /* [n] ids (used by engine_embed) */
    const int *pos;           /* [n] position in its sequence */
    const int *const *blocks; /* [n] block table of the token's sequence */
    int n_logits;             /* rows that want logits */
    const int *logit_rows;    /* [n_logits] indices into the batch */
};

struct engine;
struct sampler;

/* A backend: the step operations on one kind of hardware, a table of functions (as ggml's). The
 * engine checks a batch, then calls the backend; every call that can fail takes err and follows
 * os/common/errmsg.h (0, or -1 with the reason written). The engine passes its own e->err and
 * puts "engine: " and the backend's name in front where the reason does not already start with
 * it, so engine_error() reads "engine: cuda: span 3 (blk.2) has not been uploaded". The list of
 * backends and the choice among them: backends.h. */
struct engine_backend {
    const char *name;
    /* 1: a row's results are bit-identical whatever other rows share its batch (the CPU's matmul
     * and attention promise it: matmul.h), so rows of unrelated steps may run in one batch */
    int batch_invariant;
    /* 1: the KV cache lives on the device, not in engine.kv (its rows cannot be read or written
     * from the host: cooperative execution recomputes instead of transferring KV) */
    int kv_on_device;
    /* 0 when this backend can serve on this machine; else -1 and why ("no CUDA device
     * (libcuda.so.1 not found)"). NULL: it always can (the CPU). */
    int (*probe)(char *err);
    /* The device it serves on, for the log and the step model's identity; after probe() said
     * yes. NULL: the host's CPU. */
    void (*device_name)(char *name, size_t cap);
    /* After the engine's own init: device set-up, weights, arena registration (once). */
    int (*init)(struct engine *e, struct arena *a, char *err);
    void (*free)(struct engine *e); /* NULL where init allocated nothing */
    /* engine.h's operations on a checked batch (token ids in the vocabulary, positions in the
     * context, a valid layer range, n_logits > 0 for head). */
    int (*embed)(struct engine *e, const struct batch *b, float *x, char *err);
    int (*layers)(struct engine *e, const struct batch *b, int l0, int l1, float *x, char *err);
    int (*head)(struct engine *e, const struct batch *b, const float *x, float *logits, char *err);
    /* Optional (NULL where a backend has nothing to do; the CPU backend needs none of them). */
    /* Forward, then tokens[i] for row logit_rows[i] drawn with samplers[i] (its generator
     * advances as sampler_sample's would): only the tokens leave the device. */
    int (*forward_sample)(struct engine *e, const struct batch *b, struct sampler *const *samplers,
                          int *tokens, char *err);
    /* Start moving weight span s (model.h) to the device; a layer waits for its span. */
    int (*upload_span)(struct engine *e, int span, char *err);
    /* 1 when span s is resident on the device. */
    int (*span_ready)(struct engine *e, int span);
};

struct engine {
    struct model *model;
    const struct model_config *cfg;
    struct engine_limits lim;
    const struct engine_backend *be;
    struct kv_cache kv;
    struct threadpool *tp;
    struct matmul_ctx mm;
    const struct fwd_kernels *fwd; /* attention, SwiGLU: the ISA mm chose */
    void (*attend)(const struct attn_args *a, int h0, int h1); /* fwd's, or lim.attn's */
    /* activations, each max_tokens rows */
    float *xb, *xb2, *q, *k, *v, *att_out, *hb, *hb2,
        *att_scores;      /* att_scores: per thread n_heads x fwd_att_floats(ctx) */
    float *hidden;        /* max_tokens x dim, for engine_forward */
    char err[ERRMSG_LEN]; /* why the last operation failed (engine_error) */
    float *rope_inv_freq; /* head_dim/2: theta^(-2i/head_dim), pair i's radians per position */
    float *rope_cs;       /* head_dim: one token's (cos, sin) per pair (scratch of cpu_layers) */
    void *backend_state;
};

/* Bytes of arena the engine needs for these limits (KV + activations + matmul scratch). */
size_t engine_arena_bytes(const struct model_config *cfg, const struct engine_limits *lim);
/* Fill in defaults (0 fields) and clamp to the model. Fails if ctx exceeds the model's. */
int engine_limits_resolve(struct engine_limits *lim, const struct model_config *cfg, char *err);
int engine_init(struct engine *e, struct model *m, const struct engine_limits *lim, struct arena *a,
                char *err);
void engine_free(struct engine *e);

/* The CPU backend's own layouts (repack.h) for span s's matrices (model.h: a block's seven, the
 * output, the tied embedding), rewritten in place, the work that engine_init does for every span
 * without keep_layout. For an image that arrives later: call it before the span is used (a step
 * must never read one half-rewritten); use_pool: on the engine's threads (only while no step
 * runs), else on the calling thread. For the CPU backend only (engine_repacks: a device backend
 * uploads GGUF's bytes). Returns the matrices rewritten, or -1 with err (no staging memory). */
int engine_repack_span(struct engine *e, int span, int use_pool, char *err);
/* 1 when the engine runs on the CPU backend, which multiplies from its own layouts (repack.h). */
int engine_repacks(const struct engine *e);
/* Bytes [off, off + len) of the weight image (image: where the tensors live) as GGUF lays them
 * out, whatever spans were rewritten: what a holder sends its peers. Not while a span in the
 * range is being rewritten. */
void engine_read_gguf(const struct engine *e, const uint8_t *image, uint64_t off, size_t len,
                      uint8_t *out);

/* The step operations return 0, or -1 with the reason in engine_error(e) ("engine: batch of 300
 * tokens (1..256)", "engine: cuda: ..." when the backend failed). One thread drives an engine,
 * so the reason is that thread's. */
const char *engine_error(const struct engine *e);
int engine_embed(struct engine *e, const struct batch *b, float *x);
int engine_layers(struct engine *e, const struct batch *b, int l0, int l1, float *x);
int engine_head(struct engine *e, const struct batch *b, const float *x, float *logits);
/* logits: n_logits x vocab. */
int engine_forward(struct engine *e, const struct batch *b, float *logits);
/* engine_forward, then tokens[i] = the token drawn for row logit_rows[i] with samplers[i]. A
 * backend that samples on the device (cuda) does it there and only the tokens come back; else
 * the CPU samples from `logits` (n_logits x vocab scratch, clobbered). */
int engine_forward_sample(struct engine *e, const struct batch *b, struct sampler *const *samplers,
                          int *tokens, float *logits);

#endif
