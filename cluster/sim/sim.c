/* sim: the event loop, the instances' serving model, the planner's actions and the loads.
 * See sim.h for the model; docs/simulator.md for why. */
#include "cluster/sim/sim.h"

#include "cluster/planner.h"
#include "cluster/sim/sim_net.h"
#include "os/common/errmsg.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define TBT_BUCKETS 1200 /* log buckets of 1% from 0.1 ms */

enum { EV_STEP, EV_TICK, EV_FAIL, EV_SAMPLE, EV_KILL, EV_SCALEOUT };

struct event {
    double t;
    long seq; /* FIFO among equal times: determinism */
    int type, a, b;
};

struct sreq {
    double t_arr, t_first, t_last, t_done, tbt_sum, slo_ttft_ms;
    int in, out, gen, prefill_left, step_prefill, step_decode, inst;
};

struct inst {
    int server, type, gpus, epoch, busy, so, member;
    int tokens_epoch; /* epoch + 1 once this allocation generated a token (the trace's line) */
    struct step_model sm, sm_admit;         /* step time; the model its scheduler admits with */
    int *wait, wait_head, wait_n, wait_cap; /* FIFO ring of request indices */
    int *run, n_run;
    long kv_used, kv_cap, wait_tokens;
    double borrowed, alloc_since, load_start;
};

struct xfer_ctx {
    int so, member, chunk;
};

struct scaleout {
    int active, kind, src_host, src_inst, n, C, mc, d, round, pending, broken;
    int members[PLAN_MAX_CHAIN], got[PLAN_MAX_CHAIN], hop_sent[PLAN_MAX_CHAIN],
        hop_busy[PLAN_MAX_CHAIN], done[PLAN_MAX_CHAIN];
    unsigned char *have; /* binomial: [n * C] chunk present */
    int snd_from[PLAN_MAX_CHAIN + 1], snd_to[PLAN_MAX_CHAIN + 1], snd_chunk[PLAN_MAX_CHAIN + 1];
    double started;
};

struct sim {
    const struct sim_config *c;
    const struct sim_policy *p;
    struct sim_result *r;
    struct plan_config pcfg;
    struct plan_model pm;
    struct plan_node *pn;
    struct inst *in;
    int n_inst, n_servers, L;
    double tput[SIM_MAX_TYPES];
    struct step_model step[SIM_MAX_TYPES];
    struct step_model plan_step[SIM_MAX_TYPES]; /* what the planner predicts with */
    int R;                                      /* host copies to keep */
    struct sreq *q;
    int next_arrival, n_done;
    int *held, held_head, held_n, held_cap;
    struct event *heap;
    int heap_n, heap_cap;
    long seq;
    struct scaleout *so;
    int n_so, so_cap;
    double now, tbt_slo_ms;
    /* chunk_bytes set: the transfer chunks, n_chunks of them; layers_after[k]: layers complete
     * once chunks [0, k] are held. Else one chunk per layer. */
    int n_chunks;
    double *piece_bytes;
    int *layers_after;
    long tbt_hist[TBT_BUCKETS];
    double so_sum;
    int so_count;
    int *sec_serving, *sec_joining, n_sec;
    int holder_fail_pending;
    int trace_actions;
    /* STRATA_SIM_TRACE set: every planner action on stderr */ /* a "holder" failure waits for
                                                                      the next network scale-out */
    char err[ERRMSG_LEN];
    int failed;
};

/* ---- event heap ---- */

static int ev_less(const struct event *a, const struct event *b)
{
    return a->t < b->t || (a->t == b->t && a->seq < b->seq);
}

static void push(struct sim *s, double t, int type, int a, int b)
{
    if (s->heap_n == s->heap_cap) {
        s->heap_cap = s->heap_cap ? 2 * s->heap_cap : 1024;
        s->heap = realloc(s->heap, s->heap_cap * sizeof *s->heap);
        if (!s->heap) abort();
    }
    struct event e = {t, s->seq++, type, a, b};
    int i = s->heap_n++;
    while (i > 0 && ev_less(&e, &s->heap[(i - 1) / 2])) {
        s->heap[i] = s->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    s->heap[i] = e;
}

static struct event pop(struct sim *s)
{
    struct event top = s->heap[0], last = s->heap[--s->heap_n];
    int i = 0;
    for (;;) {
        int l = 2 * i + 1, m = i;
        if (l < s->heap_n && ev_less(&s->heap[l], &last)) m = l;
        if (l + 1 < s->heap_n && ev_less(&s->heap[l + 1], m == i ? &last : &s->heap[m])) m = l + 1;
        if (m == i) break;
        s->heap[i] = s->heap[m];
        i = m;
    }
    if (s->heap_n) s->heap[i] = last;
    return top;
}

static void *grow(void *p, int *cap, int need, size_t elem)
{
    if (need <= *cap) return p;
    int c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    p = realloc(p, (size_t)c * elem);
    if (!p) abort(); /* the simulator's own bookkeeping: no way on without it */
    *cap = c;
    return p;
}

/* ---- instances ---- */

static int serving(const struct sim *s, int i)
{
    return s->pn[i].alive && s->pn[i].engine_model == 0 && s->pn[i].layers_resident >= s->L;
}

static int usable(const struct sim *s, int i)
{
    const struct plan_node *n = &s->pn[i];
    if (!n->alive || n->engine_model != 0) return 0;
    if (n->layers_resident >= s->L) return 1;
    return s->p->live && n->layers_resident >= s->c->live_min_layers && n->helper >= 0 &&
           serving(s, n->helper);
}

/* Bytes of layer k (a span of model_spans, or an equal share of the model). */
static double layer_bytes(const struct sim *s, int k)
{
    return s->c->n_spans ? s->c->span_bytes[k] : s->c->model.bytes / s->L;
}

/* Bytes of transfer chunk k: a layer, or a piece of at most chunk_bytes of one. */
static double chunk_bytes(const struct sim *s, int k)
{
    return s->piece_bytes ? s->piece_bytes[k] : layer_bytes(s, k);
}

static void update_load(struct sim *s, int i)
{
    struct inst *x = &s->in[i];
    struct plan_load *l = &s->pn[i].load;
    l->queue_len = x->wait_n;
    l->queued_tokens = x->wait_tokens;
    l->running_seqs = x->n_run;
    l->kv_used = x->kv_cap > 0 ? (double)x->kv_used / x->kv_cap : 0;
    if (x->wait_n || x->n_run || x->busy)
        l->idle_since_ms = -1;
    else if (l->idle_since_ms < 0)
        l->idle_since_ms = s->now * 1000;
}

static void start_step(struct sim *s, int i);

static void kick(struct sim *s, int i)
{
    if (!s->in[i].busy && usable(s, i) && (s->in[i].wait_n || s->in[i].n_run)) start_step(s, i);
    update_load(s, i);
}

static void enqueue(struct sim *s, int i, int r)
{
    struct inst *x = &s->in[i];
    if (x->wait_n == x->wait_cap) {
        int old = x->wait_cap, *w = malloc(sizeof *w * (old ? 2 * old : 64));
        if (!w) abort();
        for (int j = 0; j < x->wait_n; j++) w[j] = x->wait[(x->wait_head + j) % old];
        free(x->wait);
        x->wait = w;
        x->wait_head = 0;
        x->wait_cap = old ? 2 * old : 64;
    }
    x->wait[(x->wait_head + x->wait_n++) % x->wait_cap] = r;
    x->wait_tokens += s->q[r].prefill_left;
    s->q[r].inst = i;
    kick(s, i);
}

static void hold(struct sim *s, int r)
{
    s->held = grow(s->held, &s->held_cap, s->held_head + s->held_n + 1, sizeof *s->held);
    s->held[s->held_head + s->held_n++] = r;
    s->pm.held++;
    s->pm.held_tokens += s->q[r].prefill_left;
}

static struct plan_view view(struct sim *s, struct plan_scaleout *pso, int *n_pso)
{
    int n = 0;
    for (int k = 0; k < s->n_so && pso; k++) {
        struct scaleout *o = &s->so[k];
        if (!o->active) continue;
        pso[n] = (struct plan_scaleout){.kind = o->kind,
                                        .model = 0,
                                        .source = o->src_inst,
                                        .n_chain = 0,
                                        .started_ms = o->started * 1000};
        for (int j = 0; j < o->n; j++)
            if (!o->done[j]) pso[n].chain[pso[n].n_chain++] = o->members[j];
        n++;
    }
    if (n_pso) *n_pso = n;
    return (struct plan_view){.now_ms = s->now * 1000,
                              .nodes = s->pn,
                              .n_nodes = s->n_inst,
                              .models = &s->pm,
                              .n_models = 1,
                              .scaleouts = pso,
                              .n_scaleouts = n,
                              .n_gpu_types = s->c->n_types,
                              .tput = s->tput,
                              .step = s->plan_step};
}

static int route(struct sim *s, int r)
{
    if (s->c->send_to >= 0) { /* a fixed destination: it serves the request once it can */
        if (usable(s, s->c->send_to))
            enqueue(s, s->c->send_to, r);
        else
            hold(s, r);
        return 0;
    }
    struct plan_view v = view(s, NULL, NULL);
    struct plan_route rt;
    if (planner_route(&s->pcfg, &v, 0, s->q[r].prefill_left, &rt, s->err)) return -1;
    if (rt.node < 0 || !usable(s, rt.node))
        hold(s, r);
    else
        enqueue(s, rt.node, r);
    return 0;
}

static void reroute_held(struct sim *s)
{
    int n = s->held_n, h = s->held_head;
    s->held_head += n;
    s->held_n = 0;
    s->pm.held = 0;
    s->pm.held_tokens = 0;
    for (int j = 0; j < n; j++)
        if (route(s, s->held[h + j])) s->failed = 1;
    if (s->held_n == 0) s->held_head = 0;
}

static void start_step(struct sim *s, int i)
{
    struct inst *x = &s->in[i];
    const struct sim_config *c = s->c;
    int decode = 0;
    for (int j = 0; j < x->n_run; j++) decode += s->q[x->run[j]].prefill_left == 0;
    int budget = c->max_step_tokens - decode;
    if (decode > 0) {
        /* the scheduler's TPOT guard: prompt chunks only as far as the decoders keep pace */
        int lim =
            step_model_max_tokens(&x->sm_admit, x->n_run + 1, s->tbt_slo_ms * 0.9 / 1000) - decode;
        if (lim < budget) budget = lim;
    }
    if (budget < 0) budget = 0;
    int tokens = decode;
    for (int j = 0; j < x->n_run; j++) {
        struct sreq *q = &s->q[x->run[j]];
        q->step_decode = q->prefill_left == 0;
        q->step_prefill = q->prefill_left < budget ? q->prefill_left : budget;
        budget -= q->step_prefill;
        tokens += q->step_prefill;
    }
    while (x->wait_n && budget > 0 && x->n_run < c->max_seqs) {
        int r = x->wait[x->wait_head];
        struct sreq *q = &s->q[r];
        long need = q->in + q->out;
        if (x->n_run > 0 && x->kv_used + need > x->kv_cap) break;
        x->wait_head = (x->wait_head + 1) % x->wait_cap;
        x->wait_n--;
        x->wait_tokens -= q->prefill_left;
        x->kv_used += need;
        x->run[x->n_run++] = r;
        q->step_decode = 0;
        q->step_prefill = q->prefill_left < budget ? q->prefill_left : budget;
        budget -= q->step_prefill;
        tokens += q->step_prefill;
    }
    if (tokens == 0) return;
    double dt = step_model_predict(&x->sm, tokens, x->n_run);
    const struct plan_node *n = &s->pn[i];
    if (n->layers_resident < s->L && n->helper >= 0) {
        /* layers [k, L) run on the helper: its next step is longer by their share */
        struct inst *h = &s->in[n->helper];
        h->borrowed += h->sm.a * tokens * (s->L - n->layers_resident) / s->L;
    }
    dt += x->borrowed;
    x->borrowed = 0;
    x->busy = 1;
    push(s, s->now + dt, EV_STEP, i, x->epoch);
    s->r->events++;
}

static void tbt_add(struct sim *s, double gap_s)
{
    double ms = gap_s * 1000;
    int b = ms <= 0.1 ? 0 : (int)(log(ms / 0.1) / log(1.01));
    if (b >= TBT_BUCKETS) b = TBT_BUCKETS - 1;
    s->tbt_hist[b]++;
}

static void step_done(struct sim *s, int i)
{
    struct inst *x = &s->in[i];
    x->busy = 0;
    int gen_before = 0, gen_after = 0;
    for (int j = 0; j < x->n_run; j++) gen_before += s->q[x->run[j]].gen;
    for (int j = 0; j < x->n_run;) {
        int r = x->run[j];
        struct sreq *q = &s->q[r];
        if (q->step_decode) {
            q->gen++;
            tbt_add(s, s->now - q->t_last);
            q->tbt_sum += s->now - q->t_last;
            q->t_last = s->now;
        } else if (q->step_prefill > 0) {
            q->prefill_left -= q->step_prefill;
            if (q->prefill_left == 0) {
                if (q->gen == 0) {
                    q->t_first = s->now;
                } else { /* recomputed after a failure: the gap counts as one token's */
                    tbt_add(s, s->now - q->t_last);
                    q->tbt_sum += s->now - q->t_last;
                }
                q->gen++;
                q->t_last = s->now;
            }
        }
        q->step_decode = q->step_prefill = 0;
        gen_after += q->gen;
        if (q->gen >= q->out) {
            q->t_done = s->now;
            x->kv_used -= q->in + q->out;
            x->run[j] = x->run[--x->n_run];
            s->n_done++;
            continue;
        }
        j++;
    }
    if (gen_after > gen_before && x->tokens_epoch != x->epoch + 1) {
        x->tokens_epoch = x->epoch + 1;
        if (s->trace_actions)
            fprintf(stderr, "sim: %s: t=%.3f instance %d first token\n", s->p->name, s->now, i);
    }
    kick(s, i);
}

/* ---- allocation and loads ---- */

static void gpu_release(struct sim *s, int i)
{
    struct inst *x = &s->in[i];
    if (x->alloc_since >= 0) s->r->gpu_s += (s->now - x->alloc_since) * x->gpus;
    if (x->alloc_since >= 0)
        s->r->cost_usd +=
            (s->now - x->alloc_since) * x->gpus * s->c->types[x->type].usd_hour / 3600;
    x->alloc_since = -1;
}

static int pick_helper(struct sim *s, int i)
{
    int best = -1;
    for (int j = 0; j < s->n_inst; j++)
        if (j != i && serving(s, j) &&
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
    kick(s, i);
    for (int j = 0; j < s->n_inst && s->p->live; j++) /* joiners without a helper get this one */
        if (s->pn[j].alive && s->pn[j].engine_model == 0 && s->pn[j].layers_resident < s->L &&
            (s->pn[j].helper < 0 || !serving(s, s->pn[j].helper)))
            s->pn[j].helper = i;
    reroute_held(s);
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
        int was = usable(s, i), old = s->pn[i].layers_resident;
        if (s->c->kv_recompute && s->p->live && k > old) {
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
        } else if (!was && usable(s, i)) {
            reroute_held(s);
        }
    } else if (k >= s->L) {
        o->done[j] = 1;
        s->pn[i].host_cached |= 1;
    }
}

static void chain_hop(struct sim *s, int so, int h);

static struct sim *g_sim; /* the one simulation of this process (SimGrid's too) */

static void on_chain_chunk(void *ctx)
{
    struct xfer_ctx t = *(struct xfer_ctx *)ctx;
    free(ctx);
    struct sim *s = g_sim;
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

/* Binomial pipeline (λScale's multicast): receivers 0..n-1 form a hypercube of dimension
 * d = ceil(log2 n); in round r the source sends chunk r to receiver 0, and every receiver x
 * sends its newest chunk that x ^ (1 << (r mod d)) lacks to that partner. Rounds are
 * synchronous; with n = 2^d the whole model reaches everyone in C + d rounds. */
static void binomial_round(struct sim *s, int so);

static void on_binomial_chunk(void *ctx)
{
    struct xfer_ctx t = *(struct xfer_ctx *)ctx;
    free(ctx);
    struct sim *s = g_sim;
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
    if (ns == 0) { /* nothing can move: the rest is unreachable (a receiver failed) */
        o->broken = 1;
        return;
    }
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

static int new_so(struct sim *s, int kind, int src_host, int src_inst, const int *members, int n,
                  int mc)
{
    s->so = grow(s->so, &s->so_cap, s->n_so + 1, sizeof *s->so);
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
    o->started = s->now;
    for (int j = 0; j < n; j++) {
        o->members[j] = members[j];
        if (kind == PLAN_SO_ENGINE) {
            s->in[members[j]].so = id;
            s->in[members[j]].member = j;
        }
    }
    if (src_inst >= 0) s->pn[src_inst].sources_busy++;
    if (src_inst >= 0 && kind == PLAN_SO_ENGINE && s->holder_fail_pending > 0) {
        s->holder_fail_pending--;
        push(s, s->now + 0.5 * s->c->model.bytes / s->pn[src_inst].link_Bps, EV_KILL, src_inst, 0);
    }
    if (mc == SIM_MC_BINOMIAL) {
        while ((1 << o->d) < n) o->d++;
        o->have = calloc((size_t)n * o->C, 1);
        if (!o->have) abort();
        binomial_round(s, id);
    } else {
        chain_hop(s, id, 0);
    }
    return id;
}

/* Every member of a chain loads on its own (one-member "chains" from a local or shared source). */
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
        new_so(s, PLAN_SO_ENGINE, src, -1, &members[j], 1, SIM_MC_CHAIN);
    }
}

static void scale_up(struct sim *s, const struct plan_action *a)
{
    int members[PLAN_MAX_CHAIN], n = 0, any_serving = 0;
    for (int i = 0; i < s->n_inst; i++) any_serving |= serving(s, i);
    if (!any_serving) s->r->cold_starts++;
    s->r->scaleouts++;
    for (int j = 0; j < a->n_chain; j++) {
        int i = a->chain[j];
        if (!s->pn[i].alive || s->pn[i].engine_model >= 0) continue;
        s->pn[i].engine_model = 0;
        s->pn[i].layers_resident = 0;
        s->pn[i].helper = s->p->live ? pick_helper(s, i) : -1;
        s->in[i].alloc_since = s->now;
        s->in[i].load_start = s->now;
        s->pn[i].load.idle_since_ms = s->now * 1000; /* its keep-alive starts now */
        s->in[i].epoch++;
        s->in[i].busy = 0;
        members[n++] = i;
    }
    if (n == 0) return;
    if (s->p->source != SIM_SRC_NET || a->source == a->chain[0]) {
        load_each(s, members, n);
        return;
    }
    new_so(s, PLAN_SO_ENGINE, sim_net_host_inst(a->source), a->source, members, n, s->p->multicast);
}

static void release(struct sim *s, int i)
{
    gpu_release(s, i);
    s->pn[i].engine_model = -1;
    s->pn[i].layers_resident = 0;
    s->pn[i].helper = -1;
    s->in[i].so = -1;
    s->in[i].epoch++; /* a step in flight is void */
    s->in[i].busy = 0;
}

static int do_actions(struct sim *s)
{
    struct plan_scaleout *pso = malloc(sizeof *pso * (s->n_so + 1));
    struct plan_action act[64];
    int n_pso;
    s->pm.held = s->held_n;
    struct plan_view v = view(s, pso, &n_pso);
    int n = planner_step(&s->pcfg, &v, act, 64, s->err);
    free(pso);
    if (n < 0) return -1;
    for (int k = 0; k < n; k++) {
        const struct plan_action *a = &act[k];
        if (s->trace_actions) {
            static const char *kinds[] = {"scale-up", "scale-down", "replicate-host", "drop-host"};
            fprintf(stderr, "sim: %s: t=%.3f %s source %d node %d chain", s->p->name, s->now,
                    kinds[a->kind], a->source, a->node);
            for (int j = 0; j < a->n_chain; j++) fprintf(stderr, " %d", a->chain[j]);
            fprintf(stderr, "\n");
        }
        switch (a->kind) {
        case PLAN_SCALE_UP:
            scale_up(s, a);
            break;
        case PLAN_SCALE_DOWN:
            release(s, a->node);
            break;
        case PLAN_DROP_HOST:
            s->pn[a->node].host_cached &= ~(uint64_t)1;
            break;
        case PLAN_REPLICATE_HOST:
            for (int j = 0; j < a->n_chain; j++) /* copies go one target after another */
                new_so(s, PLAN_SO_HOST, sim_net_host_inst(a->source), a->source, &a->chain[j], 1,
                       SIM_MC_CHAIN);
            break;
        }
    }
    return 0;
}

/* A scale-out fixed by the config (struct sim_scaleout_spec), carried out like a planner's. */
static void fixed_scaleout(struct sim *s, const struct sim_scaleout_spec *f)
{
    if (!serving(s, f->src)) {
        s->failed = 1;
        errmsg_set(s->err, "scaleout at %g s: instance %d does not hold the model then", f->t,
                   f->src);
        return;
    }
    struct plan_action a = {.kind = PLAN_SCALE_UP, .source = f->src, .n_chain = f->n};
    for (int j = 0; j < f->n; j++) a.chain[j] = f->chain[j];
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
        if (route(s, rs[j])) s->failed = 1;
    }
    free(rs);
}

static void fail_inst(struct sim *s, int i)
{
    if (i < 0 || i >= s->n_inst || !s->pn[i].alive) return;
    if (s->trace_actions)
        fprintf(stderr, "sim: %s: t=%.3f instance %d fails\n", s->p->name, s->now, i);
    s->r->failures_injected++;
    s->pn[i].alive = 0;
    s->in[i].busy = 0;
    gpu_release(s, i);
    s->in[i].epoch++;
    int was_joining = s->pn[i].engine_model == 0 && s->pn[i].layers_resident < s->L;
    s->pn[i].engine_model = -1;
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
    (void)was_joining;
    for (int j = 0; j < s->n_inst; j++)
        if (s->pn[j].helper == i) s->pn[j].helper = s->p->live ? pick_helper(s, j) : -1;
    requeue_all(s, i);
}

/* ---- the driver ---- */

static int all_done(const struct sim *s)
{
    return s->next_arrival >= s->c->n_req && s->n_done >= s->c->n_req;
}

static void sample(struct sim *s, int sec)
{
    if (sec >= s->n_sec) return;
    int sv = 0, jn = 0;
    for (int i = 0; i < s->n_inst; i++) {
        if (serving(s, i))
            sv += s->in[i].gpus;
        else if (s->pn[i].alive && s->pn[i].engine_model == 0)
            jn += s->in[i].gpus;
    }
    s->sec_serving[sec] = sv;
    s->sec_joining[sec] = jn;
    if (sv + jn > s->r->max_replicas) s->r->max_replicas = sv + jn;
}

static void driver(void *arg)
{
    struct sim *s = arg;
    const struct sim_config *c = s->c;
    double end = c->horizon_s * 3 + 60, next_progress = c->horizon_s / 10;
    if (!c->no_planner) push(s, 0, EV_TICK, 0, 0);
    push(s, 0, EV_SAMPLE, 0, 0);
    for (int f = 0; f < c->n_failures; f++) push(s, c->failures[f].t, EV_FAIL, f, 0);
    for (int f = 0; f < c->n_scaleouts; f++) push(s, c->scaleouts[f].t, EV_SCALEOUT, f, 0);
    while (!s->failed) {
        double ta = s->next_arrival < c->n_req ? c->req[s->next_arrival].t : INFINITY;
        double te = s->heap_n ? s->heap[0].t : INFINITY;
        double t = ta < te ? ta : te;
        /* without the planner nothing else ends a run: a transfer in flight still counts (held
         * requests wait for its layers) */
        int moving = c->no_planner && sim_net_in_flight() > 0;
        if (t == INFINITY && moving) {
            sim_net_wait_until(sim_net_now() + 1e6);
            s->now = sim_net_now();
            continue;
        }
        if (t == INFINITY || (t > end && !moving)) break;
        sim_net_wait_until(t);
        s->now = sim_net_now();
        if (s->now < t) continue; /* a transfer ended first; its callback has run */
        if (c->progress && s->now >= next_progress) {
            fprintf(stderr, "sim: %s: t=%.0f s of %.0f, %d/%d requests done\n", s->p->name, s->now,
                    c->horizon_s, s->n_done, c->n_req);
            next_progress += c->horizon_s / 10;
        }
        if (ta <= te) {
            int r = s->next_arrival++;
            if (route(s, r)) s->failed = 1;
            continue;
        }
        struct event e = pop(s);
        switch (e.type) {
        case EV_STEP:
            if (e.b == s->in[e.a].epoch && s->pn[e.a].alive) step_done(s, e.a);
            break;
        case EV_TICK:
            for (int i = 0; i < s->n_inst; i++) update_load(s, i);
            if (do_actions(s)) s->failed = 1;
            reroute_held(s);
            if (!all_done(s)) push(s, s->now + c->tick_s, EV_TICK, 0, 0);
            break;
        case EV_FAIL:
            if (c->failures[e.a].inst >= 0)
                fail_inst(s, c->failures[e.a].inst);
            else /* the source of the next scale-out from a holder dies in mid-stream */
                s->holder_fail_pending++;
            break;
        case EV_KILL:
            fail_inst(s, e.a);
            break;
        case EV_SCALEOUT:
            fixed_scaleout(s, &c->scaleouts[e.a]);
            break;
        case EV_SAMPLE:
            sample(s, e.a);
            if (!all_done(s)) push(s, s->now + 1, EV_SAMPLE, e.a + 1, 0);
            break;
        }
        s->r->events++;
        if (all_done(s) && !c->no_planner && s->heap_n == 0) break;
    }
    s->r->sim_end_s = s->now;
    if (s->trace_actions) {
        fprintf(stderr, "sim: %s: end t=%.3f held %d\n", s->p->name, s->now, s->held_n);
        for (int i = 0; i < s->n_inst; i++)
            fprintf(stderr,
                    "sim:   instance %d alive %d engine %d k %d helper %d wait %d run %d busy %d\n",
                    i, s->pn[i].alive, s->pn[i].engine_model, s->pn[i].layers_resident,
                    s->pn[i].helper, s->in[i].wait_n, s->in[i].n_run, s->in[i].busy);
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double quantile(const double *v, int n, double p)
{
    if (n == 0) return 0;
    int k = (int)ceil(p * n) - 1;
    if (k < 0) k = 0;
    if (k >= n) k = n - 1;
    return v[k];
}

static double tbt_quantile(const struct sim *s, double p)
{
    long total = 0, acc = 0;
    for (int b = 0; b < TBT_BUCKETS; b++) total += s->tbt_hist[b];
    if (!total) return 0;
    for (int b = 0; b < TBT_BUCKETS; b++) {
        acc += s->tbt_hist[b];
        if (acc >= p * total) return 0.1 * pow(1.01, b + 0.5);
    }
    return 0;
}

static int setup(struct sim *s, char *err)
{
    const struct sim_config *c = s->c;
    s->L = c->model.layers;
    s->n_chunks = s->L;
    if (c->chunk_bytes > 0) { /* every layer in pieces of at most chunk_bytes, in order */
        long n = 0;
        for (int k = 0; k < s->L; k++) n += (long)ceil(layer_bytes(s, k) / c->chunk_bytes);
        if (n > 1 << 24)
            return errmsg_set(err, "sim: chunk_bytes %g: %ld chunks (at most %d)", c->chunk_bytes,
                              n, 1 << 24);
        s->piece_bytes = malloc(sizeof *s->piece_bytes * n);
        s->layers_after = malloc(sizeof *s->layers_after * n);
        if (!s->piece_bytes || !s->layers_after) abort();
        s->n_chunks = 0;
        for (int k = 0; k < s->L; k++) {
            double b = layer_bytes(s, k);
            long m = (long)ceil(b / c->chunk_bytes);
            for (long q = 0; q < m; q++) {
                s->piece_bytes[s->n_chunks] =
                    q < m - 1 ? c->chunk_bytes : b - (m - 1) * c->chunk_bytes;
                s->layers_after[s->n_chunks++] = q < m - 1 ? k : k + 1;
            }
        }
    }
    int gps = c->gpus_per_server;
    /* instances: per type, servers of gps GPUs, groups of g GPUs */
    int g_of[SIM_MAX_TYPES];
    for (int t = 0; t < c->n_types; t++) {
        int g = c->gpus_per_inst;
        if (g <= 0)
            for (g = 1; g < gps && g * c->types[t].mem_GB * 1e9 * 0.9 < c->model.bytes * 1.3;
                 g *= 2)
                ;
        g_of[t] = g;
        s->n_inst += c->type_gpus[t] / g;
        s->n_servers += (c->type_gpus[t] + gps - 1) / gps;
        if (c->step_set[t])
            s->step[t] = c->step[t];
        else
            sim_step_model(&c->types[t], g, &c->model, &s->step[t]);
        s->plan_step[t] = c->plan_set[t] ? c->plan_step[t] : s->step[t];
        /* Gavel's effective throughput: decode tokens/s at a batch of 64 */
        s->tput[t] = 64 / step_model_predict(&s->step[t], 64, 64);
    }
    if (s->n_inst < 1)
        return errmsg_set(err, "sim: the cluster has no instance for %s", c->model.name);
    if (s->n_inst > PLAN_MAX_NODES)
        return errmsg_set(err, "sim: %d instances (at most %d)", s->n_inst, PLAN_MAX_NODES);
    if (c->send_to >= s->n_inst)
        return errmsg_set(err, "sim: send_to = %d: the cluster has instances 0..%d", c->send_to,
                          s->n_inst - 1);
    if (c->live_min_layers > s->L)
        return errmsg_set(err, "sim: live_min_layers = %d: the model has %d", c->live_min_layers,
                          s->L);
    for (int f = 0; f < c->n_scaleouts; f++) {
        const struct sim_scaleout_spec *so = &c->scaleouts[f];
        int bad = so->src >= s->n_inst;
        for (int j = 0; j < so->n; j++) bad |= so->chain[j] >= s->n_inst;
        if (bad)
            return errmsg_set(err, "sim: scaleout at %g s: the cluster has instances 0..%d", so->t,
                              s->n_inst - 1);
    }
    s->pn = calloc(s->n_inst, sizeof *s->pn);
    s->in = calloc(s->n_inst, sizeof *s->in);
    int *server = calloc(s->n_inst, sizeof(int));
    double *nic = calloc(s->n_inst, sizeof(double)), *nv = calloc(s->n_inst, sizeof(double)),
           *pcie = calloc(s->n_inst, sizeof(double));
    if (!s->pn || !s->in || !server || !nic || !nv || !pcie) abort();
    int i = 0, srv0 = 0;
    for (int t = 0; t < c->n_types; t++) {
        int g = g_of[t], per_srv = gps / g;
        if (per_srv < 1) per_srv = 1;
        for (int k = 0; k < c->type_gpus[t] / g; k++, i++) {
            struct inst *x = &s->in[i];
            x->server = srv0 + k / per_srv;
            x->type = t;
            x->gpus = g;
            x->sm = s->step[t];
            x->sm_admit = c->admit_set[t] ? c->admit_step[t] : s->step[t];
            x->so = -1;
            x->alloc_since = -1;
            x->kv_cap = (long)((g * c->types[t].mem_GB * 1e9 * 0.9 - c->model.bytes) /
                               c->model.kv_bytes_tok);
            if (x->kv_cap < 4096) x->kv_cap = 4096;
            x->run = calloc(c->max_seqs + 1, sizeof(int));
            if (!x->run) abort();
            s->pn[i] = (struct plan_node){.id = i,
                                          .alive = 1,
                                          .gpu_type = t,
                                          .domain = x->server,
                                          .link_Bps = c->tiers.nic_Bps * g,
                                          .nvlink_Bps = c->tiers.nvlink_Bps * g,
                                          .host_Bps = c->tiers.pcie_Bps * g,
                                          .fail_prob = c->fail_prob,
                                          .engine_model = -1,
                                          .helper = -1,
                                          .load = {.idle_since_ms = 0}};
            if (c->servers_per_rack > 0) s->pn[i].rack = x->server / c->servers_per_rack;
            server[i] = x->server;
            nic[i] = s->pn[i].link_Bps;
            nv[i] = s->pn[i].nvlink_Bps;
            pcie[i] = c->tiers.pcie_Bps * g;
        }
        srv0 += (c->type_gpus[t] + gps - 1) / gps;
    }
    struct sim_topology topo = {.n_inst = s->n_inst,
                                .server = server,
                                .nic_Bps = nic,
                                .nvlink_Bps = nv,
                                .pcie_Bps = pcie,
                                .n_servers = s->n_servers,
                                .ssd_Bps = c->tiers.ssd_Bps,
                                .remote_Bps = c->tiers.remote_Bps,
                                .latency_s = c->tiers.latency_s};
    int rc = sim_net_boot(&topo, err);
    free(server), free(nic), free(nv), free(pcie);
    if (rc) return -1;

    s->R = c->replicas_cached > 0 ? c->replicas_cached : s->p->replicas_cached;
    /* SLOs */
    double mean_in = 0;
    for (int r = 0; r < c->n_req; r++) mean_in += c->req[r].in;
    mean_in = c->n_req ? mean_in / c->n_req : 0;
    int fastest = 0;
    for (int t = 1; t < c->n_types; t++)
        if (s->tput[t] > s->tput[fastest]) fastest = t;
    s->tbt_slo_ms =
        c->tbt_slo_ms > 0 ? c->tbt_slo_ms : 5 * 1000 * step_model_predict(&s->step[fastest], 1, 1);
    s->pm = (struct plan_model){.layers = s->L,
                                .bytes = c->model.bytes,
                                .ttft_slo_ms = fmax(c->ttft_floor_ms, c->ttft_per_tok_ms * mean_in),
                                .tpot_slo_ms = s->tbt_slo_ms,
                                /* a cache on every server is not managed by R */
                                .replicas_cached = s->p->cache_all ? s->n_inst : s->R,
                                .keep_alive_ms = c->keep_alive_s * 1000};
    plan_config_default(&s->pcfg);
    s->pcfg.max_step_tokens = c->max_step_tokens;
    s->pcfg.max_joiners = c->max_joiners;
    s->pcfg.ignore_matrix = s->p->ignore_matrix;

    /* requests */
    s->q = calloc(c->n_req + 1, sizeof *s->q);
    if (!s->q) abort();
    for (int r = 0; r < c->n_req; r++) {
        s->q[r] = (struct sreq){.t_arr = c->req[r].t,
                                .in = c->req[r].in > 0 ? c->req[r].in : 1,
                                .out = c->req[r].out > 0 ? c->req[r].out : 1,
                                .inst = -1,
                                .t_first = -1,
                                .t_done = -1};
        s->q[r].prefill_left = s->q[r].in;
        s->q[r].slo_ttft_ms = fmax(c->ttft_floor_ms, c->ttft_per_tok_ms * s->q[r].in);
    }
    /* initial replicas on the best instances by the policy's own placement order */
    int *order = malloc(sizeof *order * s->n_inst);
    if (!order) abort();
    for (int k = 0; k < s->n_inst; k++) order[k] = k;
    if (!s->p->ignore_matrix)
        for (int a = 1; a < s->n_inst; a++) /* insertion sort: stable, by throughput desc */
            for (int b = a;
                 b > 0 && s->tput[s->in[order[b]].type] > s->tput[s->in[order[b - 1]].type]; b--) {
                int x = order[b];
                order[b] = order[b - 1];
                order[b - 1] = x;
            }
    int holders = s->R > c->initial_replicas ? s->R : c->initial_replicas;
    for (int k = 0; k < s->n_inst; k++) {
        int x = order[k];
        if (k < c->initial_replicas) {
            s->pn[x].engine_model = 0;
            s->pn[x].layers_resident = s->L;
            s->in[x].alloc_since = 0;
        }
        if (k < holders && k < s->R) {
            s->pn[x].host_cached = 1;
            if (s->p->cache_on_load) /* a server-wide host cache: its neighbours see it too */
                for (int j = 0; j < s->n_inst; j++)
                    if (s->in[j].server == s->in[x].server) s->pn[j].host_cached = 1;
        }
        if (s->p->cache_all) s->pn[x].host_cached = 1;
    }
    free(order);
    s->n_sec = (int)(c->horizon_s * 3 + 62);
    s->sec_serving = calloc(s->n_sec, sizeof(int));
    s->sec_joining = calloc(s->n_sec, sizeof(int));
    if (!s->sec_serving || !s->sec_joining) abort();
    return 0;
}

static void finish(struct sim *s, const char *timeline_csv)
{
    const struct sim_config *c = s->c;
    struct sim_result *r = s->r;
    for (int i = 0; i < s->n_inst; i++) gpu_release(s, i);
    double *ttft = malloc(sizeof *ttft * (c->n_req + 1));
    if (!ttft) abort();
    int n = 0;
    double sum = 0;
    for (int k = 0; k < c->n_req; k++) {
        const struct sreq *q = &s->q[k];
        /* a request never served counts with the time it waited: it missed its SLO */
        double t = q->t_first >= 0 ? (q->t_first - q->t_arr) * 1000 : (s->now - q->t_arr) * 1000;
        ttft[n++] = t;
        sum += t;
        double tbt = q->gen > 1 ? q->tbt_sum / (q->gen - 1) * 1000 : 0;
        if (q->t_done >= 0 && t <= q->slo_ttft_ms && tbt <= s->tbt_slo_ms) r->n_attained++;
    }
    r->n_req = c->n_req;
    r->n_done = s->n_done;
    qsort(ttft, n, sizeof *ttft, cmp_double);
    r->ttft_p50 = quantile(ttft, n, 0.5);
    r->ttft_p90 = quantile(ttft, n, 0.9);
    r->ttft_p99 = quantile(ttft, n, 0.99);
    r->ttft_mean = n ? sum / n : 0;
    for (int k = 0; k < SIM_CDF_POINTS; k++)
        r->ttft_cdf[k] = quantile(ttft, n, (k + 1.0) / SIM_CDF_POINTS);
    free(ttft);
    r->tbt_p50 = tbt_quantile(s, 0.5);
    r->tbt_p90 = tbt_quantile(s, 0.9);
    r->tbt_p99 = tbt_quantile(s, 0.99);
    r->attainment = c->n_req ? (double)r->n_attained / c->n_req : 0;
    double span = c->horizon_s > 0 ? c->horizon_s : 1;
    r->goodput_rps = r->n_attained / span;
    r->so_mean_s = s->so_count ? s->so_sum / s->so_count : 0;
    r->first_token_s = -1;
    for (int k = 0; k < c->n_req; k++)
        if (s->q[k].t_first >= 0 && (r->first_token_s < 0 || s->q[k].t_first < r->first_token_s))
            r->first_token_s = s->q[k].t_first;
    if (!timeline_csv) return;
    FILE *f = fopen(timeline_csv, "w");
    if (!f) return;
    int secs = (int)ceil(c->horizon_s) + 1;
    if (secs > s->n_sec) secs = s->n_sec;
    int *tot = calloc(secs, sizeof(int)), *ok = calloc(secs, sizeof(int));
    for (int k = 0; tot && ok && k < c->n_req; k++) {
        const struct sreq *q = &s->q[k];
        int sec = (int)q->t_arr;
        if (sec < 0 || sec >= secs) continue;
        tot[sec]++;
        double t = q->t_first >= 0 ? (q->t_first - q->t_arr) * 1000 : 1e18;
        double tbt = q->gen > 1 ? q->tbt_sum / (q->gen - 1) * 1000 : 0;
        ok[sec] += q->t_done >= 0 && t <= q->slo_ttft_ms && tbt <= s->tbt_slo_ms;
    }
    fprintf(f, "second,requests,attained,attainment,gpus_serving,gpus_joining\n");
    for (int k = 0; tot && ok && k < secs; k++)
        fprintf(f, "%d,%d,%d,%.4f,%d,%d\n", k, tot[k], ok[k], tot[k] ? (double)ok[k] / tot[k] : 1,
                s->sec_serving[k], s->sec_joining[k]);
    free(tot), free(ok);
    fclose(f);
}

int sim_run_here(const struct sim_config *c, const struct sim_policy *p, struct sim_result *r,
                 const char *timeline_csv, char *err)
{
    struct sim *s = calloc(1, sizeof *s);
    if (!s) return errmsg_set(err, "sim: out of memory");
    memset(r, 0, sizeof *r);
    snprintf(r->policy, sizeof r->policy, "%s", p->name);
    s->c = c;
    s->p = p;
    s->r = r;
    if (setup(s, err)) return -1; /* the process ends after a run: no cleanup needed */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    g_sim = s;
    s->trace_actions = getenv("STRATA_SIM_TRACE") != NULL;
    sim_net_run(driver, s);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (s->failed) return errmsg_set(err, "sim: %s: %s", p->name, s->err);
    finish(s, timeline_csv);
    r->wall_s = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
    return 0;
}

struct mcast {
    struct sim *s;
    int mc, n, members[PLAN_MAX_CHAIN];
};

static void mcast_main(void *arg)
{
    struct mcast *m = arg;
    struct sim *s = m->s;
    new_so(s, PLAN_SO_ENGINE, sim_net_host_inst(0), 0, m->members, m->n, m->mc);
    while (sim_net_in_flight() > 0) {
        sim_net_wait_until(sim_net_now() + 1e6);
        s->now = sim_net_now();
    }
}

int sim_multicast_here(const struct sim_config *c, int mc, int n, double *seconds, char *err)
{
    static struct sim_policy p = {.name = "multicast", .source = SIM_SRC_NET};
    static struct sim_result r;
    struct sim *s = calloc(1, sizeof *s);
    if (!s) return errmsg_set(err, "sim: out of memory");
    p.multicast = mc;
    s->c = c;
    s->p = &p;
    s->r = &r;
    if (setup(s, err)) return -1;
    if (n < 1 || n >= s->n_inst || n > PLAN_MAX_CHAIN)
        return errmsg_set(err, "sim: multicast to %d of %d instances", n, s->n_inst);
    s->pn[0].engine_model = 0;
    s->pn[0].layers_resident = s->L;
    static struct mcast m;
    m.s = s;
    m.mc = mc;
    m.n = n;
    for (int j = 0; j < n; j++) {
        m.members[j] = j + 1;
        s->pn[j + 1].engine_model = 0;
        s->pn[j + 1].layers_resident = 0;
    }
    g_sim = s;
    sim_net_run(mcast_main, &m);
    for (int j = 0; j < n; j++)
        if (s->pn[j + 1].layers_resident != s->L)
            return errmsg_set(err, "sim: multicast: instance %d got %d of %d layers", j + 1,
                              s->pn[j + 1].layers_resident, s->L);
    *seconds = r.so_max_s;
    return 0;
}

int sim_run(const struct sim_config *c, const struct sim_policy *p, struct sim_result *r,
            const char *timeline_csv, char *err)
{
    int fd[2];
    if (pipe(fd)) return errmsg_set(err, "sim: pipe: %s", strerror(errno));
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        close(fd[0]), close(fd[1]);
        return errmsg_set(err, "sim: fork: %s", strerror(errno));
    }
    if (pid == 0) {
        close(fd[0]);
        struct {
            int rc;
            char err[ERRMSG_LEN];
            struct sim_result r;
        } out;
        memset(&out, 0, sizeof out);
        out.rc = sim_run_here(c, p, &out.r, timeline_csv, out.err);
        const char *b = (const char *)&out;
        size_t left = sizeof out;
        while (left) {
            ssize_t w = write(fd[1], b, left);
            if (w <= 0) _exit(3);
            b += w, left -= (size_t)w;
        }
        _exit(0);
    }
    close(fd[1]);
    struct {
        int rc;
        char err[ERRMSG_LEN];
        struct sim_result r;
    } in;
    char *b = (char *)&in;
    size_t got = 0;
    while (got < sizeof in) {
        ssize_t n = read(fd[0], b + got, sizeof in - got);
        if (n <= 0) break;
        got += (size_t)n;
    }
    close(fd[0]);
    int st;
    waitpid(pid, &st, 0);
    if (got < sizeof in)
        return errmsg_set(err, "sim: %s: the simulation process died (status %d)", p->name, st);
    if (in.rc) return errmsg_set(err, "%s", in.err);
    *r = in.r;
    return 0;
}
