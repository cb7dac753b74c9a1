/* dhcp_renew: the server keeps the lease os/init obtained (DHCP_LEASE_FILE) for as long as it
 * runs, on a small thread of its own: it sleeps until T1, renews with the server that granted the
 * lease (unicast), from T2 rebinds with any server (broadcast), and when the lease has run out
 * (or a server said NAK) removes the address and asks for a new lease from scratch. A renewed
 * lease that differs (address, router, DNS) is applied through os/common/net_config.h, and the file is
 * rewritten. Each event is one console line, "strata: dhcp: ...".
 * dhcp_renew_start is called by os/pid1 (the appliance); dhcp_renew_once is one step of the
 * schedule (until the lease is extended or replaced once), for the thread and for tests. */
#ifndef STRATA_DHCP_RENEW_H
#define STRATA_DHCP_RENEW_H

#include "os/common/dhcp_lease.h"

/* Returns 0 (also when there is no lease file: a static address), or -1 with err. */
int dhcp_renew_start(const char *path, char *err);

/* Blocks until the lease is renewed, rebound or replaced; *l is updated, applied and saved to
 * path. Returns 0, or 1 when the lease is infinite (nothing to do, returns at once). */
int dhcp_renew_once(struct dhcp_lease *l, const char *path);

#endif
