/* auth: the cluster key, the handshake, and sealed frames (libsodium).
 *
 * Every node of a cluster holds the same 32-byte cluster key (a file of 64 hex digits). A
 * connection starts with HELLO (client nonce, MAC) and HELLO_ACK (both nonces, connection id,
 * MAC); the MACs are HMAC-SHA-512-256 (crypto_auth) under the cluster key, so a node without the
 * key is refused by the server, and a server without it is refused by the client. Both sides then
 * derive one key per direction, BLAKE2b(key = cluster key, client nonce || server nonce || conn),
 * and every later frame is sealed with ChaCha20-Poly1305 (IETF): the payload is encrypted (a node
 * without the key cannot read weights), the 24 header bytes before the CRC are authenticated data
 * (a forged or altered frame fails to open and is dropped), and the nonce is the frame's sequence
 * number, type and direction, which never repeat under one session key. A retransmitted frame is
 * the identical bytes, so reusing its nonce reveals nothing. Replays inside a session are rejected
 * by the transports' sequence checks; replays across sessions fail because keys differ. */
#ifndef STRATA_AUTH_H
#define STRATA_AUTH_H

#include "transport/wire.h"

#include <stddef.h>
#include <stdint.h>

#define CLUSTER_KEY_LEN 32

struct cluster_key {
    uint8_t k[CLUSTER_KEY_LEN];
};

/* Call once before any other function (sodium_init). */
int auth_init(char *err);
/* Read 64 hex digits (surrounding whitespace allowed) from `path`. */
int cluster_key_load(struct cluster_key *key, const char *path, char *err);
int cluster_key_parse(struct cluster_key *key, const char *hex, char *err);

struct session {
    uint32_t conn;
    int is_client;
    uint8_t tx_key[32], rx_key[32];
};

/* Fresh random bytes for a client nonce (one per connection attempt). */
void auth_nonce(uint8_t nonce[WIRE_NONCE_LEN]);
/* Whole HELLO frame (header + body) for `nonce` into out[WIRE_HDR_LEN + WIRE_HELLO_LEN]; the same
 * nonce gives the same frame, so a datagram transport can repeat it. */
size_t auth_hello(const struct cluster_key *key, const uint8_t nonce[WIRE_NONCE_LEN], uint8_t *out);
/* Check a received HELLO frame's body (after wire_frame_check); copies the client nonce out. */
int auth_hello_check(const struct cluster_key *key, const uint8_t *body, size_t len,
                     uint8_t nonce[WIRE_NONCE_LEN], char *err);
/* Server: HELLO_ACK frame for `client_nonce` with a fresh server nonce; derives the session. */
size_t auth_hello_ack(const struct cluster_key *key, const uint8_t client_nonce[WIRE_NONCE_LEN],
                      uint32_t conn, struct session *s, uint8_t *out);
/* Client: check a HELLO_ACK body against the nonce it sent; derives the session. */
int auth_hello_ack_check(const struct cluster_key *key, const uint8_t *body, size_t len,
                         const uint8_t client_nonce[WIRE_NONCE_LEN], struct session *s, char *err);

/* The control plane's handshake (cluster/sealed_conn.h): the same, with each end's node id bound
 * in. HELLO_ID carries the client's id and is MACed under K_client, HELLO_ID_ACK carries both ids
 * and is MACed under K_server, where K_id = BLAKE2b-256(key = cluster key, "strata node key v1"
 * || id); the session keys are derived from the nonces, the connection id and both ids. So an id
 * is fixed for the whole connection: a message that later claims another one is a lie the receiver
 * can see (it compares), and no one without the key can change it on the way. Id 0 is refused.
 * want_server: the id the client meant to reach (0: any), refused otherwise. */
size_t auth_hello_id(const struct cluster_key *key, const uint8_t nonce[WIRE_NONCE_LEN],
                     uint64_t id, uint8_t *out);
int auth_hello_id_check(const struct cluster_key *key, const uint8_t *body, size_t len,
                        uint8_t nonce[WIRE_NONCE_LEN], uint64_t *id, char *err);
size_t auth_hello_id_ack(const struct cluster_key *key, const uint8_t client_nonce[WIRE_NONCE_LEN],
                         uint64_t client, uint32_t conn, uint64_t server, struct session *s,
                         uint8_t *out);
int auth_hello_id_ack_check(const struct cluster_key *key, const uint8_t *body, size_t len,
                            const uint8_t client_nonce[WIRE_NONCE_LEN], uint64_t client,
                            uint64_t want_server, uint64_t *server, struct session *s, char *err);

/* Seal `pt` into a complete frame at out (capacity WIRE_HDR_LEN + ptlen + WIRE_TAG_LEN).
 * Returns the frame length. */
size_t session_seal(const struct session *s, uint8_t *out, uint8_t type, uint16_t flags,
                    uint64_t seq, const void *pt, size_t ptlen);
/* Check the CRC, the connection id and the tag of a whole frame; decrypt into pt (capacity
 * h->length - WIRE_TAG_LEN suffices, at most WIRE_MAX_MSG). */
int session_open(const struct session *s, const uint8_t *frame, size_t len, struct wire_hdr *h,
                 uint8_t *pt, size_t *ptlen, char *err);

#endif
