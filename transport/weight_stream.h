/* weight_stream: layer-wise weight streaming with chain forwarding and resume.
 *
 * What moves is a "weight image + manifest": the GGUF header bytes (metadata and tensor infos, so
 * a joiner knows the config), then the weight image laid out by serving/engine/model.h, whose
 * spans (0 embedding, 1..L blocks, L+1 head) are contiguous byte ranges in execution order. The
 * manifest names the model (BLAKE2b-256 of the header bytes), and gives the header length and
 * CRC-32C and per span its offset, size and CRC-32C. A "unit" is the header (unit 0) or a span
 * (unit 1+s); units travel in chunks of at most chunk_size bytes.
 *
 * One weight_stream per node. A holder (the source, or any node that has or is receiving the
 * model) accepts downstream peers and pushes units in order, each chunk as soon as it holds it,
 * which makes a chain source -> n1 -> n2 ... cost about one transfer plus pipeline fill. A joiner
 * pulls from the first reachable peer of its list; when that peer dies it reconnects to the next
 * and sends the units it has verified, so only the rest comes again. A unit is verified by its
 * CRC when its last chunk lands; one that fails is re-fetched. Over a transport with one-sided
 * access (rdma) the joiner reads the image from the holder's registered arena itself.
 *
 * A joiner skips a holder whose manifest differs from the one it is receiving, or whose header
 * its alloc_image rejects (log line, next peer); only when every peer has refused it is that fatal.
 *
 * Readiness for the engine: weight_store_span_ready() is an atomic load that any thread may poll,
 * and on_ready (if set) is called on the fabric thread as each span verifies. */
#ifndef STRATA_WEIGHT_STREAM_H
#define STRATA_WEIGHT_STREAM_H

#include "transport/transport.h"
#include "transport/wire.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

struct weight_store {
    struct wire_manifest *man; /* NULL until known */
    uint8_t *header;
    uint8_t *image;
    uint32_t n_units; /* n_spans + 1 */
    uint32_t n_chunks;
    uint32_t *unit_first;   /* first chunk index of each unit */
    uint32_t *unit_chunks;  /* chunks in each unit */
    uint32_t *unit_missing; /* chunks of the unit not yet held */
    uint8_t *chunk_have;
    _Atomic uint8_t *verified; /* per unit */
    int own_header;            /* the header buffer was allocated here (joiner) */
    atomic_int n_verified;
    /* Called on the fabric thread when span s (not the header) verifies. */
    void (*on_ready)(void *ctx, int span);
    void *ctx;
    /* Joiner: where the image goes (e.g. the arena's weight pool). Called once, when the header
     * (unit 0) has verified and before any image byte lands, so an engine can plan its arena
     * from the header (s->header, s->man->header_len) and check it against the manifest. NULL
     * with err rejects this holder's model: the joiner forgets its manifest and tries the next
     * peer. Required on a joiner. */
    uint8_t *(*alloc_image)(void *ctx, uint64_t size, char *err);
    void *alloc_ctx;
    /* Optional, on a holder whose image no longer holds every byte as the manifest has it (an
     * engine rewrote verified spans into its own layout): image bytes [off, off + len) as the
     * manifest has them, into out, for a chunk sent downstream. Called on the thread that steps
     * the stream. NULL: the image is sent as it is. (A peer that reads the image one-sided, rdma,
     * sees it as it is: such a holder must not rewrite it.) */
    void (*read_image)(void *ctx, uint64_t off, uint32_t len, uint8_t *out);
    void *read_ctx;
};

/* Source: a store that holds everything. header/image stay owned by the caller. spans must be in
 * increasing order inside image_size. The manifest (identity, CRCs) is computed here. */
int weight_store_init_full(struct weight_store *s, const char *name, const uint8_t *header,
                           uint64_t header_len, uint8_t *image, uint64_t image_size,
                           const struct wire_span *spans, uint32_t n_spans, uint32_t chunk_size,
                           char *err);
/* Joiner: an empty store that learns its manifest from the first holder. */
void weight_store_init_empty(struct weight_store *s);
void weight_store_free(struct weight_store *s);

int weight_store_span_ready(const struct weight_store *s, int span);
int weight_store_header_ready(const struct weight_store *s);
int weight_store_spans_ready(const struct weight_store *s); /* count of verified spans */
int weight_store_complete(const struct weight_store *s);

#define WS_MAX_PEERS      16
#define WS_MAX_BACKOFF_MS 5000

struct weight_stream_config {
    struct tp *t;
    struct weight_store *store;
    const char *const *peers; /* holders to pull from, in order of preference; none: a source */
    int n_peers;
    uint32_t chunk_size; /* wanted chunking when joining (0: the holder's) */
    double rate_bytes;   /* pacing of each downstream push, bytes/s (0: unpaced) */
    int corrupt_unit;    /* fault injection: corrupt the first send of this unit (-1: none) */
    int retry_ms;        /* the first wait after a failed attempt (default 200); each further
                            failure doubles it, up to WS_MAX_BACKOFF_MS, until an upstream opens */
    int no_accept;       /* the caller accepts connections and hands joiners over with
                            weight_stream_adopt (a fabric node that serves other traffic too) */
};

struct weight_stream;
struct weight_stream *weight_stream_new(const struct weight_stream_config *cfg, char *err);
void weight_stream_free(struct weight_stream *ws);
/* One round of work: accept peers, receive, verify, forward. Never blocks (call tp_poll between
 * rounds). Returns -1 with err on a fatal error (a holder with another model, out of memory). */
int weight_stream_step(struct weight_stream *ws, char *err);
/* Holder: take over an accepted connection whose first message (msg, len: a JOIN, valid during
 * the call) is for the weight stream. -1 when there is no room (the connection is closed). */
int weight_stream_adopt(struct weight_stream *ws, struct tp_conn *c, const uint8_t *msg,
                        size_t len);
/* Joiner, fabric thread: addr holds the model (again): pull from it next, at once (added to the
 * peers when new; the back-off is reset). -1 when the list is full or this is a source. */
int weight_stream_add_peer(struct weight_stream *ws, const char *addr);
/* Downstream peers that reported every span verified. */
int weight_stream_served(const struct weight_stream *ws);
/* Downstream peers connected and not done. */
int weight_stream_active(const struct weight_stream *ws);
/* Joiner: complete, DONE sent and delivered upstream. */
int weight_stream_finished(const struct weight_stream *ws);
/* The last reason the upstream connection failed ("" if none), for failure messages. */
const char *weight_stream_upstream_error(const struct weight_stream *ws);
/* Counters for logs and benchmarks. */
struct weight_stream_stats {
    uint64_t chunks_rx, chunks_tx, bytes_rx, bytes_tx, refetches, resumes, dup_chunks;
};
const struct weight_stream_stats *weight_stream_stats(const struct weight_stream *ws);

#endif
