/* test_hooks: the options that make a server misbehave on purpose, for tests, in one place.
 *
 *   --test-crash segv|panic   crash once ready (the crash handler's test; panic: past it)
 *   --test-hang S             the serve loop stops S seconds after ready (the watchdog's test)
 *   --test-step-delay-us US   every step sleeps US (a slow step on a tiny model)
 *   --test-kv-fault KIND      a helper answers KV requests wrongly (cluster/coop.h)
 *   --test-refuse KIND        the executor refuses replicate or scale-up decisions
 *   --test-clock-file PATH    the wall clock moves by the offset (ms, signed) PATH holds, read
 *                             every tick: a clock jump (os/runtime/wall_clock.h) on a shared host
 *   --cluster-standby         the stand-in executor (cluster/serve_cluster.h)
 *   --test-scale-in MS        the leader forces a scale-in with hand-over every MS (and brings the
 *                             node back), instead of planning (cluster/control_leader.c)
 *
 * They exist only in a test build: this file compiled with STRATA_TEST_HOOKS, linked ahead of
 * libstrata into build/strata (the developer's and the tests' binary) and
 * build/strata-appliance-test (the image the crash, watchdog and paced-scale boot tests boot).
 * libstrata holds it compiled without, and so does build/strata-appliance, the shipped image's
 * binary: there each option is refused with the reason (TEST_HOOKS_ABSENT) and the functions
 * below do nothing, so nothing can tell the appliance to crash or hang. What the cluster's and the
 * KV hooks switch on stays in its module (serve_cluster.c's stand-in executor and refusals,
 * coop_kvserve.c's wrong answers, the scheduler's delay), behind a field only these options set.
 * tests/integration/serve_test_hooks.sh checks all of it. */
#ifndef STRATA_TEST_HOOKS_H
#define STRATA_TEST_HOOKS_H

#include "cluster/control.h"
#include "cmd/options.h"

#include <stdio.h>

#define TEST_HOOKS_ABSENT                                                                          \
    "a test hook, and this binary is built without them (build/strata and "                        \
    "build/strata-appliance-test have them)"

/* serve's hooks (the cluster's three go to struct control_cfg: standby, test_refuse,
 * test_scale_in_ms). */
struct test_hooks {
    const char *crash;      /* --test-crash: segv | panic, once ready; NULL: none */
    int hang_s;             /* --test-hang: -1 never (set it before parsing) */
    int step_delay_us;      /* --test-step-delay-us: 0 none */
    int kv_fault;           /* --test-kv-fault: enum coop_kv_fault */
    const char *clock_file; /* --test-clock-file: NULL none */
};

#define TEST_HOOKS_SERVE_N_OPTS   5
#define TEST_HOOKS_CLUSTER_N_OPTS 3

/* 1 in a test build, 0 without the hooks. */
extern const int test_hooks_built;

/* Write the hooks' entries pointing into h (or c) at t; return their count (the N_OPTS above, in
 * both builds: without the hooks the entries refuse). */
int test_hooks_serve_options(struct test_hooks *h, struct opt *t);
int test_hooks_cluster_options(struct control_cfg *c, struct opt *t);
/* The hooks' lines of serve's usage text (none without them). */
void test_hooks_usage(FILE *f);

/* The server is ready: --test-crash crashes here. */
void test_hooks_ready(const struct test_hooks *h);
/* The serve loop's tick (ready: the model serves): --test-hang stops the loop here once due;
 * --test-clock-file's offset is applied here. */
void test_hooks_tick(const struct test_hooks *h, int ready);

#endif
