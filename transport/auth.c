#include "transport/auth.h"

#include "os/common/errmsg.h"
#include "transport/crc32c.h"

#include <ctype.h>
#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>

int auth_init(char *err)
{
    if (sodium_init() < 0) return errmsg_set(err, "libsodium: sodium_init failed");
    return 0;
}

int cluster_key_parse(struct cluster_key *key, const char *hex, char *err)
{
    while (isspace((unsigned char)*hex)) hex++;
    size_t n = 0;
    while (hex[n] && !isspace((unsigned char)hex[n])) n++;
    const char *rest = hex + n;
    while (isspace((unsigned char)*rest)) rest++;
    if (n != 2 * CLUSTER_KEY_LEN || *rest)
        return errmsg_set(err, "cluster key: need %d hex digits", 2 * CLUSTER_KEY_LEN);
    size_t bin_len = 0;
    if (sodium_hex2bin(key->k, sizeof key->k, hex, n, NULL, &bin_len, NULL) ||
        bin_len != CLUSTER_KEY_LEN)
        return errmsg_set(err, "cluster key: not hexadecimal");
    return 0;
}

int cluster_key_load(struct cluster_key *key, const char *path, char *err)
{
    FILE *f = fopen(path, "r");
    if (!f) return errmsg_set(err, "%s: %s", path, strerror(errno));
    char buf[256];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    if (cluster_key_parse(key, buf, err)) return errmsg_prefix(err, "%s: ", path);
    sodium_memzero(buf, sizeof buf);
    return 0;
}

/* The MAC covers the frame type and the body, so a HELLO can never pass as a HELLO_ACK. */
static void mac(const struct cluster_key *key, uint8_t type, const uint8_t *body, size_t len,
                uint8_t out[WIRE_MAC_LEN])
{
    crypto_auth_hmacsha512256_state st;
    crypto_auth_hmacsha512256_init(&st, key->k, CLUSTER_KEY_LEN);
    crypto_auth_hmacsha512256_update(&st, &type, 1);
    crypto_auth_hmacsha512256_update(&st, body, len);
    crypto_auth_hmacsha512256_final(&st, out);
}

static size_t plain_frame(uint8_t *out, uint8_t type, uint32_t conn, size_t body_len)
{
    struct wire_hdr h = {WIRE_VERSION,
                         type,
                         0,
                         (uint32_t)body_len,
                         conn,
                         0,
                         crc32c(0, out + WIRE_HDR_LEN, body_len)};
    wire_hdr_encode(out, &h);
    return WIRE_HDR_LEN + body_len;
}

void auth_nonce(uint8_t nonce[WIRE_NONCE_LEN])
{
    randombytes_buf(nonce, WIRE_NONCE_LEN);
}

size_t auth_hello(const struct cluster_key *key, const uint8_t nonce[WIRE_NONCE_LEN], uint8_t *out)
{
    uint8_t *body = out + WIRE_HDR_LEN;
    memcpy(body, nonce, WIRE_NONCE_LEN);
    mac(key, WIRE_HELLO, body, WIRE_NONCE_LEN, body + WIRE_NONCE_LEN);
    return plain_frame(out, WIRE_HELLO, 0, WIRE_HELLO_LEN);
}

int auth_hello_check(const struct cluster_key *key, const uint8_t *body, size_t len,
                     uint8_t nonce[WIRE_NONCE_LEN], char *err)
{
    if (len != WIRE_HELLO_LEN)
        return errmsg_set(err, "hello: %zu bytes, expected %d", len, WIRE_HELLO_LEN);
    uint8_t m[WIRE_MAC_LEN];
    mac(key, WIRE_HELLO, body, WIRE_NONCE_LEN, m);
    if (sodium_memcmp(m, body + WIRE_NONCE_LEN, WIRE_MAC_LEN))
        return errmsg_set(err, "hello: MAC does not verify (wrong cluster key)");
    memcpy(nonce, body, WIRE_NONCE_LEN);
    return 0;
}

static void derive(const struct cluster_key *key, const uint8_t *cn, const uint8_t *sn,
                   uint32_t conn, int is_client, struct session *s)
{
    uint8_t in[2 * WIRE_NONCE_LEN + 4], out[64];
    memcpy(in, cn, WIRE_NONCE_LEN);
    memcpy(in + WIRE_NONCE_LEN, sn, WIRE_NONCE_LEN);
    for (int i = 0; i < 4; i++) in[2 * WIRE_NONCE_LEN + i] = (uint8_t)(conn >> (8 * i));
    crypto_generichash(out, sizeof out, in, sizeof in, key->k, CLUSTER_KEY_LEN);
    s->conn = conn;
    s->is_client = is_client;
    memcpy(is_client ? s->tx_key : s->rx_key, out, 32);
    memcpy(is_client ? s->rx_key : s->tx_key, out + 32, 32);
    sodium_memzero(out, sizeof out);
}

size_t auth_hello_ack(const struct cluster_key *key, const uint8_t client_nonce[WIRE_NONCE_LEN],
                      uint32_t conn, struct session *s, uint8_t *out)
{
    uint8_t *body = out + WIRE_HDR_LEN, sn[WIRE_NONCE_LEN];
    randombytes_buf(sn, sizeof sn);
    memcpy(body, client_nonce, WIRE_NONCE_LEN);
    memcpy(body + WIRE_NONCE_LEN, sn, WIRE_NONCE_LEN);
    for (int i = 0; i < 4; i++) body[2 * WIRE_NONCE_LEN + i] = (uint8_t)(conn >> (8 * i));
    mac(key, WIRE_HELLO_ACK, body, 2 * WIRE_NONCE_LEN + 4, body + 2 * WIRE_NONCE_LEN + 4);
    derive(key, client_nonce, sn, conn, 0, s);
    return plain_frame(out, WIRE_HELLO_ACK, conn, WIRE_HELLO_ACK_LEN);
}

int auth_hello_ack_check(const struct cluster_key *key, const uint8_t *body, size_t len,
                         const uint8_t client_nonce[WIRE_NONCE_LEN], struct session *s, char *err)
{
    if (len != WIRE_HELLO_ACK_LEN)
        return errmsg_set(err, "hello ack: %zu bytes, expected %d", len, WIRE_HELLO_ACK_LEN);
    uint8_t m[WIRE_MAC_LEN];
    mac(key, WIRE_HELLO_ACK, body, 2 * WIRE_NONCE_LEN + 4, m);
    if (sodium_memcmp(m, body + 2 * WIRE_NONCE_LEN + 4, WIRE_MAC_LEN))
        return errmsg_set(err, "hello ack: MAC does not verify (peer has another cluster key)");
    if (sodium_memcmp(body, client_nonce, WIRE_NONCE_LEN))
        return errmsg_set(err, "hello ack: answers another hello");
    const uint8_t *c = body + 2 * WIRE_NONCE_LEN;
    uint32_t conn =
        (uint32_t)c[0] | (uint32_t)c[1] << 8 | (uint32_t)c[2] << 16 | (uint32_t)c[3] << 24;
    derive(key, client_nonce, body + WIRE_NONCE_LEN, conn, 1, s);
    return 0;
}

/* ---------------------------------------------------------------- node identity */

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* K_id = BLAKE2b-256(key = cluster key, "strata node key v1" || id): what proves id in a
 * handshake. Every holder of the cluster key can derive it (docs/control.md says what that
 * means); what it buys is that the id is fixed by the handshake, not by later messages. */
static void node_key(const struct cluster_key *key, uint64_t id, uint8_t out[32])
{
    static const char label[] = "strata node key v1";
    uint8_t in[sizeof label - 1 + 8];
    memcpy(in, label, sizeof label - 1);
    put_u64(in + sizeof label - 1, id);
    crypto_generichash(out, 32, in, sizeof in, key->k, CLUSTER_KEY_LEN);
}

static void id_mac(const struct cluster_key *key, uint64_t id, uint8_t type, const uint8_t *body,
                   size_t len, uint8_t out[WIRE_MAC_LEN])
{
    uint8_t k[32];
    node_key(key, id, k);
    crypto_auth_hmacsha512256_state st;
    crypto_auth_hmacsha512256_init(&st, k, sizeof k);
    crypto_auth_hmacsha512256_update(&st, &type, 1);
    crypto_auth_hmacsha512256_update(&st, body, len);
    crypto_auth_hmacsha512256_final(&st, out);
    sodium_memzero(k, sizeof k);
}

/* Session keys bound to both ids: BLAKE2b(key = cluster key, cn || sn || conn || client id ||
 * server id), never the same as derive()'s (its input is 16 bytes shorter). */
static void derive_id(const struct cluster_key *key, const uint8_t *cn, const uint8_t *sn,
                      uint32_t conn, uint64_t client, uint64_t server, int is_client,
                      struct session *s)
{
    uint8_t in[2 * WIRE_NONCE_LEN + 4 + 16], out[64];
    memcpy(in, cn, WIRE_NONCE_LEN);
    memcpy(in + WIRE_NONCE_LEN, sn, WIRE_NONCE_LEN);
    for (int i = 0; i < 4; i++) in[2 * WIRE_NONCE_LEN + i] = (uint8_t)(conn >> (8 * i));
    put_u64(in + 2 * WIRE_NONCE_LEN + 4, client);
    put_u64(in + 2 * WIRE_NONCE_LEN + 12, server);
    crypto_generichash(out, sizeof out, in, sizeof in, key->k, CLUSTER_KEY_LEN);
    s->conn = conn;
    s->is_client = is_client;
    memcpy(is_client ? s->tx_key : s->rx_key, out, 32);
    memcpy(is_client ? s->rx_key : s->tx_key, out + 32, 32);
    sodium_memzero(out, sizeof out);
}

size_t auth_hello_id(const struct cluster_key *key, const uint8_t nonce[WIRE_NONCE_LEN],
                     uint64_t id, uint8_t *out)
{
    uint8_t *body = out + WIRE_HDR_LEN;
    memcpy(body, nonce, WIRE_NONCE_LEN);
    put_u64(body + WIRE_NONCE_LEN, id);
    id_mac(key, id, WIRE_HELLO_ID, body, WIRE_NONCE_LEN + 8, body + WIRE_NONCE_LEN + 8);
    return plain_frame(out, WIRE_HELLO_ID, 0, WIRE_HELLO_ID_LEN);
}

int auth_hello_id_check(const struct cluster_key *key, const uint8_t *body, size_t len,
                        uint8_t nonce[WIRE_NONCE_LEN], uint64_t *id, char *err)
{
    if (len != WIRE_HELLO_ID_LEN)
        return errmsg_set(err, "hello: %zu bytes, expected %d", len, WIRE_HELLO_ID_LEN);
    uint64_t who = get_u64(body + WIRE_NONCE_LEN);
    if (!who) return errmsg_set(err, "hello: node id 0");
    uint8_t m[WIRE_MAC_LEN];
    id_mac(key, who, WIRE_HELLO_ID, body, WIRE_NONCE_LEN + 8, m);
    if (sodium_memcmp(m, body + WIRE_NONCE_LEN + 8, WIRE_MAC_LEN))
        return errmsg_set(err,
                          "hello: MAC does not verify (wrong cluster key; it claims node %llu)",
                          (unsigned long long)who);
    memcpy(nonce, body, WIRE_NONCE_LEN);
    *id = who;
    return 0;
}

#define ID_ACK_SIGNED (2 * WIRE_NONCE_LEN + 4 + 16) /* the bytes before the MAC */

size_t auth_hello_id_ack(const struct cluster_key *key, const uint8_t client_nonce[WIRE_NONCE_LEN],
                         uint64_t client, uint32_t conn, uint64_t server, struct session *s,
                         uint8_t *out)
{
    uint8_t *body = out + WIRE_HDR_LEN, sn[WIRE_NONCE_LEN];
    randombytes_buf(sn, sizeof sn);
    memcpy(body, client_nonce, WIRE_NONCE_LEN);
    memcpy(body + WIRE_NONCE_LEN, sn, WIRE_NONCE_LEN);
    for (int i = 0; i < 4; i++) body[2 * WIRE_NONCE_LEN + i] = (uint8_t)(conn >> (8 * i));
    put_u64(body + 2 * WIRE_NONCE_LEN + 4, server);
    put_u64(body + 2 * WIRE_NONCE_LEN + 12, client);
    id_mac(key, server, WIRE_HELLO_ID_ACK, body, ID_ACK_SIGNED, body + ID_ACK_SIGNED);
    derive_id(key, client_nonce, sn, conn, client, server, 0, s);
    return plain_frame(out, WIRE_HELLO_ID_ACK, conn, WIRE_HELLO_ID_ACK_LEN);
}

int auth_hello_id_ack_check(const struct cluster_key *key, const uint8_t *body, size_t len,
                            const uint8_t client_nonce[WIRE_NONCE_LEN], uint64_t client,
                            uint64_t want_server, uint64_t *server, struct session *s, char *err)
{
    if (len != WIRE_HELLO_ID_ACK_LEN)
        return errmsg_set(err, "hello ack: %zu bytes, expected %d", len, WIRE_HELLO_ID_ACK_LEN);
    uint64_t who = get_u64(body + 2 * WIRE_NONCE_LEN + 4);
    uint8_t m[WIRE_MAC_LEN];
    id_mac(key, who, WIRE_HELLO_ID_ACK, body, ID_ACK_SIGNED, m);
    if (!who || sodium_memcmp(m, body + ID_ACK_SIGNED, WIRE_MAC_LEN))
        return errmsg_set(err, "hello ack: MAC does not verify (peer has another cluster key)");
    if (sodium_memcmp(body, client_nonce, WIRE_NONCE_LEN) ||
        get_u64(body + 2 * WIRE_NONCE_LEN + 12) != client)
        return errmsg_set(err, "hello ack: answers another hello");
    if (want_server && who != want_server)
        return errmsg_set(err, "hello ack: the peer is node %llu, expected node %llu",
                          (unsigned long long)who, (unsigned long long)want_server);
    const uint8_t *c = body + 2 * WIRE_NONCE_LEN;
    uint32_t conn =
        (uint32_t)c[0] | (uint32_t)c[1] << 8 | (uint32_t)c[2] << 16 | (uint32_t)c[3] << 24;
    derive_id(key, client_nonce, body + WIRE_NONCE_LEN, conn, client, who, 1, s);
    *server = who;
    return 0;
}

static void nonce_of(uint8_t n[12], uint64_t seq, uint8_t type, int from_client)
{
    for (int i = 0; i < 8; i++) n[i] = (uint8_t)(seq >> (8 * i));
    n[8] = type;
    n[9] = (uint8_t)from_client;
    n[10] = n[11] = 0;
}

#define AD_LEN (WIRE_HDR_LEN - 4) /* the header without its CRC */

size_t session_seal(const struct session *s, uint8_t *out, uint8_t type, uint16_t flags,
                    uint64_t seq, const void *pt, size_t ptlen)
{
    struct wire_hdr h = {WIRE_VERSION, type, flags, (uint32_t)(ptlen + WIRE_TAG_LEN),
                         s->conn,      seq,  0};
    wire_hdr_encode(out, &h);
    uint8_t n[12];
    nonce_of(n, seq, type, s->is_client);
    unsigned long long clen = 0;
    crypto_aead_chacha20poly1305_ietf_encrypt(out + WIRE_HDR_LEN, &clen, pt, ptlen, out, AD_LEN,
                                              NULL, n, s->tx_key);
    h.crc = crc32c(0, out + WIRE_HDR_LEN, (size_t)clen);
    wire_hdr_encode(out, &h);
    return WIRE_HDR_LEN + (size_t)clen;
}

int session_open(const struct session *s, const uint8_t *frame, size_t len, struct wire_hdr *h,
                 uint8_t *pt, size_t *ptlen, char *err)
{
    if (wire_frame_check(h, frame, len, err)) return -1;
    if (h->type < WIRE_MSG || h->type > WIRE_CLOSE)
        return errmsg_set(err, "frame: type %u is not sealed", h->type);
    if (h->conn != s->conn)
        return errmsg_set(err, "frame: connection %u, expected %u", h->conn, s->conn);
    if (h->length < WIRE_TAG_LEN || h->length - WIRE_TAG_LEN > WIRE_MAX_MSG)
        return errmsg_set(err, "frame: sealed length %u out of range", h->length);
    uint8_t n[12];
    nonce_of(n, h->seq, h->type, !s->is_client);
    unsigned long long mlen = 0;
    if (crypto_aead_chacha20poly1305_ietf_decrypt(pt, &mlen, NULL, frame + WIRE_HDR_LEN, h->length,
                                                  frame, AD_LEN, n, s->rx_key))
        return errmsg_set(err, "frame: seq %llu does not authenticate (forged or corrupted)",
                          (unsigned long long)h->seq);
    *ptlen = (size_t)mlen;
    return 0;
}
