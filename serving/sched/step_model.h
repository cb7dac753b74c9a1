/* step_model: predicts how long one model step takes, for SLO-aware admission.
 *
 *   t(tokens, seqs) = a * tokens + b * seqs + c      (seconds)
 *
 * a is the per-token cost (matmuls), b the per-sequence cost (attention, sampling), c the fixed
 * cost of a step (dispatch, reading the weights once).
 *
 * Online (struct step_online): the model starts from a prior (a cached fit, a peer's, or a
 * default from the model's size) and is refitted after every step the scheduler times. Steps are
 * kept per shape (log2 buckets of tokens x sequences, each a moving average), and the fit is a
 * least squares over them, relative (every shape counts by its relative error, so decode steps
 * weigh as much as long prefills). Shapes not seen yet are stood in for by the prior's
 * predictions, scaled to what the seen shapes measured: the prior gives the model's shape, the
 * steps its scale, as soon as one has run. */
#ifndef STRATA_STEP_MODEL_H
#define STRATA_STEP_MODEL_H

struct step_model {
    double a, b, c;
    double corr; /* a factor on the prediction (1 for a fit) */
};

struct step_sample {
    int tokens, seqs;
    double seconds;
};

/* Least squares over n >= 3 samples; coefficients are clamped at >= 0 (a step never gets cheaper
 * by adding work). Returns -1 if the samples cannot determine the fit (then m is unchanged). */
int step_model_fit(struct step_model *m, const struct step_sample *s, int n);
double step_model_predict(const struct step_model *m, int tokens, int seqs);
/* Largest token count whose predicted step fits in `seconds` with `seqs` sequences (may be <= 0).
 */
int step_model_max_tokens(const struct step_model *m, int seqs, double seconds);

/* ---------------------------------------------------------------- online */

#define STEP_TOK_BUCKETS 17 /* log2 of tokens: 1 .. 65536 */
#define STEP_SEQ_BUCKETS 13 /* log2 of sequences: 1 .. 4096 */
#define STEP_MAX_SHAPES  8

struct step_bucket {
    double n;               /* steps seen (capped: the moving average's depth) */
    double tokens, seqs, y; /* their moving averages (seconds for y) */
};

struct step_online {
    struct step_model m;     /* the model in use (what admission reads) */
    double err;              /* how much longer than m predicts a step may take (0.2: 20%): a
                                moving average of the excess; admission widens its check by it */
    struct step_model prior; /* where it started */
    int fixed;               /* 1: m is never refitted (tests pin a model) */
    long steps;              /* steps observed */
    struct step_bucket bk[STEP_TOK_BUCKETS][STEP_SEQ_BUCKETS];
    unsigned char used[STEP_TOK_BUCKETS * STEP_SEQ_BUCKETS][2]; /* the buckets seen, in order */
    int n_used;
    /* the shapes the prior stands in for until seen (the calibration shapes) */
    struct step_sample shape[STEP_MAX_SHAPES];
    int n_shapes;
};

/* Start from prior; err: how far off it may be (its own error estimate, or a guess). fixed: never
 * refit (tests pin a model). */
void step_online_init(struct step_online *o, const struct step_model *prior, double err, int fixed);
/* The shapes the prior stands in for until they are seen (at most STEP_MAX_SHAPES). */
void step_online_shapes(struct step_online *o, const struct step_sample *shape, int n);
/* A step of this shape took `seconds`: the error estimate, the shape's bucket, the fit. */
void step_online_observe(struct step_online *o, int tokens, int seqs, double seconds);
/* The fit's relative error over the shapes seen (root mean square, each shape by its steps; 0.3:
 * 30%): the error left once the shapes are covered, without the prior's misses that led there. */
double step_online_fit_error(const struct step_online *o);
/* Steps of this shape seen so far (its bucket's depth, at most 8). */
int step_online_seen(const struct step_online *o, int tokens, int seqs);

#endif
