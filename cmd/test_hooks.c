/* test_hooks: both builds of cmd/test_hooks.h. libstrata compiles this file as it is (no hooks);
 * the Makefile compiles it again with STRATA_TEST_HOOKS for the binaries the tests run. */
#include "cmd/test_hooks.h"

#include "cluster/coop.h"
#include "os/common/errmsg.h"
#include "os/common/small_file.h"
#include "os/runtime/clock.h"
#include "os/runtime/log.h"
#include "os/runtime/wall_clock.h"

#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef STRATA_TEST_HOOKS

const int test_hooks_built = 1;

static int parse_kv_fault(const char *v, void *dst, char *err)
{
    int f = coop_kv_fault_parse(v);
    if (f < 0)
        return errmsg_set(err, "--test-kv-fault %s: want seq, layer, short, die or refuse", v);
    *(int *)dst = f;
    return 0;
}

static int parse_test_crash(const char *v, void *dst, char *err)
{
    if (strcmp(v, "segv") && strcmp(v, "panic"))
        return errmsg_set(err, "--test-crash %s: want segv or panic", v);
    *(const char **)dst = v;
    return 0;
}

int test_hooks_serve_options(struct test_hooks *h, struct opt *t)
{
    const struct opt table[TEST_HOOKS_SERVE_N_OPTS] = {
        {"--test-step-delay-us", OPT_INT, &h->step_delay_us, 0, 1000000, NULL, "US"},
        {"--test-crash", OPT_PARSE, &h->crash, 0, 0, parse_test_crash, "segv|panic"},
        {"--test-hang", OPT_INT, &h->hang_s, 0, 3600, NULL, "S"},
        {"--test-kv-fault", OPT_PARSE, &h->kv_fault, 0, 0, parse_kv_fault,
         "seq|layer|short|die|refuse"},
        {"--test-clock-file", OPT_STR, &h->clock_file, 0, 0, NULL, "PATH"},
    };
    memcpy(t, table, sizeof table);
    return TEST_HOOKS_SERVE_N_OPTS;
}

int test_hooks_cluster_options(struct control_cfg *c, struct opt *t)
{
    const struct opt table[TEST_HOOKS_CLUSTER_N_OPTS] = {
        {"--cluster-standby", OPT_FLAG, &c->standby, 0, 0, NULL, NULL},
        {"--test-refuse", OPT_STR, &c->test_refuse, 0, 0, NULL, "replicate|scale-up"},
        {"--test-scale-in", OPT_INT, &c->test_scale_in_ms, 1, 3600000, NULL, "MS"},
    };
    memcpy(t, table, sizeof table);
    return TEST_HOOKS_CLUSTER_N_OPTS;
}

void test_hooks_usage(FILE *f)
{
    fprintf(f,
            "  tests only (cmd/test_hooks.h): --test-step-delay-us sleeps in every step;\n"
            "  --test-crash crashes once ready, --test-hang hangs the serve loop S seconds after\n"
            "  ready (boot/cmdline.md); --test-kv-fault: a helper that answers KV requests\n"
            "  wrongly; --test-refuse: the executor refuses such decisions; --cluster-standby:\n"
            "  the stand-in executor (holds the model out of its engine, moves no weights);\n"
            "  --test-clock-file: the wall clock jumps by the milliseconds the file holds;\n"
            "  --test-scale-in MS: the leader forces a scale-in with hand-over every MS\n");
}

/* segv is a crash the handlers report (os/runtime/pid1.c); panic is one they cannot, with the
 * default action restored, so the kernel kills PID 1 and panics. */
void test_hooks_ready(const struct test_hooks *h)
{
    if (!h->crash) return;
    fprintf(stderr, "strata serve: --test-crash %s: crashing on purpose\n", h->crash);
    if (!strcmp(h->crash, "panic")) signal(SIGSEGV, SIG_DFL);
    volatile uintptr_t bad = 16; /* through a variable: the compiler must not see the crash */
    *(volatile int *)bad = 1;
}

/* The offset in the clock file (a signed integer of milliseconds; none or unreadable: 0), read at
 * most every 100 ms. */
static void clock_tick(const char *path)
{
    static double last;
    double now = clock_now();
    if (now - last < 0.1) return;
    last = now;
    char buf[64];
    long long off = small_file_read(path, buf, sizeof buf, NULL) > 0 ? strtoll(buf, NULL, 10) : 0;
    if (off != wall_clock_offset_ms()) {
        log_warn("serve", "--test-clock-file: the wall clock jumps by %+lld ms (offset %+lld ms)",
                 off - (long long)wall_clock_offset_ms(), off);
        wall_clock_set_offset_ms(off);
    }
}

/* As a deadlocked loop would: the watchdog is no longer petted. */
void test_hooks_tick(const struct test_hooks *h, int ready)
{
    static time_t hang_at;
    if (h->clock_file) clock_tick(h->clock_file);
    if (h->hang_s < 0 || !ready) return;
    if (!hang_at) hang_at = time(NULL) + h->hang_s;
    if (time(NULL) >= hang_at) {
        fprintf(stderr, "strata serve: --test-hang: the serve loop stops here\n");
        for (;;) pause();
    }
}

#else /* the appliance: every hook refused, nothing done */

const int test_hooks_built = 0;

int test_hooks_serve_options(struct test_hooks *h, struct opt *t)
{
    (void)h;
    const char *names[TEST_HOOKS_SERVE_N_OPTS] = {"--test-step-delay-us", "--test-crash",
                                                  "--test-hang", "--test-kv-fault",
                                                  "--test-clock-file"};
    for (int i = 0; i < TEST_HOOKS_SERVE_N_OPTS; i++)
        t[i] = (struct opt){names[i], OPT_REFUSE, NULL, 0, 0, NULL, TEST_HOOKS_ABSENT};
    return TEST_HOOKS_SERVE_N_OPTS;
}

int test_hooks_cluster_options(struct control_cfg *c, struct opt *t)
{
    (void)c;
    const char *names[TEST_HOOKS_CLUSTER_N_OPTS] = {"--cluster-standby", "--test-refuse",
                                                    "--test-scale-in"};
    for (int i = 0; i < TEST_HOOKS_CLUSTER_N_OPTS; i++)
        t[i] = (struct opt){names[i], OPT_REFUSE, NULL, 0, 0, NULL, TEST_HOOKS_ABSENT};
    return TEST_HOOKS_CLUSTER_N_OPTS;
}

void test_hooks_usage(FILE *f)
{
    (void)f;
}

void test_hooks_ready(const struct test_hooks *h)
{
    (void)h;
}

void test_hooks_tick(const struct test_hooks *h, int ready)
{
    (void)h, (void)ready;
}

#endif
