/* rdma_selftest: drivers/rdma end to end on one device (run inside the QEMU guest with
 * Soft-RoCE): one region registered once, two RC queue pairs connected to each other, then an
 * RDMA READ and an RDMA WRITE with immediate between the two halves of the region, each checked
 * byte for byte, and the immediate checked at the receiving queue pair. Prints "ok - NAME" or
 * "not ok - NAME: why" lines. */
#include "drivers/rdma/rdma.h"
#include "os/common/errmsg.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HALF (4u << 20)

int main(int argc, char **argv)
{
    char err[ERRMSG_LEN];
    struct rdma_dev *d;
    if (rdma_open(&d, argc > 1 ? argv[1] : NULL, 1, err)) {
        printf("not ok - rdma_driver_open: %s\n", err);
        return 1;
    }
    uint8_t *buf = aligned_alloc(4096, 2 * HALF);
    struct rdma_region reg;
    if (!buf || rdma_register(d, buf, 2 * HALF, &reg, err)) {
        printf("not ok - rdma_driver_register: %s\n", err);
        return 1;
    }
    struct rdma_region again;
    int twice = rdma_register(d, buf, HALF, &again, err) == 0;
    struct rdma_qp *a, *b;
    struct rdma_qp_info ia, ib;
    if (rdma_qp_create(d, &a, &ia, err) || rdma_qp_create(d, &b, &ib, err) ||
        rdma_qp_connect(a, &ib, err) || rdma_qp_connect(b, &ia, err)) {
        printf("not ok - rdma_driver_qp: %s\n", err);
        return 1;
    }
    int rc = 0;
    /* READ: a pulls the upper half into the lower half. */
    for (size_t i = 0; i < HALF; i++) buf[HALF + i] = (uint8_t)(i * 7 + 3), buf[i] = 0;
    if (rdma_read(a, buf, HALF, reg.addr + HALF, reg.rkey, 5000, err))
        printf("not ok - rdma_driver_read: %s\n", err), rc = 1;
    else if (memcmp(buf, buf + HALF, HALF))
        printf("not ok - rdma_driver_read: bytes differ\n"), rc = 1;
    else
        printf("ok - rdma_driver_read (4 MiB, one-sided)\n");
    /* WRITE with immediate: a pushes 1 MiB of the lower half into the upper; b sees the imm. */
    for (size_t i = 0; i < HALF; i++) buf[i] = (uint8_t)(i * 13 + 1);
    uint32_t imm = 0;
    if (rdma_post_recv(b, err) ||
        rdma_write_imm(a, buf, 1u << 20, reg.addr + HALF, reg.rkey, 0xC0FFEE, 5000, err) ||
        rdma_wait_imm(b, &imm, 5000, err))
        printf("not ok - rdma_driver_write_imm: %s\n", err), rc = 1;
    else if (imm != 0xC0FFEE || memcmp(buf, buf + HALF, 1u << 20))
        printf("not ok - rdma_driver_write_imm: imm 0x%x or bytes differ\n", imm), rc = 1;
    else
        printf("ok - rdma_driver_write_imm (1 MiB, immediate 0x%x)\n", imm);
    if (twice)
        printf("not ok - rdma_driver_register_once: a second registration was accepted\n"), rc = 1;
    else
        printf("ok - rdma_driver_register_once\n");
    rdma_qp_destroy(a);
    rdma_qp_destroy(b);
    rdma_close(d);
    free(buf);
    return rc;
}
