/* model: llama config from GGUF metadata, tensor validation and the execution-order weight image.
 * See model.h for the contract.
 *
 * RoPE layout. Strata rotates interleaved pairs (2i, 2i+1) of each head, as llama2.c's run.c does
 * and as llama.cpp does for LLM_ARCH_LLAMA ("normal" rope, not NeoX). That is right only because
 * of how the weights were stored: Meta's original Llama weights use interleaved pairs; Hugging
 * Face checkpoints permute the rows of Q and K so that rotating halves (i, i + head_dim/2) is
 * equivalent, and llama.cpp's convert_hf_to_gguf.py undoes that permutation when it writes a GGUF.
 * llama2.c checkpoints are trained with interleaved (complex-number) RoPE in model.py, and its
 * export.py undoes the HF permutation the same way, so they are already in the interleaved layout:
 * `strata convert` copies wq/wk as they are and must NOT permute. Every GGUF "llama" file is
 * therefore interleaved-pairs. */
#include "serving/engine/model.h"

#include "os/common/errmsg.h"
#include "serving/engine/quant.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TENSOR_ALIGN 64   /* SIMD loads and cache lines */
#define SPAN_ALIGN   4096 /* a span starts on a page: it can be registered, mapped or sent alone */

enum {
    K_ATTN_NORM,
    K_ATTN_Q,
    K_ATTN_K,
    K_ATTN_V,
    K_ATTN_OUT,
    K_FFN_NORM,
    K_FFN_GATE,
    K_FFN_DOWN,
    K_FFN_UP,
    N_LAYER_KINDS
};
static const char *const layer_kind_name[N_LAYER_KINDS] = {
    "attn_norm", "attn_q",   "attn_k",   "attn_v", "attn_output",
    "ffn_norm",  "ffn_gate", "ffn_down", "ffn_up",
};

/* ---------------------------------------------------------------------------------------------
 * Config */

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

static int read_config(struct model_config *c, const struct gguf *g, const char *what, char *err)
{
    struct gguf_str arch;
    if (gguf_get_str(g, "general.architecture", &arch, err) < 0)
        return errmsg_prefix(err, "%s: ", what);
    char buf[48];
    if (!gguf_str_eq(arch, "llama"))
        return errmsg_set(err, "%s: general.architecture is \"%s\", only \"llama\" is supported",
                          what, gguf_str_printable(arch, buf, sizeof buf));
    if (get_int(g, "llama.embedding_length", &c->dim, -1, 1 << 16, what, err) < 0 ||
        get_int(g, "llama.feed_forward_length", &c->hidden_dim, -1, 1 << 18, what, err) < 0 ||
        get_int(g, "llama.block_count", &c->n_layers, -1, MODEL_MAX_LAYERS, what, err) < 0 ||
        get_int(g, "llama.attention.head_count", &c->n_heads, -1, 1 << 12, what, err) < 0 ||
        get_int(g, "llama.attention.head_count_kv", &c->n_kv_heads, c->n_heads, 1 << 12, what,
                err) < 0 ||
        get_int(g, "llama.context_length", &c->seq_len, -1, 1 << 24, what, err) < 0 ||
        get_float(g, "llama.attention.layer_norm_rms_epsilon", &c->norm_eps, 1e-5f, what, err) <
            0 ||
        get_float(g, "llama.rope.freq_base", &c->rope_theta, 10000.0f, what, err) < 0)
        return -1;
    if (c->dim % c->n_heads)
        return errmsg_set(err, "%s: embedding_length %d is not a multiple of head_count %d", what,
                          c->dim, c->n_heads);
    if (c->n_heads % c->n_kv_heads)
        return errmsg_set(err, "%s: head_count %d is not a multiple of head_count_kv %d", what,
                          c->n_heads, c->n_kv_heads);
    c->head_dim = c->dim / c->n_heads;
    if (c->head_dim % 2)
        return errmsg_set(err, "%s: head dimension %d is odd (RoPE rotates pairs)", what,
                          c->head_dim);
    c->kv_dim = c->n_kv_heads * c->head_dim;
    int rope_dims;
    if (get_int(g, "llama.rope.dimension_count", &rope_dims, c->head_dim, 1 << 16, what, err) < 0)
        return -1;
    if (rope_dims != c->head_dim)
        return errmsg_set(err,
                          "%s: llama.rope.dimension_count %d differs from the head dimension "
                          "%d (partial RoPE is not supported)",
                          what, rope_dims, c->head_dim);
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

/* "blk.N.KIND.weight" -> layer and kind; -1 if the name is not of that form. */
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
        size_t kl = strlen(layer_kind_name[k]);
        if ((size_t)(end - p) == kl + 7 && memcmp(p, layer_kind_name[k], kl) == 0 &&
            memcmp(p + kl, ".weight", 7) == 0) {
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

static int check_tensor(const struct gguf_tensor *t, struct expect e, int is_norm, const char *what,
                        char *err)
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
    if (is_norm) {
        if (t->type != GGML_F32)
            return errmsg_set(err, "%s: tensor %s: type %s, norm weights must be f32", what, name,
                              ggml_type_name(t->type));
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
    const struct gguf_tensor *(*lt)[N_LAYER_KINDS];
};

/* One pass over the file's tensors: each name must be one the architecture knows (gguf_parse
 * rejected duplicates), and every tensor it needs must be there. */
static int find_tensors(struct found *f, const struct gguf *g, int L, const char *what, char *err)
{
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
        else if (parse_layer_name(t->name, &layer, &kind) == 0) {
            if (layer >= L)
                return errmsg_set(err, "%s: tensor %s: layer %d is beyond block_count %d", what,
                                  gguf_str_printable(t->name, name, sizeof name), layer, L);
            f->lt[layer][kind] = t;
        } else {
            return errmsg_set(err, "%s: tensor %s is not part of the llama architecture", what,
                              gguf_str_printable(t->name, name, sizeof name));
        }
    }
    if (!f->embd) return errmsg_set(err, "%s: missing tensor token_embd.weight", what);
    if (!f->out_norm) return errmsg_set(err, "%s: missing tensor output_norm.weight", what);
    for (int l = 0; l < L; l++)
        for (int k = 0; k < N_LAYER_KINDS; k++)
            if (!f->lt[l][k])
                return errmsg_set(err, "%s: missing tensor blk.%d.%s.weight", what, l,
                                  layer_kind_name[k]);
    return 0;
}

/* Every tensor's type and shape against the config. */
static int check_shapes(const struct found *f, const struct model_config *c, const char *what,
                        char *err)
{
    const uint64_t dim = (uint64_t)c->dim, hid = (uint64_t)c->hidden_dim, kv = (uint64_t)c->kv_dim,
                   voc = (uint64_t)c->vocab_size;
    const struct expect e_embd = {dim, voc, "dim", "vocab"}, e_norm = {dim, 0, "dim", "dim"};
    const struct expect e_layer[N_LAYER_KINDS] = {
        [K_ATTN_NORM] = e_norm,
        [K_ATTN_Q] = {dim, dim, "dim", "dim"},
        [K_ATTN_K] = {dim, kv, "dim", "kv_dim"},
        [K_ATTN_V] = {dim, kv, "dim", "kv_dim"},
        [K_ATTN_OUT] = {dim, dim, "dim", "dim"},
        [K_FFN_NORM] = e_norm,
        [K_FFN_GATE] = {dim, hid, "dim", "hidden_dim"},
        [K_FFN_DOWN] = {hid, dim, "hidden_dim", "dim"},
        [K_FFN_UP] = {dim, hid, "dim", "hidden_dim"},
    };
    if (check_tensor(f->embd, e_embd, 0, what, err) < 0 ||
        check_tensor(f->out_norm, e_norm, 1, what, err) < 0 ||
        (f->out && check_tensor(f->out, e_embd, 0, what, err) < 0))
        return -1;
    for (int l = 0; l < c->n_layers; l++)
        for (int k = 0; k < N_LAYER_KINDS; k++) {
            int norm = k == K_ATTN_NORM || k == K_FFN_NORM;
            if (check_tensor(f->lt[l][k], e_layer[k], norm, what, err) < 0) return -1;
        }
    return 0;
}

/* The weight image in execution order: span 0 the embedding, 1+l block l, L+1 the head; each
 * span SPAN_ALIGNed, each tensor TENSOR_ALIGNed inside it. Also where each span lies in the file. */
static int lay_out(struct model *m, const struct found *f, const struct gguf *g, const char *what,
                   char *err)
{
    const int L = m->cfg.n_layers;
    m->tied_output = f->out == NULL;
    m->n_spans = L + 2;
    m->n_slots = 1 + L * N_LAYER_KINDS + 1 + (f->out != NULL);
    if (!(m->slots = calloc((size_t)m->n_slots, sizeof *m->slots)))
        return errmsg_set(err, "%s: out of memory", what);
    uint64_t off = 0;
    int n = 0;
    for (int s = 0; s < m->n_spans; s++) {
        off = align_up(off, SPAN_ALIGN);
        m->spans[s].offset = off;
        const struct gguf_tensor *list[N_LAYER_KINDS];
        int cnt = 0;
        if (s == 0)
            list[cnt++] = f->embd;
        else if (s <= L)
            for (int k = 0; k < N_LAYER_KINDS; k++) list[cnt++] = f->lt[s - 1][k];
        else {
            list[cnt++] = f->out_norm;
            if (f->out) list[cnt++] = f->out;
        }
        uint64_t lo = UINT64_MAX, hi = 0;
        for (int i = 0; i < cnt; i++) {
            uint64_t at = g->data_offset + list[i]->offset; /* gguf_parse checked: no overflow */
            if (at < lo) lo = at;
            if (at + list[i]->nbytes > hi) hi = at + list[i]->nbytes;
            off = align_up(off, TENSOR_ALIGN);
            m->slots[n].src = list[i];
            m->slots[n].image_offset = off;
            m->slots[n].span = s;
            n++;
            off += list[i]->nbytes;
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
static void describe_tensors(struct model *m, const struct found *f)
{
    set_tensor(&m->token_embd, f->embd);
    set_tensor(&m->output_norm, f->out_norm);
    set_tensor(&m->output, f->out ? f->out : f->embd);
    for (int l = 0; l < m->cfg.n_layers; l++) {
        struct layer_weights *w = &m->layers[l];
        struct tensor *dst[N_LAYER_KINDS] = {&w->attn_norm, &w->wq,     &w->wk,     &w->wv,  &w->wo,
                                             &w->ffn_norm,  &w->w_gate, &w->w_down, &w->w_up};
        for (int k = 0; k < N_LAYER_KINDS; k++) set_tensor(dst[k], f->lt[l][k]);
    }
}

int model_plan(struct model *m, const struct gguf *g, const char *what, char *err)
{
    if (!what) what = "model";
    memset(m, 0, sizeof *m);
    m->gguf = g;
    if (read_config(&m->cfg, g, what, err) < 0) return -1;
    struct found f = {0};
    int rc = find_tensors(&f, g, m->cfg.n_layers, what, err);
    if (!rc) rc = check_shapes(&f, &m->cfg, what, err);
    if (!rc) rc = lay_out(m, &f, g, what, err);
    if (!rc) describe_tensors(m, &f);
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
    /* Slots are in execution order, the same order model_plan assigned the tensors in. */
    int i = 0;
    m->token_embd.data = image + m->slots[i++].image_offset;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        struct layer_weights *w = &m->layers[l];
        struct tensor *dst[N_LAYER_KINDS] = {&w->attn_norm, &w->wq,     &w->wk,     &w->wv,  &w->wo,
                                             &w->ffn_norm,  &w->w_gate, &w->w_down, &w->w_up};
        for (int k = 0; k < N_LAYER_KINDS; k++) dst[k]->data = image + m->slots[i++].image_offset;
    }
    m->output_norm.data = image + m->slots[i++].image_offset;
    m->output.data = m->tied_output ? m->token_embd.data : image + m->slots[i++].image_offset;
}

void model_free(struct model *m)
{
    free(m->slots);
    m->slots = NULL;
    m->n_slots = 0;
}
