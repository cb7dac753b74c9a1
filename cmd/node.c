/* strata node: one fabric node as a process, for tests, benchmarks and manual runs.
 *
 *   strata node --role source --transport tcp|dpdk|rdma --listen IP:PORT --key-file KEY
 *               (--synthetic BYTES[:SPANS[:SEED]] | -m MODEL.gguf) [--serve N] [--rate MB/s]
 *   strata node --role joiner --transport ... --peer IP:PORT [--peer ...] --key-file KEY
 *               [--listen IP:PORT --serve N] --image-out FILE
 *
 * A joiner with --listen is a chain node: it forwards each chunk downstream as soon as it holds
 * it. --serve N makes a holder exit once N downstream peers have verified everything; a joiner
 * without it exits when it has. The last stdout line says what happened ("complete: ..." or
 * "failed: ..."), so scripts can check it. */
#include "os/runtime/arena.h"
#include "os/runtime/clock.h"
#include "os/common/errmsg.h"
#include "os/runtime/log.h"
#include "cmd/commands.h"
#include "cmd/fabric_opts.h"
#include "cmd/options.h"
#include "serving/engine/gguf.h"
#include "serving/engine/loader.h"
#include "serving/engine/model.h"
#include "transport/transport.h"
#include "transport/weight_stream.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct node_opts {
    const char *role, *model, *synthetic, *image_out, *header_out;
    struct fabric_opts fab; /* --transport, --listen, --peer, --key-file, dpdk/rdma (shared) */
    int exit_after, corrupt_unit, quiet, help;
    double timeout_s, rate_mbs;
    long chunk;
};

#define MAX_OPTS 32

/* node's options, pointing into o: the one list the parser and the usage text read. */
static int node_options(struct node_opts *o, struct opt *t)
{
    const struct opt table[] = {
        {"--role", OPT_STR, &o->role, 0, 0, NULL, "source|joiner"},
        {"--exit-after", OPT_INT, &o->exit_after, 0, 1 << 20, NULL, "PEERS"},
        {"--timeout", OPT_DOUBLE, &o->timeout_s, 0, 86400, NULL, "SEC"},
        {"--synthetic", OPT_STR, &o->synthetic, 0, 0, NULL, "BYTES[:SPANS[:SEED]]"},
        {"-m", OPT_STR, &o->model, 0, 0, NULL, "MODEL.gguf"},
        {"--model", OPT_STR, &o->model, 0, 0, NULL, "MODEL.gguf"},
        {"--image-out", OPT_STR, &o->image_out, 0, 0, NULL, "FILE"},
        {"--header-out", OPT_STR, &o->header_out, 0, 0, NULL, "FILE"},
        {"--chunk", OPT_LONG, &o->chunk, 0, 1 << 30, NULL, "BYTES"},
        {"--rate", OPT_DOUBLE, &o->rate_mbs, 0, 1e9, NULL, "MB/s"},
        {"--corrupt-unit", OPT_INT, &o->corrupt_unit, -1, 1 << 20, NULL, "U"},
        {"-q", OPT_FLAG, &o->quiet, 0, 0, NULL, NULL},
        {"--help", OPT_FLAG, &o->help, 0, 0, NULL, NULL},
    };
    memcpy(t, table, sizeof table);
    int n = (int)(sizeof table / sizeof table[0]);
    return n + fabric_options(&o->fab, t + n); /* the fabric's shared entries */
}

static void usage(FILE *f)
{
    struct node_opts o;
    struct opt t[MAX_OPTS];
    opts_usage(f, "node", t, node_options(&o, t));
    fprintf(f, "  --exit-after N: a source exits once N joiners have verified every layer\n");
}

static int parse_opts(struct node_opts *o, int argc, char **argv)
{
    memset(o, 0, sizeof *o);
    o->fab.kind = "tcp";
    o->timeout_s = 60;
    o->corrupt_unit = -1;
    struct opt t[MAX_OPTS];
    char err[ERRMSG_LEN];
    if (opts_parse(t, node_options(o, t), argc, argv, err))
        return fprintf(stderr, "node: %s\n", err), -1;
    if (o->help) {
        usage(stdout);
        exit(0);
    }
    if (!o->role) return fprintf(stderr, "node: --role is required\n"), -1;
    if (!o->fab.key_file) return fprintf(stderr, "node: --key-file is required\n"), -1;
    if (!strcmp(o->role, "source")) {
        if (!o->synthetic == !o->model)
            return fprintf(stderr, "node: a source needs --synthetic or -m\n"), -1;
        if (!o->fab.listen) return fprintf(stderr, "node: a source needs --listen\n"), -1;
    } else if (!strcmp(o->role, "joiner")) {
        if (!o->fab.peers.n) return fprintf(stderr, "node: a joiner needs --peer\n"), -1;
    } else {
        return fprintf(stderr, "node: --role is source or joiner\n"), -1;
    }
    return 0;
}

/* ---- the image a source serves ---- */

static uint64_t parse_size(const char *s, const char **end)
{
    char *e;
    uint64_t v = strtoull(s, &e, 10);
    if (*e == 'K' || *e == 'k')
        v <<= 10, e++;
    else if (*e == 'M' || *e == 'm')
        v <<= 20, e++;
    else if (*e == 'G' || *e == 'g')
        v <<= 30, e++;
    *end = e;
    return v;
}

static uint64_t xorshift(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

/* A deterministic synthetic model: a header of pseudo-random bytes and spans of uneven sizes
 * (embedding and head larger than blocks, as in a real model). */
struct synth {
    uint8_t header[4096];
    uint64_t image_size;
    uint32_t n_spans;
    struct wire_span spans[WIRE_MAX_SPANS];
};

static int synth_plan(struct synth *sy, const char *spec, uint64_t *seed, char *err)
{
    const char *e;
    sy->image_size = parse_size(spec, &e);
    sy->n_spans = 10;
    *seed = 1;
    if (*e == ':') sy->n_spans = (uint32_t)strtoul(e + 1, (char **)&e, 10);
    if (*e == ':') *seed = strtoull(e + 1, (char **)&e, 10);
    if (*e || sy->image_size < 1024 || sy->n_spans < 3 || sy->n_spans > WIRE_MAX_SPANS)
        return errmsg_set(err,
                          "--synthetic '%s': expected BYTES[:SPANS[:SEED]], >= 1K, 3..%d spans",
                          spec, WIRE_MAX_SPANS);
    if (!*seed) *seed = 1;
    /* Weights: embedding 3, blocks 2 each, head 3; spans start 64-byte aligned. */
    uint64_t units = 6 + 2 * (uint64_t)(sy->n_spans - 2), off = 0;
    for (uint32_t i = 0; i < sy->n_spans; i++) {
        uint64_t w = (i == 0 || i == sy->n_spans - 1) ? 3 : 2;
        uint64_t size = sy->image_size * w / units & ~(uint64_t)63;
        if (i == sy->n_spans - 1) size = sy->image_size - off;
        sy->spans[i].offset = off;
        sy->spans[i].size = size;
        off += size;
    }
    uint64_t x = *seed * 0x9E3779B97F4A7C15ull;
    memcpy(sy->header, "SYNT", 4); /* not "GGUF": joiners do not try to parse it */
    for (size_t i = 4; i < sizeof sy->header; i++) sy->header[i] = (uint8_t)xorshift(&x);
    return 0;
}

static void synth_fill(uint8_t *image, uint64_t size, uint64_t seed)
{
    uint64_t x = seed * 0xD1B54A32D192ED03ull + 1;
    uint64_t i = 0;
    for (; i + 8 <= size; i += 8) {
        uint64_t v = xorshift(&x);
        memcpy(image + i, &v, 8);
    }
    for (; i < size; i++) image[i] = (uint8_t)xorshift(&x);
}

/* ---- a GGUF model: header bytes and the image laid out by model_plan ---- */

struct gguf_source {
    uint8_t *file;
    size_t size;
    struct gguf g;
    struct model m;
    struct wire_span spans[WIRE_MAX_SPANS];
    char name[WIRE_NAME_LEN + 1];
};

static int gguf_open_model(struct gguf_source *gs, const char *path, char *err)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0) return errmsg_set(err, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st)) {
        close(fd);
        return errmsg_set(err, "%s: %s", path, strerror(errno));
    }
    gs->size = (size_t)st.st_size;
    gs->file = mmap(NULL, gs->size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (gs->file == MAP_FAILED) {
        gs->file = NULL;
        return errmsg_set(err, "%s: mmap: %s", path, strerror(errno));
    }
    if (gguf_parse(&gs->g, gs->file, gs->size, err)) return errmsg_prefix(err, "%s: ", path);
    if (model_plan(&gs->m, &gs->g, path, err)) return -1;
    if (gs->m.n_spans > WIRE_MAX_SPANS) return errmsg_set(err, "%s: too many spans", path);
    for (int i = 0; i < gs->m.n_spans; i++)
        gs->spans[i] = (struct wire_span){gs->m.spans[i].offset, gs->m.spans[i].size, 0};
    struct gguf_str name;
    char e2[ERRMSG_LEN];
    if (gguf_get_str(&gs->g, "general.name", &name, e2) == 0)
        snprintf(gs->name, sizeof gs->name, "%.*s", (int)name.len, name.p);
    else
        snprintf(gs->name, sizeof gs->name, "%s", path);
    for (char *c = gs->name; *c; c++)
        if (*c < 0x20 || *c > 0x7e) *c = '?';
    return 0;
}

static void gguf_close_model(struct gguf_source *gs)
{
    if (gs->m.slots) model_free(&gs->m);
    if (gs->g.kv || gs->g.tensors) gguf_free(&gs->g);
    if (gs->file) munmap(gs->file, gs->size);
}

/* A joiner checks that the header it received describes the manifest's layout: the config
 * comes from the GGUF metadata (one place for each fact), the byte ranges from the manifest. */
static int check_header(const struct weight_store *s, char *err)
{
    const struct wire_manifest *man = s->man;
    if (man->header_len < 4 || memcmp(s->header, "GGUF", 4)) return 0; /* not a GGUF model */
    struct gguf g;
    struct model m;
    if (gguf_parse_header(&g, s->header, man->header_len, err))
        return errmsg_prefix(err, "received header: ");
    int rc = model_plan(&m, &g, "received header", err);
    if (rc == 0) {
        if ((uint32_t)m.n_spans != man->n_spans || m.image_size != man->image_size)
            rc = errmsg_set(err, "received header: %d spans / %llu bytes, manifest says %u / %llu",
                            m.n_spans, (unsigned long long)m.image_size, man->n_spans,
                            (unsigned long long)man->image_size);
        for (int i = 0; rc == 0 && i < m.n_spans; i++)
            if (m.spans[i].offset != man->span[i].offset || m.spans[i].size != man->span[i].size)
                rc = errmsg_set(err, "received header: span %d does not match the manifest", i);
        if (rc == 0)
            log_info("fabric", "model config: dim %d, %d layers, %d heads (%d kv), vocab %d",
                     m.cfg.dim, m.cfg.n_layers, m.cfg.n_heads, m.cfg.n_kv_heads, m.cfg.vocab_size);
        model_free(&m);
    }
    gguf_free(&g);
    return rc;
}

/* ---- the joiner's image lives in the pinned arena ---- */

struct node {
    struct arena arena;
    int have_arena;
};

static uint8_t *alloc_image(void *ctx, uint64_t size, char *err)
{
    struct node *n = ctx;
    if (arena_open(&n->arena, (size_t)size + ARENA_ALIGN, ARENA_NO_HUGEPAGES | ARENA_NO_LOCK, err))
        return NULL;
    n->have_arena = 1;
    return arena_carve(&n->arena, "weights", (size_t)size, err);
}

/* Register the arena with the device once: required to be pulled from (rdma), an optimisation
 * elsewhere (dpdk), so only the former is fatal. */
static int expose_arena(struct tp *t, uint8_t *image, uint64_t size, char *err)
{
    if (!tp_can_expose(t)) return 0;
    char xerr[ERRMSG_LEN];
    if (tp_expose(t, image, (size_t)size, xerr) == 0) return 0;
    if (tp_can_pull(t)) return errmsg_set(err, "%s", xerr);
    log_warn("fabric", "%s", xerr);
    return 0;
}

static int write_file(const char *path, const void *p, uint64_t n, char *err)
{
    FILE *f = fopen(path, "wb");
    if (!f) return errmsg_set(err, "%s: %s", path, strerror(errno));
    size_t w = n ? fwrite(p, 1, (size_t)n, f) : 0;
    if (fclose(f) || w != n) return errmsg_set(err, "%s: write failed", path);
    return 0;
}

static volatile sig_atomic_t stop_signal;
static void on_signal(int sig)
{
    stop_signal = sig;
}

/* One run of `strata node`: what it holds and streams. */
struct node_run {
    struct node_opts o;
    int is_source;
    struct node node;
    struct weight_store store;
    struct synth *sy;
    struct gguf_source *gs;
    struct tp *t;
    struct weight_stream *ws;
    double t0, t_complete;
};

/* A source with a real model: the GGUF laid out in execution order in the arena. */
static int source_from_model(struct node_run *r, char *err)
{
    const struct node_opts *o = &r->o;
    struct gguf_source *gs = r->gs = calloc(1, sizeof *gs);
    if (!gs) return errmsg_set(err, "out of memory");
    if (gguf_open_model(gs, o->model, err)) return -1;
    uint8_t *image = alloc_image(&r->node, gs->m.image_size, err);
    if (!image) return -1;
    /* the image is what peers get: the file's weight pages go as they are copied (loader.h) */
    int dropping = 1;
    for (int i = 0; i < gs->m.n_spans; i++)
        if (loader_fill_span(&gs->m, image, i, &dropping, o->model, err)) return -1;
    if (weight_store_init_full(&r->store, gs->name, gs->file, gs->g.data_offset, image,
                               gs->m.image_size, gs->spans, (uint32_t)gs->m.n_spans,
                               (uint32_t)o->chunk, err) ||
        expose_arena(r->t, image, gs->m.image_size, err) ||
        (o->image_out && write_file(o->image_out, image, gs->m.image_size, err)) ||
        (o->header_out && write_file(o->header_out, gs->file, gs->g.data_offset, err)))
        return -1;
    log_info("fabric", "source: %s, %d spans, %llu-byte image, serving on %s", gs->name,
             gs->m.n_spans, (unsigned long long)gs->m.image_size, o->fab.listen);
    return 0;
}

/* A source with a synthetic image (--synthetic BYTES[:SPANS[:SEED]]). */
static int source_synthetic(struct node_run *r, char *err)
{
    const struct node_opts *o = &r->o;
    uint64_t seed;
    struct synth *sy = r->sy = calloc(1, sizeof *sy);
    if (!sy) return errmsg_set(err, "out of memory");
    if (synth_plan(sy, o->synthetic, &seed, err)) return -1;
    uint8_t *image = alloc_image(&r->node, sy->image_size, err);
    if (!image) return -1;
    synth_fill(image, sy->image_size, seed);
    if (weight_store_init_full(&r->store, "synthetic", sy->header, sizeof sy->header, image,
                               sy->image_size, sy->spans, sy->n_spans, (uint32_t)o->chunk, err) ||
        expose_arena(r->t, image, sy->image_size, err) ||
        (o->image_out && write_file(o->image_out, image, sy->image_size, err)))
        return -1;
    log_info("fabric", "source: %llu-byte synthetic image, %u spans, serving on %s",
             (unsigned long long)sy->image_size, sy->n_spans, o->fab.listen);
    return 0;
}

/* The stream's loop: until this node has everything and --exit-after peers have it too, a signal,
 * or --timeout. */
static int stream_until_done(struct node_run *r, char *err)
{
    const struct node_opts *o = &r->o;
    int header_checked = 0;
    r->t0 = clock_now();
    for (;;) {
        tp_poll(r->t, 1);
        if (weight_stream_step(r->ws, err)) return -1;
        if (!r->is_source && !header_checked && weight_store_header_ready(&r->store)) {
            header_checked = 1;
            if (check_header(&r->store, err)) return -1;
        }
        if (!r->t_complete && weight_store_complete(&r->store) && !r->is_source)
            r->t_complete = clock_now();
        int own_done = r->is_source || weight_stream_finished(r->ws);
        if (own_done && weight_stream_served(r->ws) >= o->exit_after &&
            weight_stream_active(r->ws) == 0 && (o->exit_after > 0 || !r->is_source))
            return 0;
        if (stop_signal) return errmsg_set(err, "stopped by signal %d", (int)stop_signal);
        if (clock_now() - r->t0 > o->timeout_s) {
            if (r->is_source && o->exit_after == 0) return 0;
            const char *ue = weight_stream_upstream_error(r->ws);
            return errmsg_set(
                err, "timed out after %.0f s: %d of %u spans verified, %d peers served%s%.300s",
                o->timeout_s, weight_store_spans_ready(&r->store),
                r->store.man ? r->store.man->n_spans : 0, weight_stream_served(r->ws),
                *ue ? "; last upstream error: " : "", ue);
        }
    }
}

/* Transport counters first; the result is always the last line. A joiner writes its files. */
static int report(struct node_run *r, char *err)
{
    const struct node_opts *o = &r->o;
    const struct weight_stream_stats *st = weight_stream_stats(r->ws);
    const struct tp_stats *ts = &r->t->stats;
    const struct weight_store *store = &r->store;
    printf("stats: messages tx %llu rx %llu, retransmits %llu, dropped bad %llu, duplicates %llu, "
           "refused %llu\n",
           (unsigned long long)ts->frames_tx, (unsigned long long)ts->frames_rx,
           (unsigned long long)ts->retransmits, (unsigned long long)ts->dropped_bad,
           (unsigned long long)ts->dropped_dup, (unsigned long long)ts->refused);
    if (r->is_source) {
        printf("complete: served %d peers, %llu bytes sent, %llu re-sent units\n",
               weight_stream_served(r->ws), (unsigned long long)st->bytes_tx,
               (unsigned long long)st->refetches);
        return 0;
    }
    double dt = r->t_complete - r->t0;
    if ((o->image_out && write_file(o->image_out, store->image, store->man->image_size, err)) ||
        (o->header_out && write_file(o->header_out, store->header, store->man->header_len, err)))
        return -1;
    printf("complete: %llu-byte image, %u spans verified in %.3f s (%.1f MB/s), %llu resumes, "
           "%llu refetches, %llu duplicate chunks, served %d peers\n",
           (unsigned long long)store->man->image_size, store->man->n_spans, dt,
           dt > 0 ? store->man->image_size / dt / 1e6 : 0.0, (unsigned long long)st->resumes,
           (unsigned long long)st->refetches, (unsigned long long)st->dup_chunks,
           weight_stream_served(r->ws));
    return 0;
}

static int run_node(int argc, char **argv)
{
    static struct node_run r;
    if (parse_opts(&r.o, argc, argv)) {
        usage(stderr);
        return 2;
    }
    const struct node_opts *o = &r.o;
    if (o->quiet) log_set_quiet(1);
    char err[ERRMSG_LEN];
    r.is_source = !strcmp(o->role, "source");
    weight_store_init_empty(&r.store);
    struct tp_config cfg;
    int rc =
        auth_init(err) || fabric_opts_config(&o->fab, &cfg, err) || !(r.t = tp_open(&cfg, err));
    if (!rc && r.is_source) rc = o->model ? source_from_model(&r, err) : source_synthetic(&r, err);
    if (!rc && !r.is_source) {
        r.store.alloc_image = alloc_image;
        r.store.alloc_ctx = &r.node;
    }
    if (!rc) {
        struct weight_stream_config wc = {
            .t = r.t,
            .store = &r.store,
            .peers = o->fab.peers.v,
            .n_peers = r.is_source ? 0 : o->fab.peers.n,
            .chunk_size = (uint32_t)o->chunk,
            .rate_bytes = o->rate_mbs * 1e6,
            .corrupt_unit = o->corrupt_unit,
        };
        rc = !(r.ws = weight_stream_new(&wc, err));
    }
    if (!rc) {
        signal(SIGTERM, on_signal);
        signal(SIGINT, on_signal);
        rc = stream_until_done(&r, err) || report(&r, err);
    }
    if (rc && r.t)
        fprintf(stderr, "strata node: retransmits %llu, dropped bad %llu, duplicates %llu\n",
                (unsigned long long)r.t->stats.retransmits,
                (unsigned long long)r.t->stats.dropped_bad,
                (unsigned long long)r.t->stats.dropped_dup);
    if (rc) {
        printf("failed: %s\n", err);
        fprintf(stderr, "strata node: %s\n", err);
    }
    fflush(stdout);
    weight_stream_free(r.ws);
    tp_destroy(r.t);
    weight_store_free(&r.store);
    if (r.node.have_arena) arena_close(&r.node.arena);
    free(r.sy);
    if (r.gs) gguf_close_model(r.gs);
    free(r.gs);
    fabric_opts_free(&r.o.fab);
    return rc ? 1 : 0;
}

const struct command cmd_node = {
    "node", run_node, "node --role source|joiner --key-file FILE [options]  (a fabric node)"};
