/* cluster_state: the replicated state machine of the cluster (what raft's log builds).
 *
 * Members (id, addresses, role, GPU type, rack, measured tokens/s, alive), what each member holds
 * of each model (whole copy in host memory; in the engine with k of L layers resident), the
 * scale-outs in progress, and the last scaling events with their timestamps. It changes only by
 * cluster_state_apply() of committed commands (cluster/cluster_cmd.h), in log order, so every node that
 * applied the same prefix of the log holds the same bytes: the state machine reads no clock and
 * no local fact. A command that does not fit (unknown node, full tables) is applied as a no-op
 * and counted in `rejected`, never a failure (raft must not stall on an entry).
 *
 * Snapshots are the whole state in the same explicit little-endian encoding (its header carries
 * CL_CMD_VERSION: a snapshot of another version is refused by name); the decoder checks
 * every count and string like any wire decoder (fuzzed with the commands). cluster_state_json renders
 * what GET /v1/cluster shows of it (cJSON, malloc'd text). */
#ifndef STRATA_CLUSTER_STATE_H
#define STRATA_CLUSTER_STATE_H

#include "cluster/cluster_cmd.h"

#include <stddef.h>
#include <stdint.h>

#define CL_MAX_NODES     32
#define CL_MAX_MODELS    8
#define CL_MAX_SCALEOUTS 16
#define CL_MAX_EVENTS    32

struct cl_hold {
    uint8_t host, engine;
    uint16_t layers_resident, n_layers;
};

struct cl_member {
    struct cl_node_up info;
    uint8_t alive;
    uint64_t since_ms;                  /* last NODE_UP / NODE_DOWN */
    uint32_t downs;                     /* NODE_DOWNs it has had (deaths seen by the leaders) */
    uint64_t up_ms;                     /* time alive before since_ms (its failures' exposure) */
    struct cl_hold hold[CL_MAX_MODELS]; /* by model index */
};

struct cl_scaleout {
    uint32_t scale_id; /* sequence number of its CMD_SCALE */
    struct cl_scale s;
    uint64_t started_ms;
};

struct cl_event {
    uint64_t t_ms;
    uint32_t seq; /* events applied before this one */
    uint8_t type; /* CMD_* of the command that made it */
    uint8_t kind; /* CMD_SCALE: enum cl_scale_kind; CMD_SCALE_DONE: ok; CMD_RAFT_CONF: change */
    uint64_t node, source; /* CMD_SCALE_DONE abandoned by a refusal: node is the one that refused */
    char model[CL_STR_LEN + 1];
    char reason[CL_STR_LEN + 1]; /* CMD_SCALE_DONE abandoned: why; "" otherwise */
};

/* A model no live member holds whole (CMD_MODEL): layers [first, n_layers) are on no live node. */
struct cl_lost {
    uint8_t lost;
    uint16_t first, n_layers;
    uint64_t since_ms;
};

struct cl_state {
    uint32_t n_members, n_models, n_scaleouts, n_events; /* n_events: total ever (ring) */
    uint32_t n_scales;                                   /* CMD_SCALE applied (ids) */
    uint64_t applied, rejected;                          /* commands */
    struct cl_member member[CL_MAX_NODES];
    char model[CL_MAX_MODELS][CL_STR_LEN + 1];
    struct cl_lost lost[CL_MAX_MODELS]; /* by model index: as the last CMD_MODEL recorded it */
    struct cl_scaleout scaleout[CL_MAX_SCALEOUTS];
    struct cl_event event[CL_MAX_EVENTS]; /* ring: event[i % CL_MAX_EVENTS] */
};

void cluster_state_init(struct cl_state *s);
/* Apply one committed command. Returns 0 if it changed the state, 1 if it was rejected (no-op). */
int cluster_state_apply(struct cl_state *s, const struct cl_cmd *c);

struct cl_member *cluster_state_member(struct cl_state *s, uint64_t id);
const struct cl_member *cluster_state_member_c(const struct cl_state *s, uint64_t id);
/* Model index, or -1. */
int cluster_state_model(const struct cl_state *s, const char *name);
/* Whether model mi is held whole by no live member (none has it in host memory, or in its engine
 * with every layer), from the members and holdings alone (what every node that applied the same
 * log agrees on): 1 with *first = the most layers a live member holds ([0, first) somewhere,
 * [first, *n_layers) nowhere), 0 with *holder = a live member holding it whole. */
int cluster_state_missing(const struct cl_state *s, int mi, uint16_t *first, uint16_t *n_layers,
                          uint64_t *holder);

/* Snapshot: bytes needed for cluster_state_encode (an upper bound). */
size_t cluster_state_encoded_max(void);
size_t cluster_state_encode(const struct cl_state *s, uint8_t *out, size_t cap);
int cluster_state_decode(struct cl_state *s, const uint8_t *buf, size_t len, char *err);

#endif
