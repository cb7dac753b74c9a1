/* sim_tokenscale: TokenScale's controller (R. Lai et al., "TokenScale: Timely and Accurate
 * Autoscaling for Disaggregated LLM Serving with Token Velocity", arXiv:2512.03416, 2025),
 * from what its abstract and public summaries give; the paper's body (its exact controller,
 * thresholds, windows) was not available where this was written, so what follows is an
 * approximation and is labelled as one in every table.
 *
 * Rules:
 * - Token velocity (its leading signal): the prompt tokens arriving per second, smoothed over
 *   one second (an exponential average with a 1 s time constant; the window is ours). Instances
 *   for prefill = ceil(arrival velocity / (0.7 V_P)), V_P = one instance's prefill velocity
 *   (profiled offline in the paper: here the step model's tokens/s of back-to-back full prompt
 *   chunks). The 0.7 is ours, BlitzScale's prefill upper bound: sized at 100% the queue of a
 *   Poisson stream grows without bound, and the paper's velocities are measured at its SLOs,
 *   which we could not read.
 * - Decode velocity bounds the decoders by the rate KV memory is released; in steady state that
 *   is the KV the running requests hold: instances for decode = ceil(KV in use / (0.9 C)).
 *   Target = the larger, at least one; scale up to it at once (the data plane is BlitzScale's:
 *   the paper compares against it and its own loading was not read), scale down one instance per
 *   tick, drained first like BlitzScale's.
 * Not modelled: Convertible Decoders (decode instances that take prefill during a burst) exist
 * for prefill/decode-disaggregated serving; the simulator's instances already do both. So this is
 * TokenScale's signal on a colocated pool, not TokenScale. */
#ifndef STRATA_SIM_TOKENSCALE_H
#define STRATA_SIM_TOKENSCALE_H

#define TOKENSCALE_UTIL 0.7

/* Instances for a prompt-token velocity v_in (tokens/s) with per-instance prefill velocity v_p,
 * and kv tokens in use with per-instance capacity cap: max(ceil(v_in / (0.7 v_p)),
 * ceil(kv / (0.9 cap)), 1). */
int tokenscale_target(double v_in, double v_p, double kv, double cap);

#endif
