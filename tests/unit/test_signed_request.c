/* An operator's signed request (cluster/signed_request.h): what the CLI signs verifies once on the
 * node it names, and every change is refused with its reason: another key, method, path, body or
 * node, a timestamp outside the skew, a replayed nonce, a malformed header; the replay window
 * frees its slots as they age. The MAC of a fixed request is pinned (computed apart, in Python). */
#include "check.h"

#include "cluster/signed_request.h"
#include "os/common/errmsg.h"

#include <stdio.h>
#include <string.h>

static char err[ERRMSG_LEN];
static struct cluster_key key, other;
static const char BODY[] = "{\"voters\":[1,2],\"force\":false}";
static const char PATH[] = "/v1/cluster/recover";
#define T0         1700000000000ull
#define PINNED_MAC "674a45eddeee5ead5d8027d0cfc1e11c1d14bc6800398822fe06dfa58c86066e"

static void keys(void)
{
    CHECK(!auth_init(err));
    CHECK(!cluster_key_parse(
        &key, "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f", err));
    CHECK(!cluster_key_parse(
        &other, "100102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f", err));
}

static size_t sign(char *out, const struct cluster_key *k, uint64_t node, uint64_t ts, int nonce)
{
    uint8_t n[SIGNED_NONCE_LEN] = {(uint8_t)nonce, (uint8_t)(nonce >> 8), (uint8_t)(nonce >> 16)};
    return signed_request_sign(out, SIGNED_HEADER_MAX, k, node, ts, n, "POST", PATH, BODY,
                               strlen(BODY));
}

static int verify(const char *h, uint64_t node, uint64_t now, const char *method, const char *path,
                  const char *body, struct signed_replay *rp)
{
    return signed_request_verify(h, strlen(h), &key, node, now, method, path, body, strlen(body),
                                 rp, err);
}

TEST(pinned_signature)
{
    keys();
    char h[SIGNED_HEADER_MAX];
    uint8_t n[SIGNED_NONCE_LEN];
    for (int i = 0; i < SIGNED_NONCE_LEN; i++) n[i] = (uint8_t)i;
    CHECK(signed_request_sign(h, sizeof h, &key, 1, T0, n, "POST", PATH, NULL, 0) > 0);
    /* BLAKE2b-256(key 00..1f, "strata operator v1") as the HMAC-SHA-512-256 key over
     * "strata-signed-v1\nPOST\n/v1/cluster/recover\n1\n1700000000000\n000102..0f\n" */
    CHECK_STR(h, "v1 node=1 ts=1700000000000 nonce=000102030405060708090a0b0c0d0e0f "
                 "mac=" PINNED_MAC);
}

TEST(verifies_once_on_its_node)
{
    keys();
    struct signed_replay rp;
    signed_replay_init(&rp);
    char h[SIGNED_HEADER_MAX];
    CHECK(sign(h, &key, 2, T0, 1) > 0);
    CHECKF(!verify(h, 2, T0 + 1000, "POST", PATH, BODY, &rp), "%s", err);
    /* the same request again: a replay */
    CHECK(verify(h, 2, T0 + 2000, "POST", PATH, BODY, &rp) == -1);
    CHECKF(strstr(err, "replayed"), "%s", err);
    /* within the skew either way; past it, refused */
    CHECK(sign(h, &key, 2, T0, 2) > 0);
    CHECKF(!verify(h, 2, T0 - SIGNED_SKEW_MS, "POST", PATH, BODY, &rp), "%s", err);
    CHECK(sign(h, &key, 2, T0, 3) > 0);
    CHECK(verify(h, 2, T0 + SIGNED_SKEW_MS + 1, "POST", PATH, BODY, &rp) == -1);
    CHECKF(strstr(err, "behind this node's clock"), "%s", err);
    CHECK(verify(h, 2, T0 - SIGNED_SKEW_MS - 1, "POST", PATH, BODY, &rp) == -1);
    CHECKF(strstr(err, "ahead of this node's clock"), "%s", err);
    /* meant for node 2: node 1 refuses it */
    CHECK(verify(h, 1, T0, "POST", PATH, BODY, &rp) == -1);
    CHECKF(strstr(err, "signed for node 2, this is node 1"), "%s", err);
    /* any byte of the method, path or body changed; another key */
    CHECK(verify(h, 2, T0, "PUT", PATH, BODY, &rp) == -1);
    CHECK(verify(h, 2, T0, "POST", "/v1/cluster/recovers", BODY, &rp) == -1);
    CHECK(verify(h, 2, T0, "POST", PATH, "{\"voters\":[1,2],\"force\":true}", &rp) == -1);
    CHECKF(strstr(err, "MAC does not verify"), "%s", err);
    char o[SIGNED_HEADER_MAX];
    CHECK(sign(o, &other, 2, T0, 4) > 0);
    CHECK(verify(o, 2, T0, "POST", PATH, BODY, &rp) == -1);
    /* the fields themselves changed (node, time, nonce) under the same MAC */
    char t[SIGNED_HEADER_MAX];
    snprintf(t, sizeof t, "%s", h);
    memcpy(strstr(t, "node=2"), "node=3", 6);
    CHECK(verify(t, 3, T0, "POST", PATH, BODY, &rp) == -1);
    snprintf(t, sizeof t, "%s", h);
    strstr(t, "ts=")[5] ^= 1;
    CHECK(verify(t, 2, T0, "POST", PATH, BODY, &rp) == -1);
    snprintf(t, sizeof t, "%s", h);
    strstr(t, "nonce=")[6] = strstr(t, "nonce=")[6] == '0' ? '1' : '0';
    CHECK(verify(t, 2, T0, "POST", PATH, BODY, &rp) == -1);
    /* and it still verifies once as it was */
    CHECKF(!verify(h, 2, T0, "POST", PATH, BODY, &rp), "%s", err);
    signed_replay_fini(&rp);
}

TEST(malformed_headers)
{
    keys();
    struct signed_hdr sh;
    const char *bad[] = {
        "",
        "v2 node=1 ts=1 nonce=000102030405060708090a0b0c0d0e0f mac=" PINNED_MAC,
        "v1 node=0 ts=1 nonce=000102030405060708090a0b0c0d0e0f mac=" PINNED_MAC,
        "v1 node=01 ts=1 nonce=000102030405060708090a0b0c0d0e0f mac=" PINNED_MAC,
        "v1 node=1 ts=x nonce=000102030405060708090a0b0c0d0e0f mac=" PINNED_MAC,
        "v1 node=1 ts=1 nonce=0001 mac=" PINNED_MAC,
        "v1 node=1 ts=1 nonce=zz0102030405060708090a0b0c0d0e0f mac=" PINNED_MAC,
        "v1 node=1 ts=1 nonce=000102030405060708090a0b0c0d0e0f mac=00",
        "v1 node=1 ts=1 nonce=000102030405060708090a0b0c0d0e0f mac=" PINNED_MAC " ",
        "v1 node=1 ts=1 nonce=000102030405060708090a0b0c0d0e0f mac=" PINNED_MAC " x=1",
        "v1 ts=1 node=1 nonce=000102030405060708090a0b0c0d0e0f mac=" PINNED_MAC,
        "v1 node=99999999999999999999 ts=1 nonce=000102030405060708090a0b0c0d0e0f mac=" PINNED_MAC,
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECKF(signed_request_parse(&sh, bad[i], strlen(bad[i]), err) == -1, "%s", bad[i]);
    const char *good = "v1 node=1 ts=1 nonce=000102030405060708090a0b0c0d0e0f mac=" PINNED_MAC;
    CHECKF(!signed_request_parse(&sh, good, strlen(good), err), "%s", err);
    CHECK(sh.node == 1 && sh.ts_ms == 1 && sh.nonce[15] == 15);
}

TEST(replay_window_frees_as_it_ages)
{
    keys();
    struct signed_replay rp;
    signed_replay_init(&rp);
    char h[SIGNED_HEADER_MAX];
    for (int i = 0; i < SIGNED_REPLAY_SLOTS; i++) {
        CHECK(sign(h, &key, 1, T0, 7 * i) > 0);
        CHECKF(!verify(h, 1, T0, "POST", PATH, BODY, &rp), "%d: %s", i, err);
    }
    CHECK(sign(h, &key, 1, T0, 5000) > 0);
    CHECK(verify(h, 1, T0, "POST", PATH, BODY, &rp) == -1);
    CHECKF(strstr(err, "signed requests in the last"), "%s", err);
    /* Past twice the skew the old nonces are stale (their timestamps refuse them anyway). */
    CHECK(sign(h, &key, 1, T0 + 2 * SIGNED_SKEW_MS + 1, 5000) > 0);
    CHECKF(!verify(h, 1, T0 + 2 * SIGNED_SKEW_MS + 1, "POST", PATH, BODY, &rp), "%s", err);
    signed_replay_fini(&rp);
}

int main(void)
{
    RUN(pinned_signature);
    RUN(verifies_once_on_its_node);
    RUN(malformed_headers);
    RUN(replay_window_frees_as_it_ages);
    CHECK_DONE();
}
