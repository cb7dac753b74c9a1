/* dhcp_lease: a DHCPv4 lease, and the file that hands it from os/init (which obtains it before
 * the server exists) to the server (which renews it for as long as it runs,
 * os/runtime/dhcp_renew.h).
 *
 * The file is text, one KEY=VALUE a line, every key present:
 *   iface=eth0 ip=10.0.2.15/24 router=10.0.2.2 dns=10.0.2.3 server=10.0.2.2
 *   server_mac=52:55:0a:00:02:02 mac=52:54:00:12:34:56 lease=86400 t1=43200 t2=75600
 *   start=4.250
 * (router=0.0.0.0 and an empty dns= when the server gave none; lease=4294967295 is infinite.)
 * start is CLOCK_BOOTTIME seconds, the moment the REQUEST that got the ACK was sent: the lease
 * and its T1/T2 count from there (RFC 2131 4.4.1), and the clock is the same for init and server.
 * dhcp_lease_save writes a temporary file and renames it over path; dhcp_lease_load rejects a
 * file with a missing, unknown or malformed key, naming it. libc only (init and server). */
#ifndef STRATA_DHCP_LEASE_H
#define STRATA_DHCP_LEASE_H

#include "os/common/dhcp_msg.h"

#include <stddef.h>
#include <stdint.h>

#define DHCP_LEASE_FILE     "/run/strata/dhcp.lease"
#define DHCP_LEASE_INFINITE 0xffffffffu

struct dhcp_lease {
    char iface[16];
    uint8_t mac[6];
    uint32_t ip;
    int prefix;
    uint32_t router; /* 0 = none */
    int n_dns;
    uint32_t dns[DHCP_DNS_MAX];
    uint32_t server_id;
    uint8_t server_mac[6]; /* where renewals are unicast */
    uint32_t lease_s, t1_s, t2_s;
    double start;
};

int dhcp_lease_save(const char *path, const struct dhcp_lease *l, char *err);
int dhcp_lease_load(const char *path, struct dhcp_lease *l, char *err);

/* "eth0 10.0.2.15/24 via 10.0.2.2, DNS 10.0.2.3, lease 86400 s from 10.0.2.2" */
const char *dhcp_lease_describe(const struct dhcp_lease *l, char *buf, size_t cap);

/* CLOCK_BOOTTIME in seconds. */
double dhcp_now(void);

#endif
