/* weight_node: the serving process as a node of the weight fabric.
 *
 * A source (strata serve -m M --fabric ...) offers the model its engine runs from: the arena's
 * weight image and the file's GGUF header, nothing copied; the arena is registered once with the
 * transport (tp_expose) so rdma joiners read it one-sided. Source and joiner alike run from the
 * CPU engine's own layouts, sending GGUF's bytes (stream_loader.h), except over rdma, where
 * peers read the image as it is and it keeps GGUF's layout. A joiner (strata serve --peers A,B with no -m) pulls the weights from the first
 * peer that can serve them straight into its engine's arena (cluster/stream_loader.h): the
 * engine starts when the header has arrived, k = resident blocks grows as spans verify
 * (on_resident), and when every span is here the node serves alone (on_complete). A joiner with
 * --listen forwards what it holds to the joiners behind it (chain), and a joiner whose holder
 * dies resumes from the next peer with what it has verified (weight_stream.h).
 *
 * It rides the serving process's fabric node (cluster/fabric_node.h): a poller drives the weight
 * stream on the fabric thread, and a MSG_JOIN handler adopts each connection a joiner opens to
 * us. Weight connections are bulk (tp_set_bulk): serving traffic on the same port goes first.
 * Its progress goes to a layer_progress (/health, /metrics). A fatal stream error (every peer
 * refused us) is logged, the progress turns FAILED and weight_node_failed() says why. */
#ifndef STRATA_WEIGHT_NODE_H
#define STRATA_WEIGHT_NODE_H

#include "cluster/fabric_node.h"
#include "cluster/layer_progress.h"
#include "serving/engine/loader.h"

struct weight_node_config {
    struct fabric_node *fabric;
    const char *const *peers; /* joiner: holders to pull from, in order of preference */
    int n_peers;
    uint32_t chunk_size;       /* 0: the holder's (default 256 KiB) */
    double rate_bytes;         /* pacing of each downstream push, bytes/s (0: unpaced) */
    struct layer_progress *lp; /* required */
    void (*on_resident)(void *ctx, int k); /* fabric thread: k blocks resident (grew) */
    void (*on_embedding)(void *ctx);       /* fabric thread: the embedding (span 0) verified */
    void (*on_complete)(void *ctx);        /* fabric thread: every span verified */
    void *ctx;
};

struct weight_node;

/* lm: loaded from a file with limits.keep_layout; name: the model's name for peers. Registers on
 * cfg->fabric (before fabric_node_start); repacks lm's engine (before it serves). */
struct weight_node *weight_node_source(const struct weight_node_config *cfg,
                                       struct loaded_model *lm, const char *name, char *err);
/* lm: zeroed storage the loader fills when the header arrives. */
struct weight_node *weight_node_joiner(const struct weight_node_config *cfg,
                                       struct loaded_model *lm, const struct loader_opts *lo,
                                       char *err);
/* After fabric_node_free (the fabric thread is gone). */
void weight_node_free(struct weight_node *wn);

/* One round of the stream on the calling thread: only before fabric_node_start (a joiner waiting
 * for its header), with tp_poll between rounds; afterwards the fabric thread does this. */
void weight_node_step(struct weight_node *wn);

/* Any thread. */
int weight_node_engine_ready(const struct weight_node *wn);    /* lm's engine is started */
int weight_node_embedding_ready(const struct weight_node *wn); /* span 0 here, usable */
/* Blocks usable here: consecutive blocks with the embedding, at most L-1 until the head has
 * arrived too (k = L means "serves alone"). */
int weight_node_k(const struct weight_node *wn);
int weight_node_complete(const struct weight_node *wn);
/* NULL, or why the stream failed for good. */
const char *weight_node_failed(const struct weight_node *wn);
/* Any thread, a joiner: addr (a fabric address) holds the whole model, back or new: the stream
 * pulls from it next, at once (weight_stream_add_peer). Nothing on a source. */
void weight_node_add_holder(struct weight_node *wn, const char *addr);
/* Downstream peers served everything / connected now (holder side). */
int weight_node_served(const struct weight_node *wn);

#endif
