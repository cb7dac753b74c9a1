/* control_lost: a model that no live node holds whole any more (docs/control.md "When a model is
 * lost").
 *
 * The leader, each heartbeat on a state that applied everything: for each model, the committed
 * members and holdings say whether some live node holds it whole (host copy, or every layer in its
 * engine: cluster_state_missing); when that changed from what the last CMD_MODEL recorded, it
 * commits a new one: `model_lost` naming the layers no live node holds, or `model_found` naming
 * the node that holds it again. Any thread asks control_model_lost whether a request for a model
 * must fail at once: the model is recorded lost, still missing in the committed state, and this
 * node does not hold it whole itself. Runs on the control thread, except control_model_lost. */
#include "cluster/control_internal.h"

#include <stdio.h>
#include <string.h>

int control_lost_tick(struct control *c)
{
    if (c->inflight || raft_last_applied(&c->raft) < raft_last_index(&c->raft)) return 0;
    struct cl_cmd cmd[CL_MAX_MODELS];
    int n = 0;
    pthread_mutex_lock(&c->mu);
    for (uint32_t mi = 0; mi < c->st.n_models; mi++) {
        uint16_t first, L;
        uint64_t holder;
        int missing = cluster_state_missing(&c->st, (int)mi, &first, &L, &holder);
        const struct cl_lost *was = &c->st.lost[mi];
        if (missing == was->lost && (!missing || first == was->first)) continue;
        if (!missing && !was->lost) continue;
        struct cl_cmd *k = &cmd[n++];
        *k = (struct cl_cmd){.type = CMD_MODEL};
        snprintf(k->u.model.name, sizeof k->u.model.name, "%s", c->st.model[mi]);
        k->u.model.lost = (uint8_t)missing;
        k->u.model.first = missing ? first : 0;
        k->u.model.n_layers = L ? L : was->n_layers;
        k->u.model.node = missing ? 0 : holder;
    }
    pthread_mutex_unlock(&c->mu);
    for (int i = 0; i < n; i++) control_fsm_propose(c, &cmd[i]); /* applying it logs it */
    return n;
}

int control_model_lost(struct control *c, const char *model, char *why, size_t cap)
{
    int lost = 0;
    pthread_mutex_lock(&c->mu);
    int mi = control_model_index(c, model);
    uint16_t first = 0, L = 0;
    uint64_t holder;
    if (mi >= 0 && c->st.lost[mi].lost && cluster_state_missing(&c->st, mi, &first, &L, &holder)) {
        lost = 1;
        /* This node's own copy, whole, serves whatever the others lost. */
        for (int h = 0; h < c->n_my_hold; h++)
            if (!strcmp(c->my_hold[h].model, c->st.model[mi]) &&
                (c->my_hold[h].host || (c->my_hold[h].engine && c->my_hold[h].n_layers &&
                                        c->my_hold[h].layers_resident == c->my_hold[h].n_layers)))
                lost = 0;
    }
    if (lost && why) {
        uint64_t now = now_wall_ms(), t = c->st.lost[mi].since_ms;
        snprintf(why, cap,
                 "Model %s is lost: layers [%u, %u) of %u are held by no live node of the cluster "
                 "(recorded %.1f s ago); it is served again once a node holding it returns.",
                 c->st.model[mi], first, L, L, now > t ? (double)(now - t) / 1e3 : 0.0);
    }
    pthread_mutex_unlock(&c->mu);
    return lost;
}
