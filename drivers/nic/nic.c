#include "drivers/nic/nic.h"

#include "os/common/errmsg.h"
#include "os/runtime/log.h"

#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_memory.h>
#include <rte_ip.h>
#include <rte_mbuf.h>
#include <rte_tcp.h>
#include <rte_udp.h>
#include <glob.h>
#include <stdlib.h>
#include <unistd.h>
#include <string.h>

#define BURST    32
#define MAX_ARGS 64
#define RX_DESC  1024
#define TX_DESC  1024

struct nic {
    struct nic_config cfg;
    struct rte_mempool *pool;
    uint16_t port, exc_port;
    int have_exc;
    struct rte_ether_addr mac;
    size_t max_payload;
    struct rte_mbuf *txq[BURST];
    int n_txq;
    struct rte_mbuf *rxq[BURST];
    struct nic_stats st;
    void *ext_base;
    size_t ext_len;
};

static int eal_started;

/* The build's multiarch triplet: where Debian puts the libraries of this architecture. */
#if defined(__x86_64__)
#define NIC_MULTIARCH "x86_64-linux-gnu"
#elif defined(__aarch64__)
#define NIC_MULTIARCH "aarch64-linux-gnu"
#else
#error "drivers/nic/nic.c: no multiarch triplet for this architecture"
#endif

/* Debian's DPDK ships its drivers as plugins that the EAL does not load by itself. Unless the
 * arguments name drivers (-d), load the mempool driver and the driver of each vdev named. */
static int add_plugins(char **argv, int argc, const char *args)
{
    static const char *const dirs[] = {"/usr/lib/" NIC_MULTIARCH "/dpdk/pmds-*",
                                       "/usr/local/lib/" NIC_MULTIARCH "/dpdk/pmds-*"};
    static const struct {
        const char *vdev, *lib;
    } map[] = {
        {"net_af_packet", "librte_net_af_packet.so"}, {"net_tap", "librte_net_tap.so"},
        {"net_memif", "librte_net_memif.so"},         {"net_ring", "librte_net_ring.so"},
        {"net_virtio_user", "librte_net_virtio.so"},  {"net_af_xdp", "librte_net_af_xdp.so"}};
    static char paths[8][256];
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-d") || !strncmp(argv[i], "-d/", 3)) return argc;
    char dir[200] = "";
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0] && !dir[0]; i++) {
        glob_t g;
        if (glob(dirs[i], 0, NULL, &g) == 0 && g.gl_pathc)
            snprintf(dir, sizeof dir, "%s", g.gl_pathv[0]);
        globfree(&g);
    }
    if (!dir[0]) return argc; /* a static or self-contained DPDK */
    int n = 0;
    snprintf(paths[n++], sizeof paths[0], "%s/librte_mempool_ring.so", dir);
    for (size_t i = 0; i < sizeof map / sizeof map[0] && n < 8; i++)
        if (strstr(args, map[i].vdev))
            snprintf(paths[n++], sizeof paths[0], "%s/%s", dir, map[i].lib);
    for (int i = 0; i < n && argc + 2 < MAX_ARGS; i++) {
        if (access(paths[i], R_OK)) continue;
        argv[argc++] = "-d";
        argv[argc++] = paths[i];
    }
    return argc;
}

static int eal_init(const struct nic_config *cfg, char *err)
{
    if (eal_started) return 0;
    static char buf[2048];
    static char *argv[MAX_ARGS + 2];
    int argc = 0;
    argv[argc++] = "strata";
    snprintf(buf, sizeof buf, "%s", cfg->eal ? cfg->eal : "");
    for (char *s = strtok(buf, " \t"); s && argc < MAX_ARGS; s = strtok(NULL, " \t"))
        argv[argc++] = s;
    static char exc[256];
    if (cfg->exception_vdev && argc < MAX_ARGS) {
        snprintf(exc, sizeof exc, "--vdev=%s", cfg->exception_vdev);
        argv[argc++] = exc;
    }
    char all[2400];
    snprintf(all, sizeof all, "%s %s", cfg->eal ? cfg->eal : "",
             cfg->exception_vdev ? cfg->exception_vdev : "");
    argc = add_plugins(argv, argc, all);
    argv[argc] = NULL;
    if (rte_eal_init(argc, argv) < 0)
        return errmsg_set(err, "dpdk: rte_eal_init (%s): %s", cfg->eal ? cfg->eal : "",
                          rte_strerror(rte_errno));
    eal_started = 1;
    return 0;
}

static int port_start(struct nic *n, uint16_t port, int mtu, char *err)
{
    struct rte_eth_conf conf;
    memset(&conf, 0, sizeof conf);
    struct rte_eth_dev_info info;
    if (rte_eth_dev_info_get(port, &info))
        return errmsg_set(err, "dpdk: port %u: no device info", port);
    /* Ask for the MTU where the port says it can; af_packet reports 1518-byte frames but passes
     * whatever the kernel interface carries (its MTU is set with `ip link`). */
    if ((uint32_t)mtu + RTE_ETHER_HDR_LEN + RTE_ETHER_CRC_LEN <= info.max_rx_pktlen)
        conf.rxmode.mtu = (uint32_t)mtu;
    int r = rte_eth_dev_configure(port, 1, 1, &conf);
    if (r < 0) return errmsg_set(err, "dpdk: port %u: configure: %s", port, rte_strerror(-r));
    uint16_t rxd = RX_DESC, txd = TX_DESC;
    rte_eth_dev_adjust_nb_rx_tx_desc(port, &rxd, &txd);
    int sock = rte_eth_dev_socket_id(port);
    if (sock < 0) sock = 0;
    if ((r = rte_eth_rx_queue_setup(port, 0, rxd, (unsigned)sock, NULL, n->pool)) < 0 ||
        (r = rte_eth_tx_queue_setup(port, 0, txd, (unsigned)sock, NULL)) < 0)
        return errmsg_set(err, "dpdk: port %u: queue setup: %s", port, rte_strerror(-r));
    if ((r = rte_eth_dev_start(port)) < 0)
        return errmsg_set(err, "dpdk: port %u: start: %s", port, rte_strerror(-r));
    rte_eth_promiscuous_enable(port);
    if (rte_eth_dev_set_mtu(port, (uint16_t)mtu))
        log_info("nic", "port %u keeps its MTU (set %d on the interface itself)", port, mtu);
    return 0;
}

int nic_open(struct nic **out, const struct nic_config *cfg, char *err)
{
    *out = NULL;
    if (eal_init(cfg, err)) return -1;
    struct nic *n = calloc(1, sizeof *n);
    if (!n) return errmsg_set(err, "dpdk: out of memory");
    n->cfg = *cfg;
    int mtu = cfg->mtu > 0 ? cfg->mtu : 1500;
    uint16_t nports = rte_eth_dev_count_avail();
    if (nports == 0) {
        free(n);
        return errmsg_set(err, "dpdk: no ports (give a --vdev or bind a NIC)");
    }
    n->port = 0;
    if (cfg->exception_vdev) {
        char name[128];
        snprintf(name, sizeof name, "%s", cfg->exception_vdev);
        char *comma = strchr(name, ',');
        if (comma) *comma = 0;
        if (rte_eth_dev_get_port_by_name(name, &n->exc_port) == 0) {
            n->have_exc = 1;
            if (n->exc_port == 0) n->port = 1;
        } else {
            log_warn("nic", "exception port %s not found; non-fabric traffic is dropped", name);
        }
    }
    /* One pool for both ports; a frame never spans two mbufs. */
    unsigned room = (unsigned)mtu + RTE_ETHER_HDR_LEN + RTE_ETHER_CRC_LEN + 64;
    if (room < 2048) room = 2048;
    /* af_packet wants a whole ring frame (framesz, 12288 for jumbo in tests) to fit an mbuf. */
    if (mtu > 1500 && room < 12288) room = 12288;
    unsigned count = mtu > 1500 ? 4095 : 8191;
    n->pool =
        rte_pktmbuf_pool_create("strata_mbufs", count, 256, 0,
                                (uint16_t)(room + RTE_PKTMBUF_HEADROOM), (int)rte_socket_id());
    if (!n->pool) {
        errmsg_set(err, "dpdk: mbuf pool of %u x %u bytes: %s", count, room,
                   rte_strerror(rte_errno));
        free(n);
        return -1;
    }
    if (port_start(n, n->port, mtu, err) || (n->have_exc && port_start(n, n->exc_port, mtu, err))) {
        rte_mempool_free(n->pool);
        free(n);
        return -1;
    }
    rte_eth_macaddr_get(n->port, &n->mac);
    n->max_payload = (size_t)mtu - sizeof(struct rte_ipv4_hdr) - sizeof(struct rte_udp_hdr);
    *out = n;
    return 0;
}

void nic_close(struct nic *n)
{
    if (!n) return;
    nic_flush(n);
    rte_eth_dev_stop(n->port);
    rte_eth_dev_close(n->port);
    if (n->have_exc) {
        rte_eth_dev_stop(n->exc_port);
        rte_eth_dev_close(n->exc_port);
    }
    rte_mempool_free(n->pool);
    if (n->ext_base) rte_extmem_unregister(n->ext_base, n->ext_len);
    free(n);
}

int nic_register_memory(struct nic *n, void *base, size_t len, size_t page_size, char *err)
{
    if (n->ext_base) return errmsg_set(err, "dpdk: the arena is already registered");
    uintptr_t b = (uintptr_t)base & ~(uintptr_t)(page_size - 1);
    size_t l = ((uintptr_t)base + len - b + page_size - 1) & ~(page_size - 1);
    if (rte_extmem_register((void *)b, l, NULL, 0, page_size))
        return errmsg_set(err, "dpdk: rte_extmem_register of %zu MiB: %s", l >> 20,
                          rte_strerror(rte_errno));
    n->ext_base = (void *)b;
    n->ext_len = l;
    return 0;
}

/* A sender on the same host (veth) may leave TCP/UDP checksums for the NIC to fill in
 * (CHECKSUM_PARTIAL); af_packet hands them over unfinished and the kernel behind the TAP would
 * drop them. Exception traffic is light: finish every IPv4 TCP/UDP checksum in software. */
static void fix_l4_checksum(struct rte_mbuf *m)
{
    uint32_t len = rte_pktmbuf_data_len(m);
    struct rte_ether_hdr *eh = rte_pktmbuf_mtod(m, struct rte_ether_hdr *);
    if (len < sizeof *eh + sizeof(struct rte_ipv4_hdr) ||
        eh->ether_type != rte_cpu_to_be_16(RTE_ETHER_TYPE_IPV4))
        return;
    struct rte_ipv4_hdr *ip = (struct rte_ipv4_hdr *)(eh + 1);
    size_t ihl = (size_t)(ip->version_ihl & 0xf) * 4;
    size_t ip_len = rte_be_to_cpu_16(ip->total_length);
    if (ihl < 20 || sizeof *eh + ip_len > len || ip_len < ihl + 8 ||
        (ip->fragment_offset & rte_cpu_to_be_16(0x3fff)))
        return;
    void *l4 = (uint8_t *)ip + ihl;
    if (ip->next_proto_id == IPPROTO_TCP && ip_len >= ihl + sizeof(struct rte_tcp_hdr)) {
        struct rte_tcp_hdr *t = l4;
        t->cksum = 0;
        t->cksum = rte_ipv4_udptcp_cksum(ip, l4);
    } else if (ip->next_proto_id == IPPROTO_UDP) {
        struct rte_udp_hdr *u = l4;
        u->dgram_cksum = 0;
        u->dgram_cksum = rte_ipv4_udptcp_cksum(ip, l4);
    }
}

/* Pass frames between the port and the exception port (the kernel's view of the wire). */
static void exception_out(struct nic *n, struct rte_mbuf *m)
{
    if (n->have_exc) fix_l4_checksum(m);
    if (!n->have_exc || rte_eth_tx_burst(n->exc_port, 0, &m, 1) != 1) {
        rte_pktmbuf_free(m);
        return;
    }
    n->st.exception_to_kernel++;
}

static void exception_in(struct nic *n)
{
    if (!n->have_exc) return;
    struct rte_mbuf *m[BURST];
    uint16_t k = rte_eth_rx_burst(n->exc_port, 0, m, BURST);
    if (!k) return;
    uint16_t sent = rte_eth_tx_burst(n->port, 0, m, k);
    n->st.exception_from_kernel += sent;
    for (uint16_t i = sent; i < k; i++) rte_pktmbuf_free(m[i]);
}

int nic_rx(struct nic *n, struct nic_dgram *d, int max)
{
    exception_in(n);
    if (max > BURST) max = BURST;
    uint16_t k = rte_eth_rx_burst(n->port, 0, n->rxq, (uint16_t)max);
    int got = 0;
    for (uint16_t i = 0; i < k; i++) {
        struct rte_mbuf *m = n->rxq[i];
        uint32_t len = rte_pktmbuf_data_len(m);
        uint8_t *p = rte_pktmbuf_mtod(m, uint8_t *);
        struct rte_ether_hdr *eh = (struct rte_ether_hdr *)p;
        /* af_packet also hands back what this port itself sent. */
        if (rte_is_same_ether_addr(&eh->src_addr, &n->mac)) {
            n->st.rx_own++;
            rte_pktmbuf_free(m);
            continue;
        }
        if (len < sizeof *eh + sizeof(struct rte_ipv4_hdr) + sizeof(struct rte_udp_hdr) ||
            eh->ether_type != rte_cpu_to_be_16(RTE_ETHER_TYPE_IPV4))
            goto other;
        struct rte_ipv4_hdr *ip = (struct rte_ipv4_hdr *)(eh + 1);
        size_t ihl = (size_t)(ip->version_ihl & 0xf) * 4;
        if ((ip->version_ihl >> 4) != 4 || ihl < 20 || ip->next_proto_id != IPPROTO_UDP ||
            ip->dst_addr != n->cfg.ip_be || (ip->fragment_offset & rte_cpu_to_be_16(0x3fff)))
            goto other;
        size_t ip_len = rte_be_to_cpu_16(ip->total_length);
        if (ip_len < ihl + sizeof(struct rte_udp_hdr) || sizeof *eh + ip_len > len) goto other;
        struct rte_udp_hdr *udp = (struct rte_udp_hdr *)((uint8_t *)ip + ihl);
        if (udp->dst_port != rte_cpu_to_be_16(n->cfg.udp_port)) goto other;
        size_t ulen = rte_be_to_cpu_16(udp->dgram_len);
        if (ulen < sizeof *udp || ulen > ip_len - ihl) goto other;
        d[got].data = (const uint8_t *)(udp + 1);
        d[got].len = (uint16_t)(ulen - sizeof *udp);
        d[got].src_ip_be = ip->src_addr;
        d[got].src_port = rte_be_to_cpu_16(udp->src_port);
        memcpy(d[got].src_mac, eh->src_addr.addr_bytes, 6);
        d[got].mbuf = m;
        n->st.rx_pkts++;
        n->st.rx_bytes += len;
        got++;
        continue;
    other:
        n->st.rx_other++;
        exception_out(n, m);
    }
    return got;
}

void nic_rx_done(struct nic *n, struct nic_dgram *d, int count)
{
    (void)n;
    for (int i = 0; i < count; i++) rte_pktmbuf_free(d[i].mbuf);
}

int nic_flush(struct nic *n)
{
    if (!n->n_txq) return 0;
    uint16_t sent = rte_eth_tx_burst(n->port, 0, n->txq, (uint16_t)n->n_txq);
    n->st.tx_pkts += sent;
    if (sent < n->n_txq) {
        /* Ring full: drop the rest; the reliable layer retransmits. Holding them would let one
         * slow port stall the fabric loop. */
        for (int i = sent; i < n->n_txq; i++) rte_pktmbuf_free(n->txq[i]);
        n->st.tx_dropped += (uint64_t)(n->n_txq - sent);
    }
    n->n_txq = 0;
    return 0;
}

int nic_tx(struct nic *n, const uint8_t *dst_mac, uint32_t dst_ip_be, uint16_t dst_port,
           const void *hdr, size_t hlen, const void *body, size_t blen)
{
    size_t plen = hlen + blen;
    if (plen > n->max_payload) return -1;
    struct rte_mbuf *m = rte_pktmbuf_alloc(n->pool);
    if (!m) {
        n->st.tx_dropped++;
        return -1;
    }
    size_t flen = sizeof(struct rte_ether_hdr) + sizeof(struct rte_ipv4_hdr) +
                  sizeof(struct rte_udp_hdr) + plen;
    uint8_t *p = (uint8_t *)rte_pktmbuf_append(m, (uint16_t)flen);
    if (!p) {
        rte_pktmbuf_free(m);
        return -1;
    }
    struct rte_ether_hdr *eh = (struct rte_ether_hdr *)p;
    if (dst_mac)
        memcpy(eh->dst_addr.addr_bytes, dst_mac, 6);
    else
        memset(eh->dst_addr.addr_bytes, 0xff, 6);
    rte_ether_addr_copy(&n->mac, &eh->src_addr);
    eh->ether_type = rte_cpu_to_be_16(RTE_ETHER_TYPE_IPV4);
    struct rte_ipv4_hdr *ip = (struct rte_ipv4_hdr *)(eh + 1);
    memset(ip, 0, sizeof *ip);
    ip->version_ihl = 0x45;
    ip->total_length = rte_cpu_to_be_16((uint16_t)(sizeof *ip + sizeof(struct rte_udp_hdr) + plen));
    ip->fragment_offset = rte_cpu_to_be_16(RTE_IPV4_HDR_DF_FLAG);
    ip->time_to_live = 64;
    ip->next_proto_id = IPPROTO_UDP;
    ip->src_addr = n->cfg.ip_be;
    ip->dst_addr = dst_ip_be;
    ip->hdr_checksum = rte_ipv4_cksum(ip);
    struct rte_udp_hdr *udp = (struct rte_udp_hdr *)(ip + 1);
    udp->src_port = rte_cpu_to_be_16(n->cfg.udp_port);
    udp->dst_port = rte_cpu_to_be_16(dst_port);
    udp->dgram_len = rte_cpu_to_be_16((uint16_t)(sizeof *udp + plen));
    udp->dgram_cksum = 0; /* optional in IPv4; the fabric frame carries its own CRC-32C */
    memcpy(udp + 1, hdr, hlen);
    if (blen) memcpy((uint8_t *)(udp + 1) + hlen, body, blen);
    n->st.tx_bytes += flen;
    n->txq[n->n_txq++] = m;
    if (n->n_txq == BURST) nic_flush(n);
    return 0;
}

void nic_mac(const struct nic *n, uint8_t mac[6])
{
    memcpy(mac, n->mac.addr_bytes, 6);
}

size_t nic_max_payload(const struct nic *n)
{
    return n->max_payload;
}

const struct nic_stats *nic_stats(const struct nic *n)
{
    return &n->st;
}
