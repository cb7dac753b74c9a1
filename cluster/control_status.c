/* control_status: what the control plane shows: GET /v1/cluster (JSON) and the cluster's part of
 * /metrics, from the copy on_tick publishes (raft's state) and the replicated state, under mu.
 * Called on the HTTP thread. */
#include "cluster/control_internal.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *raft_state_name(int s)
{
    return s == RAFT_LEADER      ? "leader"
           : s == RAFT_CANDIDATE ? "candidate"
           : s == RAFT_FOLLOWER  ? "follower"
                                 : "unavailable";
}

static const char *event_name(const struct cl_event *e)
{
    switch (e->type) {
    case CMD_NODE_UP:
        return "node_up";
    case CMD_NODE_DOWN:
        return "node_down";
    case CMD_SCALE:
        return e->kind == SCALE_UP          ? "scale_up"
               : e->kind == SCALE_DOWN      ? "scale_down"
               : e->kind == SCALE_REPLICATE ? "replicate_host"
                                            : "drop_host";
    case CMD_SCALE_DONE:
        return e->kind ? "scale_done" : "scale_abandoned";
    case CMD_RAFT_CONF:
        return e->kind == CONF_REMOVED ? "raft_removed"
               : e->kind == CONF_VOTER ? "raft_voter"
                                       : "raft_recovered";
    case CMD_MODEL:
        return e->kind ? "model_lost" : "model_found";
    }
    return "?";
}

void control_scale_line(const struct cl_scale *s, char *out, size_t cap)
{
    size_t n = 0;
    out[0] = 0;
#define ADD(...)                                                                                   \
    do {                                                                                           \
        int k_ = snprintf(out + n, n < cap ? cap - n : 0, __VA_ARGS__);                            \
        if (k_ > 0) n += (size_t)k_;                                                               \
    } while (0)
    switch (s->kind) {
    case SCALE_UP:
        ADD("scale up %s onto ", s->model);
        for (int i = 0; i < s->n_chain && i < CL_MAX_CHAIN; i++)
            ADD("%s%llu", i ? " -> " : "", (unsigned long long)s->chain[i]);
        ADD(" from node %llu", (unsigned long long)s->source);
        break;
    case SCALE_DOWN:
        ADD("scale down %s on node %llu", s->model, (unsigned long long)s->node);
        if (s->source) ADD(", handing its sequences to node %llu", (unsigned long long)s->source);
        break;
    case SCALE_REPLICATE:
        ADD("copy %s into node %llu's host memory from node %llu", s->model,
            (unsigned long long)s->node, (unsigned long long)s->source);
        break;
    default:
        ADD("drop %s's host copy on node %llu", s->model, (unsigned long long)s->node);
    }
    if (s->reason[0]) ADD(": %s", s->reason);
#undef ADD
}

char *control_json(struct control *c, size_t *len)
{
    cJSON *root = cJSON_CreateObject();
    pthread_mutex_lock(&c->mu);
    const struct cl_state *s = &c->st;
    cJSON_AddNumberToObject(root, "node_id", (double)c->cfg.id);
    cJSON_AddStringToObject(root, "raft_state", raft_state_name(c->raft_state));
    if (c->leader_id)
        cJSON_AddNumberToObject(root, "leader", (double)c->leader_id);
    else
        cJSON_AddNullToObject(root, "leader");
    cJSON_AddStringToObject(root, "leader_address", c->leader_addr);
    cJSON_AddNumberToObject(root, "term", (double)c->term);
    cJSON_AddNumberToObject(root, "commit_index", (double)c->commit_index);
    cJSON_AddNumberToObject(root, "applied_index", (double)c->applied_index);
    cJSON_AddNumberToObject(root, "last_log_index", (double)c->last_index);
    cJSON_AddNumberToObject(root, "commands_applied", (double)s->applied);
    cJSON_AddNumberToObject(root, "decisions", (double)c->decisions);
    cJSON_AddNumberToObject(root, "refused_connections", (double)c->refused);
    cJSON_AddNumberToObject(root, "handshake_timeouts", (double)c->handshake_timeouts);
    cJSON_AddNumberToObject(root, "impostor_messages", (double)c->impostors);
    cJSON_AddNumberToObject(root, "forged_frames", (double)sconn_forged_frames());
    cJSON_AddNumberToObject(root, "signed_requests_refused", (double)c->signed_refused);
    cJSON_AddNumberToObject(root, "recoveries", (double)c->recoveries);
    if (c->last_recovery_ms)
        cJSON_AddNumberToObject(root, "last_recovery_ms", (double)c->last_recovery_ms);
    else
        cJSON_AddNullToObject(root, "last_recovery_ms");
    /* raft's configuration as this node holds it (the latest, maybe not yet committed). */
    cJSON *voters = cJSON_AddArrayToObject(root, "voters");
    cJSON *others = cJSON_AddArrayToObject(root, "non_voters");
    for (int i = 0; i < c->n_conf; i++)
        cJSON_AddItemToArray(c->conf[i].voter ? voters : others,
                             cJSON_CreateNumber((double)c->conf[i].id));
    cJSON *nodes = cJSON_AddArrayToObject(root, "nodes");
    for (uint32_t i = 0; i < s->n_members; i++) {
        const struct cl_member *m = &s->member[i];
        cJSON *n = cJSON_CreateObject();
        cJSON_AddNumberToObject(n, "id", (double)m->info.id);
        cJSON_AddStringToObject(n, "address", m->info.addr);
        cJSON_AddStringToObject(n, "http", m->info.http);
        cJSON_AddStringToObject(n, "fabric", m->info.fabric);
        cJSON_AddStringToObject(n, "role",
                                m->info.id == c->leader_id   ? "leader"
                                : m->info.role == ROLE_VOTER ? "voter"
                                                             : "joined");
        cJSON_AddBoolToObject(n, "alive", m->alive);
        cJSON_AddNumberToObject(n, "since_ms", (double)m->since_ms);
        cJSON_AddNumberToObject(n, "downs", m->downs); /* its failure rate's evidence */
        cJSON_AddNumberToObject(n, "up_ms", (double)m->up_ms);
        cJSON_AddStringToObject(n, "gpu", m->info.gpu);
        cJSON_AddStringToObject(n, "rack", m->info.rack);
        cJSON_AddNumberToObject(n, "tokens_per_s", m->info.tok_s);
        cJSON *models = cJSON_AddArrayToObject(n, "models");
        for (uint32_t k = 0; k < s->n_models; k++) {
            const struct cl_hold *h = &m->hold[k];
            if (!h->host && !h->engine) continue;
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "name", s->model[k]);
            cJSON_AddBoolToObject(o, "host", h->host);
            cJSON_AddBoolToObject(o, "engine", h->engine);
            cJSON_AddNumberToObject(o, "layers_resident", h->layers_resident);
            cJSON_AddNumberToObject(o, "layers", h->n_layers);
            cJSON_AddItemToArray(models, o);
        }
        /* Our own report of it (the leader has everyone's), else the leader's relayed copy. */
        const struct cl_load *ld = NULL;
        uint64_t at = 0;
        int relayed = 0;
        for (int k = 0; k < c->n_rep && !ld; k++)
            if (c->rep[k].id == m->info.id) ld = &c->rep[k].load, at = c->rep[k].at_ms;
        for (int k = 0; k < c->n_relayed && !ld; k++)
            if (c->relayed[k].id == m->info.id)
                ld = &c->relayed[k].load, at = c->relayed[k].at_ms, relayed = 1;
        if (ld) {
            cJSON *l = cJSON_AddObjectToObject(n, "load");
            cJSON_AddNumberToObject(l, "age_ms", (double)(now_mono_ms() - at));
            cJSON_AddBoolToObject(l, "relayed", relayed);
            cJSON_AddNumberToObject(l, "queue", ld->queue_len);
            cJSON_AddNumberToObject(l, "queued_tokens", (double)ld->queued_tokens);
            cJSON_AddNumberToObject(l, "running", ld->running);
            cJSON_AddNumberToObject(l, "held", ld->held);
            cJSON_AddNumberToObject(l, "kv_used", ld->kv_used);
            cJSON_AddNumberToObject(l, "predicted_ttft_ms", ld->ttft_pred_ms);
            cJSON_AddNumberToObject(l, "tokens_per_s", ld->tok_s);
            cJSON_AddNumberToObject(l, "idle_ms", ld->idle_ms);
            /* what the planner measures with (docs/control.md "What the planner is fed") */
            cJSON *sm = cJSON_AddObjectToObject(l, "step_model");
            cJSON_AddNumberToObject(sm, "a_us", ld->step_a * ld->step_corr * 1e6);
            cJSON_AddNumberToObject(sm, "b_us", ld->step_b * ld->step_corr * 1e6);
            cJSON_AddNumberToObject(sm, "c_us", ld->step_c * ld->step_corr * 1e6);
            cJSON_AddNumberToObject(sm, "err", ld->step_err);
            cJSON_AddNumberToObject(sm, "steps", ld->step_steps);
            cJSON_AddBoolToObject(sm, "calibrated", ld->step_cal);
            cJSON_AddNumberToObject(l, "link_Bps", ld->link_Bps);
            cJSON_AddNumberToObject(l, "link_peer", (double)ld->link_peer);
            cJSON_AddNumberToObject(l, "prompt_in", (double)ld->prompt_in);
            cJSON_AddNumberToObject(l, "helping", ld->helping);
        }
        cJSON_AddItemToArray(nodes, n);
    }
    /* Models recorded lost (CMD_MODEL): the layers no live node holds. */
    cJSON *lost = cJSON_AddArrayToObject(root, "models_lost");
    for (uint32_t k = 0; k < s->n_models; k++) {
        if (!s->lost[k].lost) continue;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", s->model[k]);
        cJSON *l = cJSON_AddArrayToObject(o, "missing_layers");
        cJSON_AddItemToArray(l, cJSON_CreateNumber(s->lost[k].first));
        cJSON_AddItemToArray(l, cJSON_CreateNumber(s->lost[k].n_layers));
        cJSON_AddNumberToObject(o, "layers", s->lost[k].n_layers);
        cJSON_AddNumberToObject(o, "since_ms", (double)s->lost[k].since_ms);
        cJSON_AddItemToArray(lost, o);
    }
    cJSON *sos = cJSON_AddArrayToObject(root, "scaleouts");
    for (uint32_t i = 0; i < s->n_scaleouts; i++) {
        const struct cl_scaleout *so = &s->scaleout[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "id", so->scale_id);
        cJSON_AddStringToObject(o, "kind", so->s.kind == SCALE_UP ? "engine" : "host");
        cJSON_AddStringToObject(o, "model", so->s.model);
        cJSON_AddNumberToObject(o, "source", (double)so->s.source);
        cJSON *ch = cJSON_AddArrayToObject(o, "chain");
        for (int k = 0; k < so->s.n_chain; k++)
            cJSON_AddItemToArray(ch, cJSON_CreateNumber((double)so->s.chain[k]));
        cJSON_AddNumberToObject(o, "started_ms", (double)so->started_ms);
        cJSON_AddItemToArray(sos, o);
    }
    cJSON *evs = cJSON_AddArrayToObject(root, "events");
    uint32_t first = s->n_events > CL_MAX_EVENTS ? s->n_events - CL_MAX_EVENTS : 0;
    for (uint32_t i = first; i < s->n_events; i++) {
        const struct cl_event *e = &s->event[i % CL_MAX_EVENTS];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "seq", e->seq);
        cJSON_AddNumberToObject(o, "t_ms", (double)e->t_ms);
        cJSON_AddStringToObject(o, "event", event_name(e));
        cJSON_AddNumberToObject(o, "node", (double)e->node);
        if (e->type == CMD_MODEL) cJSON_AddStringToObject(o, "model", e->model);
        if (e->type == CMD_SCALE || e->type == CMD_SCALE_DONE) {
            cJSON_AddStringToObject(o, "model", e->model);
            cJSON_AddNumberToObject(o, "source", (double)e->source);
        }
        if (e->reason[0]) cJSON_AddStringToObject(o, "reason", e->reason);
        cJSON_AddItemToArray(evs, o);
    }
    pthread_mutex_unlock(&c->mu);
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    *len = text ? strlen(text) : 0;
    return text;
}

int control_member_http(struct control *c, uint64_t id, char *out, size_t cap)
{
    pthread_mutex_lock(&c->mu);
    const struct cl_member *m = cluster_state_member_c(&c->st, id);
    if (m) snprintf(out, cap, "%s", m->info.http);
    pthread_mutex_unlock(&c->mu);
    return m ? 0 : -1;
}

struct mbuf {
    char *p;
    size_t len, cap;
};

static void mprintf(struct mbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void mprintf(struct mbuf *b, const char *fmt, ...)
{
    va_list ap;
    for (;;) {
        va_start(ap, fmt);
        int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) return;
        if (b->p && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = (b->cap + (size_t)n + 1) * 2;
        char *p = realloc(b->p, cap);
        if (!p) return;
        b->p = p;
        b->cap = cap;
    }
}

char *control_metrics(struct control *c, size_t *len)
{
    struct mbuf b = {0};
    pthread_mutex_lock(&c->mu);
    const struct cl_state *s = &c->st;
    int n_voters = 0;
    uint64_t n_lost = 0;
    for (int i = 0; i < c->n_conf; i++) n_voters += c->conf[i].voter;
    for (uint32_t k = 0; k < s->n_models; k++) n_lost += s->lost[k].lost;
    /* One line of the table, one series: "# TYPE name type" and "name value". */
    const struct {
        const char *name, *type;
        uint64_t value;
    } scalar[] = {
        {"strata_cluster_leader", "gauge", c->leader_id},
        {"strata_cluster_is_leader", "gauge", c->raft_state == RAFT_LEADER},
        {"strata_cluster_term", "gauge", c->term},
        {"strata_cluster_applied_index", "gauge", c->applied_index},
        {"strata_cluster_commands_applied_total", "counter", s->applied},
        {"strata_cluster_decisions_total", "counter", c->decisions},
        {"strata_cluster_refused_total", "counter", c->refused},
        {"strata_cluster_handshake_timeouts_total", "counter", c->handshake_timeouts},
        {"strata_cluster_impostor_messages_total", "counter", c->impostors},
        {"strata_cluster_forged_frames_total", "counter", sconn_forged_frames()},
        {"strata_cluster_recoveries_total", "counter", c->recoveries},
        {"strata_cluster_voters", "gauge", (uint64_t)n_voters},
        {"strata_cluster_load_reports_total", "counter", c->reports_in},
        {"strata_cluster_scaleouts", "gauge", s->n_scaleouts},
        {"strata_cluster_models_lost", "gauge", n_lost},
    };
    for (size_t i = 0; i < sizeof scalar / sizeof scalar[0]; i++)
        mprintf(&b, "# TYPE %s %s\n%s %llu\n", scalar[i].name, scalar[i].type, scalar[i].name,
                (unsigned long long)scalar[i].value);
    uint64_t kinds[5] = {0};
    uint32_t first = s->n_events > CL_MAX_EVENTS ? s->n_events - CL_MAX_EVENTS : 0;
    for (uint32_t i = first; i < s->n_events; i++)
        if (s->event[i % CL_MAX_EVENTS].type == CMD_SCALE)
            kinds[s->event[i % CL_MAX_EVENTS].kind]++;
    mprintf(&b, "# TYPE strata_cluster_scale_events gauge\n");
    const char *kn[] = {"", "up", "down", "replicate", "drop_host"};
    for (int k = 1; k < 5; k++)
        mprintf(&b, "strata_cluster_scale_events{kind=\"%s\"} %llu\n", kn[k],
                (unsigned long long)kinds[k]);
    mprintf(&b, "# TYPE strata_cluster_node_alive gauge\n");
    for (uint32_t i = 0; i < s->n_members; i++)
        mprintf(&b, "strata_cluster_node_alive{node=\"%llu\",rack=\"%s\"} %d\n",
                (unsigned long long)s->member[i].info.id, s->member[i].info.rack,
                s->member[i].alive);
    mprintf(&b, "# TYPE strata_cluster_layers_resident gauge\n");
    for (uint32_t i = 0; i < s->n_members; i++)
        for (uint32_t k = 0; k < s->n_models; k++)
            if (s->member[i].hold[k].engine || s->member[i].hold[k].host)
                mprintf(&b,
                        "strata_cluster_layers_resident{node=\"%llu\",model=\"%s\",engine=\"%d\","
                        "host=\"%d\"} %u\n",
                        (unsigned long long)s->member[i].info.id, s->model[k],
                        s->member[i].hold[k].engine, s->member[i].hold[k].host,
                        s->member[i].hold[k].layers_resident);
    mprintf(&b, "# TYPE strata_cluster_queue gauge\n");
    for (int k = 0; k < c->n_rep; k++)
        mprintf(&b, "strata_cluster_queue{node=\"%llu\"} %d\n", (unsigned long long)c->rep[k].id,
                c->rep[k].load.queue_len);
    pthread_mutex_unlock(&c->mu);
    *len = b.len;
    return b.p;
}
