/* control_leader: the leader's decisions, each heartbeat, one batch at a time.
 *
 * In order, and only on a state that applied everything proposed: membership (a member silent for
 * --cluster-dead-ms is committed down, one that reports up; holdings that changed), then the
 * scale-outs that ended (done, or abandoned with the reason: source or node down, a refusal, the
 * timeout), then the planner (cluster/planner.h) on the view (control_view.c), its actions
 * committed as CMD_SCALE. A node that refused a model is left out of its scale-outs for a while
 * (struct refuser). Runs on the control thread. */
#include "cluster/control_internal.h"

#include <stdio.h>
#include <string.h>

static int hold_differs(const struct cl_hold *h, const struct cl_holding *r)
{
    return h->host != r->host || h->engine != r->engine ||
           h->layers_resident != r->layers_resident || h->n_layers != r->n_layers;
}

int control_report_holding(const struct cl_state *st, const struct cl_member *m,
                           const struct report *r, struct cl_holding *out)
{
    for (int h = 0; h < r->n_hold && h < CL_MAX_HOLD; h++) {
        int mi = cluster_state_model(st, r->hold[h].model);
        if (mi >= 0 && !hold_differs(&m->hold[mi], &r->hold[h])) continue;
        *out = r->hold[h];
        return 1;
    }
    /* a model the state says the node holds and its report leaves out: it holds none of it (a
     * restarted node has lost its host copy and engine and reports only what it holds again) */
    for (uint32_t mi = 0; mi < st->n_models && mi < CL_MAX_MODELS; mi++) {
        const struct cl_hold *h = &m->hold[mi];
        if (!h->host && !h->engine && !h->layers_resident) continue;
        int reported = 0;
        for (int k = 0; k < r->n_hold && k < CL_MAX_HOLD && !reported; k++)
            reported = !strcmp(r->hold[k].model, st->model[mi]);
        if (reported) continue;
        *out = (struct cl_holding){.node = m->info.id};
        snprintf(out->model, sizeof out->model, "%s", st->model[mi]);
        out->n_layers = h->n_layers;
        return 1;
    }
    return 0;
}

int control_scaleout_stalled(struct stall_track *t, int *n, uint32_t scale_id, int progress,
                             uint64_t now, uint64_t stall_ms)
{
    struct stall_track *e = NULL;
    for (int i = 0; i < *n && !e; i++)
        if (t[i].scale_id == scale_id) e = &t[i];
    if (!e) {
        if (*n < CTL_MAX_STALL) {
            e = &t[(*n)++];
        } else {
            e = &t[0];
            for (int i = 1; i < *n; i++)
                if (t[i].since < e->since) e = &t[i];
        }
        *e = (struct stall_track){scale_id, progress, now};
        return 0;
    }
    if (progress > e->progress) {
        e->progress = progress;
        e->since = now;
        return 0;
    }
    return now - e->since > stall_ms;
}

/* Membership and holdings from the reports; returns how many commands it proposed. */
static int leader_membership(struct control *c, uint64_t now)
{
    struct cl_cmd cmd[CL_MAX_NODES * 2];
    int n = 0;
    pthread_mutex_lock(&c->mu);
    for (uint32_t i = 0; i < c->st.n_members; i++) {
        const struct cl_member *m = &c->st.member[i];
        struct report *r = NULL;
        for (int k = 0; k < c->n_rep; k++)
            if (c->rep[k].id == m->info.id) r = &c->rep[k];
        uint64_t last = r ? r->at_ms : 0;
        if (last < c->leader_since) last = c->leader_since;
        if (m->alive && now - last > (uint64_t)c->cfg.dead_ms) {
            cmd[n] = (struct cl_cmd){.type = CMD_NODE_DOWN};
            cmd[n++].u.down = m->info.id;
            log_warn("cluster", "node %llu silent for %llu ms: down",
                     (unsigned long long)m->info.id, (unsigned long long)(now - last));
        }
    }
    for (int k = 0; k < c->n_rep && n < CL_MAX_NODES * 2 - 1; k++) {
        const struct report *r = &c->rep[k];
        if (now - r->at_ms > (uint64_t)c->cfg.dead_ms) continue;
        const struct cl_member *m = cluster_state_member_c(&c->st, r->id);
        int tok_changed = m && (r->node.tok_s > 1.2f * m->info.tok_s + 1 ||
                                r->node.tok_s < 0.8f * m->info.tok_s - 1);
        if (!m || !m->alive || tok_changed || strcmp(m->info.http, r->node.http) ||
            strcmp(m->info.addr, r->node.addr) || strcmp(m->info.fabric, r->node.fabric) ||
            strcmp(m->info.rack, r->node.rack)) {
            cmd[n] = (struct cl_cmd){.type = CMD_NODE_UP};
            cmd[n++].u.up = r->node;
            continue; /* holdings once it is a member */
        }
        /* A node that has not yet acted on the latest decisions may report stale holdings. */
        if (r->seen_scales < c->st.n_scales) continue;
        struct cl_holding hd;
        if (n < CL_MAX_NODES * 2 && control_report_holding(&c->st, m, r, &hd)) {
            cmd[n] = (struct cl_cmd){.type = CMD_HOLDING}; /* one per node per tick */
            cmd[n++].u.hold = hd;
        }
    }
    pthread_mutex_unlock(&c->mu);
    for (int i = 0; i < n; i++) control_fsm_propose(c, &cmd[i]);
    return n;
}

/* A report's refusal of scale-out scale_id, or NULL (mu held). */
static const char *refusal_of(struct control *c, uint64_t node, uint32_t scale_id)
{
    for (int k = 0; k < c->n_rep; k++) {
        if (c->rep[k].id != node) continue;
        for (int j = 0; j < c->rep[k].n_refused; j++)
            if (c->rep[k].refused[j].scale_id == scale_id) return c->rep[k].refused[j].reason;
    }
    return NULL;
}

static void refuser_add(struct control *c, uint64_t node, const char *model, uint64_t now)
{
    struct refuser *r = NULL;
    for (int i = 0; i < c->n_refusers && !r; i++)
        if (c->refuser[i].node == node && !strcmp(c->refuser[i].model, model)) r = &c->refuser[i];
    for (int i = 0; i < c->n_refusers && !r; i++)
        if (c->refuser[i].until <= now) r = &c->refuser[i];
    if (!r && c->n_refusers < CTL_MAX_REFUSERS) r = &c->refuser[c->n_refusers++];
    if (!r) r = &c->refuser[0];
    r->node = node;
    r->until = now + 2 * (uint64_t)c->cfg.dead_ms;
    snprintf(r->model, sizeof r->model, "%s", model);
}

/* Scale-outs whose joiners all serve alone (or that lost their source or a joiner, or whose joiner
 * refused) end. */
static int leader_scaleouts(struct control *c)
{
    struct cl_cmd cmd[CL_MAX_SCALEOUTS];
    int n = 0;
    uint64_t now = now_mono_ms();
    pthread_mutex_lock(&c->mu);
    for (uint32_t i = 0; i < c->st.n_scaleouts; i++) {
        const struct cl_scaleout *so = &c->st.scaleout[i];
        int mi = cluster_state_model(&c->st, so->s.model), done = mi >= 0, lost = 0;
        uint64_t who = 0; /* the node that refused or failed it */
        char why[CL_STR_LEN + 1] = "";
        const struct cl_member *src = cluster_state_member_c(&c->st, so->s.source);
        if (so->s.source && (!src || !src->alive)) {
            lost = 1;
            snprintf(why, sizeof why, "source node %llu is down", (unsigned long long)so->s.source);
        }
        /* A copy that never finishes (a stream stuck below its pacing, a target that stopped
         * reporting its refusal) must not hold the model's host-copy decisions forever. */
        if (now_wall_ms() > so->started_ms + (uint64_t)c->cfg.scaleout_timeout_ms) {
            if (!lost) {
                log_warn("cluster", "scale-out %u of %s: not done after %d ms: abandoned",
                         so->scale_id, so->s.model, c->cfg.scaleout_timeout_ms);
                snprintf(why, sizeof why, "not done after %d ms", c->cfg.scaleout_timeout_ms);
            }
            lost = 1;
        }
        uint64_t targets[CL_MAX_CHAIN + 1];
        int nt = 0;
        if (so->s.kind == SCALE_UP)
            for (int k = 0; k < so->s.n_chain; k++) targets[nt++] = so->s.chain[k];
        else
            targets[nt++] = so->s.node;
        for (int k = 0; k < nt && mi >= 0; k++) {
            const struct cl_member *m = cluster_state_member_c(&c->st, targets[k]);
            if (!m || !m->alive) {
                if (!lost) {
                    who = targets[k];
                    snprintf(why, sizeof why, "node %llu is down", (unsigned long long)who);
                }
                lost = 1;
                continue;
            }
            /* The target refused the decision or its work failed, and says so in its report:
             * abandoned now, and the planner leaves that node out for this model. */
            const char *refused = refusal_of(c, targets[k], so->scale_id);
            if (refused) {
                if (!lost || !who) {
                    who = targets[k];
                    snprintf(why, sizeof why, "%s", refused);
                }
                lost = 1;
                refuser_add(c, targets[k], so->s.model, now);
                log_warn("cluster", "node %llu refused decision %u (%s of %s): %s: abandoned",
                         (unsigned long long)targets[k], so->scale_id,
                         so->s.kind == SCALE_UP ? "scale-up" : "replication", so->s.model, refused);
                continue;
            }
            const struct cl_hold *h = &m->hold[mi];
            /* The decision set the joiner's engine; its own report took it back: it refused or
             * its join failed (its log says why). The planner decides again. */
            if (so->s.kind == SCALE_UP && !h->engine) {
                if (!lost) {
                    who = targets[k];
                    snprintf(why, sizeof why, "node %llu took it out of its engine",
                             (unsigned long long)who);
                }
                lost = 1;
            }
            if (so->s.kind == SCALE_UP
                    ? !(h->engine && h->layers_resident == h->n_layers && h->n_layers)
                    : !h->host)
                done = 0;
        }
        /* A scale-up whose joiners gain no layer (a source that never sends the header, a stream
         * stopped below its pacing) ends well before the whole-copy timeout, so the planner
         * decides again instead of waiting on it. */
        if (!done && !lost && so->s.kind == SCALE_UP && mi >= 0) {
            int progress = 0;
            for (int k = 0; k < nt; k++) {
                const struct cl_member *m = cluster_state_member_c(&c->st, targets[k]);
                if (m) progress += m->hold[mi].layers_resident;
            }
            if (control_scaleout_stalled(c->stall, &c->n_stall, so->scale_id, progress, now,
                                         (uint64_t)c->cfg.scaleout_stall_ms)) {
                lost = 1;
                snprintf(why, sizeof why, "no layer landed in %d ms", c->cfg.scaleout_stall_ms);
                log_warn("cluster", "scale-out %u of %s: %s: abandoned", so->scale_id, so->s.model,
                         why);
            }
        }
        if (done || lost) {
            cmd[n] = (struct cl_cmd){.type = CMD_SCALE_DONE};
            cmd[n].u.done.scale_id = so->scale_id;
            cmd[n].u.done.ok = !lost;
            if (!lost)
                log_info("cluster", "scale-out %u of %s done: %s after %.1f s", so->scale_id,
                         so->s.model,
                         so->s.kind == SCALE_UP ? "every joiner serves alone (k = L)"
                                                : "the host copy is whole",
                         (double)(now_wall_ms() - so->started_ms) / 1e3);
            if (lost) {
                cmd[n].u.done.node = who;
                cluster_cmd_printable(cmd[n].u.done.reason, why[0] ? why : "abandoned");
            }
            n++;
        }
    }
    pthread_mutex_unlock(&c->mu);
    for (int i = 0; i < n; i++) control_fsm_propose(c, &cmd[i]);
    return n;
}

/* Why the planner took action a, in one short line: what it compared (the command's reason, the
 * event's and the decision line's). */
static void why_text(const struct plan_action *a, char out[CL_STR_LEN + 1])
{
    char t[128];
    double v = a->why_value, l = a->why_limit;
    switch (a->reason) {
    case PLAN_WHY_SLACK:
        snprintf(t, sizeof t, "predicted TTFT %.0f ms > SLO %.0f ms", v, l);
        break;
    case PLAN_WHY_COLD:
        snprintf(t, sizeof t, "%.0f request(s) held, no replica", v);
        break;
    case PLAN_WHY_FORECAST:
        snprintf(t, sizeof t, "forecast %.0f tok/s > capacity %.0f tok/s", v, l);
        break;
    case PLAN_WHY_KV:
        snprintf(t, sizeof t, "KV in use %.2f > %.2f of the replicas'", v, l);
        break;
    case PLAN_WHY_SLOTS:
        snprintf(t, sizeof t, "%.0f requests > %.0f for the batch slots", v, l);
        break;
    case PLAN_WHY_IDLE:
        snprintf(t, sizeof t, "idle %.1f s >= keep-alive %.1f s", v / 1e3, l / 1e3);
        break;
    case PLAN_WHY_CAPACITY:
        snprintf(t, sizeof t, "demand %.0f tok/s fits one replica fewer (%.0f)", v, l);
        break;
    case PLAN_WHY_DURABILITY:
        snprintf(t, sizeof t, "host copies %.0f %s R = %.0f", v, v < l ? "<" : ">", l);
        break;
    case PLAN_WHY_STANDBY:
        snprintf(t, sizeof t, "standbys %.0f > %.0f wanted", v, l);
        break;
    case CTL_WHY_TEST:
        snprintf(t, sizeof t, "--test-scale-in");
        break;
    default:
        snprintf(t, sizeof t, "reason %d", a->reason);
    }
    cluster_cmd_printable(out, t);
}

int control_leader_commands(const struct view_buf *vb, const struct cl_state *st,
                            const struct plan_action *act, int n, struct cl_cmd *cmd, int cap,
                            char *err)
{
    static const uint8_t kinds[] = {[PLAN_SCALE_UP] = SCALE_UP,
                                    [PLAN_SCALE_DOWN] = SCALE_DOWN,
                                    [PLAN_REPLICATE_HOST] = SCALE_REPLICATE,
                                    [PLAN_DROP_HOST] = SCALE_DROP_HOST};
    int nc = 0;
    if (err) err[0] = 0;
#define NODE_OK(x) ((x) >= 0 && (x) < vb->v.n_nodes)
    for (int i = 0; i < n && nc < cap; i++) {
        const struct plan_action *a = &act[i];
        const char *bad = NULL;
        if (a->kind < 0 || a->kind >= (int)sizeof kinds || !kinds[a->kind])
            bad = "a kind the log has no command for";
        else if (a->model < 0 || a->model >= (int)st->n_models)
            bad = "a model outside the view";
        else if (!NODE_OK(a->node) || (a->source >= 0 && !NODE_OK(a->source)) ||
                 (a->kind == PLAN_SCALE_DOWN && a->handover >= 0 && !NODE_OK(a->handover)) ||
                 a->n_chain < 0 || a->n_chain > CL_MAX_CHAIN)
            bad = "a node outside the view";
        for (int j = 0; j < a->n_chain && j < PLAN_MAX_CHAIN && !bad; j++)
            if (!NODE_OK(a->chain[j])) bad = "a node outside the view";
        if (bad) {
            if (err)
                errmsg_set(err, "planner action %d (kind %d, model %d, node %d): %s: left out", i,
                           a->kind, a->model, a->node, bad);
            continue;
        }
        struct cl_cmd *k = &cmd[nc++];
        *k = (struct cl_cmd){.type = CMD_SCALE};
        struct cl_scale *sc = &k->u.scale;
        sc->kind = kinds[a->kind];
        snprintf(sc->model, sizeof sc->model, "%s", st->model[a->model]);
        sc->node = vb->id[a->node];
        /* a scale-down's source is the replica taking its sequences (the hand-over), 0: none */
        int src = a->kind == PLAN_SCALE_DOWN ? a->handover : a->source;
        sc->source = src >= 0 ? vb->id[src] : 0;
        for (int j = 0; j < a->n_chain; j++) sc->chain[sc->n_chain++] = vb->id[a->chain[j]];
        why_text(a, sc->reason);
    }
#undef NODE_OK
    return nc;
}

/* --test-scale-in (tests only): instead of the planner, every test_scale_in_ms one forced
 * scale-in of the first model under load: the serving replica with the most running sequences
 * (that runs none of another node's) hands them to another serving replica (SCALE_DOWN with a
 * receiver, as a capacity scale-in does), and on the next decision it comes back from its host
 * copy (SCALE_UP from itself). */
static int test_scale_in(struct control *c, const struct view_buf *vb, struct plan_action *act)
{
    const struct plan_view *v = &vb->v;
    if (!v->n_models || c->test_next > now_mono_ms()) return 0;
    int m = 0, L = v->models[0].layers, busiest = -1, back = -1, to = -1;
    for (int i = 0; i < v->n_nodes; i++) {
        const struct plan_node *n = &v->nodes[i];
        if (!n->alive) continue;
        if (n->engine_model < 0 && (n->host_cached & 1)) back = i;
        if (n->engine_model != m || n->layers_resident < L || n->load.helping) continue;
        if (busiest < 0 || n->load.running_seqs > v->nodes[busiest].load.running_seqs) busiest = i;
    }
    if (v->n_scaleouts) return 0; /* the last one comes back first */
    if (back >= 0) {
        act[0] = (struct plan_action){.kind = PLAN_SCALE_UP,
                                      .model = m,
                                      .source = back,
                                      .node = back,
                                      .n_chain = 1,
                                      .reason = CTL_WHY_TEST,
                                      .handover = -1};
        act[0].chain[0] = back;
        return 1;
    }
    for (int i = 0; i < v->n_nodes && busiest >= 0; i++) {
        const struct plan_node *n = &v->nodes[i];
        if (i != busiest && n->alive && n->engine_model == m && n->layers_resident >= L &&
            (to < 0 || n->load.kv_used < v->nodes[to].load.kv_used))
            to = i;
    }
    if (to < 0) return 0;
    c->test_next = now_mono_ms() + (uint64_t)c->cfg.test_scale_in_ms;
    act[0] = (struct plan_action){.kind = PLAN_SCALE_DOWN,
                                  .model = m,
                                  .source = -1,
                                  .node = busiest,
                                  .reason = CTL_WHY_TEST,
                                  .handover = to};
    return 1;
}

static int leader_plan(struct control *c)
{
    static struct view_buf vb; /* the control thread's */
    struct plan_action act[16];
    struct cl_cmd cmd[16];
    struct plan_config pc;
    char err[ERRMSG_LEN], skipped[ERRMSG_LEN];
    pthread_mutex_lock(&c->mu);
    control_plan_config(&c->cfg, &pc);
    control_view_build(c, &vb, now_mono_ms());
    int n = !vb.v.n_models                ? 0
            : c->cfg.test_scale_in_ms > 0 ? test_scale_in(c, &vb, act)
                                          : planner_step(&pc, &vb.v, act, 16, err);
    int nc = n > 0 ? control_leader_commands(&vb, &c->st, act, n, cmd, 16, skipped) : 0;
    pthread_mutex_unlock(&c->mu);
    if (n < 0) log_warn("cluster", "planner: %s", err);
    if (n > 0 && skipped[0]) log_warn("cluster", "%s", skipped);
    for (int i = 0; i < nc; i++) {
        char line[ERRMSG_LEN];
        control_scale_line(&cmd[i].u.scale, line, sizeof line);
        log_info("cluster", "decision: %s", line);
        control_fsm_propose(c, &cmd[i]);
    }
    return nc;
}

/* Every fresh report's prompt tokens submitted since the last one, into its model's forecast. */
static void leader_forecast(struct control *c)
{
    uint64_t now = now_mono_ms(), wall = now_wall_ms();
    double tokens[CL_MAX_MODELS] = {0};
    pthread_mutex_lock(&c->mu);
    if (c->fc_epoch != c->leader_since) c->fc_on = 0, c->fc_epoch = c->leader_since;
    if (!c->fc_on) {
        memset(c->fc_started, 0, sizeof c->fc_started);
        for (int k = 0; k < c->n_rep; k++) c->rep[k].prompt_seen = c->rep[k].load.prompt_in;
        c->fc_on = 1;
    }
    for (uint32_t m = 0; m < c->st.n_models; m++)
        if (!c->fc_started[m]) {
            planner_forecast_init(&c->fc[m], (double)wall, CTL_FC_PERIOD_MS, CTL_FC_ALPHA,
                                  CTL_FC_BETA);
            c->fc_started[m] = 1;
        }
    for (int k = 0; k < c->n_rep; k++) {
        struct report *r = &c->rep[k];
        uint64_t in = r->load.prompt_in;
        /* a restarted node counts from 0 again */
        uint64_t d = in >= r->prompt_seen ? in - r->prompt_seen : in;
        r->prompt_seen = in;
        if (!d || now - r->at_ms > (uint64_t)c->cfg.dead_ms) continue;
        int mi = -1;
        for (int h = 0; h < r->n_hold && mi < 0; h++)
            if (r->hold[h].engine) mi = cluster_state_model(&c->st, r->hold[h].model);
        for (int h = 0; h < r->n_hold && mi < 0; h++)
            if (r->hold[h].host) mi = cluster_state_model(&c->st, r->hold[h].model);
        if (mi >= 0) tokens[mi] += (double)d;
    }
    for (uint32_t m = 0; m < c->st.n_models; m++)
        planner_forecast_observe(&c->fc[m], (double)wall, tokens[m]);
    pthread_mutex_unlock(&c->mu);
}

void control_leader_tick(struct control *c)
{
    uint64_t now = now_mono_ms();
    leader_forecast(c);      /* every tick: the arrivals are measured whether or not we decide */
    if (c->inflight) return; /* one batch at a time: decide on what committed */
    if (raft_last_applied(&c->raft) < raft_last_index(&c->raft)) return;
    if (leader_membership(c, now)) return;
    if (leader_scaleouts(c)) return;
    leader_plan(c);
}
