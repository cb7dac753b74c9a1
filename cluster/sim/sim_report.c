/* sim_report: medians over seeds, the table, the CSV files and the gnuplot charts; see the
 * header. */
#include "cluster/sim/sim_report.h"

#include "os/common/errmsg.h"

#include <errno.h>
#include <spawn.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

extern char **environ;

/* ---- medians ---- */

#define DBL(f)                                                                                     \
    {                                                                                              \
        offsetof(struct sim_result, f), 'd'                                                        \
    }
#define INT(f)                                                                                     \
    {                                                                                              \
        offsetof(struct sim_result, f), 'i'                                                        \
    }
static const struct {
    size_t off;
    char type;
} fields[] = {
    DBL(ttft_p50),         DBL(ttft_p90),      DBL(ttft_p99),        DBL(ttft_mean),
    DBL(tbt_p50),          DBL(tbt_p90),       DBL(tbt_p99),         DBL(tpot_p50),
    DBL(tpot_p99),         DBL(attainment),    DBL(goodput_rps),     DBL(gpu_s),
    DBL(cost_usd),         DBL(standby_gpu_s), DBL(proactive_gpu_s), DBL(fp_gpu_s),
    DBL(so_mean_s),        DBL(so_max_s),      DBL(first_token_s),   DBL(first_scaleout_s),
    DBL(sim_end_s),        DBL(wall_s),        INT(n_req),           INT(n_done),
    INT(n_attained),       INT(cold_starts),   INT(scaleouts),       INT(failures_injected),
    INT(scaleouts_broken), INT(max_replicas),  INT(handovers),       INT(moved_seqs),
    INT(restarts),         INT(ttft_missed),   INT(tpot_missed)};

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double get(const struct sim_result *r, size_t f)
{
    const char *p = (const char *)r + fields[f].off;
    return fields[f].type == 'd' ? *(const double *)p : *(const int *)p;
}

static void set(struct sim_result *r, size_t f, double v)
{
    char *p = (char *)r + fields[f].off;
    if (fields[f].type == 'd')
        *(double *)p = v;
    else
        *(int *)p = (int)v;
}

void sim_summarize(struct sim_summary *s)
{
    int n = s->n_runs;
    double v[SIM_MAX_SEEDS];
    s->med = s->lo = s->hi = s->runs[0];
    for (size_t f = 0; f < sizeof fields / sizeof fields[0]; f++) {
        for (int k = 0; k < n; k++) v[k] = get(&s->runs[k], f);
        qsort(v, n, sizeof v[0], cmp_double);
        set(&s->med, f, v[(n - 1) / 2]); /* the lower of the middle two for an even count */
        set(&s->lo, f, v[0]);
        set(&s->hi, f, v[n - 1]);
    }
    s->median_run = 0;
    for (int k = 0; k < n; k++)
        if (s->runs[k].ttft_p99 == s->med.ttft_p99) {
            s->median_run = k;
            break;
        }
    s->med.events = s->runs[s->median_run].events;
    memcpy(s->med.ttft_cdf, s->runs[s->median_run].ttft_cdf, sizeof s->med.ttft_cdf);
}

/* ---- table ---- */

void sim_report_table(FILE *f, const struct sim_summary *s, int n)
{
    int runs = n ? s[0].n_runs : 0;
    fprintf(f,
            "medians over %d run%s (min-max over the runs); missed: requests past their TTFT "
            "SLO, or within it and past TPOT\n",
            runs, runs == 1 ? "" : "s");
    fprintf(f, "%-16s %6s %22s %6s %6s %17s %19s %6s %5s %6s %6s %4s %5s %4s\n", "policy", "TTFT50",
            "TTFT99 ms (min-max)", "TPOT50", "TPOT99", "SLO % (min-max)", "GPU-s (min-max)",
            "m:TTFT", "TPOT", "fc-FP", "stndby", "SO", "hand", "rst");
    for (int i = 0; i < n; i++) {
        const struct sim_result *m = &s[i].med, *lo = &s[i].lo, *hi = &s[i].hi;
        char p99[48], slo[48], gpu[48];
        snprintf(p99, sizeof p99, "%.0f (%.0f-%.0f)", m->ttft_p99, lo->ttft_p99, hi->ttft_p99);
        snprintf(slo, sizeof slo, "%.1f (%.1f-%.1f)", 100 * m->attainment, 100 * lo->attainment,
                 100 * hi->attainment);
        snprintf(gpu, sizeof gpu, "%.0f (%.0f-%.0f)", m->gpu_s, lo->gpu_s, hi->gpu_s);
        fprintf(f, "%-16s %6.0f %22s %6.1f %6.1f %17s %19s %6d %5d %6.0f %6.0f %4d %5d %4d\n",
                s[i].policy, m->ttft_p50, p99, m->tpot_p50, m->tpot_p99, slo, gpu, m->ttft_missed,
                m->tpot_missed, m->fp_gpu_s, m->standby_gpu_s, m->scaleouts, m->handovers,
                m->restarts);
    }
}

/* ---- CSV ---- */

/* summary.csv's columns, in order (the charts find theirs by name). */
static const char *const summary_cols[] = {"policy",
                                           "runs",
                                           "requests",
                                           "done",
                                           "ttft_p50_ms",
                                           "ttft_p90_ms",
                                           "ttft_p99_ms",
                                           "ttft_mean_ms",
                                           "tpot_p50_ms",
                                           "tpot_p99_ms",
                                           "tbt_p50_ms",
                                           "tbt_p99_ms",
                                           "slo_attainment",
                                           "goodput_rps",
                                           "gpu_seconds",
                                           "cost_usd",
                                           "fc_gpu_seconds",
                                           "fc_fp_gpu_seconds",
                                           "standby_gpu_seconds",
                                           "cold_starts",
                                           "scaleouts",
                                           "scaleout_mean_s",
                                           "scaleout_max_s",
                                           "max_gpus",
                                           "handovers",
                                           "moved_seqs",
                                           "restarts",
                                           "failures",
                                           "scaleouts_broken",
                                           "ttft_p50_lo",
                                           "ttft_p50_hi",
                                           "ttft_p99_lo",
                                           "ttft_p99_hi",
                                           "tpot_p50_lo",
                                           "tpot_p50_hi",
                                           "tpot_p99_lo",
                                           "tpot_p99_hi",
                                           "slo_lo",
                                           "slo_hi",
                                           "gpu_s_lo",
                                           "gpu_s_hi",
                                           "first_token_s",
                                           "events",
                                           "wall_s",
                                           NULL};

static int col(const char *name)
{
    for (int k = 0; summary_cols[k]; k++)
        if (!strcmp(summary_cols[k], name)) return k + 1;
    return 0;
}

static void row(FILE *f, const char *policy, int runs, const struct sim_result *m,
                const struct sim_result *lo, const struct sim_result *hi)
{
    fprintf(f,
            "%s,%d,%d,%d,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.5f,%.4f,%.1f,%.4f,%.1f,%.1f,"
            "%.1f,%d,%d,%.4f,%.4f,%d,%d,%d,%d,%d,%d,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,"
            "%.5f,%.5f,%.1f,%.1f,%.4f,%ld,%.3f\n",
            policy, runs, m->n_req, m->n_done, m->ttft_p50, m->ttft_p90, m->ttft_p99, m->ttft_mean,
            m->tpot_p50, m->tpot_p99, m->tbt_p50, m->tbt_p99, m->attainment, m->goodput_rps,
            m->gpu_s, m->cost_usd, m->proactive_gpu_s, m->fp_gpu_s, m->standby_gpu_s,
            m->cold_starts, m->scaleouts, m->so_mean_s, m->so_max_s, m->max_replicas, m->handovers,
            m->moved_seqs, m->restarts, m->failures_injected, m->scaleouts_broken, lo->ttft_p50,
            hi->ttft_p50, lo->ttft_p99, hi->ttft_p99, lo->tpot_p50, hi->tpot_p50, lo->tpot_p99,
            hi->tpot_p99, lo->attainment, hi->attainment, lo->gpu_s, hi->gpu_s, m->first_token_s,
            m->events, m->wall_s);
}

static void header(FILE *f, const char *first)
{
    fprintf(f, "%s", first);
    for (int k = 1; summary_cols[k]; k++) fprintf(f, ",%s", summary_cols[k]);
    fprintf(f, "\n");
}

int sim_report_csv(const char *dir, const struct sim_summary *s, int n, char *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/summary.csv", dir);
    FILE *f = fopen(path, "w");
    if (!f) return errmsg_set(err, "%s: %s", path, strerror(errno));
    header(f, "policy");
    for (int i = 0; i < n; i++) row(f, s[i].policy, s[i].n_runs, &s[i].med, &s[i].lo, &s[i].hi);
    if (fclose(f)) return errmsg_set(err, "%s: write failed", path);
    snprintf(path, sizeof path, "%s/runs.csv", dir);
    if (!(f = fopen(path, "w"))) return errmsg_set(err, "%s: %s", path, strerror(errno));
    fprintf(f, "seed,");
    header(f, "policy");
    for (int i = 0; i < n; i++)
        for (int k = 0; k < s[i].n_runs; k++) {
            const struct sim_result *r = &s[i].runs[k];
            fprintf(f, "%u,", s[i].seeds[k]);
            row(f, s[i].policy, 1, r, r, r);
        }
    if (fclose(f)) return errmsg_set(err, "%s: write failed", path);
    snprintf(path, sizeof path, "%s/ttft_cdf.csv", dir);
    if (!(f = fopen(path, "w"))) return errmsg_set(err, "%s: %s", path, strerror(errno));
    fprintf(f, "quantile");
    for (int i = 0; i < n; i++) fprintf(f, ",%s", s[i].policy);
    fprintf(f, "\n");
    for (int k = 0; k < SIM_CDF_POINTS; k++) {
        fprintf(f, "%.4f", (k + 1.0) / SIM_CDF_POINTS);
        for (int i = 0; i < n; i++) fprintf(f, ",%.3f", s[i].med.ttft_cdf[k]);
        fprintf(f, "\n");
    }
    if (fclose(f)) return errmsg_set(err, "%s: write failed", path);
    return 0;
}

/* ---- charts ---- */

/* Colours told apart by colour-blind readers (Okabe-Ito, then two more), and a dash type each. */
static const char *const colours[] = {"#000000", "#E69F00", "#56B4E9", "#009E73", "#D55E00",
                                      "#0072B2", "#CC79A7", "#999999", "#F0E442", "#882255"};
#define N_COLOURS (int)(sizeof colours / sizeof colours[0])

static void styles(FILE *f, const struct sim_summary *s, int n)
{
    for (int i = 0; i < n; i++) {
        /* Strata solid and thick, the others dashed: the eye finds ours first */
        int strata = !strcmp(s[i].policy, "strata");
        fprintf(f, "set style line %d lc rgb '%s' lw %s dt %d pt %d ps 1.4\n", i + 1,
                colours[i % N_COLOURS], strata ? "3" : "2", strata ? 1 : 2 + i % 4,
                5 + 2 * (i % 4));
    }
}

/* A panel of points with min-max error bars, one per policy, at x = its index. */
static void points_panel(FILE *f, const struct sim_summary *s, int n, const char *title,
                         const char *ylabel, const char *c_med, const char *c_lo, const char *c_hi,
                         double scale, int logy)
{
    fprintf(f, "set title '%s'\nset ylabel '%s'\n%sset logscale y\n", title, ylabel,
            logy ? "" : "un");
    fprintf(f, "set xrange [-0.6:%d.6]\nset xtics rotate by -30 ()\n", n - 1);
    for (int i = 0; i < n; i++) fprintf(f, "set xtics add ('%s' %d)\n", s[i].policy, i);
    fprintf(f, "plot ");
    for (int i = 0; i < n; i++)
        fprintf(f,
                "%s'summary.csv' every ::%d::%d using (%d):($%d*%g):($%d*%g):($%d*%g) with "
                "yerrorbars ls %d dt 1 notitle",
                i ? ", " : "", i, i, i, col(c_med), scale, col(c_lo), scale, col(c_hi), scale,
                i + 1);
    fprintf(f, "\n");
}

int sim_report_plots(const char *dir, const struct sim_summary *s, int n, char *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/plots.gp", dir);
    FILE *f = fopen(path, "w");
    if (!f) return errmsg_set(err, "%s: %s", path, strerror(errno));
    fprintf(f, "# strata sim's charts (cluster/sim/sim_report.c); gnuplot plots.gp redraws them\n"
               "set datafile separator ','\nset datafile columnheaders\nset grid\n"
               "cairo = strstrt(GPVAL_TERMINALS, 'pngcairo') > 0\n"
               "wide = cairo ? \"set terminal pngcairo size 1100,650 font ',11'\" : "
               "\"set terminal png size 1100,650\"\n"
               "big = cairo ? \"set terminal pngcairo size 1200,800 font ',10'\" : "
               "\"set terminal png size 1200,800\"\n@wide\n");
    styles(f, s, n);
    /* the TTFT CDF: one line per policy, the key inside, bottom right, in two columns */
    fprintf(f,
            "set output 'ttft_cdf.png'\nset title 'TTFT CDF per policy (median run)'\n"
            "set xlabel 'TTFT (ms, log scale)'\nset ylabel 'fraction of requests'\n"
            "set logscale x\nset yrange [0:1.02]\n"
            "set key bottom right box opaque maxrows %d samplen 3\nplot ",
            (n + 1) / 2);
    for (int i = 0; i < n; i++)
        fprintf(f, "%s'ttft_cdf.csv' using %d:1 with lines ls %d title '%s'", i ? ", " : "", i + 2,
                i + 1, s[i].policy);
    fprintf(f, "\nunset logscale x\nset yrange [*:*]\n");
    /* attainment and GPUs over time: two panels, their own titles, one key below both */
    fprintf(f, "set output 'slo_timeline.png'\n"
               "set multiplot layout 2,1 title 'SLO attainment and GPUs over time (median runs)'\n"
               "set lmargin 10\nset rmargin 3\n"
               "set title 'SLO attainment, 10 s moving window'\nset xlabel ''\n"
               "set ylabel 'attainment'\nset yrange [0:1.05]\nunset key\nplot ");
    for (int i = 0; i < n; i++)
        fprintf(f, "%s'timeline_%s.csv' using 1:7 with lines ls %d title '%s'", i ? ", " : "",
                s[i].policy, i + 1, s[i].policy);
    fprintf(f, "\nset title 'GPUs allocated (serving + loading)'\nset xlabel 'time (s)'\n"
               "set ylabel 'GPUs'\nset yrange [0:*]\nset bmargin 6\n"
               "set key at screen 0.5,0.005 center bottom horizontal maxrows 2 samplen 3\nplot ");
    for (int i = 0; i < n; i++)
        fprintf(f, "%s'timeline_%s.csv' using 1:($5+$6) with steps ls %d title '%s'", i ? ", " : "",
                s[i].policy, i + 1, s[i].policy);
    fprintf(f, "\nunset multiplot\nset yrange [*:*]\nunset key\nset bmargin\n");
    /* the figures per policy, with their spread over the runs */
    fprintf(f, "@big\nset output 'metrics.png'\n"
               "set multiplot layout 2,2 title 'Per policy: median over the runs, bars min to "
               "max'\nset xlabel ''\nset bmargin 5\n");
    points_panel(f, s, n, "TTFT P99 (ms, log scale)", "ms", "ttft_p99_ms", "ttft_p99_lo",
                 "ttft_p99_hi", 1, 1);
    points_panel(f, s, n, "TTFT P50 (ms, log scale)", "ms", "ttft_p50_ms", "ttft_p50_lo",
                 "ttft_p50_hi", 1, 1);
    points_panel(f, s, n, "SLO attainment (%)", "%", "slo_attainment", "slo_lo", "slo_hi", 100, 0);
    points_panel(f, s, n, "GPU-seconds", "GPU-s", "gpu_seconds", "gpu_s_lo", "gpu_s_hi", 1, 0);
    fprintf(f, "unset multiplot\n");
    fprintf(f, "set output 'tpot.png'\nset multiplot layout 1,2 title 'TPOT per request "
               "(its mean time between tokens)'\n");
    points_panel(f, s, n, "TPOT P50 (ms)", "ms", "tpot_p50_ms", "tpot_p50_lo", "tpot_p50_hi", 1, 0);
    points_panel(f, s, n, "TPOT P99 (ms)", "ms", "tpot_p99_ms", "tpot_p99_lo", "tpot_p99_hi", 1, 0);
    fprintf(f, "unset multiplot\n");
    fprintf(f, "@wide\nset output 'gpu_time.png'\nset logscale y\nunset logscale y\nset title "
               "'GPU-seconds per policy "
               "(median, bars min to max)'\nset ylabel 'GPU-seconds'\nset yrange [0:*]\n"
               "set style fill solid 0.7 border -1\nplot ");
    /* boxerrorbars with 5 columns: x, y, ylow, yhigh, half the box's width (with 4, gnuplot
     * reads the 4th as the width: GPU-seconds wide boxes over the whole chart) */
    for (int i = 0; i < n; i++)
        fprintf(f,
                "%s'summary.csv' every ::%d::%d using (%d):%d:%d:%d:(0.3) with boxerrorbars ls "
                "%d dt 1 notitle",
                i ? ", " : "", i, i, i, col("gpu_seconds"), col("gpu_s_lo"), col("gpu_s_hi"),
                i + 1);
    fprintf(f, "\n");
    if (fclose(f)) return errmsg_set(err, "%s: write failed", path);
    pid_t pid;
    char a0[] = "gnuplot", a1[] = "plots.gp";
    char *argv[] = {a0, a1, NULL};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addchdir_np(&fa, dir);
    int rc = posix_spawnp(&pid, "gnuplot", &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc) return errmsg_set(err, "gnuplot: %s (apt-get install gnuplot-nox)", strerror(rc));
    int st;
    if (waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st))
        return errmsg_set(err, "gnuplot %s/plots.gp failed (status %d)", dir, st);
    return 0;
}
