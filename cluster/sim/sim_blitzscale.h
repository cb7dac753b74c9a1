/* sim_blitzscale: BlitzScale's controller (D. Zhang et al., "BlitzScale: Fast and Live Large
 * Model Autoscaling with O(1) Host Caching", OSDI'25), written from the paper and the authors'
 * released router (github.com/blitz-serving/blitz-scale, commit 664c56a:
 * router_v2/src/replica/cybernetics/{planner.rs,exec_blitz.rs,mod.rs}, whose comments name the
 * paper's equations). The paper's own text was not available where this was written, so rules are
 * cited by the paper's equation (as the code names them) and the code's function; section numbers
 * are not given rather than guessed.
 *
 * Rules (every tick, the simulator's tick_ms; the released loop runs back to back):
 * - Instance bounds (planner.rs generate_scale_target):
 *     Eq.1 (KV memory): n_mem in [KV used / (0.95 C), KV used / (0.75 C)], C = one instance's KV
 *       capacity, KV used over the serving and loading instances (not those shutting down);
 *     Eq.3 (prefill throughput): n_pre in [W / (0.7 V), W / (0.5 V)], W = prompt tokens waiting
 *       (at the router and in the instances' queues), V = one instance's prefill tokens/s
 *       (BlitzScale profiles it offline: tokens_prefilled_per_sec; here from the step model);
 *     min = max of the lower bounds, max = max of the upper bounds and min; bounds (0.5, 0.7) and
 *     (0.75, 0.95) are the evaluation configs' (config/eval_e2e_*.toml).
 *   If min > n: add ceil((min + max) / 2) - n. If max < n: remove one. Never below one instance
 *   (the configs' min_*_num is 2 per role; one here: no roles, see below).
 * - Scale-up order (exec_blitz.rs execute_scale_plan_blitz, the paper's planner): (1) revive an
 *   instance that is shutting down, (2) reuse one that finished shutting down but still holds the
 *   parameters (within scale_down_threshold_millis), (3) an NVLink chain inside a serving
 *   instance's server, (4) an RDMA chain (serial forwarding, layer by layer) from a serving
 *   instance not already sending; new instances serve live (zigzag cooperative execution with
 *   the old instance: the simulator's joiner running layers [0, k) with a helper).
 * - Scale-down (mod.rs shut_down_*_one, check_null_and_shut_one): the instance with the fewest
 *   KV blocks in use stops taking requests and drains; once drained and 333 ms
 *   (scale_down_threshold_millis) after it began shutting down, its GPUs go; when more must go
 *   and drained ones exist, those go at once.
 * - O(1) host cache: one host copy (R = 1), the source only when no GPU holds the model.
 * - Routing: the usable instance (serving, or live joining) with the least queued prompt tokens,
 *   skipping those shutting down.
 *
 * Approximated: BlitzScale serves prefill/decode-disaggregated (DistServe-style: prefill and
 * decode instances, KV migrated between them, Eq.2 bounding the KV-migration bandwidth). The
 * simulator's instances serve both phases (iteration-level batching), so there is one instance
 * pool: Eq.1 and Eq.3 apply to it and Eq.2 has nothing to bound. Its dispatcher's exact choice
 * among prefill instances was not read: least queued prompt tokens stands in. The multicast's
 * split of targets among several senders ("span_max_rdma_sending_replicas") is one chain per
 * tick from one sender. */
#ifndef STRATA_SIM_BLITZSCALE_H
#define STRATA_SIM_BLITZSCALE_H

struct blitz_in {
    int n;                 /* instances serving or loading, not shutting down */
    double waiting_tokens; /* W: prompt tokens not yet prefilled */
    double kv_used_tokens; /* KV in use over those instances */
    double prefill_tok_s;  /* V: one instance's prefill tokens/s */
    double kv_cap_tokens;  /* C: one instance's KV capacity */
    int floor;             /* never fewer instances */
};

struct blitz_out {
    int min, max; /* Eq.1 and Eq.3's bounds combined */
    int delta;    /* instances to add (> 0) or remove (-1), 0: stay */
};

/* The bounds and the correction, as generate_scale_target computes them. */
void blitz_target(const struct blitz_in *in, struct blitz_out *out);

#define BLITZ_PREFILL_LOW  0.5
#define BLITZ_PREFILL_HIGH 0.7
#define BLITZ_DECODE_LOW   0.75
#define BLITZ_DECODE_HIGH  0.95
#define BLITZ_SHUT_S       0.333 /* scale_down_threshold_millis */

#endif
