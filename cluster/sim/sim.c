/* sim: setup (a list of named steps), the driver (the event loop), the results, and running a
 * simulation in a process of its own. The instances' serving is in sim_serve.c, the loads and the
 * controller's actions in sim_load.c (sim_int.h); see sim.h for the model, docs/simulator.md for
 * why. */
#include "cluster/sim/sim.h"

#include "cluster/planner.h"
#include "cluster/sim/sim_int.h"
#include "cluster/sim/sim_net.h"
#include "os/common/errmsg.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct sim *sim_g; /* the one simulation of this process (SimGrid's too) */

/* ---- event heap ---- */

static int ev_less(const struct event *a, const struct event *b)
{
    return a->t < b->t || (a->t == b->t && a->seq < b->seq);
}

void sim_push(struct sim *s, double t, int type, int a, int b)
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

void *sim_grow(void *p, int *cap, int need, size_t elem)
{
    if (need <= *cap) return p;
    int c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    p = realloc(p, (size_t)c * elem);
    if (!p) abort(); /* the simulator's own bookkeeping: no way on without it */
    *cap = c;
    return p;
}

/* ---- what controllers see ---- */

struct plan_view sim_view(struct sim *s, struct plan_scaleout *pso, int *n_pso)
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

struct sim_obs sim_obs_of(struct sim *s, const struct plan_view *v)
{
    for (int i = 0; i < s->n_inst; i++) {
        const struct inst *x = &s->in[i];
        struct sim_inst_info *f = &s->info[i];
        f->kv_cap = x->kv_cap;
        f->kv_used = x->kv_used;
        f->ongoing = x->wait_n + x->n_run;
        f->gpus = x->gpus;
        f->server = x->server;
        f->prefill_tok_s = x->prefill_tok_s;
        f->loading_from_ssd = x->so >= 0 && s->so[x->so].active &&
                              s->so[x->so].src_host == sim_net_host_ssd(x->server);
        f->ssd_cached = 1;
    }
    return (struct sim_obs){.now_s = s->now,
                            .v = v,
                            .inst = s->info,
                            .held = s->held_n,
                            .held_tokens = s->pm.held_tokens,
                            .arrived = s->arrived,
                            .arrived_tokens = s->arrived_tokens,
                            .c = s->c,
                            .p = s->p,
                            .tbt_slo_ms = s->tbt_slo_ms};
}

/* ---- setup ---- */

/* The model's transfer units: a layer per chunk, or every layer in pieces of at most
 * chunk_bytes, in order. */
static int setup_chunks(struct sim *s, char *err)
{
    const struct sim_config *c = s->c;
    s->L = c->model.layers;
    s->n_chunks = s->L;
    if (c->chunk_bytes <= 0) return 0;
    long n = 0;
    for (int k = 0; k < s->L; k++) n += (long)ceil(sim_layer_bytes(s, k) / c->chunk_bytes);
    if (n > 1 << 24)
        return errmsg_set(err, "sim: chunk_bytes %g: %ld chunks (at most %d)", c->chunk_bytes, n,
                          1 << 24);
    s->piece_bytes = malloc(sizeof *s->piece_bytes * n);
    s->layers_after = malloc(sizeof *s->layers_after * n);
    if (!s->piece_bytes || !s->layers_after) abort();
    s->n_chunks = 0;
    for (int k = 0; k < s->L; k++) {
        double b = sim_layer_bytes(s, k);
        long m = (long)ceil(b / c->chunk_bytes);
        for (long q = 0; q < m; q++) {
            s->piece_bytes[s->n_chunks] = q < m - 1 ? c->chunk_bytes : b - (m - 1) * c->chunk_bytes;
            s->layers_after[s->n_chunks++] = q < m - 1 ? k : k + 1;
        }
    }
    return 0;
}

/* A seeded stream (splitmix64) for the listing's shuffle. */
static uint64_t mix(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* GPUs grouped into instances (per type: servers of gpus_per_server, tensor-parallel groups of the
 * smallest power of two that holds the model with 30% room, or gpus_per_inst), each with its step
 * model. Servers are numbered in the types' name order; listing index k (the config's order)
 * becomes instance id id_of[k], a permutation drawn from the seed. */
static int setup_instances(struct sim *s, char *err)
{
    const struct sim_config *c = s->c;
    int gps = c->gpus_per_server, g_of[SIM_MAX_TYPES];
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
    s->pn = calloc(s->n_inst, sizeof *s->pn);
    s->in = calloc(s->n_inst, sizeof *s->in);
    s->info = calloc(s->n_inst, sizeof *s->info);
    s->id_of = calloc(s->n_inst, sizeof *s->id_of);
    if (!s->pn || !s->in || !s->info || !s->id_of) abort();
    /* The canonical order (GPU types by name, then their instances) is shuffled: the same cluster
     * listed another way gets the same ids and servers for a seed. */
    int *perm = malloc(sizeof *perm * s->n_inst), ord[SIM_MAX_TYPES], base[SIM_MAX_TYPES];
    if (!perm) abort();
    for (int k = 0; k < s->n_inst; k++) perm[k] = k;
    uint64_t rng = 0x5eed0000ull ^ c->seed;
    for (int k = s->n_inst - 1; k > 0 && !c->no_shuffle; k--) { /* Fisher-Yates */
        int j = (int)(mix(&rng) % (uint64_t)(k + 1)), x = perm[k];
        perm[k] = perm[j];
        perm[j] = x;
    }
    for (int t = 0, b = 0; t < c->n_types; t++) {
        base[t] = b;
        b += c->type_gpus[t] / g_of[t];
        int p = t;
        while (p > 0 && strcmp(c->types[ord[p - 1]].name, c->types[t].name) > 0) {
            ord[p] = ord[p - 1];
            p--;
        }
        ord[p] = t;
    }
    int k = 0, srv0 = 0;
    for (int ti = 0; ti < c->n_types; ti++) {
        int t = c->no_shuffle ? ti : ord[ti];
        int g = g_of[t], per_srv = gps / g;
        if (per_srv < 1) per_srv = 1;
        for (int q = 0; q < c->type_gpus[t] / g; q++, k++) {
            int i = perm[k];
            s->id_of[base[t] + q] = i;
            struct inst *x = &s->in[i];
            x->server = srv0 + q / per_srv;
            x->type = t;
            x->gpus = g;
            x->sm = s->step[t];
            x->sm_admit = c->admit_set[t] ? c->admit_step[t] : s->step[t];
            x->so = -1;
            x->alloc_since = x->standby_since = -1;
            x->leave_to = -1;
            x->kv_cap = (long)((g * c->types[t].mem_GB * 1e9 * 0.9 - c->model.bytes) /
                               c->model.kv_bytes_tok);
            if (x->kv_cap < 4096) x->kv_cap = 4096;
            x->prefill_tok_s =
                c->max_step_tokens / step_model_predict(&x->sm, c->max_step_tokens, 1);
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
                                          .step_own = s->plan_step[t],
                                          .load = {.idle_since_ms = 0}};
            if (c->servers_per_rack > 0) s->pn[i].rack = x->server / c->servers_per_rack;
        }
        srv0 += (c->type_gpus[t] + gps - 1) / gps;
    }
    free(perm);
    return 0;
}

/* Instance numbers the config names (listing order) exist. */
static int check_references(const struct sim *s, char *err)
{
    const struct sim_config *c = s->c;
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
    return 0;
}

/* SimGrid's platform: the instances' NICs, NVLink, PCIe, the servers' SSDs, remote storage. */
static int setup_network(struct sim *s, char *err)
{
    const struct sim_config *c = s->c;
    int *server = calloc(s->n_inst, sizeof(int));
    double *nic = calloc(s->n_inst, sizeof(double)), *nv = calloc(s->n_inst, sizeof(double)),
           *pcie = calloc(s->n_inst, sizeof(double));
    if (!server || !nic || !nv || !pcie) abort();
    for (int i = 0; i < s->n_inst; i++) {
        server[i] = s->in[i].server;
        nic[i] = s->pn[i].link_Bps;
        nv[i] = s->pn[i].nvlink_Bps;
        pcie[i] = s->pn[i].host_Bps;
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
    return rc;
}

/* BlitzScale's SLOs: TTFT within max(floor, per-token x input), TBT within 5x the unloaded
 * decode step on the fastest type (or tbt_slo_ms); the planner's view of the model. */
static void setup_slos(struct sim *s)
{
    const struct sim_config *c = s->c;
    double mean_in = 0;
    for (int r = 0; r < c->n_req; r++) mean_in += c->req[r].in;
    mean_in = c->n_req ? mean_in / c->n_req : 0;
    int fastest = 0;
    for (int t = 1; t < c->n_types; t++)
        if (s->tput[t] > s->tput[fastest]) fastest = t;
    s->tbt_slo_ms =
        c->tbt_slo_ms > 0 ? c->tbt_slo_ms : 5 * 1000 * step_model_predict(&s->step[fastest], 1, 1);
    s->R = c->replicas_cached > 0 ? c->replicas_cached : s->p->replicas_cached;
    s->pm = (struct plan_model){.layers = s->L,
                                .bytes = c->model.bytes,
                                .ttft_slo_ms = fmax(c->ttft_floor_ms, c->ttft_per_tok_ms * mean_in),
                                .tpot_slo_ms = s->tbt_slo_ms,
                                /* a cache on every server is not managed by R */
                                .replicas_cached = s->p->cache_all ? s->n_inst : s->R,
                                .keep_alive_ms = c->keep_alive_s * 1000};
}

static void setup_requests(struct sim *s)
{
    const struct sim_config *c = s->c;
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
}

/* The controller's state, and the replicas serving at t = 0 (the controller's count, or the
 * config's): the policy's best instances (by throughput unless it ignores the matrix, then by
 * id, i.e. the seed's order; in a replay the first listed) hold the model, the first R of them
 * in host memory too. */
static void place_initial(struct sim *s)
{
    const struct sim_config *c = s->c;
    struct plan_view v = sim_view(s, NULL, NULL);
    struct sim_obs o = sim_obs_of(s, &v);
    s->ctl_state = s->p->ctl->init ? s->p->ctl->init(&o) : NULL;
    int initial = c->initial_replicas;
    if (s->p->ctl->initial) initial = s->p->ctl->initial(s->ctl_state, &o);
    int *order = malloc(sizeof *order * s->n_inst);
    if (!order) abort();
    /* A replayed scenario (fixed scale-outs, a fixed destination) names its instances: the first
     * listed hold the model, as they did where it was measured. */
    int replay = c->n_scaleouts > 0 || c->send_to >= 0;
    for (int k = 0; k < s->n_inst; k++) order[k] = replay ? s->id_of[k] : k;
    if (!s->p->ignore_matrix && !replay)
        for (int a = 1; a < s->n_inst; a++) /* insertion sort: stable, by throughput desc */
            for (int b = a;
                 b > 0 && s->tput[s->in[order[b]].type] > s->tput[s->in[order[b - 1]].type]; b--) {
                int x = order[b];
                order[b] = order[b - 1];
                order[b - 1] = x;
            }
    int holders = s->R > initial ? s->R : initial;
    for (int k = 0; k < s->n_inst; k++) {
        int x = order[k];
        if (k < initial) {
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
}

/* The controller's period, and the per-second samples of the timeline. */
static void setup_clock(struct sim *s)
{
    s->tick_s = s->p->ctl->period_s > 0 ? s->p->ctl->period_s : s->c->tick_s;
    s->n_sec = (int)(s->c->horizon_s * 3 + 62);
    s->sec_serving = calloc(s->n_sec, sizeof(int));
    s->sec_joining = calloc(s->n_sec, sizeof(int));
    if (!s->sec_serving || !s->sec_joining) abort();
}

/* A simulation's setup, step by step; each step above says what it builds. */
static int setup(struct sim *s, char *err)
{
    if (setup_chunks(s, err)) return -1;
    if (setup_instances(s, err)) return -1;
    if (check_references(s, err)) return -1;
    if (setup_network(s, err)) return -1;
    setup_slos(s);
    setup_requests(s);
    place_initial(s);
    setup_clock(s);
    return 0;
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
        if (s->in[i].alloc_since < 0) continue; /* standbys and free GPUs */
        if (sim_serving(s, i) || s->in[i].leaving)
            sv += s->in[i].gpus;
        else
            jn += s->in[i].gpus;
    }
    s->sec_serving[sec] = sv;
    s->sec_joining[sec] = jn;
    if (sv + jn > s->r->max_replicas) s->r->max_replicas = sv + jn;
}

static void trace_end(const struct sim *s)
{
    fprintf(stderr, "sim: %s: end t=%.3f held %d\n", s->p->name, s->now, s->held_n);
    for (int i = 0; i < s->n_inst; i++)
        fprintf(stderr,
                "sim:   instance %d alive %d engine %d k %d standby %d helper %d wait %d run %d "
                "busy %d\n",
                i, s->pn[i].alive, s->pn[i].engine_model, s->pn[i].layers_resident,
                s->pn[i].standby, s->pn[i].helper, s->in[i].wait_n, s->in[i].n_run, s->in[i].busy);
}

static void handle(struct sim *s, const struct event *e)
{
    const struct sim_config *c = s->c;
    switch (e->type) {
    case EV_STEP:
        if (e->b == s->in[e->a].epoch && s->pn[e->a].alive) sim_step_done(s, e->a);
        break;
    case EV_TICK:
        sim_fix_helpers(s);
        for (int i = 0; i < s->n_inst; i++) sim_update_load(s, i);
        if (sim_do_actions(s)) s->failed = 1;
        sim_reroute_held(s);
        /* to the end of the window at least: GPUs are paid for until then */
        if (!all_done(s) || s->now + s->tick_s <= c->horizon_s)
            sim_push(s, s->now + s->tick_s, EV_TICK, 0, 0);
        break;
    case EV_FAIL:
        if (c->failures[e->a].inst >= 0)
            sim_fail_inst(s, c->failures[e->a].inst < s->n_inst ? s->id_of[c->failures[e->a].inst]
                                                                : -1);
        else /* the source of the next scale-out from a holder dies in mid-stream */
            s->holder_fail_pending++;
        break;
    case EV_KILL:
        sim_fail_inst(s, e->a);
        break;
    case EV_SCALEOUT:
        sim_fixed_scaleout(s, &c->scaleouts[e->a]);
        break;
    case EV_SAMPLE:
        sample(s, e->a);
        if (!all_done(s) || s->now + 1 <= c->horizon_s)
            sim_push(s, s->now + 1, EV_SAMPLE, e->a + 1, 0);
        break;
    }
}

static void driver(void *arg)
{
    struct sim *s = arg;
    const struct sim_config *c = s->c;
    double end = c->horizon_s * 3 + 60, next_progress = c->horizon_s / 10;
    if (!c->no_planner) sim_push(s, 0, EV_TICK, 0, 0);
    sim_push(s, 0, EV_SAMPLE, 0, 0);
    for (int f = 0; f < c->n_failures; f++) sim_push(s, c->failures[f].t, EV_FAIL, f, 0);
    for (int f = 0; f < c->n_scaleouts; f++) sim_push(s, c->scaleouts[f].t, EV_SCALEOUT, f, 0);
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
            s->arrived++;
            s->arrived_tokens += s->q[r].in;
            if (sim_route(s, r)) s->failed = 1;
            continue;
        }
        struct event e = pop(s);
        handle(s, &e);
        s->r->events++;
        if (all_done(s) && !c->no_planner && s->heap_n == 0) break;
    }
    s->r->sim_end_s = s->now;
    if (s->trace_actions) trace_end(s);
}

/* ---- results ---- */

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

/* A request's mean time between tokens (ms; 0 with fewer than two tokens). */
static double tpot_ms(const struct sreq *q)
{
    return q->gen > 1 ? q->tbt_sum / (q->gen - 1) * 1000 : 0;
}

static int attained(const struct sim *s, const struct sreq *q)
{
    double t = q->t_first >= 0 ? (q->t_first - q->t_arr) * 1000 : 1e18;
    return q->t_done >= 0 && t <= q->slo_ttft_ms && tpot_ms(q) <= s->tbt_slo_ms;
}

static void write_timeline(const struct sim *s, const char *path)
{
    const struct sim_config *c = s->c;
    FILE *f = fopen(path, "w");
    if (!f) return;
    int secs = (int)ceil(c->horizon_s) + 1;
    if (secs > s->n_sec) secs = s->n_sec;
    int *tot = calloc(secs, sizeof(int)), *ok = calloc(secs, sizeof(int));
    for (int k = 0; tot && ok && k < c->n_req; k++) {
        int sec = (int)s->q[k].t_arr;
        if (sec < 0 || sec >= secs) continue;
        tot[sec]++;
        ok[sec] += attained(s, &s->q[k]);
    }
    fprintf(f, "second,requests,attained,attainment,gpus_serving,gpus_joining,attainment_10s\n");
    int win_tot = 0, win_ok = 0; /* the last 10 seconds (for the chart: one second is noisy) */
    for (int k = 0; tot && ok && k < secs; k++) {
        win_tot += tot[k] - (k >= 10 ? tot[k - 10] : 0);
        win_ok += ok[k] - (k >= 10 ? ok[k - 10] : 0);
        fprintf(f, "%d,%d,%d,%.4f,%d,%d,%.4f\n", k, tot[k], ok[k],
                tot[k] ? (double)ok[k] / tot[k] : 1, s->sec_serving[k], s->sec_joining[k],
                win_tot ? (double)win_ok / win_tot : 1);
    }
    free(tot), free(ok);
    fclose(f);
}

static void finish(struct sim *s, const char *timeline_csv)
{
    const struct sim_config *c = s->c;
    struct sim_result *r = s->r;
    for (int i = 0; i < s->n_inst; i++) sim_gpu_release(s, i);
    double *ttft = malloc(sizeof *ttft * (c->n_req + 1)),
           *tpot = malloc(sizeof *tpot * (c->n_req + 1));
    if (!ttft || !tpot) abort();
    int n = 0, nt = 0;
    double sum = 0;
    for (int k = 0; k < c->n_req; k++) {
        const struct sreq *q = &s->q[k];
        /* a request never served counts with the time it waited: it missed its SLO */
        double t = q->t_first >= 0 ? (q->t_first - q->t_arr) * 1000 : (s->now - q->t_arr) * 1000;
        ttft[n++] = t;
        sum += t;
        if (q->gen > 1) tpot[nt++] = tpot_ms(q);
        r->n_attained += attained(s, q);
        if (q->t_first < 0 || t > q->slo_ttft_ms)
            r->ttft_missed++;
        else if (q->t_done >= 0 && tpot_ms(q) > s->tbt_slo_ms)
            r->tpot_missed++;
    }
    r->n_req = c->n_req;
    r->n_done = s->n_done;
    qsort(ttft, n, sizeof *ttft, cmp_double);
    qsort(tpot, nt, sizeof *tpot, cmp_double);
    r->ttft_p50 = quantile(ttft, n, 0.5);
    r->ttft_p90 = quantile(ttft, n, 0.9);
    r->ttft_p99 = quantile(ttft, n, 0.99);
    r->ttft_mean = n ? sum / n : 0;
    r->tpot_p50 = quantile(tpot, nt, 0.5);
    r->tpot_p99 = quantile(tpot, nt, 0.99);
    for (int k = 0; k < SIM_CDF_POINTS; k++)
        r->ttft_cdf[k] = quantile(ttft, n, (k + 1.0) / SIM_CDF_POINTS);
    free(ttft), free(tpot);
    r->tbt_p50 = tbt_quantile(s, 0.5);
    r->tbt_p90 = tbt_quantile(s, 0.9);
    r->tbt_p99 = tbt_quantile(s, 0.99);
    r->attainment = c->n_req ? (double)r->n_attained / c->n_req : 0;
    double span = c->horizon_s > 0 ? c->horizon_s : 1;
    r->goodput_rps = r->n_attained / span;
    r->so_mean_s = s->so_count ? s->so_sum / s->so_count : 0;
    r->first_token_s = -1;
    if (r->scaleouts == 0) r->first_scaleout_s = -1;
    for (int k = 0; k < c->n_req; k++)
        if (s->q[k].t_first >= 0 && (r->first_token_s < 0 || s->q[k].t_first < r->first_token_s))
            r->first_token_s = s->q[k].t_first;
    if (timeline_csv) write_timeline(s, timeline_csv);
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
    sim_g = s;
    s->trace_actions = getenv("STRATA_SIM_TRACE") != NULL;
    sim_net_run(driver, s);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (s->failed) return errmsg_set(err, "sim: %s: %s", p->name, s->err);
    finish(s, timeline_csv);
    sim_controller_fini(s->p->ctl, s->ctl_state);
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
    sim_new_so(s, PLAN_SO_ENGINE, sim_net_host_inst(0), 0, m->members, m->n, m->mc, 0);
    while (sim_net_in_flight() > 0) {
        sim_net_wait_until(sim_net_now() + 1e6);
        s->now = sim_net_now();
    }
}

int sim_multicast_here(const struct sim_config *c, int mc, int n, double *seconds, char *err)
{
    static const struct sim_controller none = {.name = "none"};
    static struct sim_policy p = {.name = "multicast", .ctl = &none, .source = SIM_SRC_NET};
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
    sim_g = s;
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
