/* net_config: a NIC's link state, IPv4 address and default route through rtnetlink, and
 * /etc/resolv.conf. What os/init does with strata.ip/gw/dns or a DHCP lease, and what the server
 * does again when a renewed lease changes. No ip binary: one netlink request per call, answered
 * by its acknowledgement. libc and the kernel's uapi headers only (built into the static musl
 * init and the server). Addresses are host byte order. Each call returns 0, or -1 with err naming
 * the interface, the thing and the reason ("eth0: address 10.0.2.15/24: Operation not
 * permitted"). */
#ifndef STRATA_NET_CONFIG_H
#define STRATA_NET_CONFIG_H

#include <stdint.h>

#define NET_RESOLV_CONF "/etc/resolv.conf"

/* Link up (up = 1) or down; name is for messages. */
int netcfg_link(int index, const char *name, int up, char *err);

/* Add (replacing) or delete ip/prefix on the interface, with the broadcast address for prefixes
 * below 31. */
int netcfg_addr(int index, const char *name, uint32_t ip, int prefix, int add, char *err);

/* The default route via gw out of the interface (replacing any other default). */
int netcfg_default_route(int index, uint32_t gw, char *err);

/* NET_RESOLV_CONF with one nameserver line per address (n may be 0: an empty file). */
int netcfg_resolv_conf(const uint32_t *dns, int n, char *err);

/* 1 when the interface reports a carrier (/sys/class/net/NAME/carrier), 0 otherwise. */
int netcfg_carrier(const char *name);

#endif
