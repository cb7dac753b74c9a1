/* engine: the Llama forward pass on the CPU, read top to bottom like the equations.
 *
 * For each layer, over a batch of n tokens from any sequences:
 *   xb  = rmsnorm(x) * attn_norm
 *   q,k,v = Wq xb, Wk xb, Wv xb           (one dispatch)
 *   q,k,v += bq, bk, bv                   (qwen2; llama files that carry biases)
 *   q,k = rmsnorm(head) * q_norm, k_norm  (qwen3: each head on its own)
 *   rope(q, k) at each token's position   (pairs (2i, 2i+1) for llama, (i, i + hd/2) for qwen;
 *                                          angle pos * theta^(-2i/hd) / rope_freqs[i] * scale)
 *   write k, v into the paged cache at (block table[pos / bs], pos % bs)
 *   att = softmax(q . K[0..pos] / sqrt(hd)) V[0..pos], per head, GQA-shared kv heads
 *   x  += Wo att
 *   xb  = rmsnorm(x) * ffn_norm
 *   x  += Wdown (silu(Wgate xb) * Wup xb)
 * The matrix products go through matmul.h (SIMD, threaded); attention and SwiGLU through
 * fwd_kernels.h (SIMD), attention threaded over (token, kv heads) tasks. */
#include "serving/engine/engine.h"

#include "serving/engine/cuda/cuda_backend.h"
#include "os/common/errmsg.h"
#include "os/runtime/log.h"
#include "serving/engine/fwd_kernels.h"
#include "serving/engine/repack.h"
#include "serving/engine/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// small kernels

static void rmsnorm(float *o, const float *x, const float *w, int n, float eps)
{
    float ss = 0.0f;
    for (int j = 0; j < n; j++) ss += x[j] * x[j];
    ss /= n;
    ss += eps;
    ss = 1.0f / sqrtf(ss);
    for (int j = 0; j < n; j++) o[j] = w[j] * (ss * x[j]);
}

/* The (cos, sin) of each of a head's pairs at position pos: angle pos * inv_freq[i], divided by
 * the layer's frequency factor (Llama 3.1's rope_freqs) where it has them, times the linear
 * scale. The order of the operations is ggml's. */
static void rope_angles(float *cs, int pos, const float *inv_freq, const float *freq_factors,
                        float scale, int pairs)
{
    for (int i = 0; i < pairs; i++) {
        float a = (float)pos * inv_freq[i];
        if (freq_factors) a /= freq_factors[i];
        a *= scale;
        cs[2 * i] = cosf(a);
        cs[2 * i + 1] = sinf(a);
    }
}

/* Rotate pair i of every head of `v` (n_heads heads of hd floats) by its angle: elements
 * (2i, 2i+1) for ROPE_PAIRS, (i, i + hd/2) for ROPE_HALVES. */
static void rope(float *v, int n_heads, int hd, int style, const float *cs)
{
    int stride = style == ROPE_PAIRS ? 2 : 1, other = style == ROPE_PAIRS ? 1 : hd / 2;
    for (int h = 0; h < n_heads; h++, v += hd)
        for (int i = 0; i < hd / 2; i++) {
            float c = cs[2 * i], s = cs[2 * i + 1];
            float *a = v + i * stride, *b = a + other;
            float v0 = *a, v1 = *b;
            *a = v0 * c - v1 * s;
            *b = v0 * s + v1 * c;
        }
}

/* y += b over n floats */
static void add_bias(float *y, const float *b, int n)
{
    for (int i = 0; i < n; i++) y[i] += b[i];
}

// ----------------------------------------------------------------------------
// planning

int engine_limits_resolve(struct engine_limits *lim, const struct model_config *cfg, char *err)
{
    if (lim->ctx <= 0) lim->ctx = cfg->seq_len;
    if (lim->ctx > cfg->seq_len)
        return errmsg_set(err, "context %d exceeds the model's trained context %d", lim->ctx,
                          cfg->seq_len);
    if (lim->max_seqs <= 0) lim->max_seqs = 1;
    if (lim->max_tokens <= 0) lim->max_tokens = 256;
    if (lim->kv_block_size <= 0) lim->kv_block_size = 16;
    if (lim->kv_type == KV_DEFAULT) lim->kv_type = KV_F16;
    if (lim->kv_type != KV_F32 && lim->kv_type != KV_F16)
        return errmsg_set(err, "kv cache element type %d: want f32 or f16", lim->kv_type);
    if (lim->kv_blocks <= 0)
        lim->kv_blocks = lim->max_seqs * ((lim->ctx + lim->kv_block_size - 1) / lim->kv_block_size);
    if (lim->threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        lim->threads = n > 0 ? (int)n : 1;
    }
    return 0;
}

struct act_sizes {
    size_t xb, q, kv, hb, scores, rope, hidden, logits_in;
};

static struct act_sizes act_sizes(const struct model_config *c, const struct engine_limits *l)
{
    size_t t = (size_t)l->max_tokens;
    struct act_sizes s = {
        .xb = t * c->dim,
        .q = t * (size_t)c->n_heads * c->head_dim,
        .kv = t * c->kv_dim,
        .hb = t * c->hidden_dim,
        .scores = (size_t)l->threads * c->n_heads * fwd_att_floats(l->ctx),
        .rope = (size_t)l->ctx * c->head_dim, /* (cos, sin) per pair per position */
        .hidden = t * c->dim,
    };
    return s;
}

/* The widest matrix input: wo's is q_dim, which exceeds dim in some models (Qwen3-0.6B). */
static int max_cols(const struct model_config *c)
{
    int m = c->hidden_dim > c->dim ? c->hidden_dim : c->dim;
    return c->q_dim > m ? c->q_dim : m;
}

size_t engine_arena_bytes(const struct model_config *c, const struct engine_limits *l)
{
    struct act_sizes s = act_sizes(c, l);
    size_t f = sizeof(float);
    size_t bytes = 0;
    bytes += arena_round(
        kv_cache_bytes(l->kv_type, c->n_layers, c->kv_dim, l->kv_block_size, l->kv_blocks));
    bytes += 3 * arena_round(s.xb * f); /* xb, xb2, hidden */
    bytes += 2 * arena_round(s.q * f);  /* q, att_out */
    bytes += 2 * arena_round(s.kv * f); /* k, v */
    bytes += 2 * arena_round(s.hb * f); /* hb, hb2 */
    bytes += arena_round(s.scores * f);
    bytes += arena_round(s.rope * f);
    bytes += arena_round(matmul_scratch_size(l->max_tokens, max_cols(c)));
    return bytes;
}

// ----------------------------------------------------------------------------
// the CPU backend

static int cpu_embed(struct engine *e, const struct batch *b, float *x)
{
    const struct model_config *c = e->cfg;
    for (int t = 0; t < b->n; t++) {
        int id = b->token[t];
        if (id < 0 || id >= c->vocab_size)
            return errmsg_set(e->err, "engine: token id %d is outside the vocabulary (%d)", id,
                              c->vocab_size);
        tensor_get_row(&e->model->token_embd, id, x + (size_t)t * c->dim);
    }
    return 0;
}

struct attn_job {
    struct engine *e;
    const struct batch *b;
    int layer;
};

/* Tasks are (token, range of KV heads with their query heads): a decode token's heads are still
 * split over the threads. */
static void attention_worker(void *ctx, int ith, int nth)
{
    struct attn_job *job = ctx;
    struct engine *e = job->e;
    const struct model_config *c = e->cfg;
    const struct batch *b = job->b;
    int hd = c->head_dim, group = c->n_heads / c->n_kv_heads;
    int parts = nth < c->n_kv_heads ? nth : c->n_kv_heads, total = b->n * parts;
    for (int task = ith; task < total; task += nth) {
        int t = task / parts, part = task % parts;
        int g0 = c->n_kv_heads * part / parts, g1 = c->n_kv_heads * (part + 1) / parts;
        struct attn_args a = {
            .q = e->q + (size_t)t * c->n_heads * hd,
            .out = e->att_out + (size_t)t * c->n_heads * hd,
            .att = e->att_scores + (size_t)ith * c->n_heads * fwd_att_floats(e->lim.ctx),
            .ctx = e->lim.ctx,
            .kv = &e->kv,
            .layer = job->layer,
            .blocks = b->blocks[t],
            .pos = b->pos[t],
            .group = group,
            .hd = hd,
            .scale = 1.0f / sqrtf((float)hd),
        };
        e->fwd->attend(&a, g0 * group, g1 * group);
    }
}

static int cpu_layers(struct engine *e, const struct batch *b, int l0, int l1, float *x)
{
    const struct model_config *c = e->cfg;
    int n = b->n, dim = c->dim, hd = c->head_dim, qdim = c->q_dim, kvd = c->kv_dim,
        hid = c->hidden_dim;
    struct kv_cache *kv = &e->kv;

    for (int l = l0; l < l1; l++) {
        const struct layer_weights *w = &e->model->layers[l];

        // attention: norm, q/k/v, [bias], [q/k norm], rope, cache, attend, output, residual
        for (int t = 0; t < n; t++)
            rmsnorm(e->xb + (size_t)t * dim, x + (size_t)t * dim, w->attn_norm.data, dim,
                    c->norm_eps);
        float *qkv_out[3] = {e->q, e->k, e->v};
        const struct tensor *qkv_w[3] = {&w->wq, &w->wk, &w->wv};
        matmul_multi(&e->mm, 3, qkv_out, qkv_w, e->xb, n);
        for (int t = 0; t < n; t++) {
            float *q = e->q + (size_t)t * qdim, *k = e->k + (size_t)t * kvd,
                  *v = e->v + (size_t)t * kvd;
            if (c->qkv_bias) {
                add_bias(q, w->bq.data, qdim);
                add_bias(k, w->bk.data, kvd);
                add_bias(v, w->bv.data, kvd);
            }
            if (c->qk_norm) {
                for (int h = 0; h < c->n_heads; h++)
                    rmsnorm(q + h * hd, q + h * hd, w->q_norm.data, hd, c->norm_eps);
                for (int h = 0; h < c->n_kv_heads; h++)
                    rmsnorm(k + h * hd, k + h * hd, w->k_norm.data, hd, c->norm_eps);
            }
            int pos = b->pos[t], blk = b->blocks[t][pos / kv->block_size];
            rope_angles(e->rope_cs, pos, e->rope_inv_freq,
                        c->rope_freqs ? (const float *)w->rope_freqs.data : NULL, c->rope_scale,
                        hd / 2);
            rope(q, c->n_heads, hd, c->rope_style, e->rope_cs);
            rope(k, c->n_kv_heads, hd, c->rope_style, e->rope_cs);
            e->fwd->kv_store(kv, l, blk, pos % kv->block_size, k, v);
        }
        struct attn_job job = {e, b, l};
        threadpool_run(e->tp, attention_worker, &job);
        matmul(&e->mm, e->xb2, &w->wo, e->att_out, n);
        for (size_t i = 0; i < (size_t)n * dim; i++) x[i] += e->xb2[i];

        // feed-forward: norm, gate/up, SwiGLU, down projection, residual
        for (int t = 0; t < n; t++)
            rmsnorm(e->xb + (size_t)t * dim, x + (size_t)t * dim, w->ffn_norm.data, dim,
                    c->norm_eps);
        float *gu_out[2] = {e->hb, e->hb2};
        const struct tensor *gu_w[2] = {&w->w_gate, &w->w_up};
        matmul_multi(&e->mm, 2, gu_out, gu_w, e->xb, n);
        for (int t = 0; t < n; t++)
            e->fwd->swiglu(e->hb + (size_t)t * hid, e->hb2 + (size_t)t * hid, hid);
        matmul(&e->mm, e->xb2, &w->w_down, e->hb, n);
        for (size_t i = 0; i < (size_t)n * dim; i++) x[i] += e->xb2[i];
    }
    return 0;
}

static int cpu_head(struct engine *e, const struct batch *b, const float *x, float *logits)
{
    const struct model_config *c = e->cfg;
    for (int i = 0; i < b->n_logits; i++)
        rmsnorm(e->xb + (size_t)i * c->dim, x + (size_t)b->logit_rows[i] * c->dim,
                e->model->output_norm.data, c->dim, c->norm_eps);
    matmul(&e->mm, logits, &e->model->output, e->xb, b->n_logits);
    return 0;
}

/* Store the matrices in the layouts the chosen kernels read fastest (repack.h), once, in the
 * weight image. Only the CPU backend does this: a device backend uploads the ggml bytes. */
static int cpu_repack_one(struct engine *e, struct tensor *t, int *done, char *err)
{
    if (!matmul_wants_repack(&e->mm, t)) return 0;
    if (repack_tensor_tp(t, e->tp, err)) return -1;
    ++*done;
    return 0;
}

static int cpu_repack(struct engine *e, char *err)
{
    struct model *m = e->model;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int done = 0;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        struct layer_weights *w = &m->layers[l];
        struct tensor *mats[] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->w_gate, &w->w_down, &w->w_up};
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++)
            if (cpu_repack_one(e, mats[i], &done, err)) return -1;
    }
    /* The embedding table too when tied: the lookup (tensor_get_row) reads any layout. */
    if (cpu_repack_one(e, &m->output, &done, err)) return -1;
    if (m->tied_output) m->token_embd.type = m->output.type;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (done)
        log_info("engine", "%d matrices stored in 16-row groups for the %s kernels (%.2f s)", done,
                 matmul_isa_of(&e->mm),
                 (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9);
    return 0;
}

static const struct engine_backend cpu_backend = {.name = "cpu",
                                                  .batch_invariant = 1,
                                                  .embed = cpu_embed,
                                                  .layers = cpu_layers,
                                                  .head = cpu_head};

// ----------------------------------------------------------------------------
// the engine

const struct engine_backend *engine_pick_backend(const struct engine_backend *cpu)
{
    char why[ERRMSG_LEN];
    const char *force = getenv("STRATA_BACKEND");
    if (force && !strcmp(force, "cpu")) {
        log_info("engine", "backend cpu: STRATA_BACKEND=cpu");
        return cpu;
    }
    if (cuda_probe(why)) {
        log_info("engine", "backend cpu: %s", why);
        return cpu;
    }
    char name[128];
    cuda_device_name(name, sizeof name);
    log_info("engine", "backend cuda (%s)", name);
    return &cuda_backend;
}

int engine_init(struct engine *e, struct model *m, const struct engine_limits *lim_in,
                struct arena *a, char *err)
{
    memset(e, 0, sizeof *e);
    e->model = m;
    e->cfg = &m->cfg;
    e->lim = *lim_in;
    const struct model_config *c = e->cfg;
    if (engine_limits_resolve(&e->lim, c, err)) return -1;
    const struct engine_limits *l = &e->lim;
    struct act_sizes s = act_sizes(c, l);
    size_t f = sizeof(float);

    void *kvmem = arena_carve(
        a, "kv", kv_cache_bytes(l->kv_type, c->n_layers, c->kv_dim, l->kv_block_size, l->kv_blocks),
        err);
    if (!kvmem) return -1;
    if (kv_cache_init(&e->kv, kvmem, l->kv_type, c->n_layers, c->kv_dim, c->head_dim,
                      l->kv_block_size, l->kv_blocks, err))
        return -1;
    struct {
        float **p;
        size_t n;
        const char *name;
    } bufs[] = {
        {&e->xb, s.xb, "act.xb"},
        {&e->xb2, s.xb, "act.xb2"},
        {&e->hidden, s.hidden, "act.x"},
        {&e->q, s.q, "act.q"},
        {&e->att_out, s.q, "act.att"},
        {&e->k, s.kv, "act.k"},
        {&e->v, s.kv, "act.v"},
        {&e->hb, s.hb, "act.hb"},
        {&e->hb2, s.hb, "act.hb2"},
        {&e->att_scores, s.scores, "act.scores"},
        {&e->rope_inv_freq, s.rope, "rope"},
    };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (!(*bufs[i].p = arena_carve(a, bufs[i].name, bufs[i].n * f, err))) return -1;

    // RoPE: pair i turns at theta^(-2i/hd) radians per position (the angles: rope_angles).
    int hd = c->head_dim;
    e->rope_cs = e->rope_inv_freq + hd / 2;
    for (int i = 0; i < hd / 2; i++)
        e->rope_inv_freq[i] = 1.0f / powf(c->rope_theta, (float)(2 * i) / (float)hd);

    size_t scratch_n = matmul_scratch_size(l->max_tokens, max_cols(c));
    void *scratch = arena_carve(a, "act.matmul", scratch_n, err);
    if (!scratch) return -1;
    if (!(e->tp = threadpool_new(l->threads, err))) return -1;
    if (matmul_init(&e->mm, e->tp, scratch, l->max_tokens, max_cols(c), err)) {
        threadpool_free(e->tp);
        e->tp = NULL;
        return -1;
    }
    e->fwd = fwd_kernels_for(matmul_isa_of(&e->mm));
    /* cuda when a GPU and the kernels are there (logs which and why); its init uploads the
     * weights. If it fails, the CPU serves. */
    e->be = engine_pick_backend(&cpu_backend);
    if (e->be->init && e->be->init(e, a, err)) {
        log_warn("engine", "backend %s: %s; the CPU serves", e->be->name, err);
        e->be = &cpu_backend;
    }
    if (e->be == &cpu_backend && !l->keep_layout && cpu_repack(e, err)) return -1;
    return 0;
}

void engine_free(struct engine *e)
{
    if (e->be && e->be->free) e->be->free(e);
    e->be = NULL;
    if (e->tp) threadpool_free(e->tp);
    e->tp = NULL;
}

const char *engine_error(const struct engine *e)
{
    return e->err;
}

static int check_batch(struct engine *e, const struct batch *b)
{
    if (b->n <= 0 || b->n > e->lim.max_tokens)
        return errmsg_set(e->err, "engine: batch of %d tokens (1..%d)", b->n, e->lim.max_tokens);
    if (b->n_logits < 0 || b->n_logits > b->n)
        return errmsg_set(e->err, "engine: %d logit rows for %d tokens", b->n_logits, b->n);
    for (int t = 0; t < b->n; t++)
        if (b->pos[t] < 0 || b->pos[t] >= e->lim.ctx)
            return errmsg_set(e->err, "engine: token %d at position %d, outside the context (%d)",
                              t, b->pos[t], e->lim.ctx);
    return 0;
}

int engine_embed(struct engine *e, const struct batch *b, float *x)
{
    if (check_batch(e, b)) return -1;
    return e->be->embed(e, b, x);
}

int engine_layers(struct engine *e, const struct batch *b, int l0, int l1, float *x)
{
    if (check_batch(e, b)) return -1;
    if (l0 < 0 || l1 > e->cfg->n_layers || l0 > l1)
        return errmsg_set(e->err, "engine: layers [%d, %d) of %d", l0, l1, e->cfg->n_layers);
    return e->be->layers(e, b, l0, l1, x);
}

int engine_head(struct engine *e, const struct batch *b, const float *x, float *logits)
{
    if (check_batch(e, b)) return -1;
    return b->n_logits ? e->be->head(e, b, x, logits) : 0;
}

int engine_forward(struct engine *e, const struct batch *b, float *logits)
{
    if (engine_embed(e, b, e->hidden)) return -1;
    if (engine_layers(e, b, 0, e->cfg->n_layers, e->hidden)) return -1;
    return engine_head(e, b, e->hidden, logits);
}

int engine_forward_sample(struct engine *e, const struct batch *b, struct sampler *const *samplers,
                          int *tokens, float *logits)
{
    if (check_batch(e, b)) return -1;
    if (e->be->forward_sample && b->n_logits <= e->lim.max_seqs) {
        if (e->be->forward_sample(e, b, samplers, tokens, e->err) == 0) return 0;
        log_error("engine", "%s", e->err);
        return -1;
    }
    if (engine_forward(e, b, logits)) return -1;
    for (int i = 0; i < b->n_logits; i++)
        tokens[i] = sampler_sample(samplers[i], logits + (size_t)i * e->cfg->vocab_size);
    return 0;
}
