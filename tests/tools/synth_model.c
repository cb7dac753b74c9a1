/* synth_model: write a complete llama GGUF with random weights, for tests and benchmarks.
 *
 *   build/tools/synth_model --shape stories15M|stories110M|tinyllama|tiny-gqa|D,H,L,NH,NKV,V,S
 *       --type f32|f16|bf16|q8_0|q4_0|q4_k --seed S -o OUT.gguf
 *       [--tokenizer ../shared/models/tokenizer.bin] [--tied|--untied] [--threads N]
 *
 * Weights are deterministic in the seed (each tensor has its own stream, so they do not depend on
 * the order they are generated in): matrices ~ N(0, 0.02) (an Irwin-Hall approximation), norm
 * weights ~ 1 + N(0, 0.05), so activations stay in a sane range through many layers. Matrices
 * whose rows are not a multiple of the type's block stay f32 (as `strata convert` does).
 * Without --tokenizer the vocabulary is synthetic: <unk>, <s>, </s>, the 256 <0xNN> byte tokens,
 * printable ASCII, " x" and letter pairs, so the file is a complete model the tokenizer accepts.
 * Tensors are generated one at a time while the file is written (a 1.1B f32 model needs one
 * tensor's memory, not the model's), rows split over all CPUs; the bytes do not depend on the
 * number of CPUs. */
#include "os/common/errmsg.h"
#include "os/runtime/log.h"
#include "serving/engine/convert.h"
#include "serving/engine/quant.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const struct shape {
    const char *name;
    int dim, hidden, layers, heads, kv_heads, vocab, seq;
    int tied;
} shapes[] = {
    {"stories15M", 288, 768, 6, 6, 6, 32000, 256, 1},
    {"stories110M", 768, 2048, 12, 12, 12, 32000, 1024, 1},
    {"tinyllama", 2048, 5632, 22, 32, 4, 32000, 2048, 0},
    /* small, grouped-query, every row a multiple of 256 so that every type applies */
    {"tiny-gqa", 256, 512, 2, 8, 2, 512, 256, 0},
};

struct gen_tensor {
    uint64_t rows, cols;
    uint32_t type;
    int is_norm;
    uint64_t seed;
};

struct gen {
    struct gen_tensor *t;
    int n;
    int threads;
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
        for (uint64_t i = 0; i < t->cols; i++)
            row[i] = t->is_norm ? 1.0f + 0.05f * gauss(&s) : 0.02f * gauss(&s);
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

static int usage(void)
{
    fprintf(stderr, "usage: synth_model --shape stories15M|stories110M|tinyllama|tiny-gqa|"
                    "D,H,L,NH,NKV,V,S --type f32|f16|bf16|q8_0|q4_0|q4_k --seed S -o OUT.gguf "
                    "[--tokenizer TOK.bin] [--tied|--untied] [--threads N]\n");
    return 2;
}

int main(int argc, char **argv)
{
    struct shape sh = {0};
    const char *out = NULL, *tok_path = NULL;
    uint32_t type = GGML_F32;
    uint64_t seed = 1;
    int tied = -1, have_shape = 0, threads = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--shape") && v) {
            i++;
            for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++)
                if (!strcmp(v, shapes[k].name)) sh = shapes[k], have_shape = 1;
            if (!have_shape) {
                if (sscanf(v, "%d,%d,%d,%d,%d,%d,%d", &sh.dim, &sh.hidden, &sh.layers, &sh.heads,
                           &sh.kv_heads, &sh.vocab, &sh.seq) != 7) {
                    fprintf(stderr, "synth_model: bad shape '%s'\n", v);
                    return usage();
                }
                sh.name = "custom";
                sh.tied = 1;
                have_shape = 1;
            }
        } else if (!strcmp(a, "--type") && v) {
            if (convert_parse_type(argv[++i], &type) < 0) return usage();
        } else if (!strcmp(a, "--seed") && v)
            seed = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(a, "-o") && v)
            out = argv[++i];
        else if (!strcmp(a, "--tokenizer") && v)
            tok_path = argv[++i];
        else if (!strcmp(a, "--threads") && v)
            threads = atoi(argv[++i]);
        else if (!strcmp(a, "--tied"))
            tied = 1;
        else if (!strcmp(a, "--untied"))
            tied = 0;
        else
            return usage();
    }
    if (!have_shape || !out) return usage();
    if (tied >= 0) sh.tied = tied;
    if (sh.dim <= 0 || sh.hidden <= 0 || sh.layers <= 0 || sh.layers > MODEL_MAX_LAYERS ||
        sh.heads <= 0 || sh.kv_heads <= 0 || sh.vocab < 3 || sh.seq <= 0 || sh.dim % sh.heads ||
        sh.heads % sh.kv_heads || (sh.dim / sh.heads) % 2) {
        fprintf(stderr, "synth_model: inconsistent shape %d,%d,%d,%d,%d,%d,%d\n", sh.dim, sh.hidden,
                sh.layers, sh.heads, sh.kv_heads, sh.vocab, sh.seq);
        return 2;
    }
    struct model_config c = {
        .dim = sh.dim,
        .hidden_dim = sh.hidden,
        .n_layers = sh.layers,
        .n_heads = sh.heads,
        .n_kv_heads = sh.kv_heads,
        .head_dim = sh.dim / sh.heads,
        .kv_dim = sh.dim / sh.heads * sh.kv_heads,
        .vocab_size = sh.vocab,
        .seq_len = sh.seq,
        .norm_eps = 1e-5f,
        .rope_theta = 10000.0f,
    };
    char err[ERRMSG_LEN];
    uint8_t *tok_img;
    size_t tok_size;
    if (tok_path) {
        if (convert_read_file(tok_path, &tok_img, &tok_size, err) < 0) {
            fprintf(stderr, "synth_model: %s\n", err);
            return 1;
        }
    } else
        tok_img = synth_vocab(sh.vocab, &tok_size);
    struct tokenizer tok;
    if (tokenizer_from_llama2c(&tok, tok_img, tok_size, sh.vocab, err) < 0) {
        fprintf(stderr, "synth_model: %s: %s\n", tok_path ? tok_path : "synthetic vocabulary", err);
        return 1;
    }
    free(tok_img);

    struct gguf_writer *w = gguf_writer_new();
    char name[64];
    snprintf(name, sizeof name, "synth-%s-%s", sh.name, ggml_type_name(type));
    if (convert_put_config(w, &c, type, name) < 0 || convert_put_tokenizer(w, &tok) < 0) {
        fprintf(stderr, "synth_model: out of memory\n");
        return 1;
    }
    tokenizer_free(&tok);

    const int max_t = 3 + 9 * sh.layers;
    long cpus = threads > 0 ? threads : sysconf(_SC_NPROCESSORS_ONLN);
    struct gen g = {calloc((size_t)max_t, sizeof *g.t), 0,
                    cpus < 1             ? 1
                    : cpus > MAX_THREADS ? MAX_THREADS
                                         : (int)cpus};
    const uint64_t D = (uint64_t)c.dim, H = (uint64_t)c.hidden_dim, KV = (uint64_t)c.kv_dim,
                   V = (uint64_t)c.vocab_size;
    int kept = 0;
#define ADD(nm, r, cl, norm)                                                                       \
    do {                                                                                           \
        struct gen_tensor *t_ = &g.t[g.n];                                                         \
        t_->rows = (r), t_->cols = (cl), t_->is_norm = (norm);                                     \
        t_->type = (norm) ? GGML_F32 : convert_matrix_type(type, t_->cols);                        \
        kept += !(norm) && t_->type != type;                                                       \
        uint64_t s_ = seed * 0x100000001b3ull + (uint64_t)g.n;                                     \
        t_->seed = splitmix(&s_);                                                                  \
        uint64_t ne_[2] = {t_->cols, t_->rows};                                                    \
        gguf_w_tensor(w, nm, t_->type, (norm) ? 1 : 2, ne_, NULL);                                 \
        g.n++;                                                                                     \
    } while (0)
    ADD("token_embd.weight", V, D, 0);
    for (int l = 0; l < sh.layers; l++) {
        const char *k[9] = {"attn_norm", "attn_q",   "attn_k",   "attn_v", "attn_output",
                            "ffn_norm",  "ffn_gate", "ffn_down", "ffn_up"};
        const uint64_t rows[9] = {1, D, KV, KV, D, 1, H, D, H},
                       cols[9] = {D, D, D, D, D, D, D, H, D};
        for (int i = 0; i < 9; i++) {
            char nm[64];
            snprintf(nm, sizeof nm, "blk.%d.%s.weight", l, k[i]);
            ADD(nm, rows[i], cols[i], i == 0 || i == 5);
        }
    }
    ADD("output_norm.weight", 1, D, 1);
    if (!sh.tied) ADD("output.weight", V, D, 0);
#undef ADD
    if (kept)
        fprintf(stderr,
                "synth_model: %d matrices kept in f32 (rows not a multiple of %s's block "
                "of %d)\n",
                kept, ggml_type_name(type), ggml_block_elems(type));
    gguf_writer_set_fill(w, fill, &g);
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", out);
    FILE *f = fopen(tmp, "wb");
    int rc = f ? gguf_writer_write(w, f, err) : errmsg_set(err, "%s: cannot create", tmp);
    if (f && fclose(f) != 0 && rc == 0) rc = errmsg_set(err, "%s: write failed", tmp);
    if (rc == 0 && rename(tmp, out) != 0) rc = errmsg_set(err, "%s: rename failed", out);
    if (rc < 0) {
        unlink(tmp);
        fprintf(stderr, "synth_model: %s\n", err);
    }
    gguf_writer_free(w);
    free(g.t);
    return rc < 0 ? 1 : 0;
}
