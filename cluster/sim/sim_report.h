/* sim_report: the simulator's outputs over several seeds. Every figure of a policy is the median
 * over its runs (one per seed: the seed shuffles the instance ids and draws synthetic arrivals),
 * with the smallest and largest as its spread; the charts draw each policy's median run (the run
 * whose P99 TTFT is the median).
 * Files (sim_report_csv, sim_report_plots): summary.csv (a row per policy: medians, then min and
 * max of the main figures), runs.csv (a row per run), ttft_cdf.csv (the median runs' TTFT at each
 * quantile, a column per policy), timeline_<policy>.csv (the median run's, written by sim_run),
 * plots.gp and, drawn by gnuplot from it, ttft_cdf.png, slo_timeline.png (attainment and GPUs
 * over time, two panels), metrics.png (P50/P99 TTFT, TPOT, SLO attainment, GPU-seconds per
 * policy with their spread) and gpu_time.png (GPU-seconds per policy). */
#ifndef STRATA_SIM_REPORT_H
#define STRATA_SIM_REPORT_H

#include "cluster/sim/sim.h"

#include <stdio.h>

#define SIM_MAX_SEEDS 32

struct sim_summary {
    char policy[24];
    int n_runs;
    int median_run;                /* index into runs[]: the run with the median P99 TTFT */
    struct sim_result med, lo, hi; /* per figure: median, smallest, largest over the runs */
    struct sim_result runs[SIM_MAX_SEEDS];
    unsigned seeds[SIM_MAX_SEEDS];
};

/* Fills med, lo, hi and median_run from runs[0..n_runs). */
void sim_summarize(struct sim_summary *s);

void sim_report_table(FILE *f, const struct sim_summary *s, int n);
int sim_report_csv(const char *dir, const struct sim_summary *s, int n, char *err);
/* Writes plots.gp and runs gnuplot on it. */
int sim_report_plots(const char *dir, const struct sim_summary *s, int n, char *err);

#endif
