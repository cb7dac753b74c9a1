/* loader: from a GGUF path to a ready engine.
 *
 * Maps the file, parses and validates it, plans the arena (weights + KV cache + activations, sized
 * from the model config and the serving limits) and reserves it in one piece, then copies the
 * weights in execution order one span at a time, reporting progress ("layer 3/22 resident"),
 * and starts the engine. If the plan does not fit, it fails with one line giving the numbers.
 * The file stays mapped read-only for its metadata (the tokenizer and GGUF keys point into it);
 * the weights are used from the arena only. */
#ifndef STRATA_LOADER_H
#define STRATA_LOADER_H

#include "os/runtime/arena.h"
#include "serving/engine/engine.h"
#include "serving/engine/gguf.h"
#include "serving/engine/model.h"
#include "serving/engine/tokenizer.h"

struct loaded_model {
    const char *path;
    struct gguf gguf;
    struct model model;
    struct tokenizer tok;
    struct arena arena;
    struct engine engine;
    uint8_t *weights; /* the weight image, in the arena */
    void *map;
    size_t map_size;
    /* progress, readable from other threads (the /health endpoint) */
    volatile int spans_loaded, spans_total;
};

/* Optional progress callback, called after each span lands. */
typedef void (*loader_progress_fn)(void *ctx, int spans_done, int spans_total);

struct loader_opts {
    struct engine_limits limits;
    unsigned arena_flags; /* ARENA_NO_HUGEPAGES, ARENA_NO_LOCK */
    int verbose;          /* progress lines on stderr */
    loader_progress_fn progress;
    void *progress_ctx;
};

int loader_open(struct loaded_model *lm, const char *path, const struct loader_opts *opts,
                char *err);
void loader_close(struct loaded_model *lm);

#endif
