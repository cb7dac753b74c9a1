#include "cmd/fabric_opts.h"

#include "os/common/errmsg.h"
#include "transport/auth.h"

#include <stdlib.h>
#include <string.h>

static int parse_kind(const char *v, void *dst, char *err)
{
    if (strcmp(v, "tcp") && strcmp(v, "dpdk") && strcmp(v, "rdma"))
        return errmsg_set(err, "'%s' is not tcp, dpdk or rdma", v);
    *(const char **)dst = v;
    return 0;
}

static int add_peer(struct fabric_opts *o, const char *addr, char *err)
{
    uint32_t ip;
    uint16_t port;
    if (tp_parse_addr(addr, &ip, &port, err)) return -1;
    if (o->peers.n == OPT_LIST_MAX) return errmsg_set(err, "at most %d peers", OPT_LIST_MAX);
    o->peers.v[o->peers.n++] = addr;
    return 0;
}

/* --peers A,B,...: split into the same list --peer appends to. */
static int parse_peers(const char *v, void *dst, char *err)
{
    struct fabric_opts *o = dst;
    if (o->n_peer_copy == OPT_LIST_MAX) return errmsg_set(err, "too many lists");
    char *copy = strdup(v);
    if (!copy) return errmsg_set(err, "out of memory");
    o->peer_copy[o->n_peer_copy++] = copy;
    int n = 0;
    for (char *save = NULL, *p = strtok_r(copy, ",", &save); p; p = strtok_r(NULL, ",", &save), n++)
        if (add_peer(o, p, err)) return -1;
    return n ? 0 : errmsg_set(err, "no address in '%s'", v);
}

static int parse_peer(const char *v, void *dst, char *err)
{
    return add_peer(dst, v, err);
}

int fabric_options(struct fabric_opts *o, struct opt *t)
{
    const struct opt table[FABRIC_N_OPTS] = {
        {"--fabric", OPT_PARSE, &o->kind, 0, 0, parse_kind, "tcp|dpdk|rdma"},
        {"--transport", OPT_PARSE, &o->kind, 0, 0, parse_kind, "tcp|dpdk|rdma"},
        {"--listen", OPT_STR, &o->listen, 0, 0, NULL, "IP:PORT"},
        {"--key-file", OPT_STR, &o->key_file, 0, 0, NULL, "FILE"},
        {"--node-id", OPT_INT, &o->node_id, 0, 1 << 30, NULL, "N"},
        {"--peers", OPT_PARSE, o, 0, 0, parse_peers, "IP:PORT,..."},
        {"--peer", OPT_PARSE, o, 0, 0, parse_peer, "IP:PORT"},
        {"--dead-ms", OPT_INT, &o->dead_ms, 1, 3600000, NULL, "MS"},
        {"--eal", OPT_STR, &o->eal, 0, 0, NULL, "'EAL ARGS'"},
        {"--exception-vdev", OPT_STR, &o->exception_vdev, 0, 0, NULL, "VDEV"},
        {"--mtu", OPT_INT, &o->mtu, 0, 65535, NULL, "N"},
        {"--window", OPT_INT, &o->window, 0, 1 << 20, NULL, "PKTS"},
        {"--link-gbps", OPT_DOUBLE, &o->link_gbps, 0, 1e6, NULL, "G"},
        {"--rdma-dev", OPT_STR, &o->rdma_dev, 0, 0, NULL, "NAME"},
        {"--impair", OPT_STR, &o->impair, 0, 0, NULL, "loss=P,reorder=P,delay=MS,..."},
    };
    memcpy(t, table, sizeof table);
    return FABRIC_N_OPTS;
}

int fabric_opts_given(const struct fabric_opts *o)
{
    return o->kind || o->listen || o->peers.n;
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
