/* sim_serve: the instances' serving model, as serving/sched/scheduler.c serves: iteration-level
 * batching, each step decoding every running sequence and prefilling waiting prompts FIFO within
 * the TPOT guard; routing through the policy's controller; hand-overs of running sequences to
 * another instance (zero-loss scale-in). See sim.h and docs/simulator.md. */
#include "cluster/sim/sim_int.h"
#include "cluster/sim/sim_net.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int sim_serving(const struct sim *s, int i)
{
    const struct plan_node *n = &s->pn[i];
    return n->alive && n->engine_model == 0 && !n->standby && n->layers_resident >= s->L;
}

int sim_usable(const struct sim *s, int i)
{
    const struct plan_node *n = &s->pn[i];
    if (!n->alive || n->engine_model != 0 || n->standby || s->in[i].leaving) return 0;
    if (n->layers_resident >= s->L) return 1;
    return s->p->live && n->layers_resident >= s->c->live_min_layers && n->helper >= 0 &&
           sim_serving(s, n->helper);
}

void sim_update_load(struct sim *s, int i)
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

void sim_kick(struct sim *s, int i)
{
    if (!s->in[i].busy && sim_usable(s, i) && (s->in[i].wait_n || s->in[i].n_run)) start_step(s, i);
    sim_update_load(s, i);
}

/* Into instance i's queue, at its tail (front = 0) or its head (a sequence handed over, whose
 * KV is already there: it resumes before new prompts). */
void sim_enqueue(struct sim *s, int i, int r, int front)
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
    if (front) {
        x->wait_head = (x->wait_head + x->wait_cap - 1) % x->wait_cap;
        x->wait[x->wait_head] = r;
        x->wait_n++;
    } else {
        x->wait[(x->wait_head + x->wait_n++) % x->wait_cap] = r;
    }
    x->wait_tokens += s->q[r].prefill_left;
    s->q[r].inst = i;
    sim_kick(s, i);
}

static void hold(struct sim *s, int r)
{
    s->held = sim_grow(s->held, &s->held_cap, s->held_head + s->held_n + 1, sizeof *s->held);
    s->held[s->held_head + s->held_n++] = r;
    s->pm.held++;
    s->pm.held_tokens += s->q[r].prefill_left;
}

int sim_route(struct sim *s, int r)
{
    if (s->c->send_to >= 0) { /* a fixed destination: it serves the request once it can */
        int to = s->id_of[s->c->send_to];
        if (sim_usable(s, to))
            sim_enqueue(s, to, r, 0);
        else
            hold(s, r);
        return 0;
    }
    struct plan_view v = sim_view(s, NULL, NULL);
    struct sim_obs o = sim_obs_of(s, &v);
    int node = -1;
    if (s->p->ctl->route(s->ctl_state, &o, s->q[r].prefill_left, &node, s->err)) return -1;
    if (node < 0 || node >= s->n_inst || !sim_usable(s, node)) {
        hold(s, r);
        return 0;
    }
    s->in[node].served++;
    sim_enqueue(s, node, r, 0);
    return 0;
}

void sim_reroute_held(struct sim *s)
{
    int n = s->held_n, h = s->held_head;
    s->held_head += n;
    s->held_n = 0;
    s->pm.held = 0;
    s->pm.held_tokens = 0;
    for (int j = 0; j < n; j++)
        if (sim_route(s, s->held[h + j])) s->failed = 1;
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
    /* Admission: a handed-over sequence (its KV already here, at the queue's head) needs no
     * budget to resume decoding. */
    while (x->wait_n && x->n_run < c->max_seqs) {
        int r = x->wait[x->wait_head];
        struct sreq *q = &s->q[r];
        long need = q->in + q->out;
        if (x->n_run > 0 && x->kv_used + need > x->kv_cap) break;
        if (q->prefill_left > 0 && budget <= 0) break;
        x->wait_head = (x->wait_head + 1) % x->wait_cap;
        x->wait_n--;
        x->wait_tokens -= q->prefill_left;
        x->kv_used += need;
        x->run[x->n_run++] = r;
        q->step_decode = q->prefill_left == 0 && q->gen > 0;
        q->step_prefill = q->prefill_left < budget ? q->prefill_left : budget;
        budget -= q->step_prefill;
        tokens += q->step_prefill + q->step_decode;
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
    sim_push(s, s->now + dt, EV_STEP, i, x->epoch);
    s->r->events++;
}

void sim_tbt_add(struct sim *s, double gap_s)
{
    double ms = gap_s * 1000;
    int b = ms <= 0.1 ? 0 : (int)(log(ms / 0.1) / log(1.01));
    if (b >= TBT_BUCKETS) b = TBT_BUCKETS - 1;
    s->tbt_hist[b]++;
}

void sim_step_done(struct sim *s, int i)
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
            sim_tbt_add(s, s->now - q->t_last);
            q->tbt_sum += s->now - q->t_last;
            q->t_last = s->now;
        } else if (q->step_prefill > 0) {
            q->prefill_left -= q->step_prefill;
            if (q->prefill_left == 0) {
                if (q->gen == 0) {
                    q->t_first = s->now;
                } else { /* recomputed after a failure: the gap counts as one token's */
                    sim_tbt_add(s, s->now - q->t_last);
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
    if (x->leave_pending) { /* a scale-down waited for this step to end */
        x->leave_pending = 0;
        sim_evacuate(s, i, x->leave_to, 1);
        return;
    }
    sim_kick(s, i);
}

/* ---- hand-over (zero-loss scale-in) ---- */

struct handover {
    int from, to, n;
    int reqs[];
};

static void handover_landed(void *ctx)
{
    struct handover *h = ctx;
    struct sim *s = sim_g;
    s->now = sim_net_now();
    sim_leave_done(s, h->from); /* its KV is across: the GPU goes */
    int ok = s->pn[h->to].alive && sim_serving(s, h->to) && !s->in[h->to].leaving;
    for (int j = h->n - 1; j >= 0; j--) { /* at the head, in their order */
        int r = h->reqs[j];
        if (ok) {
            sim_enqueue(s, h->to, r, 1);
        } else { /* the receiver died or left meanwhile: the KV is lost, recompute */
            struct sreq *q = &s->q[r];
            q->prefill_left = q->in + q->gen;
            if (sim_route(s, r)) s->failed = 1;
        }
    }
    free(h);
}

void sim_evacuate(struct sim *s, int i, int to, int scale_in)
{
    struct inst *x = &s->in[i];
    int nw = x->wait_n, nr = x->n_run;
    int *queued = malloc(sizeof(int) * (nw + 1));
    struct handover *h = malloc(sizeof *h + sizeof(int) * (nr + 1));
    if (!queued || !h) abort();
    for (int j = 0; j < nw; j++) queued[j] = x->wait[(x->wait_head + j) % x->wait_cap];
    *h = (struct handover){.from = i, .to = to, .n = 0};
    double kv_tokens = 0;
    for (int j = 0; j < nr; j++) {
        struct sreq *q = &s->q[x->run[j]];
        q->step_decode = q->step_prefill = 0;
        if (to >= 0) {
            h->reqs[h->n++] = x->run[j];
            kv_tokens += q->in - q->prefill_left + q->gen;
        } else {
            if (scale_in && (q->gen > 0 || q->prefill_left < q->in)) s->r->restarts++;
            q->prefill_left = q->in + q->gen; /* the KV goes with the GPU: recompute */
            queued = realloc(queued, sizeof(int) * (nw + 2));
            if (!queued) abort();
            queued[nw++] = x->run[j];
        }
    }
    x->wait_n = x->n_run = 0;
    x->wait_tokens = x->kv_used = 0;
    x->leaving = 1;
    for (int j = 0; j < nw; j++) /* not begun here: placed again, nothing lost */
        if (sim_route(s, queued[j])) s->failed = 1;
    free(queued);
    if (h->n == 0) {
        free(h);
        sim_leave_done(s, i);
        return;
    }
    s->r->handovers++;
    s->r->moved_seqs += h->n;
    if (s->trace_actions)
        fprintf(stderr, "sim: %s: t=%.3f instance %d hands %d sequences (%.0f KV tokens) to %d\n",
                s->p->name, s->now, i, h->n, kv_tokens, to);
    sim_net_send(sim_net_host_inst(i), sim_net_host_inst(to), kv_tokens * s->c->model.kv_bytes_tok,
                 handover_landed, h);
}
