/* sim_report: the simulator's outputs: the policy table (stdout), CSV files and gnuplot charts
 * in a directory. Files: summary.csv (one row per policy), ttft_cdf.csv (TTFT at each quantile,
 * one column per policy), timeline_<policy>.csv (written by sim_run), plots.gp and the PNGs
 * ttft_cdf.png, slo_timeline.png, gpu_time.png (gnuplot, pngcairo or png terminal). */
#ifndef STRATA_SIM_REPORT_H
#define STRATA_SIM_REPORT_H

#include "cluster/sim/sim.h"

#include <stdio.h>

void sim_report_table(FILE *f, const struct sim_result *r, int n);
int sim_report_csv(const char *dir, const struct sim_result *r, int n, char *err);
/* Writes plots.gp and runs gnuplot on it. */
int sim_report_plots(const char *dir, const struct sim_result *r, int n, char *err);

#endif
