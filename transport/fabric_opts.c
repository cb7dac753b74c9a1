#include "transport/fabric_opts.h"

#include "os/common/errmsg.h"
#include "transport/auth.h"

#include <stdlib.h>
#include <string.h>

enum fo_kind { FO_STR, FO_INT, FO_DBL, FO_PEER, FO_PEERS };

static const struct fabric_opt {
    const char *name;
    enum fo_kind kind;
    size_t off; /* in struct fabric_opts */
    long lo, hi;
    const char *help;
} table[] = {
#define S(f) offsetof(struct fabric_opts, f)
    {"fabric", FO_STR, S(kind), 0, 0, "tcp|dpdk|rdma"},
    {"transport", FO_STR, S(kind), 0, 0, NULL /* alias of --fabric */},
    {"listen", FO_STR, S(listen), 0, 0, "IP:PORT"},
    {"key-file", FO_STR, S(key_file), 0, 0, "FILE (64 hex digits: the cluster key)"},
    {"node-id", FO_INT, S(node_id), 0, 1 << 30, "N"},
    {"peers", FO_PEERS, 0, 0, 0, "IP:PORT,IP:PORT,..."},
    {"peer", FO_PEER, 0, 0, 0, "IP:PORT (repeatable)"},
    {"dead-ms", FO_INT, S(dead_ms), 1, 3600000, "MS (a silent peer is dead after this)"},
    {"eal", FO_STR, S(eal), 0, 0, "'EAL ARGS' (dpdk)"},
    {"exception-vdev", FO_STR, S(exception_vdev), 0, 0, "VDEV (dpdk: kernel traffic)"},
    {"mtu", FO_INT, S(mtu), 576, 9216, "N (dpdk)"},
    {"window", FO_INT, S(window), 1, 1 << 20, "PKTS (dpdk)"},
    {"link-gbps", FO_DBL, S(link_gbps), 0, 1000000, "G (pacing per connection, 0 = none)"},
    {"rdma-dev", FO_STR, S(rdma_dev), 0, 0, "NAME (rdma)"},
    {"impair", FO_STR, S(impair), 0, 0, "loss=P,reorder=P,delay=MS,corrupt=P,forge=P (tests)"},
#undef S
};
#define N_OPTS ((int)(sizeof table / sizeof table[0]))

int fabric_opts_count(void)
{
    return N_OPTS;
}

void fabric_opts_getopt(struct option *out)
{
    for (int i = 0; i < N_OPTS; i++)
        out[i] = (struct option){table[i].name, required_argument, NULL, FABRIC_OPT_BASE + i};
}

static int add_peer(struct fabric_opts *o, const char *addr, char *err)
{
    if (!*addr) return errmsg_set(err, "--peers: empty address");
    if (o->n_peers == FABRIC_MAX_PEERS)
        return errmsg_set(err, "--peers: at most %d peers", FABRIC_MAX_PEERS);
    uint32_t ip;
    uint16_t port;
    if (tp_parse_addr(addr, &ip, &port, err)) return errmsg_prefix(err, "--peers: ");
    o->peers[o->n_peers++] = addr;
    return 0;
}

int fabric_opt_set(struct fabric_opts *o, int i, const char *arg, char *err)
{
    if (i < 0 || i >= N_OPTS) return errmsg_set(err, "fabric option %d unknown", i);
    const struct fabric_opt *f = &table[i];
    if (!arg) return errmsg_set(err, "--%s wants a value", f->name);
    char *end;
    switch (f->kind) {
    case FO_STR:
        *(const char **)((char *)o + f->off) = arg;
        if (f->off == offsetof(struct fabric_opts, kind) && strcmp(arg, "tcp") &&
            strcmp(arg, "dpdk") && strcmp(arg, "rdma"))
            return errmsg_set(err, "--%s %s: want tcp, dpdk or rdma", f->name, arg);
        return 0;
    case FO_INT:
    case FO_DBL: {
        double d = strtod(arg, &end);
        if (end == arg || *end || d < f->lo || d > f->hi)
            return errmsg_set(err, "--%s wants a number in [%ld, %ld], not '%s'", f->name, f->lo,
                              f->hi, arg);
        if (f->kind == FO_INT)
            *(int *)((char *)o + f->off) = (int)d;
        else
            *(double *)((char *)o + f->off) = d;
        return 0;
    }
    case FO_PEER:
        return add_peer(o, arg, err);
    case FO_PEERS: {
        if (o->n_peer_copy == FABRIC_MAX_PEERS) return errmsg_set(err, "--peers: too many lists");
        char *copy = strdup(arg);
        if (!copy) return errmsg_set(err, "--peers: out of memory");
        o->peer_copy[o->n_peer_copy++] = copy;
        for (char *save = NULL, *p = strtok_r(copy, ",", &save); p; p = strtok_r(NULL, ",", &save))
            if (add_peer(o, p, err)) return -1;
        return 0;
    }
    }
    return -1;
}

int fabric_opt_take(struct fabric_opts *o, int argc, char **argv, int *i, char *err)
{
    const char *a = argv[*i];
    if (strncmp(a, "--", 2)) return 0;
    for (int k = 0; k < N_OPTS; k++) {
        if (strcmp(a + 2, table[k].name)) continue;
        const char *v = *i + 1 < argc ? argv[*i + 1] : NULL;
        if (fabric_opt_set(o, k, v, err)) return -1;
        *i += 1;
        return 1;
    }
    return 0;
}

void fabric_opts_usage(FILE *f, const char *indent)
{
    for (int i = 0; i < N_OPTS; i++)
        if (table[i].help) fprintf(f, "%s[--%s %s]\n", indent, table[i].name, table[i].help);
}

int fabric_opts_config(const struct fabric_opts *o, struct tp_config *cfg, char *err)
{
    *cfg = (struct tp_config){.kind = o->kind ? o->kind : "tcp",
                              .listen = o->listen,
                              .dead_ms = o->dead_ms,
                              .eal = o->eal,
                              .exception_vdev = o->exception_vdev,
                              .mtu = o->mtu,
                              .window = o->window,
                              .rate_gbps = o->link_gbps,
                              .impair = o->impair,
                              .rdma_dev = o->rdma_dev};
    if (!o->key_file) return errmsg_set(err, "the fabric needs --key-file (the cluster key)");
    return cluster_key_load(&cfg->key, o->key_file, err);
}

void fabric_opts_free(struct fabric_opts *o)
{
    for (int i = 0; i < o->n_peer_copy; i++) free(o->peer_copy[i]);
    o->n_peer_copy = 0;
}
