/* options: every subcommand's command line, parsed from one table per command.
 *
 * An entry names a flag ("--port", "-m"), what it holds and where it goes. Numbers are checked
 * whole and against their range; a flag that takes a value also accepts "--flag=value"; a
 * repeated list flag (OPT_LIST) appends. opts_parse() stops at the first problem with one line in
 * err that names the flag and the reason:
 *   "--port: '70000' is not a number in [0, 65535]"
 *   "unknown option '--prot'"      "--host needs a value"
 * Operands (arguments not starting with '-') go, in order, to the entries named "" ("positional").
 * Defaults are whatever the destinations hold before the call. */
#ifndef STRATA_OPTIONS_H
#define STRATA_OPTIONS_H

#include <stdio.h>

enum opt_kind {
    OPT_FLAG,   /* int, set to 1; takes no value */
    OPT_STR,    /* const char *, points into argv */
    OPT_INT,    /* int in [lo, hi] */
    OPT_LONG,   /* long in [lo, hi] */
    OPT_DOUBLE, /* double in [lo, hi] */
    OPT_LIST,   /* struct opt_list: every occurrence appended (at most OPT_LIST_MAX) */
    OPT_PARSE,  /* parse(value, dst, err) decides (e.g. --kv-type f16|f32) */
    OPT_REFUSE, /* an option this binary is built without: refused, help is the reason (not in the
                   usage text; cmd/test_hooks.h) */
};

#define OPT_LIST_MAX 16
struct opt_list {
    const char *v[OPT_LIST_MAX];
    int n;
};

struct opt {
    const char *name;
    enum opt_kind kind;
    void *dst;
    double lo, hi;
    int (*parse)(const char *value, void *dst, char *err); /* OPT_PARSE: 0 or -1 with err */
    const char *help; /* "N", "ADDR", ...: the value's name in the usage line (NULL: none) */
};

/* OPT_PARSE for --kv-type: f16|f32 into an int (enum kv_type). */
int opts_kv_type(const char *value, void *dst, char *err);
/* OPT_PARSE for --attn: exact|ggml-fa into an int (enum attn_mode, fwd_kernels.h). */
int opts_attn(const char *value, void *dst, char *err);

/* Parse argv[1..argc-1] against table[0..n-1]. 0 on success; -1 with err on the first problem. */
int opts_parse(const struct opt *table, int n, int argc, char **argv, char *err);
/* "  [--port N] [--host ADDR] ..." wrapped at 100 columns, for a command's usage text. */
void opts_usage(FILE *f, const char *cmd, const struct opt *table, int n);

#endif
