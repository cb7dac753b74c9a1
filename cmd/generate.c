/* strata generate: load a model, complete one prompt, print the prompt and the completion to
 * stdout and the speeds to stderr. Prefill runs the prompt in batches of up to --batch tokens
 * (matrix x matrix); decode runs one token per step. Stops after -n tokens, at the end of the
 * context, or when the model emits EOS (or BOS, which llama2.c-trained models use between
 * stories). */
#include "os/common/errmsg.h"
#include "os/runtime/clock.h"
#include "os/runtime/log.h"
#include "cmd/commands.h"
#include "serving/engine/loader.h"
#include "serving/engine/sampler.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int usage(void)
{
    fprintf(stderr, "usage: strata generate -m MODEL.gguf -p PROMPT [-n N] [--temp T] [--top-p P]\n"
                    "         [--top-k K] [--min-p M] [--seed S] [--threads N] [--batch N]\n"
                    "         [--kv-type f16|f32] [-v]\n");
    return 2;
}

static int parse_num(const char *flag, const char *s, double lo, double hi, double *out)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "strata generate: %s: '%s' is not a number in [%g, %g]\n", flag, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

static int run_generate(int argc, char **argv)
{
    const char *model = NULL, *prompt = "";
    double n_gen = 128, temp = 1.0, top_p = 1.0, top_k = 0, min_p = 0, seed = 0, threads = 0,
           chunk = 64;
    int verbose = 0, kv_type = KV_DEFAULT;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int ok = 0;
        /* Numeric options: flag, destination, range. */
        const struct {
            const char *flag;
            double *var, lo, hi;
        } nums[] = {
            {"-n", &n_gen, 0, 1e9},           {"--temp", &temp, 0, 100},
            {"--top-p", &top_p, 0, 1},        {"--top-k", &top_k, 0, 1e9},
            {"--min-p", &min_p, 0, 1},        {"--seed", &seed, 0, 1.8e19},
            {"--threads", &threads, 1, 1024}, {"--batch", &chunk, 1, 65536},
        };
        if (!strcmp(a, "-v"))
            verbose = ok = 1;
        else if (!strcmp(a, "-m") && v)
            model = v, i++, ok = 1;
        else if (!strcmp(a, "-p") && v)
            prompt = v, i++, ok = 1;
        else if (!strcmp(a, "--kv-type") && v) {
            if ((kv_type = kv_type_parse(v)) == KV_DEFAULT) {
                fprintf(stderr, "strata generate: --kv-type %s: want f16 or f32\n", v);
                return usage();
            }
            i++, ok = 1;
        }
        for (size_t k = 0; !ok && k < sizeof nums / sizeof nums[0]; k++) {
            if (strcmp(a, nums[k].flag)) continue;
            if (!v || parse_num(a, v, nums[k].lo, nums[k].hi, nums[k].var)) return usage();
            i++, ok = 1;
        }
        if (!ok) {
            fprintf(stderr, "strata generate: unknown or incomplete option '%s'\n", a);
            return usage();
        }
    }
    if (!model) return usage();
    log_set_quiet(!verbose);

    char err[ERRMSG_LEN];
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
    "generate -m MODEL.gguf -p PROMPT [-n N --temp T --top-p P --top-k K --min-p M --seed S "
    "--threads N --batch N --kv-type f16|f32 -v]"};
