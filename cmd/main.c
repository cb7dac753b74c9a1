/* strata: one binary for every role. `strata <command> ...`; `strata help` lists them. The
 * commands are listed once, in cmd/commands.h. */
#include "cmd/commands.h"

#include <stdio.h>
#include <string.h>

static int run_version(int argc, char **argv)
{
    (void)argc, (void)argv;
    printf("strata 0.1\n");
    return 0;
}

static const struct command cmd_version = {"version", run_version, "version"};

#define STRATA_COMMAND_ENTRY(name) &cmd_##name,
static const struct command *const commands[] = {&cmd_version,
                                                 STRATA_COMMANDS(STRATA_COMMAND_ENTRY)};

static void usage(FILE *f)
{
    fprintf(f, "usage: strata <command> [options]   (an unknown option prints the command's "
               "options)\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  strata %s\n", commands[i]->usage);
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "help") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i]->name)) return commands[i]->run(argc - 1, argv + 1);
    fprintf(stderr, "strata: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
