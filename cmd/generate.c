/* strata generate: load a model, complete one prompt, print the prompt and the completion to
 * stdout and the speeds to stderr. Prefill runs the prompt in batches of up to --batch tokens
 * (matrix x matrix); decode runs one token per step. Stops after -n tokens, at the end of the
 * context, or when the model emits EOS (or BOS, which llama2.c-trained models use between
 * stories). */
#include "os/common/errmsg.h"
#include "os/runtime/clock.h"
#include "os/runtime/log.h"
#include "cmd/commands.h"
#include "cmd/options.h"
#include "serving/engine/loader.h"
#include "serving/engine/sampler.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct generate_opts {
    const char *model, *prompt;
    double temp, top_p, min_p, seed;
    int n_gen, top_k, threads, chunk, verbose, kv_type, attn, trace_top;
};

/* One sequence's run: the model, its buffers (allocated once), the sampler. */
struct generation {
    struct loaded_model *lm;
    struct engine *e;
    int ctx;
    int *tokens;        /* [ctx + 1] prompt, then generated */
    int *pos;           /* [max_tokens] positions of a prefill chunk */
    const int **blocks; /* [max_tokens] block table per token (all the same) */
    int *table;         /* the sequence's KV block table */
    float *logits;      /* [vocab] */
    struct sampler smp;
    int trace_top, step; /* --trace-top N: greedy on the host, each step's N best on stderr */
};

static int parse_opts(int argc, char **argv, struct generate_opts *o)
{
    *o = (struct generate_opts){
        .prompt = "", .temp = 1.0, .top_p = 1.0, .n_gen = 128, .chunk = 64, .kv_type = KV_DEFAULT};
    const struct opt t[] = {
        {"-m", OPT_STR, &o->model, 0, 0, NULL, "MODEL.gguf"},
        {"-p", OPT_STR, &o->prompt, 0, 0, NULL, "PROMPT"},
        {"-n", OPT_INT, &o->n_gen, 0, 1e9, NULL, "N"},
        {"--temp", OPT_DOUBLE, &o->temp, 0, 100, NULL, "T"},
        {"--top-p", OPT_DOUBLE, &o->top_p, 0, 1, NULL, "P"},
        {"--top-k", OPT_INT, &o->top_k, 0, 1e9, NULL, "K"},
        {"--min-p", OPT_DOUBLE, &o->min_p, 0, 1, NULL, "M"},
        {"--seed", OPT_DOUBLE, &o->seed, 0, 1.8e19, NULL, "S"},
        {"--threads", OPT_INT, &o->threads, 1, 1024, NULL, "N"},
        {"--batch", OPT_INT, &o->chunk, 1, 65536, NULL, "N"},
        {"--kv-type", OPT_PARSE, &o->kv_type, 0, 0, opts_kv_type, "f16|f32"},
        {"--attn", OPT_PARSE, &o->attn, 0, 0, opts_attn, "exact|ggml-fa"},
        {"-v", OPT_FLAG, &o->verbose, 0, 0, NULL, NULL},
        {"--trace-top", OPT_INT, &o->trace_top, 1, 20, NULL, "N"},
    };
    const int n = (int)(sizeof t / sizeof t[0]);
    char err[ERRMSG_LEN];
    if (opts_parse(t, n, argc, argv, err) ||
        (!o->model && errmsg_set(err, "-m MODEL.gguf is required")) ||
        (o->trace_top && o->temp != 0 && errmsg_set(err, "--trace-top is greedy: give --temp 0"))) {
        fprintf(stderr, "strata generate: %s\n", err);
        opts_usage(stderr, "generate", t, n);
        return -1;
    }
    return 0;
}

static int generation_open(struct generation *g, const struct generate_opts *o, char *err)
{
    memset(g, 0, sizeof *g);
    g->trace_top = o->trace_top;
    if (!(g->lm = calloc(1, sizeof *g->lm))) return errmsg_set(err, "out of memory");
    struct loader_opts lo = {
        .limits = {.max_seqs = 1,
                   .max_tokens = o->chunk,
                   .threads = o->threads,
                   .kv_type = o->kv_type,
                   .attn = o->attn},
        .verbose = o->verbose,
    };
    if (loader_open(g->lm, o->model, &lo, err)) {
        free(g->lm);
        g->lm = NULL;
        return -1;
    }
    g->e = &g->lm->engine;
    g->ctx = g->e->lim.ctx;
    int n_blocks = kv_blocks_for(&g->e->kv, g->ctx);
    g->tokens = malloc(sizeof(int) * ((size_t)g->ctx + 1));
    g->pos = malloc(sizeof(int) * (size_t)g->e->lim.max_tokens);
    g->blocks = malloc(sizeof(int *) * (size_t)g->e->lim.max_tokens);
    g->table = malloc(sizeof(int) * (size_t)n_blocks);
    g->logits = malloc(sizeof(float) * (size_t)g->lm->model.cfg.vocab_size);
    if (!g->tokens || !g->pos || !g->blocks || !g->table || !g->logits)
        return errmsg_set(err, "out of memory");
    for (int i = 0; i < n_blocks; i++) g->table[i] = kv_block_alloc(&g->e->kv);
    struct sampler_params sp = {.temperature = (float)o->temp,
                                .top_p = (float)o->top_p,
                                .top_k = o->top_k,
                                .min_p = (float)o->min_p,
                                .seed = (uint64_t)o->seed};
    return sampler_init(&g->smp, &sp, g->lm->model.cfg.vocab_size, err);
}

/* The step's logits, then the next token: sampled where the logits are, or with --trace-top N the
 * argmax (lowest id on ties, as the sampler's greedy) on the host, printing
 * "top STEP ID:LOGIT ..." (the N best, best first) to stderr, so that two runs (CPU, GPU) that
 * part can say how close each one's choice was in the other's logits. */
static int step_next(struct generation *g, const struct batch *b, int *next)
{
    struct sampler *smp = &g->smp;
    if (!g->trace_top) return engine_forward_sample(g->e, b, &smp, next, g->logits);
    if (engine_forward(g->e, b, g->logits)) return -1;
    int V = g->lm->model.cfg.vocab_size, best[20], nb = 0;
    for (int i = 0; i < V; i++) { /* insertion into the N best; earlier ids win ties */
        int k = nb;
        if (nb == g->trace_top) {
            if (!(g->logits[i] > g->logits[best[nb - 1]])) continue;
            k = nb - 1; /* the last of the N leaves */
        } else {
            nb++;
        }
        while (k > 0 && g->logits[i] > g->logits[best[k - 1]]) best[k] = best[k - 1], k--;
        best[k] = i;
    }
    fprintf(stderr, "top %d", g->step++);
    for (int k = 0; k < nb; k++) fprintf(stderr, " %d:%.9g", best[k], g->logits[best[k]]);
    fputc('\n', stderr);
    *next = best[0];
    return 0;
}

static void generation_close(struct generation *g)
{
    sampler_free(&g->smp);
    free(g->tokens), free(g->pos), free(g->blocks), free(g->table), free(g->logits);
    if (g->lm) loader_close(g->lm);
    free(g->lm);
}

/* The prompt in chunks of up to max_tokens; the last chunk's last token gives the first new
 * token, *next. */
static int prefill(struct generation *g, int n_prompt, int *next, char *err)
{
    struct engine *e = g->e;
    for (int done = 0; done < n_prompt;) {
        int n = n_prompt - done < e->lim.max_tokens ? n_prompt - done : e->lim.max_tokens;
        for (int i = 0; i < n; i++) g->pos[i] = done + i, g->blocks[i] = g->table;
        int last = n - 1, final = done + n == n_prompt;
        struct batch b = {.n = n,
                          .token = g->tokens + done,
                          .pos = g->pos,
                          .blocks = g->blocks,
                          .n_logits = final,
                          .logit_rows = &last};
        if (final ? step_next(g, &b, next) : engine_forward(e, &b, g->logits))
            return errmsg_set(err, "position %d: %s", done, engine_error(e));
        done += n;
    }
    return 0;
}

/* One token per step from `next` on, each written to stdout as it comes; sampling happens where
 * the logits are (CPU or GPU). Stops after n_gen tokens, at the context's end, at an
 * end-of-generation token (EOS, <|eot_id|>, ...) or, in llama2.c-era vocabularies, BOS. */
static int decode(struct generation *g, int n_prompt, int next, int n_gen, int *n_out, char *err)
{
    const struct tokenizer *tok = &g->lm->tok;
    char scratch[8];
    int cur = n_prompt, prev = g->tokens[n_prompt - 1];
    *n_out = 0;
    while (*n_out < n_gen && cur < g->ctx) {
        if (tokenizer_is_eog(tok, next) || (tok->model == TOK_SPM && next == tok->bos_id)) break;
        size_t len;
        const char *piece = tokenizer_decode(tok, prev, next, scratch, &len);
        fwrite(piece, 1, len, stdout);
        fflush(stdout);
        ++*n_out;
        g->tokens[cur] = next;
        prev = next;
        if (*n_out == n_gen || cur + 1 >= g->ctx) break;
        int zero = 0, p = cur;
        const int *bt = g->table;
        struct batch b = {.n = 1,
                          .token = &g->tokens[cur],
                          .pos = &p,
                          .blocks = &bt,
                          .n_logits = 1,
                          .logit_rows = &zero};
        if (step_next(g, &b, &next))
            return errmsg_set(err, "position %d: %s", cur, engine_error(g->e));
        cur++;
    }
    return 0;
}

static int run_generate(int argc, char **argv)
{
    struct generate_opts o;
    if (parse_opts(argc, argv, &o)) return 2;
    log_set_quiet(!o.verbose);
    char err[ERRMSG_LEN];
    struct generation g;
    int n_prompt = 0, next = -1, n_out = 0, rc = 1;
    if (generation_open(&g, &o, err)) goto out;
    if (tokenizer_encode(&g.lm->tok, o.prompt, strlen(o.prompt), 1, g.tokens, g.ctx, &n_prompt,
                         err)) {
        errmsg_prefix(err, "prompt: ");
        goto out;
    }
    fputs(o.prompt, stdout);
    fflush(stdout);
    double t0 = clock_now();
    if (prefill(&g, n_prompt, &next, err)) goto out;
    double t1 = clock_now();
    if (decode(&g, n_prompt, next, o.n_gen, &n_out, err)) goto out;
    double t2 = clock_now();
    fputc('\n', stdout);
    fflush(stdout);
    fprintf(stderr,
            "prefill: %d tokens in %.3f s (%.1f tok/s); decode: %d tokens in %.3f s "
            "(%.1f tok/s); %s, %s, %d threads, %s KV cache\n",
            n_prompt, t1 - t0, n_prompt / (t1 - t0 + 1e-12), n_out, t2 - t1,
            n_out / (t2 - t1 + 1e-12), g.e->be->name, matmul_isa(), g.e->lim.threads,
            kv_type_name(g.e->kv.type));
    rc = 0;
out:
    if (rc) fprintf(stderr, "strata generate: %s\n", err);
    generation_close(&g);
    return rc;
}

const struct command cmd_generate = {
    "generate", run_generate,
    "generate -m MODEL.gguf -p PROMPT [options]  (a prompt's continuation on stdout)"};
