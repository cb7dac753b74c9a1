#include "serving/engine/loader.h"

#include "os/common/errmsg.h"
#include "os/runtime/log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static int map_file(struct loaded_model *lm, const char *path, char *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errmsg_set(err, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return errmsg_set(err, "%s: %s", path, strerror(errno));
    }
    if (st.st_size == 0) {
        close(fd);
        return errmsg_set(err, "%s: empty file", path);
    }
    lm->map_size = (size_t)st.st_size;
    lm->map = mmap(NULL, lm->map_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (lm->map == MAP_FAILED) {
        lm->map = NULL;
        return errmsg_set(err, "%s: mmap: %s", path, strerror(errno));
    }
    return 0;
}

/* ---- the file's pages: weights resident once -------------------------------------------------
 * Every tensor is copied into the arena (model_fill) and used from there; after a span is copied
 * its bytes in the mapping are never read again, only the header's are (the tokenizer and the
 * GGUF keys point into it). MADV_DONTNEED on a read-only private file mapping only takes this
 * process's pages of it away: the bytes stay in the page cache, clean, the first memory the
 * kernel reclaims, and a later read would fault them in again, so a drop can cost time but never
 * data. MADV_PAGEOUT was not chosen: it leaves pages another process maps too (a second loader of
 * the same file), so what it frees is not certain; nor was pread into the arena, which would give
 * model_fill a second source of bytes beside the parsed buffer every other caller uses. */

/* The whole pages inside [lo, hi). */
static int drop_range(uintptr_t lo, uintptr_t hi, char *err)
{
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = (lo + page - 1) / page * page, b = hi / page * page;
    if (a >= b || !madvise((void *)a, b - a, MADV_DONTNEED)) return 0;
    return errmsg_set(err, "madvise(MADV_DONTNEED) of %zu KiB of the mapping: %s",
                      (size_t)(b - a) >> 10, strerror(errno));
}

int loader_drop_span_pages(const struct model *m, int s, char *err)
{
    const struct gguf *g = m->gguf;
    for (int i = 0; i < m->n_slots; i++) {
        const struct gguf_tensor *t = m->slots[i].src;
        if (m->slots[i].span != s) continue;
        uintptr_t p = (uintptr_t)gguf_tensor_data(g, t);
        if (drop_range(p, p + t->nbytes, err)) return -1;
    }
    return 0;
}

int loader_drop_data_pages(const struct gguf *g, char *err)
{
    if (g->data_offset >= g->size) return 0;
    /* the mapping runs to the end of the file's last page */
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), end = (uintptr_t)g->base + g->size;
    return drop_range((uintptr_t)g->base + g->data_offset, (end + page - 1) / page * page, err);
}

int loader_fill_span(struct model *m, uint8_t *image, int s, int *dropping, const char *what,
                     char *err)
{
    if (model_fill(m, image, s, err)) return -1;
    /* Copying span s faulted in pages around it (the kernel maps up to 64 KiB of cached
     * neighbours at each fault), some of them span s-1's: that one's again. */
    char derr[ERRMSG_LEN];
    if (*dropping &&
        (loader_drop_span_pages(m, s, derr) || (s > 0 && loader_drop_span_pages(m, s - 1, derr)) ||
         (s + 1 == m->n_spans && loader_drop_data_pages(m->gguf, derr)))) {
        log_warn("loader", "%s: the file's weight pages stay resident: %s", what, derr);
        *dropping = 0;
    }
    return 0;
}

/* From a parsed GGUF (lm->gguf): config, tokenizer, limits, the arena and its weight pool. */
static int plan_arena(struct loaded_model *lm, const char *what, const struct loader_opts *opts,
                      char *err)
{
    if (model_plan(&lm->model, &lm->gguf, what, err)) return -1;
    if (tokenizer_from_gguf(&lm->tok, &lm->gguf, err)) return errmsg_prefix(err, "%s: ", what);
    const struct model_config *c = &lm->model.cfg;
    lm->lim = opts->limits;
    if (engine_limits_resolve(&lm->lim, c, err)) return errmsg_prefix(err, "%s: ", what);
    const struct engine_limits *lim = &lm->lim;
    size_t weights = arena_round(lm->model.image_size);
    size_t engine_bytes = engine_arena_bytes(c, lim);
    size_t total = weights + engine_bytes + ARENA_MAX_POOLS * ARENA_ALIGN;
    if (opts->verbose)
        log_info("loader",
                 "%s: %d layers, dim %d, %d heads (%d kv), vocab %d; arena %zu MiB = weights "
                 "%zu MiB + kv (%s)/activations %zu MiB",
                 what, c->n_layers, c->dim, c->n_heads, c->n_kv_heads, c->vocab_size, total >> 20,
                 weights >> 20, kv_type_name(lim->kv_type), engine_bytes >> 20);
    if (arena_open(&lm->arena, total, opts->arena_flags, err))
        return errmsg_prefix(
            err, "%s: weights %zu MiB + kv (%s)/activations %zu MiB (ctx %d x %d seqs): ", what,
            weights >> 20, kv_type_name(lim->kv_type), engine_bytes >> 20, lim->ctx, lim->max_seqs);
    if (!(lm->weights = arena_carve(&lm->arena, "weights", lm->model.image_size, err))) return -1;
    lm->spans_total = lm->model.n_spans;
    return 0;
}

int loader_start(struct loaded_model *lm, char *err)
{
    model_bind(&lm->model, lm->weights);
    if (engine_init(&lm->engine, &lm->model, &lm->lim, &lm->arena, err))
        return errmsg_prefix(err, "%s: ", lm->path);
    lm->engine_started = 1;
    return 0;
}

int loader_open(struct loaded_model *lm, const char *path, const struct loader_opts *opts,
                char *err)
{
    memset(lm, 0, sizeof *lm);
    lm->path = path;
    if (map_file(lm, path, err)) return -1;
    if (gguf_parse(&lm->gguf, lm->map, lm->map_size, err)) {
        errmsg_prefix(err, "%s: ", path);
        goto fail;
    }
    if (plan_arena(lm, path, opts, err)) goto fail;
    int dropping = 1;
    for (int s = 0; s < lm->model.n_spans; s++) {
        if (loader_fill_span(&lm->model, lm->weights, s, &dropping, path, err)) goto fail;
        lm->spans_loaded = s + 1;
        if (opts->verbose && (lm->model.n_spans < 40 || s % 8 == 0 || s + 1 == lm->model.n_spans))
            log_info("loader", "span %d/%d resident (%.1f MiB)", s + 1, lm->model.n_spans,
                     (double)(lm->model.spans[s].offset + lm->model.spans[s].size) / 1048576.0);
        if (opts->progress) opts->progress(opts->progress_ctx, s + 1, lm->model.n_spans);
    }
    if (loader_start(lm, err)) goto fail;
    return 0;
fail:
    loader_close(lm);
    return -1;
}

int loader_open_header(struct loaded_model *lm, const char *what, const uint8_t *header, size_t len,
                       const struct loader_opts *opts, char *err)
{
    memset(lm, 0, sizeof *lm);
    lm->path = what;
    lm->header_only = 1;
    if (!(lm->map = malloc(len ? len : 1))) return errmsg_set(err, "%s: out of memory", what);
    memcpy(lm->map, header, len);
    lm->map_size = len;
    if (len < 4 || memcmp(header, "GGUF", 4)) {
        errmsg_set(err, "%s: the header is not GGUF", what);
        goto fail;
    }
    if (gguf_parse_header(&lm->gguf, lm->map, len, err)) {
        errmsg_prefix(err, "%s: ", what);
        goto fail;
    }
    if (plan_arena(lm, what, opts, err)) goto fail;
    return 0;
fail:
    loader_close(lm);
    return -1;
}

void loader_close(struct loaded_model *lm)
{
    engine_free(&lm->engine);
    lm->engine_started = 0;
    tokenizer_free(&lm->tok);
    model_free(&lm->model);
    gguf_free(&lm->gguf);
    arena_close(&lm->arena);
    if (lm->map && lm->header_only)
        free(lm->map);
    else if (lm->map)
        munmap(lm->map, lm->map_size);
    lm->map = NULL;
}
