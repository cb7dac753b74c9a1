/* fabric_opts: the options that put a process on the fabric, one table shared by every command
 * that has them (`strata node`, `strata serve`), in cmd/options.h's format:
 *
 *   --fabric tcp|dpdk|rdma (alias --transport)  --listen IP:PORT  --key-file FILE
 *   --node-id N  --peers A,B,...  --peer A (repeatable; both fill one list)  --dead-ms MS
 *   dpdk: --eal 'ARGS'  --exception-vdev VDEV  --mtu N  --window PKTS  --link-gbps G
 *         --impair loss=P,...
 *   rdma: --rdma-dev NAME
 *
 * A command appends fabric_options()'s entries to its own table before opts_parse (so usage and
 * parsing read the same list), then turns the result into a tp_config with fabric_opts_config
 * (which reads the cluster key: call auth_init first). Strings point into argv, or for --peers
 * lists into copies the struct owns (fabric_opts_free). */
#ifndef STRATA_FABRIC_OPTS_H
#define STRATA_FABRIC_OPTS_H

#include "cmd/options.h"
#include "transport/transport.h"

#define FABRIC_N_OPTS 15 /* entries fabric_options() writes */

struct fabric_opts {
    const char *kind; /* NULL: not given (serve: not on the fabric; node: tcp) */
    const char *listen, *key_file;
    struct opt_list peers;
    int node_id, dead_ms, mtu, window;
    double link_gbps;
    const char *eal, *exception_vdev, *rdma_dev, *impair;
    char *peer_copy[OPT_LIST_MAX]; /* --peers lists, split at commas */
    int n_peer_copy;
};

/* Writes FABRIC_N_OPTS entries pointing into o at t; returns that count. */
int fabric_options(struct fabric_opts *o, struct opt *t);
/* 1 when any fabric option was given (serve joins the fabric then). */
int fabric_opts_given(const struct fabric_opts *o);
/* tp_config for these options, the key read from --key-file (required). */
int fabric_opts_config(const struct fabric_opts *o, struct tp_config *cfg, char *err);
void fabric_opts_free(struct fabric_opts *o);

#endif
