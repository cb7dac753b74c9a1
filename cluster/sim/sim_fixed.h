/* sim_fixed: a fixed deployment sized to the trace's peak, the serving systems without
 * autoscaling that BlitzScale compares its GPU time with (DistServe, vLLM: "49% less GPU time at
 * the same SLO"). It knows the whole request list in advance (that is what sizing to the peak
 * means) and never scales.
 *
 * Size: the most instances any moment of the trace needs by BlitzScale's own bounds at their
 * upper (busiest) ends, so the two are sized by the same yardstick:
 * - prompt tokens: the peak over sliding 10 s windows of prompt tokens/s, over 0.7 V (Eq.3's
 *   upper bound; V = one instance's prefill tokens/s);
 * - KV memory: the peak of the KV that requests in flight hold, each holding in + out tokens from
 *   its arrival for out x the TBT SLO (the longest a request meeting its SLO holds it), over
 *   0.95 C (Eq.1's).
 * At least `initial`, at most the cluster. Routing: least queued prompt tokens.
 * Approximated: "the same SLO" is not searched for (the papers search for the smallest fixed
 * deployment meeting it); this is the peak's size, one estimate of it. */
#ifndef STRATA_SIM_FIXED_H
#define STRATA_SIM_FIXED_H

struct sim_request;

/* Instances for the requests: max(peak 10 s prompt tokens/s / (0.7 prefill_tok_s), peak KV in
 * flight / (0.95 kv_cap)), each request holding its KV for out x step_s. */
int fixed_size(const struct sim_request *req, int n, double prefill_tok_s, double kv_cap,
               double step_s);

#endif
