/* loader: from a GGUF path, or from a GGUF header whose weights arrive later, to an engine.
 *
 * Maps the file, parses and validates it, plans the arena (weights + KV cache + activations, sized
 * from the model config and the serving limits) and reserves it in one piece, then copies the
 * weights in execution order one span at a time, reporting progress ("layer 3/22 resident"),
 * and starts the engine. If the plan does not fit, it fails with one line giving the numbers.
 * The file stays mapped read-only for its metadata (the tokenizer and GGUF keys point into it);
 * the weights are used from the arena only, so as each span is copied the mapping's pages of its
 * tensors are dropped (loader_fill_span), and the rest of the data section's after the last:
 * the process holds the weights once, not the file's pages beside the arena's copy.
 *
 * The stream path (a fabric joiner, cluster/stream_loader.h) has no file: loader_open_header()
 * takes the GGUF header bytes (metadata and tensor infos), keeps a copy for the tokenizer and the
 * GGUF keys, plans and reserves the arena the same way and carves the weight pool, zeroed, whose
 * spans the weight stream then writes in place; loader_start() binds the tensors and starts the
 * engine, which may run a layer only once its span has arrived. Such an engine keeps the GGUF
 * layout (engine_limits.keep_layout): its image is forwarded to other nodes as it is. */
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
    void *map;        /* the mapped file, or the header copy (stream path) */
    size_t map_size;
    int header_only;          /* map is a malloc'd header: no tensor data */
    struct engine_limits lim; /* resolved */
    int engine_started;
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
/* Stream path: plan from header bytes (copied); lm->weights is the zeroed weight pool of
 * lm->model.image_size bytes, in execution order (model.h spans). `what` names the source. */
int loader_open_header(struct loaded_model *lm, const char *what, const uint8_t *header, size_t len,
                       const struct loader_opts *opts, char *err);
/* Stream path: bind the tensors into lm->weights and start the engine (no weight is read). */
int loader_start(struct loaded_model *lm, char *err);
void loader_close(struct loaded_model *lm);

/* A GGUF parsed from a read-only private file mapping whose tensors have been copied out: drop
 * this process's pages of them (madvise MADV_DONTNEED on the whole pages inside; the bytes stay in
 * the page cache and a later read faults them back in). Span s's tensors (of model m, whose gguf
 * is that mapping), after model_fill(s); or the whole data section, after the last span, the
 * header's pages kept. Never on memory of another kind: MADV_DONTNEED zeroes anonymous memory.
 * -1 with err when madvise fails (the pages stay, the weights are still right). */
int loader_drop_span_pages(const struct model *m, int s, char *err);
int loader_drop_data_pages(const struct gguf *g, char *err);
/* How loader_open fills the image from such a mapping, for a caller that fills one itself:
 * model_fill(s), then the pages of span s and s-1 dropped (and, after the last span, the data
 * section's), spans in order 0 .. n_spans-1. *dropping starts at 1; a failed drop is logged once
 * (naming `what`) and ends the dropping. -1 only when model_fill fails. */
int loader_fill_span(struct model *m, uint8_t *image, int s, int *dropping, const char *what,
                     char *err);

#endif
