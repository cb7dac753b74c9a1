/* nic: the DPDK port that carries the fabric's UDP/IPv4 datagrams.
 *
 * nic_open() runs the EAL with the arguments from the configuration (core list, --vdev devices,
 * --no-huge or hugepages; in tests net_af_packet on a veth, on an appliance the virtio or real
 * NIC), creates one mbuf pool sized for the MTU (jumbo frames where the port takes them), and
 * starts port 0 with one rx and one tx queue. It is the l2fwd shape: nic_rx() is one rx burst,
 * nic_tx() fills a tx burst that leaves when full or on nic_flush().
 *
 * Only IPv4/UDP datagrams to this node's address and port reach the caller. Everything else
 * (ARP, ICMP, the HTTP API's TCP) goes to the kernel through the exception port, a TAP or
 * virtio-user vdev named in the configuration, and what the kernel sends there goes out on the
 * port, so kernel sockets keep working on the same wire; without an exception port it is
 * dropped and counted. No DPDK type appears in this header: transport/ compiles without DPDK. */
#ifndef STRATA_NIC_H
#define STRATA_NIC_H

#include <stddef.h>
#include <stdint.h>

struct nic_config {
    const char *eal;            /* EAL arguments separated by spaces */
    const char *exception_vdev; /* e.g. "net_tap0,iface=strata0", or NULL */
    int mtu;                    /* IP MTU */
    uint32_t ip_be;             /* this node's IPv4 address, network order */
    uint16_t udp_port;          /* this node's fabric port, host order */
};

struct nic_dgram {
    const uint8_t *data; /* UDP payload, valid until nic_rx_done */
    uint16_t len;
    uint32_t src_ip_be;
    uint16_t src_port;
    uint8_t src_mac[6];
    void *mbuf;
};

struct nic_stats {
    uint64_t rx_pkts, tx_pkts, rx_bytes, tx_bytes, tx_dropped, rx_other, rx_own;
    uint64_t exception_to_kernel, exception_from_kernel;
};

struct nic;
int nic_open(struct nic **out, const struct nic_config *cfg, char *err);
void nic_close(struct nic *n);
/* Up to max Strata datagrams; the rest of the burst is passed to the exception port. */
int nic_rx(struct nic *n, struct nic_dgram *d, int max);
void nic_rx_done(struct nic *n, struct nic_dgram *d, int count);
/* Queue one datagram (hdr then body, copied) to dst; dst_mac NULL = broadcast. -1 if no mbuf. */
int nic_tx(struct nic *n, const uint8_t *dst_mac, uint32_t dst_ip_be, uint16_t dst_port,
           const void *hdr, size_t hlen, const void *body, size_t blen);
/* Send what is queued; returns the number of frames still waiting (tx ring full). */
int nic_flush(struct nic *n);
void nic_mac(const struct nic *n, uint8_t mac[6]);
size_t nic_max_payload(const struct nic *n); /* UDP payload bytes per datagram */
const struct nic_stats *nic_stats(const struct nic *n);
/* Register the pinned arena with DPDK once (rte_extmem_register), so frames can later be sent
 * from it without a copy; base and len are rounded out to page_size inside the mapping. */
int nic_register_memory(struct nic *n, void *base, size_t len, size_t page_size, char *err);

#endif
