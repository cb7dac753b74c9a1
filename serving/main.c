/* strata: one binary for every role. `strata <command> ...`; `strata help` lists them. */
#include "serving/commands.h"

#include <stdio.h>
#include <string.h>

static int cmd_version(int argc, char **argv)
{
    (void)argc, (void)argv;
    printf("strata 0.1\n");
    return 0;
}

static const struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *usage;
} commands[] = {
    {"version", cmd_version, "version"},
    {"generate", cmd_generate,
     "generate -m MODEL.gguf -p PROMPT [-n N --temp T --top-p P --top-k K --min-p M --seed S "
     "--threads N --batch N --kv-type f16|f32 -v]"},
    {"node", cmd_node, "node --role source|joiner --transport tcp|dpdk|rdma ... (fabric node)"},
    {"convert", cmd_convert,
     "convert --tokenizer TOK.bin IN.bin OUT.gguf [--type f32|f16|bf16|q8_0|q4_0|q4_k]"},
    {"inspect", cmd_inspect, "inspect [-v] MODEL.gguf (config, tokenizer, per-layer spans)"},
    {"serve", cmd_serve,
     "serve -m MODEL.gguf [--host H] [--port N] [--max-batch N] [--ctx N] [--api-key KEY] ... "
     "(OpenAI-compatible server)"},
    {"update", cmd_update,
     "update [--tries N] [--esp DIR] FILE|http://PEER/PATH (new image into the inactive boot "
     "slot)"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: strata <command> [options]\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  strata %s\n", commands[i].usage);
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "help") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "strata: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
