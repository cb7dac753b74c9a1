/* Weight streaming in one process over loopback TCP: a source and a joiner, spans become ready in
 * execution order through the readiness API, a corrupted unit is re-fetched, and the joiner ends
 * with the exact bytes. */
#include "os/common/errmsg.h"
#include "tests/unit/check.h"
#include "tests/unit/free_port.h"
#include "transport/weight_stream.h"

#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static char err[ERRMSG_LEN];
static int ready_order[64], n_ready;

static void on_ready(void *ctx, int span)
{
    (void)ctx;
    if (n_ready < 64) ready_order[n_ready++] = span;
}

static uint8_t *alloc_image(void *ctx, uint64_t size, char *e)
{
    (void)e;
    uint8_t **keep = ctx;
    *keep = calloc(1, size);
    return *keep;
}

static void run_stream(int corrupt_unit, uint32_t chunk)
{
    enum { SPANS = 6, SIZE = 3 << 20 };
    static uint8_t header[3000];
    uint8_t *image = malloc(SIZE), *got = NULL;
    CHECK(image);
    for (size_t i = 0; i < SIZE; i++) image[i] = (uint8_t)(i * 2654435761u >> 13);
    for (size_t i = 0; i < sizeof header; i++) header[i] = (uint8_t)(i ^ 0x5a);
    struct wire_span spans[SPANS];
    for (int i = 0; i < SPANS; i++)
        spans[i] =
            (struct wire_span){(uint64_t)i * (SIZE / SPANS), SIZE / SPANS - (i == 2 ? 100 : 0), 0};
    /* Bytes between spans (alignment padding) are not streamed: zero, as in a fresh arena. */
    memset(image + 3 * (SIZE / SPANS) - 100, 0, 100);

    CHECK(auth_init(err) == 0);
    char addr[32];
    int port = free_port();
    CHECK(port > 0);
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    struct tp_config sc = {.kind = "tcp", .listen = addr}, jc = {.kind = "tcp"};
    memset(sc.key.k, 7, 32);
    memset(jc.key.k, 7, 32);
    struct tp *st = tp_open(&sc, err), *jt = tp_open(&jc, err);
    CHECKF(st && jt, "%s", err);

    struct weight_store src, dst;
    CHECKF(weight_store_init_full(&src, "test", header, sizeof header, image, SIZE, spans, SPANS,
                                  chunk, err) == 0,
           "%s", err);
    CHECK(weight_store_complete(&src) && weight_store_spans_ready(&src) == SPANS);
    weight_store_init_empty(&dst);
    dst.on_ready = on_ready;
    dst.alloc_image = alloc_image;
    dst.alloc_ctx = &got;
    CHECK(!weight_store_span_ready(&dst, 0) && !weight_store_complete(&dst));

    const char *peers[] = {addr};
    struct weight_stream_config scfg = {.t = st, .store = &src, .corrupt_unit = corrupt_unit};
    struct weight_stream_config jcfg = {
        .t = jt, .store = &dst, .peers = peers, .n_peers = 1, .corrupt_unit = -1};
    struct weight_stream *sw = weight_stream_new(&scfg, err), *jw = weight_stream_new(&jcfg, err);
    CHECK(sw && jw);
    n_ready = 0;
    time_t t0 = time(NULL);
    while (!(weight_stream_finished(jw) && weight_stream_served(sw) == 1) && time(NULL) - t0 < 20) {
        tp_poll(st, 0);
        tp_poll(jt, 1);
        CHECKF(weight_stream_step(sw, err) == 0, "%s", err);
        CHECKF(weight_stream_step(jw, err) == 0, "%s", err);
    }
    CHECK(weight_stream_finished(jw));
    CHECK(weight_store_complete(&dst) && weight_store_header_ready(&dst));
    CHECK(!memcmp(dst.header, header, sizeof header));
    CHECK(got && !memcmp(got, image, SIZE));
    CHECK_EQ_INT(n_ready, SPANS);
    if (corrupt_unit < 0) {
        for (int i = 0; i < SPANS; i++) CHECK_EQ_INT(ready_order[i], i);
        CHECK_EQ_INT(weight_stream_stats(jw)->refetches, 0);
    } else {
        CHECK_EQ_INT(weight_stream_stats(jw)->refetches, 1);
        CHECK_EQ_INT(weight_stream_stats(sw)->refetches, 1);
    }
    for (int i = 0; i < SPANS; i++) CHECK(weight_store_span_ready(&dst, i));
    CHECK(!weight_store_span_ready(&dst, SPANS) && !weight_store_span_ready(&dst, -1));
    weight_stream_free(sw);
    weight_stream_free(jw);
    tp_destroy(st);
    tp_destroy(jt);
    weight_store_free(&src);
    weight_store_free(&dst);
    free(got);
    free(image);
}

TEST(stream_exact_and_in_order)
{
    run_stream(-1, 65536);
}

TEST(corrupt_span_is_refetched)
{
    run_stream(3, 100000);
}

TEST(store_rejects_bad_layout)
{
    uint8_t image[1000] = {0}, header[10] = {0};
    struct wire_span spans[2] = {{0, 600, 0}, {500, 100, 0}};
    struct weight_store s;
    CHECK(weight_store_init_full(&s, "x", header, 10, image, 1000, spans, 2, 4096, err) == -1);
    weight_store_free(&s);
    spans[1] = (struct wire_span){600, 401, 0};
    CHECK(weight_store_init_full(&s, "x", header, 10, image, 1000, spans, 2, 4096, err) == -1);
    weight_store_free(&s);
    spans[1] = (struct wire_span){600, 400, 0};
    CHECK(weight_store_init_full(&s, "x", header, 10, image, 1000, spans, 2, 10, err) == -1);
    weight_store_free(&s);
    CHECK(weight_store_init_full(&s, "x", header, 10, image, 1000, spans, 2, 4096, err) == 0);
    weight_store_free(&s);
}

int main(void)
{
    RUN(stream_exact_and_in_order);
    RUN(corrupt_span_is_refetched);
    RUN(store_rejects_bad_layout);
    CHECK_DONE();
}
