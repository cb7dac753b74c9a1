/* control: the control thread's frame: its options, start and stop, raft's set-up, the tick.
 *
 * control_start checks the configuration, opens raft (the state machine: control_fsm.c) over the
 * sealed transport and starts the thread. Its libuv loop runs raft and, every heartbeat, on_tick:
 * publish raft's state for the other threads, carry out the committed decisions that name this
 * node (control_exec.c), send the load report (control_channel.c), and on the leader change raft's
 * configuration (control_conf.c) and decide (control_leader.c). The struct every control_*.c file
 * shares, and which thread owns each of its fields, is in control_internal.h. */
#include "cluster/control_internal.h"

#include <sodium.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---------------------------------------------------------------- options */

int control_enabled(const struct control_cfg *cfg)
{
    return cfg->peers != NULL;
}

static int parse_peers(struct control *c, char *err)
{
    snprintf(c->peers_s, sizeof c->peers_s, "%s", c->cfg.peers);
    char *save = NULL;
    for (char *tok = strtok_r(c->peers_s, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *at = strchr(tok, '@');
        char *end;
        unsigned long long id = at ? strtoull(tok, &end, 10) : 0;
        if (!at || end != at || !id || strlen(at + 1) > CL_STR_LEN || !at[1])
            return errmsg_set(err, "--cluster: '%s' is not ID@HOST:PORT", tok);
        if (c->n_peers == CL_MAX_NODES)
            return errmsg_set(err, "--cluster: more than %d peers", CL_MAX_NODES);
        struct sockaddr_in sa;
        if (sealed_conn_parse_addr(at + 1, &sa, err)) return errmsg_prefix(err, "--cluster: ");
        c->peer[c->n_peers].id = id;
        snprintf(c->peer[c->n_peers].addr, sizeof c->peer[0].addr, "%s", at + 1);
        if (id == c->cfg.id) {
            snprintf(c->addr, sizeof c->addr, "%s", at + 1);
            c->bootstrap_member = 1;
        }
        c->n_peers++;
    }
    if (!c->n_peers) return errmsg_set(err, "--cluster: no peers");
    if (!c->bootstrap_member) {
        if (!c->cfg.addr)
            return errmsg_set(err,
                              "--node-id %llu is not in --cluster: give --cluster-addr "
                              "HOST:PORT to join",
                              (unsigned long long)c->cfg.id);
        snprintf(c->addr, sizeof c->addr, "%s", c->cfg.addr);
    }
    return 0;
}

/* The API address other nodes forward requests to. An API bound to every address (the
 * appliance's --host 0.0.0.0) is reached at the host of our control address. */
static void advertise_http(struct control *c)
{
    const char *colon = strrchr(c->http, ':'), *ccolon = strrchr(c->addr, ':');
    if (!colon || !ccolon) return;
    size_t hl = (size_t)(colon - c->http);
    int any = (hl == 7 && !strncmp(c->http, "0.0.0.0", 7)) ||
              (hl == 2 && !strncmp(c->http, "::", 2)) ||
              (hl == 4 && !strncmp(c->http, "[::]", 4)) || hl == 0;
    if (!any) return;
    char port[16];
    snprintf(port, sizeof port, "%s", colon + 1);
    snprintf(c->http, sizeof c->http, "%.*s:%s", (int)(ccolon - c->addr), c->addr, port);
}

/* ---------------------------------------------------------------- each heartbeat */

static void publish(struct control *c)
{
    raft_id lid = 0;
    const char *laddr = NULL;
    raft_leader(&c->raft, &lid, &laddr);
    pthread_mutex_lock(&c->mu);
    c->raft_state = raft_state(&c->raft);
    c->leader_id = lid;
    snprintf(c->leader_addr, sizeof c->leader_addr, "%s", laddr ? laddr : "");
    c->term = c->raft.current_term;
    c->commit_index = c->raft.commit_index;
    c->applied_index = raft_last_applied(&c->raft);
    c->last_index = raft_last_index(&c->raft);
    c->n_conf = 0;
    for (unsigned i = 0; i < c->raft.configuration.n && c->n_conf < CL_MAX_NODES; i++)
        c->conf[c->n_conf++] =
            (struct vp_server){.id = c->raft.configuration.servers[i].id,
                               .voter = c->raft.configuration.servers[i].role == RAFT_VOTER};
    pthread_mutex_unlock(&c->mu);
}

static void on_tick(uv_timer_t *t)
{
    struct control *c = t->data;
    if (c->stopping || c->recovering) return;
    publish(c);
    int leader = raft_state(&c->raft) == RAFT_LEADER;
    if (leader && !c->was_leader) {
        c->leader_since = now_mono_ms();
        c->leader_since_wall = now_wall_ms();
        pthread_mutex_lock(&c->mu);
        c->leaderships++;
        pthread_mutex_unlock(&c->mu);
        log_info("cluster", "node %llu is the leader (term %llu)", (unsigned long long)c->cfg.id,
                 (unsigned long long)c->raft.current_term);
    }
    c->was_leader = leader;
    control_exec_tick(c);
    control_channel_report(c);
    if (!c->bootstrap_member) control_channel_join_tick(c, 0);
    raft_id lid = 0;
    const char *laddr = NULL;
    raft_leader(&c->raft, &lid, &laddr);
    control_channel_rejoin_tick(c, now_mono_ms(), lid != 0);
    if (leader && c->recover_event && !c->inflight) {
        /* Every node's /v1/cluster shows when the configuration was forced, and by whom. */
        c->recover_event = 0;
        control_conf_event(c, c->cfg.id, CONF_RECOVERED);
        return;
    }
    if (leader && control_recover_add_tick(c)) return;
    if (leader) control_conf_tick(c);
    if (leader && control_lost_tick(c)) return;
    if (leader) control_leader_tick(c);
}

/* ---------------------------------------------------------------- the thread and raft */

static void raft_closed(struct raft *r)
{
    struct control *c = r->data;
    raft_uv_close(&c->io);
    c->raft_open = 0;
}

static void close_walk(uv_handle_t *h, void *arg)
{
    (void)arg;
    if (!uv_is_closing(h)) uv_close(h, NULL);
}

static void on_stop(uv_async_t *a)
{
    struct control *c = a->data;
    c->stopping = 1;
    uv_timer_stop(&c->tick);
    uv_close((uv_handle_t *)&c->tick, NULL);
    uv_close((uv_handle_t *)&c->stop_async, NULL);
    uv_close((uv_handle_t *)&c->recover_async, NULL);
    uv_timer_stop(&c->recover_timer);
    uv_close((uv_handle_t *)&c->recover_timer, NULL);
    pthread_mutex_lock(&c->mu);
    int waiting = c->rq_state == 1;
    pthread_mutex_unlock(&c->mu);
    if (waiting) control_recover_answer(c, 503, "the node is stopping");
    if (c->ctl) sealed_conn_close(c->ctl, "stopping");
    if (c->join) sealed_conn_close(c->join, "stopping");
    fwd_channels_stop(c->fwd);
    if (c->raft_open) raft_close(&c->raft, raft_closed);
    /* The forward channels a front keeps in its pool (and any other connection) end now: the
     * loop must run out, and the front is freed only after this thread has returned. */
    sealed_conn_close_all(&c->loop, "stopping");
}

static void *control_main(void *arg)
{
    struct control *c = arg;
    uv_run(&c->loop, UV_RUN_DEFAULT);
    /* Connections raft handed back may still be open: close whatever is left. */
    uv_walk(&c->loop, close_walk, NULL);
    uv_run(&c->loop, UV_RUN_DEFAULT);
    return NULL;
}

static int mkdir_p(const char *dir, char *err)
{
    char tmp[256];
    snprintf(tmp, sizeof tmp, "%s", dir);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            mkdir(tmp, 0700);
            *p = '/';
        }
    if (mkdir(tmp, 0700) && errno != EEXIST) return errmsg_set(err, "mkdir %s: %m", dir);
    return 0;
}

int control_raft_setup(struct control *c, char *err)
{
    struct raft_transport_cfg tc = {.loop = &c->loop,
                                    .key = &c->key,
                                    .ctx = c,
                                    .on_ctl = control_channel_on_ctl,
                                    .on_fwd = control_channel_on_fwd,
                                    .on_refused = control_channel_on_refused,
                                    .on_impostor = control_channel_on_impostor,
                                    .handshake_ms = c->cfg.handshake_ms};
    if (raft_transport_init(&c->transport, &tc, err)) return -1;
    int rc = raft_uv_init(&c->io, &c->loop, c->dir, &c->transport);
    if (rc) return errmsg_set(err, "raft data dir %s: %s", c->dir, c->io.errmsg);
    raft_uv_set_connect_retry_delay(&c->io, (unsigned)c->cfg.heartbeat_ms);
    control_fsm_init(c);
    rc = raft_init(&c->raft, &c->io, &c->fsm, c->cfg.id, c->addr);
    if (rc) return errmsg_set(err, "raft_init: %s", raft_errmsg(&c->raft));
    c->raft.data = c;
    raft_set_heartbeat_timeout(&c->raft, (unsigned)c->cfg.heartbeat_ms);
    raft_set_election_timeout(&c->raft, (unsigned)(c->cfg.heartbeat_ms * 5));
    raft_set_pre_vote(&c->raft, true);
    raft_set_snapshot_threshold(&c->raft, 64);
    raft_set_snapshot_trailing(&c->raft, 16);
    if (c->n_recover_to) {
        if (control_recover_force(c, err)) return -1;
    } else if (c->bootstrap_member) {
        struct raft_configuration conf;
        raft_configuration_init(&conf);
        for (int i = 0; i < c->n_peers; i++)
            raft_configuration_add(&conf, c->peer[i].id, c->peer[i].addr, RAFT_VOTER);
        rc = raft_bootstrap(&c->raft, &conf);
        raft_configuration_close(&conf);
        if (rc && rc != RAFT_CANTBOOTSTRAP)
            return errmsg_set(err, "raft_bootstrap: %s", raft_errmsg(&c->raft));
        if (rc == RAFT_CANTBOOTSTRAP)
            log_info("cluster", "%s holds a log already: rejoining from it", c->dir);
    }
    rc = raft_start(&c->raft);
    if (rc) return errmsg_set(err, "raft_start: %s", raft_errmsg(&c->raft));
    c->raft_open = 1;
    return 0;
}

/* ---------------------------------------------------------------- start and stop */

struct control *control_start(const struct control_cfg *cfg, const struct control_serving *sv,
                              const struct cluster_exec *ex, char *err)
{
    struct control *c = calloc(1, sizeof *c);
    if (!c) {
        errmsg_set(err, "cluster: out of memory");
        return NULL;
    }
    c->cfg = *cfg;
    if (cfg->test_refuse && strcmp(cfg->test_refuse, "replicate") &&
        strcmp(cfg->test_refuse, "scale-up")) {
        errmsg_set(err, "--test-refuse %s: not replicate or scale-up", cfg->test_refuse);
        free(c);
        return NULL;
    }
    if (!c->cfg.heartbeat_ms) c->cfg.heartbeat_ms = 200;
    if (!c->cfg.dead_ms) c->cfg.dead_ms = 5 * c->cfg.heartbeat_ms;
    if (!c->cfg.replicas_cached) c->cfg.replicas_cached = 1;
    if (c->cfg.keep_alive_ms <= 0) c->cfg.keep_alive_ms = 10000;
    if (c->cfg.scaleout_timeout_ms <= 0) c->cfg.scaleout_timeout_ms = 600000;
    if (c->cfg.scaleout_stall_ms <= 0) c->cfg.scaleout_stall_ms = 120000;
    if (c->cfg.ttft_slo_ms <= 0) c->cfg.ttft_slo_ms = 1000;
    if (sv) c->sv = *sv;
    if (ex) c->ex = *ex;
    snprintf(c->http, sizeof c->http, "%s", cfg->http ? cfg->http : "");
    snprintf(c->gpu, sizeof c->gpu, "%s", cfg->gpu ? cfg->gpu : "cpu");
    snprintf(c->rack, sizeof c->rack, "%s", cfg->rack ? cfg->rack : "");
    snprintf(c->model, sizeof c->model, "%s", cfg->model ? cfg->model : "");
    snprintf(c->fabric, sizeof c->fabric, "%s", cfg->fabric ? cfg->fabric : "");
    c->start_wall = now_wall_ms();
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->recover_cv, NULL);
    signed_replay_init(&c->signed_seen);
    cluster_state_init(&c->st);
    if (!cfg->id) {
        errmsg_set(err, "cluster: --node-id is required with --cluster");
        goto fail;
    }
    if (cfg->rack && !cluster_cmd_rack_ok(cfg->rack)) {
        errmsg_set(err, "cluster: --rack %s: want 1..%d letters, digits, '.', '-' or '_'",
                   cfg->rack, CL_STR_LEN);
        goto fail;
    }
    if (!cfg->key_file) {
        errmsg_set(err, "cluster: --key-file is required with --cluster");
        goto fail;
    }
    if (auth_init(err) || cluster_key_load(&c->key, cfg->key_file, err) || parse_peers(c, err))
        goto fail;
    advertise_http(c);
    if (cfg->dir)
        snprintf(c->dir, sizeof c->dir, "%s", cfg->dir);
    else
        snprintf(c->dir, sizeof c->dir, "/run/strata-raft-%llu", (unsigned long long)cfg->id);
    if (mkdir_p(c->dir, err)) goto fail;
    if (cfg->recover && control_recover_at_start(c, err)) goto fail;
    if (c->model[0])
        control_set_holding(c, c->model, 1, !cfg->standby, cfg->standby ? 0 : cfg->n_layers,
                            cfg->n_layers);
    if (uv_loop_init(&c->loop)) {
        errmsg_set(err, "cluster: uv_loop_init failed");
        goto fail;
    }
    if (!(c->fwd = fwd_channels_new(&c->loop, &c->key, cfg->id, c->addr, err))) goto fail_loop;
    if (control_raft_setup(c, err)) goto fail_loop;
    if (c->n_recover_to) control_recover_started(c);
    uv_timer_init(&c->loop, &c->tick);
    c->tick.data = c;
    uv_timer_start(&c->tick, on_tick, (uint64_t)c->cfg.heartbeat_ms, (uint64_t)c->cfg.heartbeat_ms);
    uv_async_init(&c->loop, &c->stop_async, on_stop);
    c->stop_async.data = c;
    uv_async_init(&c->loop, &c->recover_async, control_recover_on_async);
    c->recover_async.data = c;
    uv_timer_init(&c->loop, &c->recover_timer);
    c->recover_timer.data = c;
    if (pthread_create(&c->thread, NULL, control_main, c)) {
        errmsg_set(err, "cluster: pthread_create failed");
        goto fail_loop;
    }
    c->thread_started = 1;
    log_info("cluster", "node %llu: control on %s, raft data in %s, %d peers, heartbeat %d ms",
             (unsigned long long)cfg->id, c->addr, c->dir, c->n_peers, c->cfg.heartbeat_ms);
    return c;
fail_loop:
    /* raft may hold handles on the loop: let the failure be fatal for the process instead of
     * unwinding half a raft instance. */
    return NULL;
fail:
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->recover_cv);
    signed_replay_fini(&c->signed_seen);
    free(c);
    return NULL;
}

void control_stop(struct control *c)
{
    if (!c) return;
    if (c->thread_started) {
        uv_async_send(&c->stop_async);
        pthread_join(c->thread, NULL);
    }
    uv_loop_close(&c->loop);
    raft_transport_free(&c->transport);
    fwd_channels_free(c->fwd);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->recover_cv);
    signed_replay_fini(&c->signed_seen);
    sodium_memzero(&c->key, sizeof c->key);
    free(c);
}

void control_set_model(struct control *c, const char *model, int n_layers, double bytes,
                       int max_step_tokens)
{
    pthread_mutex_lock(&c->mu);
    snprintf(c->model, sizeof c->model, "%s", model);
    c->cfg.n_layers = n_layers;
    c->cfg.model_bytes = bytes;
    c->cfg.max_step_tokens = max_step_tokens;
    pthread_mutex_unlock(&c->mu);
}

void control_plan_config(const struct control_cfg *cfg, struct plan_config *pc)
{
    plan_config_default(pc);
    if (cfg->max_step_tokens > 0) pc->max_step_tokens = cfg->max_step_tokens;
    pc->max_seqs = cfg->max_seqs > 0 ? cfg->max_seqs : 0;
    /* proactive: the simulator's policy "strata"; reactive: "strata-reactive" */
    pc->proactive = pc->handover = cfg->proactive != 0;
    pc->standby_max = 0; /* partial residency is not carried out live (docs/control.md) */
}

uint64_t control_id(const struct control *c)
{
    return c->cfg.id;
}
