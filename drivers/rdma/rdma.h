/* rdma: libibverbs for the fabric: one device, one protection domain, the pinned arena registered
 * once, reliable-connected queue pairs, one-sided RDMA READ and WRITE with immediate.
 *
 * rdma_open() opens the named device (or the first), allocates the PD, one completion queue and,
 * in event mode, a completion channel: waiting then sleeps in the kernel instead of spinning
 * (under software emulation with Soft-RoCE this was ~20x faster than busy polling, and on a
 * serving node it leaves the cores to compute). rdma_register() registers one memory region, the
 * arena, once per device: per-tensor registration is what makes peers slow to start. Queue pairs
 * are created, their addresses (QPN, PSN, GID) exchanged over the authenticated control channel
 * by the caller, then connected (INIT -> RTR -> RTS). rdma_read() and rdma_write_imm() post one
 * work request and wait for its completion (timeout_ms), so a dead peer becomes an error, not a
 * hang. No verbs type appears here. */
#ifndef STRATA_RDMA_H
#define STRATA_RDMA_H

#include <stddef.h>
#include <stdint.h>

struct rdma_dev;
struct rdma_qp;

struct rdma_qp_info {
    uint32_t qpn, psn;
    uint16_t lid;
    uint8_t gid[16];
};

struct rdma_region {
    uint64_t addr;
    uint64_t len;
    uint32_t rkey;
};

int rdma_open(struct rdma_dev **out, const char *name, int event_mode, char *err);
void rdma_close(struct rdma_dev *d);
const char *rdma_dev_name(const struct rdma_dev *d);
/* Register [base, base+len) for local access and remote READ/WRITE. Once per device. */
int rdma_register(struct rdma_dev *d, void *base, size_t len, struct rdma_region *out, char *err);
int rdma_qp_create(struct rdma_dev *d, struct rdma_qp **out, struct rdma_qp_info *local, char *err);
int rdma_qp_connect(struct rdma_qp *qp, const struct rdma_qp_info *remote, char *err);
void rdma_qp_destroy(struct rdma_qp *qp);
/* One-sided: copy len bytes from the peer's remote_addr (rkey) into local (inside the region). */
int rdma_read(struct rdma_qp *qp, void *local, size_t len, uint64_t remote_addr, uint32_t rkey,
              int timeout_ms, char *err);
/* One-sided write that also raises a completion with `imm` at the peer (which must have posted
 * a receive with rdma_post_recv). */
int rdma_write_imm(struct rdma_qp *qp, const void *local, size_t len, uint64_t remote_addr,
                   uint32_t rkey, uint32_t imm, int timeout_ms, char *err);
int rdma_post_recv(struct rdma_qp *qp, char *err);
/* Wait for a received immediate (after rdma_post_recv). */
int rdma_wait_imm(struct rdma_qp *qp, uint32_t *imm, int timeout_ms, char *err);

#endif
