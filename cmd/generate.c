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

static int run_generate(int argc, char **argv)
{
    const char *model = NULL, *prompt = "";
    double temp = 1.0, top_p = 1.0, min_p = 0, seed = 0;
    int n_gen = 128, top_k = 0, threads = 0, chunk = 64, verbose = 0, kv_type = KV_DEFAULT;
    const struct opt opt_table[] = {
        {"-m", OPT_STR, &model, 0, 0, NULL, "MODEL.gguf"},
        {"-p", OPT_STR, &prompt, 0, 0, NULL, "PROMPT"},
        {"-n", OPT_INT, &n_gen, 0, 1e9, NULL, "N"},
        {"--temp", OPT_DOUBLE, &temp, 0, 100, NULL, "T"},
        {"--top-p", OPT_DOUBLE, &top_p, 0, 1, NULL, "P"},
        {"--top-k", OPT_INT, &top_k, 0, 1e9, NULL, "K"},
        {"--min-p", OPT_DOUBLE, &min_p, 0, 1, NULL, "M"},
        {"--seed", OPT_DOUBLE, &seed, 0, 1.8e19, NULL, "S"},
        {"--threads", OPT_INT, &threads, 1, 1024, NULL, "N"},
        {"--batch", OPT_INT, &chunk, 1, 65536, NULL, "N"},
        {"--kv-type", OPT_PARSE, &kv_type, 0, 0, opts_kv_type, "f16|f32"},
        {"-v", OPT_FLAG, &verbose, 0, 0, NULL, NULL},
    };
    const int n_opts = (int)(sizeof opt_table / sizeof opt_table[0]);
    char err[ERRMSG_LEN];
    if (opts_parse(opt_table, n_opts, argc, argv, err)) {
        fprintf(stderr, "strata generate: %s\n", err);
        opts_usage(stderr, "generate", opt_table, n_opts);
        return 2;
    }
    if (!model) {
        fprintf(stderr, "strata generate: -m MODEL.gguf is required\n");
        opts_usage(stderr, "generate", opt_table, n_opts);
        return 2;
    }
    log_set_quiet(!verbose);

    struct loaded_model *lm = calloc(1, sizeof *lm);
    if (!lm) return 1;
    struct loader_opts opts = {
        .limits = {.max_seqs = 1,
                   .max_tokens = (int)chunk,
                   .threads = (int)threads,
                   .kv_type = kv_type},
        .verbose = verbose,
    };
    if (loader_open(lm, model, &opts, err)) {
        fprintf(stderr, "strata generate: %s\n", err);
        free(lm);
        return 1;
    }
    struct engine *e = &lm->engine;
    const struct model_config *c = &lm->model.cfg;
    int ctx = e->lim.ctx, rc = 1;

    int *tokens = malloc(sizeof(int) * ((size_t)ctx + 1));
    int *pos = malloc(sizeof(int) * (size_t)e->lim.max_tokens);
    const int **blocks = malloc(sizeof(int *) * (size_t)e->lim.max_tokens);
    int *table = malloc(sizeof(int) * (size_t)kv_blocks_for(&e->kv, ctx));
    float *logits = malloc(sizeof(float) * (size_t)c->vocab_size);
    struct sampler smp = {0};
    if (!tokens || !pos || !blocks || !table || !logits) goto out;

    int n_prompt = 0;
    if (tokenizer_encode(&lm->tok, prompt, strlen(prompt), 1, tokens, ctx, &n_prompt, err)) {
        fprintf(stderr, "strata generate: prompt: %s\n", err);
        goto out;
    }
    for (int i = 0; i < kv_blocks_for(&e->kv, ctx); i++) table[i] = kv_block_alloc(&e->kv);
    struct sampler_params sp = {.temperature = (float)temp,
                                .top_p = (float)top_p,
                                .top_k = (int)top_k,
                                .min_p = (float)min_p,
                                .seed = (uint64_t)seed};
    if (sampler_init(&smp, &sp, c->vocab_size, err)) {
        fprintf(stderr, "strata generate: %s\n", err);
        goto out;
    }
    fputs(prompt, stdout);
    fflush(stdout);

    // prefill: the prompt in chunks; the last chunk's last token gives the first new token
    double t0 = clock_now();
    int done = 0, next = -1;
    struct sampler *smpp = &smp;
    while (done < n_prompt) {
        int n = n_prompt - done < e->lim.max_tokens ? n_prompt - done : e->lim.max_tokens;
        for (int i = 0; i < n; i++) pos[i] = done + i, blocks[i] = table;
        int last = n - 1, final = done + n == n_prompt;
        struct batch b = {.n = n,
                          .token = tokens + done,
                          .pos = pos,
                          .blocks = blocks,
                          .n_logits = final,
                          .logit_rows = &last};
        int r = final ? engine_forward_sample(e, &b, &smpp, &next, logits)
                      : engine_forward(e, &b, logits);
        if (r) {
            fprintf(stderr, "strata generate: forward pass failed at position %d\n", done);
            goto out;
        }
        done += n;
    }
    double t1 = clock_now();

    // decode: one token per step; sampling happens where the logits are (CPU or GPU)
    int n_out = 0, cur = n_prompt;
    char scratch[8];
    int prev = tokens[n_prompt - 1];
    while (n_out < (int)n_gen && cur < ctx) {
        if (next == lm->tok.eos_id || next == lm->tok.bos_id) break;
        size_t len;
        const char *piece = tokenizer_decode(&lm->tok, prev, next, scratch, &len);
        fwrite(piece, 1, len, stdout);
        fflush(stdout);
        n_out++;
        tokens[cur] = next;
        prev = next;
        if (n_out == (int)n_gen || cur + 1 >= ctx) break;
        int zero = 0, p = cur;
        const int *bt = table;
        struct batch b = {.n = 1,
                          .token = &tokens[cur],
                          .pos = &p,
                          .blocks = &bt,
                          .n_logits = 1,
                          .logit_rows = &zero};
        if (engine_forward_sample(e, &b, &smpp, &next, logits)) {
            fprintf(stderr, "strata generate: forward pass failed at position %d\n", cur);
            goto out;
        }
        cur++;
    }
    double t2 = clock_now();
    fputc('\n', stdout);
    fflush(stdout);
    fprintf(stderr,
            "prefill: %d tokens in %.3f s (%.1f tok/s); decode: %d tokens in %.3f s "
            "(%.1f tok/s); %s, %s, %d threads, %s KV cache\n",
            n_prompt, t1 - t0, n_prompt / (t1 - t0 + 1e-12), n_out, t2 - t1,
            n_out / (t2 - t1 + 1e-12), e->be->name, matmul_isa(), e->lim.threads,
            kv_type_name(e->kv.type));
    rc = 0;
out:
    sampler_free(&smp);
    free(tokens), free(pos), free(blocks), free(table), free(logits);
    loader_close(lm);
    free(lm);
    return rc;
}

const struct command cmd_generate = {
    "generate", run_generate,
    "generate -m MODEL.gguf -p PROMPT [options]  (a prompt's continuation on stdout)"};
