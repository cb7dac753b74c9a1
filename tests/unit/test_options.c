/* options: every kind of value, ranges, "--flag=value", lists, and the error lines. */
#include "cmd/options.h"

#include "os/common/errmsg.h"
#include "serving/engine/kv_cache.h"
#include "tests/unit/check.h"

struct o {
    const char *s;
    int i, flag, kv;
    long l;
    double d;
    struct opt_list list;
};

static int table(struct o *o, struct opt *t)
{
    const struct opt all[] = {
        {"-s", OPT_STR, &o->s, 0, 0, NULL, "S"},
        {"--int", OPT_INT, &o->i, -5, 70000, NULL, "N"},
        {"--flag", OPT_FLAG, &o->flag, 0, 0, NULL, NULL},
        {"--long", OPT_LONG, &o->l, 0, 1e12, NULL, "N"},
        {"--dbl", OPT_DOUBLE, &o->d, 0, 1, NULL, "X"},
        {"--peer", OPT_LIST, &o->list, 0, 0, NULL, "ADDR"},
        {"--kv-type", OPT_PARSE, &o->kv, 0, 0, opts_kv_type, "f16|f32"},
    };
    memcpy(t, all, sizeof all);
    return (int)(sizeof all / sizeof all[0]);
}

static int parse(struct o *o, char *err, int argc, char **argv)
{
    struct opt t[16];
    memset(o, 0, sizeof *o);
    o->i = 7;
    return opts_parse(t, table(o, t), argc, argv, err);
}

#define ARGV(...)                                                                                  \
    (sizeof((char *[]){"cmd", __VA_ARGS__}) / sizeof(char *)), (char *[])                          \
    {                                                                                              \
        "cmd", __VA_ARGS__                                                                         \
    }

TEST(every_kind)
{
    struct o o;
    char err[ERRMSG_LEN];
    CHECKF(parse(&o, err,
                 ARGV("-s", "x", "--int", "-5", "--flag", "--long=1000000000000", "--dbl", "0.25",
                      "--peer", "a:1", "--peer=b:2", "--kv-type", "f32")) == 0,
           "%s", err);
    CHECK_STR(o.s, "x");
    CHECK_EQ_INT(o.i, -5);
    CHECK_EQ_INT(o.flag, 1);
    CHECK(o.l == 1000000000000L);
    CHECK(o.d == 0.25);
    CHECK_EQ_INT(o.list.n, 2);
    CHECK_STR(o.list.v[1], "b:2");
    CHECK_EQ_INT(o.kv, KV_F32);
}

TEST(defaults_stay_when_absent)
{
    struct o o;
    char err[ERRMSG_LEN];
    CHECK(parse(&o, err, 1, (char *[]){"cmd"}) == 0);
    CHECK_EQ_INT(o.i, 7);
    CHECK(o.s == NULL);
}

TEST(errors_name_the_flag_and_the_reason)
{
    struct o o;
    char err[ERRMSG_LEN];
    CHECK(parse(&o, err, ARGV("--int", "70001")) == -1);
    CHECK_STR(err, "--int: '70001' is not a number in [-5, 70000]");
    CHECK(parse(&o, err, ARGV("--int", "12abc")) == -1);
    CHECK_STR(err, "--int: '12abc' is not a number in [-5, 70000]");
    CHECK(parse(&o, err, ARGV("--int", "1.5")) == -1);
    CHECK_STR(err, "--int: '1.5' is not a whole number");
    CHECK(parse(&o, err, ARGV("--dbl", "nan")) == -1);
    CHECK(parse(&o, err, ARGV("--int")) == -1);
    CHECK_STR(err, "--int needs a value");
    CHECK(parse(&o, err, ARGV("--flag=1")) == -1);
    CHECK_STR(err, "--flag takes no value");
    CHECK(parse(&o, err, ARGV("--prot", "1")) == -1);
    CHECK_STR(err, "unknown option '--prot'");
    CHECK(parse(&o, err, ARGV("--kv-type", "f8")) == -1);
    CHECK_STR(err, "--kv-type f8: want f16 or f32");
}

TEST(list_is_bounded)
{
    struct o o;
    char err[ERRMSG_LEN];
    char *argv[2 + 2 * (OPT_LIST_MAX + 1)];
    int argc = 0;
    argv[argc++] = "cmd";
    for (int i = 0; i <= OPT_LIST_MAX; i++) argv[argc++] = "--peer", argv[argc++] = "a:1";
    CHECK(parse(&o, err, argc, argv) == -1);
    CHECK_STR(err, "--peer: at most 16 values");
}

TEST(operands_fill_the_positional_entries)
{
    const char *in = NULL, *out = NULL;
    int flag = 0;
    const struct opt t[] = {
        {"", OPT_STR, &in, 0, 0, NULL, "IN"},
        {"--flag", OPT_FLAG, &flag, 0, 0, NULL, NULL},
        {"", OPT_STR, &out, 0, 0, NULL, "OUT"},
    };
    char err[ERRMSG_LEN];
    CHECK(opts_parse(t, 3, 4, (char *[]){"cmd", "a", "--flag", "b"}, err) == 0);
    CHECK_STR(in, "a");
    CHECK_STR(out, "b");
    CHECK(flag == 1);
    CHECK(opts_parse(t, 3, 4, (char *[]){"cmd", "a", "b", "c"}, err) == -1);
    CHECK_STR(err, "unexpected argument 'c'");
}

/* An option the binary is built without (cmd/test_hooks.h): refused with its reason, flag or
 * not, "=value" or not, and left out of the usage text. */
TEST(refused_entries_say_why_and_stay_out_of_usage)
{
    int flag = 0;
    const struct opt t[] = {
        {"--flag", OPT_FLAG, &flag, 0, 0, NULL, NULL},
        {"--hook", OPT_REFUSE, NULL, 0, 0, NULL, "not in this build"},
    };
    char err[ERRMSG_LEN];
    CHECK(opts_parse(t, 2, 3, (char *[]){"cmd", "--flag", "--hook"}, err) == -1);
    CHECK_STR(err, "--hook: not in this build");
    CHECK(opts_parse(t, 2, 2, (char *[]){"cmd", "--hook=1"}, err) == -1);
    CHECK_STR(err, "--hook: not in this build");
    char buf[256] = "";
    FILE *f = fmemopen(buf, sizeof buf - 1, "w");
    opts_usage(f, "x", t, 2);
    fclose(f);
    CHECK_STR(buf, "usage: strata x [--flag]\n");
}

int main(void)
{
    check_run("every_kind", every_kind);
    check_run("defaults_stay_when_absent", defaults_stay_when_absent);
    check_run("errors_name_the_flag_and_the_reason", errors_name_the_flag_and_the_reason);
    check_run("list_is_bounded", list_is_bounded);
    check_run("operands_fill_the_positional_entries", operands_fill_the_positional_entries);
    check_run("refused_entries_say_why_and_stay_out_of_usage",
              refused_entries_say_why_and_stay_out_of_usage);
    return check_failed_count != 0;
}
