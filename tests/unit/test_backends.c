/* test_backends: the backend interface (engine.h) and the choice among backends (backends.h),
 * with fake backends and a hand-made engine: no model, no device.
 *   - a backend call that fails leaves engine_error() naming the engine, the backend (once) and
 *     the reason, for each operation; a batch the engine refuses never reaches the backend;
 *   - backends_pick passes over a backend whose probe fails or that $STRATA_BACKEND does not
 *     name, and its line gives each reason; the last always serves;
 *   - backends_start falls back to the next when an init fails, and fails with the last one's
 *     own message when the last fails. */
#include "check.h"

#include "os/common/errmsg.h"
#include "os/runtime/log.h"
#include "serving/engine/backends.h"

static int calls; /* backend calls that reached a fake */

static int lost_embed(struct engine *e, const struct batch *b, float *x, char *err)
{
    (void)e, (void)b, (void)x;
    calls++;
    return errmsg_set(err, "device lost (embedding)");
}

/* The reason already names the backend: it is not named twice. */
static int lost_layers(struct engine *e, const struct batch *b, int l0, int l1, float *x, char *err)
{
    (void)e, (void)b, (void)x;
    calls++;
    return errmsg_set(err, "fake: layers [%d, %d): kernel timed out", l0, l1);
}

static int lost_head(struct engine *e, const struct batch *b, const float *x, float *logits,
                     char *err)
{
    (void)e, (void)b, (void)x, (void)logits;
    calls++;
    return errmsg_set(err, "device lost (head)");
}

static int lost_sample(struct engine *e, const struct batch *b, struct sampler *const *samplers,
                       int *tokens, char *err)
{
    (void)e, (void)b, (void)samplers, (void)tokens;
    calls++;
    /* "fakes: ..." starts with the name's letters but is not "fake: " */
    return errmsg_set(err, "fakes: sampler out of memory");
}

static const struct engine_backend failing = {.name = "fake",
                                              .embed = lost_embed,
                                              .layers = lost_layers,
                                              .head = lost_head,
                                              .forward_sample = lost_sample};

TEST(failed_backend_call_names_backend_and_reason)
{
    struct model_config cfg = {.n_layers = 4, .vocab_size = 100, .dim = 8};
    struct engine e = {
        .cfg = &cfg, .be = &failing, .lim = {.max_tokens = 4, .max_seqs = 2, .ctx = 16}};
    float x[4 * 8], logits[100];
    int tok[2] = {5, 7}, pos[2] = {0, 1}, rows[1] = {1}, table[1] = {0}, out[1];
    const int *blocks[2] = {table, table};
    struct batch b = {2, tok, pos, blocks, 1, rows};

    calls = 0;
    CHECK(engine_embed(&e, &b, x) == -1);
    CHECK_STR(engine_error(&e), "engine: fake: device lost (embedding)");
    CHECK(engine_layers(&e, &b, 1, 3, x) == -1);
    CHECK_STR(engine_error(&e), "engine: fake: layers [1, 3): kernel timed out");
    CHECK(engine_head(&e, &b, x, logits) == -1);
    CHECK_STR(engine_error(&e), "engine: fake: device lost (head)");
    CHECK(engine_forward(&e, &b, logits) == -1);
    CHECK_STR(engine_error(&e), "engine: fake: device lost (embedding)");
    struct sampler *smp[1] = {NULL};
    CHECK(engine_forward_sample(&e, &b, smp, out, logits) == -1);
    CHECK_STR(engine_error(&e), "engine: fake: fakes: sampler out of memory");
    CHECK_EQ_INT(calls, 5);

    /* What the engine refuses stops there, with the engine's reason. */
    int far[2] = {0, 16}, oov[2] = {5, 100};
    struct batch bad_pos = {2, tok, far, blocks, 1, rows}, bad_tok = {2, oov, pos, blocks, 1, rows};
    CHECK(engine_forward(&e, &bad_pos, logits) == -1);
    CHECK_STR(engine_error(&e), "engine: token 1 at position 16, outside the context (16)");
    CHECK(engine_embed(&e, &bad_tok, x) == -1);
    CHECK_STR(engine_error(&e), "engine: token id 100 is outside the vocabulary (100)");
    CHECK(engine_layers(&e, &b, 3, 5, x) == -1);
    CHECK_STR(engine_error(&e), "engine: layers [3, 5) of 4");
    struct batch no_logits = {2, tok, pos, blocks, 0, rows};
    CHECK(engine_head(&e, &no_logits, x, logits) == 0);
    CHECK_EQ_INT(calls, 5);
}

static int no_device(char *err)
{
    return errmsg_set(err, "no FAKE device (test)");
}

static int has_device(char *err)
{
    (void)err;
    return 0;
}

static void fake_device_name(char *name, size_t cap)
{
    snprintf(name, cap, "Fake 9000");
}

static const struct engine_backend nodev = {.name = "nodev", .probe = no_device},
                                   gpu = {.name = "gpu",
                                          .probe = has_device,
                                          .device_name = fake_device_name},
                                   last = {.name = "last"};
static const struct engine_backend *const list[] = {&nodev, &gpu, &last, NULL};

/* backends_pick(list) with $STRATA_BACKEND = want (NULL: unset): the name and the line. */
static void pick_is(const char *want, const char *name, const char *line_want)
{
    char line[ERRMSG_LEN];
    if (want)
        setenv("STRATA_BACKEND", want, 1);
    else
        unsetenv("STRATA_BACKEND");
    const struct engine_backend *be = backends_pick(list, NULL, line);
    unsetenv("STRATA_BACKEND");
    CHECK_STR(be->name, name);
    CHECK_STR(line, line_want);
}

TEST(pick_passes_over_with_reasons)
{
    pick_is(NULL, "gpu", "backend gpu (Fake 9000): no FAKE device (test)");
    pick_is("last", "last", "backend last: STRATA_BACKEND=last");
    /* named but cannot: the last serves, and says both */
    pick_is("nodev", "last", "backend last: no FAKE device (test); STRATA_BACKEND=nodev");
    pick_is("gpu", "gpu", "backend gpu (Fake 9000): STRATA_BACKEND=gpu");
    pick_is("", "gpu", "backend gpu (Fake 9000): no FAKE device (test)");
    /* an unknown name is a warning, and the choice is as without it */
    pick_is("tpu", "gpu", "backend gpu (Fake 9000): no FAKE device (test)");
    /* reasons given before (an init that failed) come first */
    char line[ERRMSG_LEN];
    CHECK(backends_pick(list + 2, "gpu: out of memory", line) == &last);
    CHECK_STR(line, "backend last: gpu: out of memory");
}

static int inits;

static int init_fails(struct engine *e, struct arena *a, char *err)
{
    (void)e, (void)a;
    inits++;
    return errmsg_set(err, "out of device memory (%d MiB)", 80);
}

static int init_ok(struct engine *e, struct arena *a, char *err)
{
    (void)e, (void)a, (void)err;
    inits++;
    return 0;
}

TEST(start_falls_back_when_init_fails)
{
    static const struct engine_backend dev = {.name = "dev", .init = init_fails},
                                       dev2 = {.name = "dev2", .init = init_fails},
                                       host = {.name = "host", .init = init_ok};
    const struct engine_backend *const fallback[] = {&dev, &host, NULL}, *const none[] = {
                                                                             &dev, &dev2, NULL};
    struct engine e = {0};
    char err[ERRMSG_LEN];
    inits = 0;
    unsetenv("STRATA_BACKEND");
    CHECK(backends_start(&e, NULL, fallback, err) == 0);
    CHECK(e.be == &host);
    CHECK_EQ_INT(inits, 2);
    /* the last one's failure is engine_init's, in the backend's own words */
    e.be = NULL;
    CHECK(backends_start(&e, NULL, none, err) == -1);
    CHECK_STR(err, "out of device memory (80 MiB)");
    CHECK(e.be == NULL);
    CHECK_EQ_INT(inits, 4);
}

/* The real list: cuda first, cpu last and always able. */
TEST(real_list_is_cuda_then_cpu)
{
    CHECK(backends_all[0] && !strcmp(backends_all[0]->name, "cuda") && backends_all[0]->probe);
    CHECK(backends_all[1] == &cpu_backend && !cpu_backend.probe && !backends_all[2]);
}

int main(void)
{
    log_set_quiet(1);
    RUN(failed_backend_call_names_backend_and_reason);
    RUN(pick_passes_over_with_reasons);
    RUN(start_falls_back_when_init_fails);
    RUN(real_list_is_cuda_then_cpu);
    CHECK_DONE();
}
