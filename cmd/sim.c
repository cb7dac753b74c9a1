/* strata sim: replay a trace (or synthetic bursts, or exact arrivals) on a simulated cluster under
 * several scaling policies side by side, each over several seeds (medians and their spread), and
 * write the table, CSV files and charts. The command line is cmd/options.h's: the command's own
 * options, then every simulator setting as --KEY VALUE (underscores or dashes). */
#include "cluster/planner.h"
#include "cluster/sim/sim.h"
#include "cluster/sim/sim_report.h"
#include "cmd/commands.h"
#include "cmd/options.h"
#include "os/common/errmsg.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_POLICIES 16
#define MAX_KEYS     64

struct sim_opts {
    const char *trace, *synth, *reqf, *out;
    struct opt_list policy;
    double rate, w_start, w_dur;
    int quiet, help, seeds, no_charts;
};

/* A --KEY option: the config and which key it sets. */
struct key_opt {
    struct sim_config *c;
    const char *key;
};

static int set_key(const char *value, void *dst, char *err)
{
    const struct key_opt *k = dst;
    return sim_config_set(k->c, k->key, value, err);
}

static int load_config(const char *value, void *dst, char *err)
{
    return sim_config_load(dst, value, err);
}

static int parse_window(const char *v, void *dst, char *err)
{
    struct sim_opts *o = dst;
    if (sscanf(v, "%lf:%lf", &o->w_start, &o->w_dur) != 2 || o->w_start < 0 || !(o->w_dur > 0))
        return errmsg_set(err, "--window %s: want START:DURATION seconds", v);
    return 0;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: strata sim (--trace FILE | --synthetic SPEC | --requests FILE) [--rate X]\n"
            "                  [--window START:DUR] [--policy P]... [--seeds N] [--config FILE]\n"
            "                  [--out DIR [--no-charts]] [--quiet] [--KEY VALUE]...\n"
            "  --trace FILE      Azure LLM trace CSV (TIMESTAMP,ContextTokens,GeneratedTokens)\n"
            "  --synthetic SPEC  Poisson arrivals: rps=R,dur=S[,burst=R2,at=T,len=D[,ramp=U]\n"
            "                    [,every=P]][,in=N][,out=M]\n"
            "  --requests FILE   exact arrivals: CSV \"seconds,in,out\", one request per line\n"
            "  --rate X          replay X times the trace's traffic (default 10)\n"
            "  --window S:D      D simulated seconds from trace second S (default 0:300)\n"
            "  --policy P        default, side by side: fixed stop-the-world serverlessllm\n"
            "                    lambdascale blitzscale tokenscale strata; by name also:\n"
            "                    serverlessllm-allcache strata-reactive strata-nomatrix\n"
            "                    strata-stop-the-world\n"
            "  --seeds N         runs per policy, seeds S..S+N-1 (default 5; S = --seed, 1):\n"
            "                    each shuffles the instance ids (and draws synthetic arrivals)\n"
            "  --config FILE     key = value lines (cluster, tiers, SLOs, step models, failures)\n"
            "  --out DIR         CSV files and PNG charts (gnuplot) there\n"
            "  --no-charts       the CSV files only (no gnuplot run)\n"
            "  --KEY VALUE       any config key, e.g. --gpus H100:128,A100:128 --model 70B\n"
            "                    --net rdma200 --fail 60:holder --seed 7 (docs/simulator.md);\n"
            "                    defaults: 32 H100, 13B\n");
}

static int mkdir_p(const char *dir, char *err)
{
    char p[4096];
    if (strlen(dir) >= sizeof p) return errmsg_set(err, "%s: path too long", dir);
    strcpy(p, dir);
    for (char *s = p + 1; *s; s++)
        if (*s == '/') {
            *s = 0;
            if (mkdir(p, 0755) && errno != EEXIST)
                return errmsg_set(err, "%s: %s", p, strerror(errno));
            *s = '/';
        }
    if (mkdir(p, 0755) && errno != EEXIST) return errmsg_set(err, "%s: %s", p, strerror(errno));
    return 0;
}

/* The options table: the command's own, then --KEY (and --KEY-WITH-DASHES) per config key. */
static int options(struct sim_opts *o, struct sim_config *c, struct opt *t, struct key_opt *keys,
                   char (*dashed)[48])
{
    int n = 0;
    t[n++] = (struct opt){"--trace", OPT_STR, &o->trace, 0, 0, NULL, "FILE"};
    t[n++] = (struct opt){"--synthetic", OPT_STR, &o->synth, 0, 0, NULL, "SPEC"};
    t[n++] = (struct opt){"--requests", OPT_STR, &o->reqf, 0, 0, NULL, "FILE"};
    t[n++] = (struct opt){"--rate", OPT_DOUBLE, &o->rate, 1e-6, 1e4, NULL, "X"};
    t[n++] = (struct opt){"--window", OPT_PARSE, o, 0, 0, parse_window, "S:D"};
    t[n++] = (struct opt){"--policy", OPT_LIST, &o->policy, 0, 0, NULL, "P"};
    t[n++] = (struct opt){"--seeds", OPT_INT, &o->seeds, 1, SIM_MAX_SEEDS, NULL, "N"};
    t[n++] = (struct opt){"--config", OPT_PARSE, c, 0, 0, load_config, "FILE"};
    t[n++] = (struct opt){"--out", OPT_STR, &o->out, 0, 0, NULL, "DIR"};
    t[n++] = (struct opt){"--quiet", OPT_FLAG, &o->quiet, 0, 0, NULL, NULL};
    t[n++] = (struct opt){"--no-charts", OPT_FLAG, &o->no_charts, 0, 0, NULL, NULL};
    t[n++] = (struct opt){"--help", OPT_FLAG, &o->help, 0, 0, NULL, NULL};
    t[n++] = (struct opt){"-h", OPT_FLAG, &o->help, 0, 0, NULL, NULL};
    for (int k = 0; sim_config_keys[k] && k < MAX_KEYS; k++) {
        keys[k] = (struct key_opt){c, sim_config_keys[k]};
        snprintf(dashed[2 * k], 48, "--%s", sim_config_keys[k]);
        snprintf(dashed[2 * k + 1], 48, "--%s", sim_config_keys[k]);
        for (char *p = dashed[2 * k + 1] + 2; *p; p++)
            if (*p == '_') *p = '-';
        t[n++] = (struct opt){dashed[2 * k], OPT_PARSE, &keys[k], 0, 0, set_key, "V"};
        if (strcmp(dashed[2 * k], dashed[2 * k + 1]))
            t[n++] = (struct opt){dashed[2 * k + 1], OPT_PARSE, &keys[k], 0, 0, set_key, "V"};
    }
    return n;
}

static int load_requests(const struct sim_opts *o, unsigned seed, struct sim_request **req, int *n,
                         char *err)
{
    if (o->trace) return sim_trace_load(o->trace, o->rate, o->w_start, o->w_dur, req, n, err);
    if (o->reqf) return sim_requests_load(o->reqf, req, n, err);
    return sim_synthetic(o->synth, seed, req, n, err);
}

/* Every policy over every seed; the median run's timeline becomes timeline_<policy>.csv. */
static int run_all(const struct sim_opts *o, struct sim_config *c, const char *const *pol,
                   int n_pol, struct sim_summary *sum, char *err)
{
    unsigned seed0 = c->seed;
    for (int k = 0; k < n_pol; k++) {
        struct sim_policy p;
        sim_policy_by_name(pol[k], &p);
        struct sim_summary *s = &sum[k];
        memset(s, 0, sizeof *s);
        snprintf(s->policy, sizeof s->policy, "%s", p.name);
        char tl[SIM_MAX_SEEDS][4200];
        for (int r = 0; r < o->seeds; r++) {
            struct sim_request *req;
            int n_req;
            c->seed = seed0 + (unsigned)r;
            if (load_requests(o, c->seed, &req, &n_req, err)) return -1;
            c->req = req;
            c->n_req = n_req;
            c->horizon_s = o->trace ? o->w_dur : (n_req ? req[n_req - 1].t : 1);
            if (o->out)
                snprintf(tl[r], sizeof tl[r], "%s/timeline_%s.seed%u.csv", o->out, p.name, c->seed);
            if (!o->quiet) fprintf(stderr, "sim: %s seed %u: running\n", p.name, c->seed);
            int rc = sim_run(c, &p, &s->runs[r], o->out ? tl[r] : NULL, err);
            free(req);
            c->req = NULL;
            if (rc) return -1;
            s->seeds[r] = c->seed;
            s->n_runs++;
            if (!o->quiet)
                fprintf(stderr, "sim: %s seed %u: %.2f s wall, %ld events\n", p.name, c->seed,
                        s->runs[r].wall_s, s->runs[r].events);
        }
        sim_summarize(s);
        if (o->out)
            for (int r = 0; r < s->n_runs; r++) {
                char final[4200];
                snprintf(final, sizeof final, "%s/timeline_%s.csv", o->out, p.name);
                if (r == s->median_run)
                    rename(tl[r], final);
                else
                    remove(tl[r]);
            }
    }
    c->seed = seed0;
    return 0;
}

static void print_header(const struct sim_opts *o, const struct sim_config *c, int n_req,
                         double horizon)
{
    int gpus = 0;
    for (int t = 0; t < c->n_types; t++) gpus += c->type_gpus[t];
    printf("strata sim: %s, %d requests over %.0f s (%.2f req/s), %s on %d GPUs (",
           o->trace ? o->trace : (o->reqf ? o->reqf : o->synth), n_req, horizon,
           n_req / (horizon > 0 ? horizon : 1), c->model.name, gpus);
    for (int t = 0; t < c->n_types; t++)
        printf("%s%s x%d", t ? ", " : "", c->types[t].name, c->type_gpus[t]);
    printf("), NIC %.0f Gb/s/GPU, seeds %u..%u\n", c->tiers.nic_Bps * 8 / 1e9, c->seed,
           c->seed + (unsigned)o->seeds - 1);
}

static void print_notes(const struct sim_config *c, const struct sim_summary *s, int n)
{
    double fp[4] = {c->fail_prob, c->fail_prob, c->fail_prob, c->fail_prob};
    printf("host-copy loss probability (node failure probability %g): R=1 %.3g, R=2 %.3g, "
           "R=3 %.3g\n",
           c->fail_prob, planner_loss_probability(fp, 1), planner_loss_probability(fp, 2),
           planner_loss_probability(fp, 3));
    const struct sim_result *strata = NULL, *blitz = NULL;
    for (int k = 0; k < n; k++) {
        if (!strcmp(s[k].policy, "strata")) strata = &s[k].med;
        if (!strcmp(s[k].policy, "blitzscale")) blitz = &s[k].med;
    }
    if (strata && blitz && blitz->ttft_p99 > 0 && blitz->gpu_s > 0)
        printf("strata vs blitzscale (medians): P99 TTFT %+.1f%%, SLO attainment %+.1f points, "
               "GPU-seconds %+.1f%%\n",
               100 * (strata->ttft_p99 / blitz->ttft_p99 - 1),
               100 * (strata->attainment - blitz->attainment),
               100 * (strata->gpu_s / blitz->gpu_s - 1));
}

static int run_sim(int argc, char **argv)
{
    static struct sim_config c; /* large; one per process */
    static struct sim_summary sum[MAX_POLICIES];
    sim_config_default(&c);
    sim_model_by_name("13B", &c.model); /* scaling shows on the defaults (32 H100, rate 10) */
    struct sim_opts o = {.rate = 10, .w_dur = 300, .seeds = 5};
    static struct opt t[16 + 2 * MAX_KEYS];
    static struct key_opt keys[MAX_KEYS];
    static char dashed[2 * MAX_KEYS][48];
    int n_opt = options(&o, &c, t, keys, dashed);
    char err[ERRMSG_LEN];
    if (opts_parse(t, n_opt, argc, argv, err)) {
        fprintf(stderr, "strata sim: %s\n", err);
        usage();
        return 2;
    }
    if (o.help) {
        usage();
        return 0;
    }
    if (!!o.trace + !!o.synth + !!o.reqf != 1) {
        fprintf(stderr,
                "strata sim: give one of --trace FILE, --synthetic SPEC or --requests FILE\n");
        usage();
        return 2;
    }
    const char *pol[MAX_POLICIES];
    int n_pol = 0;
    for (int k = 0; k < o.policy.n; k++) {
        struct sim_policy p;
        if (sim_policy_by_name(o.policy.v[k], &p) || n_pol >= MAX_POLICIES) {
            fprintf(stderr, "strata sim: --policy %s: unknown (or too many)\n", o.policy.v[k]);
            return 2;
        }
        pol[n_pol++] = o.policy.v[k];
    }
    if (n_pol == 0)
        for (; sim_policy_names[n_pol]; n_pol++) pol[n_pol] = sim_policy_names[n_pol];
    struct sim_request *req;
    int n_req;
    if (load_requests(&o, c.seed, &req, &n_req, err)) { /* checks the input before any run */
        fprintf(stderr, "strata sim: %s\n", err);
        return 1;
    }
    double horizon = o.trace ? o.w_dur : (n_req ? req[n_req - 1].t : 1);
    free(req);
    c.progress = !o.quiet;
    if (o.out && mkdir_p(o.out, err)) {
        fprintf(stderr, "strata sim: --out: %s\n", err);
        return 1;
    }
    print_header(&o, &c, n_req, horizon);
    if (run_all(&o, &c, pol, n_pol, sum, err)) {
        fprintf(stderr, "strata sim: %s\n", err);
        return 1;
    }
    sim_report_table(stdout, sum, n_pol);
    print_notes(&c, sum, n_pol);
    if (!o.out) return 0;
    if (sim_report_csv(o.out, sum, n_pol, err)) {
        fprintf(stderr, "strata sim: %s\n", err);
        return 1;
    }
    if (o.no_charts) {
        printf("wrote %s/summary.csv, runs.csv, ttft_cdf.csv, timeline_*.csv (--no-charts)\n",
               o.out);
        return 0;
    }
    if (n_req == 0) { /* scale-outs only (a requests file with none): nothing to chart */
        printf("wrote %s/summary.csv, runs.csv, ttft_cdf.csv, timeline_*.csv (no requests: no "
               "charts)\n",
               o.out);
        return 0;
    }
    if (sim_report_plots(o.out, sum, n_pol, err)) {
        fprintf(stderr, "strata sim: %s\n", err);
        return 1;
    }
    printf("wrote %s/summary.csv, runs.csv, ttft_cdf.csv, timeline_*.csv, ttft_cdf.png, "
           "slo_timeline.png, metrics.png, tpot.png, gpu_time.png\n",
           o.out);
    return 0;
}

const struct command cmd_sim = {"sim", run_sim,
                                "sim (--trace FILE | --synthetic SPEC) [options]  (the cluster "
                                "simulator: policies side by side)"};
