/* fabric_opts: the command-line options that place a process on the fabric, one table for every
 * command that has them (`strata node`, `strata serve`).
 *
 *   --fabric tcp|dpdk|rdma (alias --transport)  --listen IP:PORT  --key-file FILE
 *   --node-id N  --peers A,B,...  --peer A (repeatable)  --dead-ms MS
 *   dpdk: --eal 'ARGS'  --exception-vdev VDEV  --mtu N  --window PKTS  --link-gbps G
 *         --impair loss=P,...
 *   rdma: --rdma-dev NAME
 *
 * Two ways in, same table: a getopt_long parser appends fabric_opts_getopt()'s entries to its own
 * (their `val` is FABRIC_OPT_BASE + i) and hands matching codes to fabric_opt_set(); a hand-written
 * parser asks fabric_opt_take() about each argument. fabric_opts_config() turns the result into
 * a tp_config, reading the cluster key (auth_init first). Strings point into argv (or, for
 * --peers lists, into a copy owned by the struct: fabric_opts_free). */
#ifndef STRATA_FABRIC_OPTS_H
#define STRATA_FABRIC_OPTS_H

#include "transport/transport.h"

#include <getopt.h>
#include <stdio.h>

#define FABRIC_MAX_PEERS 16
#define FABRIC_OPT_BASE  0x1000

struct fabric_opts {
    const char *kind; /* NULL: not on the fabric (serve), node defaults it to "tcp" */
    const char *listen, *key_file;
    const char *peers[FABRIC_MAX_PEERS];
    int n_peers;
    int node_id, dead_ms, mtu, window;
    double link_gbps;
    const char *eal, *exception_vdev, *rdma_dev, *impair;
    char *peer_copy[FABRIC_MAX_PEERS]; /* --peers lists, split */
    int n_peer_copy;
};

/* Number of table entries; out must have room for that many struct option. */
int fabric_opts_count(void);
void fabric_opts_getopt(struct option *out);
/* Option i of the table (i = getopt val - FABRIC_OPT_BASE) with its argument. */
int fabric_opt_set(struct fabric_opts *o, int i, const char *arg, char *err);
/* argv[*i] is "--name" [value]: returns 1 and advances *i past the value when it is a fabric
 * option, 0 when it is not, -1 (err) when it is but the value is missing or malformed. */
int fabric_opt_take(struct fabric_opts *o, int argc, char **argv, int *i, char *err);
void fabric_opts_usage(FILE *f, const char *indent);
/* tp_config for these options, key loaded from --key-file (required). */
int fabric_opts_config(const struct fabric_opts *o, struct tp_config *cfg, char *err);
void fabric_opts_free(struct fabric_opts *o);

#endif
