#include "cluster/cluster_cmd.h"

#include "os/common/errmsg.h"
#include "transport/wire.h"

#include <math.h>
#include <string.h>

/* ---------------------------------------------------------------- strings */

void cluster_cmd_put_str(struct wire_w *w, const char *s)
{
    size_t n = strnlen(s, CL_STR_LEN);
    wire_put_u8(w, (uint8_t)n);
    wire_put_bytes(w, s, n);
}

/* Printable ASCII, at most CL_STR_LEN bytes. Returns -1 (and marks r bad) otherwise. */
int cluster_cmd_get_str(struct wire_r *r, char out[CL_STR_LEN + 1])
{
    uint8_t n = wire_get_u8(r);
    const uint8_t *p = r->bad ? NULL : wire_get_bytes(r, n);
    out[0] = 0;
    if (!p || n > CL_STR_LEN) {
        r->bad = 1;
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        if (p[i] < 0x20 || p[i] > 0x7e) {
            r->bad = 1;
            return -1;
        }
    memcpy(out, p, n);
    out[n] = 0;
    return 0;
}

void cluster_cmd_printable(char out[CL_STR_LEN + 1], const char *s)
{
    size_t n = strnlen(s, CL_STR_LEN);
    for (size_t i = 0; i < n; i++) out[i] = s[i] >= 0x20 && s[i] <= 0x7e ? s[i] : '?';
    out[n] = 0;
}

static int finite_f(float f)
{
    return isfinite(f);
}

int cluster_cmd_rack_ok(const char *s)
{
    size_t n = strnlen(s, CL_STR_LEN + 1);
    if (n > CL_STR_LEN) return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
              (s[i] >= '0' && s[i] <= '9') || s[i] == '.' || s[i] == '-' || s[i] == '_'))
            return 0;
    return 1;
}

/* ---------------------------------------------------------------- the framing of both */

/* A log command and a control message start alike (version, type; a command then its time) and
 * end alike (every byte read, none left over); `what` names which in the messages. */
static void put_head(struct wire_w *w, uint8_t type)
{
    wire_put_u8(w, CL_CMD_VERSION);
    wire_put_u8(w, type);
}

/* After the header's fields were read (ver: its version). */
static int check_head(const struct wire_r *r, uint8_t ver, const char *what, size_t len, char *err)
{
    if (r->bad) return errmsg_set(err, "%s: %zu bytes, shorter than its header", what, len);
    if (ver != CL_CMD_VERSION)
        return errmsg_set(err, "%s: version %u, expected %u", what, ver, CL_CMD_VERSION);
    return 0;
}

static int check_tail(const struct wire_r *r, unsigned type, const char *what, size_t len,
                      char *err)
{
    if (r->bad) return errmsg_set(err, "%s type %u: truncated", what, type);
    if (r->off != len)
        return errmsg_set(err, "%s type %u: %zu trailing bytes", what, type, len - r->off);
    return 0;
}

/* ---------------------------------------------------------------- log commands */

void cluster_cmd_put_node_up(struct wire_w *w, const struct cl_node_up *u)
{
    wire_put_u64(w, u->id);
    cluster_cmd_put_str(w, u->addr);
    cluster_cmd_put_str(w, u->http);
    cluster_cmd_put_str(w, u->fabric);
    cluster_cmd_put_str(w, u->gpu);
    cluster_cmd_put_str(w, u->rack);
    wire_put_u8(w, u->role);
    wire_put_f32(w, u->tok_s);
}

int cluster_cmd_get_node_up(struct wire_r *r, struct cl_node_up *u, char *err)
{
    u->id = wire_get_u64(r);
    cluster_cmd_get_str(r, u->addr);
    cluster_cmd_get_str(r, u->http);
    cluster_cmd_get_str(r, u->fabric);
    cluster_cmd_get_str(r, u->gpu);
    cluster_cmd_get_str(r, u->rack);
    u->role = wire_get_u8(r);
    u->tok_s = wire_get_f32(r);
    if (r->bad) return errmsg_set(err, "node: truncated or bad string");
    if (!u->id) return errmsg_set(err, "node: id 0");
    if (!cluster_cmd_rack_ok(u->rack))
        return errmsg_set(err, "node %llu: rack \"%s\" is not letters, digits, '.', '-', '_'",
                          (unsigned long long)u->id, u->rack);
    if (u->role != ROLE_VOTER && u->role != ROLE_JOINER)
        return errmsg_set(err, "node %llu: unknown role %u", (unsigned long long)u->id, u->role);
    if (!finite_f(u->tok_s) || u->tok_s < 0)
        return errmsg_set(err, "node %llu: tokens/s not a finite value >= 0",
                          (unsigned long long)u->id);
    return 0;
}

static void put_holding(struct wire_w *w, const struct cl_holding *h)
{
    wire_put_u64(w, h->node);
    cluster_cmd_put_str(w, h->model);
    wire_put_u8(w, h->host);
    wire_put_u8(w, h->engine);
    wire_put_u16(w, h->layers_resident);
    wire_put_u16(w, h->n_layers);
}

static int get_holding(struct wire_r *r, struct cl_holding *h, char *err)
{
    h->node = wire_get_u64(r);
    cluster_cmd_get_str(r, h->model);
    h->host = wire_get_u8(r);
    h->engine = wire_get_u8(r);
    h->layers_resident = wire_get_u16(r);
    h->n_layers = wire_get_u16(r);
    if (r->bad) return errmsg_set(err, "holding: truncated or bad string");
    if (!h->node || !h->model[0]) return errmsg_set(err, "holding: node 0 or empty model name");
    if (h->host > 1 || h->engine > 1) return errmsg_set(err, "holding %s: flags not 0/1", h->model);
    if (h->layers_resident > h->n_layers)
        return errmsg_set(err, "holding %s: %u layers resident of %u", h->model, h->layers_resident,
                          h->n_layers);
    return 0;
}

size_t cluster_cmd_encode(uint8_t *out, size_t cap, const struct cl_cmd *c)
{
    struct wire_w w = {out, cap, 0, 0};
    put_head(&w, c->type);
    wire_put_u64(&w, c->t_ms);
    switch (c->type) {
    case CMD_NODE_UP:
        cluster_cmd_put_node_up(&w, &c->u.up);
        break;
    case CMD_NODE_DOWN:
        wire_put_u64(&w, c->u.down);
        break;
    case CMD_HOLDING:
        put_holding(&w, &c->u.hold);
        break;
    case CMD_SCALE: {
        const struct cl_scale *s = &c->u.scale;
        wire_put_u8(&w, s->kind);
        cluster_cmd_put_str(&w, s->model);
        wire_put_u64(&w, s->source);
        wire_put_u64(&w, s->node);
        wire_put_u8(&w, s->n_chain);
        for (int i = 0; i < s->n_chain && i < CL_MAX_CHAIN; i++) wire_put_u64(&w, s->chain[i]);
        cluster_cmd_put_str(&w, s->reason);
        break;
    }
    case CMD_SCALE_DONE:
        wire_put_u32(&w, c->u.done.scale_id);
        wire_put_u8(&w, c->u.done.ok);
        wire_put_u64(&w, c->u.done.node);
        cluster_cmd_put_str(&w, c->u.done.reason);
        break;
    case CMD_RAFT_CONF:
        wire_put_u64(&w, c->u.conf.node);
        wire_put_u8(&w, c->u.conf.change);
        break;
    case CMD_MODEL:
        cluster_cmd_put_str(&w, c->u.model.name);
        wire_put_u8(&w, c->u.model.lost);
        wire_put_u16(&w, c->u.model.first);
        wire_put_u16(&w, c->u.model.n_layers);
        wire_put_u64(&w, c->u.model.node);
        break;
    default:
        return 0;
    }
    return w.bad ? 0 : w.off;
}

int cluster_cmd_decode(struct cl_cmd *c, const uint8_t *buf, size_t len, char *err)
{
    struct wire_r r = {buf, len, 0, 0};
    memset(c, 0, sizeof *c);
    uint8_t ver = wire_get_u8(&r);
    c->type = wire_get_u8(&r);
    c->t_ms = wire_get_u64(&r);
    if (check_head(&r, ver, "cluster command", len, err)) return -1;
    switch (c->type) {
    case CMD_NODE_UP:
        if (cluster_cmd_get_node_up(&r, &c->u.up, err)) return errmsg_prefix(err, "NODE_UP: ");
        break;
    case CMD_NODE_DOWN:
        c->u.down = wire_get_u64(&r);
        if (!r.bad && !c->u.down) return errmsg_set(err, "NODE_DOWN: node id 0");
        break;
    case CMD_HOLDING:
        if (get_holding(&r, &c->u.hold, err)) return errmsg_prefix(err, "HOLDING: ");
        break;
    case CMD_SCALE: {
        struct cl_scale *s = &c->u.scale;
        s->kind = wire_get_u8(&r);
        cluster_cmd_get_str(&r, s->model);
        s->source = wire_get_u64(&r);
        s->node = wire_get_u64(&r);
        s->n_chain = wire_get_u8(&r);
        if (r.bad) return errmsg_set(err, "SCALE: truncated");
        if (s->kind < SCALE_UP || s->kind > SCALE_DROP_HOST)
            return errmsg_set(err, "SCALE: unknown kind %u", s->kind);
        if (s->n_chain > CL_MAX_CHAIN)
            return errmsg_set(err, "SCALE: chain of %u nodes, at most %d", s->n_chain,
                              CL_MAX_CHAIN);
        for (int i = 0; i < s->n_chain; i++)
            if (!(s->chain[i] = wire_get_u64(&r)) && !r.bad)
                return errmsg_set(err, "SCALE: chain[%d] is node 0", i);
        cluster_cmd_get_str(&r, s->reason);
        if (!r.bad && (!s->model[0] || !s->node))
            return errmsg_set(err, "SCALE: empty model name or target node 0");
        break;
    }
    case CMD_SCALE_DONE:
        c->u.done.scale_id = wire_get_u32(&r);
        c->u.done.ok = wire_get_u8(&r);
        c->u.done.node = wire_get_u64(&r);
        cluster_cmd_get_str(&r, c->u.done.reason);
        if (!r.bad && c->u.done.ok > 1) return errmsg_set(err, "SCALE_DONE: ok not 0/1");
        if (!r.bad && c->u.done.ok && (c->u.done.node || c->u.done.reason[0]))
            return errmsg_set(err, "SCALE_DONE: a finished scale-out names a refusing node or a "
                                   "reason");
        break;
    case CMD_RAFT_CONF:
        c->u.conf.node = wire_get_u64(&r);
        c->u.conf.change = wire_get_u8(&r);
        if (!r.bad && !c->u.conf.node) return errmsg_set(err, "RAFT_CONF: node id 0");
        if (!r.bad && (c->u.conf.change < CONF_REMOVED || c->u.conf.change > CONF_RECOVERED))
            return errmsg_set(err, "RAFT_CONF: unknown change %u", c->u.conf.change);
        break;
    case CMD_MODEL:
        cluster_cmd_get_str(&r, c->u.model.name);
        c->u.model.lost = wire_get_u8(&r);
        c->u.model.first = wire_get_u16(&r);
        c->u.model.n_layers = wire_get_u16(&r);
        c->u.model.node = wire_get_u64(&r);
        if (!r.bad &&
            (!c->u.model.name[0] || c->u.model.lost > 1 || !c->u.model.n_layers ||
             (c->u.model.lost && (c->u.model.first >= c->u.model.n_layers || c->u.model.node)) ||
             (!c->u.model.lost && (c->u.model.first || !c->u.model.node))))
            return errmsg_set(
                err, "MODEL: inconsistent fields (%s, lost %u, layers [%u, %u), node %llu)",
                c->u.model.name, c->u.model.lost, c->u.model.first, c->u.model.n_layers,
                (unsigned long long)c->u.model.node);
        break;
    default:
        return errmsg_set(err, "cluster command: unknown type %u", c->type);
    }
    return check_tail(&r, c->type, "cluster command", len, err);
}

/* ---------------------------------------------------------------- control messages */

static void put_load(struct wire_w *w, const struct cl_load *l)
{
    wire_put_u32(w, (uint32_t)l->queue_len);
    wire_put_u32(w, (uint32_t)l->running);
    wire_put_u64(w, (uint64_t)l->queued_tokens);
    const float f[] = {l->kv_used, l->idle_ms, l->ttft_pred_ms, l->tok_s,
                       l->step_a,  l->step_b,  l->step_c,       l->step_corr};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) wire_put_f32(w, f[i]);
    wire_put_f32(w, l->step_err);
    wire_put_u32(w, l->step_steps);
    wire_put_u8(w, l->step_cal);
    wire_put_u64(w, l->step_id);
    wire_put_f32(w, l->link_Bps);
    wire_put_u64(w, l->link_peer);
    wire_put_u64(w, l->model_bytes);
    wire_put_u64(w, l->prompt_in);
    wire_put_u32(w, (uint32_t)l->helping);
}

static int get_load(struct wire_r *r, struct cl_load *l, char *err)
{
    l->queue_len = (int32_t)wire_get_u32(r);
    l->running = (int32_t)wire_get_u32(r);
    l->queued_tokens = (int64_t)wire_get_u64(r);
    float *f[] = {&l->kv_used, &l->idle_ms, &l->ttft_pred_ms, &l->tok_s,
                  &l->step_a,  &l->step_b,  &l->step_c,       &l->step_corr};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) *f[i] = wire_get_f32(r);
    l->step_err = wire_get_f32(r);
    l->step_steps = wire_get_u32(r);
    l->step_cal = wire_get_u8(r);
    l->step_id = wire_get_u64(r);
    l->link_Bps = wire_get_f32(r);
    l->link_peer = wire_get_u64(r);
    l->model_bytes = wire_get_u64(r);
    l->prompt_in = wire_get_u64(r);
    l->helping = (int32_t)wire_get_u32(r);
    if (r->bad) return errmsg_set(err, "load: truncated");
    if (l->queue_len < 0 || l->running < 0 || l->queued_tokens < 0 || l->helping < 0)
        return errmsg_set(err, "load: negative queue, running, queued tokens or helped sequences");
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (!finite_f(*f[i])) return errmsg_set(err, "load: field %zu not finite", i);
    if (l->kv_used < 0 || l->kv_used > 1) return errmsg_set(err, "load: KV use outside [0, 1]");
    if (!finite_f(l->step_err) || l->step_err < 0 || !finite_f(l->link_Bps) || l->link_Bps < 0)
        return errmsg_set(err, "load: step model error or link rate negative or not finite");
    if (l->step_cal > 1) return errmsg_set(err, "load: calibrated flag %u", l->step_cal);
    return 0;
}

size_t cluster_cmd_msg_encode(uint8_t *out, size_t cap, const struct cl_msg *m)
{
    struct wire_w w = {out, cap, 0, 0};
    put_head(&w, m->type);
    switch (m->type) {
    case MSGC_OPEN:
        wire_put_u8(&w, m->u.open.channel);
        wire_put_u64(&w, m->u.open.id);
        cluster_cmd_put_str(&w, m->u.open.addr);
        break;
    case MSGC_LOAD:
        cluster_cmd_put_node_up(&w, &m->u.load.node);
        put_load(&w, &m->u.load.load);
        wire_put_u32(&w, m->u.load.seen_scales);
        wire_put_u8(&w, m->u.load.n_hold);
        for (int i = 0; i < m->u.load.n_hold && i < CL_MAX_HOLD; i++)
            put_holding(&w, &m->u.load.hold[i]);
        wire_put_u32(&w, (uint32_t)m->u.load.load.held);
        wire_put_u64(&w, (uint64_t)m->u.load.load.held_tokens);
        cluster_cmd_put_str(&w, m->u.load.load.held_model);
        wire_put_u8(&w, m->u.load.n_refused);
        for (int i = 0; i < m->u.load.n_refused && i < CL_MAX_REFUSED; i++) {
            wire_put_u32(&w, m->u.load.refused[i].scale_id);
            cluster_cmd_put_str(&w, m->u.load.refused[i].reason);
        }
        break;
    case MSGC_JOIN:
        wire_put_u64(&w, m->u.join.id);
        cluster_cmd_put_str(&w, m->u.join.addr);
        break;
    case MSGC_REDIRECT:
        wire_put_u8(&w, m->u.redirect.status);
        cluster_cmd_put_str(&w, m->u.redirect.addr);
        break;
    case MSGC_STATE_REQ:
        break;
    case MSGC_LOADS:
        wire_put_u8(&w, m->u.loads.n);
        for (int i = 0; i < m->u.loads.n && i < CL_MAX_LOADS; i++) {
            wire_put_u64(&w, m->u.loads.id[i]);
            wire_put_u32(&w, m->u.loads.age_ms[i]);
            put_load(&w, &m->u.loads.load[i]);
        }
        break;
    case MSGC_STATE:
        wire_put_u32(&w, m->u.state.len);
        wire_put_bytes(&w, m->u.state.p, m->u.state.len);
        break;
    default:
        return 0;
    }
    return w.bad ? 0 : w.off;
}

int cluster_cmd_msg_decode(struct cl_msg *m, const uint8_t *buf, size_t len, char *err)
{
    struct wire_r r = {buf, len, 0, 0};
    memset(m, 0, sizeof *m);
    uint8_t ver = wire_get_u8(&r);
    m->type = wire_get_u8(&r);
    if (check_head(&r, ver, "control message", len, err)) return -1;
    switch (m->type) {
    case MSGC_OPEN:
        m->u.open.channel = wire_get_u8(&r);
        m->u.open.id = wire_get_u64(&r);
        cluster_cmd_get_str(&r, m->u.open.addr);
        if (!r.bad && m->u.open.channel != CHAN_RAFT && m->u.open.channel != CHAN_CTL &&
            m->u.open.channel != CHAN_FWD)
            return errmsg_set(err, "OPEN: unknown channel %u", m->u.open.channel);
        if (!r.bad && !m->u.open.id) return errmsg_set(err, "OPEN: node id 0");
        break;
    case MSGC_LOAD:
        if (cluster_cmd_get_node_up(&r, &m->u.load.node, err)) return errmsg_prefix(err, "LOAD: ");
        if (get_load(&r, &m->u.load.load, err)) return errmsg_prefix(err, "LOAD: ");
        m->u.load.seen_scales = wire_get_u32(&r);
        m->u.load.n_hold = wire_get_u8(&r);
        if (!r.bad && m->u.load.n_hold > CL_MAX_HOLD)
            return errmsg_set(err, "LOAD: %u holdings, at most %d", m->u.load.n_hold, CL_MAX_HOLD);
        for (int i = 0; i < m->u.load.n_hold && !r.bad; i++) {
            if (get_holding(&r, &m->u.load.hold[i], err)) return errmsg_prefix(err, "LOAD: ");
            if (m->u.load.hold[i].node != m->u.load.node.id)
                return errmsg_set(err, "LOAD: node %llu reports a holding of node %llu",
                                  (unsigned long long)m->u.load.node.id,
                                  (unsigned long long)m->u.load.hold[i].node);
        }
        m->u.load.load.held = (int32_t)wire_get_u32(&r);
        m->u.load.load.held_tokens = (int64_t)wire_get_u64(&r);
        cluster_cmd_get_str(&r, m->u.load.load.held_model);
        if (!r.bad && (m->u.load.load.held < 0 || m->u.load.load.held_tokens < 0))
            return errmsg_set(err, "LOAD: negative held requests or tokens");
        m->u.load.n_refused = wire_get_u8(&r);
        if (!r.bad && m->u.load.n_refused > CL_MAX_REFUSED)
            return errmsg_set(err, "LOAD: %u refusals, at most %d", m->u.load.n_refused,
                              CL_MAX_REFUSED);
        for (int i = 0; i < m->u.load.n_refused && !r.bad; i++) {
            m->u.load.refused[i].scale_id = wire_get_u32(&r);
            cluster_cmd_get_str(&r, m->u.load.refused[i].reason);
            if (!r.bad && !m->u.load.refused[i].reason[0])
                return errmsg_set(err, "LOAD: refusal of decision %u without a reason",
                                  m->u.load.refused[i].scale_id);
        }
        break;
    case MSGC_JOIN:
        m->u.join.id = wire_get_u64(&r);
        cluster_cmd_get_str(&r, m->u.join.addr);
        if (!r.bad && (!m->u.join.id || !m->u.join.addr[0]))
            return errmsg_set(err, "JOIN: node id 0 or empty address");
        break;
    case MSGC_REDIRECT:
        m->u.redirect.status = wire_get_u8(&r);
        cluster_cmd_get_str(&r, m->u.redirect.addr);
        if (!r.bad && m->u.redirect.status > 2)
            return errmsg_set(err, "REDIRECT: unknown status %u", m->u.redirect.status);
        break;
    case MSGC_STATE_REQ:
        break;
    case MSGC_LOADS:
        m->u.loads.n = wire_get_u8(&r);
        if (!r.bad && m->u.loads.n > CL_MAX_LOADS)
            return errmsg_set(err, "LOADS: %u loads, at most %d", m->u.loads.n, CL_MAX_LOADS);
        for (int i = 0; i < m->u.loads.n && !r.bad; i++) {
            m->u.loads.id[i] = wire_get_u64(&r);
            m->u.loads.age_ms[i] = wire_get_u32(&r);
            if (get_load(&r, &m->u.loads.load[i], err)) return errmsg_prefix(err, "LOADS: ");
            if (!m->u.loads.id[i]) return errmsg_set(err, "LOADS: node id 0");
        }
        break;
    case MSGC_STATE:
        m->u.state.len = wire_get_u32(&r);
        m->u.state.p = r.bad ? NULL : wire_get_bytes(&r, m->u.state.len);
        break;
    default:
        return errmsg_set(err, "control message: unknown type %u", m->type);
    }
    return check_tail(&r, m->type, "control message", len, err);
}
