/* sim_serverlessllm: ServerlessLLM's controller (Y. Fu et al., "ServerlessLLM: Low-Latency
 * Serverless Inference for Large Language Models", OSDI'24), written from the paper's design and
 * the authors' released code (github.com/ServerlessLLM/ServerlessLLM v0.5, commits f773b68 and
 * 461d4e2: sllm/serve/routers/roundrobin_router.py, sllm/serve/schedulers/
 * storage_aware_scheduler.py). The paper's text was not available where this was written: its
 * sections are cited as its three contributions appear in its abstract (multi-tier loading,
 * live migration, startup-time-optimized scheduling); no section numbers are guessed.
 *
 * Rules:
 * - Scaling (the released router's auto_scaler, a loop every second): desired instances =
 *   ceil(ongoing requests / target), target = sllm_target (the code's default 2), at least
 *   `initial` (the code's min_instances is 0: scale to zero; one here, as every policy keeps
 *   one); one instance started per loop while fewer are running or starting; one stopped per loop
 *   while more are, once the model has had no request for sllm_keep_alive_s (the code's
 *   keep_alive, default 0; its idle clock restarts at every request). Only an idle instance is
 *   stopped (the code stops an instance outright; here none is cut mid-request).
 * - Placement (startup-time-optimized scheduling; the scheduler's _get_model_loading_time): each
 *   server with a free GPU group is scored by its estimated startup time, model bytes / PCIe
 *   bandwidth when its host memory holds the checkpoint, else the server's SSD queue (the loads
 *   already reading its SSD) plus bytes / SSD bandwidth; the least wins, ties by instance id.
 * - Loading (multi-tier loading): from host memory over PCIe, else from the server's SSD (every
 *   server's SSD holds the checkpoint, as the released scheduler considers only local
 *   checkpoints); a server keeps what it loaded in host memory (its pinned pool; one model, so
 *   nothing is evicted). Stop-the-world: an instance serves once every layer is in.
 * - Routing (the router's load balancer): round robin over ready instances holding fewer than
 *   sllm_max_queue requests (the code's InstanceHandle max_queue_length, 10); else the request
 *   waits at the router.
 * - Live migration (the paper's second contribution) moves another model's inference off a
 *   server whose host memory holds the model being started: with one model per simulation it has
 *   nothing to move and never fires. Noted, not modelled.
 * Approximated: loading bandwidths are the tiers' (the paper's loading-optimized checkpoints are
 * what make a load run at them); the released scheduler's one-second polling of held requests is
 * the simulator's re-placement at every tick. */
#ifndef STRATA_SIM_SERVERLESSLLM_H
#define STRATA_SIM_SERVERLESSLLM_H

struct sim_obs;

/* Estimated startup time (s) of instance i: the placement score. */
double sllm_startup_s(const struct sim_obs *o, int i);

/* Desired instances for `ongoing` requests: ceil(ongoing / target), at least floor. */
int sllm_desired(int ongoing, double target, int floor);

#endif
