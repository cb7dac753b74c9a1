/* signed_request: an operator's request to a state-changing cluster endpoint, signed with the
 * cluster key (POST /v1/cluster/recover on a node without --api-key; `strata cluster` signs).
 *
 * The header, one line:
 *   X-Strata-Signature: v1 node=ID ts=UNIX_MS nonce=HEX32 mac=HEX64
 * mac = HMAC-SHA-512-256 under K_op = BLAKE2b-256(key = cluster key, "strata operator v1") over
 *   "strata-signed-v1\n" METHOD "\n" PATH "\n" ID "\n" UNIX_MS "\n" NONCE "\n" BODY
 * (ID, UNIX_MS and NONCE as written in the header). The node that receives it refuses, naming
 * the reason: another form; a node id that is not its own (a request meant for node 1 does nothing
 * on node 2); a timestamp more than SIGNED_SKEW_MS from its wall clock; a MAC that does not verify
 * (constant time: another key, or any byte of method, path or body changed); a nonce it accepted
 * before (a replay within the window; outside it the timestamp refuses it). The nonces it
 * accepted are kept for 2 x SIGNED_SKEW_MS (SIGNED_REPLAY_SLOTS of them: more fresh ones than that
 * and new requests are refused until some expire). A node that restarts forgets them: a request
 * recorded within the window can be replayed once to the restarted node (docs/control.md).
 *
 * K_op is its own key, so a signature is never a MAC of the handshake's or the reverse. */
#ifndef STRATA_SIGNED_REQUEST_H
#define STRATA_SIGNED_REQUEST_H

#include "transport/auth.h"

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define SIGNED_SKEW_MS      30000
#define SIGNED_NONCE_LEN    16
#define SIGNED_REPLAY_SLOTS 256
#define SIGNED_HEADER_MAX   192 /* the header's value, with room */

struct signed_hdr {
    uint64_t node, ts_ms;
    uint8_t nonce[SIGNED_NONCE_LEN];
    uint8_t mac[32];
};

/* Nonces accepted lately (any thread: its own mutex). Zero it, then signed_replay_init. */
struct signed_replay {
    pthread_mutex_t mu;
    struct {
        uint8_t nonce[SIGNED_NONCE_LEN];
        uint64_t ts_ms; /* 0: free */
    } slot[SIGNED_REPLAY_SLOTS];
};
void signed_replay_init(struct signed_replay *r);
void signed_replay_fini(struct signed_replay *r);

/* The header's value for this request into out (cap >= SIGNED_HEADER_MAX); its length, 0 if cap
 * is too small. */
size_t signed_request_sign(char *out, size_t cap, const struct cluster_key *key, uint64_t node,
                           uint64_t ts_ms, const uint8_t nonce[SIGNED_NONCE_LEN],
                           const char *method, const char *path, const void *body, size_t len);
/* The header's value (len bytes, no NUL needed) into h: 0, or -1 with err naming what is wrong. */
int signed_request_parse(struct signed_hdr *h, const char *value, size_t len, char *err);
/* Every check above, against this node's id and wall clock now_ms; rp records the nonce once all
 * passed (NULL: not recorded, for tests). 0, or -1 with err. */
int signed_request_verify(const char *value, size_t value_len, const struct cluster_key *key,
                          uint64_t node, uint64_t now_ms, const char *method, const char *path,
                          const void *body, size_t len, struct signed_replay *rp, char *err);

#endif
