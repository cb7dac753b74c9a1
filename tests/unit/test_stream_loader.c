/* The engine from a weight stream, in one process over loopback TCP: a source engine loaded from
 * a synthetic Q4_0 GGUF offers its arena image, a joiner with no file plans its arena from the
 * received header and receives the spans in place. Checked: the blocks become resident in
 * execution order (k = 1..L reported once each, the head last), a partial joiner runs layers
 * [0, k) with the same hidden states as the source, the complete joiner's logits equal the
 * source's exactly, a corrupted span or header is fetched again, and a holder whose manifest
 * does not match its GGUF header is refused with a message saying so. The same for a Llama 3.1
 * file (rope_freqs, which every layer's span carries) and a qwen3 one (q/k norms). */
#include "cluster/stream_loader.h"
#include "tests/unit/check.h"
#include "tests/unit/free_port.h"
#include "tests/unit/synth.h"

#include <time.h>
#include <unistd.h>

static char err[512];
static const struct synth_cfg cfg = {64, 160, 6, 8, 2, 300, 64};
static int ks[64], n_ks, n_complete;

static void on_resident(void *ctx, int k)
{
    (void)ctx;
    if (n_ks < 64) ks[n_ks++] = k;
}

static void on_complete(void *ctx)
{
    (void)ctx;
    n_complete++;
}

static struct loader_opts opts(void)
{
    return (struct loader_opts){
        .limits = {.max_tokens = 16, .max_seqs = 2, .ctx = 64, .threads = 1, .keep_layout = 1},
        .arena_flags = ARENA_NO_HUGEPAGES | ARENA_NO_LOCK};
}

struct pair {
    struct tp *st, *jt;
    struct weight_stream *sw, *jw;
};

static void pair_open(struct pair *p, struct weight_store *src, struct weight_store *dst,
                      int corrupt_unit, double rate)
{
    static char addr[32];
    int port = free_port();
    CHECK(port > 0);
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    CHECK(auth_init(err) == 0);
    struct tp_config sc = {.kind = "tcp", .listen = addr}, jc = {.kind = "tcp"};
    memset(sc.key.k, 3, 32);
    memset(jc.key.k, 3, 32);
    p->st = tp_open(&sc, err);
    p->jt = tp_open(&jc, err);
    CHECKF(p->st && p->jt, "%s", err);
    static const char *peers[1];
    peers[0] = addr;
    struct weight_stream_config scfg = {.t = p->st,
                                        .store = src,
                                        .corrupt_unit = corrupt_unit,
                                        .chunk_size = 8192,
                                        .rate_bytes = rate};
    struct weight_stream_config jcfg = {
        .t = p->jt, .store = dst, .peers = peers, .n_peers = 1, .corrupt_unit = -1, .retry_ms = 20};
    p->sw = weight_stream_new(&scfg, err);
    p->jw = weight_stream_new(&jcfg, err);
    CHECK(p->sw && p->jw);
}

/* One round of both ends; the joiner's error (if any) goes to err. */
static int pair_step(struct pair *p)
{
    tp_poll(p->st, 0);
    tp_poll(p->jt, 1);
    CHECKF(weight_stream_step(p->sw, err) == 0, "%s", err);
    return weight_stream_step(p->jw, err);
}

static void pair_close(struct pair *p)
{
    weight_stream_free(p->sw);
    weight_stream_free(p->jw);
    tp_destroy(p->st);
    tp_destroy(p->jt);
}

static void forward_logits(struct loaded_model *lm, float *logits)
{
    struct engine *e = &lm->engine;
    int toks[5] = {1, 260, 7, 299, 42}, pos[5], rows[5], table[8];
    for (int i = 0; i < kv_blocks_for(&e->kv, 64); i++) table[i] = kv_block_alloc(&e->kv);
    const int *blocks[5];
    for (int i = 0; i < 5; i++) pos[i] = i, rows[i] = i, blocks[i] = table;
    struct batch b = {5, toks, pos, blocks, 5, rows};
    CHECK(engine_forward(e, &b, logits) == 0);
    for (int i = 0; i < kv_blocks_for(&e->kv, 64); i++) kv_block_free(&e->kv, table[i]);
}

/* Hidden states after the embedding and layers [0, k). */
static void hidden_after(struct loaded_model *lm, int k, float *x)
{
    struct engine *e = &lm->engine;
    int toks[3] = {1, 270, 33}, pos[3] = {0, 1, 2}, table[8];
    for (int i = 0; i < kv_blocks_for(&e->kv, 64); i++) table[i] = kv_block_alloc(&e->kv);
    const int *blocks[3] = {table, table, table};
    struct batch b = {3, toks, pos, blocks, 0, NULL};
    CHECK(engine_embed(e, &b, x) == 0);
    CHECK(engine_layers(e, &b, 0, k, x) == 0);
    for (int i = 0; i < kv_blocks_for(&e->kv, 64); i++) kv_block_free(&e->kv, table[i]);
}

static void stream_model_arch(int corrupt_unit, const struct synth_arch *arch)
{
    const char *path = "build/test-stream-loader.gguf";
    CHECK(synth_write_arch(path, &cfg, arch, GGML_Q4_0, 5) == 0);
    struct loader_opts o = opts();
    static struct loaded_model src_lm, dst_lm;
    CHECKF(loader_open(&src_lm, path, &o, err) == 0, "%s", err);
    static struct stream_loader src, dst;
    CHECKF(stream_loader_source(&src, &src_lm, "synthetic", 8192, NULL, err) == 0, "%s", err);
    struct layer_progress lp;
    layer_progress_init(&lp);
    stream_loader_joiner(&dst, &dst_lm, &o, &lp);
    dst.on_resident = on_resident;
    dst.on_complete = on_complete;
    n_ks = n_complete = 0;
    struct pair p;
    /* paced so the partial state lasts a while: ~1 MB/s */
    pair_open(&p, &src.store, &dst.store, corrupt_unit, corrupt_unit < 0 ? 1e6 : 0);
    time_t t0 = time(NULL);
    int checked_partial = 0;
    float *a = malloc(sizeof(float) * 3 * cfg.dim), *b = malloc(sizeof(float) * 3 * cfg.dim);
    while (!weight_stream_finished(p.jw) && time(NULL) - t0 < 30) {
        CHECKF(pair_step(&p) == 0, "%s", err);
        int k = stream_loader_k(&dst);
        if (!checked_partial && k >= 2 && !stream_loader_complete(&dst)) {
            /* partial: the joiner runs what it holds exactly as the source does */
            CHECK(atomic_load(&dst.engine_ready));
            CHECK(atomic_load(&lp.state) == LP_PARTIAL);
            CHECK_EQ_INT(atomic_load(&lp.layers_resident), k);
            CHECK_EQ_INT(atomic_load(&lp.layers_total), cfg.layers);
            hidden_after(&src_lm, k, a);
            hidden_after(&dst_lm, k, b);
            CHECK(!memcmp(a, b, sizeof(float) * 3 * cfg.dim));
            checked_partial = 1;
        }
    }
    CHECK(weight_stream_finished(p.jw));
    CHECK(stream_loader_complete(&dst));
    if (corrupt_unit < 0) CHECK(checked_partial);
    /* k grew one block at a time to L (a corrupted block holds k back until it comes again) */
    CHECK(n_ks >= 1 && ks[n_ks - 1] == cfg.layers);
    for (int i = 1; i < n_ks; i++) CHECK(ks[i] > ks[i - 1]);
    if (corrupt_unit < 0)
        for (int i = 0; i < n_ks; i++) CHECK_EQ_INT(ks[i], i + 1);
    CHECK_EQ_INT(n_complete, 1);
    CHECK(atomic_load(&lp.state) == LP_READY);
    CHECK_EQ_INT(atomic_load(&lp.spans_verified), cfg.layers + 2);
    if (corrupt_unit >= 0) CHECK(weight_stream_stats(p.jw)->refetches >= 1);
    /* the image, the config, the tokenizer and the output */
    CHECK(dst_lm.model.image_size == src_lm.model.image_size);
    CHECK(!memcmp(dst_lm.weights, src_lm.weights, src_lm.model.image_size));
    CHECK_EQ_INT(dst_lm.tok.vocab_size, src_lm.tok.vocab_size);
    CHECK_EQ_INT(dst_lm.tok.eos_id, src_lm.tok.eos_id);
    float *la = malloc(sizeof(float) * 5 * cfg.vocab), *lb = malloc(sizeof(float) * 5 * cfg.vocab);
    forward_logits(&src_lm, la);
    forward_logits(&dst_lm, lb);
    CHECK(!memcmp(la, lb, sizeof(float) * 5 * cfg.vocab));
    free(la), free(lb), free(a), free(b);
    pair_close(&p);
    stream_loader_free(&src);
    stream_loader_free(&dst);
    loader_close(&src_lm);
    loader_close(&dst_lm);
    remove(path);
}

static void stream_model(int corrupt_unit)
{
    const struct synth_arch llama2 = {0};
    stream_model_arch(corrupt_unit, &llama2);
}

TEST(stream_in_order_partial_then_exact)
{
    stream_model(-1);
}

TEST(stream_other_architectures)
{
    const struct synth_arch llama31 = {.arch = ARCH_LLAMA,
                                       .head_dim = 16,
                                       .rope_freqs = 1,
                                       .rope_theta = 500000,
                                       .qk_scale = 4},
                            qwen3 = {.arch = ARCH_QWEN3, .head_dim = 16, .tied = 1, .qk_scale = 4};
    stream_model_arch(-1, &llama31);
    stream_model_arch(-1, &qwen3);
}

TEST(corrupted_block_is_fetched_again)
{
    stream_model(3); /* unit 3 = span 2 = block 1 */
}

TEST(corrupted_header_is_fetched_again)
{
    stream_model(0);
}

TEST(manifest_not_matching_header_is_refused)
{
    /* The header of a 6-layer model with the spans of a 4-layer one. */
    const char *pa = "build/test-stream-loader-a.gguf", *pb = "build/test-stream-loader-b.gguf";
    struct synth_cfg small = cfg;
    small.layers = 4;
    CHECK(synth_write(pa, &cfg, GGML_Q4_0, 5) == 0);
    CHECK(synth_write(pb, &small, GGML_Q4_0, 5) == 0);
    struct loader_opts o = opts();
    static struct loaded_model a, b, dst_lm;
    CHECKF(loader_open(&a, pa, &o, err) == 0, "%s", err);
    CHECKF(loader_open(&b, pb, &o, err) == 0, "%s", err);
    struct wire_span spans[WIRE_MAX_SPANS];
    for (int i = 0; i < b.model.n_spans; i++)
        spans[i] = (struct wire_span){b.model.spans[i].offset, b.model.spans[i].size, 0};
    struct weight_store liar;
    CHECKF(weight_store_init_full(&liar, "liar", a.map, a.gguf.data_offset, b.weights,
                                  b.model.image_size, spans, (uint32_t)b.model.n_spans, 8192,
                                  err) == 0,
           "%s", err);
    static struct stream_loader dst;
    stream_loader_joiner(&dst, &dst_lm, &o, NULL);
    struct pair p;
    pair_open(&p, &liar, &dst.store, -1, 0);
    time_t t0 = time(NULL);
    int rc = 0;
    while (rc == 0 && time(NULL) - t0 < 20) rc = pair_step(&p);
    CHECK(rc == -1);
    CHECKF(strstr(err, "manifest does not match its GGUF header"), "%s", err);
    CHECK(!atomic_load(&dst.engine_ready) && !dst.store.man && !dst.store.image);
    pair_close(&p);
    stream_loader_free(&dst);
    weight_store_free(&liar);
    loader_close(&a);
    loader_close(&b);
    remove(pa);
    remove(pb);
}

TEST(header_that_is_not_gguf_is_refused)
{
    static struct loaded_model lm;
    struct loader_opts o = opts();
    const uint8_t junk[16] = "SYNTjunkjunkjunk";
    CHECK(loader_open_header(&lm, "peer", junk, sizeof junk, &o, err) == -1);
    CHECKF(strstr(err, "not GGUF"), "%s", err);
    uint8_t trunc[24] = "GGUF";
    trunc[4] = 3;
    trunc[12] = 200; /* 200 tensors, nothing behind */
    CHECK(loader_open_header(&lm, "peer", trunc, sizeof trunc, &o, err) == -1);
}

/* The console's progress line while weights stream, and the last one. */
TEST(progress_line_for_the_console)
{
    char line[160];
    layer_progress_line(line, sizeof line, 7, 24, 45000000, 111000000, 12000000, -1);
    CHECK_STR(line, "weights: 7/24 layers, 45.0 of 111.0 MB, 12.0 MB/s, ETA 5.5 s");
    layer_progress_line(line, sizeof line, 0, 24, 0, 111000000, 0, -1);
    CHECK_STR(line, "weights: 0/24 layers, 0.0 of 111.0 MB, 0.0 MB/s, ETA ?");
    layer_progress_line(line, sizeof line, 0, 0, 100000, 0, 100000, -1);
    CHECK_STR(line, "weights: waiting for the header, 0.1 MB, 0.1 MB/s");
    layer_progress_line(line, sizeof line, 24, 24, 111000000, 111000000, 0, 9.25);
    CHECK_STR(line, "weights: 24/24 layers, 111.0 MB in 9.2 s (12.0 MB/s)");
}

int main(void)
{
    RUN(progress_line_for_the_console);
    RUN(stream_in_order_partial_then_exact);
    RUN(stream_other_architectures);
    RUN(corrupted_block_is_fetched_again);
    RUN(corrupted_header_is_fetched_again);
    RUN(manifest_not_matching_header_is_refused);
    RUN(header_that_is_not_gguf_is_refused);
    CHECK_DONE();
}
