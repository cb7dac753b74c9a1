/* dhcp: the exact bytes of the client's DISCOVER and REQUESTs, servers' OFFER/ACK/NAK parsed
 * option by option, malformed and truncated replies rejected with the reason, the IPv4/UDP
 * envelope (checksums against values computed by hand), and the lease file handed from init to
 * the server. */
#include "os/common/dhcp_lease.h"
#include "os/common/dhcp_msg.h"
#include "os/common/errmsg.h"
#include "tests/unit/check.h"

#include <stdint.h>
#include <unistd.h>

static const uint8_t mac[6] = {0x52, 0x54, 0x00, 0x12, 0x34, 0x56};
static char err[ERRMSG_LEN];

/* The 240-byte head every client message shares: BOOTREQUEST, Ethernet, xid 0x12345678, secs 3. */
static void client_head(uint8_t *m, const uint8_t ciaddr[4])
{
    memset(m, 0, DHCP_MSG_MIN);
    const uint8_t head[] = {0x01, 0x01, 0x06, 0x00, 0x12, 0x34, 0x56, 0x78, 0x00, 0x03, 0x00, 0x00};
    memcpy(m, head, sizeof head);
    memcpy(m + 12, ciaddr, 4);
    memcpy(m + 28, mac, 6);
    const uint8_t magic[] = {0x63, 0x82, 0x53, 0x63};
    memcpy(m + 236, magic, 4);
}

static void check_bytes(const uint8_t *got, const uint8_t *want, size_t n)
{
    for (size_t i = 0; i < n; i++)
        CHECKF(got[i] == want[i], "byte %zu is 0x%02x, expected 0x%02x", i, got[i], want[i]);
}

TEST(discover_exact_bytes)
{
    struct dhcp_request r = {.type = DHCP_DISCOVER, .xid = 0x12345678, .secs = 3};
    memcpy(r.mac, mac, 6);
    uint8_t got[400], want[DHCP_MSG_MIN];
    memset(got, 0xaa, sizeof got);
    CHECK_EQ_INT(dhcp_build(&r, got, sizeof got), 300);
    client_head(want, (const uint8_t[4]){0});
    const uint8_t opts[] = {53, 1, 1,                                        /* DISCOVER */
                            61, 7, 1,    0x52, 0x54, 0x00, 0x12, 0x34, 0x56, /* client id */
                            57, 2, 0x05, 0xdc,                               /* max size 1500 */
                            55, 7, 1,    3,    6,    51,   54,   58,   59,   /* parameters */
                            255};
    memcpy(want + 240, opts, sizeof opts);
    check_bytes(got, want, DHCP_MSG_MIN);
    CHECK_EQ_INT(dhcp_build(&r, got, 299), -1);
    r.type = DHCP_ACK;
    CHECK_EQ_INT(dhcp_build(&r, got, sizeof got), -1);
}

TEST(request_selecting_exact_bytes)
{
    struct dhcp_request r = {.type = DHCP_REQUEST,
                             .xid = 0x12345678,
                             .secs = 3,
                             .requested_ip = 0x0a00020f,
                             .server_id = 0x0a000202};
    memcpy(r.mac, mac, 6);
    uint8_t got[DHCP_MSG_MIN], want[DHCP_MSG_MIN];
    CHECK_EQ_INT(dhcp_build(&r, got, sizeof got), 300);
    client_head(want, (const uint8_t[4]){0});
    const uint8_t opts[] = {53, 1,    3,    61, 7, 1,  0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 57,
                            2,  0x05, 0xdc, 50, 4, 10, 0,    2,    15,   54,   4,    10,   0,
                            2,  2,    55,   7,  1, 3,  6,    51,   54,   58,   59,   255};
    memcpy(want + 240, opts, sizeof opts);
    check_bytes(got, want, DHCP_MSG_MIN);
}

TEST(request_renewing_exact_bytes)
{
    struct dhcp_request r = {
        .type = DHCP_REQUEST, .xid = 0x12345678, .secs = 3, .ciaddr = 0x0a00020f};
    memcpy(r.mac, mac, 6);
    uint8_t got[DHCP_MSG_MIN], want[DHCP_MSG_MIN];
    CHECK_EQ_INT(dhcp_build(&r, got, sizeof got), 300);
    client_head(want, (const uint8_t[4]){10, 0, 2, 15});
    const uint8_t opts[] = {53, 1,    3,    61, 7, 1, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 57,
                            2,  0x05, 0xdc, 55, 7, 1, 3,    6,    51,   54,   58,   59,   255};
    memcpy(want + 240, opts, sizeof opts);
    check_bytes(got, want, DHCP_MSG_MIN);
}

/* A server reply: BOOTREPLY to our MAC with yiaddr 10.0.2.15, then opts (len bytes). */
static size_t reply(uint8_t *m, const uint8_t *opts, size_t len)
{
    memset(m, 0, 240);
    m[0] = 2, m[1] = 1, m[2] = 6;
    m[4] = 0xde, m[5] = 0xad, m[6] = 0xbe, m[7] = 0xef;
    m[16] = 10, m[17] = 0, m[18] = 2, m[19] = 15; /* yiaddr */
    m[20] = 10, m[21] = 0, m[22] = 2, m[23] = 4;  /* siaddr */
    memcpy(m + 28, mac, 6);
    m[236] = 0x63, m[237] = 0x82, m[238] = 0x53, m[239] = 0x63;
    memcpy(m + 240, opts, len);
    return 240 + len;
}

TEST(parse_offer_and_ack)
{
    uint8_t m[600];
    const uint8_t opts[] = {
        53,  1,  2,                                      /* OFFER */
        0,   0,                                          /* pads */
        54,  4,  10,  0,   2,    2,                      /* server id */
        51,  4,  0,   1,   0x51, 0x80,                   /* lease 86400 */
        1,   4,  255, 255, 255,  0,                      /* mask */
        3,   8,  10,  0,   2,    2,    10,  0,   2,   1, /* routers: the first counts */
        6,   16, 10,  0,   2,    3,    1,   1,   1,   1,   8,   8,   8,   8,
        9,   9,  9,   9,   15,   7,    'e', 'x', 'a', 'm', 'p', 'l', 'e', /* unknown: skipped */
        58,  4,  0,   0,   0x0e, 0x10,                                    /* T1 3600 */
        59,  4,  0,   0,   0x18, 0x9c,                                    /* T2 6300 */
        255, 1,  2,   3}; /* after the end: ignored */
    struct dhcp_reply r;
    CHECK_EQ_INT(dhcp_parse(m, reply(m, opts, sizeof opts), &r, err), 0);
    CHECK_EQ_INT(r.type, DHCP_OFFER);
    CHECK_EQ_INT(r.xid, 0xdeadbeef);
    CHECK_EQ_INT(r.yiaddr, 0x0a00020f);
    CHECK_EQ_INT(r.siaddr, 0x0a000204);
    CHECK(!memcmp(r.chaddr, mac, 6));
    CHECK_EQ_INT(r.server_id, 0x0a000202);
    CHECK_EQ_INT(r.lease_s, 86400);
    CHECK_EQ_INT(r.has_mask, 1);
    CHECK_EQ_INT(r.mask, 0xffffff00);
    CHECK_EQ_INT(dhcp_mask_prefix(r.mask), 24);
    CHECK_EQ_INT(r.router, 0x0a000202);
    CHECK_EQ_INT(r.n_dns, 3);
    CHECK_EQ_INT(r.dns[0], 0x0a000203);
    CHECK_EQ_INT(r.dns[2], 0x08080808);
    CHECK_EQ_INT(r.t1_s, 3600);
    CHECK_EQ_INT(r.t2_s, 6300);

    const uint8_t ack[] = {53, 1, 5, 51, 4, 0xff, 0xff, 0xff, 0xff};
    CHECK_EQ_INT(dhcp_parse(m, reply(m, ack, sizeof ack), &r, err), 0);
    CHECK_EQ_INT(r.type, DHCP_ACK);
    CHECK_EQ_INT(r.lease_s, DHCP_LEASE_INFINITE);
    CHECK_EQ_INT(r.has_mask, 0);
    CHECK_EQ_INT(r.router, 0);
    CHECK_EQ_INT(r.n_dns, 0);
    const uint8_t nak[] = {53, 1, 6, 255};
    CHECK_EQ_INT(dhcp_parse(m, reply(m, nak, sizeof nak), &r, err), 0);
    CHECK_EQ_INT(r.type, DHCP_NAK);
    CHECK_STR(dhcp_type_name(r.type), "NAK");
}

TEST(parse_overloaded_file_field)
{
    uint8_t m[600];
    const uint8_t opts[] = {53, 1, 5, 52, 1, 1, 255};
    size_t n = reply(m, opts, sizeof opts);
    const uint8_t in_file[] = {51, 4, 0, 0, 0x0e, 0x10, 3, 4, 192, 168, 1, 1, 255};
    memcpy(m + 108, in_file, sizeof in_file);
    struct dhcp_reply r;
    CHECK_EQ_INT(dhcp_parse(m, n, &r, err), 0);
    CHECK_EQ_INT(r.lease_s, 3600);
    CHECK_EQ_INT(r.router, 0xc0a80101);
}

static void bad(const uint8_t *opts, size_t len, const char *want)
{
    uint8_t m[600];
    struct dhcp_reply r;
    err[0] = 0;
    CHECKF(dhcp_parse(m, reply(m, opts, len), &r, err) == -1, "accepted (wanted \"%s\")", want);
    CHECK_STR(err, want);
}

TEST(malformed_and_truncated_options)
{
    bad((const uint8_t[]){53, 1, 2, 51, 3, 0, 1, 0}, 8,
        "dhcp: options: option 51: length 3 (want 4)");
    bad((const uint8_t[]){53, 1, 2, 1, 2, 255, 0}, 7, "dhcp: options: option 1: length 2 (want 4)");
    bad((const uint8_t[]){53, 1, 2, 6, 5, 1, 1, 1, 1, 1}, 10,
        "dhcp: options: option 6: length 5 (want a multiple of 4)");
    bad((const uint8_t[]){53, 1, 2, 3, 0}, 5,
        "dhcp: options: option 3: length 0 (want a multiple of 4)");
    bad((const uint8_t[]){53, 2, 2, 2}, 4, "dhcp: options: option 53: length 2 (want 1)");
    bad((const uint8_t[]){53, 1, 2, 54, 4, 10, 0}, 7,
        "dhcp: options: option 54: length 4 runs past the end (2 left)");
    bad((const uint8_t[]){53, 1, 2, 54}, 4, "dhcp: options: option 54: no length byte (truncated)");
    bad((const uint8_t[]){53, 1, 1, 255}, 4, "dhcp: message type 1 is not OFFER, ACK or NAK");
    bad((const uint8_t[]){51, 4, 0, 0, 0, 1, 255}, 7,
        "dhcp: message type 0 is not OFFER, ACK or NAK");
    bad((const uint8_t[]){53, 1, 5, 52, 1, 4}, 6,
        "dhcp: options: option 52 (overload): want one byte 1..3");

    uint8_t m[600];
    struct dhcp_reply r;
    const uint8_t ok[] = {53, 1, 5, 255};
    size_t n = reply(m, ok, sizeof ok);
    CHECK_EQ_INT(dhcp_parse(m, 239, &r, err), -1);
    CHECK_STR(err, "dhcp: message of 239 bytes is shorter than the 240-byte header");
    m[0] = 1;
    CHECK_EQ_INT(dhcp_parse(m, n, &r, err), -1);
    CHECK_STR(err, "dhcp: op 1 is not BOOTREPLY (2)");
    m[0] = 2, m[239] = 0;
    CHECK_EQ_INT(dhcp_parse(m, n, &r, err), -1);
    CHECK_STR(err, "dhcp: no magic cookie (a BOOTP reply, not DHCP)");
    m[239] = 0x63, m[2] = 8;
    CHECK_EQ_INT(dhcp_parse(m, n, &r, err), -1);
    CHECK_STR(err, "dhcp: hardware type 1 length 8 is not Ethernet (1, 6)");
    /* Overloaded file field with a bad option inside it. */
    m[2] = 6;
    const uint8_t ov[] = {53, 1, 5, 52, 1, 3, 255};
    n = reply(m, ov, sizeof ov);
    m[44] = 51, m[45] = 9; /* an option in sname with a wrong length */
    CHECK_EQ_INT(dhcp_parse(m, n, &r, err), -1);
    CHECK_STR(err, "dhcp: sname: option 51: length 9 (want 4)");
}

TEST(udp_envelope)
{
    const uint8_t payload[4] = {1, 2, 3, 4};
    uint8_t pkt[64];
    CHECK_EQ_INT(dhcp_udp_wrap(0, 0xffffffffu, payload, 4, pkt, 31), -1);
    CHECK_EQ_INT(dhcp_udp_wrap(0, 0xffffffffu, payload, 4, pkt, sizeof pkt), 32);
    /* Checksums worked out by hand: IP 0x7ace, UDP 0xfb49 (RFC 1071 over the pseudo-header). */
    const uint8_t want[32] = {0x45, 0,   0,   32,  0, 0,  0, 0,  64, 17, 0x7a, 0xce, 0, 0, 0, 0,
                              255,  255, 255, 255, 0, 68, 0, 67, 0,  12, 0xfb, 0x49, 1, 2, 3, 4};
    check_bytes(pkt, want, 32);

    /* Unwrap: a reply to port 68 (swap the ports and recompute nothing: the sum is symmetric). */
    pkt[21] = 67, pkt[23] = 68;
    const uint8_t *p;
    size_t n;
    uint32_t src;
    CHECK_EQ_INT(dhcp_udp_unwrap(pkt, 32, 1, &p, &n, &src, err), 0);
    CHECK_EQ_INT(n, 4);
    CHECK(p == pkt + 28);
    CHECK_EQ_INT(src, 0);
    pkt[31] ^= 1;
    CHECK_EQ_INT(dhcp_udp_unwrap(pkt, 32, 1, &p, &n, &src, err), -1);
    CHECK_STR(err, "udp: bad checksum");
    CHECK_EQ_INT(dhcp_udp_unwrap(pkt, 32, 0, &p, &n, &src, err), 0); /* not checked: offload */
    pkt[31] ^= 1;
    CHECK_EQ_INT(dhcp_udp_unwrap(pkt, 31, 1, &p, &n, &src, err), -1);
    CHECK_STR(err, "ip: header length 20, total 32 in a 31-byte packet");
    pkt[15] ^= 1;
    CHECK_EQ_INT(dhcp_udp_unwrap(pkt, 32, 1, &p, &n, &src, err), -1);
    CHECK_STR(err, "ip: bad header checksum");
    pkt[15] ^= 1;
    pkt[23] = 69;
    CHECK_EQ_INT(dhcp_udp_unwrap(pkt, 32, 0, &p, &n, &src, err), -1);
    CHECK_STR(err, "not UDP to port 68");
    CHECK_EQ_INT(dhcp_udp_unwrap(pkt, 10, 0, &p, &n, &src, err), -1);
    CHECK_STR(err, "ip: not an IPv4 packet");
}

TEST(lease_file_round_trip)
{
    char path[] = "/tmp/strata-test-lease-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    close(fd);
    struct dhcp_lease l = {.iface = "eth0",
                           .ip = 0x0a00020f,
                           .prefix = 24,
                           .router = 0x0a000202,
                           .n_dns = 2,
                           .dns = {0x0a000203, 0x01010101},
                           .server_id = 0x0a000202,
                           .server_mac = {0x52, 0x55, 0x0a, 0, 2, 2},
                           .lease_s = 86400,
                           .t1_s = 43200,
                           .t2_s = 75600,
                           .start = 4.25};
    memcpy(l.mac, mac, 6);
    CHECK_EQ_INT(dhcp_lease_save(path, &l, err), 0);
    struct dhcp_lease b;
    CHECK_EQ_INT(dhcp_lease_load(path, &b, err), 0);
    CHECK_STR(b.iface, "eth0");
    CHECK_EQ_INT(b.ip, l.ip);
    CHECK_EQ_INT(b.prefix, 24);
    CHECK_EQ_INT(b.router, l.router);
    CHECK_EQ_INT(b.n_dns, 2);
    CHECK_EQ_INT(b.dns[1], 0x01010101);
    CHECK_EQ_INT(b.server_id, l.server_id);
    CHECK(!memcmp(b.server_mac, l.server_mac, 6) && !memcmp(b.mac, mac, 6));
    CHECK_EQ_INT(b.lease_s, 86400);
    CHECK_EQ_INT(b.t1_s, 43200);
    CHECK_EQ_INT(b.t2_s, 75600);
    CHECK(b.start == 4.25);
    char d[200];
    CHECK_STR(dhcp_lease_describe(&b, d, sizeof d),
              "eth0 10.0.2.15/24 via 10.0.2.2, DNS 10.0.2.3,1.1.1.1, lease 86400 s from 10.0.2.2");

    FILE *f = fopen(path, "w");
    fputs("iface=eth0\nip=10.0.2.15/33\n", f);
    fclose(f);
    CHECK_EQ_INT(dhcp_lease_load(path, &b, err), -1);
    CHECK(strstr(err, ":2: ip=10.0.2.15/33: malformed"));
    f = fopen(path, "w");
    fputs("iface=eth0\ncolour=blue\n", f);
    fclose(f);
    CHECK_EQ_INT(dhcp_lease_load(path, &b, err), -1);
    CHECK(strstr(err, ":2: unknown key colour"));
    f = fopen(path, "w");
    fputs("iface=eth0\n", f);
    fclose(f);
    CHECK_EQ_INT(dhcp_lease_load(path, &b, err), -1);
    CHECK(strstr(err, ": no ip= line"));
    unlink(path);
}

int main(void)
{
    RUN(discover_exact_bytes);
    RUN(request_selecting_exact_bytes);
    RUN(request_renewing_exact_bytes);
    RUN(parse_offer_and_ack);
    RUN(parse_overloaded_file_field);
    RUN(malformed_and_truncated_options);
    RUN(udp_envelope);
    RUN(lease_file_round_trip);
    CHECK_DONE();
}
