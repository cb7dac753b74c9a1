/* step_model: predicts how long one model step takes, for SLO-aware admission.
 *
 *   t(tokens, seqs) = a * tokens + b * seqs + c      (seconds)
 *
 * a is the per-token cost (matmuls), b the per-sequence cost (attention, sampling), c the fixed
 * cost of a step (dispatch, the output head's setup). The coefficients come from a least-squares
 * fit over steps timed at start-up (step_model_fit); while serving, an exponential moving average
 * of actual/predicted corrects for drift (other load on the machine, longer contexts). */
#ifndef STRATA_STEP_MODEL_H
#define STRATA_STEP_MODEL_H

struct step_model {
    double a, b, c;
    double corr; /* EMA of actual / predicted, 1 at start */
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
void step_model_observe(struct step_model *m, int tokens, int seqs, double seconds);

#endif
