/* transport: one interface for moving authenticated messages between nodes, three backends.
 *
 *   tcp  (transport_tcp.c)  kernel sockets; the fallback for machines with neither NIC kind.
 *   dpdk (transport_dpdk.c) a reliable datagram protocol over UDP/IPv4 on a DPDK port
 *                           (drivers/nic): sequence numbers, selective acks, retransmission on
 *                           timeout, a send window, pacing, jumbo frames.
 *   rdma (transport_rdma.c) messages over the TCP control channel plus one-sided RDMA READs from
 *                           the peer's registered arena (drivers/rdma): tp_pull().
 *
 * The model is Redis's ae.c: a small API, one file per mechanism behind an ops table. Everything
 * is non-blocking and driven by tp_poll() from the fabric thread: tp_send() queues a whole
 * message or answers TP_BUSY (window or buffer full: poll and retry), tp_recv() hands out the next
 * whole message in order (valid until the next tp_recv/tp_poll on that connection). A connection
 * is usable once tp_conn_state() says TP_OPEN (after the HELLO handshake, transport/auth.h); a
 * refused, failed or dead peer turns it TP_CLOSED with the reason in tp_conn_error(). */
#ifndef STRATA_TRANSPORT_H
#define STRATA_TRANSPORT_H

#include "os/common/errmsg.h"
#include "transport/auth.h"

#include <stddef.h>
#include <stdint.h>

enum tp_state { TP_CONNECTING = 0, TP_OPEN = 1, TP_CLOSED = 2 };
enum { TP_OK = 0, TP_BUSY = 1 };

struct tp_config {
    const char *kind;   /* "tcp", "dpdk", "rdma" */
    const char *listen; /* "IP:PORT" this node accepts on (and, for dpdk, its address); NULL:
                           connect only (tcp), required for dpdk */
    struct cluster_key key;
    int dead_ms; /* a peer silent this long while work is pending is dead (default 2000) */
    /* dpdk */
    const char *eal; /* EAL arguments, e.g. "-l 0 --no-pci --no-huge -m 256 --vdev=..." */
    const char *exception_vdev; /* optional TAP/virtio-user port for non-Strata traffic */
    int mtu;                    /* IP MTU of the port (default 1500) */
    int window;                 /* packets in flight per connection (default 256) */
    double rate_gbps;           /* pacing of each connection's sends; 0 = unpaced */
    const char *impair;         /* tests: "loss=P,reorder=P,delay=MS,corrupt=P,forge=P" */
    /* rdma */
    const char *rdma_dev; /* ibv device name, NULL = first */
};

struct tp_stats {
    uint64_t frames_tx, frames_rx, bytes_tx, bytes_rx;
    uint64_t retransmits, dropped_bad, dropped_dup, refused;
};

struct tp;
struct tp_conn;

struct tp_ops {
    const char *name;
    int (*open)(struct tp *t, char *err);
    struct tp_conn *(*connect)(struct tp *t, const char *addr, char *err);
    struct tp_conn *(*accept)(struct tp *t);
    int (*poll)(struct tp *t, int timeout_ms);
    int (*send)(struct tp_conn *c, const void *msg, size_t len);
    int (*recv)(struct tp_conn *c, const uint8_t **msg, size_t *len);
    size_t (*pending)(struct tp_conn *c);
    void (*close)(struct tp_conn *c);
    void (*destroy)(struct tp *t);
    /* Optional (rdma): register memory for one-sided access, and pull. */
    int (*expose)(struct tp *t, void *base, size_t len, char *err);
    int (*pull)(struct tp_conn *c, uint64_t remote_off, void *dst, size_t len, char *err);
    /* Optional: the connection now carries bulk (weight) traffic. */
    void (*set_bulk)(struct tp_conn *c);
};

struct tp {
    const struct tp_ops *ops;
    struct tp_config cfg;
    struct tp_stats stats;
    void *impl;
};

extern const struct tp_ops tp_tcp_ops, tp_dpdk_ops, tp_rdma_ops;

/* Open the backend named cfg->kind; listens when cfg->listen is set. */
struct tp *tp_open(const struct tp_config *cfg, char *err);
void tp_destroy(struct tp *t);
/* Start connecting to "IP:PORT"; the connection turns TP_OPEN or TP_CLOSED in later polls. */
struct tp_conn *tp_connect(struct tp *t, const char *addr, char *err);
/* A connection whose handshake completed on the listening side, or NULL. */
struct tp_conn *tp_accept(struct tp *t);
/* Move bytes; waits at most timeout_ms when nothing is ready (0: never blocks). */
int tp_poll(struct tp *t, int timeout_ms);
int tp_send(struct tp_conn *c, const void *msg, size_t len); /* TP_OK, TP_BUSY or -1 (closed) */
int tp_recv(struct tp_conn *c, const uint8_t **msg, size_t *len); /* 1 message, 0 none, -1 closed */
int tp_conn_state(struct tp_conn *c);
const char *tp_conn_error(struct tp_conn *c);
const char *tp_conn_peer(struct tp_conn *c);
size_t tp_pending(struct tp_conn *c); /* bytes queued or unacknowledged */
void tp_close(struct tp_conn *c);
/* One-sided transports only (rdma); others answer -1. */
int tp_expose(struct tp *t, void *base, size_t len, char *err);
int tp_pull(struct tp_conn *c, uint64_t remote_off, void *dst, size_t len, char *err);
int tp_can_pull(const struct tp *t);
int tp_can_expose(const struct tp *t); /* has expose: register the arena with the device once */
/* Mark a connection as bulk (weights). Serving traffic (activations, control) has priority on
 * a shared port: dpdk sends bulk frames only when no other connection has frames waiting; tcp
 * marks bulk sockets with a low priority and DSCP CS1 (lower effort) for the kernel's queues. */
void tp_set_bulk(struct tp_conn *c);

/* "a.b.c.d:port" -> network-order address and host-order port. */
int tp_parse_addr(const char *s, uint32_t *ip_be, uint16_t *port, char *err);

/* Every connection begins with this common part (backends embed it first): its state, error and
 * peer are read here for every backend (tp_conn_state, tp_conn_error, tp_conn_peer). */
struct tp_conn_base {
    struct tp *t;
    int state;
    int refused; /* the peer rejected our handshake (or failed ours): wrong cluster key */
    int bulk;    /* weight traffic: yields to serving traffic (tp_set_bulk) */
    char peer[48];
    char err[ERRMSG_LEN];
};

#endif
