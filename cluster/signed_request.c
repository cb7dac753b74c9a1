#include "cluster/signed_request.h"

#include "os/common/errmsg.h"

#include <inttypes.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>

void signed_replay_init(struct signed_replay *r)
{
    memset(r->slot, 0, sizeof r->slot);
    pthread_mutex_init(&r->mu, NULL);
}

void signed_replay_fini(struct signed_replay *r)
{
    pthread_mutex_destroy(&r->mu);
}

static void op_key(const struct cluster_key *key, uint8_t out[32])
{
    static const char label[] = "strata operator v1";
    crypto_generichash(out, 32, (const uint8_t *)label, sizeof label - 1, key->k, CLUSTER_KEY_LEN);
}

/* The MAC over the canonical text; node, ts and nonce exactly as the header writes them. */
static void mac_of(const struct cluster_key *key, uint64_t node, uint64_t ts_ms,
                   const uint8_t nonce[SIGNED_NONCE_LEN], const char *method, const char *path,
                   const void *body, size_t len, uint8_t out[32])
{
    uint8_t k[32];
    char head[160], hex[2 * SIGNED_NONCE_LEN + 1];
    op_key(key, k);
    sodium_bin2hex(hex, sizeof hex, nonce, SIGNED_NONCE_LEN);
    crypto_auth_hmacsha512256_state st;
    crypto_auth_hmacsha512256_init(&st, k, sizeof k);
    static const char tag[] = "strata-signed-v1\n";
    crypto_auth_hmacsha512256_update(&st, (const uint8_t *)tag, sizeof tag - 1);
    crypto_auth_hmacsha512256_update(&st, (const uint8_t *)method, strlen(method));
    crypto_auth_hmacsha512256_update(&st, (const uint8_t *)"\n", 1);
    crypto_auth_hmacsha512256_update(&st, (const uint8_t *)path, strlen(path));
    int n = snprintf(head, sizeof head, "\n%" PRIu64 "\n%" PRIu64 "\n%s\n", node, ts_ms, hex);
    crypto_auth_hmacsha512256_update(&st, (const uint8_t *)head, (size_t)n);
    if (len) crypto_auth_hmacsha512256_update(&st, body, len);
    crypto_auth_hmacsha512256_final(&st, out);
    sodium_memzero(k, sizeof k);
}

size_t signed_request_sign(char *out, size_t cap, const struct cluster_key *key, uint64_t node,
                           uint64_t ts_ms, const uint8_t nonce[SIGNED_NONCE_LEN],
                           const char *method, const char *path, const void *body, size_t len)
{
    uint8_t m[32];
    char nh[2 * SIGNED_NONCE_LEN + 1], mh[65];
    mac_of(key, node, ts_ms, nonce, method, path, body, len, m);
    sodium_bin2hex(nh, sizeof nh, nonce, SIGNED_NONCE_LEN);
    sodium_bin2hex(mh, sizeof mh, m, sizeof m);
    int n = snprintf(out, cap, "v1 node=%" PRIu64 " ts=%" PRIu64 " nonce=%s mac=%s", node, ts_ms,
                     nh, mh);
    return n > 0 && (size_t)n < cap ? (size_t)n : 0;
}

/* "NAME=" then digits (a u64 without leading zeros) or exactly `hex` hex digits, then a space or
 * the end. Advances *p. */
static int field(const char **p, const char *end, const char *name, uint64_t *num, uint8_t *bin,
                 size_t bin_len, char *err)
{
    size_t nl = strlen(name);
    if ((size_t)(end - *p) <= nl || memcmp(*p, name, nl) || (*p)[nl] != '=')
        return errmsg_set(err, "signature: expected %s=", name);
    const char *v = *p + nl + 1, *e = v;
    while (e < end && *e != ' ') e++;
    size_t vn = (size_t)(e - v);
    if (num) {
        uint64_t x = 0;
        if (!vn || vn > 19 || (vn > 1 && v[0] == '0'))
            return errmsg_set(err, "signature: %s is not a number", name);
        for (size_t i = 0; i < vn; i++) {
            if (v[i] < '0' || v[i] > '9')
                return errmsg_set(err, "signature: %s is not a number", name);
            x = x * 10 + (uint64_t)(v[i] - '0');
        }
        *num = x;
    } else {
        size_t got = 0;
        if (vn != 2 * bin_len || sodium_hex2bin(bin, bin_len, v, vn, NULL, &got, NULL) ||
            got != bin_len)
            return errmsg_set(err, "signature: %s wants %zu hex digits", name, 2 * bin_len);
    }
    *p = e < end ? e + 1 : e;
    return 0;
}

int signed_request_parse(struct signed_hdr *h, const char *value, size_t len, char *err)
{
    const char *p = value, *end = value + len;
    memset(h, 0, sizeof *h);
    if (len < 3 || memcmp(p, "v1 ", 3))
        return errmsg_set(err, "signature: not of the form 'v1 node=ID ts=MS nonce=HEX mac=HEX'");
    p += 3;
    if (field(&p, end, "node", &h->node, NULL, 0, err) ||
        field(&p, end, "ts", &h->ts_ms, NULL, 0, err) ||
        field(&p, end, "nonce", NULL, h->nonce, SIGNED_NONCE_LEN, err) ||
        field(&p, end, "mac", NULL, h->mac, sizeof h->mac, err))
        return -1;
    if (p != end || (len && value[len - 1] == ' '))
        return errmsg_set(err, "signature: trailing bytes after mac=");
    if (!h->node) return errmsg_set(err, "signature: node 0");
    return 0;
}

/* Free slots are those unused or older than twice the skew (their timestamps refuse them now). */
static int replay_record(struct signed_replay *r, const uint8_t nonce[SIGNED_NONCE_LEN],
                         uint64_t ts_ms, uint64_t now_ms, char *err)
{
    int rc = 0, free_slot = -1;
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < SIGNED_REPLAY_SLOTS; i++) {
        int stale = !r->slot[i].ts_ms || r->slot[i].ts_ms + 2 * SIGNED_SKEW_MS < now_ms;
        if (!stale && !sodium_memcmp(r->slot[i].nonce, nonce, SIGNED_NONCE_LEN)) {
            rc = errmsg_set(err, "signature: nonce already used (a replayed request)");
            break;
        }
        if (stale && free_slot < 0) free_slot = i;
    }
    if (!rc && free_slot < 0)
        rc = errmsg_set(err, "signature: %d signed requests in the last %d s: wait",
                        SIGNED_REPLAY_SLOTS, 2 * SIGNED_SKEW_MS / 1000);
    if (!rc) {
        memcpy(r->slot[free_slot].nonce, nonce, SIGNED_NONCE_LEN);
        r->slot[free_slot].ts_ms = ts_ms ? ts_ms : 1;
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
}

int signed_request_verify(const char *value, size_t value_len, const struct cluster_key *key,
                          uint64_t node, uint64_t now_ms, const char *method, const char *path,
                          const void *body, size_t len, struct signed_replay *rp, char *err)
{
    struct signed_hdr h;
    if (signed_request_parse(&h, value, value_len, err)) return -1;
    uint8_t m[32];
    mac_of(key, h.node, h.ts_ms, h.nonce, method, path, body, len, m);
    if (sodium_memcmp(m, h.mac, sizeof m))
        return errmsg_set(err, "signature: MAC does not verify (another key, or the method, path "
                               "or body changed)");
    if (h.node != node)
        return errmsg_set(err, "signature: signed for node %" PRIu64 ", this is node %" PRIu64,
                          h.node, node);
    uint64_t d = h.ts_ms > now_ms ? h.ts_ms - now_ms : now_ms - h.ts_ms;
    if (d > SIGNED_SKEW_MS)
        return errmsg_set(err,
                          "signature: timestamp %" PRIu64 " ms %s this node's clock (at most %d "
                          "ms apart)",
                          d, h.ts_ms > now_ms ? "ahead of" : "behind", SIGNED_SKEW_MS);
    return rp ? replay_record(rp, h.nonce, h.ts_ms, now_ms, err) : 0;
}
