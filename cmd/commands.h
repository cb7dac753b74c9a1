/* commands: the subcommands of the one `strata` binary, listed once, here.
 *
 * Each command is a file in cmd/ that defines `const struct command cmd_NAME` (its name, its entry
 * point and a one-line usage); STRATA_COMMANDS below is the only list of them, and cmd/main.c
 * builds its table from it. Adding a command: a new file plus one word here. An entry point
 * returns the process exit status: 0 success, 1 runtime failure, 2 usage error. */
#ifndef STRATA_COMMANDS_H
#define STRATA_COMMANDS_H

struct command {
    const char *name;
    int (*run)(int argc, char **argv); /* argv[0] is the command's name */
    const char *usage;                 /* "NAME [options] (what it does)" */
};

/* The appliance's binary is built without the simulator (STRATA_NO_SIM): it would bring SimGrid. */
#ifdef STRATA_NO_SIM
#define STRATA_SIM_COMMAND(X)
#else
#define STRATA_SIM_COMMAND(X) X(sim)
#endif

#define STRATA_COMMANDS(X)                                                                         \
    X(generate)                                                                                    \
    X(serve) X(node) X(convert) X(inspect) X(tokenize) X(update) X(cluster) STRATA_SIM_COMMAND(X)

#define STRATA_DECLARE_COMMAND(name) extern const struct command cmd_##name;
STRATA_COMMANDS(STRATA_DECLARE_COMMAND)
#undef STRATA_DECLARE_COMMAND

#endif
