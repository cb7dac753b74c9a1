/* model: config from GGUF metadata, tensor validation and the execution-order weight image.
 * See model.h for the contract.
 *
 * RoPE layout. For `llama` Strata rotates interleaved pairs (2i, 2i+1) of each head, as llama2.c's
 * run.c does and as llama.cpp does for LLM_ARCH_LLAMA ("normal" rope, not NeoX). That is right
 * only because of how the weights were stored: Meta's original Llama weights use interleaved
 * pairs; Hugging Face checkpoints permute the rows of Q and K so that rotating halves
 * (i, i + head_dim/2) is equivalent, and llama.cpp's convert_hf_to_gguf.py undoes that permutation
 * when it writes a llama GGUF. llama2.c checkpoints are trained with interleaved (complex-number)
 * RoPE in model.py, and its export.py undoes the HF permutation the same way, so they are already
 * in the interleaved layout: `strata convert` copies wq/wk as they are and must NOT permute. Every
 * GGUF "llama" file is therefore interleaved-pairs. `qwen2` and `qwen3` files keep the Hugging
 * Face layout (the converter does not permute them) and rotate halves: ROPE_HALVES. */
#include "serving/engine/model.h"

#include "os/common/errmsg.h"
#include "serving/engine/quant.h"

#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TENSOR_ALIGN 64   /* SIMD loads and cache lines */
#define SPAN_ALIGN   4096 /* a span starts on a page: it can be registered, mapped or sent alone */

/* A layer's tensors in execution order (the order of its span). */
enum {
    K_ATTN_NORM,
    K_ATTN_Q,
    K_ATTN_K,
    K_ATTN_V,
    K_Q_BIAS,
    K_K_BIAS,
    K_V_BIAS,
    K_Q_NORM,
    K_K_NORM,
    K_ROPE_FREQS, /* not named blk.N: the file's one rope_freqs.weight, copied into every layer */
    K_ATTN_OUT,
    K_FFN_NORM,
    K_FFN_GATE,
    K_FFN_DOWN,
    K_FFN_UP,
    N_LAYER_KINDS
};
static const char *const layer_kind_name[N_LAYER_KINDS] = {
    [K_ATTN_NORM] = "attn_norm.weight",  [K_ATTN_Q] = "attn_q.weight",
    [K_ATTN_K] = "attn_k.weight",        [K_ATTN_V] = "attn_v.weight",
    [K_Q_BIAS] = "attn_q.bias",          [K_K_BIAS] = "attn_k.bias",
    [K_V_BIAS] = "attn_v.bias",          [K_Q_NORM] = "attn_q_norm.weight",
    [K_K_NORM] = "attn_k_norm.weight",   [K_ROPE_FREQS] = NULL,
    [K_ATTN_OUT] = "attn_output.weight", [K_FFN_NORM] = "ffn_norm.weight",
    [K_FFN_GATE] = "ffn_gate.weight",    [K_FFN_DOWN] = "ffn_down.weight",
    [K_FFN_UP] = "ffn_up.weight",
};
static const size_t layer_kind_field[N_LAYER_KINDS] = {
    [K_ATTN_NORM] = offsetof(struct layer_weights, attn_norm),
    [K_ATTN_Q] = offsetof(struct layer_weights, wq),
    [K_ATTN_K] = offsetof(struct layer_weights, wk),
    [K_ATTN_V] = offsetof(struct layer_weights, wv),
    [K_Q_BIAS] = offsetof(struct layer_weights, bq),
    [K_K_BIAS] = offsetof(struct layer_weights, bk),
    [K_V_BIAS] = offsetof(struct layer_weights, bv),
    [K_Q_NORM] = offsetof(struct layer_weights, q_norm),
    [K_K_NORM] = offsetof(struct layer_weights, k_norm),
    [K_ROPE_FREQS] = offsetof(struct layer_weights, rope_freqs),
    [K_ATTN_OUT] = offsetof(struct layer_weights, wo),
    [K_FFN_NORM] = offsetof(struct layer_weights, ffn_norm),
    [K_FFN_GATE] = offsetof(struct layer_weights, w_gate),
    [K_FFN_DOWN] = offsetof(struct layer_weights, w_down),
    [K_FFN_UP] = offsetof(struct layer_weights, w_up),
};

/* 1 if a layer of this config has tensor kind k. */
static int kind_present(const struct model_config *c, int k)
{
    switch (k) {
    case K_Q_BIAS:
    case K_K_BIAS:
    case K_V_BIAS:
        return c->qkv_bias;
    case K_Q_NORM:
    case K_K_NORM:
        return c->qk_norm;
    case K_ROPE_FREQS:
        return c->rope_freqs;
    default:
        return 1;
    }
}

/* ---------------------------------------------------------------------------------------------
 * Architectures: what each one's files hold (llama.cpp's src/llama-model.cpp and
 * src/models/ARCH.cpp define them; docs/engine.md). */

enum { NONE, OPTIONAL, REQUIRED };

static const struct arch {
    const char *name;
    int rope_style;
    int qkv_bias;   /* NONE, OPTIONAL (all layers or none), REQUIRED */
    int qk_norm;    /* NONE or REQUIRED */
    int rope_freqs; /* NONE or OPTIONAL */
} archs[N_ARCHS] = {
    [ARCH_LLAMA] = {"llama", ROPE_PAIRS, OPTIONAL, NONE, OPTIONAL},
    [ARCH_QWEN2] = {"qwen2", ROPE_HALVES, REQUIRED, NONE, NONE},
    [ARCH_QWEN3] = {"qwen3", ROPE_HALVES, NONE, REQUIRED, NONE},
};

const char *model_arch_name(int arch)
{
    return arch >= 0 && arch < N_ARCHS ? archs[arch].name : "?";
}

/* ---------------------------------------------------------------------------------------------
 * Config */

/* "ARCH.suffix" into a static-size buffer (every key the config reads is short). */
struct key {
    char s[96];
};
static struct key akey(const struct model_config *c, const char *suffix)
{
    struct key k;
    snprintf(k.s, sizeof k.s, "%s.%s", archs[c->arch].name, suffix);
    return k;
}

static int get_int(const struct gguf *g, const char *key, int *out, int def, int max,
                   const char *what, char *err)
{
    uint32_t v;
    if (!gguf_find(g, key)) {
        if (def < 0) return errmsg_set(err, "%s: missing key %s", what, key);
        *out = def;
        return 0;
    }
    if (gguf_get_u32(g, key, &v, err) < 0) return errmsg_prefix(err, "%s: ", what);
    if (v == 0 || v > (uint32_t)max)
        return errmsg_set(err, "%s: %s = %u is out of range (1..%d)", what, key, v, max);
    *out = (int)v;
    return 0;
}

static int get_float(const struct gguf *g, const char *key, float *out, float def, const char *what,
                     char *err)
{
    if (!gguf_find(g, key)) {
        *out = def;
        return 0;
    }
    if (gguf_get_f32(g, key, out, err) < 0) return errmsg_prefix(err, "%s: ", what);
    if (!(*out > 0) || *out > 1e30f)
        return errmsg_set(err, "%s: %s = %g must be positive", what, key, (double)*out);
    return 0;
}

static int read_arch(struct model_config *c, const struct gguf *g, const char *what, char *err)
{
    struct gguf_str arch;
    if (gguf_get_str(g, "general.architecture", &arch, err) < 0)
        return errmsg_prefix(err, "%s: ", what);
    for (int a = 0; a < N_ARCHS; a++)
        if (gguf_str_eq(arch, archs[a].name)) {
            c->arch = a;
            c->rope_style = archs[a].rope_style;
            c->qkv_bias = archs[a].qkv_bias == REQUIRED;
            c->qk_norm = archs[a].qk_norm == REQUIRED;
            return 0;
        }
    char buf[48], list[64] = "";
    for (int a = 0; a < N_ARCHS; a++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", a ? ", " : "",
                 archs[a].name);
    return errmsg_set(err, "%s: general.architecture is \"%s\", which is not supported (%s are)",
                      what, gguf_str_printable(arch, buf, sizeof buf), list);
}

/* The RoPE frequencies' scaling as llama.cpp reads it: rope.scaling.type "linear" (the default)
 * divides every angle by rope.scaling.factor (or the older rope.scale_linear), "none" ignores it;
 * YaRN and LongRoPE change more than the angles and are refused. */
static int read_rope_scaling(struct model_config *c, const struct gguf *g, const char *what,
                             char *err)
{
    struct key type_key = akey(c, "rope.scaling.type"), factor_key = akey(c, "rope.scaling.factor");
    int linear = 1;
    if (gguf_find(g, type_key.s)) {
        struct gguf_str type;
        if (gguf_get_str(g, type_key.s, &type, err) < 0) return errmsg_prefix(err, "%s: ", what);
        char buf[48];
        if (gguf_str_eq(type, "none"))
            linear = 0;
        else if (!gguf_str_eq(type, "linear"))
            return errmsg_set(err, "%s: %s is \"%s\", which is not supported (none, linear are)",
                              what, type_key.s, gguf_str_printable(type, buf, sizeof buf));
    }
    if (!gguf_find(g, factor_key.s)) factor_key = akey(c, "rope.scale_linear");
    float factor = 1.0f;
    if (gguf_find(g, factor_key.s) && gguf_get_f32(g, factor_key.s, &factor, err) < 0)
        return errmsg_prefix(err, "%s: ", what);
    if (!(factor >= 0) || factor > 1e6f) /* 0 means "not set", as in llama.cpp */
        return errmsg_set(err, "%s: %s = %g is out of range", what, factor_key.s, (double)factor);
    c->rope_scale = linear && factor != 0 ? 1.0f / factor : 1.0f;
    struct key attn = akey(c, "rope.scaling.attn_factor");
    float af = 1.0f;
    if (gguf_find(g, attn.s) && gguf_get_f32(g, attn.s, &af, err) < 0)
        return errmsg_prefix(err, "%s: ", what);
    if (af != 1.0f)
        return errmsg_set(err, "%s: %s = %g is not supported (only 1)", what, attn.s, (double)af);
    return 0;
}

static int read_config(struct model_config *c, const struct gguf *g, const char *what, char *err)
{
    if (read_arch(c, g, what, err) < 0) return -1;
    struct key ek = akey(c, "expert_count");
    uint32_t experts = 0;
    if (gguf_find(g, ek.s) && gguf_get_u32(g, ek.s, &experts, err) < 0)
        return errmsg_prefix(err, "%s: ", what);
    if (experts)
        return errmsg_set(err, "%s: %s = %u: mixture-of-experts models are not supported", what,
                          ek.s, experts);
    if (get_int(g, akey(c, "embedding_length").s, &c->dim, -1, 1 << 16, what, err) < 0 ||
        get_int(g, akey(c, "feed_forward_length").s, &c->hidden_dim, -1, 1 << 18, what, err) < 0 ||
        get_int(g, akey(c, "block_count").s, &c->n_layers, -1, MODEL_MAX_LAYERS, what, err) < 0 ||
        get_int(g, akey(c, "attention.head_count").s, &c->n_heads, -1, 1 << 12, what, err) < 0 ||
        get_int(g, akey(c, "attention.head_count_kv").s, &c->n_kv_heads, c->n_heads, 1 << 12, what,
                err) < 0 ||
        get_int(g, akey(c, "context_length").s, &c->seq_len, -1, 1 << 24, what, err) < 0 ||
        get_float(g, akey(c, "attention.layer_norm_rms_epsilon").s, &c->norm_eps, 1e-5f, what,
                  err) < 0 ||
        get_float(g, akey(c, "rope.freq_base").s, &c->rope_theta, 10000.0f, what, err) < 0 ||
        read_rope_scaling(c, g, what, err) < 0)
        return -1;
    if (c->n_heads % c->n_kv_heads)
        return errmsg_set(err, "%s: head_count %d is not a multiple of head_count_kv %d", what,
                          c->n_heads, c->n_kv_heads);
    /* The head dimension: key_length where the file says (Mistral Nemo: 128 at dim 5120 with 32
     * heads), else dim / n_heads. Values are as wide as keys (llama.cpp asserts it too). */
    struct key kl = akey(c, "attention.key_length"), vl = akey(c, "attention.value_length");
    if (!gguf_find(g, kl.s) && c->dim % c->n_heads)
        return errmsg_set(err, "%s: embedding_length %d is not a multiple of head_count %d", what,
                          c->dim, c->n_heads);
    int value_dim;
    if (get_int(g, kl.s, &c->head_dim, c->dim / c->n_heads, 1 << 12, what, err) < 0 ||
        get_int(g, vl.s, &value_dim, c->head_dim, 1 << 12, what, err) < 0)
        return -1;
    if (value_dim != c->head_dim)
        return errmsg_set(err, "%s: %s %d differs from %s %d (not supported)", what, vl.s,
                          value_dim, kl.s, c->head_dim);
    if (c->head_dim % 2)
        return errmsg_set(err, "%s: head dimension %d is odd (RoPE rotates pairs)", what,
                          c->head_dim);
    c->q_dim = c->n_heads * c->head_dim;
    c->kv_dim = c->n_kv_heads * c->head_dim;
    int rope_dims;
    struct key rd = akey(c, "rope.dimension_count");
    if (get_int(g, rd.s, &rope_dims, c->head_dim, 1 << 16, what, err) < 0) return -1;
    if (rope_dims != c->head_dim)
        return errmsg_set(err,
                          "%s: %s %d differs from the head dimension %d (partial RoPE is not "
                          "supported)",
                          what, rd.s, rope_dims, c->head_dim);
    const struct gguf_kv *tokens = gguf_find(g, "tokenizer.ggml.tokens");
    if (tokens) {
        if (tokens->type != GGUF_ARRAY || tokens->v.arr.type != GGUF_STRING)
            return errmsg_set(err, "%s: tokenizer.ggml.tokens is not an array of strings", what);
        if (tokens->v.arr.n == 0 || tokens->v.arr.n > (1 << 24))
            return errmsg_set(err, "%s: tokenizer.ggml.tokens has %llu entries (1..%d)", what,
                              (unsigned long long)tokens->v.arr.n, 1 << 24);
        c->vocab_size = (int)tokens->v.arr.n;
    } else {
        const struct gguf_tensor *e = gguf_find_tensor(g, "token_embd.weight");
        if (!e) return errmsg_set(err, "%s: missing tensor token_embd.weight", what);
        if (e->ne[1] == 0 || e->ne[1] > (1 << 24))
            return errmsg_set(err, "%s: tensor token_embd.weight: vocabulary of %llu rows", what,
                              (unsigned long long)e->ne[1]);
        c->vocab_size = (int)e->ne[1];
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Tensors */

/* "blk.N.KIND" (KIND one of layer_kind_name) -> layer and kind; -1 if the name is not of that
 * form. */
static int parse_layer_name(struct gguf_str name, int *layer, int *kind)
{
    const char *p = name.p, *end = name.p + name.len;
    if (name.len < 5 || memcmp(p, "blk.", 4) != 0) return -1;
    p += 4;
    long n = 0;
    const char *digits = p;
    while (p < end && *p >= '0' && *p <= '9' && p - digits < 6) n = n * 10 + (*p++ - '0');
    if (p == digits || p >= end || *p != '.' || (*digits == '0' && p - digits > 1)) return -1;
    p++;
    for (int k = 0; k < N_LAYER_KINDS; k++) {
        if (!layer_kind_name[k]) continue;
        size_t kl = strlen(layer_kind_name[k]);
        if ((size_t)(end - p) == kl && memcmp(p, layer_kind_name[k], kl) == 0) {
            *layer = (int)n;
            *kind = k;
            return 0;
        }
    }
    return -1;
}

struct expect {
    uint64_t cols, rows; /* rows == 0: a vector */
    const char *cols_name, *rows_name;
};

static void shape_str(const struct gguf_tensor *t, char *buf, size_t n)
{
    int o = 0;
    for (uint32_t d = 0; d < t->n_dims && o < (int)n; d++)
        o += snprintf(buf + o, n - o, "%s%llu", d ? "x" : "", (unsigned long long)t->ne[d]);
}

/* f32_only: NULL for a matrix (any supported type), else what the vector is ("norm weights"). */
static int check_tensor(const struct gguf_tensor *t, struct expect e, const char *f32_only,
                        const char *what, char *err)
{
    char name[80];
    gguf_str_printable(t->name, name, sizeof name);
    uint64_t rows = e.rows ? e.rows : 1;
    if (t->ne[0] != e.cols || t->ne[1] != rows || t->ne[2] != 1 || t->ne[3] != 1) {
        char shape[96], want[96];
        shape_str(t, shape, sizeof shape);
        if (!e.rows || !strcmp(e.cols_name, e.rows_name))
            snprintf(want, sizeof want, "%s %llu", e.cols_name, (unsigned long long)e.cols);
        else
            snprintf(want, sizeof want, "%s x %s = %llux%llu", e.cols_name, e.rows_name,
                     (unsigned long long)e.cols, (unsigned long long)e.rows);
        return errmsg_set(err, "%s: tensor %s: shape %s does not match %s", what, name, shape,
                          want);
    }
    if (f32_only) {
        if (t->type != GGML_F32)
            return errmsg_set(err, "%s: tensor %s: type %s, %s must be f32", what, name,
                              ggml_type_name(t->type), f32_only);
        return 0;
    }
    if (!quant_type_supported(t->type))
        return errmsg_set(err, "%s: tensor %s: type %s (%u) is not supported (%s)", what, name,
                          ggml_type_name(t->type), t->type, quant_type_list());
    return 0;
}

static void set_tensor(struct tensor *dst, const struct gguf_tensor *src)
{
    dst->data = NULL;
    dst->type = src->type;
    dst->cols = (int)src->ne[0];
    dst->rows = (int)src->ne[1];
    dst->nbytes = (size_t)src->nbytes;
}

static uint64_t align_up(uint64_t x, uint64_t a)
{
    return (x + a - 1) / a * a;
}

/* The architecture's tensors as the file names them; lt[l][kind] for the blocks. */
struct found {
    const struct gguf_tensor *embd, *out_norm, *out; /* out NULL: tied to embd */
    const struct gguf_tensor *rope_freqs;            /* one for every layer */
    const struct gguf_tensor *(*lt)[N_LAYER_KINDS];
};

/* One pass over the file's tensors: each name must be one the architecture knows (gguf_parse
 * rejected duplicates), and every tensor it needs must be there. Decides the config's optional
 * parts from what the file holds: llama's biases (all layers or none) and rope_freqs. */
static int find_tensors(struct found *f, struct model_config *c, const struct gguf *g,
                        const char *what, char *err)
{
    const int L = c->n_layers;
    const struct arch *a = &archs[c->arch];
    if (!(f->lt = calloc((size_t)L, sizeof *f->lt)))
        return errmsg_set(err, "%s: out of memory", what);
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const struct gguf_tensor *t = &g->tensors[i];
        char name[80];
        int layer, kind;
        if (gguf_str_eq(t->name, "token_embd.weight"))
            f->embd = t;
        else if (gguf_str_eq(t->name, "output_norm.weight"))
            f->out_norm = t;
        else if (gguf_str_eq(t->name, "output.weight"))
            f->out = t;
        else if (gguf_str_eq(t->name, "rope_freqs.weight") && a->rope_freqs)
            f->rope_freqs = t;
        else if (parse_layer_name(t->name, &layer, &kind) == 0 &&
                 (kind < K_Q_BIAS || kind > K_V_BIAS || a->qkv_bias) &&
                 (kind < K_Q_NORM || kind > K_K_NORM || a->qk_norm)) {
            if (layer >= L)
                return errmsg_set(err, "%s: tensor %s: layer %d is beyond block_count %d", what,
                                  gguf_str_printable(t->name, name, sizeof name), layer, L);
            f->lt[layer][kind] = t;
        } else {
            return errmsg_set(err, "%s: tensor %s is not part of the %s architecture", what,
                              gguf_str_printable(t->name, name, sizeof name), a->name);
        }
    }
    if (!f->embd) return errmsg_set(err, "%s: missing tensor token_embd.weight", what);
    if (!f->out_norm) return errmsg_set(err, "%s: missing tensor output_norm.weight", what);
    if (a->qkv_bias == OPTIONAL) /* llama: biases if the first layer has any */
        c->qkv_bias = f->lt[0][K_Q_BIAS] || f->lt[0][K_K_BIAS] || f->lt[0][K_V_BIAS];
    c->rope_freqs = f->rope_freqs != NULL;
    for (int l = 0; l < L; l++)
        for (int k = 0; k < N_LAYER_KINDS; k++)
            if (k != K_ROPE_FREQS && kind_present(c, k) && !f->lt[l][k])
                return errmsg_set(err, "%s: missing tensor blk.%d.%s", what, l, layer_kind_name[k]);
            else if (!kind_present(c, k) && f->lt[l][k]) /* a bias beside biasless layers */
                return errmsg_set(err, "%s: tensor blk.%d.%s: blk.0 has no q/k/v biases", what, l,
                                  layer_kind_name[k]);
    return 0;
}

/* Every tensor's type and shape against the config. */
static int check_shapes(const struct found *f, const struct model_config *c, const char *what,
                        char *err)
{
    const uint64_t dim = (uint64_t)c->dim, hid = (uint64_t)c->hidden_dim, kv = (uint64_t)c->kv_dim,
                   qd = (uint64_t)c->q_dim, hd = (uint64_t)c->head_dim,
                   voc = (uint64_t)c->vocab_size;
    const struct expect e_embd = {dim, voc, "dim", "vocab"}, e_norm = {dim, 0, "dim", "dim"};
    const struct expect e_layer[N_LAYER_KINDS] = {
        [K_ATTN_NORM] = e_norm,
        [K_ATTN_Q] = {dim, qd, "dim", "n_heads*head_dim"},
        [K_ATTN_K] = {dim, kv, "dim", "kv_dim"},
        [K_ATTN_V] = {dim, kv, "dim", "kv_dim"},
        [K_Q_BIAS] = {qd, 0, "n_heads*head_dim", ""},
        [K_K_BIAS] = {kv, 0, "kv_dim", ""},
        [K_V_BIAS] = {kv, 0, "kv_dim", ""},
        [K_Q_NORM] = {hd, 0, "head_dim", ""},
        [K_K_NORM] = {hd, 0, "head_dim", ""},
        [K_ROPE_FREQS] = {hd / 2, 0, "head_dim/2", ""},
        [K_ATTN_OUT] = {qd, dim, "n_heads*head_dim", "dim"},
        [K_FFN_NORM] = e_norm,
        [K_FFN_GATE] = {dim, hid, "dim", "hidden_dim"},
        [K_FFN_DOWN] = {hid, dim, "hidden_dim", "dim"},
        [K_FFN_UP] = {dim, hid, "dim", "hidden_dim"},
    };
    /* "dim" when qd == dim, as the messages always said for Llama 2 shapes */
    struct expect eq = e_layer[K_ATTN_Q], eo = e_layer[K_ATTN_OUT];
    if (qd == dim) eq.rows_name = "dim", eo.cols_name = "dim";
    if (check_tensor(f->embd, e_embd, NULL, what, err) < 0 ||
        check_tensor(f->out_norm, e_norm, "norm weights", what, err) < 0 ||
        (f->out && check_tensor(f->out, e_embd, NULL, what, err) < 0) ||
        (f->rope_freqs && check_tensor(f->rope_freqs, e_layer[K_ROPE_FREQS],
                                       "rope frequency factors", what, err) < 0))
        return -1;
    for (int l = 0; l < c->n_layers; l++)
        for (int k = 0; k < N_LAYER_KINDS; k++) {
            if (k == K_ROPE_FREQS || !kind_present(c, k)) continue;
            const char *f32_only =
                k == K_ATTN_NORM || k == K_FFN_NORM || k == K_Q_NORM || k == K_K_NORM
                    ? "norm weights"
                : k >= K_Q_BIAS && k <= K_V_BIAS ? "biases"
                                                 : NULL;
            struct expect e = k == K_ATTN_Q ? eq : k == K_ATTN_OUT ? eo : e_layer[k];
            if (check_tensor(f->lt[l][k], e, f32_only, what, err) < 0) return -1;
        }
    return 0;
}

/* Span s's tensors in execution order: where each goes in the model (dst) and its kind (-1 for
 * the embedding and the head's). lay_out, describe_tensors and model_bind walk the same list. */
#define SPAN_MAX_TENSORS N_LAYER_KINDS
static int span_members(struct model *m, int s, struct tensor **dst, int *kind)
{
    const int L = m->cfg.n_layers;
    int n = 0;
    if (s == 0) {
        dst[n] = &m->token_embd, kind[n++] = -1;
    } else if (s == L + 1) {
        dst[n] = &m->output_norm, kind[n++] = -1;
        if (!m->tied_output) dst[n] = &m->output, kind[n++] = -2;
    } else {
        for (int k = 0; k < N_LAYER_KINDS; k++)
            if (kind_present(&m->cfg, k))
                dst[n] = (struct tensor *)((char *)&m->layers[s - 1] + layer_kind_field[k]),
                kind[n++] = k;
    }
    return n;
}

/* The GGUF tensor behind member i of span s. */
static const struct gguf_tensor *member_src(const struct found *f, int s, int L, int kind)
{
    if (s == 0) return f->embd;
    if (s == L + 1) return kind == -1 ? f->out_norm : f->out;
    return kind == K_ROPE_FREQS ? f->rope_freqs : f->lt[s - 1][kind];
}

/* The weight image in execution order: span 0 the embedding, 1+l block l, L+1 the head; each
 * span SPAN_ALIGNed, each tensor TENSOR_ALIGNed inside it. Also where each span lies in the file. */
static int lay_out(struct model *m, const struct found *f, const struct gguf *g, const char *what,
                   char *err)
{
    const int L = m->cfg.n_layers;
    m->tied_output = f->out == NULL;
    m->n_spans = L + 2;
    struct tensor *dst[SPAN_MAX_TENSORS];
    int kind[SPAN_MAX_TENSORS];
    m->n_slots = 0;
    for (int s = 0; s < m->n_spans; s++) m->n_slots += span_members(m, s, dst, kind);
    if (!(m->slots = calloc((size_t)m->n_slots, sizeof *m->slots)))
        return errmsg_set(err, "%s: out of memory", what);
    uint64_t off = 0;
    int n = 0;
    for (int s = 0; s < m->n_spans; s++) {
        off = align_up(off, SPAN_ALIGN);
        m->spans[s].offset = off;
        int cnt = span_members(m, s, dst, kind);
        uint64_t lo = UINT64_MAX, hi = 0;
        for (int i = 0; i < cnt; i++) {
            const struct gguf_tensor *t = member_src(f, s, L, kind[i]);
            uint64_t at = g->data_offset + t->offset; /* gguf_parse checked: no overflow */
            if (at < lo) lo = at;
            if (at + t->nbytes > hi) hi = at + t->nbytes;
            off = align_up(off, TENSOR_ALIGN);
            m->slots[n].src = t;
            m->slots[n].image_offset = off;
            m->slots[n].span = s;
            n++;
            off += t->nbytes;
        }
        m->spans[s].size = off - m->spans[s].offset;
        m->file_spans[s].offset = lo;
        m->file_spans[s].size = hi - lo;
    }
    m->file_in_order = 1;
    for (int s = 1; s < m->n_spans; s++)
        if (m->file_spans[s].offset < m->file_spans[s - 1].offset + m->file_spans[s - 1].size)
            m->file_in_order = 0;
    m->image_size = align_up(off, SPAN_ALIGN);
    return 0;
}

/* Shapes and types into the model's tensor structs (data comes with model_fill/model_bind). */
static void describe_tensors(struct model *m)
{
    struct tensor *dst[SPAN_MAX_TENSORS];
    int kind[SPAN_MAX_TENSORS];
    for (int s = 0, i = 0; s < m->n_spans; s++) {
        int cnt = span_members(m, s, dst, kind);
        for (int j = 0; j < cnt; j++) set_tensor(dst[j], m->slots[i++].src);
    }
    if (m->tied_output) set_tensor(&m->output, m->slots[0].src);
}

int model_plan(struct model *m, const struct gguf *g, const char *what, char *err)
{
    if (!what) what = "model";
    memset(m, 0, sizeof *m);
    m->gguf = g;
    if (read_config(&m->cfg, g, what, err) < 0) return -1;
    struct found f = {0};
    int rc = find_tensors(&f, &m->cfg, g, what, err);
    if (!rc) rc = check_shapes(&f, &m->cfg, what, err);
    if (!rc) rc = lay_out(m, &f, g, what, err);
    if (!rc) describe_tensors(m);
    free(f.lt);
    if (rc) {
        free(m->slots);
        m->slots = NULL;
    }
    return rc;
}

int model_fill(struct model *m, uint8_t *image, int s, char *err)
{
    if (s < 0 || s >= m->n_spans)
        return errmsg_set(err, "model: span %d out of range (0..%d)", s, m->n_spans - 1);
    const struct gguf *g = m->gguf;
    for (int i = 0; i < m->n_slots; i++) {
        const struct model_slot *sl = &m->slots[i];
        if (sl->span != s) continue;
        const struct gguf_tensor *t = sl->src;
        /* A GGUF parsed with gguf_parse_header may hold only the header. */
        if (g->data_offset > g->size || t->offset > g->size - g->data_offset ||
            t->nbytes > g->size - g->data_offset - t->offset) {
            char name[80];
            return errmsg_set(err, "model: tensor %s: data is not in the buffer",
                              gguf_str_printable(t->name, name, sizeof name));
        }
        memcpy(image + sl->image_offset, gguf_tensor_data(g, t), t->nbytes);
    }
    return 0;
}

void model_bind(struct model *m, const uint8_t *image)
{
    /* Slots are in execution order, the order span_members gives. */
    struct tensor *dst[SPAN_MAX_TENSORS];
    int kind[SPAN_MAX_TENSORS];
    for (int s = 0, i = 0; s < m->n_spans; s++) {
        int cnt = span_members(m, s, dst, kind);
        for (int j = 0; j < cnt; j++) dst[j]->data = image + m->slots[i++].image_offset;
    }
    if (m->tied_output) m->output.data = m->token_embd.data;
}

void model_free(struct model *m)
{
    free(m->slots);
    m->slots = NULL;
    m->n_slots = 0;
}
