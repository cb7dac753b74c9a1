/* fuzz_dhcp: any bytes as what a packet socket hands the DHCP client: first as an IPv4 packet
 * (dhcp_udp_unwrap, checksums on and off), then its payload -- or, when it is no packet for port
 * 68, the bytes themselves -- as a server's reply (dhcp_parse). Nothing may read out of bounds;
 * a parsed reply must hold what the parser promises; an error must say which layer refused. */
#include "os/common/dhcp_msg.h"
#include "os/common/errmsg.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void parse(const uint8_t *m, size_t n)
{
    struct dhcp_reply r;
    char err[ERRMSG_LEN];
    err[0] = 0;
    if (dhcp_parse(m, n, &r, err)) {
        if (strncmp(err, "dhcp: ", 6)) abort();
        return;
    }
    if (r.type != DHCP_OFFER && r.type != DHCP_ACK && r.type != DHCP_NAK) abort();
    if (r.n_dns < 0 || r.n_dns > DHCP_DNS_MAX) abort();
    if (n < 240) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* A copy of exactly size bytes, so ASan sees any read past the end. */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    for (int check = 0; check < 2; check++) {
        const uint8_t *p;
        size_t n;
        uint32_t src;
        char err[ERRMSG_LEN];
        if (dhcp_udp_unwrap(buf, size, check, &p, &n, &src, err) == 0) {
            if (p < buf || p + n > buf + size) abort();
            parse(p, n);
        } else if (strncmp(err, "ip: ", 4) && strncmp(err, "udp: ", 5) &&
                   strcmp(err, "not UDP to port 68")) {
            abort();
        }
    }
    parse(buf, size);
    free(buf);
    return 0;
}
