/* coop: cooperative ("zigzag") execution of one model across two serving processes.
 *
 * A joiner holds layers [0, k) of L. Each step its scheduler runs the embedding and those layers
 * on its own KV cache, then ships the step's hidden states (every sequence of the step in one
 * MSG_ACTIVATIONS, transport/wire.h) to a helper, a node holding the whole model, over the
 * fabric (cluster/fabric_node.h). The helper runs [k, L) and the head on its own KV blocks for
 * those sequences, inside its own step where it can (the rows join it at layer k, so each
 * layer's weights are read once for both: coop_config.fuse, sched_coop.forward), samples with the
 * sequence's sampler (sent once in MSG_COOP_OPEN, its generator state returned with every token)
 * and answers MSG_COOP_TOKENS; the step completes when the reply comes. k moves up only (but for a
 * hand-over, below), between steps: the KV of the layers that became local is transferred from the helper (one
 * MSG_COOP_KV_REQ naming every running sequence, answered by MSG_COOP_KV chunks that the helper's
 * compute thread reads out between its steps, at most kv_window bytes (4 MiB) per between-step
 * window, and that the joiner installs as they arrive) or recomputed from the saved inputs of
 * layer k (all sequences' rows in the same engine calls), whichever a cost estimate says is
 * faster (--coop-kv; docs/cluster.md has the figures); a sequence whose transfer fails or is
 * refused is recomputed. At k = L the joiner serves alone and closes its sequences
 * at the helper (MSG_COOP_CLOSE), which frees their KV.
 *
 * Before the embedding: a pulling joiner serves as soon as its header has verified and its helper
 * is connected, before the token embedding table (span 0, often bigger than a layer) has arrived
 * (coop_config.embedding_remote). Until it has, k is 0 and each step's rows go to the helper as
 * token ids (MSG_ACTIVATIONS of dtype WIRE_TOKENS, layer 0): the helper runs the embedding, every
 * layer and the head. Those positions keep only their token ids here; when k later rises their
 * KV is transferred, or recomputed by running the embedding on the saved ids and then the
 * layers. coop_set_embedding_local says the table is here; the scheduler picks it up at its next
 * step boundary, from which steps embed here and send hidden states as above.
 *
 * Another helper: a joiner given alt_helpers (cluster mode: the other nodes that serve the model)
 * takes one of them as its helper when its helper's connection closes. The sequences that were
 * open at the dead helper fail as before (their upper layers' KV went with it; the error names the
 * dead helper); new sequences are opened at the new helper and served while partial.
 *
 * Pipelining (coop_config.pipeline, --coop-pipeline): the joiner does not wait for step n's
 * tokens before it computes step n+1's layers [0, k) and sends them; step n+1 holds only rows that
 * do not depend on step n's tokens (a sequence whose step-n rows end in a logit row is left out
 * until its token is back; a prompt's next chunk needs only the earlier chunk's KV of layers
 * [0, k), here already). At most 2 steps are in flight; k rises (and the KV is filled) only when
 * none is. The helper runs a peer's messages in order (the fused step takes at most one step of
 * a peer, the next waits), so a sequence's chunks reach its KV in order; replies come in order.
 * A step of more rows than one message holds runs unpipelined once the flights are back.
 *
 * Hand-over (coop_config.handover, a cluster member that serves alone): a node that leaves the
 * engine (a capacity scale-in) hands its running sequences to another replica with
 * coop_handover(receiver's fabric address): the receiver becomes its helper and, at the step
 * boundary after its connection opened, k falls from L to 0: every running sequence is opened
 * there (with its sampler as it is now) and its computed positions sent as token ids for the
 * receiver to compute their KV (a recompute, one batch), and from then on each step's rows go
 * there as token ids and its tokens come back, as for a joiner before its embedding: this node's
 * front keeps streaming them, its engine computes nothing for them. A sequence that cannot be
 * moved, or a receiver that refuses or is not connected within HO_WAIT_S, gives the hand-over up
 * with nothing moved (they finish here, as before). Once no sequence is left at the receiver, or
 * when the node serves again (coop_handover_end) or the receiver is gone, k is L again: the KV
 * of the sequences still running is filled (transfer or recompute from their token ids, as a
 * joiner's rise), so none fails because of the scale-in. A node whose own steps run remote right
 * now (k < L) answers other nodes' steps with an error at once: two hand-overs into each other
 * never wait on each other.
 *
 * Threads: the scheduler's compute thread calls the sched_coop hooks (serving/sched/scheduler.h);
 * the fabric thread runs the message handlers, which validate and queue and never block;
 * coop_set_resident may be called from any thread.
 *
 * Who raises k: coop_set_resident(c, k) — the weight puller calls it as layers verify (layers
 * [0, k) resident and usable by the engine, which includes the embedding: k > 0 is never run
 * before the embedding is local); the test option --resident-schedule does it at given steps
 * ("STEP:e" there: the embedding arrives at STEP, remote until then). The scheduler picks the new
 * value up at its next step boundary. */
#ifndef STRATA_COOP_H
#define STRATA_COOP_H

#include "cluster/fabric_node.h"
#include "serving/api/metrics.h"
#include "serving/sched/scheduler.h"
#include "serving/engine/engine.h"

/* How the KV of layers that became local arrives (--coop-kv). */
enum coop_kv {
    COOP_KV_AUTO = 0,  /* the faster of the two by the measured link rate and recompute cost */
    COOP_KV_TRANSFER,  /* from the helper (recompute only when the transfer fails) */
    COOP_KV_RECOMPUTE, /* from the saved inputs of the old k */
    COOP_KV_COMPARE,   /* measuring: transfer, then recompute over it, log both times and whether
                          the bytes are identical (tests and benchmarks) */
};
/* Tests: a helper that answers KV requests wrongly (--test-kv-fault). */
enum coop_kv_fault {
    KV_FAULT_NONE = 0,
    KV_FAULT_SEQ,    /* the first chunk names another sequence */
    KV_FAULT_LAYER,  /* the first chunk names the next layer */
    KV_FAULT_SHORT,  /* the first chunk is cut 3 bytes short */
    KV_FAULT_DIE,    /* the helper exits after sending the first chunk */
    KV_FAULT_REFUSE, /* the second sequence of a request is refused (status 1), the rest sent */
};
/* "auto" | "transfer" | "recompute" | "compare" -> enum coop_kv, -1 otherwise; likewise
 * "seq" | "layer" | "short" | "die" | "refuse" -> enum coop_kv_fault. */
int coop_kv_parse(const char *s);
int coop_kv_fault_parse(const char *s);

struct coop_config {
    struct fabric_node *fabric;
    struct engine *e;
    struct serve_metrics *m;
    int eos_id, bos_id; /* masked on rows that ask for it (min_tokens, ignore_eos) */
    const int *eog_ids; /* and these (the tokenizer's end-of-generation tokens) */
    int n_eog;
    /* joiner */
    int resident;         /* layers resident at start: 0..L (L: not a joiner) */
    int embedding_remote; /* the embedding table is not here yet: resident must be 0 */
    const char *schedule; /* tests: "STEP:K,STEP:K,..." (at scheduler step STEP, k becomes K) */
    int helper_peer;      /* fabric peer that runs the rest (configured peers come first: 0) */
    /* other fabric peers that serve the whole model in their engine (a cluster's other holders):
     * when the helper's connection closes, the first of them that is connected (or the first to
     * connect) becomes the helper for the steps from then on */
    const int *alt_helpers;
    int n_alt_helpers;
    int dtype;      /* enum wire_dtype of the activations (WIRE_F32: exact) */
    int timeout_ms; /* a reply later than this fails the step (default 30000) */
    int kv_mode;    /* enum coop_kv */
    /* joiner: keep up to 2 steps in flight (--coop-pipeline on): while the helper runs step n's
     * layers [k, L), the scheduler runs step n+1's layers [0, k) here for the work that does not
     * need step n's tokens (sched_coop.send / recv) */
    int pipeline;
    /* helper: serve remote sequences (a node that holds the whole model) */
    int serve_remote;
    int fuse; /* 1: remote steps run inside our own steps (--coop-fuse on, the default), on a
                 backend whose rows do not depend on their batch; 0: between them */
    size_t kv_window;  /* KV answer bytes sent between two of our steps (0: KV_WINDOW_BYTES) */
    int handover;      /* 1: this node may hand its sequences over (a cluster member) */
    int test_kv_fault; /* enum coop_kv_fault */
};

struct coop;
struct coop *coop_new(const struct coop_config *cfg, char *err);
/* Registers the handlers on cfg->fabric (before fabric_node_start). */
int coop_attach(struct coop *c, char *err);
void coop_free(struct coop *c);

/* Any thread: layers [0, k) are resident. k only moves up (a lower value is ignored); the
 * scheduler applies it at its next step boundary. */
void coop_set_resident(struct coop *c, int k);
/* Any thread: the embedding table has arrived (embedding_remote ends at the next step). */
void coop_set_embedding_local(struct coop *c);
/* 1 while the scheduler still sends token ids (the embedding runs on the helper). */
int coop_embedding_remote(const struct coop *c);
/* Any thread: hand this node's running sequences to the replica at fabric address `receiver`
 * (see above). 0, or -1 (err) when it cannot (no hand-over here, a partial node, no fabric slot).
 */
int coop_handover(struct coop *c, const char *receiver, char *err);
/* Any thread: the node serves again: sequences handed over come back (k = L at the next
 * boundary). */
void coop_handover_end(struct coop *c);
/* Hand-overs done, sequences moved, hand-overs given up (nothing moved) so far. */
void coop_handover_counts(const struct coop *c, unsigned long long *done, unsigned long long *seqs,
                          unsigned long long *failed);
/* The target set by coop_set_resident (or the schedule), and the k the scheduler runs now. */
int coop_resident(const struct coop *c);
int coop_current_k(const struct coop *c);

/* The scheduler's hooks (sched_config.coop); the scheduler is given them by serve. */
struct sched_coop coop_sched_hooks(struct coop *c);
/* The helper's compute thread is woken through this scheduler when remote work arrives. */
void coop_set_scheduler(struct coop *c, struct scheduler *s);

/* Any thread: fabric peer `peer` serves the whole model (a holder that came back, or a new one):
 * it may take over as the helper once ours is gone, as alt_helpers do. */
void coop_add_helper(struct coop *c, int peer);

#endif
