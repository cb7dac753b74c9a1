/* check: the unit-test harness. Each test program is a list of TEST() functions run by main();
 * every test prints one line, "ok - name" or "not ok - name: file:line: what failed", which
 * scripts/run-tests.sh counts. A test stops at its first failed CHECK. SKIP() prints
 * "skip - name: reason" and is counted as skipped, never as passed. */
#ifndef STRATA_CHECK_H
#define STRATA_CHECK_H

#include <math.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static jmp_buf check_jmp;
static int check_failed_count, check_state; /* 0 ok, 1 failed, 2 skipped */
static char check_msg[1024];

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            snprintf(check_msg, sizeof check_msg, "%s:%d: %s", __FILE__, __LINE__, #cond);         \
            check_state = 1;                                                                       \
            longjmp(check_jmp, 1);                                                                 \
        }                                                                                          \
    } while (0)

#define CHECKF(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            int o_ = snprintf(check_msg, sizeof check_msg, "%s:%d: ", __FILE__, __LINE__);         \
            snprintf(check_msg + o_, sizeof check_msg - o_, __VA_ARGS__);                          \
            check_state = 1;                                                                       \
            longjmp(check_jmp, 1);                                                                 \
        }                                                                                          \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                                         \
    CHECKF((long long)(a) == (long long)(b), "%s == %lld, expected %s == %lld", #a,                \
           (long long)(a), #b, (long long)(b))

#define CHECK_STR(a, b) CHECKF(strcmp((a), (b)) == 0, "%s is \"%s\", expected \"%s\"", #a, (a), (b))

#define SKIP(...)                                                                                  \
    do {                                                                                           \
        snprintf(check_msg, sizeof check_msg, __VA_ARGS__);                                        \
        check_state = 2;                                                                           \
        longjmp(check_jmp, 1);                                                                     \
    } while (0)

#define TEST(name) static void name(void)

static inline void check_run(const char *name, void (*fn)(void))
{
    check_state = 0;
    if (setjmp(check_jmp) == 0) fn();
    if (check_state == 0)
        printf("ok - %s\n", name);
    else if (check_state == 2)
        printf("skip - %s: %s\n", name, check_msg);
    else {
        printf("not ok - %s: %s\n", name, check_msg);
        check_failed_count++;
    }
    fflush(stdout);
}

#define RUN(fn)      check_run(#fn, fn)
#define CHECK_DONE() return check_failed_count ? 1 : 0

/* ../shared relative to the repository root; tests run from the root. */
static inline const char *check_shared(void)
{
    const char *s = getenv("STRATA_SHARED");
    return s ? s : "../shared";
}

#endif
