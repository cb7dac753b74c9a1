#include "cluster/cluster_state.h"

#include "os/common/errmsg.h"
#include "transport/wire.h"

#include <stdio.h>
#include <string.h>

#define CL_SNAP_MAGIC 0x50414e53u /* "SNAP" */

void cluster_state_init(struct cl_state *s)
{
    memset(s, 0, sizeof *s);
}

struct cl_member *cluster_state_member(struct cl_state *s, uint64_t id)
{
    for (uint32_t i = 0; i < s->n_members; i++)
        if (s->member[i].info.id == id) return &s->member[i];
    return NULL;
}

const struct cl_member *cluster_state_member_c(const struct cl_state *s, uint64_t id)
{
    return cluster_state_member((struct cl_state *)s, id);
}

int cluster_state_model(const struct cl_state *s, const char *name)
{
    for (uint32_t i = 0; i < s->n_models; i++)
        if (!strcmp(s->model[i], name)) return (int)i;
    return -1;
}

int cluster_state_missing(const struct cl_state *s, int mi, uint16_t *first, uint16_t *n_layers,
                          uint64_t *holder)
{
    uint16_t best = 0, L = 0;
    *holder = 0;
    for (uint32_t i = 0; i < s->n_members; i++) {
        const struct cl_hold *h = &s->member[i].hold[mi];
        if (h->n_layers > L) L = h->n_layers;
        if (!s->member[i].alive) continue;
        int whole = h->host || (h->engine && h->n_layers && h->layers_resident == h->n_layers);
        if (whole && !*holder) *holder = s->member[i].info.id;
        if (h->layers_resident > best) best = h->layers_resident;
    }
    *first = best < L ? best : 0;
    *n_layers = L;
    return !*holder && L > 0;
}

static int model_add(struct cl_state *s, const char *name)
{
    int m = cluster_state_model(s, name);
    if (m >= 0 || s->n_models == CL_MAX_MODELS) return m;
    snprintf(s->model[s->n_models], sizeof s->model[0], "%s", name);
    return (int)s->n_models++;
}

static void event_add(struct cl_state *s, const struct cl_cmd *c, uint8_t kind, uint64_t node,
                      uint64_t source, const char *model, const char *reason)
{
    struct cl_event *e = &s->event[s->n_events % CL_MAX_EVENTS];
    *e = (struct cl_event){.t_ms = c->t_ms,
                           .seq = s->n_events,
                           .type = c->type,
                           .kind = kind,
                           .node = node,
                           .source = source};
    snprintf(e->model, sizeof e->model, "%s", model ? model : "");
    snprintf(e->reason, sizeof e->reason, "%s", reason ? reason : "");
    s->n_events++;
}

/* A decision changes what its targets should hold at once, so the next planner call sees it
 * (joiners join with k = 0; a scaled-down engine is gone); their reports confirm or correct it. */
static void set_desired(struct cl_state *s, const struct cl_scale *sc)
{
    int mi = cluster_state_model(s, sc->model);
    uint16_t L = 0;
    for (uint32_t i = 0; i < s->n_members; i++)
        if (s->member[i].hold[mi].n_layers) L = s->member[i].hold[mi].n_layers;
    struct cl_member *m = cluster_state_member(s, sc->node);
    switch (sc->kind) {
    case SCALE_UP:
        for (int k = 0; k < sc->n_chain; k++) {
            struct cl_member *j = cluster_state_member(s, sc->chain[k]);
            if (j && !j->hold[mi].engine) j->hold[mi] = (struct cl_hold){j->hold[mi].host, 1, 0, L};
        }
        break;
    case SCALE_DOWN:
        if (m) m->hold[mi].engine = 0, m->hold[mi].layers_resident = 0;
        break;
    case SCALE_DROP_HOST:
        if (m) m->hold[mi].host = 0;
        break;
    }
}

static int apply(struct cl_state *s, const struct cl_cmd *c)
{
    switch (c->type) {
    case CMD_NODE_UP: {
        struct cl_member *m = cluster_state_member(s, c->u.up.id);
        if (!m) {
            if (s->n_members == CL_MAX_NODES) return 1;
            m = &s->member[s->n_members++];
            memset(m, 0, sizeof *m);
        }
        int was_alive = m->alive;
        m->info = c->u.up;
        m->alive = 1;
        if (!was_alive) {
            m->since_ms = c->t_ms;
            event_add(s, c, 0, c->u.up.id, 0, NULL, NULL);
        }
        return 0;
    }
    case CMD_NODE_DOWN: {
        struct cl_member *m = cluster_state_member(s, c->u.down);
        if (!m || !m->alive) return 1;
        m->alive = 0;
        m->downs++;
        if (c->t_ms > m->since_ms) m->up_ms += c->t_ms - m->since_ms;
        m->since_ms = c->t_ms;
        event_add(s, c, 0, c->u.down, 0, NULL, NULL);
        return 0;
    }
    case CMD_HOLDING: {
        struct cl_member *m = cluster_state_member(s, c->u.hold.node);
        int mi = m ? model_add(s, c->u.hold.model) : -1;
        if (mi < 0) return 1;
        m->hold[mi] = (struct cl_hold){c->u.hold.host, c->u.hold.engine, c->u.hold.layers_resident,
                                       c->u.hold.n_layers};
        return 0;
    }
    case CMD_SCALE: {
        const struct cl_scale *sc = &c->u.scale;
        if (model_add(s, sc->model) < 0) return 1;
        uint32_t id = s->n_scales++;
        set_desired(s, sc);
        if ((sc->kind == SCALE_UP || sc->kind == SCALE_REPLICATE) &&
            s->n_scaleouts < CL_MAX_SCALEOUTS)
            s->scaleout[s->n_scaleouts++] =
                (struct cl_scaleout){.scale_id = id, .s = *sc, .started_ms = c->t_ms};
        event_add(s, c, sc->kind, sc->node, sc->source, sc->model, sc->reason);
        return 0;
    }
    case CMD_SCALE_DONE:
        for (uint32_t i = 0; i < s->n_scaleouts; i++) {
            if (s->scaleout[i].scale_id != c->u.done.scale_id) continue;
            struct cl_scaleout so = s->scaleout[i];
            s->scaleout[i] = s->scaleout[--s->n_scaleouts];
            /* Abandoned because a node refused (or failed) it: the event names that node. */
            event_add(s, c, c->u.done.ok, c->u.done.node ? c->u.done.node : so.s.node, so.s.source,
                      so.s.model, c->u.done.reason);
            return 0;
        }
        return 1;
    case CMD_RAFT_CONF:
        /* Raft's configuration is raft's; the state keeps the event so /v1/cluster shows when
         * and why a node stopped (or started again) counting for the quorum. */
        event_add(s, c, c->u.conf.change, c->u.conf.node, 0, NULL, NULL);
        return 0;
    case CMD_MODEL: {
        int mi = model_add(s, c->u.model.name);
        if (mi < 0) return 1;
        const struct cl_model_cmd *m = &c->u.model;
        s->lost[mi] = (struct cl_lost){m->lost, m->first, m->n_layers, c->t_ms};
        char why[CL_STR_LEN + 1];
        if (m->lost)
            snprintf(why, sizeof why, "layers [%u, %u) of %u held by no live node", m->first,
                     m->n_layers, m->n_layers);
        else
            snprintf(why, sizeof why, "all %u layers on node %llu", m->n_layers,
                     (unsigned long long)m->node);
        event_add(s, c, m->lost, m->node, 0, m->name, why);
        return 0;
    }
    }
    return 1;
}

int cluster_state_apply(struct cl_state *s, const struct cl_cmd *c)
{
    int rc = apply(s, c);
    s->applied++;
    if (rc) s->rejected++;
    return rc;
}

/* ---------------------------------------------------------------- snapshot */

static void put_scale(struct wire_w *w, const struct cl_scale *sc)
{
    wire_put_u8(w, sc->kind);
    cluster_cmd_put_str(w, sc->model);
    wire_put_u64(w, sc->source);
    wire_put_u64(w, sc->node);
    wire_put_u8(w, sc->n_chain);
    for (int i = 0; i < sc->n_chain; i++) wire_put_u64(w, sc->chain[i]);
    cluster_cmd_put_str(w, sc->reason);
}

static int get_scale(struct wire_r *r, struct cl_scale *sc)
{
    sc->kind = wire_get_u8(r);
    cluster_cmd_get_str(r, sc->model);
    sc->source = wire_get_u64(r);
    sc->node = wire_get_u64(r);
    sc->n_chain = wire_get_u8(r);
    if (r->bad || sc->n_chain > CL_MAX_CHAIN) return -1;
    for (int i = 0; i < sc->n_chain; i++) sc->chain[i] = wire_get_u64(r);
    cluster_cmd_get_str(r, sc->reason);
    return r->bad ? -1 : 0;
}

size_t cluster_state_encoded_max(void)
{
    /* Every string at its longest, every table full. */
    size_t up = 8 + 5 * (1 + CL_STR_LEN) + 1 + 4; /* addr, http, fabric, gpu, rack */
    size_t member = up + 1 + 8 + 4 + 8 + CL_MAX_MODELS * 6;
    size_t scale = 1 + 1 + CL_STR_LEN + 8 + 8 + 1 + 8 * CL_MAX_CHAIN + 1 + CL_STR_LEN;
    return 4 + 6 * 4 + 2 * 8 + CL_MAX_NODES * member + CL_MAX_MODELS * (1 + CL_STR_LEN + 13) +
           CL_MAX_SCALEOUTS * (4 + scale + 8) +
           CL_MAX_EVENTS * (8 + 4 + 2 + 16 + 2 * (1 + CL_STR_LEN));
}

size_t cluster_state_encode(const struct cl_state *s, uint8_t *out, size_t cap)
{
    struct wire_w w = {out, cap, 0, 0};
    uint32_t n_ev = s->n_events < CL_MAX_EVENTS ? s->n_events : CL_MAX_EVENTS;
    wire_put_u32(&w, CL_SNAP_MAGIC);
    wire_put_u32(&w, s->n_members);
    wire_put_u32(&w, s->n_models);
    wire_put_u32(&w, s->n_scaleouts);
    wire_put_u32(&w, s->n_events);
    wire_put_u32(&w, s->n_scales);
    wire_put_u32(&w, CL_CMD_VERSION); /* the members' encoding (cluster_cmd_put_node_up) */
    wire_put_u64(&w, s->applied);
    wire_put_u64(&w, s->rejected);
    for (uint32_t i = 0; i < s->n_members; i++) {
        const struct cl_member *m = &s->member[i];
        cluster_cmd_put_node_up(&w, &m->info);
        wire_put_u8(&w, m->alive);
        wire_put_u64(&w, m->since_ms);
        wire_put_u32(&w, m->downs);
        wire_put_u64(&w, m->up_ms);
        for (int k = 0; k < CL_MAX_MODELS; k++) {
            wire_put_u8(&w, m->hold[k].host);
            wire_put_u8(&w, m->hold[k].engine);
            wire_put_u16(&w, m->hold[k].layers_resident);
            wire_put_u16(&w, m->hold[k].n_layers);
        }
    }
    for (uint32_t i = 0; i < s->n_models; i++) {
        cluster_cmd_put_str(&w, s->model[i]);
        wire_put_u8(&w, s->lost[i].lost);
        wire_put_u16(&w, s->lost[i].first);
        wire_put_u16(&w, s->lost[i].n_layers);
        wire_put_u64(&w, s->lost[i].since_ms);
    }
    for (uint32_t i = 0; i < s->n_scaleouts; i++) {
        wire_put_u32(&w, s->scaleout[i].scale_id);
        put_scale(&w, &s->scaleout[i].s);
        wire_put_u64(&w, s->scaleout[i].started_ms);
    }
    for (uint32_t i = s->n_events - n_ev; i < s->n_events; i++) {
        const struct cl_event *e = &s->event[i % CL_MAX_EVENTS];
        wire_put_u64(&w, e->t_ms);
        wire_put_u32(&w, e->seq);
        wire_put_u8(&w, e->type);
        wire_put_u8(&w, e->kind);
        wire_put_u64(&w, e->node);
        wire_put_u64(&w, e->source);
        cluster_cmd_put_str(&w, e->model);
        cluster_cmd_put_str(&w, e->reason);
    }
    return w.bad ? 0 : w.off;
}

int cluster_state_decode(struct cl_state *s, const uint8_t *buf, size_t len, char *err)
{
    struct wire_r r = {buf, len, 0, 0};
    cluster_state_init(s);
    uint32_t magic = wire_get_u32(&r);
    s->n_members = wire_get_u32(&r);
    s->n_models = wire_get_u32(&r);
    s->n_scaleouts = wire_get_u32(&r);
    s->n_events = wire_get_u32(&r);
    s->n_scales = wire_get_u32(&r);
    uint32_t version = wire_get_u32(&r);
    s->applied = wire_get_u64(&r);
    s->rejected = wire_get_u64(&r);
    if (r.bad) return errmsg_set(err, "cluster snapshot: %zu bytes, shorter than its header", len);
    if (magic != CL_SNAP_MAGIC) return errmsg_set(err, "cluster snapshot: bad magic");
    if (version != CL_CMD_VERSION) {
        cluster_state_init(s);
        return errmsg_set(err, "cluster snapshot: version %u, expected %u", version,
                          CL_CMD_VERSION);
    }
    if (s->n_members > CL_MAX_NODES || s->n_models > CL_MAX_MODELS ||
        s->n_scaleouts > CL_MAX_SCALEOUTS) {
        char e[ERRMSG_LEN];
        snprintf(e, sizeof e, "%u members, %u models, %u scale-outs", s->n_members, s->n_models,
                 s->n_scaleouts);
        cluster_state_init(s);
        return errmsg_set(err, "cluster snapshot: %s exceed the tables", e);
    }
    for (uint32_t i = 0; i < s->n_members && !r.bad; i++) {
        struct cl_member *m = &s->member[i];
        char why[ERRMSG_LEN];
        if (cluster_cmd_get_node_up(&r, &m->info, why)) r.bad = 1;
        m->alive = wire_get_u8(&r);
        m->since_ms = wire_get_u64(&r);
        m->downs = wire_get_u32(&r);
        m->up_ms = wire_get_u64(&r);
        for (int k = 0; k < CL_MAX_MODELS; k++) {
            m->hold[k].host = wire_get_u8(&r);
            m->hold[k].engine = wire_get_u8(&r);
            m->hold[k].layers_resident = wire_get_u16(&r);
            m->hold[k].n_layers = wire_get_u16(&r);
            if (m->hold[k].layers_resident > m->hold[k].n_layers) r.bad = 1;
        }
        if (!m->info.id || m->alive > 1) r.bad = 1;
    }
    for (uint32_t i = 0; i < s->n_models && !r.bad; i++) {
        cluster_cmd_get_str(&r, s->model[i]);
        s->lost[i].lost = wire_get_u8(&r);
        s->lost[i].first = wire_get_u16(&r);
        s->lost[i].n_layers = wire_get_u16(&r);
        s->lost[i].since_ms = wire_get_u64(&r);
        if (s->lost[i].lost > 1 || (s->lost[i].lost && s->lost[i].first >= s->lost[i].n_layers))
            r.bad = 1;
    }
    for (uint32_t i = 0; i < s->n_scaleouts && !r.bad; i++) {
        s->scaleout[i].scale_id = wire_get_u32(&r);
        if (get_scale(&r, &s->scaleout[i].s) || s->scaleout[i].s.kind < SCALE_UP ||
            s->scaleout[i].s.kind > SCALE_DROP_HOST)
            r.bad = 1;
        s->scaleout[i].started_ms = wire_get_u64(&r);
    }
    uint32_t n_ev = s->n_events < CL_MAX_EVENTS ? s->n_events : CL_MAX_EVENTS;
    for (uint32_t i = s->n_events - n_ev; i < s->n_events && !r.bad; i++) {
        struct cl_event *e = &s->event[i % CL_MAX_EVENTS];
        e->t_ms = wire_get_u64(&r);
        e->seq = wire_get_u32(&r);
        e->type = wire_get_u8(&r);
        e->kind = wire_get_u8(&r);
        e->node = wire_get_u64(&r);
        e->source = wire_get_u64(&r);
        cluster_cmd_get_str(&r, e->model);
        cluster_cmd_get_str(&r, e->reason);
        if (e->type < CMD_NODE_UP || e->type > CMD_MODEL || (e->type == CMD_MODEL && e->kind > 1) ||
            (e->type == CMD_SCALE && (e->kind < SCALE_UP || e->kind > SCALE_DROP_HOST)) ||
            (e->type == CMD_SCALE_DONE && e->kind > 1) ||
            (e->type == CMD_RAFT_CONF && (e->kind < CONF_REMOVED || e->kind > CONF_RECOVERED)))
            r.bad = 1;
    }
    if (r.bad || r.off != len) {
        int trailing = !r.bad;
        cluster_state_init(s);
        return trailing ? errmsg_set(err, "cluster snapshot: %zu trailing bytes", len - r.off)
                        : errmsg_set(err, "cluster snapshot: truncated or bad field");
    }
    return 0;
}
