/* control_internal: what the control_*.c files share (not a public header: cluster/control.h is).
 *
 * One struct control per node. Three kinds of owner, said per group of fields below:
 *   - set by control_start, read-only afterwards (any thread);
 *   - the control thread alone (the libuv loop: raft's callbacks, the tick, the connections);
 *   - guarded by mu: what other threads read or write too (the HTTP thread's /v1/cluster, routing
 *     and recovery; the serving process's executor and setters; the relays).
 * The functions below are each defined in the file their prefix names (control_fsm_ in
 * control_fsm.c, ...) and run on the control thread unless they say otherwise. */
#ifndef STRATA_CLUSTER_CONTROL_INTERNAL_H
#define STRATA_CLUSTER_CONTROL_INTERNAL_H

#include "cluster/control.h"

#include "cluster/cluster_state.h"
#include "cluster/fwd_channel.h"
#include "cluster/planner.h"
#include "cluster/raft_transport.h"
#include "cluster/recover_req.h"
#include "cluster/signed_request.h"
#include "cluster/voter_policy.h"
#include "os/common/errmsg.h"
#include "os/runtime/log.h"
#include "os/runtime/wall_clock.h"

#include <pthread.h>
#include <raft.h>
#include <raft/uv.h>
#include <stdint.h>
#include <time.h>

#define CTL_MAX_EXECUTED 64

struct peer {
    uint64_t id;
    char addr[CL_STR_LEN + 1];
};

/* The latest load report of a node (the leader's table; every node keeps its own). */
struct report {
    uint64_t id;
    uint64_t at_ms; /* monotonic, local */
    uint32_t seen_scales;
    struct cl_node_up node;
    struct cl_load load;
    int n_hold;
    struct cl_holding hold[CL_MAX_HOLD];
    int n_refused;
    struct cl_refusal refused[CL_MAX_REFUSED];
    uint64_t prompt_seen; /* the leader's: load.prompt_in when its forecast last counted it */
};

/* The leader's clock of a scale-up's progress: the layers its joiners held when they last gained
 * one, and when (monotonic). */
struct stall_track {
    uint32_t scale_id;
    int progress;
    uint64_t since;
};
#define CTL_MAX_STALL (2 * CL_MAX_SCALEOUTS)

/* The leader's memory of a node that refused (or failed) a scale-out of a model: no new copy or
 * joiner of that model goes there until `until` (monotonic; twice --cluster-dead-ms later: long
 * enough for its reports to correct a stale view, short enough that a transient refusal, a
 * switch asked while the old model is still leaving the engine, is asked again). */
struct refuser {
    uint64_t node, until;
    char model[CL_STR_LEN + 1];
};

#define CTL_MAX_REFUSERS 16

/* A load the leader relayed to this node (MSGC_LOADS). */
struct relayed_load {
    uint64_t id, at_ms; /* at_ms: local monotonic time the leader's copy was taken */
    struct cl_load load;
};

struct control {
    /* Set by control_start, read-only afterwards; except model, cfg.n_layers and
     * cfg.model_bytes, which control_set_model changes under mu (and which are read under mu). */
    struct control_cfg cfg;
    char peers_s[1024], addr[CL_STR_LEN + 1], dir[256], http[CL_STR_LEN + 1], gpu[CL_STR_LEN + 1],
        rack[CL_STR_LEN + 1], model[CL_STR_LEN + 1], fabric[CL_STR_LEN + 1];
    struct peer peer[CL_MAX_NODES];
    int n_peers, bootstrap_member;
    struct cluster_key key;
    struct control_serving sv;
    struct cluster_exec ex;

    /* The control thread's (control_start and control_stop set them up and tear them down around
     * it; fwd is thread-safe itself: relays open channels through it). */
    pthread_t thread;
    int thread_started;
    uv_loop_t loop;
    uv_async_t stop_async;
    uv_timer_t tick;
    struct raft_uv_transport transport;
    struct fwd_channels *fwd; /* forwarded API requests, both ways */
    struct raft_io io;
    struct raft_fsm fsm;
    struct raft raft;
    int raft_open, stopping;

    /* Guarded by mu: the replicated state (written by the FSM on the loop thread), this node's
     * holdings (written by the executor), the report table and the counters below it. */
    pthread_mutex_t mu;
    struct cl_state st;
    struct cl_holding my_hold[CL_MAX_HOLD];
    int n_my_hold;
    struct cl_refusal my_refused[CL_MAX_REFUSED]; /* decisions this node refused or failed */
    int n_my_refused;
    struct refuser refuser[CTL_MAX_REFUSERS]; /* the leader's, see struct refuser */
    int n_refusers;
    struct stall_track stall[CTL_MAX_STALL]; /* the leader's, see control_scaleout_stalled */
    int n_stall;
    struct report rep[CL_MAX_NODES];
    int n_rep;
    int raft_state;
    uint64_t leader_id, term, commit_index, applied_index, last_index;
    char leader_addr[CL_STR_LEN + 1];
    uint64_t decisions, refused, handshake_timeouts, reports_in, proposals_failed, leaderships;
    uint64_t impostors; /* messages in another node's name than the handshake proved (refused) */
    struct vp_server conf[CL_MAX_NODES]; /* raft's configuration, as this node holds it */
    int n_conf;
    int outstanding[CL_MAX_NODES]; /* requests this node has relayed to member i, in flight */
    /* Loads the leader relayed to us (a follower's view of the others, for routing only). */
    struct relayed_load relayed[CL_MAX_NODES];
    int n_relayed;
    uint64_t suspect_until[CL_MAX_NODES]; /* member i refused a relay: not routed to until then */
    /* The leader's forecast of each model's prompt tokens/s (control_leader.c), fed from the
     * reports' prompt_in every tick; started afresh with each leadership (fc_epoch). */
    struct plan_forecast fc[CL_MAX_MODELS];
    uint8_t fc_started[CL_MAX_MODELS];
    int fc_on;
    uint64_t fc_epoch;

    /* The control thread alone. */
    int inflight, was_leader;
    uint64_t leader_since, leader_since_wall, start_wall;
    uint64_t leader_seen; /* monotonic: the last tick raft knew a leader */
    uint64_t join_last;   /* monotonic: the last JOIN this node sent while leaderless */
    int conf_busy;        /* a change of raft's configuration of ours in flight */
    uint64_t keep_logged; /* the dead voter we last logged as kept */
    struct sconn *ctl;    /* to the leader */
    uint64_t ctl_leader;
    int ctl_open;
    int in_config;                /* this node is in raft's configuration */
    struct sconn *join;           /* a JOIN in flight */
    int join_next;                /* next peer to ask */
    char join_to[CL_STR_LEN + 1]; /* the leader a peer named: asked next */
    uint32_t executed[CTL_MAX_EXECUTED];
    int n_executed;
    uint32_t events_seen;
    uint32_t seen_scales; /* CMD_SCALEs this node has applied and acted on */
    uint64_t test_next;   /* --test-scale-in: the next forced scale-in, not before (monotonic) */

    /* Recovery from a lost quorum (control_recover.c). The request and its answer are guarded by
     * mu (rq_state: 0 none, 1 posted, 2 answered; recover_cv signals the answer), and so are
     * recoveries and last_recovery_ms; the rest is the control thread's. */
    uv_async_t recover_async;
    uv_timer_t recover_timer;
    pthread_cond_t recover_cv;
    int rq_state, rq_status;
    struct recover_req rq;
    char rq_msg[ERRMSG_LEN];
    struct peer recover_to[CL_MAX_NODES]; /* the named voters, at the addresses this node knows */
    int n_recover_to;
    struct peer recover_add[CL_MAX_NODES]; /* the others: added back as voters once we lead */
    int n_recover_add;
    int recovering;    /* raft is closed for a recovery: the tick does nothing */
    int recover_event; /* a recovery to record in the log once this node leads */
    uint64_t recoveries;
    uint64_t last_recovery_ms;
    struct signed_replay signed_seen; /* nonces of signed requests accepted (its own mutex) */
    uint64_t signed_refused;          /* guarded by mu: signed requests refused */
};

static inline uint64_t now_mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static inline uint64_t now_wall_ms(void)
{
    return wall_clock_ms();
}

/* The planner's view: the committed state plus the latest reports. The planner names a node by
 * its plan id, the rank of its id among the members' (an int whatever the ids are, in the same
 * order, so the planner's ties by id fall the same way); id[] maps them back. */
struct view_buf {
    struct plan_node node[CL_MAX_NODES];
    struct plan_model model[CL_MAX_MODELS];
    struct plan_scaleout so[CL_MAX_SCALEOUTS];
    uint64_t id[CL_MAX_NODES]; /* plan id -> node id */
    char gpu[CL_MAX_NODES][CL_STR_LEN + 1];
    double tput[CL_MAX_NODES * CL_MAX_MODELS];            /* [gpu_type * n_models + m] */
    struct step_model step[CL_MAX_NODES * CL_MAX_MODELS]; /* [gpu_type * n_models + m] */
    struct plan_view v;
};

/* Everything the view is made of (control_view_of is a pure function of it: no struct control,
 * no raft, no clock). */
struct view_in {
    const struct cl_state *st;
    const struct report *rep; /* the reports this node holds (the leader: every node's) */
    int n_rep;
    const struct relayed_load *relayed; /* the leader's copies of the others' loads */
    int n_relayed;
    const struct refuser *refuser; /* the leader's memory of refusals */
    int n_refusers;
    const struct plan_forecast *fc; /* [st->n_models]: the leader's forecasts, NULL: none */
    const char *model;              /* this node's model and its bytes (before its report says) */
    double model_bytes;
    double ttft_slo_ms, tpot_slo_ms, keep_alive_ms;
    int replicas_cached;
    int dead_ms; /* a report older than this is no load */
    uint64_t now_mono, now_wall;
};

/* What a node counts as until measured (docs/control.md "What the planner is fed"). */
#define VIEW_LINK_ASSUMED   1.25e9 /* bytes/s: 10 Gb/s, when no transfer was measured anywhere */
#define VIEW_FAIL_PRIOR_N   0.1    /* failures seen over ...               */
#define VIEW_FAIL_PRIOR_DAY 10.0   /* ... days: 1% a day before any evidence */
#define VIEW_STEP_FITTED    16     /* steps timed before a node's own step model is its own */

/* control.c */
int control_raft_setup(struct control *c, char *err); /* raft_init .. raft_start on c->dir */

/* control_fsm.c */
void control_fsm_init(struct control *c); /* c->fsm, before raft_init */
/* Append cmd to the log (the leader; stamps cmd->t_ms). 0, or -1 (logged) when raft refused it. */
int control_fsm_propose(struct control *c, struct cl_cmd *cmd);

/* control_channel.c: the transport's callbacks (struct raft_transport_cfg), and each heartbeat's
 * report (and the JOIN of a node outside the configuration; force: even though our configuration
 * lists us: rejoin_tick) */
void control_channel_on_ctl(void *ctx, struct sconn *s, uint64_t id, const char *addr);
void control_channel_on_fwd(void *ctx, struct sconn *s, uint64_t id, const char *addr);
void control_channel_on_refused(void *ctx, const char *peer, const char *why, int timed_out);
void control_channel_on_impostor(void *ctx);
void control_channel_report(struct control *c);
void control_channel_join_tick(struct control *c, int force);
void control_channel_rejoin_tick(struct control *c, uint64_t now, int leader_known);

/* control_conf.c: record a change of raft's configuration in the log (CONF_*); add node id at
 * addr as a voter (the leader); one policy step (the leader) */
void control_conf_event(struct control *c, uint64_t id, int change);
void control_conf_start_join(struct control *c, uint64_t id, const char *addr);
void control_conf_tick(struct control *c);

/* control_exec.c: carry out the committed decisions that name this node */
void control_exec_tick(struct control *c);

/* control_lost.c: the leader records models no live node holds whole (CMD_MODEL); how many it
 * proposed */
int control_lost_tick(struct control *c);

/* control_leader.c: membership, ended scale-outs, the planner (the leader, each heartbeat) */
void control_leader_tick(struct control *c);
/* The planner's actions act[0..n) on view vb of state st as log commands (pure): a scale-down's
 * source is the node its sequences go to (plan_action.handover), every command's reason what the
 * planner compared ("predicted TTFT 2638 ms > SLO 300 ms"). An action of a kind the log has
 * no command for, or naming a model or node outside the view, is left out (err says which; ""
 * when none was). Returns how many commands. */
int control_leader_commands(const struct view_buf *vb, const struct cl_state *st,
                            const struct plan_action *act, int n, struct cl_cmd *cmd, int cap,
                            char *err);
/* The holding command a node's report calls for against member m of state st (pure): the first
 * model it reports differently from the state, else the first the state says it holds (host
 * copy, engine or layers) and the report leaves out, which it holds none of: a restarted node
 * reports only what it holds again, and until this its lost copy stayed in the state, a source
 * the planner would revive from. Returns 1 with *out set, 0 when the state is right. */
int control_report_holding(const struct cl_state *st, const struct cl_member *m,
                           const struct report *r, struct cl_holding *out);
/* Whether scale-up scale_id, whose joiners hold `progress` layers now, has gained none for more
 * than stall_ms (pure): t[0..*n) remembers each scale-up's progress and since when (at most
 * CTL_MAX_STALL; the oldest is forgotten first); one not seen before starts its clock now, so a
 * new leader gives every scale-up in flight the whole stall time again. */
int control_scaleout_stalled(struct stall_track *t, int *n, uint32_t scale_id, int progress,
                             uint64_t now, uint64_t stall_ms);
/* The planner's configuration for this node's options (control.c; mu held). */
void control_plan_config(const struct control_cfg *cfg, struct plan_config *pc);

/* control_route.c: the model a request for `model` means (mu held): the one it names when the
 * state knows it, else this node's, else the cluster's only one; -1 for none, or when it names
 * this node's model before the state knows it (served here, never taken for another model) */
int control_model_index(const struct control *c, const char *model);

#define CTL_WHY_TEST 100 /* a --test-scale-in decision */
/* The leading signal's smoothing: the simulator's defaults (docs/simulator.md). */
#define CTL_FC_PERIOD_MS 500
#define CTL_FC_ALPHA     0.3
#define CTL_FC_BETA      0.1

/* control_view.c: the planner's view of in (pure), or of this node's state (mu held); a plan id
 * of node id, -1 when it is no member */
void control_view_of(const struct view_in *in, struct view_buf *vb);
void control_view_build(struct control *c, struct view_buf *vb, uint64_t now_mono);
int control_view_pid(const struct view_buf *vb, uint64_t id);
/* A node's failure probability over a day from its deaths and uptime (control_view.c). */
double control_view_fail_prob(uint32_t downs, double up_ms);

/* control_status.c: one line for a scaling decision ("scale up m onto 2 -> 3 from node 1: why",
 * "scale down m on node 3, handing its sequences to node 2: why"), the log's (any thread) */
void control_scale_line(const struct cl_scale *s, char *out, size_t cap);

/* control_recover.c */
int control_recover_at_start(struct control *c, char *err); /* --cluster-recover, checked */
/* raft_recover and a new term (from control_raft_setup) */
int control_recover_force(struct control *c, char *err);
void control_recover_started(struct control *c); /* raft recovered at start: record it */
void control_recover_on_async(uv_async_t *a);    /* the HTTP thread posted a request */
void control_recover_answer(struct control *c, int status, const char *msg);
int control_recover_add_tick(struct control *c); /* the leader: add back the next named voter */

#endif
