/* control_exec: the executor's side of the control plane: a committed decision that names this
 * node is carried out here, once, through the serving process's table (struct cluster_exec).
 *
 * A scale-out in progress is started again after a restart (its work went with the process); a
 * scale-down or host-copy drop only when decided after this node started. A refusal, or work
 * that failed after it started (control_exec_failed), is kept for this node's next reports until
 * the leader has ended that scale-out; progress comes back through control_set_holding. control_exec_tick
 * runs on the control thread; the two setters on any thread (under mu). */
#include "cluster/control_internal.h"

#include <stdio.h>
#include <string.h>

static int scaleout_names(const struct cl_scaleout *so, uint64_t id)
{
    int mine = so->s.node == id;
    for (int k = 0; k < so->s.n_chain; k++) mine |= so->s.chain[k] == id;
    return mine;
}

/* A decision this node refused or failed, for its next reports (mu held). */
static void add_refusal(struct control *c, uint32_t scale_id, const char *why)
{
    for (int i = 0; i < c->n_my_refused; i++)
        if (c->my_refused[i].scale_id == scale_id) return;
    if (c->n_my_refused == CL_MAX_REFUSED) {
        memmove(c->my_refused, c->my_refused + 1, sizeof c->my_refused - sizeof c->my_refused[0]);
        c->n_my_refused--;
    }
    struct cl_refusal *r = &c->my_refused[c->n_my_refused++];
    r->scale_id = scale_id;
    cluster_cmd_printable(r->reason, why && why[0] ? why : "refused");
}

static int exec_done(struct control *c, uint32_t id)
{
    for (int i = 0; i < c->n_executed; i++)
        if (c->executed[i] == id) return 1;
    if (c->n_executed == CTL_MAX_EXECUTED) {
        memmove(c->executed, c->executed + 1, sizeof c->executed - sizeof c->executed[0]);
        c->n_executed--;
    }
    c->executed[c->n_executed++] = id;
    return 0;
}

/* Carry out committed decisions that name this node. Scale-outs in progress are re-run after a
 * restart (the work was lost with the process); scale-downs only if decided after we started. */
void control_exec_tick(struct control *c)
{
    char err[ERRMSG_LEN];
    struct cl_scaleout todo[CL_MAX_SCALEOUTS];
    struct cl_event ev[CL_MAX_EVENTS];
    int n_todo = 0, n_ev = 0;
    pthread_mutex_lock(&c->mu);
    for (uint32_t i = 0; i < c->st.n_scaleouts; i++) todo[n_todo++] = c->st.scaleout[i];
    uint32_t first = c->st.n_events > CL_MAX_EVENTS ? c->st.n_events - CL_MAX_EVENTS : 0;
    if (c->events_seen > first) first = c->events_seen;
    for (uint32_t i = first; i < c->st.n_events; i++) ev[n_ev++] = c->st.event[i % CL_MAX_EVENTS];
    /* Never backwards: after a recovery the state is rebuilt from the log, and the events it
     * replays were carried out already. */
    if (c->st.n_events > c->events_seen) c->events_seen = c->st.n_events;
    uint32_t n_scales = c->st.n_scales;
    pthread_mutex_unlock(&c->mu);

    for (int i = 0; i < n_todo; i++) {
        const struct cl_scale *s = &todo[i].s;
        if (!scaleout_names(&todo[i], c->cfg.id) || exec_done(c, todo[i].scale_id)) continue;
        int rc;
        if (s->kind == SCALE_UP && c->ex.scale_up)
            rc = c->ex.scale_up(c->ex.ctx, s->model, s->source, s->chain, s->n_chain, err);
        else if (s->kind == SCALE_REPLICATE && c->ex.replicate)
            rc = c->ex.replicate(c->ex.ctx, s->model, s->source, err);
        else
            continue; /* no handler here (a test's executor): nothing was carried out */
        if (rc) {
            /* The leader hears it with the next report and abandons the scale-out. */
            log_warn("cluster", "refused decision %u (%s of %s from node %llu): %s",
                     todo[i].scale_id, s->kind == SCALE_UP ? "scale-up" : "replication", s->model,
                     (unsigned long long)s->source, err);
            pthread_mutex_lock(&c->mu);
            add_refusal(c, todo[i].scale_id, err);
            pthread_mutex_unlock(&c->mu);
            continue;
        }
        log_info("cluster", "executing %s of %s from node %llu",
                 s->kind == SCALE_UP ? "scale-up" : "replication", s->model,
                 (unsigned long long)s->source);
    }
    for (int i = 0; i < n_ev; i++) {
        const struct cl_event *e = &ev[i];
        if (e->type != CMD_SCALE || e->node != c->cfg.id || e->t_ms < c->start_wall) continue;
        int rc = 0;
        if (e->kind == SCALE_DOWN && c->ex.scale_down)
            rc = c->ex.scale_down(c->ex.ctx, e->model, e->source, err);
        else if (e->kind == SCALE_DROP_HOST && c->ex.drop_host)
            rc = c->ex.drop_host(c->ex.ctx, e->model, err);
        else
            continue;
        char to[64] = "";
        if (e->kind == SCALE_DOWN && e->source)
            snprintf(to, sizeof to, " (its sequences to node %llu)", (unsigned long long)e->source);
        log_info("cluster", "executing %s of %s%s%s%s",
                 e->kind == SCALE_DOWN ? "scale-down" : "host-copy drop", e->model, to,
                 rc ? ": " : "", rc ? err : "");
    }
    c->seen_scales = n_scales;
}

void control_exec_failed(struct control *c, const char *model, const char *why)
{
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    for (uint32_t i = 0; i < c->st.n_scaleouts; i++)
        if (!strcmp(c->st.scaleout[i].s.model, model) &&
            scaleout_names(&c->st.scaleout[i], c->cfg.id))
            add_refusal(c, c->st.scaleout[i].scale_id, why);
    pthread_mutex_unlock(&c->mu);
}

void control_set_holding(struct control *c, const char *model, int host, int engine,
                         int layers_resident, int n_layers)
{
    pthread_mutex_lock(&c->mu);
    int i = 0;
    while (i < c->n_my_hold && strcmp(c->my_hold[i].model, model)) i++;
    if (i == c->n_my_hold && c->n_my_hold < CL_MAX_HOLD) c->n_my_hold++;
    if (i < CL_MAX_HOLD) {
        struct cl_holding *h = &c->my_hold[i];
        h->node = c->cfg.id;
        snprintf(h->model, sizeof h->model, "%s", model);
        h->host = host ? 1 : 0;
        h->engine = engine ? 1 : 0;
        h->n_layers = (uint16_t)n_layers;
        h->layers_resident = (uint16_t)(layers_resident > n_layers ? n_layers : layers_resident);
    }
    pthread_mutex_unlock(&c->mu);
}
