#include "cluster/sim/sim_report.h"

#include "os/common/errmsg.h"

#include <errno.h>
#include <spawn.h>
#include <string.h>
#include <sys/wait.h>

extern char **environ;

void sim_report_table(FILE *f, const struct sim_result *r, int n)
{
    fprintf(f, "%-22s %8s %8s %8s %6s %6s %6s %6s %8s %9s %8s %4s %4s %7s %7s\n", "policy",
            "TTFT-p50", "p90", "p99", "TBT50", "p90", "p99", "SLO%", "goodput", "GPU-s", "cost$",
            "cold", "SO", "SOmean", "SOmax");
    for (int i = 0; i < n; i++)
        fprintf(f,
                "%-22s %8.0f %8.0f %8.0f %6.1f %6.1f %6.1f %6.1f %8.2f %9.0f %8.2f %4d %4d %7.2f "
                "%7.2f\n",
                r[i].policy, r[i].ttft_p50, r[i].ttft_p90, r[i].ttft_p99, r[i].tbt_p50,
                r[i].tbt_p90, r[i].tbt_p99, 100 * r[i].attainment, r[i].goodput_rps, r[i].gpu_s,
                r[i].cost_usd, r[i].cold_starts, r[i].scaleouts, r[i].so_mean_s, r[i].so_max_s);
}

int sim_report_csv(const char *dir, const struct sim_result *r, int n, char *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/summary.csv", dir);
    FILE *f = fopen(path, "w");
    if (!f) return errmsg_set(err, "%s: %s", path, strerror(errno));
    fprintf(f, "policy,requests,done,attained,ttft_p50_ms,ttft_p90_ms,ttft_p99_ms,ttft_mean_ms,"
               "tbt_p50_ms,tbt_p90_ms,tbt_p99_ms,slo_attainment,goodput_rps,gpu_seconds,cost_usd,"
               "cold_starts,scaleouts,scaleout_mean_s,scaleout_max_s,max_gpus,failures,"
               "scaleouts_broken,sim_end_s,wall_s,events,first_token_s\n");
    for (int i = 0; i < n; i++)
        fprintf(f,
                "%s,%d,%d,%d,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.5f,%.4f,%.1f,%.4f,%d,%d,%.4f,"
                "%.4f,%d,%d,%d,%.3f,%.3f,%ld,%.4f\n",
                r[i].policy, r[i].n_req, r[i].n_done, r[i].n_attained, r[i].ttft_p50, r[i].ttft_p90,
                r[i].ttft_p99, r[i].ttft_mean, r[i].tbt_p50, r[i].tbt_p90, r[i].tbt_p99,
                r[i].attainment, r[i].goodput_rps, r[i].gpu_s, r[i].cost_usd, r[i].cold_starts,
                r[i].scaleouts, r[i].so_mean_s, r[i].so_max_s, r[i].max_replicas,
                r[i].failures_injected, r[i].scaleouts_broken, r[i].sim_end_s, r[i].wall_s,
                r[i].events, r[i].first_token_s);
    if (fclose(f)) return errmsg_set(err, "%s: write failed", path);
    snprintf(path, sizeof path, "%s/ttft_cdf.csv", dir);
    f = fopen(path, "w");
    if (!f) return errmsg_set(err, "%s: %s", path, strerror(errno));
    fprintf(f, "quantile");
    for (int i = 0; i < n; i++) fprintf(f, ",%s", r[i].policy);
    fprintf(f, "\n");
    for (int k = 0; k < SIM_CDF_POINTS; k++) {
        fprintf(f, "%.4f", (k + 1.0) / SIM_CDF_POINTS);
        for (int i = 0; i < n; i++) fprintf(f, ",%.3f", r[i].ttft_cdf[k]);
        fprintf(f, "\n");
    }
    if (fclose(f)) return errmsg_set(err, "%s: write failed", path);
    return 0;
}

int sim_report_plots(const char *dir, const struct sim_result *r, int n, char *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/plots.gp", dir);
    FILE *f = fopen(path, "w");
    if (!f) return errmsg_set(err, "%s: %s", path, strerror(errno));
    fprintf(f, "set datafile separator ','\nset key autotitle columnhead\n"
               "set terminal png size 1000,600\nset grid\n");
    fprintf(f, "set output 'ttft_cdf.png'\nset title 'TTFT CDF per policy'\n"
               "set xlabel 'TTFT (ms)'\nset ylabel 'fraction of requests'\nset logscale x\n"
               "set key bottom right\n");
    fprintf(f, "plot ");
    for (int i = 0; i < n; i++)
        fprintf(f, "%s'ttft_cdf.csv' using %d:1 with lines lw 2 title '%s'", i ? ", " : "", i + 2,
                r[i].policy);
    fprintf(f, "\nunset logscale x\n");
    fprintf(f, "set output 'slo_timeline.png'\nset multiplot layout 2,1 title 'SLO attainment "
               "and GPUs over time'\nset xlabel 'time (s)'\nset ylabel 'SLO attainment'\n"
               "set yrange [0:1.05]\nset key outside right\nplot ");
    for (int i = 0; i < n; i++)
        fprintf(f, "%s'timeline_%s.csv' using 1:4 with lines title '%s'", i ? ", " : "",
                r[i].policy, r[i].policy);
    fprintf(f, "\nset ylabel 'GPUs (serving + joining)'\nset yrange [0:*]\nplot ");
    for (int i = 0; i < n; i++)
        fprintf(f, "%s'timeline_%s.csv' using 1:($5+$6) with steps title '%s'", i ? ", " : "",
                r[i].policy, r[i].policy);
    fprintf(f, "\nunset multiplot\n");
    fprintf(f, "set output 'gpu_time.png'\nset title 'GPU time per policy'\nset xlabel ''\n"
               "set ylabel 'GPU-seconds'\nset style fill solid 0.6\nset boxwidth 0.6\n"
               "set yrange [0:*]\nset xtics rotate by -30\nunset key\n"
               "plot 'summary.csv' using 0:14:xtic(1) with boxes\n");
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
