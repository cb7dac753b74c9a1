/* The step model online (serving/sched/step_model.h: struct step_online) and its cache on local
 * storage (step_cache.h): exact data gives back the model; one step scales the prior; the error
 * estimate rises and falls; one descheduled step cannot throw a fitted model off; the cache file
 * round-trips, every damaged byte and every truncation of it is refused as corrupt, another
 * model's or hardware's as foreign, each with one reason. No timing. */
#include "check.h"
#include "serving/sched/step_cache.h"
#include "serving/sched/step_model.h"
#include "serving/sched/step_prior.h"

#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const struct step_sample shapes[] = {{1, 1, 0},  {9, 9, 0},   {16, 16, 0}, {65, 1, 0},
                                            {80, 9, 0}, {129, 1, 0}, {256, 1, 0}};
#define N_SHAPES        7
#define CHECK_DIR(a, b) CHECKF(strcmp((a), (b)) == 0, "%.200s, expected %s", (a), (b))

static double truth(int t, int s)
{
    return 2e-4 * t + 5e-5 * s + 3e-3;
}

static int close_rel(double x, double want, double tol)
{
    return fabs(x - want) <= tol * fabs(want);
}

TEST(exact_steps_give_back_the_model)
{
    struct step_online o;
    step_online_init(&o, &(struct step_model){.a = 1e-5, .c = 1e-5, .corr = 1}, 1, 0);
    step_online_shapes(&o, shapes, N_SHAPES);
    for (int rep = 0; rep < 3; rep++)
        for (int i = 0; i < N_SHAPES; i++)
            step_online_observe(&o, shapes[i].tokens, shapes[i].seqs,
                                truth(shapes[i].tokens, shapes[i].seqs));
    CHECKF(close_rel(o.m.a, 2e-4, 1e-6) && close_rel(o.m.b, 5e-5, 1e-5) &&
               close_rel(o.m.c, 3e-3, 1e-6),
           "fit %g %g %g", o.m.a, o.m.b, o.m.c);
    CHECK_EQ_INT(o.steps, 3 * N_SHAPES);
    CHECKF(step_online_fit_error(&o) < 1e-6, "fit error %g", step_online_fit_error(&o));
    /* one shape 50% slower than the rest say: the fit's error is no longer nothing */
    for (int rep = 0; rep < 8; rep++) step_online_observe(&o, 16, 16, 1.5 * truth(16, 16));
    CHECKF(step_online_fit_error(&o) > 0.05 && step_online_fit_error(&o) < 0.5, "fit error %g",
           step_online_fit_error(&o));
    CHECK_EQ_INT(step_online_seen(&o, 256, 1), 3);
    CHECK_EQ_INT(step_online_seen(&o, 300, 1), 3); /* the same log2 bucket */
    CHECK_EQ_INT(step_online_seen(&o, 2, 1), 0);
}

TEST(one_step_scales_the_prior)
{
    /* the prior has the right shape but is 10x too fast: one decode step fixes every shape */
    struct step_online o;
    struct step_model prior = {.a = 2e-5, .b = 5e-6, .c = 3e-4, .corr = 1};
    step_online_init(&o, &prior, 1, 0);
    step_online_shapes(&o, shapes, N_SHAPES);
    step_online_observe(&o, 1, 1, truth(1, 1));
    for (int i = 0; i < N_SHAPES; i++) {
        double p = step_model_predict(&o.m, shapes[i].tokens, shapes[i].seqs);
        CHECKF(close_rel(p, truth(shapes[i].tokens, shapes[i].seqs), 1e-6), "%d x %d: %g, want %g",
               shapes[i].tokens, shapes[i].seqs, p, truth(shapes[i].tokens, shapes[i].seqs));
    }
}

TEST(a_corrected_prior_folds_its_factor)
{
    struct step_online o;
    step_online_init(&o, &(struct step_model){.a = 1e-4, .c = 1e-3, .corr = 2}, 0.5, 0);
    CHECK(o.m.corr == 1 && close_rel(o.m.a, 2e-4, 1e-12) && close_rel(o.m.c, 2e-3, 1e-12));
    CHECK(o.err == 0.5);
}

TEST(error_estimate_rises_and_falls)
{
    struct step_online o;
    step_online_init(&o, &(struct step_model){.a = 2e-4, .b = 5e-5, .c = 3e-3, .corr = 1}, 1, 0);
    step_online_shapes(&o, shapes, N_SHAPES);
    for (int i = 0; i < 30; i++) step_online_observe(&o, 1, 1, truth(1, 1));
    CHECKF(o.err < 0.01, "err %g after 30 exact steps", o.err);
    double before = o.err;
    step_online_observe(&o, 64, 1, 3 * truth(64, 1)); /* a step 3x slower than predicted */
    CHECKF(o.err > before + 0.3, "err %g after a step 3x slower", o.err);
    for (int i = 0; i < 30; i++) step_online_observe(&o, 64, 1, 3 * truth(64, 1));
    CHECKF(o.err < 0.05, "err %g once the slower steps are learnt", o.err);
    double p = step_model_predict(&o.m, 64, 1);
    CHECKF(close_rel(p, 3 * truth(64, 1), 0.01), "%g, want %g", p, 3 * truth(64, 1));
}

TEST(one_descheduled_step_is_clipped)
{
    struct step_online o;
    step_online_init(&o, &(struct step_model){.a = 2e-4, .b = 5e-5, .c = 3e-3, .corr = 1}, 0, 0);
    step_online_shapes(&o, shapes, N_SHAPES);
    for (int rep = 0; rep < 3; rep++)
        for (int i = 0; i < N_SHAPES; i++)
            step_online_observe(&o, shapes[i].tokens, shapes[i].seqs,
                                truth(shapes[i].tokens, shapes[i].seqs));
    step_online_observe(&o, 1, 1, 1000 * truth(1, 1)); /* descheduled for a long while */
    double p = step_model_predict(&o.m, 1, 1);
    CHECKF(p < 2 * truth(1, 1), "one 1000x step moved a decode's prediction to %g (was %g)", p,
           truth(1, 1));
    CHECK(o.err <= 4.0); /* the excess is capped too */
}

TEST(fixed_model_never_moves)
{
    struct step_online o;
    struct step_model m = {.a = 1.0, .c = 0.001, .corr = 1};
    step_online_init(&o, &m, 0, 1);
    for (int i = 0; i < 10; i++) step_online_observe(&o, 4, 1, 1e-6);
    CHECK(o.m.a == 1.0 && o.m.c == 0.001 && o.err == 0);
    CHECK_EQ_INT(o.steps, 10);
}

TEST(nonsense_steps_are_ignored)
{
    struct step_online o;
    step_online_init(&o, &(struct step_model){.a = 1e-4, .c = 1e-3, .corr = 1}, 1, 0);
    step_online_observe(&o, 0, 1, 1e-3);
    step_online_observe(&o, 1, 0, 1e-3);
    step_online_observe(&o, 1, 1, 0);
    step_online_observe(&o, 1, 1, NAN);
    CHECK_EQ_INT(o.steps, 0);
    CHECK(o.m.a == 1e-4 && o.m.c == 1e-3);
}

/* ---------------------------------------------------------------- the cache file */

static const struct step_identity id = {
    .model = "blake2b:00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff",
    .hardware = "cpu AMD EPYC (avx2), 2 threads, kv f16"};
static const struct step_cached cached = {
    .m = {.a = 1.832e-4, .b = 5.01e-5, .c = 0.0612, .corr = 1}, .err = 0.08, .steps = 812};

TEST(cache_round_trip)
{
    char buf[4096], err[ERRMSG_LEN];
    size_t n = step_cache_encode(buf, sizeof buf, &id, &cached);
    CHECK(n > 0 && n < sizeof buf);
    struct step_cached c;
    CHECKF(step_cache_parse(buf, n, &id, &c, err) == 0, "%s", err);
    CHECK(c.m.a == cached.m.a && c.m.b == cached.m.b && c.m.c == cached.m.c && c.m.corr == 1);
    CHECK(c.err == cached.err && c.steps == cached.steps);
    CHECK_EQ_INT(step_cache_encode(buf, 40, &id, &cached), 0); /* too small: nothing */
}

TEST(cache_every_damaged_byte_is_corrupt)
{
    char buf[4096], bad[4096], err[ERRMSG_LEN];
    size_t n = step_cache_encode(buf, sizeof buf, &id, &cached);
    struct step_cached c;
    for (size_t i = 0; i < n; i++)
        for (int bit = 0; bit < 8; bit += 3) {
            memcpy(bad, buf, n);
            bad[i] ^= (char)(1 << bit);
            int rc = step_cache_parse(bad, n, &id, &c, err);
            CHECKF(rc == -1 && strstr(err, "corrupt"), "byte %zu bit %d: rc %d (%s)", i, bit, rc,
                   err);
        }
    for (size_t len = 0; len < n; len++) {
        int rc = step_cache_parse(buf, len, &id, &c, err);
        CHECKF(rc == -1 && strstr(err, "corrupt"), "%zu of %zu bytes: rc %d (%s)", len, n, rc, err);
    }
}

TEST(cache_foreign_or_newer_is_refused)
{
    char buf[4096], err[ERRMSG_LEN];
    struct step_cached c;
    size_t n = step_cache_encode(buf, sizeof buf, &id, &cached);
    struct step_identity other = id;
    other.model[10] = 'f';
    CHECK(step_cache_parse(buf, n, &other, &c, err) == -1);
    CHECKF(strstr(err, "foreign: made for model"), "%s", err);
    other = id;
    snprintf(other.hardware, sizeof other.hardware, "cpu AMD EPYC (avx2), 16 threads, kv f16");
    CHECK(step_cache_parse(buf, n, &other, &c, err) == -1);
    CHECKF(strstr(err, "foreign: made on cpu AMD EPYC (avx2), 2 threads"), "%s", err);
    /* a later format, signed as the format says (BLAKE2b-128 of the lines before "check"): not
     * read, and the reason says why */
    char body[4096];
    const char *check = strstr(buf, "check ");
    int len = snprintf(body, sizeof body, "strata-step-model 2%.*s",
                       (int)(check - strchr(buf, '\n')), strchr(buf, '\n'));
    unsigned char h[16];
    crypto_generichash(h, sizeof h, (const unsigned char *)body, (size_t)len, NULL, 0);
    len += snprintf(body + len, sizeof body - (size_t)len, "check ");
    for (int i = 0; i < 16; i++)
        len += snprintf(body + len, sizeof body - (size_t)len, "%02x", h[i]);
    len += snprintf(body + len, sizeof body - (size_t)len, "\n");
    CHECK(step_cache_parse(body, (size_t)len, &id, &c, err) == -1);
    CHECKF(strstr(err, "version 2, this build reads 1"), "%s", err);
}

TEST(cache_save_load_in_a_directory)
{
    char dir[] = "/tmp/test_step_cache.XXXXXX", err[ERRMSG_LEN], path[4200];
    CHECK(mkdtemp(dir));
    char sub[4200];
    snprintf(sub, sizeof sub, "%s/state", dir); /* made on first save */
    struct step_cached c;
    CHECK_EQ_INT(step_cache_load(sub, &id, &c, err), 0);
    CHECKF(step_cache_save(sub, &id, &cached, err) == 0, "%s", err);
    CHECKF(step_cache_load(sub, &id, &c, err) == 1, "%s", err);
    CHECK(c.m.a == cached.m.a && c.steps == cached.steps);
    /* another hardware has its own file */
    struct step_identity other = id;
    snprintf(other.hardware, sizeof other.hardware, "cuda NVIDIA H100 (avx2), 2 threads, kv f16");
    char p2[4200];
    step_cache_path(path, sizeof path, sub, &id);
    step_cache_path(p2, sizeof p2, sub, &other);
    CHECK(strcmp(path, p2) != 0 && !strncmp(path, sub, strlen(sub)));
    CHECK_EQ_INT(step_cache_load(sub, &other, &c, err), 0);
    /* a damaged file: -1, the reason names the file */
    FILE *f = fopen(path, "w");
    CHECK(f);
    fputs("strata-step-model 1\nmodel x\n", f);
    fclose(f);
    CHECK_EQ_INT(step_cache_load(sub, &id, &c, err), -1);
    CHECKF(strstr(err, path) && strstr(err, "corrupt"), "%s", err);
    unlink(path);
    rmdir(sub);
    rmdir(dir);
}

TEST(state_dir_choice)
{
    char dir[512];
    int remount = 7;
    CHECK_EQ_INT(step_state_dir("off", "/m/model.gguf", 0, dir, sizeof dir, &remount), 1);
    CHECK_EQ_INT(step_state_dir("/var/x", "/m/model.gguf", 1, dir, sizeof dir, &remount), 0);
    CHECK_DIR(dir, "/var/x");
    CHECK_EQ_INT(remount, 0);
    setenv("XDG_CACHE_HOME", "/c", 1);
    CHECK_EQ_INT(step_state_dir(NULL, "/m/model.gguf", 0, dir, sizeof dir, &remount), 0);
    CHECK_DIR(dir, "/c/strata");
    unsetenv("XDG_CACHE_HOME");
    setenv("HOME", "/h", 1);
    CHECK_EQ_INT(step_state_dir(NULL, NULL, 0, dir, sizeof dir, &remount), 0);
    CHECK_DIR(dir, "/h/.cache/strata");
    /* PID 1: only a model on its own partition (here /proc is one; a directory of /tmp, or the
     * initrd's root, is not: nothing there survives a reboot) */
    CHECK_EQ_INT(step_state_dir(NULL, "/proc/model.gguf", 1, dir, sizeof dir, &remount), 0);
    CHECK_DIR(dir, "/proc");
    CHECK_EQ_INT(remount, 1);
    char tmp[] = "/tmp/test_step_state.XXXXXX", model[64];
    CHECK(mkdtemp(tmp));
    snprintf(model, sizeof model, "%s/model.gguf", tmp);
    CHECK_EQ_INT(step_state_dir(NULL, model, 1, dir, sizeof dir, &remount), 1);
    CHECK_EQ_INT(step_state_dir(NULL, "model.gguf", 1, dir, sizeof dir, &remount), 1);
    rmdir(tmp);
}

TEST(default_prior_from_size_and_bandwidth)
{
    struct step_model m;
    step_prior_default(&m, 600e6, 6e9); /* 600 MB at 6 GB/s: 0.1 s a pass over the weights */
    CHECK(close_rel(m.c, 0.05, 1e-12) && close_rel(m.a, 0.05, 1e-12) && m.b == 0 && m.corr == 1);
    CHECK(close_rel(step_model_predict(&m, 1, 1), 0.1, 1e-12));
    step_prior_default(&m, 600e6, 0); /* not measured: a slow server's guess, 5 GB/s */
    CHECK(close_rel(step_model_predict(&m, 1, 1), 0.12, 1e-12));
}

int main(void)
{
    RUN(exact_steps_give_back_the_model);
    RUN(one_step_scales_the_prior);
    RUN(a_corrected_prior_folds_its_factor);
    RUN(error_estimate_rises_and_falls);
    RUN(one_descheduled_step_is_clipped);
    RUN(fixed_model_never_moves);
    RUN(nonsense_steps_are_ignored);
    RUN(cache_round_trip);
    RUN(cache_every_damaged_byte_is_corrupt);
    RUN(cache_foreign_or_newer_is_refused);
    RUN(cache_save_load_in_a_directory);
    RUN(state_dir_choice);
    RUN(default_prior_from_size_and_bandwidth);
    CHECK_DONE();
}
