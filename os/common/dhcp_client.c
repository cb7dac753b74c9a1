/* dhcp_client: see dhcp_client.h. */
#include "os/common/dhcp_client.h"

#include "os/common/errmsg.h"

#include <arpa/inet.h>
#include <errno.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

static const uint8_t broadcast_mac[6] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff};

struct link {
    int fd, ifindex;
    uint8_t mac[6];
    const char *name;
};

static int link_open(const char *iface, struct link *k, char *err)
{
    k->name = iface;
    k->fd = socket(AF_PACKET, SOCK_DGRAM | SOCK_CLOEXEC, htons(ETH_P_IP));
    if (k->fd < 0) return errmsg_set(err, "dhcp: %s: packet socket: %s", iface, strerror(errno));
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "%s", iface);
    if (ioctl(k->fd, SIOCGIFINDEX, &ifr) || (k->ifindex = ifr.ifr_ifindex, 0) ||
        ioctl(k->fd, SIOCGIFHWADDR, &ifr)) {
        int e = errno;
        close(k->fd);
        return errmsg_set(err, "dhcp: %s: %s", iface, strerror(e));
    }
    memcpy(k->mac, ifr.ifr_hwaddr.sa_data, 6);
    struct sockaddr_ll sll = {
        .sll_family = AF_PACKET, .sll_protocol = htons(ETH_P_IP), .sll_ifindex = k->ifindex};
    int one = 1;
    if (bind(k->fd, (struct sockaddr *)&sll, sizeof sll) ||
        setsockopt(k->fd, SOL_PACKET, PACKET_AUXDATA, &one, sizeof one)) {
        int e = errno;
        close(k->fd);
        return errmsg_set(err, "dhcp: %s: bind: %s", iface, strerror(e));
    }
    return 0;
}

static uint32_t new_xid(const uint8_t *mac)
{
    uint32_t x = 0;
    if (getrandom(&x, sizeof x, GRND_NONBLOCK) != (ssize_t)sizeof x)
        x = (uint32_t)(dhcp_now() * 1e6) ^ (uint32_t)mac[5] << 24 ^ (uint32_t)mac[4] << 16;
    return x;
}

static int send_request(struct link *k, const struct dhcp_request *r, uint32_t src, uint32_t dst,
                        const uint8_t *dst_mac, char *err)
{
    uint8_t msg[DHCP_MSG_MIN], pkt[DHCP_IPUDP_HLEN + DHCP_MSG_MIN];
    int n = dhcp_build(r, msg, sizeof msg);
    int len = n < 0 ? -1 : dhcp_udp_wrap(src, dst, msg, (size_t)n, pkt, sizeof pkt);
    if (len < 0)
        return errmsg_set(err, "dhcp: %s: cannot build %s", k->name, dhcp_type_name(r->type));
    struct sockaddr_ll to = {.sll_family = AF_PACKET,
                             .sll_protocol = htons(ETH_P_IP),
                             .sll_ifindex = k->ifindex,
                             .sll_halen = 6};
    memcpy(to.sll_addr, dst_mac, 6);
    if (sendto(k->fd, pkt, (size_t)len, 0, (struct sockaddr *)&to, sizeof to) != len)
        return errmsg_set(err, "dhcp: %s: send %s: %s", k->name, dhcp_type_name(r->type),
                          strerror(errno));
    return 0;
}

/* The next reply for xid before the deadline: 0 with *out and the sender's MAC, 1 on timeout,
 * -1 on a socket error. */
static int wait_reply(struct link *k, uint32_t xid, double deadline, struct dhcp_reply *out,
                      uint8_t *from_mac, char *err)
{
    for (;;) {
        double left = deadline - dhcp_now();
        if (left <= 0) return 1;
        struct pollfd pf = {.fd = k->fd, .events = POLLIN};
        int rc = poll(&pf, 1, (int)(left * 1000) + 1);
        if (rc < 0 && errno != EINTR)
            return errmsg_set(err, "dhcp: %s: poll: %s", k->name, strerror(errno));
        if (rc <= 0) continue;
        uint8_t pkt[2048];
        union {
            struct cmsghdr h;
            char buf[CMSG_SPACE(sizeof(struct tpacket_auxdata))];
        } ctl;
        struct sockaddr_ll from;
        struct iovec iov = {pkt, sizeof pkt};
        struct msghdr mh = {.msg_name = &from,
                            .msg_namelen = sizeof from,
                            .msg_iov = &iov,
                            .msg_iovlen = 1,
                            .msg_control = &ctl,
                            .msg_controllen = sizeof ctl};
        ssize_t n = recvmsg(k->fd, &mh, MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR || errno == EAGAIN) continue;
            return errmsg_set(err, "dhcp: %s: recv: %s", k->name, strerror(errno));
        }
        if (from.sll_pkttype == PACKET_OUTGOING) continue;
        /* A NIC with receive checksum offload may hand over a packet whose UDP checksum it has
         * not written yet (virtio between guests): then the field is not ours to check. */
        int check = 1;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
            if (c->cmsg_level == SOL_PACKET && c->cmsg_type == PACKET_AUXDATA) {
                struct tpacket_auxdata aux;
                memcpy(&aux, CMSG_DATA(c), sizeof aux);
                if (aux.tp_status & TP_STATUS_CSUMNOTREADY) check = 0;
            }
        const uint8_t *msg;
        size_t len;
        char why[ERRMSG_LEN];
        if (dhcp_udp_unwrap(pkt, (size_t)n, check, &msg, &len, NULL, why)) continue;
        if (dhcp_parse(msg, len, out, why)) continue;
        if (out->xid != xid || memcmp(out->chaddr, k->mac, 6)) continue;
        memcpy(from_mac, from.sll_addr, 6);
        return 0;
    }
}

/* Fill the lease's address part from an ACK. A reply without a mask gets its address's class
 * mask, as the RFC leaves it to the client. */
static void take_ack(struct dhcp_lease *l, const struct dhcp_reply *a, uint32_t server,
                     const uint8_t *server_mac, double start)
{
    l->ip = a->yiaddr;
    int p = a->has_mask ? dhcp_mask_prefix(a->mask) : -1;
    if (p < 0) p = a->yiaddr >> 31 == 0 ? 8 : a->yiaddr >> 30 == 2 ? 16 : 24;
    l->prefix = p;
    l->router = a->router;
    l->n_dns = a->n_dns;
    memcpy(l->dns, a->dns, sizeof l->dns);
    l->server_id = a->server_id ? a->server_id : server;
    memcpy(l->server_mac, server_mac, 6);
    /* No lease time in an ACK is not allowed; read it as one hour rather than forever. */
    l->lease_s = a->lease_s ? a->lease_s : 3600;
    if (l->lease_s == DHCP_LEASE_INFINITE) {
        l->t1_s = l->t2_s = DHCP_LEASE_INFINITE;
    } else {
        l->t1_s = a->t1_s && a->t1_s < l->lease_s ? a->t1_s : l->lease_s / 2;
        l->t2_s = a->t2_s && a->t2_s < l->lease_s && a->t2_s >= l->t1_s
                      ? a->t2_s
                      : (uint32_t)((uint64_t)l->lease_s * 7 / 8);
    }
    l->start = start;
}

int dhcp_acquire(const char *iface, double timeout_s, struct dhcp_lease *l, char *err)
{
    struct link k;
    if (link_open(iface, &k, err)) return -1;
    memset(l, 0, sizeof *l);
    snprintf(l->iface, sizeof l->iface, "%s", iface);
    memcpy(l->mac, k.mac, 6);
    double t0 = dhcp_now(), deadline = t0 + timeout_s;
    int discovers = 0, offers = 0, rc = -1;
    struct dhcp_reply rep;
    uint8_t from[6];
    while (dhcp_now() < deadline) {
        /* Selecting: DISCOVER until an OFFER comes. */
        struct dhcp_request r = {.type = DHCP_DISCOVER, .xid = new_xid(k.mac)};
        memcpy(r.mac, k.mac, 6);
        double wait = 1, next = 0;
        int offered = 0;
        while (!offered && dhcp_now() < deadline) {
            double now = dhcp_now();
            if (now >= next) {
                r.secs = (uint16_t)(now - t0);
                if (send_request(&k, &r, 0, 0xffffffffu, broadcast_mac, err)) goto out;
                discovers++;
                next = now + wait;
                wait = wait < 8 ? wait * 2 : 8;
            }
            int w = wait_reply(&k, r.xid, next < deadline ? next : deadline, &rep, from, err);
            if (w < 0) goto out;
            offered = w == 0 && rep.type == DHCP_OFFER && rep.yiaddr;
        }
        if (!offered) break;
        offers++;
        /* Requesting: the offer, from the server that made it; three tries, then start over. */
        r.type = DHCP_REQUEST;
        r.requested_ip = rep.yiaddr;
        r.server_id = rep.server_id;
        uint32_t server = rep.server_id;
        for (int t = 0; t < 3 && dhcp_now() < deadline; t++) {
            double sent = dhcp_now();
            r.secs = (uint16_t)(sent - t0);
            if (send_request(&k, &r, 0, 0xffffffffu, broadcast_mac, err)) goto out;
            double until = sent + (1 << t);
            int w;
            while ((w = wait_reply(&k, r.xid, until < deadline ? until : deadline, &rep, from,
                                   err)) == 0 &&
                   rep.type == DHCP_OFFER) {
            }
            if (w < 0) goto out;
            if (w == 1) continue;
            if (rep.type == DHCP_NAK) break;
            take_ack(l, &rep, server, from, sent);
            rc = 0;
            goto out;
        }
    }
    errmsg_set(err, "dhcp: %s: no lease in %.0f s (%d DISCOVER%s sent, %d OFFER%s received)", iface,
               timeout_s, discovers, discovers == 1 ? "" : "s", offers, offers == 1 ? "" : "s");
out:
    close(k.fd);
    return rc;
}

int dhcp_renew(struct dhcp_lease *l, int rebinding, double timeout_s, char *err)
{
    struct link k;
    if (link_open(l->iface, &k, err)) return -1;
    struct dhcp_request r = {.type = DHCP_REQUEST, .xid = new_xid(k.mac), .ciaddr = l->ip};
    memcpy(r.mac, k.mac, 6);
    double t0 = dhcp_now(), deadline = t0 + timeout_s;
    int rc = -1;
    struct dhcp_reply rep;
    uint8_t from[6];
    for (int t = 0; dhcp_now() < deadline; t++) {
        double sent = dhcp_now();
        r.secs = (uint16_t)(sent - t0);
        if (send_request(&k, &r, l->ip, rebinding ? 0xffffffffu : l->server_id,
                         rebinding ? broadcast_mac : l->server_mac, err))
            goto out;
        double until = sent + (1 << (t < 2 ? t : 2));
        int w = wait_reply(&k, r.xid, until < deadline ? until : deadline, &rep, from, err);
        if (w < 0) goto out;
        if (w == 1 || rep.type == DHCP_OFFER) continue;
        if (rep.type == DHCP_NAK) {
            errmsg_set(err, "dhcp: %s: the server refused to extend the lease (NAK)", l->iface);
            rc = 1;
            goto out;
        }
        take_ack(l, &rep, l->server_id, rebinding ? from : l->server_mac, sent);
        rc = 0;
        goto out;
    }
    errmsg_set(err, "dhcp: %s: no answer to %s in %.0f s", l->iface,
               rebinding ? "rebinding (broadcast)" : "renewal", timeout_s);
out:
    close(k.fd);
    return rc;
}
