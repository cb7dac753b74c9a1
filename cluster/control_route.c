/* control_route: where things go, on this node's view: a completion (control_route: the replica
 * with the least predicted TTFT, counting what this node relayed and is still in flight), a
 * joiner's weights and helper (the members' fabric addresses).
 *
 * Any thread (under mu). */
#include "cluster/control_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int member_index(const struct cl_state *s, uint64_t id)
{
    const struct cl_member *m = cluster_state_member_c(s, id);
    return m ? (int)(m - s->member) : -1;
}

int control_model_index(const struct control *c, const char *model)
{
    const struct cl_state *s = &c->st;
    int named = model && model[0];
    int mi = named ? cluster_state_model(s, model) : -1;
    if (mi >= 0) return mi;
    int own = c->model[0] ? cluster_state_model(s, c->model) : -1;
    if (own >= 0) return own;
    /* Ours, but its holding is not committed yet: never the cluster's other model (a request
     * for b answered with a's text); it is served here. */
    if (named && c->model[0] && !strcmp(model, c->model)) return -1;
    return s->n_models == 1 ? 0 : -1;
}

int control_route(struct control *c, const char *model, int prompt_tokens, char *http_out,
                  size_t cap, uint64_t *node, char *err)
{
    struct view_buf *vb = malloc(sizeof *vb);
    if (!vb) return errmsg_set(err, "route: out of memory");
    struct plan_config pc;
    struct plan_route rt = {.node = -1};
    int rc = 0;
    *node = 0;
    snprintf(http_out, cap, "none");
    pthread_mutex_lock(&c->mu);
    control_plan_config(&c->cfg, &pc);
    const struct cl_state *s = &c->st;
    int mi = control_model_index(c, model);
    uint64_t now = now_mono_ms();
    if (mi >= 0) {
        control_view_build(c, vb, now);
        /* What we relayed and is still in flight there, beyond what that node last reported
         * (a follower has no one's report but its own): queued work of that size. */
        for (int i = 0; i < vb->v.n_nodes; i++) {
            struct plan_node *pn = &vb->node[i];
            int k = member_index(s, vb->id[i]);
            int o = k >= 0 ? c->outstanding[k] : 0,
                have = pn->load.queue_len + pn->load.running_seqs;
            if (k >= 0 && c->suspect_until[k] > now) pn->alive = 0;
            if (vb->id[i] == c->cfg.id || o <= have) continue;
            pn->load.queue_len += o - have;
            pn->load.queued_tokens += (long)(o - have) * (prompt_tokens > 16 ? prompt_tokens : 16);
            pn->load.idle_since_ms = -1;
        }
        rc = planner_route(&pc, &vb->v, mi, prompt_tokens, &rt, err);
    }
    if (!rc && rt.node >= 0) {
        /* Equal predictions: serve here rather than pay a hop. */
        int me = control_view_pid(vb, c->cfg.id);
        const struct plan_node *pn = me >= 0 ? &vb->node[me] : NULL;
        if (pn && pn->alive && pn->engine_model == mi && !pn->standby &&
            planner_predict_ttft_ms(&pc, &vb->v, pn, mi, prompt_tokens) <= rt.predicted_ttft_ms)
            rt.node = me;
        uint64_t id = vb->id[rt.node];
        const struct cl_member *m = cluster_state_member_c(s, id);
        if (id == c->cfg.id) {
            snprintf(http_out, cap, "local");
            *node = c->cfg.id;
        } else if (m && m->info.http[0]) {
            snprintf(http_out, cap, "%s", m->info.http);
            *node = id;
        }
    }
    pthread_mutex_unlock(&c->mu);
    free(vb);
    return rc;
}

void control_routed(struct control *c, uint64_t node, int delta)
{
    pthread_mutex_lock(&c->mu);
    int k = member_index(&c->st, node);
    if (k >= 0) {
        c->outstanding[k] += delta;
        if (c->outstanding[k] < 0) c->outstanding[k] = 0;
    }
    pthread_mutex_unlock(&c->mu);
}

void control_unreachable(struct control *c, uint64_t node)
{
    pthread_mutex_lock(&c->mu);
    int k = member_index(&c->st, node);
    if (k >= 0) c->suspect_until[k] = now_mono_ms() + (uint64_t)c->cfg.dead_ms;
    pthread_mutex_unlock(&c->mu);
}

int control_node_fabric(struct control *c, uint64_t id, char out[CL_STR_LEN + 1])
{
    pthread_mutex_lock(&c->mu);
    const struct cl_member *m = cluster_state_member_c(&c->st, id);
    int ok = m && m->info.fabric[0];
    snprintf(out, CL_STR_LEN + 1, "%s", ok ? m->info.fabric : "");
    pthread_mutex_unlock(&c->mu);
    return ok ? 0 : -1;
}

int control_holders_fabric(struct control *c, const char *model, const uint64_t *skip, int n_skip,
                           char (*out)[CL_STR_LEN + 1], int cap)
{
    int n = 0;
    pthread_mutex_lock(&c->mu);
    int mi = cluster_state_model(&c->st, model);
    for (uint32_t i = 0; mi >= 0 && i < c->st.n_members && n < cap; i++) {
        const struct cl_member *m = &c->st.member[i];
        int skipped = m->info.id == c->cfg.id;
        for (int k = 0; k < n_skip; k++) skipped |= m->info.id == skip[k];
        if (skipped || !m->alive || !m->hold[mi].host || !m->info.fabric[0]) continue;
        snprintf(out[n++], CL_STR_LEN + 1, "%s", m->info.fabric);
    }
    pthread_mutex_unlock(&c->mu);
    return n;
}

int control_fabric_serves(struct control *c, const char *model, const char *fabric)
{
    int yes = 0;
    pthread_mutex_lock(&c->mu);
    int mi = cluster_state_model(&c->st, model);
    for (uint32_t i = 0; mi >= 0 && i < c->st.n_members && !yes; i++) {
        const struct cl_member *m = &c->st.member[i];
        yes = m->alive && m->hold[mi].engine &&
              m->hold[mi].layers_resident == m->hold[mi].n_layers && m->hold[mi].n_layers > 0 &&
              !strcmp(m->info.fabric, fabric);
    }
    pthread_mutex_unlock(&c->mu);
    return yes;
}
