#include "drivers/rdma/rdma.h"

#include "os/runtime/clock.h"
#include "os/common/errmsg.h"
#include "os/runtime/log.h"

#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PORT     1
#define CQ_DEPTH 256
#define MAX_WR   64

struct rdma_dev {
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_comp_channel *ch;
    struct ibv_cq *cq;
    struct ibv_mr *mr;
    struct ibv_port_attr port;
    union ibv_gid gid;
    int gid_index;
    int event_mode;
    uint64_t next_wr;
    /* Received immediates seen while waiting for something else (one CQ serves all). */
    uint32_t imm[64];
    int n_imm;
    char name[64];
};

struct rdma_qp {
    struct rdma_dev *d;
    struct ibv_qp *qp;
    uint32_t psn;
};

int rdma_open(struct rdma_dev **out, const char *name, int event_mode, char *err)
{
    *out = NULL;
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    if (!list || n == 0) {
        if (list) ibv_free_device_list(list);
        return errmsg_set(err, "rdma: no RDMA devices (load rdma_rxe and `rdma link add`?)");
    }
    struct ibv_device *dev = NULL;
    for (int i = 0; i < n && !dev; i++)
        if (!name || !strcmp(ibv_get_device_name(list[i]), name)) dev = list[i];
    if (!dev) {
        ibv_free_device_list(list);
        return errmsg_set(err, "rdma: no device named %s", name);
    }
    struct rdma_dev *d = calloc(1, sizeof *d);
    if (!d) {
        ibv_free_device_list(list);
        return errmsg_set(err, "rdma: out of memory");
    }
    snprintf(d->name, sizeof d->name, "%s", ibv_get_device_name(dev));
    d->event_mode = event_mode;
    d->ctx = ibv_open_device(dev);
    ibv_free_device_list(list);
    if (!d->ctx) {
        errmsg_set(err, "rdma: %s: ibv_open_device: %s", d->name, strerror(errno));
        goto fail;
    }
    if (ibv_query_port(d->ctx, PORT, &d->port)) {
        errmsg_set(err, "rdma: %s: query port: %s", d->name, strerror(errno));
        goto fail;
    }
    /* RoCE: prefer an IPv4-mapped GID (::ffff:a.b.c.d, RoCEv2 over the node's IPv4 address): it
     * exists as soon as the address does, while the IPv6 link-local one waits for DAD. */
    d->gid_index = -1;
    for (int i = 0; i < d->port.gid_tbl_len && i < 32; i++) {
        union ibv_gid g;
        if (ibv_query_gid(d->ctx, PORT, i, &g)) continue;
        static const uint8_t v4[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        static const uint8_t zero[16];
        if (!memcmp(g.raw, zero, 16)) continue;
        if (d->gid_index < 0 || !memcmp(g.raw, v4, 12)) {
            d->gid_index = i;
            d->gid = g;
            if (!memcmp(g.raw, v4, 12)) break;
        }
    }
    if (d->gid_index < 0) {
        if (d->port.link_layer == IBV_LINK_LAYER_ETHERNET) {
            errmsg_set(err, "rdma: %s: no GID (does its netdev have an address?)", d->name);
            goto fail;
        }
        d->gid_index = 0;
    }
    d->pd = ibv_alloc_pd(d->ctx);
    if (!d->pd) {
        errmsg_set(err, "rdma: %s: ibv_alloc_pd: %s", d->name, strerror(errno));
        goto fail;
    }
    if (event_mode) {
        d->ch = ibv_create_comp_channel(d->ctx);
        if (!d->ch) {
            errmsg_set(err, "rdma: %s: completion channel: %s", d->name, strerror(errno));
            goto fail;
        }
        int fl = fcntl(d->ch->fd, F_GETFL);
        fcntl(d->ch->fd, F_SETFL, fl | O_NONBLOCK);
    }
    d->cq = ibv_create_cq(d->ctx, CQ_DEPTH, NULL, d->ch, 0);
    if (!d->cq) {
        errmsg_set(err, "rdma: %s: ibv_create_cq: %s", d->name, strerror(errno));
        goto fail;
    }
    if (event_mode && ibv_req_notify_cq(d->cq, 0)) {
        errmsg_set(err, "rdma: %s: ibv_req_notify_cq failed", d->name);
        goto fail;
    }
    *out = d;
    return 0;
fail:
    rdma_close(d);
    return -1;
}

void rdma_close(struct rdma_dev *d)
{
    if (!d) return;
    if (d->mr) ibv_dereg_mr(d->mr);
    if (d->cq) ibv_destroy_cq(d->cq);
    if (d->ch) ibv_destroy_comp_channel(d->ch);
    if (d->pd) ibv_dealloc_pd(d->pd);
    if (d->ctx) ibv_close_device(d->ctx);
    free(d);
}

const char *rdma_dev_name(const struct rdma_dev *d)
{
    return d->name;
}

int rdma_register(struct rdma_dev *d, void *base, size_t len, struct rdma_region *out, char *err)
{
    if (d->mr) return errmsg_set(err, "rdma: %s: the arena is already registered", d->name);
    d->mr = ibv_reg_mr(d->pd, base, len,
                       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE);
    if (!d->mr)
        return errmsg_set(err, "rdma: %s: ibv_reg_mr of %zu MiB: %s", d->name, len >> 20,
                          strerror(errno));
    out->addr = (uint64_t)(uintptr_t)base;
    out->len = len;
    out->rkey = d->mr->rkey;
    return 0;
}

int rdma_qp_create(struct rdma_dev *d, struct rdma_qp **out, struct rdma_qp_info *local, char *err)
{
    struct rdma_qp *q = calloc(1, sizeof *q);
    if (!q) return errmsg_set(err, "rdma: out of memory");
    q->d = d;
    struct ibv_qp_init_attr ia = {
        .send_cq = d->cq,
        .recv_cq = d->cq,
        .cap = {.max_send_wr = MAX_WR, .max_recv_wr = MAX_WR, .max_send_sge = 1, .max_recv_sge = 1},
        .qp_type = IBV_QPT_RC,
        .sq_sig_all = 1,
    };
    q->qp = ibv_create_qp(d->pd, &ia);
    if (!q->qp) {
        free(q);
        return errmsg_set(err, "rdma: %s: ibv_create_qp: %s", d->name, strerror(errno));
    }
    struct ibv_qp_attr a = {
        .qp_state = IBV_QPS_INIT,
        .pkey_index = 0,
        .port_num = PORT,
        .qp_access_flags =
            IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE,
    };
    if (ibv_modify_qp(q->qp, &a,
                      IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) {
        ibv_destroy_qp(q->qp);
        free(q);
        return errmsg_set(err, "rdma: %s: QP to INIT: %s", d->name, strerror(errno));
    }
    uint32_t r;
    do r = (uint32_t)rand() & 0xffffff;
    while (!r);
    q->psn = r;
    local->qpn = q->qp->qp_num;
    local->psn = q->psn;
    local->lid = d->port.lid;
    memcpy(local->gid, d->gid.raw, 16);
    *out = q;
    return 0;
}

int rdma_qp_connect(struct rdma_qp *q, const struct rdma_qp_info *remote, char *err)
{
    struct rdma_dev *d = q->d;
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = d->port.active_mtu;
    a.dest_qp_num = remote->qpn;
    a.rq_psn = remote->psn;
    a.max_dest_rd_atomic = 16;
    a.min_rnr_timer = 12;
    a.ah_attr.port_num = PORT;
    a.ah_attr.dlid = remote->lid;
    /* RoCE (Soft-RoCE included) routes by GID: a global route header is mandatory. */
    if (d->port.link_layer == IBV_LINK_LAYER_ETHERNET || remote->lid == 0) {
        a.ah_attr.is_global = 1;
        memcpy(a.ah_attr.grh.dgid.raw, remote->gid, 16);
        a.ah_attr.grh.sgid_index = (uint8_t)d->gid_index;
        a.ah_attr.grh.hop_limit = 1;
    }
    if (ibv_modify_qp(q->qp, &a,
                      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
        return errmsg_set(err, "rdma: %s: QP to RTR: %s", d->name, strerror(errno));
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.sq_psn = q->psn;
    a.max_rd_atomic = 16;
    if (ibv_modify_qp(q->qp, &a,
                      IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                          IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
        return errmsg_set(err, "rdma: %s: QP to RTS: %s", d->name, strerror(errno));
    return 0;
}

void rdma_qp_destroy(struct rdma_qp *q)
{
    if (!q) return;
    ibv_destroy_qp(q->qp);
    free(q);
}

/* Wait for the completion of work request `wr_id`. */
static int wait_wc(struct rdma_dev *d, uint64_t wr_id, struct ibv_wc *out, int timeout_ms,
                   const char *what, char *err)
{
    double deadline = (clock_now() * 1e3) + timeout_ms;
    for (;;) {
        struct ibv_wc wc;
        int n;
        while ((n = ibv_poll_cq(d->cq, 1, &wc)) > 0) {
            if (wc.status != IBV_WC_SUCCESS)
                return errmsg_set(err, "rdma: %s: %s failed: %s", d->name, what,
                                  ibv_wc_status_str(wc.status));
            if (wc.wr_id == wr_id) {
                if (out) *out = wc;
                return 0;
            }
            if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM && d->n_imm < 64)
                d->imm[d->n_imm++] = be32toh(wc.imm_data);
        }
        if (n < 0) return errmsg_set(err, "rdma: %s: ibv_poll_cq failed", d->name);
        double left = deadline - (clock_now() * 1e3);
        if (left <= 0)
            return errmsg_set(err, "rdma: %s: %s timed out after %d ms", d->name, what, timeout_ms);
        if (d->event_mode) {
            struct pollfd pf = {d->ch->fd, POLLIN, 0};
            if (poll(&pf, 1, (int)left + 1) > 0) {
                struct ibv_cq *cq;
                void *ctx;
                if (ibv_get_cq_event(d->ch, &cq, &ctx) == 0) {
                    ibv_ack_cq_events(cq, 1);
                    ibv_req_notify_cq(cq, 0);
                }
            }
        }
    }
}

int rdma_read(struct rdma_qp *q, void *local, size_t len, uint64_t remote_addr, uint32_t rkey,
              int timeout_ms, char *err)
{
    struct rdma_dev *d = q->d;
    if (!d->mr) return errmsg_set(err, "rdma: %s: no registered region", d->name);
    struct ibv_sge sge = {(uint64_t)(uintptr_t)local, (uint32_t)len, d->mr->lkey};
    struct ibv_send_wr wr = {.wr_id = ++d->next_wr,
                             .sg_list = &sge,
                             .num_sge = 1,
                             .opcode = IBV_WR_RDMA_READ,
                             .send_flags = IBV_SEND_SIGNALED};
    wr.wr.rdma.remote_addr = remote_addr;
    wr.wr.rdma.rkey = rkey;
    struct ibv_send_wr *bad;
    if (ibv_post_send(q->qp, &wr, &bad))
        return errmsg_set(err, "rdma: %s: post READ: %s", d->name, strerror(errno));
    return wait_wc(d, wr.wr_id, NULL, timeout_ms, "READ", err);
}

int rdma_write_imm(struct rdma_qp *q, const void *local, size_t len, uint64_t remote_addr,
                   uint32_t rkey, uint32_t imm, int timeout_ms, char *err)
{
    struct rdma_dev *d = q->d;
    if (!d->mr) return errmsg_set(err, "rdma: %s: no registered region", d->name);
    struct ibv_sge sge = {(uint64_t)(uintptr_t)local, (uint32_t)len, d->mr->lkey};
    struct ibv_send_wr wr = {.wr_id = ++d->next_wr,
                             .sg_list = &sge,
                             .num_sge = 1,
                             .opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
                             .send_flags = IBV_SEND_SIGNALED,
                             .imm_data = htobe32(imm)};
    wr.wr.rdma.remote_addr = remote_addr;
    wr.wr.rdma.rkey = rkey;
    struct ibv_send_wr *bad;
    if (ibv_post_send(q->qp, &wr, &bad))
        return errmsg_set(err, "rdma: %s: post WRITE_WITH_IMM: %s", d->name, strerror(errno));
    return wait_wc(d, wr.wr_id, NULL, timeout_ms, "WRITE_WITH_IMM", err);
}

int rdma_post_recv(struct rdma_qp *q, char *err)
{
    struct rdma_dev *d = q->d;
    struct ibv_recv_wr wr = {.wr_id = ++d->next_wr | (1ull << 63), .sg_list = NULL, .num_sge = 0};
    struct ibv_recv_wr *bad;
    if (ibv_post_recv(q->qp, &wr, &bad))
        return errmsg_set(err, "rdma: %s: post receive: %s", d->name, strerror(errno));
    return 0;
}

int rdma_wait_imm(struct rdma_qp *q, uint32_t *imm, int timeout_ms, char *err)
{
    struct rdma_dev *d = q->d;
    double deadline = (clock_now() * 1e3) + timeout_ms;
    for (;;) {
        if (d->n_imm) {
            *imm = d->imm[0];
            memmove(d->imm, d->imm + 1, (size_t)--d->n_imm * sizeof d->imm[0]);
            return 0;
        }
        struct ibv_wc wc;
        int n = ibv_poll_cq(d->cq, 1, &wc);
        if (n > 0) {
            if (wc.status != IBV_WC_SUCCESS)
                return errmsg_set(err, "rdma: %s: receive failed: %s", d->name,
                                  ibv_wc_status_str(wc.status));
            if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
                *imm = be32toh(wc.imm_data);
                return 0;
            }
            continue;
        }
        if (n < 0) return errmsg_set(err, "rdma: %s: ibv_poll_cq failed", d->name);
        if ((clock_now() * 1e3) > deadline)
            return errmsg_set(err, "rdma: %s: no immediate in %d ms", d->name, timeout_ms);
        if (d->event_mode) {
            struct pollfd pf = {d->ch->fd, POLLIN, 0};
            if (poll(&pf, 1, 10) > 0) {
                struct ibv_cq *cq;
                void *ctx;
                if (ibv_get_cq_event(d->ch, &cq, &ctx) == 0) {
                    ibv_ack_cq_events(cq, 1);
                    ibv_req_notify_cq(cq, 0);
                }
            }
        }
    }
}
