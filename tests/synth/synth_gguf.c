/* synth_gguf: see synth_gguf.h for the contract. */
#include "tests/synth/synth_gguf.h"

#include "os/common/errmsg.h"
#include "serving/engine/convert.h"
#include "serving/engine/quant.h"
#include "serving/engine/quant_preset.h"
#include "tests/synth/vocab_json.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct gen_tensor {
    uint64_t rows, cols;
    uint32_t type;
    float mean, std, scale; /* element = (mean + std * N(0,1)) * scale */
    const float *values;    /* instead: these (one row) */
    uint64_t seed;
};

struct gen {
    struct gen_tensor *t;
    int n;
    int threads;
    float *rope_freqs; /* the values of rope_freqs.weight */
};

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Approximately N(0, 1): the sum of four 16-bit uniforms, centred and scaled (Irwin-Hall). */
static float gauss(uint64_t *s)
{
    uint64_t r = splitmix(s);
    float sum = (float)(r & 0xffff) + (float)((r >> 16) & 0xffff) + (float)((r >> 32) & 0xffff) +
                (float)(r >> 48);
    return (sum / 65536.0f - 2.0f) * 1.7320508f;
}

struct fill_job {
    const struct gen_tensor *t;
    uint8_t *buf;
    uint64_t r0, r1;
    int rc;
};

/* Rows [r0, r1): each row has its own stream (derived from the tensor's seed and the row), so the
 * values do not depend on how rows are split between threads. */
static void *fill_rows(void *arg)
{
    struct fill_job *j = arg;
    const struct gen_tensor *t = j->t;
    uint64_t rb = ggml_row_bytes(t->type, t->cols);
    float *row = malloc(t->cols * sizeof *row);
    j->rc = row ? 0 : -1;
    for (uint64_t r = j->r0; r < j->r1 && j->rc == 0; r++) {
        uint64_t s = t->seed ^ (r * 0xd1b54a32d192ed03ull);
        s = splitmix(&s);
        for (uint64_t i = 0; i < t->cols; i++) {
            if (t->values) {
                row[i] = t->values[i];
                continue;
            }
            float g = gauss(&s);
            row[i] = t->mean ? t->mean + t->std * g : t->std * g;
            if (t->scale != 1.0f) row[i] *= t->scale;
        }
        if (convert_encode(t->type, row, 1, t->cols, j->buf + r * rb) < 0) j->rc = -1;
    }
    free(row);
    return NULL;
}

#define MAX_THREADS 16

static int fill(void *ctx, int index, void *buf, uint64_t nbytes)
{
    struct gen *g = ctx;
    const struct gen_tensor *t = &g->t[index];
    if (ggml_row_bytes(t->type, t->cols) * t->rows != nbytes) return -1;
    int nt = g->threads;
    if ((uint64_t)nt > t->rows) nt = (int)t->rows;
    struct fill_job jobs[MAX_THREADS];
    pthread_t th[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    for (int k = 0; k < nt; k++) {
        jobs[k] = (struct fill_job){t, buf, t->rows * (uint64_t)k / (uint64_t)nt,
                                    t->rows * (uint64_t)(k + 1) / (uint64_t)nt, 0};
        /* Job 0 runs on this thread; a job whose thread cannot start runs here too. */
        if (k > 0) started[k] = pthread_create(&th[k], NULL, fill_rows, &jobs[k]) == 0;
    }
    int rc = 0;
    for (int k = 0; k < nt; k++) {
        if (started[k])
            pthread_join(th[k], NULL);
        else
            fill_rows(&jobs[k]);
        if (jobs[k].rc) rc = -1;
    }
    return rc;
}

/* A llama2.c tokenizer.bin image of a synthetic vocabulary of n tokens. */
static uint8_t *synth_vocab(int n, size_t *size)
{
    uint8_t *img = malloc(4 + (size_t)n * 16), *p = img + 4;
    uint32_t maxlen = 6;
    memcpy(img, &maxlen, 4);
    char piece[8];
    for (int i = 0; i < n; i++) {
        if (i == 0)
            strcpy(piece, "<unk>");
        else if (i == 1)
            strcpy(piece, "\n<s>\n");
        else if (i == 2)
            strcpy(piece, "\n</s>\n");
        else if (i < 259)
            snprintf(piece, sizeof piece, "<0x%02X>", i - 3);
        else if (i < 259 + 95)
            snprintf(piece, sizeof piece, "%c", ' ' + (i - 259));
        else if (i < 259 + 95 + 26)
            snprintf(piece, sizeof piece, " %c", 'a' + (i - 259 - 95));
        else { /* letter pairs, then space + pair: "aa".."zz", " aa".." zz", then triples */
            int k = i - (259 + 95 + 26);
            if (k < 676)
                snprintf(piece, sizeof piece, "%c%c", 'a' + k / 26, 'a' + k % 26);
            else if ((k -= 676) < 676)
                snprintf(piece, sizeof piece, " %c%c", 'a' + k / 26, 'a' + k % 26);
            else {
                k -= 676;
                snprintf(piece, sizeof piece, "%c%c%c%c", 'a' + (k / 17576) % 26,
                         'a' + (k / 676) % 26, 'a' + (k / 26) % 26, 'a' + k % 26);
            }
        }
        float score = i < 259 ? 0.0f : -(float)(i - 259);
        int32_t len = (int32_t)strlen(piece);
        memcpy(p, &score, 4);
        memcpy(p + 4, &len, 4);
        memcpy(p + 8, piece, (size_t)len);
        p += 8 + len;
    }
    *size = (size_t)(p - img);
    return img;
}

static struct model_config config_of(const struct synth_spec *s)
{
    int hd = s->head_dim ? s->head_dim : s->dim / s->heads;
    return (struct model_config){
        .arch = s->arch,
        .dim = s->dim,
        .hidden_dim = s->hidden,
        .n_layers = s->layers,
        .n_heads = s->heads,
        .n_kv_heads = s->kv_heads,
        .head_dim = hd,
        .q_dim = hd * s->heads,
        .kv_dim = hd * s->kv_heads,
        .vocab_size = s->vocab,
        .seq_len = s->seq,
        .norm_eps = 1e-5f,
        .rope_theta = s->rope_theta > 0 ? s->rope_theta : 10000.0f,
        .rope_scale = 1.0f,
        .qkv_bias = s->arch == ARCH_QWEN2 || s->qkv_bias,
        .qk_norm = s->arch == ARCH_QWEN3,
        .rope_freqs = s->rope_freqs,
    };
}

/* Llama 3.1's frequency factors for head_dim hd, as llama.cpp's convert_hf_to_gguf.py computes
 * them for rope_scaling {rope_type llama3, factor 8, low_freq_factor 1, high_freq_factor 4,
 * original_max_position_embeddings 8192}: pairs whose wavelength is shorter than 8192/4 keep their
 * frequency, longer than 8192/1 turn 8 times slower, and the band between is interpolated. */
static float *llama31_rope_freqs(float theta, int hd)
{
    const double factor = 8, low = 1, high = 4, old_ctx = 8192;
    const double low_wavelen = old_ctx / low, high_wavelen = old_ctx / high;
    float *f = malloc(sizeof(float) * (size_t)(hd / 2));
    for (int i = 0; f && i < hd / 2; i++) {
        float freq = 1.0f / powf(theta, (float)(2 * i) / (float)hd);
        double wavelen = 2 * M_PI / freq;
        if (wavelen < high_wavelen)
            f[i] = 1.0f;
        else if (wavelen > low_wavelen)
            f[i] = (float)factor;
        else {
            double smooth = (old_ctx / wavelen - low) / (high - low);
            f[i] = (float)(1 / ((1 - smooth) / factor + smooth));
        }
    }
    return f;
}

/* The tokenizer from s->tokenizer, or the synthetic vocabulary of s->vocab tokens. */
static int load_vocab(const struct synth_spec *s, struct tokenizer *tok, char *err)
{
    uint8_t *tok_img;
    size_t tok_size;
    if (s->tokenizer) {
        if (convert_read_file(s->tokenizer, &tok_img, &tok_size, err) < 0) return -1;
    } else
        tok_img = synth_vocab(s->vocab, &tok_size);
    int rc = tokenizer_from_llama2c(tok, tok_img, tok_size, s->vocab, err);
    free(tok_img);
    if (rc < 0)
        return errmsg_prefix(err, "%s: ", s->tokenizer ? s->tokenizer : "synthetic vocabulary");
    return 0;
}

/* Element distributions: matrices ~ N(0, 0.02), norm weights ~ 1 + N(0, 0.05), biases ~ N(0, 0.2). */
enum { MATRIX, NORM, BIAS, FACTORS };

/* One tensor's description, added to the writer without data (fill() makes it while writing).
 * type: a matrix's type (the others are f32 whatever it says). */
static void add_tensor(struct gguf_writer *w, struct gen *g, const char *name, uint64_t rows,
                       uint64_t cols, int kind, float scale, uint32_t type,
                       const struct synth_spec *s, int *kept)
{
    struct gen_tensor *t = &g->t[g->n];
    t->rows = rows, t->cols = cols;
    t->type = kind != MATRIX ? GGML_F32 : type;
    t->mean = kind == NORM ? 1.0f : 0.0f;
    t->std = kind == NORM ? 0.05f : kind == BIAS ? 0.2f : 0.02f;
    t->scale = scale;
    t->values = kind == FACTORS ? g->rope_freqs : NULL;
    *kept += kind == MATRIX && !s->preset && t->type != s->type;
    uint64_t seed = s->seed * 0x100000001b3ull + (uint64_t)g->n;
    t->seed = splitmix(&seed);
    uint64_t ne[2] = {t->cols, t->rows};
    gguf_w_tensor(w, name, t->type, kind != MATRIX ? 1 : 2, ne, NULL);
    g->n++;
}

/* A matrix's type: the preset's choice for it, or s->type (f32 where its rows do not fit). */
static uint32_t matrix_type(const struct synth_spec *s, const struct quant_preset *p,
                            enum quant_tensor_kind kind, int layer, uint64_t cols)
{
    if (!p) return convert_matrix_type(s->type, cols);
    return quant_preset_type(p, kind, layer, s->layers, s->heads / s->kv_heads, cols);
}

/* Every tensor in execution order (rope_freqs first, as llama.cpp's converter writes it):
 * embedding, each layer's, final norm, classifier. */
static int add_tensors(struct gguf_writer *w, struct gen *g, const struct model_config *c,
                       const struct synth_spec *s, const struct quant_preset *p)
{
    const uint64_t D = (uint64_t)c->dim, H = (uint64_t)c->hidden_dim, KV = (uint64_t)c->kv_dim,
                   Q = (uint64_t)c->q_dim, HD = (uint64_t)c->head_dim, V = (uint64_t)c->vocab_size;
    const float out_scale = s->output_scale > 0 ? s->output_scale : 1.0f,
                qk = s->qk_scale > 0 ? s->qk_scale : 1.0f;
    int kept = 0;
    if (c->rope_freqs)
        add_tensor(w, g, "rope_freqs.weight", 1, HD / 2, FACTORS, 1, GGML_F32, s, &kept);
    /* tied: the embedding is the classifier, and llama-quantize types it as one */
    add_tensor(w, g, "token_embd.weight", V, D, MATRIX, 1,
               matrix_type(s, p, s->tied ? QT_OUTPUT : QT_TOKEN_EMBD, 0, D), s, &kept);
    for (int l = 0; l < s->layers; l++) {
        const struct {
            const char *name;
            uint64_t rows, cols;
            int kind, present;
            float scale;
            enum quant_tensor_kind qt; /* matrices only */
        } ts[] = {
            {"attn_norm.weight", 1, D, NORM, 1, 1, QT_ATTN_Q},
            {"attn_q.weight", Q, D, MATRIX, 1, qk, QT_ATTN_Q},
            {"attn_k.weight", KV, D, MATRIX, 1, qk, QT_ATTN_K},
            {"attn_v.weight", KV, D, MATRIX, 1, 1, QT_ATTN_V},
            {"attn_q.bias", 1, Q, BIAS, c->qkv_bias, 1, QT_ATTN_Q},
            {"attn_k.bias", 1, KV, BIAS, c->qkv_bias, 1, QT_ATTN_Q},
            {"attn_v.bias", 1, KV, BIAS, c->qkv_bias, 1, QT_ATTN_Q},
            {"attn_q_norm.weight", 1, HD, NORM, c->qk_norm, 1, QT_ATTN_Q},
            {"attn_k_norm.weight", 1, HD, NORM, c->qk_norm, 1, QT_ATTN_Q},
            {"attn_output.weight", D, Q, MATRIX, 1, 1, QT_ATTN_OUTPUT},
            {"ffn_norm.weight", 1, D, NORM, 1, 1, QT_ATTN_Q},
            {"ffn_gate.weight", H, D, MATRIX, 1, 1, QT_FFN_GATE},
            {"ffn_down.weight", D, H, MATRIX, 1, 1, QT_FFN_DOWN},
            {"ffn_up.weight", H, D, MATRIX, 1, 1, QT_FFN_UP},
        };
        for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
            if (!ts[i].present) continue;
            char nm[64];
            snprintf(nm, sizeof nm, "blk.%d.%s", l, ts[i].name);
            uint32_t type =
                ts[i].kind == MATRIX ? matrix_type(s, p, ts[i].qt, l, ts[i].cols) : GGML_F32;
            add_tensor(w, g, nm, ts[i].rows, ts[i].cols, ts[i].kind, ts[i].scale, type, s, &kept);
        }
    }
    /* tied: scaling the embedding would scale the input too, so the final norm takes it */
    add_tensor(w, g, "output_norm.weight", 1, D, NORM, s->tied ? out_scale : 1, GGML_F32, s, &kept);
    if (!s->tied)
        add_tensor(w, g, "output.weight", V, D, MATRIX, out_scale,
                   matrix_type(s, p, QT_OUTPUT, 0, D), s, &kept);
    return kept;
}

/* Write through path.tmp, renamed only when complete. */
static int write_file(const char *path, struct gguf_writer *w, char *err)
{
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    int rc = f ? gguf_writer_write(w, f, err) : errmsg_set(err, "%s: cannot create", tmp);
    if (f && fclose(f) != 0 && rc == 0) rc = errmsg_set(err, "%s: write failed", tmp);
    if (rc == 0 && rename(tmp, path) != 0) rc = errmsg_set(err, "%s: rename failed", path);
    if (rc < 0) unlink(tmp);
    return rc;
}

int synth_gguf_write(const char *path, const struct synth_spec *spec, char *err)
{
    struct synth_spec sv = *spec;
    const struct synth_spec *s = &sv;
    const struct quant_preset *p = NULL;
    if (s->preset && !(p = quant_preset_find(s->preset)))
        return errmsg_set(err, "preset %s is not one of %s", s->preset, quant_preset_list());
    struct gguf_writer *w = gguf_writer_new();
    if (!w) return errmsg_set(err, "out of memory");
    /* a real vocabulary first: its size is the model's */
    if (s->vocab_json) {
        struct vocab_json_opts o = {.tokenizer = s->vocab_json,
                                    .tokenizer_config = s->vocab_config};
        struct vocab_json_info info;
        if (vocab_json_put(w, &o, &info, err) < 0) {
            gguf_writer_free(w);
            return -1;
        }
        sv.vocab = info.n_vocab;
    }
    struct model_config c = config_of(s);
    char name[64];
    snprintf(name, sizeof name, "synth-%s-%s", s->name, p ? p->name : ggml_type_name(s->type));
    if ((p ? convert_put_config_ftype(w, &c, p->file_type, name)
           : convert_put_config(w, &c, s->type, name)) < 0) {
        gguf_writer_free(w);
        return errmsg_set(err, "out of memory");
    }
    if (!s->vocab_json) {
        struct tokenizer tok;
        if (load_vocab(s, &tok, err) < 0) {
            gguf_writer_free(w);
            return -1;
        }
        int rc = convert_put_tokenizer(w, &tok);
        tokenizer_free(&tok);
        if (rc < 0) {
            gguf_writer_free(w);
            return errmsg_set(err, "out of memory");
        }
    }

    const int max_t = 4 + 14 * s->layers;
    struct gen g = {calloc((size_t)max_t, sizeof *g.t), 0,
                    s->threads < 1             ? 1
                    : s->threads > MAX_THREADS ? MAX_THREADS
                                               : s->threads,
                    c.rope_freqs ? llama31_rope_freqs(c.rope_theta, c.head_dim) : NULL};
    if (!g.t || (c.rope_freqs && !g.rope_freqs)) {
        free(g.t);
        gguf_writer_free(w);
        return errmsg_set(err, "out of memory");
    }
    int kept = add_tensors(w, &g, &c, s, p);
    if (kept && s->warn_as)
        fprintf(stderr,
                "%s: %d matrices kept in f32 (rows not a multiple of %s's block "
                "of %d)\n",
                s->warn_as, kept, ggml_type_name(s->type), ggml_block_elems(s->type));
    gguf_writer_set_fill(w, fill, &g);
    int rc = write_file(path, w, err);
    gguf_writer_free(w);
    free(g.t);
    free(g.rope_freqs);
    return rc;
}
