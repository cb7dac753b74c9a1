#include "cluster/voter_policy.h"

#include <string.h>

/* When raft last made id a voter again (its raft_voter event still in the ring), or 0. */
static uint64_t readmitted(const struct cl_state *s, uint64_t id)
{
    uint32_t first = s->n_events > CL_MAX_EVENTS ? s->n_events - CL_MAX_EVENTS : 0;
    uint64_t t = 0;
    for (uint32_t i = first; i < s->n_events; i++) {
        const struct cl_event *e = &s->event[i % CL_MAX_EVENTS];
        if (e->type == CMD_RAFT_CONF && e->kind == CONF_VOTER && e->node == id && e->t_ms > t)
            t = e->t_ms;
    }
    return t;
}

/* Down for at least remove_ms (by the state's clock), or never seen since this leader began. A
 * node that rejoined is a voter before its first report commits NODE_UP: it gets remove_ms from
 * its raft_voter event, or it would be removed again at once. */
static int gone(const struct vp_input *in, uint64_t id)
{
    if (id == in->self) return 0;
    const struct cl_member *m = cluster_state_member_c(in->st, id);
    uint64_t since = m ? m->since_ms : in->leader_since;
    if (m && m->alive) return 0;
    uint64_t back = readmitted(in->st, id);
    if (back > since) since = back;
    return in->now_ms >= since && in->now_ms - since >= in->remove_ms;
}

static const char *rack_of(const struct vp_input *in, uint64_t id)
{
    const struct cl_member *m = cluster_state_member_c(in->st, id);
    return m ? m->info.rack : "";
}

static int live(const struct vp_input *in, uint64_t id)
{
    const struct cl_member *m = cluster_state_member_c(in->st, id);
    return id == in->self || (m && m->alive);
}

/* The live non-voter to promote: the one whose rack holds the fewest voters that are not gone
 * (a rack's switch or power takes all its voters at once), then the first in raft's order. A
 * member the state has not seen is in rack "". Returns its index in conf, or -1. */
static int promotee(const struct vp_input *in)
{
    int best = -1, best_n = 0;
    for (int k = 0; k < in->n_conf; k++) {
        if (in->conf[k].voter || !live(in, in->conf[k].id)) continue;
        const char *rack = rack_of(in, in->conf[k].id);
        int n = 0;
        for (int i = 0; i < in->n_conf; i++)
            n += in->conf[i].voter && !gone(in, in->conf[i].id) &&
                 !strcmp(rack_of(in, in->conf[i].id), rack);
        if (best < 0 || n < best_n) {
            best = k;
            best_n = n;
        }
    }
    return best;
}

struct vp_action voter_policy_step(const struct vp_input *in)
{
    struct vp_action none = {VP_NONE, 0};
    if (!in->remove_ms) return none;
    int voters = 0;
    for (int i = 0; i < in->n_conf; i++) voters += in->conf[i].voter != 0;
    /* A dead non-voter holds nothing up: remove it first. */
    for (int i = 0; i < in->n_conf; i++)
        if (!in->conf[i].voter && gone(in, in->conf[i].id))
            return (struct vp_action){VP_REMOVE, in->conf[i].id};
    for (int i = 0; i < in->n_conf; i++) {
        if (!in->conf[i].voter || !gone(in, in->conf[i].id)) continue;
        if (voters - 1 >= VOTERS_MIN) return (struct vp_action){VP_REMOVE, in->conf[i].id};
        int k = promotee(in);
        if (k >= 0) return (struct vp_action){VP_PROMOTE, in->conf[k].id};
        return (struct vp_action){VP_KEEP, in->conf[i].id};
    }
    /* Too few voters (a join cut short by a leader change leaves a spare): promote a live one. */
    if (voters < VOTERS_MIN) {
        int k = promotee(in);
        if (k >= 0) return (struct vp_action){VP_PROMOTE, in->conf[k].id};
    }
    return none;
}
