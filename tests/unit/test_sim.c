/* The simulator against closed forms: one transfer takes size / bandwidth; a chain of N costs one
 * transfer plus N - 1 chunk times; the binomial pipeline takes C + log2 N chunk times; an M/D/1
 * queue's mean wait is rho / (2 mu (1 - rho)); a seed gives the same run twice; the live
 * namespaces setup (tests/bench/sim_validate.sh) as a config: a chunked chain costs one transfer
 * plus a chunk per hop, a live joiner serves once its first span lands. Each simulation
 * runs in a child process (SimGrid's engine is once per process). */
#include "check.h"
#include "cluster/sim/sim.h"
#include "os/common/errmsg.h"

#include <sys/wait.h>
#include <unistd.h>

/* Run the multicast in a child; the time comes back through a pipe. */
static double multicast(const struct sim_config *c, int mc, int n)
{
    int fd[2];
    if (pipe(fd)) return -1;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        char err[ERRMSG_LEN];
        double t = -1;
        if (sim_multicast_here(c, mc, n, &t, err)) fprintf(stderr, "%s\n", err);
        if (write(fd[1], &t, sizeof t) != sizeof t) _exit(2);
        _exit(0);
    }
    close(fd[1]);
    double t = -1;
    if (read(fd[0], &t, sizeof t) != sizeof t) t = -1;
    close(fd[0]);
    int st;
    waitpid(pid, &st, 0);
    return t;
}

/* One instance per server (no NVLink between them), no latency: every hop is the NIC. */
static void flat_cluster(struct sim_config *c, int gpus)
{
    sim_config_default(c);
    c->type_gpus[0] = gpus;
    c->gpus_per_server = 1;
    c->gpus_per_inst = 1;
    c->tiers.latency_s = 0;
    c->tiers.nic_Bps = 12.5e9; /* 100 Gb/s */
}

static int close_to(double got, double want, double rel)
{
    return fabs(got - want) <= rel * want;
}

TEST(one_transfer_takes_size_over_bandwidth)
{
    struct sim_config c;
    flat_cluster(&c, 4);
    double t = multicast(&c, SIM_MC_CHAIN, 1);
    double want = c.model.bytes / c.tiers.nic_Bps; /* 13.5 GB at 12.5 GB/s = 1.08 s */
    CHECKF(close_to(t, want, 1e-9), "%.9f s, want %.9f s", t, want);
    /* with latency: each of the C chunks pays the two links' latency once */
    c.tiers.latency_s = 5e-6;
    t = multicast(&c, SIM_MC_CHAIN, 1);
    want += c.model.layers * 2 * 5e-6;
    CHECKF(close_to(t, want, 1e-9), "%.9f s, want %.9f s", t, want);
}

TEST(chain_costs_one_transfer_plus_chunk_times)
{
    struct sim_config c;
    flat_cluster(&c, 16);
    double chunk = c.model.bytes / c.model.layers / c.tiers.nic_Bps;
    for (int n = 2; n <= 15; n += 13) {
        double t = multicast(&c, SIM_MC_CHAIN, n);
        double want = (c.model.layers + n - 1) * chunk;
        CHECKF(close_to(t, want, 1e-9), "chain of %d: %.9f s, want %.9f s", n, t, want);
        /* against N separate transfers from the source: about N times less */
        CHECKF(t < 0.2 * n * c.model.bytes / c.tiers.nic_Bps || n < 5, "chain of %d: %.3f s", n, t);
    }
}

TEST(binomial_pipeline_matches_formula)
{
    struct sim_config c;
    flat_cluster(&c, 17);
    double chunk = c.model.bytes / c.model.layers / c.tiers.nic_Bps;
    for (int d = 1; d <= 4; d++) {
        int n = 1 << d;
        double t = multicast(&c, SIM_MC_BINOMIAL, n);
        double want = (c.model.layers + d) * chunk;
        CHECKF(close_to(t, want, 1e-9), "binomial to %d: %.9f s, want (C + %d) chunks = %.9f s", n,
               t, d, want);
    }
}

/* λScale's pipeline to a group that is no power of two (3, 5, 6, 7) brings every receiver every
 * layer (sim_multicast_here checks k = L for each; a round in which nothing can move is skipped,
 * not the end), but slower than C + d rounds: a receiver whose hypercube partner is missing idles
 * in those rounds, so within 3 (C + d) (docs/simulator.md: λPipe's adaptive multicast is not
 * modelled, and this handicaps λScale on such groups). */
TEST(binomial_pipeline_to_any_group_completes)
{
    struct sim_config c;
    flat_cluster(&c, 9);
    double chunk = c.model.bytes / c.model.layers / c.tiers.nic_Bps;
    int groups[] = {3, 5, 6, 7};
    for (int g = 0; g < 4; g++) {
        int n = groups[g], d = 0;
        while ((1 << d) < n) d++;
        double t = multicast(&c, SIM_MC_BINOMIAL, n);
        CHECKF(t > 0 && t <= 3 * (c.model.layers + d) * chunk * (1 + 1e-9),
               "binomial to %d: %.6f s, bound 3 (C + d) chunks = %.6f s", n, t,
               3 * (c.model.layers + d) * chunk);
    }
}

struct run_out {
    int rc;
    char err[ERRMSG_LEN];
    struct sim_result r;
};

static void run_forked(const struct sim_config *c, const char *policy, struct run_out *o)
{
    struct sim_policy p;
    memset(o, 0, sizeof *o);
    if (sim_policy_by_name(policy, &p)) {
        o->rc = -1;
        snprintf(o->err, sizeof o->err, "no policy %s", policy);
        return;
    }
    o->rc = sim_run(c, &p, &o->r, NULL, o->err);
}

/* One instance, one sequence at a time, every request one step of D: an M/D/1 queue. With
 * 200,000 Poisson arrivals at rho = 0.5 the sample mean of the wait is within 3% of theory
 * (its standard error there is about 0.6%, autocorrelation included). */
TEST(md1_mean_wait_matches_theory)
{
    static struct sim_config c;
    sim_config_default(&c);
    c.type_gpus[0] = 1;
    c.gpus_per_server = 1;
    c.gpus_per_inst = 1;
    c.no_planner = 1;
    c.max_seqs = 1;
    const double D = 0.010, lambda = 50; /* mu = 100/s, rho = 0.5 */
    c.step_set[0] = 1;
    c.step[0] = (struct step_model){1e-12, 0, D - 1e-12, 1};
    char spec[128], err[ERRMSG_LEN];
    snprintf(spec, sizeof spec, "rps=%g,dur=4000,in=1,out=1", lambda);
    struct sim_request *req;
    int n;
    CHECKF(sim_synthetic(spec, 7, &req, &n, err) == 0, "%s", err);
    c.req = req;
    c.n_req = n;
    c.horizon_s = 4000;
    struct run_out o;
    run_forked(&c, "strata", &o);
    free(req);
    CHECKF(o.rc == 0, "%s", o.err);
    CHECK_EQ_INT(o.r.n_done, n);
    double rho = lambda * D, mu = 1 / D, wq = rho / (2 * mu * (1 - rho));
    double got = o.r.ttft_mean / 1000 - D;
    CHECKF(close_to(got, wq, 0.03), "mean wait %.6f s, theory %.6f s (%d requests)", got, wq, n);
}

TEST(deterministic_for_a_seed)
{
    static struct sim_config c;
    sim_config_default(&c);
    c.type_gpus[0] = 16;
    c.keep_alive_s = 5;
    struct sim_request *req;
    int n;
    char err[ERRMSG_LEN];
    CHECKF(sim_synthetic("rps=10,dur=40,burst=60,at=10,len=8,in=512,out=64", 3, &req, &n, err) == 0,
           "%s", err);
    c.req = req;
    c.n_req = n;
    c.horizon_s = 40;
    c.failures[0] = (struct sim_failure){12, -1};
    c.n_failures = 1;
    struct run_out a, b;
    run_forked(&c, "strata", &a);
    run_forked(&c, "strata", &b);
    CHECKF(a.rc == 0, "%s", a.err);
    CHECKF(b.rc == 0, "%s", b.err);
    CHECK(a.r.scaleouts > 0); /* the burst made it scale */
    a.r.wall_s = b.r.wall_s = 0;
    CHECK(memcmp(&a.r, &b.r, sizeof a.r) == 0);
    /* another seed: other arrivals, other figures */
    free(req);
    CHECK(sim_synthetic("rps=10,dur=40,burst=60,at=10,len=8,in=512,out=64", 4, &req, &n, err) == 0);
    c.req = req;
    c.n_req = n;
    run_forked(&c, "strata", &b);
    free(req);
    CHECK(b.rc == 0);
    CHECK(b.r.ttft_p99 != a.r.ttft_p99 || b.r.n_req != a.r.n_req);
}

TEST(trace_parser_windows_and_rate)
{
    const char *t = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    "2023-11-16 18:17:03.5,100,10\n"
                    "2023-11-16 18:17:04.5,200,20\n"
                    "2023-11-16 18:17:07.5,300,30\n"
                    "2023-11-16 18:18:03.5,400,40\n";
    struct sim_request *r;
    int n;
    char err[ERRMSG_LEN];
    CHECKF(sim_trace_parse(t, strlen(t), 1, 0, 0, &r, &n, err) == 0, "%s", err);
    CHECK_EQ_INT(n, 4);
    CHECK(fabs(r[3].t - 60) < 1e-9 && r[3].in == 400 && r[3].out == 40);
    free(r);
    /* window from second 1, 3 simulated seconds at rate 2: trace seconds [1, 7) */
    CHECKF(sim_trace_parse(t, strlen(t), 2, 1, 3, &r, &n, err) == 0, "%s", err);
    CHECK_EQ_INT(n, 2);
    CHECK(fabs(r[0].t - 0) < 1e-9 && r[0].in == 200);
    CHECK(fabs(r[1].t - 1.5) < 1e-9 && r[1].in == 300);
    free(r);
    CHECK(sim_trace_parse("x,y\n1,2\n", 8, 1, 0, 0, &r, &n, err) == -1);
    const char *bad = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.5,100\n";
    CHECK(sim_trace_parse(bad, strlen(bad), 1, 0, 0, &r, &n, err) == -1);
    CHECK(strstr(err, "line 2") != NULL);
}

/* The live namespaces setup of tests/bench/sim_validate.sh, as a config: two CPU nodes, the
 * TinyLlama-shape spans (header with the embedding), 256 KiB chunks, no latency. */
static const char *live_conf = "gpus = CPU:4\ngpus_per_server = 1\ngpus_per_inst = 1\n"
                               "model_spans = 37516416,24788992x22,36872192\n"
                               "chunk_bytes = 262144\nnic_gbps = 0.62\nlatency_us = 0\n"
                               "step = CPU:0.0125,0.001,0.035\nmax_seqs = 8\n"
                               "max_step_tokens = 64\nplanner = off\nsend_to = 1\n";

/* A chain of N through chunked spans: every hop a link of the same rate, each chunk forwarded as
 * it lands, so the last joiner completes one chunk per extra hop after one transfer:
 * bytes / rate + (N - 1) x the largest chunk / rate. */
TEST(chunked_chain_costs_one_transfer_plus_a_chunk_per_hop)
{
    static struct sim_config c;
    char err[ERRMSG_LEN];
    for (int n = 1; n <= 3; n++) {
        sim_config_default(&c);
        CHECKF(sim_config_parse(&c, live_conf, err) == 0, "%s", err);
        char so[64];
        snprintf(so, sizeof so, "scaleout = 0:0:%s\n", n == 1 ? "1" : n == 2 ? "1,2" : "1,2,3");
        CHECKF(sim_config_parse(&c, so, err) == 0, "%s", err);
        CHECK_EQ_INT(c.model.layers, 24);
        CHECK(c.model.bytes == 37516416.0 + 22 * 24788992.0 + 36872192.0);
        struct run_out o;
        run_forked(&c, "strata-stop-the-world", &o);
        CHECKF(o.rc == 0, "%s", o.err);
        double rate = 0.62e9 / 8, want = (c.model.bytes + (n - 1) * 262144.0) / rate;
        CHECKF(close_to(o.r.so_max_s, want, 1e-9), "chain of %d: %.9f s, want %.9f s", n,
               o.r.so_max_s, want);
    }
}

/* A fixed scale-out at t = 0 with a request held for the joiner: live, it is served once the
 * first span (live_min_layers = 1) has landed, in one step of the step model; stop-the-world,
 * once every span has. */
TEST(fixed_scaleout_serves_from_the_first_span)
{
    static struct sim_config c;
    char err[ERRMSG_LEN];
    sim_config_default(&c);
    CHECKF(sim_config_parse(&c, live_conf, err) == 0, "%s", err);
    CHECKF(sim_config_parse(&c, "scaleout = 0:0:1\nlive_min_layers = 1\n", err) == 0, "%s", err);
    const char *reqs = "seconds,in,out\n0.025,11,1 # the burst's arrival\n";
    struct sim_request *req;
    int n;
    CHECKF(sim_requests_parse(reqs, strlen(reqs), &req, &n, err) == 0, "%s", err);
    CHECK_EQ_INT(n, 1);
    c.req = req;
    c.n_req = n;
    c.horizon_s = req[0].t;
    double rate = 0.62e9 / 8, step = 0.0125 * 11 + 0.001 + 0.035;
    struct run_out o;
    run_forked(&c, "strata", &o);
    CHECKF(o.rc == 0, "%s", o.err);
    double want = 37516416.0 / rate + step;
    CHECKF(close_to(o.r.first_token_s, want, 1e-9), "live: %.9f s, want %.9f s", o.r.first_token_s,
           want);
    CHECKF(close_to(o.r.ttft_p50, (want - 0.025) * 1000, 1e-9), "live TTFT %.6f ms", o.r.ttft_p50);
    run_forked(&c, "strata-stop-the-world", &o);
    CHECKF(o.rc == 0, "%s", o.err);
    want = c.model.bytes / rate + step;
    CHECKF(close_to(o.r.first_token_s, want, 1e-9), "stop-the-world: %.9f s, want %.9f s",
           o.r.first_token_s, want);
    /* a source that does not hold the model is an error that says so */
    CHECKF(sim_config_parse(&c, "scaleout = 1:2:3\n", err) == 0, "%s", err);
    run_forked(&c, "strata", &o);
    CHECK(o.rc == -1 && strstr(o.err, "instance 2 does not hold the model"));
    free(req); /* the config points into it until here */
}

TEST(requests_parser)
{
    struct sim_request *r;
    int n;
    char err[ERRMSG_LEN];
    const char *ok = "# burst\nseconds,in,out\n0,5,8\n0.5,11,8\n\n";
    CHECKF(sim_requests_parse(ok, strlen(ok), &r, &n, err) == 0, "%s", err);
    CHECK_EQ_INT(n, 2);
    CHECK(r[1].t == 0.5 && r[1].in == 11 && r[1].out == 8);
    free(r);
    const char *bad[] = {"",
                         "t,in,out\n0,1,1\n",
                         "seconds,in,out\n0,0,1\n",
                         "seconds,in,out\n1,1,1\n0,1,1\n",
                         "seconds,in,out\nnan,1,1\n",
                         "seconds,in,out\n0,1,1,1\n"};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        err[0] = 0;
        CHECKF(sim_requests_parse(bad[k], strlen(bad[k]), &r, &n, err) == -1, "accepted %zu", k);
        CHECK(err[0] != 0);
    }
    CHECK(strstr(err, "line 2") != NULL);
}

TEST(config_settings)
{
    static struct sim_config c;
    char err[ERRMSG_LEN];
    sim_config_default(&c);
    CHECKF(sim_config_parse(&c,
                            "# three nodes\ngpus = H100:2, A100:1\nmodel = 13B\nnet = rdma200\n"
                            "step = A100:0.0001,0.0002,0.01\nfail = 30:holder\n",
                            err) == 0,
           "%s", err);
    CHECK_EQ_INT(c.n_types, 2);
    CHECK_EQ_INT(c.type_gpus[1], 1);
    CHECK(c.tiers.nic_Bps == 25e9);
    CHECK(c.step_set[1] && c.step[1].c == 0.01);
    CHECK_EQ_INT(c.n_failures, 1);
    CHECK_EQ_INT(c.failures[0].inst, -1);
    CHECK(sim_config_parse(&c, "gpus = B200:3\n", err) == -1);
    CHECK(strstr(err, "line 1") && strstr(err, "B200"));
    CHECK(sim_config_parse(&c, "nic_gbps = -5\n", err) == -1);
    CHECK(sim_config_parse(&c, "scaleout = 0:1:1\n", err) == -1 && strstr(err, "own source"));
    CHECK(sim_config_parse(&c, "scaleout = 0:0:1,1\n", err) == -1 && strstr(err, "twice"));
    CHECK(sim_config_parse(&c, "scaleout = 0:0:\n", err) == -1);
    CHECK(sim_config_parse(&c, "planner = maybe\n", err) == -1);
    CHECK(sim_config_parse(&c, "model_spans = 100x0\n", err) == -1);
    CHECK(sim_config_parse(&c, "model_spans = 10,20x3\nadmit_step = H100:0.0001,0,0.001\n", err) ==
          0);
    CHECK(c.n_spans == 4 && c.model.layers == 4 && c.model.bytes == 70 && c.admit_set[0]);
    CHECK(sim_config_parse(&c, "plan_step = H100:0.0002,0.00004,0\nreplicas_cached = 1\n", err) ==
          0);
    CHECK(c.plan_set[0] && c.plan_step[0].a == 0.0002 && c.plan_step[0].c == 0 &&
          c.replicas_cached == 1);
    CHECK(sim_config_parse(&c, "plan_step = CPU:0.0002,0,0\n", err) == -1 && strstr(err, "CPU"));
    CHECK(sim_config_parse(&c, "replicas_cached = -1\n", err) == -1);
    CHECK(sim_config_parse(&c, "servers_per_rack = 4\n", err) == 0 && c.servers_per_rack == 4);
    CHECK(sim_config_parse(&c, "servers_per_rack = -1\n", err) == -1);
    CHECK(sim_config_parse(&c, "model = 7B\n", err) == 0 && c.n_spans == 0);
}

/* plan_step: the planner predicts with it while steps take `step` (a live node whose steps are
 * padded after timing). 40 prompts of 100 tokens at t = 0 take 4 s to prefill at 1 ms a token,
 * past the 1 s SLO: the planner scales out; told 0.1 ms a token it sees 0.4 s and does not, and
 * the requests still wait the real steps. replicas_cached = 1: strata keeps no host copy on the
 * empty node, so its scale-out crosses the 1 MB/s link (4 s), where R = 2 loads it from its own
 * host memory. */
TEST(planner_predicts_with_plan_step_and_keeps_r_copies)
{
    static struct sim_config c;
    char err[ERRMSG_LEN];
    static struct sim_request req[40];
    for (int i = 0; i < 40; i++) req[i] = (struct sim_request){0, 100, 4};
    const char *base =
        "gpus = CPU:2\ngpus_per_server = 1\ngpus_per_inst = 1\n"
        "model_spans = 1000000x4\nnic_gbps = 0.008\nlatency_us = 0\nstep = CPU:0.001,0,0.04\n"
        "max_seqs = 8\nmax_step_tokens = 256\nttft_floor_ms = 1000\n"
        "ttft_per_tok_ms = 0\ntbt_slo_ms = 200\ninitial = 1\n";
    struct run_out o[4];
    for (int k = 0; k < 4; k++) {
        sim_config_default(&c);
        CHECKF(sim_config_parse(&c, base, err) == 0, "%s", err);
        if (k == 1)
            CHECKF(sim_config_parse(&c, "plan_step = CPU:0.0001,0,0\n", err) == 0, "%s", err);
        if (k == 2) CHECKF(sim_config_parse(&c, "replicas_cached = 1\n", err) == 0, "%s", err);
        if (k == 3) CHECKF(sim_config_parse(&c, "replicas_cached = 2\n", err) == 0, "%s", err);
        c.req = req;
        c.n_req = 40;
        c.horizon_s = 1;
        run_forked(&c, "strata-reactive", &o[k]); /* the trigger alone, no forecast */
        CHECKF(o[k].rc == 0, "%s", o[k].err);
    }
    CHECKF(o[0].r.scaleouts >= 1, "%d scale-outs at 1 ms a token", o[0].r.scaleouts);
    CHECKF(o[1].r.scaleouts == 0, "%d scale-outs predicting 0.1 ms a token", o[1].r.scaleouts);
    CHECKF(o[1].r.ttft_p99 > 3000, "TTFT P99 %.0f ms with one node", o[1].r.ttft_p99);
    CHECKF(o[2].r.scaleouts >= 1 && close_to(o[2].r.so_max_s, 4.0, 1e-6),
           "R = 1: %d scale-outs, the longest %.6f s, want 4 s over the link", o[2].r.scaleouts,
           o[2].r.so_max_s);
    CHECKF(o[3].r.scaleouts >= 1 && o[3].r.so_max_s < 0.1,
           "R = 2: the longest scale-out %.6f s, want a host-memory load", o[3].r.so_max_s);
}

int main(void)
{
    RUN(one_transfer_takes_size_over_bandwidth);
    RUN(chain_costs_one_transfer_plus_chunk_times);
    RUN(binomial_pipeline_matches_formula);
    RUN(binomial_pipeline_to_any_group_completes);
    RUN(md1_mean_wait_matches_theory);
    RUN(deterministic_for_a_seed);
    RUN(trace_parser_windows_and_rate);
    RUN(config_settings);
    RUN(requests_parser);
    RUN(chunked_chain_costs_one_transfer_plus_a_chunk_per_hop);
    RUN(fixed_scaleout_serves_from_the_first_span);
    RUN(planner_predicts_with_plan_step_and_keeps_r_copies);
    CHECK_DONE();
}
