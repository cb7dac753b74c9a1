/* vocab_gguf: a vocabulary-only GGUF from a real tokenizer, for tests and for checking Strata's
 * tokenizers against llama.cpp's (llama-tokenize loads such a file with its vocabulary only).
 *
 *   build/tools/vocab_gguf -o OUT.gguf TOKENIZER.json [--config tokenizer_config.json]
 *       [--model-config config.json] [--pre NAME] [--vocab-size N]
 *   build/tools/vocab_gguf -o OUT.gguf --llama2c tokenizer.bin
 *
 * The first form converts a Hugging Face tokenizer.json or a Mistral tekken file as llama.cpp's
 * converter would (tests/synth/vocab_json.h says what is written); the second writes a llama2.c
 * tokenizer.bin as `strata convert` does (SentencePiece, real scores). The file has a minimal
 * llama header (general.architecture and the hyperparameters llama.cpp reads) and no tensors. */
#include "os/common/errmsg.h"
#include "serving/engine/convert.h"
#include "serving/engine/tokenizer.h"
#include "tests/synth/vocab_json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int usage(void)
{
    fprintf(stderr, "usage: vocab_gguf -o OUT.gguf TOKENIZER.json [--config tokenizer_config.json] "
                    "[--model-config config.json] [--pre NAME] [--vocab-size N]\n"
                    "       vocab_gguf -o OUT.gguf --llama2c tokenizer.bin\n");
    return 2;
}

/* What llama.cpp reads of a llama model before its vocabulary. */
static int put_header(struct gguf_writer *w, int n_vocab, const char *name)
{
    int e = 0;
    e |= gguf_w_str(w, "general.architecture", "llama");
    e |= gguf_w_str(w, "general.name", name);
    e |= gguf_w_u32(w, "llama.vocab_size", (uint32_t)n_vocab);
    e |= gguf_w_u32(w, "llama.context_length", 4096);
    e |= gguf_w_u32(w, "llama.embedding_length", 256);
    e |= gguf_w_u32(w, "llama.block_count", 1);
    e |= gguf_w_u32(w, "llama.feed_forward_length", 512);
    e |= gguf_w_u32(w, "llama.attention.head_count", 4);
    e |= gguf_w_u32(w, "llama.attention.head_count_kv", 4);
    e |= gguf_w_u32(w, "llama.rope.dimension_count", 64);
    e |= gguf_w_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    return e;
}

int main(int argc, char **argv)
{
    struct vocab_json_opts o = {0};
    const char *out = NULL, *llama2c = NULL;
    char err[ERRMSG_LEN];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-o") && v)
            out = v, i++;
        else if (!strcmp(a, "--config") && v)
            o.tokenizer_config = v, i++;
        else if (!strcmp(a, "--model-config") && v)
            o.model_config = v, i++;
        else if (!strcmp(a, "--pre") && v)
            o.pre = v, i++;
        else if (!strcmp(a, "--vocab-size") && v)
            o.vocab_size = atoi(v), i++;
        else if (!strcmp(a, "--llama2c") && v)
            llama2c = v, i++;
        else if (a[0] != '-' && !o.tokenizer)
            o.tokenizer = a;
        else
            return usage();
    }
    if (!out || !!o.tokenizer == !!llama2c) return usage();
    struct gguf_writer *w = gguf_writer_new();
    int rc;
    if (llama2c) {
        uint8_t *buf;
        size_t n;
        struct tokenizer t;
        rc = convert_read_file(llama2c, &buf, &n, err);
        if (rc == 0) {
            rc = tokenizer_from_llama2c(&t, buf, n, 0, err);
            free(buf);
            if (rc == 0) {
                rc = put_header(w, t.vocab_size, "vocab-llama-spm") || convert_put_tokenizer(w, &t)
                         ? errmsg_set(err, "out of memory")
                         : 0;
                tokenizer_free(&t);
            }
        }
    } else {
        struct vocab_json_info info;
        rc = vocab_json_put(w, &o, &info, err);
        if (rc == 0) {
            char name[64];
            snprintf(name, sizeof name, "vocab-%s", info.pre);
            if (put_header(w, info.n_vocab, name)) rc = errmsg_set(err, "out of memory");
        }
    }
    FILE *f = rc == 0 ? fopen(out, "wb") : NULL;
    if (rc == 0 && !f) rc = errmsg_set(err, "%s: cannot create", out);
    if (rc == 0) rc = gguf_writer_write(w, f, err);
    if (f && fclose(f) != 0 && rc == 0) rc = errmsg_set(err, "%s: write failed", out);
    gguf_writer_free(w);
    if (rc < 0) {
        fprintf(stderr, "vocab_gguf: %s\n", err);
        return 1;
    }
    return 0;
}
