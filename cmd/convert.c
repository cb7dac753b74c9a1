/* strata convert: llama2.c checkpoint + tokenizer.bin -> GGUF (the logic is in convert.c). */
#include "os/common/errmsg.h"
#include "cmd/commands.h"
#include "cmd/options.h"
#include "serving/engine/convert.h"

#include <stdio.h>

static int usage(void)
{
    fprintf(stderr, "usage: strata convert --tokenizer TOK.bin IN.bin OUT.gguf "
                    "[--type f32|f16|bf16|q8_0|q4_0|q4_k]\n");
    return 2;
}

static int parse_type(const char *v, void *dst, char *err)
{
    if (convert_parse_type(v, dst) < 0) return errmsg_set(err, "unknown type '%s'", v);
    return 0;
}

static int run_convert(int argc, char **argv)
{
    const char *tok = NULL, *in = NULL, *out = NULL;
    uint32_t type = GGML_F32;
    const struct opt table[] = {
        {"--tokenizer", OPT_STR, &tok, 0, 0, NULL, "TOK.bin"},
        {"--type", OPT_PARSE, &type, 0, 0, parse_type, "TYPE"},
        {"", OPT_STR, &in, 0, 0, NULL, "IN.bin"},
        {"", OPT_STR, &out, 0, 0, NULL, "OUT.gguf"},
    };
    char err[ERRMSG_LEN];
    if (opts_parse(table, (int)(sizeof table / sizeof table[0]), argc, argv, err)) {
        fprintf(stderr, "strata convert: %s\n", err);
        return usage();
    }
    if (!tok || !in || !out) return usage();
    if (convert_llama2c_files(in, tok, out, type, err) < 0) {
        fprintf(stderr, "strata convert: %s\n", err);
        return 1;
    }
    fprintf(stderr, "strata convert: wrote %s (%s)\n", out, ggml_type_name(type));
    return 0;
}

const struct command cmd_convert = {
    "convert", run_convert,
    "convert --tokenizer TOK.bin IN.bin OUT.gguf [--type f32|f16|bf16|q8_0|q4_0|q4_k]"};
