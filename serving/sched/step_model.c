#include "serving/sched/step_model.h"

#include <math.h>

/* Solve the 3x3 normal equations by Gaussian elimination with partial pivoting. */
static int solve3(double A[3][4], double x[3])
{
    for (int i = 0; i < 3; i++) {
        int p = i;
        for (int r = i + 1; r < 3; r++)
            if (fabs(A[r][i]) > fabs(A[p][i])) p = r;
        if (fabs(A[p][i]) < 1e-18) return -1;
        for (int k = 0; k < 4; k++) {
            double t = A[i][k];
            A[i][k] = A[p][k];
            A[p][k] = t;
        }
        for (int r = 0; r < 3; r++) {
            if (r == i) continue;
            double f = A[r][i] / A[i][i];
            for (int k = i; k < 4; k++) A[r][k] -= f * A[i][k];
        }
    }
    for (int i = 0; i < 3; i++) x[i] = A[i][3] / A[i][i];
    return 0;
}

int step_model_fit(struct step_model *m, const struct step_sample *s, int n)
{
    if (n < 3) return -1;
    double A[3][4] = {{0}};
    for (int i = 0; i < n; i++) {
        double f[3] = {s[i].tokens, s[i].seqs, 1};
        for (int r = 0; r < 3; r++) {
            for (int c = 0; c < 3; c++) A[r][c] += f[r] * f[c];
            A[r][3] += f[r] * s[i].seconds;
        }
    }
    double x[3];
    if (solve3(A, x)) {
        /* tokens and seqs collinear: fit a * tokens + c only */
        double st = 0, st2 = 0, sy = 0, sty = 0;
        for (int i = 0; i < n; i++) {
            st += s[i].tokens, st2 += (double)s[i].tokens * s[i].tokens;
            sy += s[i].seconds, sty += s[i].tokens * s[i].seconds;
        }
        double d = n * st2 - st * st;
        if (fabs(d) < 1e-18) return -1;
        x[0] = (n * sty - st * sy) / d;
        x[1] = 0;
        x[2] = (sy - x[0] * st) / n;
    }
    m->a = x[0] > 0 ? x[0] : 0;
    m->b = x[1] > 0 ? x[1] : 0;
    m->c = x[2] > 0 ? x[2] : 0;
    if (m->a == 0) m->a = 1e-9;
    m->corr = 1;
    return 0;
}

double step_model_predict(const struct step_model *m, int tokens, int seqs)
{
    return (m->a * tokens + m->b * seqs + m->c) * m->corr;
}

int step_model_max_tokens(const struct step_model *m, int seqs, double seconds)
{
    double t = (seconds / m->corr - m->b * seqs - m->c) / m->a;
    if (t > 1e9) return 1000000000;
    return (int)floor(t);
}

void step_model_observe(struct step_model *m, int tokens, int seqs, double seconds)
{
    double p = m->a * tokens + m->b * seqs + m->c;
    if (p <= 0 || seconds <= 0) return;
    double r = seconds / p;
    if (r > 10) r = 10; /* one descheduled step must not blind admission for long */
    m->corr = 0.95 * m->corr + 0.05 * r;
}
