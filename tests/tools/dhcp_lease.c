/* dhcp_lease: the appliance's DHCP path outside the appliance, for tests/integration/
 * dhcp_renew.sh: obtain a lease on IFACE (os/common/dhcp_client.h), apply the address and route
 * (os/common/net_config.h; resolv.conf is left alone: this runs on a test host), save it to LEASEFILE,
 * then run the server's renewal schedule (os/runtime/dhcp_renew.h) RENEWALS times. Prints "acquired: ..."
 * and "renewal N: ..." lines; the schedule's own lines ("strata: dhcp: ...") go to stderr.
 *
 *   dhcp_lease IFACE LEASEFILE RENEWALS */
#include "os/common/dhcp_client.h"
#include "os/runtime/dhcp_renew.h"
#include "os/common/errmsg.h"
#include "os/common/net_config.h"

#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: dhcp_lease IFACE LEASEFILE RENEWALS\n");
        return 2;
    }
    char err[ERRMSG_LEN], d[200];
    struct dhcp_lease l;
    int index = (int)if_nametoindex(argv[1]);
    if (!index || dhcp_acquire(argv[1], 10, &l, err)) {
        fprintf(stderr, "dhcp_lease: %s\n", index ? err : "no such interface");
        return 1;
    }
    if (netcfg_addr(index, l.iface, l.ip, l.prefix, 1, err) ||
        (l.router && netcfg_default_route(index, l.router, err)) ||
        dhcp_lease_save(argv[2], &l, err)) {
        fprintf(stderr, "dhcp_lease: %s\n", err);
        return 1;
    }
    printf("acquired: %s\n", dhcp_lease_describe(&l, d, sizeof d));
    fflush(stdout);
    for (int i = 1; i <= atoi(argv[3]); i++) {
        if (dhcp_renew_once(&l, argv[2])) return 1;
        printf("renewal %d: %s\n", i, dhcp_lease_describe(&l, d, sizeof d));
        fflush(stdout);
    }
    return 0;
}
