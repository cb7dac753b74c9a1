/* sim_load: how the model gets onto an instance and off it. Scale-outs move the model layer by
 * layer (or in chunk_bytes pieces) over the policy's tier: a chain forwarding each chunk as it
 * lands, a binomial pipeline (λScale's multicast), or each joiner on its own from host memory,
 * SSD or remote storage. The controller's actions (sim_policy.h) are carried out here; so are
 * leaving instances (release, hand-over, standby), and failures. See sim.h. */
#include "cluster/sim/sim_int.h"
#include "cluster/sim/sim_net.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Bytes of layer k (a span of model_spans, or an equal share of the model). */
double sim_layer_bytes(const struct sim *s, int k)
{
    return s->c->n_spans ? s->c->span_bytes[k] : s->c->model.bytes / s->L;
}

/* Bytes of transfer chunk k: a layer, or a piece of at most chunk_bytes of one. */
static double chunk_bytes(const struct sim *s, int k)
{
    return s->piece_bytes ? s->piece_bytes[k] : sim_layer_bytes(s, k);
}

/* The first chunk of layer k: the chunks of layers [0, k) come before it. */
static int chunk_of_layer(const struct sim *s, int k)
{
    if (!s->piece_bytes) return k;
    int c = 0;
    for (int j = 0; j < k; j++) c += (int)ceil(sim_layer_bytes(s, j) / s->c->chunk_bytes);
    return c;
}

/* A standby's share of its instance's HBM: what it is charged per GPU-second. */
static double standby_share(const struct sim *s, int i)
{
    const struct inst *x = &s->in[i];
    double hbm = x->gpus * s->c->types[x->type].mem_GB * 1e9;
    double f = hbm > 0 ? (double)s->pn[i].layers_resident / s->L * s->c->model.bytes / hbm : 1;
    return f < 1 ? f : 1;
}

void sim_gpu_release(struct sim *s, int i)
{
    struct inst *x = &s->in[i];
    double usd = s->c->types[x->type].usd_hour / 3600;
    if (x->alloc_since >= 0) {
        double g = (s->now - x->alloc_since) * x->gpus;
        s->r->gpu_s += g;
        s->r->cost_usd += g * usd;
        if (x->proactive) {
            s->r->proactive_gpu_s += g;
            if (!x->served) s->r->fp_gpu_s += g; /* the forecast's burst never came here */
        }
    }
    if (x->standby_since >= 0) {
        double g = (s->now - x->standby_since) * x->gpus * standby_share(s, i);
        s->r->gpu_s += g;
        s->r->standby_gpu_s += g;
        s->r->cost_usd += g * usd;
    }
    x->alloc_since = x->standby_since = -1;
    x->proactive = x->served = 0;
}

static int pick_helper(struct sim *s, int i)
{
    int best = -1;
    for (int j = 0; j < s->n_inst; j++)
        if (j != i && sim_serving(s, j) && !s->in[j].leaving &&
            (best < 0 || s->pn[j].load.queued_tokens < s->pn[best].load.queued_tokens))
            best = j;
    return best;
}

static void joined(struct sim *s, int i)
{
    struct plan_node *n = &s->pn[i];
    n->layers_resident = s->L;
    n->helper = -1;
    if (s->p->cache_on_load) /* the server's host memory: every instance there sees it */
        for (int j = 0; j < s->n_inst; j++)
            if (s->in[j].server == s->in[i].server && s->pn[j].alive) s->pn[j].host_cached |= 1;
    double t = s->now - s->in[i].load_start;
    if (s->trace_actions)
        fprintf(stderr, "sim: %s: t=%.3f instance %d holds every layer (k = L)\n", s->p->name,
                s->now, i);
    s->so_sum += t;
    s->so_count++;
    if (t > s->r->so_max_s) s->r->so_max_s = t;
    s->in[i].so = -1;
    sim_kick(s, i);
    for (int j = 0; j < s->n_inst && s->p->live; j++) /* joiners without a helper get this one */
        if (s->pn[j].alive && s->pn[j].engine_model == 0 && !s->pn[j].standby &&
            s->pn[j].layers_resident < s->L &&
            (s->pn[j].helper < 0 || !sim_serving(s, s->pn[j].helper)))
            s->pn[j].helper = i;
    sim_reroute_held(s);
}

static void so_maybe_end(struct sim *s, struct scaleout *o)
{
    for (int j = 0; j < o->n; j++)
        if (!o->done[j]) return;
    o->active = 0;
    if (o->src_inst >= 0) s->pn[o->src_inst].sources_busy--;
    free(o->have);
    o->have = NULL;
}

static void member_chunks(struct sim *s, struct scaleout *o, int j, int chunks)
{
    int k = chunks == 0 ? 0 : s->layers_after ? s->layers_after[chunks - 1] : chunks;
    int i = o->members[j];
    if (o->kind == PLAN_SO_ENGINE) {
        int was = sim_usable(s, i), old = s->pn[i].layers_resident;
        if (k <= old) return; /* a standby's layers were there already */
        if (s->c->kv_recompute && s->p->live) {
            /* the KV of the layers that became local, recomputed from the saved inputs of every
             * running sequence (docs/cluster.md): a prefill of those layers, on its next step */
            struct inst *x = &s->in[i];
            long pos = 0;
            for (int r = 0; r < x->n_run; r++) {
                const struct sreq *q = &s->q[x->run[r]];
                pos += q->in - q->prefill_left + (q->gen > 0 ? q->gen - 1 : 0);
            }
            x->borrowed += x->sm.a * pos * (k - old) / s->L;
        }
        s->pn[i].layers_resident = k;
        if (k >= s->L) {
            o->done[j] = 1;
            joined(s, i);
        } else if (!was && sim_usable(s, i)) {
            sim_reroute_held(s);
        }
    } else if (k >= s->L) {
        o->done[j] = 1;
        s->pn[i].host_cached |= 1;
    }
}

/* ---- chains ---- */

static void chain_hop(struct sim *s, int so, int h);

static void on_chain_chunk(void *ctx)
{
    struct xfer_ctx t = *(struct xfer_ctx *)ctx;
    free(ctx);
    struct sim *s = sim_g;
    s->now = sim_net_now();
    struct scaleout *o = &s->so[t.so];
    o->hop_busy[t.member] = 0;
    if (!o->active || t.member >= o->n) return;
    o->got[t.member]++;
    o->hop_sent[t.member]++;
    member_chunks(s, o, t.member, o->got[t.member]);
    if (!o->active) return;
    chain_hop(s, t.so, t.member);
    if (t.member + 1 < o->n) chain_hop(s, t.so, t.member + 1);
    so_maybe_end(s, o);
}

static void chain_hop(struct sim *s, int so, int h)
{
    struct scaleout *o = &s->so[so];
    if (o->hop_busy[h] || o->hop_sent[h] >= o->C) return;
    if (h > 0 && o->got[h - 1] <= o->hop_sent[h]) return; /* sender lacks the chunk yet */
    int from = h == 0 ? o->src_host : sim_net_host_inst(o->members[h - 1]);
    struct xfer_ctx *t = malloc(sizeof *t);
    if (!t) abort();
    *t = (struct xfer_ctx){so, h, o->hop_sent[h]};
    o->hop_busy[h] = 1;
    sim_net_send(from, sim_net_host_inst(o->members[h]), chunk_bytes(s, o->hop_sent[h]),
                 on_chain_chunk, t);
}

/* ---- binomial pipeline ---- */

/* λScale's multicast: receivers 0..n-1 form a hypercube of dimension d = ceil(log2 n); in round
 * r the source sends chunk r to receiver 0, and every receiver x sends its newest chunk that
 * x ^ (1 << (r mod d)) lacks to that partner. Rounds are synchronous; with n = 2^d the whole
 * model reaches everyone in C + d rounds. */
static void binomial_round(struct sim *s, int so);

static void on_binomial_chunk(void *ctx)
{
    struct xfer_ctx t = *(struct xfer_ctx *)ctx;
    free(ctx);
    struct sim *s = sim_g;
    s->now = sim_net_now();
    struct scaleout *o = &s->so[t.so];
    if (--o->pending > 0 || !o->active) return;
    /* round over: deliver, then the next round */
    for (int k = 0; k < o->n + 1; k++) {
        if (o->snd_to[k] < 0) continue;
        int j = o->snd_to[k];
        if (j >= o->n) continue;
        o->have[j * o->C + o->snd_chunk[k]] = (unsigned char)(1 + (o->round & 0x7f));
        int pre = 0;
        while (pre < o->C && o->have[j * o->C + pre]) pre++;
        if (pre > o->got[j]) {
            o->got[j] = pre;
            if (!o->done[j] && s->pn[o->members[j]].alive) member_chunks(s, o, j, pre);
        }
    }
    o->round++;
    so_maybe_end(s, o);
    if (o->active) binomial_round(s, t.so);
}

static void binomial_round(struct sim *s, int so)
{
    struct scaleout *o = &s->so[so];
    int ns = 0;
again:
    for (int k = 0; k < o->n + 1; k++) o->snd_to[k] = -1;
    if (o->round < o->C) {
        o->snd_from[ns] = -1;
        o->snd_to[ns] = 0;
        o->snd_chunk[ns++] = o->round;
    }
    if (o->d > 0)
        for (int x = 0; x < o->n; x++) {
            int p = x ^ (1 << (o->round % o->d));
            if (p >= o->n) continue;
            int best = -1, best_age = -1;
            for (int ch = 0; ch < o->C; ch++) {
                int a = o->have[x * o->C + ch];
                if (!a || o->have[p * o->C + ch]) continue;
                if (a > best_age || (a == best_age && ch > best)) best = ch, best_age = a;
            }
            if (best < 0) continue;
            o->snd_from[ns] = x;
            o->snd_to[ns] = p;
            o->snd_chunk[ns++] = best;
        }
    if (ns == 0) {
        /* Nothing moves this round: in a group that is no power of two a receiver's partner may
         * be missing for a round; the next dimension's pairs may still move something. After a
         * whole cycle of d idle rounds the rest is unreachable (a receiver failed). */
        if (++o->idle_rounds <= o->d) {
            o->round++;
            goto again;
        }
        o->broken = 1;
        return;
    }
    o->idle_rounds = 0;
    o->pending = ns;
    for (int k = 0; k < ns; k++) {
        struct xfer_ctx *t = malloc(sizeof *t);
        if (!t) abort();
        *t = (struct xfer_ctx){so, o->snd_to[k], o->snd_chunk[k]};
        int from = o->snd_from[k] < 0 ? o->src_host : sim_net_host_inst(o->members[o->snd_from[k]]);
        sim_net_send(from, sim_net_host_inst(o->members[o->snd_to[k]]),
                     chunk_bytes(s, o->snd_chunk[k]), on_binomial_chunk, t);
    }
}

int sim_new_so(struct sim *s, int kind, int src_host, int src_inst, const int *members, int n,
               int mc, int first)
{
    s->so = sim_grow(s->so, &s->so_cap, s->n_so + 1, sizeof *s->so);
    int id = s->n_so++;
    struct scaleout *o = &s->so[id];
    memset(o, 0, sizeof *o);
    o->active = 1;
    o->kind = kind;
    o->src_host = src_host;
    o->src_inst = src_inst;
    o->n = n;
    o->C = s->n_chunks;
    o->mc = mc;
    o->first = first;
    o->started = s->now;
    for (int j = 0; j < n; j++) {
        o->members[j] = members[j];
        o->got[j] = o->hop_sent[j] = first; /* a chain member with `first` chunks sends on */
        if (kind == PLAN_SO_ENGINE) {
            s->in[members[j]].so = id;
            s->in[members[j]].member = j;
        }
    }
    if (src_inst >= 0) s->pn[src_inst].sources_busy++;
    if (src_inst >= 0 && kind == PLAN_SO_ENGINE && s->holder_fail_pending > 0) {
        s->holder_fail_pending--;
        sim_push(s, s->now + 0.5 * s->c->model.bytes / s->pn[src_inst].link_Bps, EV_KILL, src_inst,
                 0);
    }
    if (mc == SIM_MC_BINOMIAL && first == 0) {
        while ((1 << o->d) < n) o->d++;
        o->have = calloc((size_t)n * o->C, 1);
        if (!o->have) abort();
        binomial_round(s, id);
    } else {
        o->mc = SIM_MC_CHAIN;
        chain_hop(s, id, 0);
    }
    return id;
}

/* Every member loads on its own (one-member "chains" from a local or shared source). */
static void load_each(struct sim *s, const int *members, int n)
{
    for (int j = 0; j < n; j++) {
        int i = members[j], srv = s->in[i].server, src;
        switch (s->p->source) {
        case SIM_SRC_REMOTE:
            src = sim_net_host_remote();
            break;
        case SIM_SRC_HOST:
            src = (s->pn[i].host_cached & 1) ? sim_net_host_mem(srv) : sim_net_host_ssd(srv);
            break;
        case SIM_SRC_NET:
            src = sim_net_host_mem(srv);
            break; /* own host copy over PCIe */
        default:
            src = sim_net_host_ssd(srv);
            break;
        }
        sim_new_so(s, PLAN_SO_ENGINE, src, -1, &members[j], 1, SIM_MC_CHAIN, 0);
    }
}

/* ---- the controller's actions ---- */

static void scale_up(struct sim *s, const struct plan_action *a)
{
    int members[PLAN_MAX_CHAIN], n = 0, any_serving = 0, first = 0;
    for (int i = 0; i < s->n_inst; i++) any_serving |= sim_serving(s, i);
    if (!any_serving) s->r->cold_starts++;
    if (s->r->scaleouts++ == 0) s->r->first_scaleout_s = s->now;
    for (int j = 0; j < a->n_chain; j++) {
        int i = a->chain[j];
        if (i < 0 || i >= s->n_inst || !s->pn[i].alive || s->in[i].leaving) continue;
        struct plan_node *pn = &s->pn[i];
        int standby = pn->standby && pn->engine_model == 0;
        if (pn->engine_model >= 0 && !standby) continue;
        if (standby) { /* its first layers are here: the stream starts after them */
            if (a->n_chain != 1) continue;
            sim_gpu_release(s, i); /* ends the standby's charge */
            first = chunk_of_layer(s, pn->layers_resident);
            pn->standby = 0;
        } else {
            pn->engine_model = 0;
            pn->layers_resident = 0;
        }
        pn->helper = s->p->live ? pick_helper(s, i) : -1;
        s->in[i].alloc_since = s->now;
        s->in[i].load_start = s->now;
        s->in[i].proactive = a->reason == PLAN_WHY_FORECAST || a->reason == PLAN_WHY_KV ||
                             a->reason == PLAN_WHY_SLOTS;
        s->in[i].served = 0;
        pn->load.idle_since_ms = s->now * 1000; /* its keep-alive starts now */
        s->in[i].epoch++;
        s->in[i].busy = 0;
        members[n++] = i;
    }
    if (n == 0) return;
    if (s->p->source != SIM_SRC_NET || a->source == a->chain[0]) {
        load_each(s, members, n);
        return;
    }
    sim_new_so(s, PLAN_SO_ENGINE, sim_net_host_inst(a->source), a->source, members, n,
               s->p->multicast, first);
}

/* Instance i's allocation ends: nothing runs there any more. */
static void release(struct sim *s, int i)
{
    sim_gpu_release(s, i);
    s->pn[i].engine_model = -1;
    s->pn[i].layers_resident = 0;
    s->pn[i].helper = -1;
    s->pn[i].standby = 0;
    s->in[i].so = -1;
    s->in[i].epoch++; /* a step in flight is void */
    s->in[i].busy = 0;
}

void sim_leave(struct sim *s, int i, int to, int keep)
{
    struct plan_node *pn = &s->pn[i];
    struct inst *x = &s->in[i];
    if (!pn->alive || x->leaving) return;
    if (pn->standby) { /* a standby gives its layers back */
        release(s, i);
        return;
    }
    if (pn->engine_model != 0) return;
    if (to == i || (to >= 0 && (to >= s->n_inst || !sim_serving(s, to) || s->in[to].leaving)))
        to = -1;
    x->leave_to = to;
    x->leave_keep = keep > 0 && keep < s->L && pn->layers_resident >= keep ? keep : 0;
    x->leaving = 1; /* before the joiners it helped pick another helper: not itself */
    for (int j = 0; j < s->n_inst; j++)
        if (j != i && s->pn[j].helper == i) s->pn[j].helper = s->p->live ? pick_helper(s, j) : -1;
    /* Out of the planner's view at once (engine empty, no joiner of it while its GPU is held);
     * the GPU goes when its sequences have landed. */
    pn->engine_model = -1;
    pn->layers_resident = 0;
    pn->refused |= 1;
    if (x->busy)
        x->leave_pending = 1;
    else
        sim_evacuate(s, i, to, 1);
}

void sim_leave_done(struct sim *s, int i)
{
    struct inst *x = &s->in[i];
    int keep = x->leave_keep;
    if (s->trace_actions)
        fprintf(stderr, "sim: %s: t=%.3f instance %d left%s\n", s->p->name, s->now, i,
                keep ? " (a standby)" : "");
    x->leaving = x->leave_pending = 0;
    s->pn[i].refused &= ~(uint64_t)1;
    release(s, i);
    if (keep > 0 && s->pn[i].alive) { /* partial residency: layers [0, keep) stay */
        s->pn[i].engine_model = 0;
        s->pn[i].layers_resident = keep;
        s->pn[i].standby = 1;
        x->standby_since = s->now;
    }
    sim_update_load(s, i);
}

/* Joiners whose helper stopped serving (it left or died while none other served) get one now,
 * and run what they hold. */
void sim_fix_helpers(struct sim *s)
{
    if (!s->p->live) return;
    for (int j = 0; j < s->n_inst; j++) {
        struct plan_node *n = &s->pn[j];
        if (!n->alive || n->engine_model != 0 || n->standby || n->layers_resident >= s->L ||
            (n->helper >= 0 && sim_serving(s, n->helper) && !s->in[n->helper].leaving))
            continue;
        n->helper = pick_helper(s, j);
        if (n->helper >= 0) sim_kick(s, j);
    }
}

static void trace_action(const struct sim *s, const struct plan_action *a)
{
    static const char *kinds[] = {"scale-up", "scale-down", "replicate-host", "drop-host"};
    fprintf(stderr, "sim: %s: t=%.3f %s source %d node %d reason %d", s->p->name, s->now,
            kinds[a->kind], a->source, a->node, a->reason);
    if (a->kind == PLAN_SCALE_DOWN)
        fprintf(stderr, " handover %d keep %d", a->handover, a->keep_layers);
    fprintf(stderr, " chain");
    for (int j = 0; j < a->n_chain; j++) fprintf(stderr, " %d", a->chain[j]);
    fprintf(stderr, "\n");
}

int sim_do_actions(struct sim *s)
{
    struct plan_scaleout *pso = malloc(sizeof *pso * (s->n_so + 1));
    struct plan_action act[64];
    int n_pso;
    if (!pso) abort();
    s->pm.held = s->held_n;
    struct plan_view v = sim_view(s, pso, &n_pso);
    struct sim_obs o = sim_obs_of(s, &v);
    int n = s->p->ctl->tick(s->ctl_state, &o, act, 64, s->err);
    free(pso);
    s->arrived = 0;
    s->arrived_tokens = 0;
    if (n < 0) return -1;
    for (int k = 0; k < n; k++) {
        const struct plan_action *a = &act[k];
        if (s->trace_actions) trace_action(s, a);
        switch (a->kind) {
        case PLAN_SCALE_UP:
            scale_up(s, a);
            break;
        case PLAN_SCALE_DOWN:
            if (a->node >= 0 && a->node < s->n_inst)
                sim_leave(s, a->node, a->handover, a->keep_layers);
            break;
        case PLAN_DROP_HOST:
            if (a->node >= 0 && a->node < s->n_inst) s->pn[a->node].host_cached &= ~(uint64_t)1;
            break;
        case PLAN_REPLICATE_HOST:
            for (int j = 0; j < a->n_chain; j++) /* copies go one target after another */
                sim_new_so(s, PLAN_SO_HOST, sim_net_host_inst(a->source), a->source, &a->chain[j],
                           1, SIM_MC_CHAIN, 0);
            break;
        }
    }
    return 0;
}

/* A scale-out fixed by the config (struct sim_scaleout_spec), carried out like a planner's. */
void sim_fixed_scaleout(struct sim *s, const struct sim_scaleout_spec *f)
{
    int src = s->id_of[f->src];
    if (!sim_serving(s, src)) {
        s->failed = 1;
        errmsg_set(s->err, "scaleout at %g s: instance %d does not hold the model then", f->t,
                   f->src);
        return;
    }
    struct plan_action a = {.kind = PLAN_SCALE_UP, .source = src, .n_chain = f->n};
    for (int j = 0; j < f->n; j++) a.chain[j] = s->id_of[f->chain[j]];
    if (s->trace_actions)
        fprintf(stderr, "sim: %s: t=%.3f fixed scale-out from %d to %d joiner(s)\n", s->p->name,
                s->now, f->src, f->n);
    scale_up(s, &a);
}

/* ---- failures ---- */

static void requeue_all(struct sim *s, int i)
{
    struct inst *x = &s->in[i];
    int n = x->wait_n + x->n_run, *rs = malloc(sizeof *rs * (n + 1)), k = 0;
    if (!rs) abort();
    for (int j = 0; j < x->wait_n; j++) rs[k++] = x->wait[(x->wait_head + j) % x->wait_cap];
    for (int j = 0; j < x->n_run; j++) rs[k++] = x->run[j];
    x->wait_n = x->n_run = 0;
    x->wait_tokens = x->kv_used = 0;
    for (int j = 0; j < k; j++) {
        struct sreq *q = &s->q[rs[j]];
        q->prefill_left = q->in + q->gen; /* the KV died with the node: recompute */
        q->step_decode = q->step_prefill = 0;
        if (sim_route(s, rs[j])) s->failed = 1;
    }
    free(rs);
}

void sim_fail_inst(struct sim *s, int i)
{
    if (i < 0 || i >= s->n_inst || !s->pn[i].alive) return;
    if (s->trace_actions)
        fprintf(stderr, "sim: %s: t=%.3f instance %d fails\n", s->p->name, s->now, i);
    s->r->failures_injected++;
    s->pn[i].alive = 0;
    s->in[i].busy = 0;
    s->in[i].leaving = s->in[i].leave_pending = 0;
    sim_gpu_release(s, i);
    s->in[i].epoch++;
    s->pn[i].engine_model = -1;
    s->pn[i].standby = 0;
    s->pn[i].host_cached = 0;
    for (int k = 0; k < s->n_so; k++) {
        struct scaleout *o = &s->so[k];
        if (!o->active) continue;
        int cut = -1;
        if (o->src_inst == i) cut = 0;
        for (int j = 0; j < o->n && cut < 0; j++)
            if (o->members[j] == i) cut = o->mc == SIM_MC_BINOMIAL ? 0 : j;
        if (cut < 0) continue;
        /* downstream of the dead node the stream is gone: those joiners give their GPU back
         * and the planner plans again from the next view */
        s->r->scaleouts_broken++;
        for (int j = cut; j < o->n; j++) {
            int m = o->members[j];
            if (o->done[j] || m == i) continue;
            if (o->kind == PLAN_SO_ENGINE && s->pn[m].alive) {
                requeue_all(s, m);
                release(s, m);
            }
        }
        o->n = cut;
        if (o->src_inst == i)
            o->src_inst = -1;
        else if (cut == 0 && o->src_inst >= 0) {
            s->pn[o->src_inst].sources_busy--;
            o->src_inst = -1;
        }
        so_maybe_end(s, o);
        if (cut == 0) o->active = 0;
    }
    for (int j = 0; j < s->n_inst; j++)
        if (s->pn[j].helper == i) s->pn[j].helper = s->p->live ? pick_helper(s, j) : -1;
    requeue_all(s, i);
}
