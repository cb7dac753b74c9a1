/* stream_loader: the engine's weights as a weight_stream store, both ways.
 *
 * Joiner (stream_loader_joiner): no file. The store learns the manifest from a holder; when the
 * GGUF header (unit 0) verifies, the loader plans the model and the arena from it
 * (loader_open_header: config, tokenizer from the header's metadata, KV and activations sized by
 * the serving limits), checks that the manifest's spans are the ones the header implies (else the
 * holder is skipped: "manifest does not match its GGUF header: ..."), starts the engine, and hands
 * the arena's weight pool to the stream as its image: spans land there in place, in execution
 * order, and the arena is registered once with the transport (weight_stream does tp_expose).
 * As spans verify (fabric thread), k = the number of consecutive blocks held with the embedding
 * is recomputed and, when it grows, reported through on_resident(ctx, k); on_embedding reports the
 * embedding (span 0) on its own, since k stays 0 until block 0 is here too; on_complete follows
 * the last span. The head is the last span: a joiner with k blocks runs [0, k) and needs a
 * helper for the rest until everything has arrived.
 *
 * Source (stream_loader_source): a model loaded from a file (loader_open with
 * limits.keep_layout) offers its arena image and header bytes as they are: nothing is copied.
 *
 * The engine's own layouts: a CPU engine multiplies fastest from its 16-row records (repack.h),
 * which a file-loaded engine makes at init. Unless keep_gguf, the joiner rewrites each span in
 * place as it verifies, before k (or the embedding) says it is there, so a step never reads one
 * half-rewritten; a source does all of it once the manifest's CRCs are taken
 * (stream_loader_repack). Either way a downstream peer still receives GGUF's bytes: the store's
 * read_image turns a rewritten chunk back (engine_read_gguf), and the memory is the image's own.
 * keep_gguf is for a transport whose peers read the arena one-sided (rdma): they see it as it is.
 *
 * Threads: everything here runs on the fabric thread except the readers (stream_loader_k,
 * _complete, _embedding: atomics, set once a span is usable), which any thread may call; the
 * store's weight_store_span_ready says verified, which comes before the rewrite. */
#ifndef STRATA_STREAM_LOADER_H
#define STRATA_STREAM_LOADER_H

#include "cluster/layer_progress.h"
#include "serving/engine/loader.h"
#include "transport/weight_stream.h"

#include <stdatomic.h>

struct stream_loader {
    struct weight_store store;
    struct loaded_model *lm; /* joiner: filled in when the header arrives */
    struct loader_opts opts;
    struct layer_progress *lp;             /* optional */
    void (*on_resident)(void *ctx, int k); /* fabric thread, k grew */
    void (*on_embedding)(void *ctx);       /* fabric thread, span 0 (the embedding) verified */
    void (*on_complete)(void *ctx);        /* fabric thread, every span verified */
    void *ctx;
    atomic_int engine_ready; /* lm's engine is started (joiner: after the header) */
    atomic_int k;
    /* the embedding / every span here and usable (repacked: the store's own flags come first) */
    atomic_int embedding, complete;
    char name[80];
    int keep_gguf; /* set before the stream starts: 1 = never rewrite the image (above) */
    /* fabric thread: matrices rewritten as spans landed, the seconds it took, the longest span's
     * (the fabric thread does nothing else meanwhile) */
    int repacked;
    double repack_s, repack_max_s;
};

/* lm: zeroed storage the loader fills (joiner). opts.limits.keep_layout is forced on. */
void stream_loader_joiner(struct stream_loader *sl, struct loaded_model *lm,
                          const struct loader_opts *opts, struct layer_progress *lp);
/* lm: loaded from a file with keep_layout. name: the model's name in the manifest. */
int stream_loader_source(struct stream_loader *sl, struct loaded_model *lm, const char *name,
                         uint32_t chunk_size, struct layer_progress *lp, char *err);
/* Source, before it serves (the engine's threads do it): every span into the engine's layouts,
 * peers still getting GGUF's bytes. A no-op on a device backend. */
int stream_loader_repack(struct stream_loader *sl, char *err);
void stream_loader_free(struct stream_loader *sl);

/* Consecutive blocks held with the embedding (0 until the embedding and block 0 are here). */
int stream_loader_k(const struct stream_loader *sl);
int stream_loader_complete(const struct stream_loader *sl);
int stream_loader_embedding(const struct stream_loader *sl);

#endif
