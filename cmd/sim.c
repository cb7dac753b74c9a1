/* strata sim: replay a trace (or synthetic bursts) on a simulated cluster under several
 * scale-out policies side by side, with the cluster's own planner deciding. */
#include "cluster/planner.h"
#include "cluster/sim/sim.h"
#include "cluster/sim/sim_report.h"
#include "os/common/errmsg.h"
#include "cmd/commands.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void usage(void)
{
    fprintf(
        stderr,
        "usage: strata sim (--trace FILE | --synthetic SPEC | --requests FILE) [--rate X]\n"
        "                  [--window START:DUR]\n"
        "                  [--policy P]... [--config FILE] [--out DIR] [--quiet] [--KEY VALUE]...\n"
        "  --trace FILE      Azure LLM trace CSV (TIMESTAMP,ContextTokens,GeneratedTokens)\n"
        "  --synthetic SPEC  Poisson arrivals: rps=R,dur=S[,burst=R2,at=T,len=D][,in=N][,out=M]\n"
        "  --requests FILE   exact arrivals: CSV \"seconds,in,out\", one request per line\n"
        "  --rate X          replay X times the trace's traffic (default 1)\n"
        "  --window S:D      D simulated seconds from trace second S (default 0:300)\n"
        "  --policy P        one of: stop-the-world serverlessllm serverlessllm-allcache\n"
        "                    lambdascale blitzscale\n"
        "                    strata strata-nomatrix (default: all, side by side);\n"
        "                    by name only: strata-stop-the-world (the chain, no live serving)\n"
        "  --config FILE     key = value lines (cluster, tiers, SLOs, step models, failures)\n"
        "  --out DIR         CSV files and PNG charts (gnuplot) there\n"
        "  --KEY VALUE       any config key, e.g. --gpus H100:128,A100:128 --model 70B\n"
        "                    --net rdma200 --fail 60:holder --seed 7 (docs/simulator.md)\n");
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

static int run_sim(int argc, char **argv)
{
    static struct sim_config c; /* large; one per process */
    sim_config_default(&c);
    char err[ERRMSG_LEN];
    const char *trace = NULL, *synth = NULL, *reqf = NULL, *out = NULL, *pol[16];
    int n_pol = 0, quiet = 0;
    double rate = 1, w_start = 0, w_dur = 300;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            return 0;
        }
        if (!strcmp(a, "--quiet")) {
            quiet = 1;
            continue;
        }
        if (strncmp(a, "--", 2) || !v) {
            fprintf(stderr, "strata sim: %s: %s\n", a, v ? "unknown argument" : "needs a value");
            usage();
            return 2;
        }
        i++;
        if (!strcmp(a, "--trace"))
            trace = v;
        else if (!strcmp(a, "--synthetic"))
            synth = v;
        else if (!strcmp(a, "--requests"))
            reqf = v;
        else if (!strcmp(a, "--out"))
            out = v;
        else if (!strcmp(a, "--rate")) {
            char *e;
            rate = strtod(v, &e);
            if (*e || !(rate > 0 && rate < 1e4)) {
                fprintf(stderr, "strata sim: --rate %s: want a number > 0\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--window")) {
            if (sscanf(v, "%lf:%lf", &w_start, &w_dur) != 2 || w_start < 0 || !(w_dur > 0)) {
                fprintf(stderr, "strata sim: --window %s: want START:DURATION seconds\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--policy")) {
            struct sim_policy p;
            if (sim_policy_by_name(v, &p) || n_pol >= 16) {
                fprintf(stderr, "strata sim: --policy %s: unknown (or too many)\n", v);
                return 2;
            }
            pol[n_pol++] = v;
        } else if (!strcmp(a, "--config")) {
            if (sim_config_load(&c, v, err)) {
                fprintf(stderr, "strata sim: %s\n", err);
                return 2;
            }
        } else {
            char key[64];
            snprintf(key, sizeof key, "%s", a + 2);
            for (char *k = key; *k; k++)
                if (*k == '-') *k = '_';
            if (sim_config_set(&c, key, v, err)) {
                fprintf(stderr, "strata sim: %s\n", err);
                return 2;
            }
        }
    }
    if (!!trace + !!synth + !!reqf != 1) {
        fprintf(stderr,
                "strata sim: give one of --trace FILE, --synthetic SPEC or --requests FILE\n");
        usage();
        return 2;
    }
    struct sim_request *req;
    int n_req;
    if (trace  ? sim_trace_load(trace, rate, w_start, w_dur, &req, &n_req, err)
        : reqf ? sim_requests_load(reqf, &req, &n_req, err)
               : sim_synthetic(synth, c.seed, &req, &n_req, err)) {
        fprintf(stderr, "strata sim: %s\n", err);
        return 1;
    }
    c.req = req;
    c.n_req = n_req;
    c.horizon_s = trace ? w_dur : (n_req ? req[n_req - 1].t : 1);
    c.progress = !quiet;
    if (n_pol == 0)
        for (; sim_policy_names[n_pol]; n_pol++) pol[n_pol] = sim_policy_names[n_pol];
    if (out && mkdir_p(out, err)) {
        fprintf(stderr, "strata sim: --out: %s\n", err);
        return 1;
    }
    int gpus = 0;
    for (int t = 0; t < c.n_types; t++) gpus += c.type_gpus[t];
    printf("strata sim: %s, %d requests over %.0f s (%.2f req/s), %s on %d GPUs (",
           trace ? trace : (reqf ? reqf : synth), n_req, c.horizon_s,
           n_req / (c.horizon_s > 0 ? c.horizon_s : 1), c.model.name, gpus);
    for (int t = 0; t < c.n_types; t++)
        printf("%s%s x%d", t ? ", " : "", c.types[t].name, c.type_gpus[t]);
    printf("), NIC %.0f Gb/s/GPU, seed %u\n", c.tiers.nic_Bps * 8 / 1e9, c.seed);
    struct sim_result res[16];
    int n_res = 0;
    for (int k = 0; k < n_pol; k++) {
        struct sim_policy p;
        sim_policy_by_name(pol[k], &p);
        char tl[4200];
        if (out) snprintf(tl, sizeof tl, "%s/timeline_%s.csv", out, p.name);
        if (!quiet) fprintf(stderr, "sim: %s: running\n", p.name);
        if (sim_run(&c, &p, &res[n_res], out ? tl : NULL, err)) {
            fprintf(stderr, "strata sim: %s\n", err);
            free(req);
            return 1;
        }
        if (!quiet)
            fprintf(stderr, "sim: %s: %.2f s wall, %ld events\n", p.name, res[n_res].wall_s,
                    res[n_res].events);
        n_res++;
    }
    sim_report_table(stdout, res, n_res);
    double fp[4] = {c.fail_prob, c.fail_prob, c.fail_prob, c.fail_prob};
    printf("host-copy loss probability (node failure probability %g): R=1 %.3g, R=2 %.3g, "
           "R=3 %.3g\n",
           c.fail_prob, planner_loss_probability(fp, 1), planner_loss_probability(fp, 2),
           planner_loss_probability(fp, 3));
    const struct sim_result *with = NULL, *without = NULL;
    for (int k = 0; k < n_res; k++) {
        if (!strcmp(res[k].policy, "strata")) with = &res[k];
        if (!strcmp(res[k].policy, "strata-nomatrix")) without = &res[k];
    }
    if (with && without)
        printf("heterogeneity: placement by the throughput matrix vs ignoring it: SLO "
               "attainment %.1f%% vs %.1f%%, p99 TTFT %.0f vs %.0f ms, GPU-s %.0f vs %.0f, "
               "cost $%.2f vs $%.2f\n",
               100 * with->attainment, 100 * without->attainment, with->ttft_p99, without->ttft_p99,
               with->gpu_s, without->gpu_s, with->cost_usd, without->cost_usd);
    free(req);
    if (out) {
        if (sim_report_csv(out, res, n_res, err)) {
            fprintf(stderr, "strata sim: %s\n", err);
            return 1;
        }
        if (n_req == 0) { /* scale-outs only (a requests file with none): nothing to chart */
            printf("wrote %s/summary.csv, ttft_cdf.csv, timeline_*.csv (no requests: no charts)\n",
                   out);
            return 0;
        }
        if (sim_report_plots(out, res, n_res, err)) {
            fprintf(stderr, "strata sim: %s\n", err);
            return 1;
        }
        printf("wrote %s/summary.csv, ttft_cdf.csv, timeline_*.csv, ttft_cdf.png, "
               "slo_timeline.png, gpu_time.png\n",
               out);
    }
    return 0;
}

const struct command cmd_sim = {"sim", run_sim,
                                "sim (--trace FILE | --synthetic SPEC) [options]  (the cluster "
                                "simulator: policies side by side)"};
