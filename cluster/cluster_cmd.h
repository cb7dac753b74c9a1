/* cluster_cmd: the commands of the cluster's replicated log, and the control messages nodes send
 * each other, encoded as explicit little-endian bytes (transport/wire.h's cursors).
 *
 * A log entry is one command: version u8 | type u8 | t_ms u64 | body. t_ms is the leader's wall
 * clock when it proposed the command, so applying the log is deterministic on every node (the
 * state machine never reads a clock). Strings are u8 length + bytes, printable ASCII only.
 * Control messages (load reports, join requests, state reads) travel over the authenticated
 * control channel (cluster/sealed_conn.h), never through the log; they share the encoding.
 *
 * Decoders take (buf, len), check every length before reading, reject unknown types, out-of-range
 * values and trailing bytes, and return 0 or -1 with one line in err. */
#ifndef STRATA_CLUSTER_CMD_H
#define STRATA_CLUSTER_CMD_H

#include <stddef.h>
#include <stdint.h>

/* 3: a member's rack (cl_node_up.rack); 4: refusals (SCALE_DONE's node and reason, LOAD's refused
 * decisions and held requests); 5, on two branches apart: SCALE's reason (ops), what the planner
 * measures (live: a load's step model error, steps, identity, link rate, model bytes, prompt
 * tokens in, sequences helped; a member's deaths and uptime); 6: both, merged; 6 on trust: ops's
 * reason and CMD_MODEL (a model lost or found again) with each model's lost flag in snapshots;
 * 7: all of them */
#define CL_CMD_VERSION 7
#define CL_STR_LEN     63 /* addresses, model names, GPU types */
#define CL_MAX_CHAIN   16 /* joiners of one scale-out */
#define CL_MAX_HOLD    8  /* models a node reports at once */
#define CL_CMD_MAX     1024
#define CL_MAX_LOADS   32 /* loads in one MSGC_LOADS (the state's CL_MAX_NODES) */
#define CL_MAX_REFUSED 4  /* refused decisions a node reports at once */

enum cl_cmd_type {
    CMD_NODE_UP = 1,    /* a member is (back) alive: its identity and capabilities */
    CMD_NODE_DOWN = 2,  /* the leader stopped hearing from a member */
    CMD_HOLDING = 3,    /* what a node holds of one model: host copy, engine layers */
    CMD_SCALE = 4,      /* a planner decision (scale up/down, replicate, drop a host copy) */
    CMD_SCALE_DONE = 5, /* a scale-out finished (every joiner serves alone) or was abandoned */
    CMD_RAFT_CONF = 6,  /* the leader changed raft's configuration (an event in the state) */
    CMD_MODEL = 7,      /* no live node holds some layer of a model any more, or one does again */
};

enum cl_role { ROLE_VOTER = 1, ROLE_JOINER = 2 };

enum cl_scale_kind { SCALE_UP = 1, SCALE_DOWN = 2, SCALE_REPLICATE = 3, SCALE_DROP_HOST = 4 };

/* CMD_RAFT_CONF: what happened to the node in raft's configuration (CONF_RECOVERED: an operator
 * forced a new configuration on that node, cluster/recover_req.h). */
enum cl_conf_change { CONF_REMOVED = 1, CONF_VOTER = 2, CONF_RECOVERED = 3 };

struct cl_node_up {
    uint64_t id;
    char addr[CL_STR_LEN + 1];   /* control (raft) address host:port */
    char http[CL_STR_LEN + 1];   /* API address host:port */
    char fabric[CL_STR_LEN + 1]; /* fabric (weights, activations) address host:port, "" none */
    char gpu[CL_STR_LEN + 1];    /* GPU type ("cpu" without one) */
    char rack[CL_STR_LEN + 1];   /* failure domain (--rack, strata.rack): letters, digits, '.',
                                    '-', '_'; "" when not given (all such nodes are one rack) */
    uint8_t role;                /* enum cl_role */
    float tok_s;                 /* measured tokens/s for its model (0: not yet measured) */
};

struct cl_holding {
    uint64_t node;
    char model[CL_STR_LEN + 1];
    uint8_t host;             /* whole model in host memory */
    uint8_t engine;           /* model in the engine (layers_resident of n_layers) */
    uint16_t layers_resident; /* k */
    uint16_t n_layers;        /* L */
};

struct cl_scale {
    uint8_t kind; /* enum cl_scale_kind */
    char model[CL_STR_LEN + 1];
    uint64_t source; /* 0: none */
    uint64_t node;   /* target (chain[0] for a scale up) */
    uint8_t n_chain;
    uint64_t chain[CL_MAX_CHAIN];
    char reason[CL_STR_LEN + 1]; /* why the planner decided it, for people ("" none) */
};

struct cl_cmd {
    uint8_t type; /* enum cl_cmd_type */
    uint64_t t_ms;
    union {
        struct cl_node_up up;
        uint64_t down; /* node id */
        struct cl_holding hold;
        struct cl_scale scale;
        struct {
            uint32_t scale_id; /* index of the CMD_SCALE event (its log order) */
            uint8_t ok;
            uint64_t node;               /* abandoned: the node that refused or failed, 0 none */
            char reason[CL_STR_LEN + 1]; /* abandoned: why ("" when ok) */
        } done;
        struct {
            uint64_t node;
            uint8_t change; /* enum cl_conf_change */
        } conf;
        struct cl_model_cmd {
            char name[CL_STR_LEN + 1];
            uint8_t lost;      /* 1: lost (layers [first, n_layers) on no live node); 0: found */
            uint16_t first;    /* lost: the first layer no live node holds (< n_layers) */
            uint16_t n_layers; /* its L (>= 1) */
            uint64_t node;     /* found: the live node that holds it whole; lost: 0 */
        } model;
    } u;
};

/* Returns bytes written, 0 if cap is too small. */
size_t cluster_cmd_encode(uint8_t *out, size_t cap, const struct cl_cmd *c);
int cluster_cmd_decode(struct cl_cmd *c, const uint8_t *buf, size_t len, char *err);

/* ---------------------------------------------------------------- control messages */

enum cl_msg_type {
    MSGC_OPEN = 1,      /* first message on a connection: channel, sender id and address */
    MSGC_LOAD = 2,      /* node -> leader, every heartbeat */
    MSGC_JOIN = 3,      /* a new node asks to be added */
    MSGC_REDIRECT = 4,  /* "not the leader; try this address" (or "added", status 0) */
    MSGC_STATE_REQ = 5, /* read the replicated state */
    MSGC_STATE = 6,     /* reply: the state snapshot (cluster_state encoding) */
    MSGC_LOADS = 7,     /* leader -> a reporting node: every node's latest load (for routing) */
};

/* CHAN_FWD: a forwarded API request (serving/api/relay.h): the bytes after OPEN are HTTP/1.1,
 * handed to the receiving node's front as a connection from a cluster member. */
enum cl_channel { CHAN_RAFT = 1, CHAN_CTL = 2, CHAN_FWD = 3 };

struct cl_load {
    int32_t queue_len, running;
    int64_t queued_tokens;
    float kv_used;      /* 0..1 */
    float idle_ms;      /* time since queue and running were both empty; < 0 busy */
    float ttft_pred_ms; /* predicted TTFT of a request arriving now (step model) */
    float tok_s;        /* measured decode tokens/s */
    float step_a, step_b, step_c, step_corr; /* the scheduler's step model (seconds) */
    /* What the planner measures with (docs/control.md "What the planner is fed"): */
    float step_err;       /* the step model's own error estimate (0.2: a step may take 20% more) */
    uint32_t step_steps;  /* steps timed into it (a cached prior's included); 0: an untimed prior */
    uint8_t step_cal;     /* 1: it covers every calibration shape (calibrated or cached) */
    uint64_t step_id;     /* its identity: model header and hardware (step_identity_hash), 0 none */
    float link_Bps;       /* the latest weight stream into this node, bytes/s (before one: what
                             its streams are configured to); 0: neither */
    uint64_t link_peer;   /* the node at the measured stream's other end (0: none, unknown) */
    uint64_t model_bytes; /* bytes of the model it holds (engine or host copy), 0: none */
    uint64_t prompt_in;   /* prompt tokens submitted to its scheduler since it started (arrivals) */
    int32_t helping; /* other nodes' sequences whose layers run here (a joiner's, a hand-over's) */
    /* Requests this node took while its route found no replica (relays holding them, or served
     * here from a host copy out of the engine), their prompt tokens, and their model: the demand
     * the planner counts as held (a cold start). Nothing else it runs. They travel in the node's
     * own MSGC_LOAD only (the leader plans; MSGC_LOADS, for routing, leave them out). */
    int32_t held;
    int64_t held_tokens;
    char held_model[CL_STR_LEN + 1]; /* "" : none held */
};

/* A decision the node's executor refused, or whose work failed (the join gave up): reported in
 * every MSGC_LOAD until the scale-out is no longer in the committed state. */
struct cl_refusal {
    uint32_t scale_id;           /* the CMD_SCALE's id (cl_scaleout.scale_id) */
    char reason[CL_STR_LEN + 1]; /* printable, cut to CL_STR_LEN */
};

struct cl_msg {
    uint8_t type;
    union {
        struct {
            uint8_t channel; /* enum cl_channel */
            uint64_t id;
            char addr[CL_STR_LEN + 1];
        } open;
        struct {
            struct cl_node_up node; /* identity as the node sees itself */
            struct cl_load load;
            uint32_t seen_scales; /* CMD_SCALEs the node had applied and acted on */
            uint8_t n_hold;
            struct cl_holding hold[CL_MAX_HOLD];
            uint8_t n_refused;
            struct cl_refusal refused[CL_MAX_REFUSED];
        } load;
        struct {
            uint64_t id;
            char addr[CL_STR_LEN + 1];
        } join;
        struct {
            uint8_t status; /* 0 done, 1 not the leader (addr: the leader, may be ""), 2 failed */
            char addr[CL_STR_LEN + 1];
        } redirect;
        struct {
            const uint8_t *p; /* into the decoded buffer */
            uint32_t len;
        } state;
        struct {
            uint8_t n;
            uint64_t id[CL_MAX_LOADS];
            uint32_t age_ms[CL_MAX_LOADS]; /* how old the leader's copy is */
            struct cl_load load[CL_MAX_LOADS];
        } loads;
    } u;
};

size_t cluster_cmd_msg_encode(uint8_t *out, size_t cap, const struct cl_msg *m);
int cluster_cmd_msg_decode(struct cl_msg *m, const uint8_t *buf, size_t len, char *err);

/* A rack name as the decoder takes it: "" or 1..CL_STR_LEN of [A-Za-z0-9._-] (it becomes a
 * /metrics label value and a JSON string as is). */
int cluster_cmd_rack_ok(const char *s);

/* Shared by the state snapshot codec. */
struct wire_w;
struct wire_r;
void cluster_cmd_put_str(struct wire_w *w, const char *s);
int cluster_cmd_get_str(struct wire_r *r, char out[CL_STR_LEN + 1]);
/* s into out as cluster_cmd_get_str accepts it: cut to CL_STR_LEN, bytes outside printable ASCII as '?'. */
void cluster_cmd_printable(char out[CL_STR_LEN + 1], const char *s);
/* A member's description, as log commands and snapshots both carry it; the reader checks it. */
void cluster_cmd_put_node_up(struct wire_w *w, const struct cl_node_up *u);
int cluster_cmd_get_node_up(struct wire_r *r, struct cl_node_up *u, char *err);

#endif
