/* The network from the command line, through rtnetlink (no ip binary, no DHCP client: iPXE or
 * the operator already knows the address and passes it as strata.ip/gw/dns). */
#include "os/common/errmsg.h"
#include "os/init/init.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

struct nl_req {
    struct nlmsghdr h;
    union {
        struct ifinfomsg ifi;
        struct ifaddrmsg ifa;
        struct rtmsg rt;
    } u;
    char attrs[256];
};

static void add_attr(struct nl_req *r, unsigned short type, const void *data, size_t len)
{
    struct rtattr *a = (struct rtattr *)((char *)r + NLMSG_ALIGN(r->h.nlmsg_len));
    a->rta_type = type;
    a->rta_len = (unsigned short)RTA_LENGTH(len);
    memcpy(RTA_DATA(a), data, len);
    r->h.nlmsg_len = NLMSG_ALIGN(r->h.nlmsg_len) + RTA_ALIGN(a->rta_len);
}

/* Send one request and wait for its acknowledgement; what = the thing, for the message. */
static int nl_talk(struct nl_req *r, const char *what, char *err)
{
    static unsigned seq;
    int fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
    if (fd < 0) return errmsg_set(err, "%s: netlink socket: %s", what, strerror(errno));
    r->h.nlmsg_flags |= NLM_F_REQUEST | NLM_F_ACK;
    r->h.nlmsg_seq = ++seq;
    struct sockaddr_nl to = {.nl_family = AF_NETLINK};
    if (sendto(fd, r, r->h.nlmsg_len, 0, (struct sockaddr *)&to, sizeof to) < 0) {
        int e = errno;
        close(fd);
        return errmsg_set(err, "%s: netlink send: %s", what, strerror(e));
    }
    char buf[4096];
    for (;;) {
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n < 0) {
            int e = errno;
            close(fd);
            return errmsg_set(err, "%s: netlink recv: %s", what, strerror(e));
        }
        for (struct nlmsghdr *h = (struct nlmsghdr *)buf; NLMSG_OK(h, (unsigned)n);
             h = NLMSG_NEXT(h, n)) {
            if (h->nlmsg_seq != r->h.nlmsg_seq || h->nlmsg_type != NLMSG_ERROR) continue;
            int code = ((struct nlmsgerr *)NLMSG_DATA(h))->error;
            close(fd);
            if (code && code != -EEXIST) return errmsg_set(err, "%s: %s", what, strerror(-code));
            return 0;
        }
    }
}

static int link_up(int index, const char *name, char *err)
{
    struct nl_req r = {0};
    r.h.nlmsg_len = NLMSG_LENGTH(sizeof r.u.ifi);
    r.h.nlmsg_type = RTM_NEWLINK;
    r.u.ifi.ifi_family = AF_UNSPEC;
    r.u.ifi.ifi_index = index;
    r.u.ifi.ifi_flags = IFF_UP;
    r.u.ifi.ifi_change = IFF_UP;
    char what[64];
    snprintf(what, sizeof what, "%s: link up", name);
    return nl_talk(&r, what, err);
}

static int addr_add(int index, const char *name, uint32_t ip, int prefix, char *err)
{
    struct nl_req r = {0};
    r.h.nlmsg_len = NLMSG_LENGTH(sizeof r.u.ifa);
    r.h.nlmsg_type = RTM_NEWADDR;
    r.h.nlmsg_flags = NLM_F_CREATE | NLM_F_REPLACE;
    r.u.ifa.ifa_family = AF_INET;
    r.u.ifa.ifa_prefixlen = (unsigned char)prefix;
    r.u.ifa.ifa_index = (unsigned)index;
    uint32_t be = htonl(ip);
    add_attr(&r, IFA_LOCAL, &be, 4);
    add_attr(&r, IFA_ADDRESS, &be, 4);
    if (prefix < 31) {
        uint32_t bcast = htonl(ip | (prefix ? 0xffffffffu >> prefix : 0xffffffffu));
        add_attr(&r, IFA_BROADCAST, &bcast, 4);
    }
    char what[64], a[16];
    snprintf(what, sizeof what, "%s: address %s/%d", name, boot_ip_str(ip, a), prefix);
    return nl_talk(&r, what, err);
}

static int route_default(int index, uint32_t gw, char *err)
{
    struct nl_req r = {0};
    r.h.nlmsg_len = NLMSG_LENGTH(sizeof r.u.rt);
    r.h.nlmsg_type = RTM_NEWROUTE;
    r.h.nlmsg_flags = NLM_F_CREATE | NLM_F_REPLACE;
    r.u.rt.rtm_family = AF_INET;
    r.u.rt.rtm_table = RT_TABLE_MAIN;
    r.u.rt.rtm_protocol = RTPROT_BOOT;
    r.u.rt.rtm_scope = RT_SCOPE_UNIVERSE;
    r.u.rt.rtm_type = RTN_UNICAST;
    uint32_t be = htonl(gw);
    add_attr(&r, RTA_GATEWAY, &be, 4);
    uint32_t oif = (uint32_t)index;
    add_attr(&r, RTA_OIF, &oif, 4);
    char what[64], a[16];
    snprintf(what, sizeof what, "default route via %s", boot_ip_str(gw, a));
    return nl_talk(&r, what, err);
}

/* The first interface (by name) that is not loopback. */
static int first_nic(char *name, size_t cap)
{
    DIR *d = opendir("/sys/class/net");
    if (!d) return -1;
    name[0] = 0;
    for (struct dirent *e; (e = readdir(d));) {
        size_t n = strlen(e->d_name);
        if (e->d_name[0] == '.' || !strcmp(e->d_name, "lo") || n >= cap) continue;
        if (!name[0] || strcmp(e->d_name, name) < 0) memcpy(name, e->d_name, n + 1);
    }
    closedir(d);
    return name[0] ? 0 : -1;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int write_resolv_conf(const struct boot_config *cfg, char *err)
{
    FILE *f = fopen("/etc/resolv.conf", "we");
    if (!f) return errmsg_set(err, "/etc/resolv.conf: %s", strerror(errno));
    char a[16];
    for (int i = 0; i < cfg->n_dns; i++) fprintf(f, "nameserver %s\n", boot_ip_str(cfg->dns[i], a));
    if (fclose(f)) return errmsg_set(err, "/etc/resolv.conf: %s", strerror(errno));
    return 0;
}

int init_net(const struct boot_config *cfg, char *err)
{
    if (link_up(1, "lo", err)) return -1;
    char name[IFNAMSIZ];
    int index = 0;
    /* A NIC driver registers its interface while it probes, but give slow devices 3 s. */
    for (int tries = 0; tries < 30; tries++) {
        if (cfg->iface[0])
            snprintf(name, sizeof name, "%s", cfg->iface);
        else if (first_nic(name, sizeof name))
            name[0] = 0;
        if (name[0] && (index = (int)if_nametoindex(name)) > 0) break;
        sleep_ms(100);
    }
    if (index <= 0) {
        if (cfg->has_ip)
            return errmsg_set(err, "strata.ip: no network interface %s%s",
                              cfg->iface[0] ? "named " : "found", cfg->iface);
        init_say("net", "lo up; no network interface found");
        return 0;
    }
    if (link_up(index, name, err)) return -1;
    char a[16], g[16];
    if (!cfg->has_ip) {
        init_say("net", "lo up, %s up (no strata.ip: no address)", name);
        return 0;
    }
    if (addr_add(index, name, cfg->ip, cfg->prefix, err)) return -1;
    if (cfg->has_gw && route_default(index, cfg->gw, err)) return -1;
    if (cfg->n_dns && write_resolv_conf(cfg, err)) return -1;
    init_say("net", "lo up, %s up %s/%d%s%s, %d DNS server(s)", name, boot_ip_str(cfg->ip, a),
             cfg->prefix, cfg->has_gw ? " via " : "", cfg->has_gw ? boot_ip_str(cfg->gw, g) : "",
             cfg->n_dns);
    return 0;
}
