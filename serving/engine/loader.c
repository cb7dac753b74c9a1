#include "serving/engine/loader.h"

#include "os/common/errmsg.h"
#include "os/runtime/log.h"

#include <errno.h>
#include <fcntl.h>
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
    if (model_plan(&lm->model, &lm->gguf, path, err)) goto fail;
    if (tokenizer_from_gguf(&lm->tok, &lm->gguf, err)) {
        errmsg_prefix(err, "%s: ", path);
        goto fail;
    }
    const struct model_config *c = &lm->model.cfg;
    struct engine_limits lim = opts->limits;
    if (engine_limits_resolve(&lim, c, err)) {
        errmsg_prefix(err, "%s: ", path);
        goto fail;
    }
    size_t weights = arena_round(lm->model.image_size);
    size_t engine_bytes = engine_arena_bytes(c, &lim);
    size_t total = weights + engine_bytes + ARENA_MAX_POOLS * ARENA_ALIGN;
    if (opts->verbose)
        log_info("loader",
                 "%s: %d layers, dim %d, %d heads (%d kv), vocab %d; arena %zu MiB = weights "
                 "%zu MiB + kv (%s)/activations %zu MiB",
                 path, c->n_layers, c->dim, c->n_heads, c->n_kv_heads, c->vocab_size, total >> 20,
                 weights >> 20, kv_type_name(lim.kv_type), engine_bytes >> 20);
    if (arena_open(&lm->arena, total, opts->arena_flags, err)) {
        errmsg_prefix(
            err, "%s: weights %zu MiB + kv (%s)/activations %zu MiB (ctx %d x %d seqs): ", path,
            weights >> 20, kv_type_name(lim.kv_type), engine_bytes >> 20, lim.ctx, lim.max_seqs);
        goto fail;
    }
    if (!(lm->weights = arena_carve(&lm->arena, "weights", lm->model.image_size, err))) goto fail;
    lm->spans_total = lm->model.n_spans;
    for (int s = 0; s < lm->model.n_spans; s++) {
        if (model_fill(&lm->model, lm->weights, s, err)) goto fail;
        lm->spans_loaded = s + 1;
        if (opts->verbose && (lm->model.n_spans < 40 || s % 8 == 0 || s + 1 == lm->model.n_spans))
            log_info("loader", "span %d/%d resident (%.1f MiB)", s + 1, lm->model.n_spans,
                     (double)(lm->model.spans[s].offset + lm->model.spans[s].size) / 1048576.0);
        if (opts->progress) opts->progress(opts->progress_ctx, s + 1, lm->model.n_spans);
    }
    model_bind(&lm->model, lm->weights);
    if (engine_init(&lm->engine, &lm->model, &lim, &lm->arena, err)) {
        errmsg_prefix(err, "%s: ", path);
        goto fail;
    }
    return 0;
fail:
    loader_close(lm);
    return -1;
}

void loader_close(struct loaded_model *lm)
{
    engine_free(&lm->engine);
    tokenizer_free(&lm->tok);
    model_free(&lm->model);
    gguf_free(&lm->gguf);
    arena_close(&lm->arena);
    if (lm->map) munmap(lm->map, lm->map_size);
    lm->map = NULL;
}
