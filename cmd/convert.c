/* strata convert: llama2.c checkpoint + tokenizer.bin -> GGUF (the logic is in convert.c). */
#include "os/common/errmsg.h"
#include "cmd/commands.h"
#include "serving/engine/convert.h"

#include <stdio.h>
#include <string.h>

static int usage(void)
{
    fprintf(stderr, "usage: strata convert --tokenizer TOK.bin IN.bin OUT.gguf "
                    "[--type f32|f16|bf16|q8_0|q4_0|q4_k]\n");
    return 2;
}

static int run_convert(int argc, char **argv)
{
    const char *tok = NULL, *in = NULL, *out = NULL;
    uint32_t type = GGML_F32;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc)
            tok = argv[++i];
        else if (!strcmp(argv[i], "--type") && i + 1 < argc) {
            if (convert_parse_type(argv[++i], &type) < 0) {
                fprintf(stderr, "strata convert: unknown type '%s'\n", argv[i]);
                return usage();
            }
        } else if (argv[i][0] == '-' && argv[i][1])
            return usage();
        else if (!in)
            in = argv[i];
        else if (!out)
            out = argv[i];
        else
            return usage();
    }
    if (!tok || !in || !out) return usage();
    char err[ERRMSG_LEN];
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
