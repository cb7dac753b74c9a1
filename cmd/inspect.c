/* strata inspect: what a GGUF holds and how Strata would lay it out: config, tokenizer, the
 * per-layer spans (in the weight image and in the file), and with -v every key and tensor. */
#include "os/common/errmsg.h"
#include "cmd/commands.h"
#include "cmd/options.h"
#include "serving/engine/model.h"
#include "serving/engine/tokenizer.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* A string from the file, at most 80 bytes, with control bytes shown as '?' (never sent raw to a
 * terminal). */
static void print_str(struct gguf_str s)
{
    uint64_t n = s.len < 80 ? s.len : 80;
    for (uint64_t i = 0; i < n; i++) putchar((unsigned char)s.p[i] < 0x20 ? '?' : s.p[i]);
    if (s.len > n) printf("...");
}

static void print_kv(const struct gguf_kv *kv)
{
    printf("  ");
    print_str(kv->key);
    printf(" (%s", gguf_vtype_name(kv->type));
    switch (kv->type) {
    case GGUF_UINT8:
    case GGUF_UINT16:
    case GGUF_UINT32:
    case GGUF_UINT64:
    case GGUF_BOOL:
        printf(") = %llu\n", (unsigned long long)kv->v.u);
        break;
    case GGUF_INT8:
    case GGUF_INT16:
    case GGUF_INT32:
    case GGUF_INT64:
        printf(") = %lld\n", (long long)kv->v.i);
        break;
    case GGUF_FLOAT32:
    case GGUF_FLOAT64:
        printf(") = %g\n", kv->v.f);
        break;
    case GGUF_STRING:
        printf(") = \"");
        print_str(kv->v.s);
        printf("\"\n");
        break;
    default:
        printf(" of %llu %s)\n", (unsigned long long)kv->v.arr.n, gguf_vtype_name(kv->v.arr.type));
    }
}

static int run_inspect(int argc, char **argv)
{
    int verbose = 0;
    const char *path = NULL;
    const struct opt table[] = {
        {"-v", OPT_FLAG, &verbose, 0, 0, NULL, NULL},
        {"", OPT_STR, &path, 0, 0, NULL, "MODEL.gguf"},
    };
    char err[ERRMSG_LEN];
    int bad = opts_parse(table, 2, argc, argv, err);
    if (bad || !path) {
        if (bad) fprintf(stderr, "strata inspect: %s\n", err);
        fprintf(stderr, "usage: strata inspect [-v] MODEL.gguf\n");
        return 2;
    }
    /* Mapped, not read: only the header and metadata pages are touched. */
    int fd = open(path, O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0) {
        fprintf(stderr, "strata inspect: %s: %s\n", path, strerror(errno));
        if (fd >= 0) close(fd);
        return 1;
    }
    size_t size = (size_t)st.st_size;
    void *buf = size ? mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
    close(fd);
    if (buf == MAP_FAILED) {
        fprintf(stderr, "strata inspect: %s: mmap: %s\n", path, strerror(errno));
        return 1;
    }
    struct gguf g;
    if (gguf_parse(&g, buf, size, err) < 0) {
        fprintf(stderr, "strata inspect: %s: %s\n", path, err);
        if (buf) munmap(buf, size);
        return 1;
    }
    printf("%s: GGUF v%u, %zu bytes, %llu keys, %llu tensors, alignment %llu, data at %llu\n", path,
           g.version, size, (unsigned long long)g.n_kv, (unsigned long long)g.n_tensors,
           (unsigned long long)g.alignment, (unsigned long long)g.data_offset);
    if (verbose) {
        for (uint64_t i = 0; i < g.n_kv; i++) print_kv(&g.kv[i]);
        for (uint64_t i = 0; i < g.n_tensors; i++) {
            const struct gguf_tensor *t = &g.tensors[i];
            printf("  tensor ");
            print_str(t->name);
            printf(" %s [", ggml_type_name(t->type));
            for (uint32_t d = 0; d < t->n_dims; d++)
                printf("%s%llu", d ? ", " : "", (unsigned long long)t->ne[d]);
            printf("] at %llu, %llu bytes\n", (unsigned long long)t->offset,
                   (unsigned long long)t->nbytes);
        }
    }
    int rc = 0;
    struct model m;
    if (model_plan(&m, &g, path, err) < 0) {
        fprintf(stderr, "strata inspect: %s\n", err);
        rc = 1;
    } else {
        const struct model_config *c = &m.cfg;
        printf("%s: dim %d, hidden %d, layers %d, heads %d (kv %d, head dim %d), vocab %d, "
               "context %d, rms eps %g, rope theta %g%s%s%s%s, %s output\n",
               model_arch_name(c->arch), c->dim, c->hidden_dim, c->n_layers, c->n_heads,
               c->n_kv_heads, c->head_dim, c->vocab_size, c->seq_len, (double)c->norm_eps,
               (double)c->rope_theta, c->rope_style == ROPE_HALVES ? " (neox)" : "",
               c->rope_freqs ? ", rope_freqs" : "", c->qkv_bias ? ", q/k/v biases" : "",
               c->qk_norm ? ", q/k norms" : "", m.tied_output ? "tied" : "separate");
        printf("weights: %s embedding, %s attention, %s ffn gate/up, %s ffn down, %s output; "
               "image %.1f MiB in %d spans; file %s execution order\n",
               ggml_type_name(m.token_embd.type), ggml_type_name(m.layers[0].wq.type),
               ggml_type_name(m.layers[0].w_gate.type), ggml_type_name(m.layers[0].w_down.type),
               ggml_type_name(m.output.type), (double)m.image_size / 1048576.0, m.n_spans,
               m.file_in_order ? "in" : "NOT in");
        for (int s = 0; s < m.n_spans; s++)
            if (verbose || s < 2 || s >= m.n_spans - 2)
                printf("  span %d (%s): image [%llu, +%llu), file [%llu, +%llu)\n", s,
                       s == 0               ? "embedding"
                       : s == m.n_spans - 1 ? "head"
                                            : "layer",
                       (unsigned long long)m.spans[s].offset, (unsigned long long)m.spans[s].size,
                       (unsigned long long)m.file_spans[s].offset,
                       (unsigned long long)m.file_spans[s].size);
            else if (s == 2)
                printf("  ... (-v for every span)\n");
        model_free(&m);
    }
    struct tokenizer t;
    if (tokenizer_from_gguf(&t, &g, err) < 0) {
        fprintf(stderr, "strata inspect: %s: %s\n", path, err);
        rc = 1;
    } else {
        int bytes = 0;
        for (int b = 0; b < 256; b++) bytes += t.byte_ids[b] >= 0;
        if (t.model == TOK_SPM)
            printf("tokenizer: llama, %d tokens, bos %d, eos %d, %d byte tokens\n", t.vocab_size,
                   t.bos_id, t.eos_id, bytes);
        else
            printf("tokenizer: gpt2 (byte-level BPE), %d tokens, bos %d, eos %d, %d "
                   "end-of-generation tokens, %d special tokens\n",
                   t.vocab_size, t.bos_id, t.eos_id, t.n_eog, t.n_special);
        tokenizer_free(&t);
    }
    gguf_free(&g);
    if (buf) munmap(buf, size);
    return rc;
}

const struct command cmd_inspect = {"inspect", run_inspect,
                                    "inspect [-v] MODEL.gguf (config, tokenizer, per-layer spans)"};
