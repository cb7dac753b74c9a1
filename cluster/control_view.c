/* control_view: the planner's view of the cluster: the committed state plus the latest load
 * reports, in cluster/planner.h's shapes.
 *
 * The leader plans on it (control_leader.c), every node routes on it (control_route.c). A node's
 * load is its own report (the leader has everyone's) or the copy the leader relayed, if fresher
 * than --cluster-dead-ms. control_view_of is a pure function of its inputs (struct view_in), so
 * tests build views without raft; control_view_build gathers them from this node's state (mu
 * held).
 *
 * What is measured and what is assumed (docs/control.md "What the planner is fed"):
 *   - step models: each node's own fit (its report) once it has timed VIEW_STEP_FITTED steps or
 *     covers every calibration shape; per GPU type, the most-timed report of that type (what a
 *     node with no fit of its own, a joiner, is predicted with);
 *   - link rates: the latest weight stream into a node (its report names the other end, which
 *     gets the rate too: the faster of what each end saw), or before any, the rate a node's
 *     streams are configured to (--weight-rate, --link-gbps); a node with neither counts at the
 *     mean of the others, VIEW_LINK_ASSUMED when no node has one;
 *   - failure probability: the deaths the leaders saw (NODE_DOWN) over the node's uptime, with a
 *     prior of 1% a day, to two significant digits (control_view_fail_prob);
 *   - NVLink domain: the host of the node's fabric (else control) address: processes on one
 *     machine share it; no NVLink rate is known (nvlink_Bps 0), so it orders nothing yet;
 *   - model bytes: any holder's report; the TTFT/TPOT SLOs, R and the keep-alive: this node's
 *     options;
 *   - the sequences a node runs for others (load.helping): its report, or at least those a node
 *     that handed its sequences to it (its latest decision, a scale-down naming it) still runs;
 *   - the leading signal: the leader's forecast of each model's prompt tokens/s (the planner reads
 *     it only where the forecast has two closed periods). */
#include "cluster/control_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static int gpu_index(struct view_buf *vb, const char *gpu)
{
    for (int i = 0; i < vb->v.n_gpu_types; i++)
        if (!strcmp(vb->gpu[i], gpu)) return i;
    snprintf(vb->gpu[vb->v.n_gpu_types], sizeof vb->gpu[0], "%s", gpu);
    return vb->v.n_gpu_types++;
}

int control_view_pid(const struct view_buf *vb, uint64_t id)
{
    for (int i = 0; i < vb->v.n_nodes; i++)
        if (vb->id[i] == id) return i;
    return -1;
}

double control_view_fail_prob(uint32_t downs, double up_ms)
{
    double days = (up_ms > 0 ? up_ms : 0) / 86400e3;
    double per_day = ((double)downs + VIEW_FAIL_PRIOR_N) / (days + VIEW_FAIL_PRIOR_DAY);
    double p = 1 - exp(-per_day);
    /* two significant digits: minutes of uptime are no evidence, and must not reorder nodes
     * (the planner breaks a tie in failure probability by id) */
    double unit = pow(10, floor(log10(p)) - 1);
    return round(p / unit) * unit;
}

/* The host of "host:port" ("[v6]:port" too) into out. */
static void host_of(const char *addr, char out[CL_STR_LEN + 1])
{
    const char *colon = strrchr(addr, ':');
    size_t n = colon ? (size_t)(colon - addr) : strlen(addr);
    if (n >= CL_STR_LEN + 1) n = CL_STR_LEN;
    memcpy(out, addr, n);
    out[n] = 0;
}

/* A member's load: its own report, else the copy the leader relayed, if fresh. */
static const struct cl_load *load_of(const struct view_in *in, uint64_t id)
{
    for (int k = 0; k < in->n_rep; k++)
        if (in->rep[k].id == id && in->now_mono - in->rep[k].at_ms <= (uint64_t)in->dead_ms)
            return &in->rep[k].load;
    for (int k = 0; k < in->n_relayed; k++)
        if (in->relayed[k].id == id && in->now_mono - in->relayed[k].at_ms <= (uint64_t)in->dead_ms)
            return &in->relayed[k].load;
    return NULL;
}

static int fitted(const struct cl_load *ld)
{
    return (ld->step_a > 0 || ld->step_c > 0) &&
           (ld->step_cal || ld->step_steps >= VIEW_STEP_FITTED);
}

static struct step_model step_of_load(const struct cl_load *ld)
{
    return (struct step_model){ld->step_a, ld->step_b, ld->step_c, ld->step_corr};
}

static void models(const struct view_in *in, struct view_buf *vb)
{
    const struct cl_state *s = in->st;
    vb->v.n_models = (int)s->n_models;
    for (uint32_t m = 0; m < s->n_models; m++) {
        struct plan_model *pm = &vb->model[m];
        pm->layers = 1;
        for (uint32_t i = 0; i < s->n_members; i++)
            if (s->member[i].hold[m].n_layers) pm->layers = s->member[i].hold[m].n_layers;
        /* its bytes: this node's own (when it is ours), else any holder's report */
        if (in->model && !strcmp(s->model[m], in->model)) pm->bytes = in->model_bytes;
        for (uint32_t i = 0; i < s->n_members && pm->bytes <= 0; i++) {
            const struct cl_hold *h = &s->member[i].hold[m];
            const struct cl_load *ld = load_of(in, s->member[i].info.id);
            if ((h->host || h->engine) && ld && ld->model_bytes)
                pm->bytes = (double)ld->model_bytes;
        }
        pm->ttft_slo_ms = in->ttft_slo_ms;
        pm->tpot_slo_ms = in->tpot_slo_ms;
        pm->replicas_cached = in->replicas_cached;
        pm->keep_alive_ms = in->keep_alive_ms;
        if (in->fc) planner_forecast_fill(&in->fc[m], pm);
    }
}

/* The committed facts of member i: identity, failure, placement, holdings, scale-outs. */
static void node_state(const struct view_in *in, struct view_buf *vb, uint32_t i,
                       struct plan_node *pn)
{
    const struct cl_state *s = in->st;
    const struct cl_member *m = &s->member[i];
    pn->alive = m->alive;
    pn->gpu_type = gpu_index(vb, m->info.gpu);
    /* Racks by name, and servers by host: the index of the first member in the same one. */
    char host[CL_STR_LEN + 1], other[CL_STR_LEN + 1];
    host_of(m->info.fabric[0] ? m->info.fabric : m->info.addr, host);
    pn->domain = pn->rack = -1;
    for (uint32_t k = 0; k <= i; k++) {
        const struct cl_member *o = &s->member[k];
        host_of(o->info.fabric[0] ? o->info.fabric : o->info.addr, other);
        if (pn->domain < 0 && !strcmp(host, other)) pn->domain = (int)k;
        if (pn->rack < 0 && !strcmp(o->info.rack, m->info.rack)) pn->rack = (int)k;
    }
    double up = (double)m->up_ms;
    if (m->alive && in->now_wall > m->since_ms) up += (double)(in->now_wall - m->since_ms);
    pn->fail_prob = control_view_fail_prob(m->downs, up);
    pn->model_slots = 1; /* the serving process holds one model (docs/control.md) */
    for (int k = 0; k < in->n_refusers; k++) {
        int rm = cluster_state_model(s, in->refuser[k].model);
        if (in->refuser[k].node == m->info.id && rm >= 0 && in->refuser[k].until > in->now_mono)
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
    /* A joiner of a scale-out runs the layers it lacks of that model on the scale-out's source. */
    for (uint32_t k = 0; k < s->n_scaleouts; k++) {
        const struct cl_scale *sc = &s->scaleout[k].s;
        int sm = cluster_state_model(s, sc->model);
        if (sc->source == m->info.id) pn->sources_busy++;
        if (sm < 0 || sm != pn->engine_model || sc->kind != SCALE_UP) continue;
        for (int j = 0; j < sc->n_chain; j++)
            if (sc->chain[j] == m->info.id && pn->layers_resident < vb->model[sm].layers)
                pn->helper = control_view_pid(vb, sc->source);
    }
}

/* The reported load, and what the node measured: its step model, its link. */
static void node_load(const struct view_in *in, struct view_buf *vb, struct plan_node *pn,
                      const struct cl_load *ld, int *most_steps)
{
    pn->load.queue_len = ld->queue_len;
    pn->load.queued_tokens = (long)ld->queued_tokens;
    pn->load.running_seqs = ld->running;
    pn->load.kv_used = ld->kv_used;
    pn->load.idle_since_ms = ld->idle_ms >= 0 ? vb->v.now_ms - ld->idle_ms : -1;
    pn->load.helping = ld->helping;
    if (fitted(ld)) pn->step_own = step_of_load(ld);
    /* Requests the node took while its route found no replica wait for one: the planner counts
     * them as held (a cold start). Not the rest of its queue: what a host copy runs because it
     * was sent there (routed while it was a replica) waits for nothing. */
    const struct cl_state *s = in->st;
    if (ld->held > 0) {
        int hm = cluster_state_model(s, ld->held_model);
        if (hm < 0 && s->n_models == 1) hm = 0; /* "the model" of a one-model cluster */
        if (hm >= 0) {
            vb->model[hm].held += ld->held;
            vb->model[hm].held_tokens += (long)ld->held_tokens;
        }
    }
    if (pn->engine_model < 0) return;
    /* The matrix of its GPU type: the best tokens/s, the most-timed step model. */
    int cell = pn->gpu_type * CL_MAX_MODELS + pn->engine_model;
    if (ld->tok_s > vb->tput[cell]) vb->tput[cell] = ld->tok_s;
    int steps = ld->step_cal ? 1 << 30 : (int)(ld->step_steps & 0x3fffffff);
    if ((ld->step_a > 0 || ld->step_c > 0) && steps >= most_steps[cell]) {
        vb->step[cell] = step_of_load(ld);
        most_steps[cell] = steps;
    }
}

/* Link rates: measured ones where a transfer touched the node, the mean of those elsewhere. */
static void links(const struct view_in *in, struct view_buf *vb, const struct cl_load *const *ld)
{
    double sum = 0;
    int n = 0;
    for (int i = 0; i < vb->v.n_nodes; i++) {
        if (!ld[i] || ld[i]->link_Bps <= 0) continue;
        struct plan_node *a = &vb->node[i];
        if (ld[i]->link_Bps > a->link_Bps) a->link_Bps = ld[i]->link_Bps;
        int j = ld[i]->link_peer ? control_view_pid(vb, ld[i]->link_peer) : -1;
        if (j >= 0 && ld[i]->link_Bps > vb->node[j].link_Bps)
            vb->node[j].link_Bps = ld[i]->link_Bps;
    }
    for (int i = 0; i < vb->v.n_nodes; i++)
        if (vb->node[i].link_Bps > 0) sum += vb->node[i].link_Bps, n++;
    (void)in;
    for (int i = 0; i < vb->v.n_nodes; i++)
        if (vb->node[i].link_Bps <= 0) vb->node[i].link_Bps = n ? sum / n : VIEW_LINK_ASSUMED;
}

/* A node scaled down naming a receiver, out of the engine and still running sequences, has them
 * there (a hand-over): the receiver helps them, as its own report will say a heartbeat later. */
static void handovers(const struct view_in *in, struct view_buf *vb)
{
    const struct cl_state *s = in->st;
    uint32_t first = s->n_events > CL_MAX_EVENTS ? s->n_events - CL_MAX_EVENTS : 0;
    int seen[CL_MAX_NODES] = {0}, inferred[CL_MAX_NODES] = {0};
    for (uint32_t k = s->n_events; k-- > first;) { /* the latest decision naming each node */
        const struct cl_event *e = &s->event[k % CL_MAX_EVENTS];
        int x = e->type == CMD_SCALE ? control_view_pid(vb, e->node) : -1;
        if (x < 0 || seen[x]) continue;
        seen[x] = 1;
        int y = e->kind == SCALE_DOWN && e->source ? control_view_pid(vb, e->source) : -1;
        int mi = cluster_state_model(s, e->model);
        const struct plan_node *n = &vb->node[x];
        if (y >= 0 && n->engine_model != mi && n->load.running_seqs > 0)
            inferred[y] += n->load.running_seqs;
    }
    for (int i = 0; i < vb->v.n_nodes; i++)
        if (inferred[i] > vb->node[i].load.helping) vb->node[i].load.helping = inferred[i];
}

void control_view_of(const struct view_in *in, struct view_buf *vb)
{
    const struct cl_state *s = in->st;
    memset(vb, 0, sizeof *vb);
    struct plan_view *v = &vb->v;
    v->now_ms = (double)in->now_wall;
    /* Plan ids: each member's rank by id. */
    v->n_nodes = (int)s->n_members;
    for (uint32_t i = 0; i < s->n_members; i++) {
        int rank = 0;
        for (uint32_t k = 0; k < s->n_members; k++)
            rank += s->member[k].info.id < s->member[i].info.id;
        vb->id[rank] = s->member[i].info.id;
        vb->node[rank].id = rank;
    }
    models(in, vb);
    const struct cl_load *ld[CL_MAX_NODES] = {0};
    int most_steps[CL_MAX_NODES * CL_MAX_MODELS];
    for (int i = 0; i < CL_MAX_NODES * CL_MAX_MODELS; i++) most_steps[i] = -1;
    for (uint32_t i = 0; i < s->n_members; i++) {
        int pid = control_view_pid(vb, s->member[i].info.id);
        struct plan_node *pn = &vb->node[pid];
        node_state(in, vb, i, pn);
        pn->load.idle_since_ms = -1;
        if ((ld[pid] = load_of(in, s->member[i].info.id)))
            node_load(in, vb, pn, ld[pid], most_steps);
    }
    links(in, vb, ld);
    handovers(in, vb);
    /* The matrices as the planner indexes them: [gpu_type * n_models + m], packed in place
     * (row g of the packed layout never lies past row g of the padded one). */
    for (int g = 0; g < v->n_gpu_types; g++)
        for (int m = 0; m < v->n_models; m++) {
            vb->tput[g * v->n_models + m] = vb->tput[g * CL_MAX_MODELS + m];
            vb->step[g * v->n_models + m] = vb->step[g * CL_MAX_MODELS + m];
        }
    for (uint32_t k = 0; k < s->n_scaleouts; k++) {
        const struct cl_scaleout *so = &s->scaleout[k];
        struct plan_scaleout *ps = &vb->so[v->n_scaleouts++];
        ps->kind = so->s.kind == SCALE_UP ? PLAN_SO_ENGINE : PLAN_SO_HOST;
        ps->model = cluster_state_model(s, so->s.model);
        ps->source = so->s.source ? control_view_pid(vb, so->s.source) : -1;
        for (int j = 0; j < so->s.n_chain; j++) {
            int c = control_view_pid(vb, so->s.chain[j]);
            if (c >= 0) ps->chain[ps->n_chain++] = c;
        }
        if (so->s.kind != SCALE_UP) {
            int c = control_view_pid(vb, so->s.node);
            if (c >= 0) ps->chain[ps->n_chain++] = c;
        }
        ps->started_ms = (double)so->started_ms;
    }
    v->nodes = vb->node;
    v->models = vb->model;
    v->scaleouts = vb->so;
    v->tput = vb->tput;
    v->step = vb->step;
}

void control_view_build(struct control *c, struct view_buf *vb, uint64_t now_mono)
{
    struct view_in in = {.st = &c->st,
                         .rep = c->rep,
                         .n_rep = c->n_rep,
                         .relayed = c->relayed,
                         .n_relayed = c->n_relayed,
                         .refuser = c->refuser,
                         .n_refusers = c->n_refusers,
                         .fc = c->fc_on ? c->fc : NULL,
                         .model = c->model,
                         .model_bytes = c->cfg.model_bytes,
                         .ttft_slo_ms = c->cfg.ttft_slo_ms,
                         .tpot_slo_ms = c->cfg.tpot_slo_ms,
                         .keep_alive_ms = c->cfg.keep_alive_ms,
                         .replicas_cached = c->cfg.replicas_cached,
                         .dead_ms = c->cfg.dead_ms,
                         .now_mono = now_mono,
                         .now_wall = now_wall_ms()};
    control_view_of(&in, vb);
}

int control_member_step(struct control *c, uint64_t step_id, struct step_model *m, double *err,
                        int *calibrated, uint64_t *node)
{
    int found = 0, best = -1;
    pthread_mutex_lock(&c->mu);
    uint64_t now = now_mono_ms();
    for (int k = 0; k < c->n_rep + c->n_relayed; k++) {
        const struct cl_load *ld = k < c->n_rep ? &c->rep[k].load : &c->relayed[k - c->n_rep].load;
        uint64_t id = k < c->n_rep ? c->rep[k].id : c->relayed[k - c->n_rep].id;
        uint64_t at = k < c->n_rep ? c->rep[k].at_ms : c->relayed[k - c->n_rep].at_ms;
        if (id == c->cfg.id || !step_id || ld->step_id != step_id || !fitted(ld) ||
            now - at > (uint64_t)c->cfg.dead_ms)
            continue;
        int steps = ld->step_cal ? 1 << 30 : (int)(ld->step_steps & 0x3fffffff);
        if (steps <= best) continue;
        best = steps;
        *m = step_of_load(ld);
        *err = ld->step_err;
        *calibrated = ld->step_cal;
        *node = id;
        found = 1;
    }
    pthread_mutex_unlock(&c->mu);
    return found;
}
