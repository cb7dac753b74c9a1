/* control: the cluster's control thread inside `strata serve` (membership, leadership, scaling).
 *
 * One thread runs a libuv loop with a raft instance (Canonical's C Raft, libuv I/O, data dir on
 * tmpfs on the appliance) whose state machine is cluster/cluster_state.h, over the authenticated
 * transport of cluster/raft_transport.h. The nodes of --cluster bootstrap the configuration; a
 * node started with an id outside that list asks them to add it (the leader runs raft_add and
 * raft_assign(VOTER)).
 *
 * Every heartbeat (cfg.heartbeat_ms) each node sends a load report (cluster/cluster_cmd.h
 * MSGC_LOAD: queue, running, KV use, predicted TTFT, tokens/s, the step model, what it holds) to
 * the leader over the sealed control channel. Only the leader decides, and only through the log:
 * a member silent for cfg.dead_ms is committed down (and up again when it reports), holdings are
 * committed when they change, and the pure planner (cluster/planner.h) runs on the committed view
 * plus the latest reports; its actions are committed as CMD_SCALE, one batch at a time (the next
 * planner call waits until the batch committed, so it sees its own decisions). A leader that
 * loses its quorum stops deciding: raft no longer calls it leader. A member down for cfg.remove_ms
 * leaves raft's configuration (cluster/voter_policy.h: never below 3 voters), so the quorum counts
 * the nodes the rack still has; a removed node that comes back finds no leader (none talks to a
 * server outside the configuration) and asks to join again. The node a committed decision
 * names carries it out through the executor table (struct cluster_exec), filled in by the serving
 * process (the live scale-out) or by a test's fake.
 *
 * control_json / control_metrics are called from the HTTP thread; they read a copy published
 * under a mutex. */
#ifndef STRATA_CLUSTER_CONTROL_H
#define STRATA_CLUSTER_CONTROL_H

#include "cluster/cluster_cmd.h"

#include <stddef.h>
#include <stdint.h>

#define CONTROL_REMOVE_MS 60000

struct control_cfg {
    uint64_t id;          /* --node-id */
    const char *peers;    /* --cluster "1@10.0.0.1:7100,2@10.0.0.2:7100,..." */
    const char *addr;     /* --cluster-addr: our control address when id is not in peers */
    const char *key_file; /* --key-file: the cluster key (64 hex digits) */
    const char *dir;      /* --raft-dir: raft's data (default /run/strata-raft-ID) */
    const char *http;     /* our API host:port, advertised in /v1/cluster (0.0.0.0, ::: the
                             host of our control address) */
    const char *fabric;   /* our fabric address host:port (--listen): joiners pull from it */
    const char *gpu;      /* GPU type name ("cpu") */
    const char *rack;     /* --rack: failure domain (cluster_cmd_rack_ok); NULL or "": none given */
    const char *model;    /* model this node serves (name), NULL: none */
    int n_layers;         /* its L */
    double model_bytes;
    int standby;          /* --cluster-standby: the model is on this node but not in its engine */
    int heartbeat_ms;     /* H (default 200) */
    int dead_ms;          /* silent this long: down (default 5 H) */
    int remove_ms;        /* down this long: out of raft's configuration (cluster/voter_policy.h;
                             0: never; `strata serve` defaults to CONTROL_REMOVE_MS) */
    int handshake_ms;     /* a connection's handshake deadline (0: SCONN_HANDSHAKE_MS) */
    double ttft_slo_ms;   /* the planner's TTFT target for the model */
    double tpot_slo_ms;   /* ... and its TPOT target (0: none: prefill chunks are not bounded) */
    int max_step_tokens;  /* the scheduler's token budget per step (0: the planner's default) */
    int max_seqs;         /* the scheduler's sequences at once (--max-batch; 0: no slot bound) */
    double link_cap_Bps;  /* what a weight stream from here may take (its pacing, the fabric's
                             configured rate): reported as the link until one is measured; 0 */
    int proactive;        /* --cluster-planner proactive: the forecast scales up ahead of the SLO
                             and busy replicas leave by hand-over (capacity scale-in); 0 reactive:
                             the predicted TTFT past the SLO, idle replicas leave */
    double keep_alive_ms; /* idle time before scale-down (default 10000) */
    int scaleout_timeout_ms; /* a scale-out not done by then is abandoned (default 600000) */
    int scaleout_stall_ms;   /* a scale-up whose joiners gained no layer for this long is
                                abandoned and planned again (default 120000) */
    int replicas_cached;     /* R (default 1) */
    const char *recover;     /* --cluster-recover "1,3": force this raft configuration at start
                                (cluster/recover_req.h); NULL: none */
    const char *test_refuse; /* --test-refuse KIND (tests only): the executor refuses every
                                "replicate" or "scale-up" decision; NULL: none */
    int test_scale_in_ms;    /* --test-scale-in MS (tests only): instead of the planner, the
                                busiest replica hands its sequences over every MS and comes back */
};

/* What the serving process gives the control thread (called on the control thread; must be
 * thread-safe and must not block). */
struct control_serving {
    void *ctx;
    void (*load)(void *ctx, struct cl_load *out);
    /* A member opened a forward channel (cluster/fwd_channel.h): fd, a socket carrying HTTP/1.1
     * from node `from`, becomes a connection of this node's front; the callee owns fd. NULL:
     * forward channels are refused. */
    void (*forward_in)(void *ctx, int fd, uint64_t from);
};

/* The executor: carries out a committed decision that names this node. Each call starts the work
 * and returns 0, or -1 with err: a refusal, which this node's next load reports carry ("refused
 * decision N: err") until the leader has abandoned that scale-out (SCALE_DONE ok = 0 naming this
 * node and the reason; the planner decides again without this node for that model). Work that
 * fails after it started goes the same way through control_exec_failed. Progress comes back
 * through control_set_holding. Called on the control thread. */
struct cluster_exec {
    void *ctx;
    int (*scale_up)(void *ctx, const char *model, uint64_t source, const uint64_t *chain,
                    int n_chain, char *err);
    /* handover: the replica that takes the node's running sequences (a capacity scale-in:
     * cluster/coop.h's hand-over), 0: none (what runs finishes here) */
    int (*scale_down)(void *ctx, const char *model, uint64_t handover, char *err);
    int (*replicate)(void *ctx, const char *model, uint64_t source, char *err);
    int (*drop_host)(void *ctx, const char *model, char *err);
};

struct control;

/* Whether cfg asks for a cluster at all (--cluster given). */
int control_enabled(const struct control_cfg *cfg);

struct control *control_start(const struct control_cfg *cfg, const struct control_serving *sv,
                              const struct cluster_exec *ex, char *err);
void control_stop(struct control *c);

/* This node's holding of a model (thread-safe; the next load report carries it). */
void control_set_holding(struct control *c, const char *model, int host, int engine,
                         int layers_resident, int n_layers);

/* The work of a decision that names this node and `model` (a scale-up or replication in
 * progress) failed after the executor had started it (the join gave up): reported like a refusal,
 * with why (thread-safe). */
void control_exec_failed(struct control *c, const char *model, const char *why);

/* Where a completion request of `model` with prompt_tokens goes (the front's route; any thread):
 * planner_route (least predicted TTFT; a joining node with its split point counts) on this node's
 * copy of the committed state plus the load reports it holds. The leader holds every node's latest
 * report; a follower holds only its own, so it routes on the committed replicas with the other
 * nodes' loads unknown (taken as idle). Among replicas predicted equal, this node wins (no hop),
 * then the lowest id. `model` names a model of the cluster; "" or an unknown name means this
 * node's model, else the cluster's only model, except that this node's own model, named before
 * the state knows it, is never taken for another ("none": served here). http_out gets "local"
 * (this node), "none" (no live replica: the caller holds the request or serves it here if it
 * can), or the chosen node's API address host:port, with *node its id. 0, or -1 with err (a
 * view the planner refuses). */
int control_route(struct control *c, const char *model, int prompt_tokens, char *http_out,
                  size_t cap, uint64_t *node, char *err);
/* The model this node now serves (an empty member that joined one; thread-safe), its bytes and
 * its scheduler's token budget per step. */
void control_set_model(struct control *c, const char *model, int n_layers, double bytes,
                       int max_step_tokens);
uint64_t control_id(const struct control *c);
/* The step model of a member (not this node) whose own has the identity step_id (the model's
 * header and the hardware: serving/sched/step_cache.h step_identity_hash) and is fitted (timed
 * steps, or calibrated), from the load reports this node holds (the leader relays every node's):
 * the most-timed one. 1 with *m, its error, whether it covers every calibration shape and the
 * node; 0 when no member has one (thread-safe). */
struct step_model;
int control_member_step(struct control *c, uint64_t step_id, struct step_model *m, double *err,
                        int *calibrated, uint64_t *node);
/* A member's fabric address from the replicated state; -1 when unknown or it has none. */
int control_node_fabric(struct control *c, uint64_t id, char out[CL_STR_LEN + 1]);

/* Fabric addresses of the live members (not us, not those in skip) holding the whole model in
 * host memory, in member order: where a joiner resumes when its source dies. Returns how many. */
int control_holders_fabric(struct control *c, const char *model, const uint64_t *skip, int n_skip,
                           char (*out)[CL_STR_LEN + 1], int cap);
/* 1 when the live member with fabric address `fabric` serves the whole model in its engine (a
 * joiner may take it as its helper), else 0. */
int control_fabric_serves(struct control *c, const char *model, const char *fabric);

/* Whether a request for `model` (resolved as control_route resolves it) must fail at once: the
 * cluster recorded the model lost (CMD_MODEL: no live node holds some of its layers), the committed
 * state still says so, and this node does not hold it whole itself. 1 with why (the model, the
 * missing layers, since when), else 0. Any thread. */
int control_model_lost(struct control *c, const char *model, char *why, size_t cap);

/* A request relayed to node (+1) or ended there (-1): control_route counts what this node has in
 * flight at each member beyond the member's last report (thread-safe). */
void control_routed(struct control *c, uint64_t node, int delta);

/* A relay could not connect to node: routes avoid it for --cluster-dead-ms (by then the leader
 * has committed it down, or it answered again). Thread-safe. */
void control_unreachable(struct control *c, uint64_t node);

/* A sealed channel to member `node` for a forwarded request (cluster/fwd_channel.h): any thread
 * but the control thread; blocks up to timeout_ms. The socket, -1 with err (nothing sent: the
 * node is unknown, unreachable or refused the handshake), -2 when cancel_fd became readable. */
int control_forward_open(struct control *c, uint64_t node, int timeout_ms, int cancel_fd,
                         char *err);

/* Recovery from a lost quorum (POST /v1/cluster/recover; any thread but the control thread).
 * The control thread checks r (recover_check: r names this node and only known members; unless
 * r->force, no leader seen for 20 heartbeats), closes raft, opens it again on the same data dir,
 * appends the configuration "this node alone" with raft_recover, moves the term on and starts
 * it: it leads at once, adds the other nodes r names back as voters (raft_add + assign), and the
 * rest rejoin through JOIN. Blocks until raft runs again
 * (at most 10 s). 0 with msg saying what was done, or an HTTP status (400 a bad list, 409 refused
 * in this state or another recovery running, 500 raft did not start again, 503 stopping, 504 no
 * answer in time) with msg the reason. Committed entries only the other old voters had are lost
 * (docs/control.md). */
struct recover_req;
int control_recover(struct control *c, const struct recover_req *r, char *msg, size_t cap);

/* An operator's request to a state-changing endpoint signed with the cluster key
 * (cluster/signed_request.h: X-Strata-Signature's value sig, sig_len bytes), checked against this
 * node's id, wall clock and nonces seen. 0, or -1 with err the reason (any thread). */
int control_check_signed(struct control *c, const char *method, const char *path, const char *sig,
                         size_t sig_len, const void *body, size_t len, char *err);

/* GET /v1/cluster (JSON) and the cluster part of /metrics: malloc'd text, *len its length. */
char *control_json(struct control *c, size_t *len);
char *control_metrics(struct control *c, size_t *len);
/* The API address ("host:port") of member id, for the operator's page to read its /metrics
 * through a forward channel: 0, or -1 when id is no member of the committed state. */
int control_member_http(struct control *c, uint64_t id, char *out, size_t cap);

#endif
