/* sim_input: the simulator's external inputs: config settings (files and flags), the Azure
 * trace CSV, synthetic arrivals. Every reader checks lengths and ranges before it uses a value. */
#include "cluster/sim/sim.h"

#include "cluster/planner.h"
#include "os/common/errmsg.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int num(const char *key, const char *v, double lo, double hi, double *out, char *err)
{
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    while (*end == ' ' || *end == '\t') end++;
    if (end == v || *end || errno || !(x >= lo && x <= hi))
        return errmsg_set(err, "sim: %s = \"%s\": want a number in [%g, %g]", key, v, lo, hi);
    *out = x;
    return 0;
}

static int integer(const char *key, const char *v, int lo, int hi, int *out, char *err)
{
    double x;
    if (num(key, v, lo, hi, &x, err)) return -1;
    if (x != floor(x)) return errmsg_set(err, "sim: %s = \"%s\": want an integer", key, v);
    *out = (int)x;
    return 0;
}

/* "H100:128,A100:64" */
static int set_gpus(struct sim_config *c, const char *v, char *err)
{
    char buf[256];
    if (strlen(v) >= sizeof buf) return errmsg_set(err, "sim: gpus: value too long");
    strcpy(buf, v);
    int n = 0;
    for (char *save, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ') tok++;
        char *colon = strchr(tok, ':');
        if (!colon) return errmsg_set(err, "sim: gpus: \"%s\": want TYPE:COUNT", tok);
        *colon = 0;
        if (n >= SIM_MAX_TYPES)
            return errmsg_set(err, "sim: gpus: at most %d GPU types", SIM_MAX_TYPES);
        if (sim_gpu_by_name(tok, &c->types[n]))
            return errmsg_set(err, "sim: gpus: unknown GPU type \"%s\" (H100, A100, L40S, CPU)",
                              tok);
        if (integer("gpus", colon + 1, 1, 65536, &c->type_gpus[n], err)) return -1;
        c->step_set[n] = c->admit_set[n] = c->plan_set[n] = 0;
        n++;
    }
    if (n == 0) return errmsg_set(err, "sim: gpus: empty");
    c->n_types = n;
    return 0;
}

static int type_index(const struct sim_config *c, const char *name)
{
    for (int t = 0; t < c->n_types; t++)
        if (!strcmp(c->types[t].name, name)) return t;
    return -1;
}

/* "H100:a,b,c" (seconds per token, per sequence, per step); which: 0 step, 1 admit_step,
 * 2 plan_step */
static int set_step(struct sim_config *c, const char *v, int which, char *err)
{
    const char *key = which == 1 ? "admit_step" : which == 2 ? "plan_step" : "step";
    char name[16];
    double a, b, cc;
    int used = 0;
    if (sscanf(v, "%15[^:]:%lf,%lf,%lf%n", name, &a, &b, &cc, &used) != 4 || v[used])
        return errmsg_set(err, "sim: %s = \"%s\": want TYPE:a,b,c", key, v);
    int t = type_index(c, name);
    if (t < 0) return errmsg_set(err, "sim: %s: GPU type %s is not in gpus", key, name);
    if (!(a > 0 && a < 1 && b >= 0 && b < 1 && cc >= 0 && cc < 10))
        return errmsg_set(err, "sim: %s: %s: coefficients out of range", key, name);
    if (which == 1) {
        c->admit_step[t] = (struct step_model){a, b, cc, 1};
        c->admit_set[t] = 1;
    } else if (which == 2) {
        c->plan_step[t] = (struct step_model){a, b, cc, 1};
        c->plan_set[t] = 1;
    } else {
        c->step[t] = (struct step_model){a, b, cc, 1};
        c->step_set[t] = 1;
    }
    return 0;
}

/* "T:INST" or "T:holder" */
static int set_fail(struct sim_config *c, const char *v, char *err)
{
    if (c->n_failures >= (int)(sizeof c->failures / sizeof c->failures[0]))
        return errmsg_set(err, "sim: fail: at most 16 failures");
    char what[16];
    double t;
    int used = 0;
    if (sscanf(v, "%lf:%15s%n", &t, what, &used) != 2 || v[used] || !(t >= 0 && t < 1e7))
        return errmsg_set(err, "sim: fail = \"%s\": want SECONDS:INSTANCE or SECONDS:holder", v);
    struct sim_failure *f = &c->failures[c->n_failures];
    f->t = t;
    if (!strcmp(what, "holder"))
        f->inst = -1;
    else if (integer("fail", what, 0, 1 << 20, &f->inst, err))
        return -1;
    c->n_failures++;
    return 0;
}

/* "T:SRC:DST[,DST...]" */
static int set_scaleout(struct sim_config *c, const char *v, char *err)
{
    if (c->n_scaleouts >= SIM_MAX_SCALEOUTS)
        return errmsg_set(err, "sim: scaleout: at most %d", SIM_MAX_SCALEOUTS);
    struct sim_scaleout_spec so = {0};
    char list[256];
    int used = 0;
    if (strlen(v) >= sizeof list ||
        sscanf(v, "%lf:%d:%255[0-9, ]%n", &so.t, &so.src, list, &used) != 3 || v[used] ||
        !(so.t >= 0 && so.t < 1e7) || so.src < 0 || so.src > PLAN_MAX_NODES)
        return errmsg_set(err, "sim: scaleout = \"%s\": want SECONDS:SOURCE:DEST[,DEST...]", v);
    for (char *save, *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int d;
        if (so.n >= SIM_SCALEOUT_MAX_CHAIN)
            return errmsg_set(err, "sim: scaleout: at most %d joiners", SIM_SCALEOUT_MAX_CHAIN);
        if (integer("scaleout", tok, 0, PLAN_MAX_NODES, &d, err)) return -1;
        if (d == so.src) return errmsg_set(err, "sim: scaleout: %d is its own source", d);
        for (int j = 0; j < so.n; j++)
            if (so.chain[j] == d) return errmsg_set(err, "sim: scaleout: %d twice in the chain", d);
        so.chain[so.n++] = d;
    }
    if (so.n == 0) return errmsg_set(err, "sim: scaleout = \"%s\": no joiner", v);
    c->scaleouts[c->n_scaleouts++] = so;
    return 0;
}

/* "B1,B2xN,..." bytes of each span, "xN" repeating one N times */
static int set_spans(struct sim_config *c, const char *v, char *err)
{
    char buf[1024];
    if (strlen(v) >= sizeof buf) return errmsg_set(err, "sim: model_spans: value too long");
    strcpy(buf, v);
    int n = 0;
    double sum = 0;
    for (char *save, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int rep = 1;
        char *x = strchr(tok, 'x');
        if (x) {
            *x = 0;
            if (integer("model_spans", x + 1, 1, SIM_MAX_SPANS, &rep, err)) return -1;
        }
        double b;
        if (num("model_spans", tok, 1, 1e13, &b, err)) return -1;
        if (n + rep > SIM_MAX_SPANS)
            return errmsg_set(err, "sim: model_spans: more than %d spans", SIM_MAX_SPANS);
        for (int k = 0; k < rep; k++) c->span_bytes[n++] = b;
        sum += b * rep;
    }
    if (n == 0) return errmsg_set(err, "sim: model_spans: empty");
    c->n_spans = n;
    c->model.layers = n;
    c->model.bytes = sum;
    snprintf(c->model.name, sizeof c->model.name, "custom");
    return 0;
}

/* model_bytes, model_layers, model_params, kv_bytes_tok: a model described by its figures */
static int set_model_figure(struct sim_config *c, const char *key, const char *v, char *err)
{
    struct sim_model_spec *m = &c->model;
    double x;
    if (!strcmp(key, "model_layers") || !strcmp(key, "model_bytes")) c->n_spans = 0;
    if (!strcmp(key, "model_layers")) {
        if (integer(key, v, 1, 4096, &m->layers, err)) return -1;
    } else if (!strcmp(key, "model_bytes")) {
        if (num(key, v, 1e3, 1e14, &m->bytes, err)) return -1;
    } else if (!strcmp(key, "model_params")) {
        if (num(key, v, 1e3, 1e14, &m->params, err)) return -1;
    } else {
        if (num(key, v, 1, 1e9, &x, err)) return -1;
        m->kv_bytes_tok = x;
    }
    snprintf(m->name, sizeof m->name, "custom");
    return 0;
}

const char *const sim_config_keys[] = {"gpus",
                                       "gpus_per_server",
                                       "gpus_per_inst",
                                       "servers_per_rack",
                                       "model",
                                       "model_spans",
                                       "model_bytes",
                                       "model_layers",
                                       "model_params",
                                       "kv_bytes_tok",
                                       "chunk_bytes",
                                       "net",
                                       "nic_gbps",
                                       "nvlink_GBps",
                                       "pcie_GBps",
                                       "ssd_GBps",
                                       "remote_GBps",
                                       "latency_us",
                                       "initial",
                                       "keep_alive_s",
                                       "tick_ms",
                                       "max_step_tokens",
                                       "max_seqs",
                                       "max_joiners",
                                       "ttft_floor_ms",
                                       "ttft_per_tok_ms",
                                       "tbt_slo_ms",
                                       "fail_prob",
                                       "fail",
                                       "step",
                                       "admit_step",
                                       "plan_step",
                                       "replicas_cached",
                                       "price_H100",
                                       "price_A100",
                                       "price_L40S",
                                       "price_CPU",
                                       "seed",
                                       "shuffle",
                                       "scaleout",
                                       "planner",
                                       "send_to",
                                       "live_min_layers",
                                       "kv_recompute",
                                       "fc_period_ms",
                                       "fc_alpha",
                                       "fc_beta",
                                       "fc_z",
                                       "fc_z_in",
                                       "fc_fast_ms",
                                       "onset_ratio",
                                       "fc_queue",
                                       "util_high",
                                       "util_low",
                                       "standby_max",
                                       "sllm_target",
                                       "sllm_max_queue",
                                       "sllm_keep_alive_s",
                                       NULL};

int sim_config_set(struct sim_config *c, const char *key, const char *v, char *err)
{
    double x;
    struct sim_tiers *t = &c->tiers;
    if (!strcmp(key, "gpus")) return set_gpus(c, v, err);
    if (!strcmp(key, "step")) return set_step(c, v, 0, err);
    if (!strcmp(key, "admit_step")) return set_step(c, v, 1, err);
    if (!strcmp(key, "plan_step")) return set_step(c, v, 2, err);
    if (!strcmp(key, "replicas_cached"))
        return integer(key, v, 0, PLAN_MAX_NODES, &c->replicas_cached, err);
    if (!strcmp(key, "fail")) return set_fail(c, v, err);
    if (!strcmp(key, "scaleout")) return set_scaleout(c, v, err);
    if (!strcmp(key, "model_spans")) return set_spans(c, v, err);
    if (!strcmp(key, "model_bytes") || !strcmp(key, "model_layers") ||
        !strcmp(key, "model_params") || !strcmp(key, "kv_bytes_tok"))
        return set_model_figure(c, key, v, err);
    if (!strcmp(key, "planner")) {
        if (strcmp(v, "on") && strcmp(v, "off"))
            return errmsg_set(err, "sim: planner = \"%s\": want on or off", v);
        c->no_planner = !strcmp(v, "off");
        return 0;
    }
    if (!strcmp(key, "kv_recompute")) {
        if (strcmp(v, "on") && strcmp(v, "off"))
            return errmsg_set(err, "sim: kv_recompute = \"%s\": want on or off", v);
        c->kv_recompute = !strcmp(v, "on");
        return 0;
    }
    if (!strcmp(key, "shuffle")) {
        if (strcmp(v, "on") && strcmp(v, "off"))
            return errmsg_set(err, "sim: shuffle = \"%s\": want on or off", v);
        c->no_shuffle = !strcmp(v, "off");
        return 0;
    }
    if (!strcmp(key, "standby_max")) return integer(key, v, 0, 64, &c->standby_max, err);
    if (!strcmp(key, "sllm_max_queue")) return integer(key, v, 1, 1 << 20, &c->sllm_max_queue, err);
    if (!strcmp(key, "send_to")) return integer(key, v, -1, PLAN_MAX_NODES, &c->send_to, err);
    if (!strcmp(key, "live_min_layers")) return integer(key, v, 0, 4096, &c->live_min_layers, err);
    if (!strcmp(key, "model")) {
        if (sim_model_by_name(v, &c->model))
            return errmsg_set(err, "sim: model \"%s\": want 7B, 13B or 70B", v);
        c->n_spans = 0;
        return 0;
    }
    if (!strcmp(key, "net")) { /* the compute fabric's tier, per GPU */
        if (!strcmp(v, "rdma100"))
            t->nic_Bps = 100e9 / 8;
        else if (!strcmp(v, "rdma200"))
            t->nic_Bps = 200e9 / 8;
        else if (!strcmp(v, "rdma400"))
            t->nic_Bps = 400e9 / 8;
        else if (!strcmp(v, "tcp25"))
            t->nic_Bps = 25e9 / 8;
        else
            return errmsg_set(err, "sim: net \"%s\": want rdma100, rdma200, rdma400, tcp25", v);
        return 0;
    }
    if (!strcmp(key, "gpus_per_server")) return integer(key, v, 1, 64, &c->gpus_per_server, err);
    if (!strcmp(key, "gpus_per_inst")) return integer(key, v, 0, 64, &c->gpus_per_inst, err);
    if (!strcmp(key, "servers_per_rack"))
        return integer(key, v, 0, PLAN_MAX_NODES, &c->servers_per_rack, err);
    if (!strcmp(key, "initial")) return integer(key, v, 0, 1 << 20, &c->initial_replicas, err);
    if (!strcmp(key, "max_step_tokens"))
        return integer(key, v, 16, 1 << 20, &c->max_step_tokens, err);
    if (!strcmp(key, "max_seqs")) return integer(key, v, 1, 4096, &c->max_seqs, err);
    if (!strcmp(key, "max_joiners")) return integer(key, v, 1, 128, &c->max_joiners, err);
    if (!strcmp(key, "seed")) {
        int s;
        if (integer(key, v, 0, 1 << 30, &s, err)) return -1;
        c->seed = (unsigned)s;
        return 0;
    }
    struct {
        const char *key;
        double *dst, scale, lo, hi;
    } nums[] = {
        {"nic_gbps", &t->nic_Bps, 1e9 / 8, 0.001, 1e5},
        {"nvlink_GBps", &t->nvlink_Bps, 1e9, 0, 1e5},
        {"pcie_GBps", &t->pcie_Bps, 1e9, 0.001, 1e4},
        {"ssd_GBps", &t->ssd_Bps, 1e9, 0.001, 1e4},
        {"remote_GBps", &t->remote_Bps, 1e9, 0.001, 1e5},
        {"latency_us", &t->latency_s, 1e-6, 0, 1e6},
        {"chunk_bytes", &c->chunk_bytes, 1, 0, 1e13},
        {"keep_alive_s", &c->keep_alive_s, 1, 0, 1e7},
        {"tick_ms", &c->tick_s, 1e-3, 1, 1e6},
        {"ttft_floor_ms", &c->ttft_floor_ms, 1, 1, 1e7},
        {"ttft_per_tok_ms", &c->ttft_per_tok_ms, 1, 0, 1e3},
        {"tbt_slo_ms", &c->tbt_slo_ms, 1, 0, 1e6},
        {"fail_prob", &c->fail_prob, 1, 0, 1},
        {"fc_period_ms", &c->fc_period_ms, 1, 10, 1e7},
        {"fc_alpha", &c->fc_alpha, 1, 0.001, 1},
        {"fc_beta", &c->fc_beta, 1, 0, 1},
        {"fc_z", &c->fc_z, 1, 0, 100},
        {"fc_z_in", &c->fc_z_in, 1, 0, 100},
        {"fc_fast_ms", &c->fc_fast_ms, 1, 10, 1e7},
        {"onset_ratio", &c->onset_ratio, 1, 0, 100},
        {"fc_queue", &c->fc_queue, 1, 0, 100},
        {"util_high", &c->util_high, 1, 0.01, 10},
        {"util_low", &c->util_low, 1, 0.001, 10},
        {"sllm_target", &c->sllm_target, 1, 0.01, 1e6},
        {"sllm_keep_alive_s", &c->sllm_keep_alive_s, 1, 0, 1e7},
    };
    for (size_t k = 0; k < sizeof nums / sizeof nums[0]; k++)
        if (!strcmp(key, nums[k].key)) {
            if (num(key, v, nums[k].lo, nums[k].hi, &x, err)) return -1;
            *nums[k].dst = x * nums[k].scale;
            return 0;
        }
    if (!strncmp(key, "price_", 6)) { /* price_H100 = 4.0 (USD per GPU-hour) */
        int ti = type_index(c, key + 6);
        if (ti < 0) return errmsg_set(err, "sim: %s: GPU type not in gpus", key);
        return num(key, v, 0, 1e4, &c->types[ti].usd_hour, err);
    }
    return errmsg_set(err, "sim: unknown setting \"%s\"", key);
}

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t' || *s == '\r') s++;
    char *e = s + strlen(s);
    while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r')) *--e = 0;
    return s;
}

int sim_config_parse(struct sim_config *c, const char *text, char *err)
{
    int line = 0;
    for (const char *p = text; *p;) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        line++;
        char buf[512];
        if (len >= sizeof buf) return errmsg_set(err, "sim: config line %d: too long", line);
        memcpy(buf, p, len);
        buf[len] = 0;
        p += len + (nl != NULL);
        char *hash = strchr(buf, '#');
        if (hash) *hash = 0;
        char *s = trim(buf);
        if (!*s) continue;
        char *eq = strchr(s, '=');
        if (!eq) return errmsg_set(err, "sim: config line %d: want key = value", line);
        *eq = 0;
        if (sim_config_set(c, trim(s), trim(eq + 1), err))
            return errmsg_prefix(err, "config line %d: ", line);
    }
    return 0;
}

static char *slurp(const char *path, size_t *len, char *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        errmsg_set(err, "%s: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap + 1);
    while (b) {
        size_t r = fread(b + n, 1, cap - n, f);
        n += r;
        if (n < cap) break;
        char *nb = realloc(b, 2 * cap + 1);
        if (!nb) {
            free(b);
            b = NULL;
            break;
        }
        b = nb;
        cap *= 2;
    }
    int bad = ferror(f);
    fclose(f);
    if (!b || bad) {
        free(b);
        errmsg_set(err, "%s: read failed", path);
        return NULL;
    }
    b[n] = 0;
    *len = n;
    return b;
}

int sim_config_load(struct sim_config *c, const char *path, char *err)
{
    size_t len;
    char *t = slurp(path, &len, err);
    if (!t) return -1;
    if (memchr(t, 0, len)) {
        free(t);
        return errmsg_set(err, "%s: not a text file", path);
    }
    int rc = sim_config_parse(c, t, err);
    free(t);
    return rc ? errmsg_prefix(err, "%s: ", path) : 0;
}

/* "2023-11-16 18:17:03.9799600" -> seconds since the day before the epoch of days (only
 * differences are used): day-of-month x 86400 + time of day. */
static int parse_stamp(const char *s, size_t n, double *out)
{
    int y, mo, d, h, mi;
    double sec;
    char buf[40];
    if (n >= sizeof buf || n < 19) return -1;
    memcpy(buf, s, n);
    buf[n] = 0;
    int used = 0;
    if (sscanf(buf, "%4d-%2d-%2d %2d:%2d:%lf%n", &y, &mo, &d, &h, &mi, &sec, &used) != 6 ||
        buf[used])
        return -1;
    if (mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || h < 0 || mi < 0 || mi > 59 ||
        !(sec >= 0 && sec < 61))
        return -1;
    *out = ((double)(y * 12 + mo) * 31 + d) * 86400 + h * 3600 + mi * 60 + sec;
    return 0;
}

int sim_trace_parse(const char *text, size_t len, double rate, double start_s, double dur_s,
                    struct sim_request **out, int *n_out, char *err)
{
    if (!(rate > 0)) return errmsg_set(err, "sim: trace: rate %g must be > 0", rate);
    const char *p = text, *end = text + len;
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    if (!nl || (size_t)(nl - p) < 8 || memcmp(p, "TIMESTAMP", 9) != 0)
        return errmsg_set(err, "trace: header is not TIMESTAMP,ContextTokens,GeneratedTokens");
    p = nl + 1;
    int cap = 1024, n = 0, line = 1;
    struct sim_request *r = malloc(sizeof *r * cap);
    if (!r) return errmsg_set(err, "trace: out of memory");
    double t0 = 0, prev = -1;
    while (p < end) {
        line++;
        const char *e = memchr(p, '\n', (size_t)(end - p));
        if (!e) e = end;
        const char *c1 = memchr(p, ',', (size_t)(e - p));
        if (e == p || (e - p == 1 && *p == '\r')) {
            p = e + 1;
            continue;
        }
        double t;
        long in, gen;
        char nums[64];
        if (!c1 || parse_stamp(p, (size_t)(c1 - p), &t) || (size_t)(e - c1) >= sizeof nums) {
            free(r);
            return errmsg_set(err, "trace line %d: want TIMESTAMP,ContextTokens,GeneratedTokens",
                              line);
        }
        memcpy(nums, c1 + 1, (size_t)(e - c1 - 1));
        nums[e - c1 - 1] = 0;
        int used = 0;
        if (sscanf(nums, "%ld,%ld%n", &in, &gen, &used) != 2 ||
            (nums[used] && strcmp(nums + used, "\r")) || in < 0 || gen < 0 || in > 1 << 20 ||
            gen > 1 << 20) {
            free(r);
            return errmsg_set(err, "trace line %d: token counts \"%s\"", line, nums);
        }
        if (n == 0 && prev < 0) t0 = t;
        if (t < prev) {
            free(r);
            return errmsg_set(err, "trace line %d: time goes backwards", line);
        }
        prev = t;
        double rel = t - t0;
        p = e + 1;
        if (rel < start_s) continue;
        if (dur_s > 0 && rel >= start_s + dur_s * rate) break;
        if (n == cap) {
            struct sim_request *nr = realloc(r, sizeof *r * cap * 2);
            if (!nr) {
                free(r);
                return errmsg_set(err, "trace: out of memory");
            }
            r = nr;
            cap *= 2;
        }
        r[n++] = (struct sim_request){(rel - start_s) / rate, (int)in, (int)gen};
    }
    *out = r;
    *n_out = n;
    return 0;
}

int sim_trace_load(const char *path, double rate, double start_s, double dur_s,
                   struct sim_request **out, int *n, char *err)
{
    size_t len;
    char *t = slurp(path, &len, err);
    if (!t) return -1;
    int rc = sim_trace_parse(t, len, rate, start_s, dur_s, out, n, err);
    free(t);
    return rc ? errmsg_prefix(err, "%s: ", path) : 0;
}

int sim_requests_parse(const char *text, size_t len, struct sim_request **out, int *n_out,
                       char *err)
{
    const char *p = text, *end = text + len;
    int cap = 64, n = 0, line = 0, header = 0;
    struct sim_request *r = malloc(sizeof *r * cap);
    if (!r) return errmsg_set(err, "requests: out of memory");
    while (p < end) {
        line++;
        const char *e = memchr(p, '\n', (size_t)(end - p));
        if (!e) e = end;
        char buf[128];
        size_t l = (size_t)(e - p);
        const char *hash = memchr(p, '#', l);
        if (hash) l = (size_t)(hash - p);
        if (l >= sizeof buf) {
            free(r);
            return errmsg_set(err, "requests line %d: too long", line);
        }
        memcpy(buf, p, l);
        buf[l] = 0;
        p = e + 1;
        char *s = trim(buf);
        if (!*s) continue;
        if (!header) {
            if (strcmp(s, "seconds,in,out")) {
                free(r);
                return errmsg_set(err, "requests line %d: the header is not \"seconds,in,out\"",
                                  line);
            }
            header = 1;
            continue;
        }
        double t;
        int in, gen, used = 0;
        if (sscanf(s, "%lf,%d,%d%n", &t, &in, &gen, &used) != 3 || s[used] ||
            !(t >= 0 && t < 1e7) || in < 1 || gen < 1 || in > 1 << 20 || gen > 1 << 20) {
            free(r);
            return errmsg_set(err,
                              "requests line %d: \"%s\": want SECONDS,IN,OUT (seconds >= 0, "
                              "tokens >= 1)",
                              line, s);
        }
        if (n && t < r[n - 1].t) {
            free(r);
            return errmsg_set(err, "requests line %d: time goes backwards", line);
        }
        if (n == cap) {
            if (cap >= 1 << 24) {
                free(r);
                return errmsg_set(err, "requests: too many");
            }
            struct sim_request *nr = realloc(r, sizeof *r * cap * 2);
            if (!nr) {
                free(r);
                return errmsg_set(err, "requests: out of memory");
            }
            r = nr;
            cap *= 2;
        }
        r[n++] = (struct sim_request){t, in, gen};
    }
    if (!header) {
        free(r);
        return errmsg_set(err, "requests: empty (want the header \"seconds,in,out\")");
    }
    *out = r;
    *n_out = n;
    return 0;
}

int sim_requests_load(const char *path, struct sim_request **out, int *n, char *err)
{
    size_t len;
    char *t = slurp(path, &len, err);
    if (!t) return -1;
    int rc = memchr(t, 0, len) ? errmsg_set(err, "not a text file")
                               : sim_requests_parse(t, len, out, n, err);
    free(t);
    return rc ? errmsg_prefix(err, "%s: ", path) : 0;
}

static double unif(uint64_t *s) /* splitmix64 -> (0, 1) */
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return ((z >> 11) + 0.5) / 9007199254740992.0;
}

/* The burst's extra rate at time t: from `at`, ramping up over `ramp` s, holding `len` s,
 * ramping down over `ramp` s; again every `every` s (0: once). */
static double burst_rate(double t, double burst, double at, double blen, double ramp, double every)
{
    if (t < at || burst <= 0) return 0;
    double ph = every > 0 ? fmod(t - at, every) : t - at;
    if (ph < ramp) return burst * ph / ramp;
    if (ph < ramp + blen) return burst;
    if (ph < 2 * ramp + blen) return burst * (2 * ramp + blen - ph) / ramp;
    return 0;
}

int sim_synthetic(const char *spec, unsigned seed, struct sim_request **out, int *n_out, char *err)
{
    double rps = 0, dur = 0, burst = 0, at = 0, blen = 0, in = 1024, outt = 128, ramp = 0,
           every = 0;
    char buf[256];
    if (strlen(spec) >= sizeof buf) return errmsg_set(err, "sim: synthetic: spec too long");
    strcpy(buf, spec);
    for (char *save, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq) return errmsg_set(err, "sim: synthetic: \"%s\": want key=value", tok);
        *eq = 0;
        double *dst = !strcmp(tok, "rps")     ? &rps
                      : !strcmp(tok, "dur")   ? &dur
                      : !strcmp(tok, "burst") ? &burst
                      : !strcmp(tok, "at")    ? &at
                      : !strcmp(tok, "len")   ? &blen
                      : !strcmp(tok, "in")    ? &in
                      : !strcmp(tok, "out")   ? &outt
                      : !strcmp(tok, "ramp")  ? &ramp
                      : !strcmp(tok, "every") ? &every
                                              : NULL;
        if (!dst) return errmsg_set(err, "sim: synthetic: unknown key \"%s\"", tok);
        if (num(tok, eq + 1, 0, 1e7, dst, err)) return -1;
    }
    if (!(rps > 0 && dur > 0 && in >= 1 && outt >= 1))
        return errmsg_set(err, "sim: synthetic: want rps > 0, dur > 0, in >= 1, out >= 1");
    if ((rps + burst) * dur > 5e7) return errmsg_set(err, "sim: synthetic: too many requests");
    if (every > 0 && every < 2 * ramp + blen)
        return errmsg_set(err, "sim: synthetic: every = %g: shorter than a burst (%g s)", every,
                          2 * ramp + blen);
    uint64_t st = seed * 0x2545f4914f6cdd1dull + 1;
    int cap = 1024, n = 0;
    struct sim_request *r = malloc(sizeof *r * cap);
    if (!r) return errmsg_set(err, "sim: synthetic: out of memory");
    for (double t = 0;;) {
        double rate = rps + burst_rate(t, burst, at, blen, ramp, every);
        t += -log(unif(&st)) / rate;
        if (t >= dur) break;
        if (n == cap) {
            struct sim_request *nr = realloc(r, sizeof *r * cap * 2);
            if (!nr) {
                free(r);
                return errmsg_set(err, "sim: synthetic: out of memory");
            }
            r = nr;
            cap *= 2;
        }
        r[n++] = (struct sim_request){t, (int)in, (int)outt};
    }
    *out = r;
    *n_out = n;
    return 0;
}
