#include "serving/sched/step_model.h"

#include <math.h>
#include <string.h>

/* Solve the n x n normal equations A x = A[.][n] (n <= 3) by Gaussian elimination with partial
 * pivoting. Returns -1 when they are singular. */
static int solve(double A[3][4], int n, double x[3])
{
    for (int i = 0; i < n; i++) {
        int p = i;
        for (int r = i + 1; r < n; r++)
            if (fabs(A[r][i]) > fabs(A[p][i])) p = r;
        if (fabs(A[p][i]) < 1e-18) return -1;
        for (int k = 0; k < 4; k++) {
            double t = A[i][k];
            A[i][k] = A[p][k];
            A[p][k] = t;
        }
        for (int r = 0; r < n; r++) {
            if (r == i) continue;
            double f = A[r][i] / A[i][i];
            for (int k = i; k < 4; k++) A[r][k] -= f * A[i][k];
        }
    }
    for (int i = 0; i < n; i++) x[i] = A[i][n] / A[i][i];
    return 0;
}

static int solve3(double A[3][4], double x[3])
{
    return solve(A, 3, x);
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
    double room = seconds / m->corr - m->b * seqs - m->c;
    if (m->a <= 0) return room >= 0 ? 1000000000 : -1;
    double t = room / m->a;
    if (t > 1e9) return 1000000000;
    if (t < -1e9) return -1000000000;
    return (int)floor(t);
}

/* ---------------------------------------------------------------- online */

#define DEPTH    8    /* a bucket averages its last ~8 steps */
#define PRIOR_W  1e-3 /* an unseen shape's stand-in: it decides only what no step does */
#define ERR_GAIN 0.2  /* the error estimate's moving average: ~5 steps */
#define ERR_MAX  4.0
#define TRUST    4 /* steps after which one step cannot move its bucket by more than CLIP x */
#define CLIP     4.0
#define MIN_A    1e-9

static int log2_bucket(int v, int n)
{
    int b = 0;
    while (v > 1 && b < n - 1) v >>= 1, b++;
    return b;
}

static struct step_bucket *bucket(struct step_online *o, int tokens, int seqs)
{
    return &o->bk[log2_bucket(tokens, STEP_TOK_BUCKETS)][log2_bucket(seqs, STEP_SEQ_BUCKETS)];
}

void step_online_init(struct step_online *o, const struct step_model *prior, double err, int fixed)
{
    memset(o, 0, sizeof *o);
    o->err = err > 0 ? err : 0;
    o->prior = *prior;
    /* a prior corrected by a factor: the factor goes into the coefficients */
    double k = prior->corr > 0 ? prior->corr : 1;
    o->prior.a *= k, o->prior.b *= k, o->prior.c *= k;
    o->prior.corr = 1;
    if (o->prior.a < MIN_A) o->prior.a = MIN_A;
    o->m = fixed ? *prior : o->prior;
    o->fixed = fixed;
}

void step_online_shapes(struct step_online *o, const struct step_sample *shape, int n)
{
    if (n > STEP_MAX_SHAPES) n = STEP_MAX_SHAPES;
    memcpy(o->shape, shape, (size_t)n * sizeof *shape);
    o->n_shapes = n;
}

int step_online_seen(const struct step_online *o, int tokens, int seqs)
{
    return (int)bucket((struct step_online *)o, tokens, seqs)->n;
}

/* Weighted least squares of y = a t + b s + c with some coefficients held at 0 (mask bit i set:
 * coefficient i is free). Returns the weighted residual sum of squares, or INFINITY when the
 * free coefficients are undetermined or one of them comes out negative. */
static double fit_subset(const double N[3][3], const double r[3], double yy, int mask, double x[3])
{
    int idx[3], n = 0;
    for (int i = 0; i < 3; i++)
        if (mask & (1 << i)) idx[n++] = i;
    double A[3][4] = {{0}};
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < n; j++) A[i][j] = N[idx[i]][idx[j]];
        A[i][n] = r[idx[i]];
    }
    double z[3];
    if (solve(A, n, z)) return INFINITY;
    x[0] = x[1] = x[2] = 0;
    for (int i = 0; i < n; i++) {
        if (z[i] < 0) return INFINITY;
        x[idx[i]] = z[i];
    }
    /* |W^1/2 (y - X x)|^2 = yWy - 2 x.r + x N x */
    double sse = yy;
    for (int i = 0; i < 3; i++) {
        sse -= 2 * x[i] * r[i];
        for (int j = 0; j < 3; j++) sse += x[i] * N[i][j] * x[j];
    }
    return sse;
}

static void add_point(double N[3][3], double r[3], double *yy, double t, double s, double y,
                      double w)
{
    double f[3] = {t, s, 1};
    for (int i = 0; i < 3; i++) {
        for (int j = 0; j < 3; j++) N[i][j] += w * f[i] * f[j];
        r[i] += w * f[i] * y;
    }
    *yy += w * y * y;
}

/* The fit over the buckets seen, with the prior (scaled to them) standing in for the shapes not
 * seen yet; non-negative least squares (every subset of free coefficients, the best feasible). */
static void refit(struct step_online *o)
{
    double N[3][3] = {{0}}, r[3] = {0}, yy = 0, lsum = 0, wsum = 0;
    for (int u = 0; u < o->n_used; u++) {
        const struct step_bucket *b = &o->bk[o->used[u][0]][o->used[u][1]];
        add_point(N, r, &yy, b->tokens, b->seqs, b->y, b->n / (b->y * b->y));
        double p = o->prior.a * b->tokens + o->prior.b * b->seqs + o->prior.c;
        if (p > 0) lsum += b->n * log(b->y / p), wsum += b->n;
    }
    double k = wsum > 0 ? exp(lsum / wsum) : 1;
    for (int i = 0; i < o->n_shapes; i++) {
        const struct step_sample *sh = &o->shape[i];
        if (bucket(o, sh->tokens, sh->seqs)->n > 0) continue;
        double y = k * (o->prior.a * sh->tokens + o->prior.b * sh->seqs + o->prior.c);
        if (y > 0) add_point(N, r, &yy, sh->tokens, sh->seqs, y, PRIOR_W / (y * y));
    }
    /* all three free first: when that fit is feasible it is the constrained optimum too */
    double best = INFINITY, x[3], bx[3] = {0};
    for (int mask = 7; mask >= 1; mask--) {
        double sse = fit_subset(N, r, yy, mask, x);
        if (sse < best) best = sse, memcpy(bx, x, sizeof bx);
        if (mask == 7 && best < INFINITY) break;
    }
    if (best == INFINITY) { /* nothing determines a fit: the prior, scaled */
        bx[0] = k * o->prior.a, bx[1] = k * o->prior.b, bx[2] = k * o->prior.c;
    }
    o->m.a = bx[0] > MIN_A ? bx[0] : MIN_A;
    o->m.b = bx[1];
    o->m.c = bx[2];
    o->m.corr = 1;
}

double step_online_fit_error(const struct step_online *o)
{
    double sq = 0, w = 0;
    for (int u = 0; u < o->n_used; u++) {
        const struct step_bucket *b = &o->bk[o->used[u][0]][o->used[u][1]];
        double p = o->m.a * b->tokens + o->m.b * b->seqs + o->m.c;
        if (p <= 0) continue;
        sq += b->n * (b->y / p - 1) * (b->y / p - 1);
        w += b->n;
    }
    double rms = w > 0 ? sqrt(sq / w) : 0;
    return rms < ERR_MAX ? rms : ERR_MAX;
}

void step_online_observe(struct step_online *o, int tokens, int seqs, double y)
{
    if (tokens < 1 || seqs < 1 || !(y > 0)) return;
    o->steps++;
    if (o->fixed) return;
    double p = step_model_predict(&o->m, tokens, seqs);
    if (p > 0) {
        double ex = y / p - 1;
        ex = ex < 0 ? 0 : ex > ERR_MAX ? ERR_MAX : ex;
        o->err = (1 - ERR_GAIN) * o->err + ERR_GAIN * ex;
        /* one descheduled step must not throw a well-fitted model off for long */
        if (o->steps > TRUST) y = y > CLIP * p ? CLIP * p : y < p / CLIP ? p / CLIP : y;
    }
    struct step_bucket *b = bucket(o, tokens, seqs);
    if (b->n == 0) {
        o->used[o->n_used][0] = (unsigned char)log2_bucket(tokens, STEP_TOK_BUCKETS);
        o->used[o->n_used++][1] = (unsigned char)log2_bucket(seqs, STEP_SEQ_BUCKETS);
    }
    b->n = b->n < DEPTH ? b->n + 1 : DEPTH;
    double g = 1 / b->n;
    b->tokens += g * (tokens - b->tokens);
    b->seqs += g * (seqs - b->seqs);
    b->y += g * (y - b->y);
    refit(o);
}
