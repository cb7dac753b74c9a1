/* dhcp_msg: DHCPv4 messages on the wire (RFC 2131/2132), and the IPv4+UDP envelope they travel
 * in before the client has an address (packet sockets see IP packets, not UDP payloads).
 *
 * dhcp_build() writes a client message (DISCOVER, or REQUEST in any of its three states) as
 * exact, deterministic bytes: the BOOTP header, the magic cookie, then options 53, 61 (client id
 * = 1 + MAC), 57 (max size 1500), 50 and 54 when given, 55 (parameters: 1 3 6 51 54 58 59), 255,
 * zero-padded to 300 bytes (older servers ignore shorter BOOTP frames).
 * dhcp_parse() reads a server's reply (OFFER, ACK or NAK) into struct dhcp_reply: options 1, 3,
 * 6, 51, 53, 54, 58, 59, with option overload (52) into the file/sname fields. Anything that is
 * not a well-formed BOOTREPLY is an error naming the field or option and the reason; unknown
 * options are skipped. dhcp_udp_wrap()/dhcp_udp_unwrap() add and check the IPv4 and UDP headers
 * (checksums included). Pure functions of their arguments, libc only: built into both os/init
 * (static musl) and the server. Addresses are host byte order, like os/common/boot_cmdline.h. */
#ifndef STRATA_DHCP_MSG_H
#define STRATA_DHCP_MSG_H

#include <stddef.h>
#include <stdint.h>

#define DHCP_SERVER_PORT 67
#define DHCP_CLIENT_PORT 68
#define DHCP_MSG_MIN     300 /* what dhcp_build pads to */
#define DHCP_MSG_MAX     1500
#define DHCP_DNS_MAX     3
#define DHCP_IPUDP_HLEN  28 /* IPv4 header without options + UDP header */

enum dhcp_type {
    DHCP_DISCOVER = 1,
    DHCP_OFFER = 2,
    DHCP_REQUEST = 3,
    DHCP_DECLINE = 4,
    DHCP_ACK = 5,
    DHCP_NAK = 6,
    DHCP_RELEASE = 7,
    DHCP_INFORM = 8,
};

/* What the client sends. REQUEST while selecting: requested_ip + server_id, ciaddr 0; while
 * renewing or rebinding: ciaddr = the leased address, neither option (RFC 2131 4.3.2). */
struct dhcp_request {
    enum dhcp_type type; /* DHCP_DISCOVER or DHCP_REQUEST */
    uint32_t xid;
    uint16_t secs;
    uint8_t mac[6];
    uint32_t ciaddr;
    uint32_t requested_ip; /* option 50; 0 = absent */
    uint32_t server_id;    /* option 54; 0 = absent */
};

/* A server's reply. Absent options read 0 (has_mask tells a /0 mask from none). */
struct dhcp_reply {
    enum dhcp_type type; /* option 53: OFFER, ACK or NAK */
    uint32_t xid;
    uint32_t yiaddr, siaddr;
    uint8_t chaddr[6];
    int has_mask;
    uint32_t mask;   /* option 1 */
    uint32_t router; /* option 3, the first one */
    int n_dns;       /* option 6, the first DHCP_DNS_MAX */
    uint32_t dns[DHCP_DNS_MAX];
    uint32_t lease_s;    /* option 51 */
    uint32_t server_id;  /* option 54 */
    uint32_t t1_s, t2_s; /* options 58, 59 */
};

/* Returns the message length (>= DHCP_MSG_MIN), or -1 when cap is too small or r->type is not
 * DISCOVER or REQUEST. */
int dhcp_build(const struct dhcp_request *r, uint8_t *buf, size_t cap);

/* Returns 0, or -1 with err, e.g. "dhcp: option 51: length 3 (want 4)". */
int dhcp_parse(const uint8_t *msg, size_t len, struct dhcp_reply *out, char *err);

/* Prefix length of a contiguous netmask, -1 when it is not contiguous. */
int dhcp_mask_prefix(uint32_t mask);

/* IPv4 (TTL 64, no options, DF clear) + UDP from src:68 to dst:67 around payload. Returns the
 * packet length, or -1 when cap is too small. */
int dhcp_udp_wrap(uint32_t src, uint32_t dst, const uint8_t *payload, size_t len, uint8_t *pkt,
                  size_t cap);

/* The UDP payload of an IPv4 packet for port 68. check_udp_sum = 0 skips the UDP checksum (the
 * packet socket said the NIC had not filled it in yet). Returns 0 with *payload inside pkt, or -1
 * with err (a packet for someone else reads "not UDP to port 68"). */
int dhcp_udp_unwrap(const uint8_t *pkt, size_t len, int check_udp_sum, const uint8_t **payload,
                    size_t *plen, uint32_t *src, char *err);

const char *dhcp_type_name(enum dhcp_type t);

#endif
