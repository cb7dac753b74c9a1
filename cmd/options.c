#include "cmd/options.h"

#include "os/common/errmsg.h"
#include "serving/engine/fwd_kernels.h"
#include "serving/engine/kv_cache.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static const struct opt *find(const struct opt *t, int n, const char *arg, size_t len)
{
    for (int i = 0; i < n; i++)
        if (strlen(t[i].name) == len && !strncmp(t[i].name, arg, len)) return &t[i];
    return NULL;
}

static int set_number(const struct opt *o, const char *v, char *err)
{
    char *end;
    errno = 0;
    double d = strtod(v, &end);
    if (end == v || *end || errno || !(d >= o->lo && d <= o->hi)) /* NaN too */
        return errmsg_set(err, "%s: '%s' is not a number in [%.15g, %.15g]", o->name, v, o->lo,
                          o->hi);
    if (o->kind == OPT_DOUBLE) {
        *(double *)o->dst = d;
        return 0;
    }
    if (d != (double)(long)d) return errmsg_set(err, "%s: '%s' is not a whole number", o->name, v);
    if (o->kind == OPT_INT)
        *(int *)o->dst = (int)d;
    else
        *(long *)o->dst = (long)d;
    return 0;
}

static int set_value(const struct opt *o, const char *v, char *err)
{
    switch (o->kind) {
    case OPT_STR:
        *(const char **)o->dst = v;
        return 0;
    case OPT_INT:
    case OPT_LONG:
    case OPT_DOUBLE:
        return set_number(o, v, err);
    case OPT_LIST: {
        struct opt_list *l = o->dst;
        if (l->n == OPT_LIST_MAX)
            return errmsg_set(err, "%s: at most %d values", o->name, OPT_LIST_MAX);
        l->v[l->n++] = v;
        return 0;
    }
    case OPT_PARSE:
        return o->parse(v, o->dst, err);
    case OPT_FLAG:
    case OPT_REFUSE:
        break;
    }
    return errmsg_set(err, "%s takes no value", o->name);
}

/* The n_pos-th entry named "" takes operand a. */
static int positional(const struct opt *t, int n, int *n_pos, const char *a, char *err)
{
    for (int i = 0, k = 0; i < n; i++) {
        if (t[i].name[0]) continue;
        if (k++ < *n_pos) continue;
        ++*n_pos;
        return set_value(&t[i], a, err);
    }
    return errmsg_set(err, "unexpected argument '%s'", a);
}

int opts_parse(const struct opt *table, int n, int argc, char **argv, char *err)
{
    int n_pos = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *eq = strncmp(a, "--", 2) ? NULL : strchr(a, '=');
        if (a[0] != '-' || !a[1]) { /* an operand: the next positional entry ("" name) takes it */
            if (positional(table, n, &n_pos, a, err)) return -1;
            continue;
        }
        const struct opt *o = find(table, n, a, eq ? (size_t)(eq - a) : strlen(a));
        if (!o) return errmsg_set(err, "unknown option '%s'", a);
        if (o->kind == OPT_REFUSE) return errmsg_set(err, "%s: %s", o->name, o->help);
        if (o->kind == OPT_FLAG) {
            if (eq) return errmsg_set(err, "%s takes no value", o->name);
            *(int *)o->dst = 1;
            continue;
        }
        const char *v = eq ? eq + 1 : i + 1 < argc ? argv[++i] : NULL;
        if (!v) return errmsg_set(err, "%s needs a value", o->name);
        if (set_value(o, v, err)) return -1;
    }
    return 0;
}

void opts_usage(FILE *f, const char *cmd, const struct opt *table, int n)
{
    int col = fprintf(f, "usage: strata %s", cmd);
    for (int i = 0; i < n; i++) {
        if (table[i].kind == OPT_REFUSE) continue;
        char item[96];
        int len =
            snprintf(item, sizeof item, " [%s%s%s]%s", table[i].name, table[i].help ? " " : "",
                     table[i].help ? table[i].help : "", table[i].kind == OPT_LIST ? "..." : "");
        if (col + len > 100) {
            fprintf(f, "\n        ");
            col = 8;
        }
        col += fprintf(f, "%s", item);
    }
    fputc('\n', f);
}

int opts_attn(const char *v, void *dst, char *err)
{
    if ((*(int *)dst = attn_mode_parse(v)) == ATTN_DEFAULT)
        return errmsg_set(err, "--attn %s: want exact or ggml-fa", v);
    return 0;
}

int opts_kv_type(const char *v, void *dst, char *err)
{
    if ((*(int *)dst = kv_type_parse(v)) == KV_DEFAULT)
        return errmsg_set(err, "--kv-type %s: want f16 or f32", v);
    return 0;
}
