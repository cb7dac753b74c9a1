/* convert: llama2.c checkpoint + tokenizer.bin -> GGUF. See convert.h for the contract. */
#include "serving/engine/convert.h"

#include "os/common/errmsg.h"
#include "os/runtime/log.h"
#include "serving/engine/quant.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#define LLAMA2C_V1_MAGIC 0x616b3432u /* "ak42": llama2.c's later export versions */

static const struct {
    const char *name;
    uint32_t type;
    uint32_t file_type; /* llama.cpp's general.file_type (llama_ftype) */
} types[] = {
    {"f32", GGML_F32, 0},    {"f16", GGML_F16, 1},    {"bf16", GGML_BF16, 32},
    {"q8_0", GGML_Q8_0, 7},  {"q4_0", GGML_Q4_0, 2},  {"q4_1", GGML_Q4_1, 3},
    {"q5_0", GGML_Q5_0, 8},  {"q5_1", GGML_Q5_1, 9},  {"iq4_nl", GGML_IQ4_NL, 25},
    {"q2_k", GGML_Q2_K, 10}, {"q3_k", GGML_Q3_K, 12}, {"q4_k", GGML_Q4_K, 15},
    {"q5_k", GGML_Q5_K, 17}, {"q6_k", GGML_Q6_K, 18}, {"iq4_xs", GGML_IQ4_XS, 30},
};

int convert_parse_type(const char *name, uint32_t *type)
{
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (!strcasecmp(name, types[i].name)) {
            *type = types[i].type;
            return 0;
        }
    return -1;
}

uint32_t convert_matrix_type(uint32_t type, uint64_t cols)
{
    int blk = ggml_block_elems(type);
    return blk > 0 && cols % (uint64_t)blk == 0 ? type : GGML_F32;
}

int convert_encode(uint32_t type, const float *x, uint64_t rows, uint64_t cols, void *out)
{
    uint64_t rb = ggml_row_bytes(type, cols);
    if (!rb || cols > INT32_MAX) return -1;
    for (uint64_t r = 0; r < rows; r++)
        if (quantize_row(type, x + r * cols, (uint8_t *)out + r * rb, (int)cols) < 0) return -1;
    return 0;
}

int convert_read_file(const char *path, uint8_t **buf, size_t *size, char *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) return errmsg_set(err, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) < 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return errmsg_set(err, "%s: not a regular file", path);
    }
    *size = (size_t)st.st_size;
    *buf = malloc(*size ? *size : 1);
    if (!*buf) {
        fclose(f);
        return errmsg_set(err, "%s: out of memory for %zu bytes", path, *size);
    }
    if (fread(*buf, 1, *size, f) != *size) {
        fclose(f);
        free(*buf);
        *buf = NULL;
        return errmsg_set(err, "%s: read failed", path);
    }
    fclose(f);
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Metadata */

int convert_put_config(struct gguf_writer *w, const struct model_config *c, uint32_t type,
                       const char *name)
{
    uint32_t file_type = 0;
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (types[i].type == type) file_type = types[i].file_type;
    return convert_put_config_ftype(w, c, file_type, name);
}

int convert_put_config_ftype(struct gguf_writer *w, const struct model_config *c,
                             uint32_t file_type, const char *name)
{
    const char *arch = model_arch_name(c->arch);
    char k[64];
#define AKEY(suffix) (snprintf(k, sizeof k, "%s.%s", arch, suffix), k)
    int rc = 0;
    rc |= gguf_w_str(w, "general.architecture", arch);
    rc |= gguf_w_str(w, "general.name", name);
    rc |= gguf_w_u32(w, "general.file_type", file_type);
    rc |= gguf_w_u32(w, AKEY("context_length"), (uint32_t)c->seq_len);
    rc |= gguf_w_u32(w, AKEY("embedding_length"), (uint32_t)c->dim);
    rc |= gguf_w_u32(w, AKEY("feed_forward_length"), (uint32_t)c->hidden_dim);
    rc |= gguf_w_u32(w, AKEY("block_count"), (uint32_t)c->n_layers);
    rc |= gguf_w_u32(w, AKEY("attention.head_count"), (uint32_t)c->n_heads);
    rc |= gguf_w_u32(w, AKEY("attention.head_count_kv"), (uint32_t)c->n_kv_heads);
    if (c->head_dim * c->n_heads != c->dim) { /* as llama.cpp's converter writes a head_dim */
        rc |= gguf_w_u32(w, AKEY("attention.key_length"), (uint32_t)c->head_dim);
        rc |= gguf_w_u32(w, AKEY("attention.value_length"), (uint32_t)c->head_dim);
    }
    rc |= gguf_w_u32(w, AKEY("rope.dimension_count"), (uint32_t)c->head_dim);
    rc |= gguf_w_u32(w, AKEY("vocab_size"), (uint32_t)c->vocab_size);
    rc |= gguf_w_f32(w, AKEY("attention.layer_norm_rms_epsilon"), c->norm_eps);
    rc |= gguf_w_f32(w, AKEY("rope.freq_base"), c->rope_theta);
#undef AKEY
    return rc ? -1 : 0;
}

/* GGUF spelling of a piece: llama2.c's "\n<s>\n" / "\n</s>\n" become "<s>" / "</s>", spaces
 * become U+2581 as in the SentencePiece model the vocabulary came from. */
static char *gguf_piece(const struct tokenizer *t, int id)
{
    const char *p = t->pieces[id];
    if (id == t->bos_id && !strcmp(p, "\n<s>\n")) return strdup("<s>");
    if (id == t->eos_id && !strcmp(p, "\n</s>\n")) return strdup("</s>");
    char *s = malloc(3 * (size_t)t->piece_len[id] + 1), *o = s;
    if (!s) return NULL;
    for (int i = 0; i < t->piece_len[id]; i++) {
        if (p[i] == ' ') {
            memcpy(o, "\xe2\x96\x81", 3);
            o += 3;
        } else
            *o++ = p[i];
    }
    *o = 0;
    return s;
}

int convert_put_tokenizer(struct gguf_writer *w, const struct tokenizer *t)
{
    int n = t->vocab_size, rc = -1;
    char **pieces = calloc((size_t)n, sizeof *pieces);
    int32_t *tt = calloc((size_t)n, sizeof *tt);
    if (!pieces || !tt) goto out;
    for (int i = 0; i < n; i++) {
        if (!(pieces[i] = gguf_piece(t, i))) goto out;
        tt[i] = 1; /* normal */
    }
    for (int b = 0; b < 256; b++)
        if (t->byte_ids[b] >= 0) tt[t->byte_ids[b]] = 6; /* byte */
    if (n > 0) tt[0] = 2;                                /* unknown */
    if (t->bos_id >= 0) tt[t->bos_id] = 3;               /* control */
    if (t->eos_id >= 0) tt[t->eos_id] = 3;
    uint8_t yes = 1, no = 0;
    int e = 0;
    e |= gguf_w_str(w, "tokenizer.ggml.model", "llama");
    e |= gguf_w_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)pieces, (uint64_t)n);
    e |= gguf_w_arr_f32(w, "tokenizer.ggml.scores", t->scores, (uint64_t)n);
    e |= gguf_w_arr_i32(w, "tokenizer.ggml.token_type", tt, (uint64_t)n);
    e |= gguf_w_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    if (t->bos_id >= 0) e |= gguf_w_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)t->bos_id);
    if (t->eos_id >= 0) e |= gguf_w_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)t->eos_id);
    e |= gguf_w_val(w, "tokenizer.ggml.add_bos_token", GGUF_BOOL, &yes);
    e |= gguf_w_val(w, "tokenizer.ggml.add_eos_token", GGUF_BOOL, &no);
    rc = e ? -1 : 0;
out:
    if (pieces)
        for (int i = 0; i < n; i++) free(pieces[i]);
    free(pieces);
    free(tt);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * Checkpoint */

struct ckpt_header {
    int32_t dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
};

static int check_header(const struct ckpt_header *h, const char *what, struct model_config *c,
                        int *shared, char *err)
{
    if (h->dim <= 0 || h->dim > (1 << 16) || h->hidden_dim <= 0 || h->hidden_dim > (1 << 18) ||
        h->n_layers <= 0 || h->n_layers > MODEL_MAX_LAYERS || h->n_heads <= 0 ||
        h->n_kv_heads <= 0 || h->vocab_size == 0 || h->vocab_size < -(1 << 24) ||
        h->vocab_size > (1 << 24) || h->seq_len <= 0 || h->seq_len > (1 << 24))
        return errmsg_set(err,
                          "%s: implausible header (dim %d, hidden_dim %d, n_layers %d, n_heads %d, "
                          "n_kv_heads %d, vocab %d, seq_len %d): not a llama2.c v0 checkpoint?",
                          what, h->dim, h->hidden_dim, h->n_layers, h->n_heads, h->n_kv_heads,
                          h->vocab_size, h->seq_len);
    if (h->dim % h->n_heads || h->n_heads % h->n_kv_heads || (h->dim / h->n_heads) % 2)
        return errmsg_set(err,
                          "%s: header has dim %d, n_heads %d, n_kv_heads %d: need dim = n_heads "
                          "x an even head size and n_heads a multiple of n_kv_heads",
                          what, h->dim, h->n_heads, h->n_kv_heads);
    *shared = h->vocab_size > 0;
    memset(c, 0, sizeof *c);
    c->dim = h->dim;
    c->hidden_dim = h->hidden_dim;
    c->n_layers = h->n_layers;
    c->n_heads = h->n_heads;
    c->n_kv_heads = h->n_kv_heads;
    c->head_dim = h->dim / h->n_heads;
    c->q_dim = h->dim;
    c->kv_dim = c->head_dim * h->n_kv_heads;
    c->vocab_size = h->vocab_size > 0 ? h->vocab_size : -h->vocab_size;
    c->seq_len = h->seq_len;
    c->norm_eps = 1e-5f;
    c->rope_theta = 10000.0f;
    c->rope_scale = 1.0f;
    return 0;
}

/* Where a tensor lies in the checkpoint, in floats after the header. */
struct src {
    const char *gguf_name; /* with %d for the layer */
    uint64_t rows, cols;   /* per layer */
    int per_layer;
    int is_norm;
};

/* Checkpoint order. */
enum { EMB, RMS_ATT, WQ, WK, WV, WO, RMS_FFN, W1, W2, W3, RMS_FINAL, FREQ, WCLS, N_SRC };

/* The header, read and checked: c and shared describe the model on success. */
static int read_ckpt_header(const void *ckpt, size_t ckpt_size, const char *what,
                            struct ckpt_header *h, struct model_config *c, int *shared, char *err)
{
    if (ckpt_size < sizeof *h)
        return errmsg_set(err, "%s: %zu bytes, too short for a llama2.c checkpoint header", what,
                          ckpt_size);
    memcpy(h, ckpt, sizeof *h);
    if ((uint32_t)h->dim == LLAMA2C_V1_MAGIC)
        return errmsg_set(err,
                          "%s: a llama2.c version 1/2 export (magic ak42); only the legacy "
                          "v0 format is supported (export.py --version 0)",
                          what);
    return check_header(h, what, c, shared, err);
}

/* The checkpoint's tensors in file order, their offsets in floats in at[]; returns the total. */
static uint64_t ckpt_layout(const struct model_config *c, int shared, struct src src[N_SRC],
                            uint64_t at[N_SRC])
{
    const uint64_t D = (uint64_t)c->dim, H = (uint64_t)c->hidden_dim, L = (uint64_t)c->n_layers,
                   KV = (uint64_t)c->kv_dim, V = (uint64_t)c->vocab_size, S = (uint64_t)c->seq_len,
                   HS = (uint64_t)c->head_dim;
    const struct src layout[N_SRC] = {
        [EMB] = {"token_embd.weight", V, D, 0, 0},
        [RMS_ATT] = {"blk.%d.attn_norm.weight", 1, D, 1, 1},
        [WQ] = {"blk.%d.attn_q.weight", D, D, 1, 0},
        [WK] = {"blk.%d.attn_k.weight", KV, D, 1, 0},
        [WV] = {"blk.%d.attn_v.weight", KV, D, 1, 0},
        [WO] = {"blk.%d.attn_output.weight", D, D, 1, 0},
        [RMS_FFN] = {"blk.%d.ffn_norm.weight", 1, D, 1, 1},
        [W1] = {"blk.%d.ffn_gate.weight", H, D, 1, 0},
        [W2] = {"blk.%d.ffn_down.weight", D, H, 1, 0},
        [W3] = {"blk.%d.ffn_up.weight", H, D, 1, 0},
        [RMS_FINAL] = {"output_norm.weight", 1, D, 0, 1},
        [FREQ] = {NULL, 2 * S, HS / 2, 0, 0},
        [WCLS] = {"output.weight", shared ? 0 : V, D, 0, 0},
    };
    uint64_t total = 0; /* in floats; all factors < 2^25 and few: no overflow */
    for (int i = 0; i < N_SRC; i++) {
        src[i] = layout[i];
        at[i] = total;
        total += src[i].rows * src[i].cols * (src[i].per_layer ? L : 1);
    }
    return total;
}

/* The file must hold exactly the tensors its header announces; a classifier too many or too few
 * is named, since that is the usual mistake (the sign of vocab_size). */
static int check_ckpt_size(size_t ckpt_size, uint64_t expect, const struct ckpt_header *h,
                           const struct model_config *c, int shared, const char *what, char *err)
{
    if (ckpt_size == expect) return 0;
    const uint64_t V = (uint64_t)c->vocab_size, D = (uint64_t)c->dim;
    char hint[160] = "";
    if (shared && ckpt_size == expect + 4 * V * D)
        snprintf(hint, sizeof hint,
                 " (the extra bytes are exactly a classifier: the header's "
                 "vocab_size should be negative)");
    else if (!shared && ckpt_size + 4 * V * D == expect)
        snprintf(hint, sizeof hint,
                 " (the classifier the negative vocab_size announces is "
                 "missing)");
    return errmsg_set(err,
                      "%s: %zu bytes, but its header (dim %d, hidden_dim %d, n_layers %d, "
                      "n_heads %d, n_kv_heads %d, vocab %d, seq_len %d, %s classifier) needs "
                      "%llu%s",
                      what, ckpt_size, c->dim, c->hidden_dim, c->n_layers, c->n_heads,
                      c->n_kv_heads, h->vocab_size, c->seq_len, shared ? "shared" : "separate",
                      (unsigned long long)expect, hint);
}

/* Tensors encoded for the writer, freed once the file is written. */
struct converted {
    void **owned;
    int n_owned;
    int kept_f32; /* matrices left in f32 because their rows do not fit the type's block */
};

/* Add one tensor (layer l for per-layer ones) to w, encoded as `type` where its rows allow. */
static int add_tensor(struct gguf_writer *w, const struct src *sp, const float *x, int l,
                      uint32_t type, struct converted *cv, char *err)
{
    char tname[64];
    snprintf(tname, sizeof tname, sp->gguf_name, l);
    uint64_t ne[2] = {sp->cols, sp->rows};
    uint32_t tt = sp->is_norm ? GGML_F32 : convert_matrix_type(type, sp->cols);
    const void *data = x;
    if (tt != type && !sp->is_norm) cv->kept_f32++;
    if (tt != GGML_F32) {
        void *q = malloc(ggml_row_bytes(tt, sp->cols) * sp->rows);
        if (!q) return errmsg_set(err, "out of memory for %s", tname);
        cv->owned[cv->n_owned++] = q;
        if (convert_encode(tt, x, sp->rows, sp->cols, q) < 0)
            return errmsg_set(err, "%s: cannot encode as %s", tname, ggml_type_name(tt));
        data = q;
    }
    if (gguf_w_tensor(w, tname, tt, sp->is_norm ? 1 : 2, ne, data) < 0)
        return errmsg_set(err, "%s: cannot add tensor", tname);
    return 0;
}

/* All tensors in execution order: embedding, each layer's nine tensors, final norm, classifier. */
static int add_tensors(struct gguf_writer *w, const float *f, const struct src src[N_SRC],
                       const uint64_t at[N_SRC], int L, int shared, uint32_t type,
                       struct converted *cv, char *err)
{
    const int layer_order[9] = {RMS_ATT, WQ, WK, WV, WO, RMS_FFN, W1, W2, W3};
    for (int l = -1; l <= L; l++) {
        int count = l < 0 ? 1 : l < L ? 9 : (shared ? 1 : 2);
        for (int k = 0; k < count; k++) {
            int s = l < 0 ? EMB : l < L ? layer_order[k] : (k == 0 ? RMS_FINAL : WCLS);
            const struct src *sp = &src[s];
            const float *x = f + at[s] + (sp->per_layer ? (uint64_t)l * sp->rows * sp->cols : 0);
            if (add_tensor(w, sp, x, l, type, cv, err) < 0) return -1;
        }
    }
    return 0;
}

int convert_llama2c(const void *ckpt, size_t ckpt_size, const void *tok, size_t tok_size,
                    uint32_t type, const char *name, const char *what, FILE *out, char *err)
{
    struct ckpt_header h;
    struct model_config c = {0};
    int shared = 0;
    if (read_ckpt_header(ckpt, ckpt_size, what, &h, &c, &shared, err) < 0) return -1;
    struct src src[N_SRC];
    uint64_t at[N_SRC];
    uint64_t expect = sizeof h + 4 * ckpt_layout(&c, shared, src, at);
    if (check_ckpt_size(ckpt_size, expect, &h, &c, shared, what, err) < 0) return -1;
    struct tokenizer t;
    if (tokenizer_from_llama2c(&t, tok, tok_size, c.vocab_size, err) < 0) return -1;

    const float *f = (const float *)((const uint8_t *)ckpt + sizeof h);
    struct gguf_writer *w = gguf_writer_new();
    int rc = -1;
    struct converted cv = {calloc((size_t)c.n_layers * 9 + 4, sizeof *cv.owned), 0, 0};
    if (!w || !cv.owned) {
        errmsg_set(err, "out of memory");
        goto out;
    }
    if (convert_put_config(w, &c, type, name) < 0 || convert_put_tokenizer(w, &t) < 0) {
        errmsg_set(err, "out of memory writing metadata");
        goto out;
    }
    if (add_tensors(w, f, src, at, c.n_layers, shared, type, &cv, err) < 0) goto out;
    if (cv.kept_f32)
        log_warn("convert",
                 "%d matrices kept in f32: their rows are not a multiple of %s's block "
                 "of %d",
                 cv.kept_f32, ggml_type_name(type), ggml_block_elems(type));
    rc = gguf_writer_write(w, out, err);
out:
    for (int i = 0; i < cv.n_owned; i++) free(cv.owned[i]);
    free(cv.owned);
    gguf_writer_free(w);
    tokenizer_free(&t);
    return rc;
}

int convert_llama2c_files(const char *ckpt_path, const char *tok_path, const char *out_path,
                          uint32_t type, char *err)
{
    uint8_t *ck = NULL, *tk = NULL;
    size_t ck_size, tk_size;
    int rc = -1;
    if (convert_read_file(ckpt_path, &ck, &ck_size, err) < 0) return -1;
    if (convert_read_file(tok_path, &tk, &tk_size, err) < 0) goto out;
    /* general.name: the checkpoint's file name without directory and extension. */
    char name[128];
    const char *base = strrchr(ckpt_path, '/');
    snprintf(name, sizeof name, "%s", base ? base + 1 : ckpt_path);
    char *dot = strrchr(name, '.');
    if (dot && dot != name) *dot = 0;
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", out_path) >= (int)sizeof tmp) {
        errmsg_set(err, "%s: path too long", out_path);
        goto out;
    }
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        errmsg_set(err, "%s: %s", tmp, strerror(errno));
        goto out;
    }
    rc = convert_llama2c(ck, ck_size, tk, tk_size, type, name, ckpt_path, f, err);
    if (rc < 0 && strncmp(err, "tokenizer", 9) == 0) errmsg_prefix(err, "%s: ", tok_path);
    if (fclose(f) != 0 && rc == 0) rc = errmsg_set(err, "%s: %s", tmp, strerror(errno));
    /* Write to a temporary name and rename, so a failed run never leaves a half file. */
    if (rc == 0 && rename(tmp, out_path) < 0)
        rc = errmsg_set(err, "%s: %s", out_path, strerror(errno));
    if (rc < 0) unlink(tmp);
out:
    free(ck);
    free(tk);
    return rc;
}
