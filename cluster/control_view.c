/* control_view: the planner's view of the cluster: the committed state plus the latest load
 * reports, in cluster/planner.h's shapes.
 *
 * The leader plans on it (control_leader.c), every node routes on it (control_route.c). A node's
 * load is its own report (the leader has everyone's) or the copy the leader relayed, if fresher
 * than --cluster-dead-ms. Called with mu held. */
#include "cluster/control_internal.h"

#include <stdio.h>
#include <string.h>

static int gpu_index(struct view_buf *vb, const char *gpu)
{
    for (int i = 0; i < vb->v.n_gpu_types; i++)
        if (!strcmp(vb->gpu[i], gpu)) return i;
    snprintf(vb->gpu[vb->v.n_gpu_types], sizeof vb->gpu[0], "%s", gpu);
    return vb->v.n_gpu_types++;
}

void control_view_build(struct control *c, struct view_buf *vb, uint64_t now_mono)
{
    const struct cl_state *s = &c->st;
    memset(vb, 0, sizeof *vb);
    struct plan_view *v = &vb->v;
    v->now_ms = (double)now_wall_ms();
    v->n_models = (int)s->n_models;
    for (uint32_t m = 0; m < s->n_models; m++) {
        struct plan_model *pm = &vb->model[m];
        pm->layers = 1;
        for (uint32_t i = 0; i < s->n_members; i++)
            if (s->member[i].hold[m].n_layers) pm->layers = s->member[i].hold[m].n_layers;
        pm->bytes = !strcmp(s->model[m], c->model) ? c->cfg.model_bytes : 0;
        pm->ttft_slo_ms = c->cfg.ttft_slo_ms;
        pm->tpot_slo_ms = 0;
        pm->replicas_cached = c->cfg.replicas_cached;
        pm->keep_alive_ms = c->cfg.keep_alive_ms;
    }
    for (uint32_t i = 0; i < s->n_members; i++) {
        const struct cl_member *m = &s->member[i];
        struct plan_node *pn = &vb->node[v->n_nodes++];
        pn->id = (int)m->info.id;
        pn->alive = m->alive;
        pn->gpu_type = gpu_index(vb, m->info.gpu);
        pn->domain = (int)m->info.id;
        /* Racks by name: the index of the first member in the same rack ("" is one rack too). */
        for (uint32_t k = 0; k <= i; k++)
            if (!strcmp(s->member[k].info.rack, m->info.rack)) {
                pn->rack = (int)k;
                break;
            }
        pn->link_Bps = 1.25e9;
        pn->fail_prob = 0.01;
        pn->model_slots = 1; /* the serving process holds one model (docs/control.md) */
        for (int k = 0; k < c->n_refusers; k++) {
            int rm = cluster_state_model(s, c->refuser[k].model);
            if (c->refuser[k].node == m->info.id && rm >= 0 && c->refuser[k].until > now_mono)
                pn->refused |= 1ull << rm;
        }
        pn->engine_model = -1;
        pn->helper = -1;
        for (uint32_t k = 0; k < s->n_models; k++) {
            if (m->hold[k].host) pn->host_cached |= 1ull << k;
            if (m->hold[k].engine && pn->engine_model < 0) {
                pn->engine_model = (int)k;
                pn->layers_resident = m->hold[k].layers_resident;
            }
        }
        for (uint32_t k = 0; k < s->n_scaleouts; k++) {
            const struct cl_scale *sc = &s->scaleout[k].s;
            if ((int)sc->source == pn->id) pn->sources_busy++;
            /* A joiner short of its scale-out's model's layers (not model 0's) runs the rest on
             * the source. */
            int sm = cluster_state_model(s, sc->model);
            for (int j = 0; j < sc->n_chain; j++)
                if (sc->chain[j] == m->info.id && sm >= 0 &&
                    pn->layers_resident < vb->model[sm].layers)
                    pn->helper = (int)sc->source;
        }
        pn->load.idle_since_ms = -1;
        /* Its own report (the leader has everyone's), else the copy the leader relayed. */
        const struct cl_load *ld = NULL;
        for (int k = 0; k < c->n_rep && !ld; k++)
            if (c->rep[k].id == m->info.id &&
                now_mono - c->rep[k].at_ms <= (uint64_t)c->cfg.dead_ms)
                ld = &c->rep[k].load;
        for (int k = 0; k < c->n_relayed && !ld; k++)
            if (c->relayed[k].id == m->info.id &&
                now_mono - c->relayed[k].at_ms <= (uint64_t)c->cfg.dead_ms)
                ld = &c->relayed[k].load;
        if (!ld) continue;
        pn->load.queue_len = ld->queue_len;
        pn->load.queued_tokens = (long)ld->queued_tokens;
        pn->load.running_seqs = ld->running;
        pn->load.kv_used = ld->kv_used;
        pn->load.idle_since_ms = ld->idle_ms >= 0 ? v->now_ms - ld->idle_ms : -1;
        /* Requests the node took while its route found no replica wait for one: the planner
         * counts them as held (a cold start). Not the rest of its queue: what a host copy runs
         * because it was sent there (routed while it was a replica) waits for nothing. */
        if (ld->held > 0) {
            int hm = cluster_state_model(s, ld->held_model);
            if (hm < 0 && s->n_models == 1) hm = 0; /* "the model" of a one-model cluster */
            if (hm >= 0) {
                vb->model[hm].held += ld->held;
                vb->model[hm].held_tokens += (long)ld->held_tokens;
            }
        }
        if (pn->engine_model >= 0) {
            int cell = pn->gpu_type * CL_MAX_MODELS + pn->engine_model;
            if (ld->tok_s > vb->tput[cell]) vb->tput[cell] = ld->tok_s;
            if (ld->step_a > 0 || ld->step_c > 0)
                vb->step[cell] =
                    (struct step_model){ld->step_a, ld->step_b, ld->step_c, ld->step_corr};
        }
    }
    /* The matrix as the planner indexes it: [gpu_type * n_models + m]. */
    static double tput[CL_MAX_NODES * CL_MAX_MODELS];
    static struct step_model step[CL_MAX_NODES * CL_MAX_MODELS];
    for (int g = 0; g < v->n_gpu_types; g++)
        for (int m = 0; m < v->n_models; m++) {
            tput[g * v->n_models + m] = vb->tput[g * CL_MAX_MODELS + m];
            step[g * v->n_models + m] = vb->step[g * CL_MAX_MODELS + m];
        }
    memcpy(vb->tput, tput, sizeof tput);
    memcpy(vb->step, step, sizeof step);
    for (uint32_t k = 0; k < s->n_scaleouts; k++) {
        const struct cl_scaleout *so = &s->scaleout[k];
        struct plan_scaleout *ps = &vb->so[v->n_scaleouts++];
        ps->kind = so->s.kind == SCALE_UP ? PLAN_SO_ENGINE : PLAN_SO_HOST;
        ps->model = cluster_state_model(s, so->s.model);
        ps->source = (int)so->s.source;
        ps->n_chain = so->s.n_chain;
        for (int j = 0; j < so->s.n_chain; j++) ps->chain[j] = (int)so->s.chain[j];
        if (so->s.kind != SCALE_UP) ps->chain[ps->n_chain++] = (int)so->s.node;
        ps->started_ms = (double)so->started_ms;
    }
    v->nodes = vb->node;
    v->models = vb->model;
    v->scaleouts = vb->so;
    v->tput = vb->tput;
    v->step = vb->step;
}
