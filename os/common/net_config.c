/* net_config: see net_config.h. */
#include "os/common/net_config.h"

#include "os/common/boot_cmdline.h"
#include "os/common/errmsg.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
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
    r->h.nlmsg_seq = __atomic_add_fetch(&seq, 1, __ATOMIC_RELAXED);
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

int netcfg_link(int index, const char *name, int up, char *err)
{
    struct nl_req r = {0};
    r.h.nlmsg_len = NLMSG_LENGTH(sizeof r.u.ifi);
    r.h.nlmsg_type = RTM_NEWLINK;
    r.u.ifi.ifi_family = AF_UNSPEC;
    r.u.ifi.ifi_index = index;
    r.u.ifi.ifi_flags = up ? IFF_UP : 0;
    r.u.ifi.ifi_change = IFF_UP;
    char what[64];
    snprintf(what, sizeof what, "%s: link %s", name, up ? "up" : "down");
    return nl_talk(&r, what, err);
}

int netcfg_addr(int index, const char *name, uint32_t ip, int prefix, int add, char *err)
{
    struct nl_req r = {0};
    r.h.nlmsg_len = NLMSG_LENGTH(sizeof r.u.ifa);
    r.h.nlmsg_type = add ? RTM_NEWADDR : RTM_DELADDR;
    r.h.nlmsg_flags = add ? NLM_F_CREATE | NLM_F_REPLACE : 0;
    r.u.ifa.ifa_family = AF_INET;
    r.u.ifa.ifa_prefixlen = (unsigned char)prefix;
    r.u.ifa.ifa_index = (unsigned)index;
    uint32_t be = htonl(ip);
    add_attr(&r, IFA_LOCAL, &be, 4);
    add_attr(&r, IFA_ADDRESS, &be, 4);
    if (add && prefix < 31) {
        uint32_t bcast = htonl(ip | (prefix ? 0xffffffffu >> prefix : 0xffffffffu));
        add_attr(&r, IFA_BROADCAST, &bcast, 4);
    }
    char what[80], a[16];
    snprintf(what, sizeof what, "%s: %saddress %s/%d", name, add ? "" : "removing ",
             boot_ip_str(ip, a), prefix);
    return nl_talk(&r, what, err);
}

int netcfg_default_route(int index, uint32_t gw, char *err)
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

int netcfg_resolv_conf(const uint32_t *dns, int n, char *err)
{
    /* Written whole under a temporary name, then renamed: a reader never sees half a file. */
    const char *tmp = NET_RESOLV_CONF ".tmp";
    FILE *f = fopen(tmp, "we");
    if (!f) return errmsg_set(err, "%s: %s", tmp, strerror(errno));
    char a[16];
    for (int i = 0; i < n; i++) fprintf(f, "nameserver %s\n", boot_ip_str(dns[i], a));
    if (fclose(f)) return errmsg_set(err, "%s: %s", tmp, strerror(errno));
    if (rename(tmp, NET_RESOLV_CONF))
        return errmsg_set(err, "%s: %s", NET_RESOLV_CONF, strerror(errno));
    return 0;
}

int netcfg_carrier(const char *name)
{
    char path[96], c = 0;
    snprintf(path, sizeof path, "/sys/class/net/%s/carrier", name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, &c, 1); /* EINVAL while the link is down */
    close(fd);
    return n == 1 && c == '1';
}
