/* dhcp_msg: see dhcp_msg.h. Layout of a BOOTP message (RFC 951/2131):
 *   0 op  1 htype  2 hlen  3 hops  4 xid(4)  8 secs(2)  10 flags(2)  12 ciaddr  16 yiaddr
 *   20 siaddr  24 giaddr  28 chaddr(16)  44 sname(64)  108 file(128)  236 magic cookie  240 options
 */
#include "os/common/dhcp_msg.h"

#include "os/common/errmsg.h"

#include <string.h>

#define OFF_XID     4
#define OFF_SECS    8
#define OFF_CIADDR  12
#define OFF_YIADDR  16
#define OFF_SIADDR  20
#define OFF_CHADDR  28
#define OFF_SNAME   44
#define OFF_FILE    108
#define OFF_COOKIE  236
#define OFF_OPTIONS 240

static const uint8_t cookie[4] = {99, 130, 83, 99};

static void put32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8),
    p[3] = (uint8_t)v;
}

static void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)(v >> 8), p[1] = (uint8_t)v;
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static uint16_t get16(const uint8_t *p)
{
    return (uint16_t)(p[0] << 8 | p[1]);
}

/* ---- client messages --------------------------------------------------------------------- */

int dhcp_build(const struct dhcp_request *r, uint8_t *buf, size_t cap)
{
    if (r->type != DHCP_DISCOVER && r->type != DHCP_REQUEST) return -1;
    /* 240 fixed + 3 (53) + 9 (61) + 4 (57) + 6 (50) + 6 (54) + 9 (55) + 1 (end) < 300 */
    if (cap < DHCP_MSG_MIN) return -1;
    memset(buf, 0, DHCP_MSG_MIN);
    buf[0] = 1; /* BOOTREQUEST */
    buf[1] = 1; /* Ethernet */
    buf[2] = 6;
    put32(buf + OFF_XID, r->xid);
    put16(buf + OFF_SECS, r->secs);
    put32(buf + OFF_CIADDR, r->ciaddr);
    memcpy(buf + OFF_CHADDR, r->mac, 6);
    memcpy(buf + OFF_COOKIE, cookie, 4);
    uint8_t *p = buf + OFF_OPTIONS;
    *p++ = 53, *p++ = 1, *p++ = (uint8_t)r->type;
    *p++ = 61, *p++ = 7, *p++ = 1;
    memcpy(p, r->mac, 6), p += 6;
    *p++ = 57, *p++ = 2;
    put16(p, DHCP_MSG_MAX), p += 2;
    if (r->requested_ip) {
        *p++ = 50, *p++ = 4;
        put32(p, r->requested_ip), p += 4;
    }
    if (r->server_id) {
        *p++ = 54, *p++ = 4;
        put32(p, r->server_id), p += 4;
    }
    static const uint8_t params[] = {1, 3, 6, 51, 54, 58, 59};
    *p++ = 55, *p++ = sizeof params;
    memcpy(p, params, sizeof params), p += sizeof params;
    *p++ = 255;
    return DHCP_MSG_MIN;
}

/* ---- server replies ---------------------------------------------------------------------- */

/* One option area (the options field, or file/sname when overloaded). *overload collects
 * option 52 from the main area. */
static int parse_options(const uint8_t *p, size_t len, const char *area, struct dhcp_reply *out,
                         int *overload, char *err)
{
    size_t i = 0;
    while (i < len) {
        uint8_t code = p[i++];
        if (code == 0) continue;
        if (code == 255) return 0;
        if (i >= len)
            return errmsg_set(err, "dhcp: %s: option %u: no length byte (truncated)", area, code);
        size_t n = p[i++];
        if (n > len - i)
            return errmsg_set(err, "dhcp: %s: option %u: length %zu runs past the end (%zu left)",
                              area, code, n, len - i);
        const uint8_t *v = p + i;
        i += n;
        const char *want = NULL;
        switch (code) {
        case 1:
            if (n != 4)
                want = "4";
            else
                out->has_mask = 1, out->mask = get32(v);
            break;
        case 3:
            if (n < 4 || n % 4)
                want = "a multiple of 4";
            else
                out->router = get32(v);
            break;
        case 6:
            if (n < 4 || n % 4) {
                want = "a multiple of 4";
                break;
            }
            out->n_dns = 0;
            for (size_t k = 0; k < n / 4 && out->n_dns < DHCP_DNS_MAX; k++)
                out->dns[out->n_dns++] = get32(v + 4 * k);
            break;
        case 51:
        case 54:
        case 58:
        case 59: {
            if (n != 4) {
                want = "4";
                break;
            }
            uint32_t x = get32(v);
            if (code == 51)
                out->lease_s = x;
            else if (code == 54)
                out->server_id = x;
            else if (code == 58)
                out->t1_s = x;
            else
                out->t2_s = x;
            break;
        }
        case 52:
            if (n != 1 || v[0] < 1 || v[0] > 3)
                return errmsg_set(err, "dhcp: %s: option 52 (overload): want one byte 1..3", area);
            if (overload) *overload = v[0];
            break;
        case 53:
            if (n != 1)
                want = "1";
            else
                out->type = (enum dhcp_type)v[0];
            break;
        default:
            break;
        }
        if (want)
            return errmsg_set(err, "dhcp: %s: option %u: length %zu (want %s)", area, code, n,
                              want);
    }
    return 0; /* no end option: tolerated, the area simply ends */
}

int dhcp_parse(const uint8_t *msg, size_t len, struct dhcp_reply *out, char *err)
{
    memset(out, 0, sizeof *out);
    if (len < OFF_OPTIONS)
        return errmsg_set(err, "dhcp: message of %zu bytes is shorter than the %d-byte header", len,
                          OFF_OPTIONS);
    if (msg[0] != 2) return errmsg_set(err, "dhcp: op %u is not BOOTREPLY (2)", msg[0]);
    if (msg[1] != 1 || msg[2] != 6)
        return errmsg_set(err, "dhcp: hardware type %u length %u is not Ethernet (1, 6)", msg[1],
                          msg[2]);
    if (memcmp(msg + OFF_COOKIE, cookie, 4))
        return errmsg_set(err, "dhcp: no magic cookie (a BOOTP reply, not DHCP)");
    out->xid = get32(msg + OFF_XID);
    out->yiaddr = get32(msg + OFF_YIADDR);
    out->siaddr = get32(msg + OFF_SIADDR);
    memcpy(out->chaddr, msg + OFF_CHADDR, 6);
    int overload = 0;
    if (parse_options(msg + OFF_OPTIONS, len - OFF_OPTIONS, "options", out, &overload, err))
        return -1;
    if ((overload & 1) && parse_options(msg + OFF_FILE, 128, "file", out, NULL, err)) return -1;
    if ((overload & 2) && parse_options(msg + OFF_SNAME, 64, "sname", out, NULL, err)) return -1;
    if (out->type != DHCP_OFFER && out->type != DHCP_ACK && out->type != DHCP_NAK)
        return errmsg_set(err, "dhcp: message type %d is not OFFER, ACK or NAK", (int)out->type);
    return 0;
}

int dhcp_mask_prefix(uint32_t mask)
{
    uint32_t inv = ~mask;
    if (inv & (inv + 1)) return -1;
    int n = 0;
    while (n < 32 && (mask & (0x80000000u >> n))) n++;
    return n;
}

const char *dhcp_type_name(enum dhcp_type t)
{
    static const char *names[] = {"?",   "DISCOVER", "OFFER",   "REQUEST", "DECLINE",
                                  "ACK", "NAK",      "RELEASE", "INFORM"};
    return (unsigned)t < sizeof names / sizeof names[0] ? names[t] : "?";
}

/* ---- IPv4 + UDP envelope ------------------------------------------------------------------ */

/* The Internet checksum's running sum over len bytes (RFC 1071). */
static uint32_t sum16(const uint8_t *p, size_t len, uint32_t sum)
{
    for (size_t i = 0; i + 1 < len; i += 2) sum += get16(p + i);
    if (len & 1) sum += (uint32_t)p[len - 1] << 8;
    return sum;
}

static uint16_t fold(uint32_t sum)
{
    while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
    return (uint16_t)~sum;
}

/* UDP checksum over the pseudo-header and the UDP header + data at u (ulen bytes). */
static uint16_t udp_sum(uint32_t src, uint32_t dst, const uint8_t *u, size_t ulen)
{
    uint32_t s = (src >> 16) + (src & 0xffff) + (dst >> 16) + (dst & 0xffff) + 17 + (uint32_t)ulen;
    return fold(sum16(u, ulen, s));
}

int dhcp_udp_wrap(uint32_t src, uint32_t dst, const uint8_t *payload, size_t len, uint8_t *pkt,
                  size_t cap)
{
    size_t total = DHCP_IPUDP_HLEN + len;
    if (total > cap || total > 65535) return -1;
    memset(pkt, 0, DHCP_IPUDP_HLEN);
    pkt[0] = 0x45; /* IPv4, 5 words */
    put16(pkt + 2, (uint16_t)total);
    pkt[8] = 64; /* TTL */
    pkt[9] = 17; /* UDP */
    put32(pkt + 12, src);
    put32(pkt + 16, dst);
    put16(pkt + 10, fold(sum16(pkt, 20, 0)));
    uint8_t *u = pkt + 20;
    put16(u, DHCP_CLIENT_PORT);
    put16(u + 2, DHCP_SERVER_PORT);
    put16(u + 4, (uint16_t)(8 + len));
    memcpy(u + 8, payload, len);
    uint16_t c = udp_sum(src, dst, u, 8 + len);
    put16(u + 6, c ? c : 0xffff); /* 0 means "no checksum" in UDP */
    return (int)total;
}

int dhcp_udp_unwrap(const uint8_t *pkt, size_t len, int check_udp_sum, const uint8_t **payload,
                    size_t *plen, uint32_t *src, char *err)
{
    if (len < 20 || (pkt[0] >> 4) != 4) return errmsg_set(err, "ip: not an IPv4 packet");
    size_t ihl = (size_t)(pkt[0] & 15) * 4, total = get16(pkt + 2);
    if (ihl < 20 || total < ihl || total > len)
        return errmsg_set(err, "ip: header length %zu, total %zu in a %zu-byte packet", ihl, total,
                          len);
    if (fold(sum16(pkt, ihl, 0))) return errmsg_set(err, "ip: bad header checksum");
    if (get16(pkt + 6) & 0x3fff) return errmsg_set(err, "ip: a fragment (not reassembled)");
    if (pkt[9] != 17 || total - ihl < 8) return errmsg_set(err, "not UDP to port 68");
    const uint8_t *u = pkt + ihl;
    size_t ulen = get16(u + 4);
    if (get16(u + 2) != DHCP_CLIENT_PORT) return errmsg_set(err, "not UDP to port 68");
    if (ulen < 8 || ulen > total - ihl)
        return errmsg_set(err, "udp: length %zu in a %zu-byte datagram", ulen, total - ihl);
    uint32_t s = get32(pkt + 12), d = get32(pkt + 16);
    if (check_udp_sum && get16(u + 6) && udp_sum(s, d, u, ulen))
        return errmsg_set(err, "udp: bad checksum");
    *payload = u + 8;
    *plen = ulen - 8;
    if (src) *src = s;
    return 0;
}
