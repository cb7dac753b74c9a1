/* coop_internal: what the coop*.c files share (not a public header: cluster/coop.h is).
 *
 * One struct coop per serving process. Three threads touch it, and each field below says whose
 * it is: the compute thread (the scheduler's hooks: the joiner's steps and KV fill, the helper's
 * work, fused steps and KV answers), the fabric thread (the message handlers of coop_rx.c, which
 * check and queue and never block), and any thread (the atomics: k and the embedding's arrival).
 * The queues between them are guarded by mu (replies, KV chunks, the helper session) and wmu (the
 * helper's work). The functions below are each defined in the file their prefix names
 * (coop_joiner_ in coop_joiner.c, ...). */
#ifndef STRATA_CLUSTER_COOP_INTERNAL_H
#define STRATA_CLUSTER_COOP_INTERNAL_H

#include "cluster/coop.h"

#include "os/common/errmsg.h"
#include "os/runtime/clock.h"
#include "os/runtime/log.h"
#include "serving/engine/sampler.h"
#include "transport/wire.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#define MAX_SCHEDULE 64

/* A hand-over's states: NONE; ASKED (the receiver's connection is coming: the scheduler lowers k
 * to 0 at the step boundary after it opened); AWAY (k = 0: the receiver runs every layer of this
 * node's sequences; back at k = L once none is left there, or the receiver is gone); BACK (the
 * node serves again: k = L at the next boundary, the KV brought back by the fill). */
enum coop_ho { HO_NONE, HO_ASKED, HO_AWAY, HO_BACK };
#define HO_WAIT_S 10.0 /* a receiver not connected by then: the hand-over is given up */

/* Joiner: a sequence some of whose layers run on the helper. x holds, for every computed position,
 * a hidden state saved at the input of layer xl[pos] (what was sent at the time, or where the last
 * recompute left it): the input of a KV recompute. A transfer does not advance it, so after one
 * the older positions' inputs are of a lower layer than the newer ones'. xl[pos] = -1: the position
 * was sent as its token id (the embedding was not here yet) and only tok[pos] is saved; a
 * recompute runs the embedding first. */
struct jseq {
    unsigned id;
    unsigned session; /* the helper connection it was opened on */
    int helper;       /* that helper's fabric peer */
    int opened;
    float *x; /* ctx x dim */
    int *xl;  /* ctx */
    int *tok; /* ctx: every computed position's token id */
};

/* Joiner: a reply from the helper, queued by the fabric thread (on_tokens). */
struct reply {
    struct reply *next;
    size_t len;
    uint8_t msg[];
};

/* Joiner: a pipelined step in flight (coop_joiner_send): its message's step id, the helper session and
 * peer it went to, its rows, and the sequence of each logit row (to check the answer). */
#define COOP_MAX_FLIGHTS 2

struct flight {
    uint64_t step;
    unsigned session;
    int helper;
    int rows, want, token_rows;
    unsigned *seq; /* max_seqs */
};

/* Helper: another node's sequence; its KV blocks come from our pool. */
struct hseq {
    int peer;
    unsigned id;
    struct sampler smp;
    int *blocks;
    int n_blocks;
    int n_pos;     /* positions [0, n_pos) computed here */
    int max_layer; /* the highest first layer of any of its rows: layers [max_layer, L) of every
                      computed position are in our KV */
};

/* Fabric thread -> compute thread. */
enum { W_OPEN, W_ACT, W_CLOSE, W_GONE, W_KV_REQ };

struct work {
    struct work *next;
    int kind, peer;
    uint32_t layer, rows, wants; /* W_ACT: first layer, rows, rows that want a token */
    uint64_t step;               /* W_ACT: the sender's step id */
    size_t len;
    uint8_t msg[];
};

/* Fabric thread's view of a peer that sends us work, for validation. */
struct peer_state {
    uint64_t last_step;
    unsigned *open; /* sequence ids opened and not closed */
    int n_open, cap_open;
};

#define COOP_MAX_ALT 16

struct coop {
    /* Set by coop_new, read-only afterwards (any thread). */
    struct coop_config cfg;
    struct engine *e;
    struct serve_metrics *m;
    int L, dim, ctx, vocab;
    /* Any thread: k's target (coop_set_resident) and the k the scheduler runs now */
    atomic_int target, k_now;
    /* the embedding table is here (coop_set_embedding_local); emb_now: as the scheduler runs */
    atomic_int emb_target, emb_now;
    /* Compute thread: --resident-schedule, applied at the step boundaries */
    struct {
        unsigned long long step;
        int k;            /* -1: the embedding arrives */
    } plan[MAX_SCHEDULE]; /* --resident-schedule */
    int n_sched, next_sched;

    /* Joiner: the compute thread's, except what mu guards (marked) and the atomic helper. */
    struct jseq *js;
    int n_js, cap_js;
    uint64_t step_id;
    float *x;           /* max_tokens x dim: a step's hidden states (the recompute's too) */
    uint8_t *out;       /* one encoded message (the helper's answers too) */
    pthread_mutex_t mu; /* replies, KV chunks and the helper session (the fields marked mu) */
    pthread_cond_t cv;
    struct reply *r_head, *r_tail; /* mu: MSG_COOP_TOKENS received, oldest first */
    /* pipelined steps sent and not answered yet (coop_joiner_send / _recv), oldest first */
    struct flight fl[COOP_MAX_FLIGHTS];
    int fl_first, n_fl;
    unsigned session;      /* mu: bumped when the helper connection closes */
    int helper_open;       /* mu */
    atomic_int helper;     /* the helper's fabric peer: cfg.helper_peer, or an alternative */
    char helper_why[256];  /* mu */
    int alt[COOP_MAX_ALT]; /* mu: peers that may take over as helper (cfg's, then added) */
    int n_alt;
    /* mu: KV transfers: the request being answered (0: none) and its chunks */
    uint64_t kv_want, kv_req_id;
    struct work *kv_head, *kv_tail;
    void *kv_k, *kv_v; /* one chunk's keys and values in host order (the helper's too) */
    struct {
        uint32_t *seq, *n; /* WIRE_COOP_KV_MAX_SEQS */
    } kv_ask;              /* the KV request being sent: its sequences and position counts */
    /* the cost model: measured KV transfer rate (bytes/s) and recompute time per layer x
     * position (s); before the first recompute, the local layers' time per row and layer */
    double link_bps, lp_s, lp_prior_s;
    /* while partial (logged when every layer is here): seconds in our layers and waiting for
     * answers, steps sent and of those sent with another in flight */
    double t_local, t_wait;
    unsigned long long n_sent, n_piped;
    unsigned long n_refused; /* helper: steps refused for lack of KV blocks */
    int logged_k0, logged_k1;

    /* Hand-over (coop_handover.c): this node's sequences to another replica. ho_state and
     * ho_peer any thread; ho_tokens and the counts the compute thread's. */
    atomic_int ho_state;     /* enum coop_ho */
    atomic_int ho_peer;      /* the receiver's fabric peer, -1: none */
    _Atomic double ho_asked; /* clock_now() when it was asked (it gives up after HO_WAIT_S) */
    int ho_tokens;           /* AWAY: the steps send token ids (the receiver runs every layer) */
    atomic_ullong ho_done, ho_seqs, ho_failed;

    /* Helper. */
    struct scheduler *sched;                     /* set before the fabric starts; poked by it */
    pthread_mutex_t wmu;                         /* the work queue */
    struct work *w_head, *w_tail;                /* wmu: fabric thread -> compute thread */
    struct peer_state ps[FABRIC_MAX_NODE_PEERS]; /* fabric thread */
    struct {
        uint32_t *seq, *pos, *tok; /* WIRE_MAX_ACT_TOKENS (seq), hx_rows */
        uint8_t *flags;
        float *x;                /* hx_rows x dim */
        uint32_t *kv_seq, *kv_n; /* WIRE_COOP_KV_MAX_SEQS */
    } check; /* fabric thread: a message decoded to be checked (the compute thread decodes again) */
    struct kvjob *kv_jobs; /* compute thread: KV answers under way (coop_kvserve_pump) */
    struct hseq *hs;       /* compute thread: other nodes' sequences */
    int n_hs, cap_hs;
    /* compute thread, from here on */
    struct work *held_head, *held_tail; /* taken from the queue, not run yet (coop_helper_serve) */
    float *hx, *logits; /* a remote step run apart: hx_rows x dim, max_seqs x vocab */
    /* a fused step (coop_fuse_forward): our rows first, then the remote ones as they join; x is
     * max_tokens x dim, logits (2 max_seqs) x vocab: our logit rows, then theirs */
    struct {
        float *x, *logits;
        int *tok, *pos, *logit_rows; /* max_tokens */
        const int **blocks;
        struct hseq **hs;
        uint8_t *flags;
    } fused;
    /* One MSG_ACTIVATIONS' rows as encoded (the joiner's step) or decoded (a remote step at the
     * helper); seq also holds a CLOSE's ids and a step's sequence of each logit row. */
    struct {
        uint32_t *seq, *pos, *tok; /* WIRE_MAX_ACT_TOKENS (seq), hx_rows */
        uint8_t *flags;
    } rows;
    /* An engine batch assembled here: a chunk of a remote step run apart (helper), a batch of
     * saved inputs recomputed (joiner). */
    struct {
        int *pos, *tok, *logit_rows; /* max_tokens */
        const int **blocks;
    } batch;
    struct wire_coop_token *toks; /* a step's answer (helper), decoded reply (joiner) */
    uint32_t hx_rows;             /* rows of one activations message at f16 (the most) */
};

/* coop_joiner.c: the scheduler's joiner hooks (struct sched_coop); a sequence's saved inputs */
int coop_joiner_resident(void *ctx, unsigned long long steps);
int coop_joiner_ready(void *ctx);
int coop_joiner_step(void *ctx, const struct batch *b, int k, const unsigned *seq,
                     struct sampler *const *smp, const unsigned char *mask, int *tokens, char *err);
int coop_joiner_send(void *ctx, const struct batch *b, int k, const unsigned *seq,
                     struct sampler *const *smp, const unsigned char *mask, char *err);
int coop_joiner_recv(void *ctx, int *tokens, uint64_t *rng, char *err);
const char *coop_joiner_lost(void *ctx, unsigned seq);
void coop_joiner_all_local(void *ctx);
void coop_joiner_seq_end(void *ctx, unsigned seq);
struct jseq *coop_joiner_find(struct coop *c, unsigned id);

/* The joiner's sequence table, its helper's answers and CLOSE (the hand-over uses them too). */
struct jseq *coop_joiner_js_get(struct coop *c, unsigned id, char *err);
void coop_joiner_js_drop(struct coop *c, struct jseq *j);
int coop_joiner_send_close(struct coop *c, int helper, const uint32_t *ids, uint32_t n, char *err);
int coop_joiner_wait_reply(struct coop *c, int helper_peer, uint64_t step, unsigned session,
                           struct wire_coop_tokens *t, char *err);
/* The helper's answer t to a step: 0 (want tokens, for seq_of_row's sequences), -1 (err) failed or
 * not what was sent, SCHED_COOP_REFUSED (err) refused for lack of KV blocks there. */
int coop_joiner_reply_check(struct coop *c, int hp, const struct wire_coop_tokens *t, int want,
                            const unsigned *seq_of_row, char *err);

/* Rows go as hidden states (1) or as token ids (0: before the embedding, or handed over). */
static inline int coop_rows_embedded(struct coop *c)
{
    return atomic_load(&c->emb_now) && !c->ho_tokens;
}

/* coop_handover.c: the k a boundary runs given the hand-over (k: the layers resident), and the
 * lower hook (every running sequence opened at the receiver, its positions recomputed there) */
int coop_handover_k(struct coop *c, int k);
int coop_handover_lower(void *ctx, int n_seqs, const unsigned *seq, struct sampler *const *smp,
                        const int *const *tok, const int *n, char *err);

/* coop_kvfill.c: the fill hook (k rose from k0 to k1) */
void coop_kvfill_fill(void *ctx, int n_seqs, const unsigned *seq, const int *const *blocks,
                      const int *n, int k0, int k1, int *rc, char *errs);

/* coop_helper.c: the serve hook; another node's sequences, steps and answers */
int coop_helper_serve(void *ctx, int hold);
struct hseq *coop_helper_find(struct coop *c, int peer, unsigned id);
void coop_helper_seq_free(struct coop *c, struct hseq *h);
/* Rows of another node's step: every row's sequence open here, KV blocks for its position. 0, -1
 * (err: why; the step is answered with it), or WIRE_COOP_REFUSED (err: why): the pool is dry, and
 * the step is refused (answered with that status; the joiner sends it again later). */
int coop_helper_rows_ready(struct coop *c, int peer, uint32_t layer, const uint32_t *seq,
                           const uint32_t *pos, uint32_t n, char *err);
/* A remote row's token from its logits (lg, clobbered), drawn with the sequence's sampler. */
struct wire_coop_token coop_helper_token(struct coop *c, struct hseq *h, uint8_t flags, float *lg);
void coop_helper_reply_tokens(struct coop *c, int peer, uint64_t step, uint32_t n_tok,
                              uint32_t rows);
/* Answers step with status (1 failed, WIRE_COOP_REFUSED) and msg. */
void coop_helper_reply_error(struct coop *c, int peer, uint64_t step, int status, const char *msg);
void coop_helper_run_step(struct coop *c, const struct work *w); /* apart from ours */
void coop_helper_take_queue(struct coop *c); /* the fabric thread's work onto the held list */

/* coop_kvserve.c: KV requests (queued as jobs), answered between our steps by the pump; a peer's
 * jobs dropped (-1: all) */
void coop_kvserve_request(struct coop *c, const struct work *w);
int coop_kvserve_pump(struct coop *c);
void coop_kvserve_drop(struct coop *c, int peer);

/* coop_fuse.c: the forward hook (our step with other nodes' steps inside) */
int coop_fuse_forward(void *ctx, const struct batch *b, float *logits, char *err);

#endif
