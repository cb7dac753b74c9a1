/* The network from the command line: a static strata.ip (with strata.gw/dns), no address
 * (strata.ip=off), or by default a DHCPv4 lease on the NIC (strata.iface, else the first one with
 * a link). Links, addresses and routes through rtnetlink (os/common/net_config.h), DHCP over a
 * packet socket (os/common/dhcp_client.h). The lease goes to DHCP_LEASE_FILE, from which the server
 * renews it. */
#include "os/common/dhcp_client.h"
#include "os/common/errmsg.h"
#include "os/init/init.h"
#include "os/common/net_config.h"
#include "os/common/small_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_NICS     16
#define DHCP_TIMEOUT 60  /* s: switch ports may hold traffic for ~30 s (spanning tree) */
#define CARRIER_WAIT 100 /* x 100 ms for a NIC to report a link */

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int by_name(const void *a, const void *b)
{
    return strcmp(a, b);
}

/* Ethernet interfaces (ARPHRD_ETHER), sorted by name. */
static int list_nics(char (*names)[IFNAMSIZ], int max)
{
    DIR *d = opendir("/sys/class/net");
    if (!d) return 0;
    int n = 0;
    for (struct dirent *e; n < max && (e = readdir(d));) {
        if (e->d_name[0] == '.' || strlen(e->d_name) >= IFNAMSIZ) continue;
        char path[300], type[8] = {0};
        snprintf(path, sizeof path, "/sys/class/net/%s/type", e->d_name);
        if (small_file_read(path, type, sizeof type, NULL) > 0 && atoi(type) == 1)
            memcpy(names[n++], e->d_name, strlen(e->d_name) + 1);
    }
    closedir(d);
    qsort(names, (size_t)n, IFNAMSIZ, by_name);
    return n;
}

/* strata.iface, or every Ethernet NIC; a NIC driver registers its interface while it probes,
 * but give slow devices 3 s. */
static int find_nics(const struct boot_config *cfg, char (*names)[IFNAMSIZ])
{
    for (int tries = 0; tries < 30; tries++) {
        if (cfg->iface[0]) {
            if (if_nametoindex(cfg->iface)) {
                snprintf(names[0], IFNAMSIZ, "%s", cfg->iface);
                return 1;
            }
        } else {
            int n = list_nics(names, MAX_NICS);
            if (n) return n;
        }
        sleep_ms(100);
    }
    return 0;
}

static int static_address(const struct boot_config *cfg, const char *name, int index, char *err)
{
    char a[16], g[16];
    if (netcfg_addr(index, name, cfg->ip, cfg->prefix, 1, err)) return -1;
    if (cfg->has_gw && netcfg_default_route(index, cfg->gw, err)) return -1;
    if (cfg->n_dns && netcfg_resolv_conf(cfg->dns, cfg->n_dns, err)) return -1;
    init_say("net", "lo up, %s up %s/%d%s%s, %d DNS server(s)", name, boot_ip_str(cfg->ip, a),
             cfg->prefix, cfg->has_gw ? " via " : "", cfg->has_gw ? boot_ip_str(cfg->gw, g) : "",
             cfg->n_dns);
    return 0;
}

/* Bring every candidate up and take the first (by name) that reports a link within 10 s; none
 * does: the first one (some drivers never report carrier). The others go back down. */
static int pick_linked(char (*names)[IFNAMSIZ], int n, char *err)
{
    for (int i = 0; i < n; i++)
        if (netcfg_link((int)if_nametoindex(names[i]), names[i], 1, err)) return -1;
    int pick = -1;
    for (int tries = 0; pick < 0 && tries < CARRIER_WAIT; tries++) {
        for (int i = 0; i < n && pick < 0; i++)
            if (netcfg_carrier(names[i])) pick = i;
        if (pick < 0) sleep_ms(100);
    }
    if (pick < 0) {
        init_say("net", "no NIC reports a link after %d s; trying %s", CARRIER_WAIT / 10, names[0]);
        pick = 0;
    }
    for (int i = 0; i < n; i++)
        if (i != pick) netcfg_link((int)if_nametoindex(names[i]), names[i], 0, err);
    return pick;
}

static int dhcp_address(const char *name, int index, char *err)
{
    struct dhcp_lease l;
    init_say("net", "lo up, %s up; DHCP (no strata.ip)", name);
    double t0 = dhcp_now();
    if (dhcp_acquire(name, DHCP_TIMEOUT, &l, err))
        return errmsg_prefix(err, "no strata.ip, so DHCP: ");
    if (netcfg_addr(index, name, l.ip, l.prefix, 1, err)) return -1;
    if (l.router && netcfg_default_route(index, l.router, err)) return -1;
    if (netcfg_resolv_conf(l.dns, l.n_dns, err)) return -1;
    if (dhcp_lease_save(DHCP_LEASE_FILE, &l, err)) return -1;
    char d[200];
    init_say("dhcp", "%s (in %.1f s)", dhcp_lease_describe(&l, d, sizeof d), dhcp_now() - t0);
    return 0;
}

/* The fabric's own NIC (strata.fabric_ip on strata.fabric_iface). */
static int fabric_net(const struct boot_config *cfg, char *err)
{
    if (!cfg->has_fabric_ip) return 0;
    int index = 0;
    for (int tries = 0; tries < 30 && index <= 0; tries++) {
        index = (int)if_nametoindex(cfg->fabric_iface);
        if (index <= 0) sleep_ms(100);
    }
    if (index <= 0)
        return errmsg_set(err, "strata.fabric_iface=%s: no such network interface",
                          cfg->fabric_iface);
    if (netcfg_link(index, cfg->fabric_iface, 1, err) ||
        netcfg_addr(index, cfg->fabric_iface, cfg->fabric_ip, cfg->fabric_prefix, 1, err))
        return -1;
    char a[16];
    init_say("net", "fabric: %s up %s/%d", cfg->fabric_iface, boot_ip_str(cfg->fabric_ip, a),
             cfg->fabric_prefix);
    return 0;
}

static int main_net(const struct boot_config *cfg, char *err);

int init_net(const struct boot_config *cfg, char *err)
{
    if (main_net(cfg, err)) return -1;
    return fabric_net(cfg, err);
}

static int main_net(const struct boot_config *cfg, char *err)
{
    if (netcfg_link(1, "lo", 1, err)) return -1;
    char names[MAX_NICS][IFNAMSIZ];
    int n = find_nics(cfg, names);
    if (!n) {
        if (cfg->has_ip || cfg->iface[0])
            return errmsg_set(err, "%s: no network interface %s%s",
                              cfg->has_ip ? "strata.ip" : "strata.iface",
                              cfg->iface[0] ? "named " : "found", cfg->iface);
        init_say("net", "lo up; no network interface found");
        return 0;
    }
    int pick = 0;
    if (!cfg->has_ip && !cfg->ip_off && n > 1 && (pick = pick_linked(names, n, err)) < 0) return -1;
    const char *name = names[pick];
    int index = (int)if_nametoindex(name);
    if (netcfg_link(index, name, 1, err)) return -1;
    if (cfg->has_ip) return static_address(cfg, name, index, err);
    if (cfg->ip_off) {
        init_say("net", "lo up, %s up (strata.ip=off: no address)", name);
        return 0;
    }
    return dhcp_address(name, index, err);
}
