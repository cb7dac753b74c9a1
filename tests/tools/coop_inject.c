/* coop_inject: a misbehaving cooperative-execution joiner, for the fault scenarios.
 *
 *   build/tools/coop_inject --key-file KEY --peer IP:PORT --dim D --mode MODE
 *
 * Connects to a helper (a `strata serve` on the fabric) with the cluster key, then breaks the
 * protocol one way (MODE):
 *   good     open sequence 1 and send one well-formed step: expects the tokens back
 *   badlen   a step whose length does not match its declared shape
 *   badseq   a step with a row of a sequence that was never opened
 *   badstep  a good step 5, then a step 3 (steps only move forward)
 *   badcrc   a well-formed step with one value bit flipped after the CRC was computed
 *   badkvreq a KV request (MSG_COOP_KV_REQ) for sequence 9, which it never opened
 *   tokens   like good, the step as token ids (WIRE_TOKENS: a joiner without its embedding)
 *   badtokens token rows that claim to enter at layer 1 (CRC recomputed over the forgery)
 * and waits (5 s) for the helper to close the connection. Prints one line: "reply: ..." (good)
 * or "closed: REASON", and exits 0 when the helper did what it should (answered / closed). */
#include "os/common/errmsg.h"
#include "os/runtime/clock.h"
#include "transport/auth.h"
#include "cmd/fabric_opts.h"
#include "transport/crc32c.h"
#include "transport/transport.h"
#include "transport/wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint8_t buf[WIRE_MAX_MSG];

/* Poll until a message, the connection closing, or the deadline. 1 message, 0 closed, -1 time. */
static int wait_msg(struct tp *t, struct tp_conn *c, double until, const uint8_t **m, size_t *n)
{
    while (clock_now() < until) {
        tp_poll(t, 10);
        int r = tp_recv(c, m, n);
        if (r == 1) return 1;
        if (r < 0 || tp_conn_state(c) == TP_CLOSED) return 0;
    }
    return -1;
}

/* tokens: 0 f32 values at layer 1; 1 token ids (layer 0); 2 token ids forged to layer 1 */
static int send_step(struct tp *t, struct tp_conn *c, uint64_t step, uint32_t seq, uint32_t dim,
                     int cut, int flip, int tokens)
{
    uint32_t s[1] = {seq}, p[1] = {0}, tok[1] = {1};
    uint8_t f[1] = {WIRE_ROW_LOGITS};
    float *x = calloc(dim, sizeof *x);
    if (!x) return -1;
    for (uint32_t i = 0; i < dim; i++) x[i] = 0.01f * (float)(i % 7);
    struct wire_activations a = {.step = step,
                                 .layer = tokens ? 0 : 1,
                                 .n = 1,
                                 .dim = dim,
                                 .dtype = tokens ? WIRE_TOKENS : WIRE_F32,
                                 .seq = s,
                                 .pos = p,
                                 .token = tok,
                                 .flags = f,
                                 .x = x};
    size_t len = wire_activations_encode(buf, sizeof buf, &a);
    free(x);
    if (!len) return -1;
    if (tokens == 2) {
        buf[1 + 8] = 1; /* layer, little-endian byte 0 */
        uint32_t crc = crc32c(0, buf, len - 4);
        for (int i = 0; i < 4; i++) buf[len - 4 + i] = (uint8_t)(crc >> (8 * i));
    }
    if (flip) buf[WIRE_ACT_HDR_LEN + WIRE_ACT_ROW_LEN + 1] ^= 0x40;
    len -= (size_t)cut;
    while (tp_send(c, buf, len) == TP_BUSY) tp_poll(t, 10);
    return 0;
}

int main(int argc, char **argv)
{
    const char *key_file = NULL, *peer = NULL, *mode = "good";
    uint32_t dim = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--key-file"))
            key_file = argv[i + 1];
        else if (!strcmp(argv[i], "--peer"))
            peer = argv[i + 1];
        else if (!strcmp(argv[i], "--mode"))
            mode = argv[i + 1];
        else if (!strcmp(argv[i], "--dim"))
            dim = (uint32_t)atoi(argv[i + 1]);
    }
    if (!key_file || !peer || !dim) {
        fprintf(stderr, "usage: coop_inject --key-file KEY --peer IP:PORT --dim D --mode MODE\n");
        return 2;
    }
    char err[ERRMSG_LEN];
    struct fabric_opts fo = {.kind = "tcp", .key_file = key_file};
    struct tp_config cfg;
    if (auth_init(err) || fabric_opts_config(&fo, &cfg, err))
        return fprintf(stderr, "%s\n", err), 1;
    struct tp *t = tp_open(&cfg, err);
    struct tp_conn *c = t ? tp_connect(t, peer, err) : NULL;
    if (!c) return fprintf(stderr, "%s\n", err), 1;
    double until = clock_now() + 5;
    while (tp_conn_state(c) == TP_CONNECTING && clock_now() < until) tp_poll(t, 10);
    if (tp_conn_state(c) != TP_OPEN) {
        printf("closed: %s\n", tp_conn_error(c));
        return 1;
    }
    struct wire_coop_open o = {.seq = 1, .top_p = 1, .rng = 1};
    size_t len = wire_coop_open_encode(buf, sizeof buf, &o);
    if (strcmp(mode, "badseq")) tp_send(c, buf, len);
    int good = !strcmp(mode, "good") || !strcmp(mode, "tokens");
    int expect_reply = good || !strcmp(mode, "badstep");
    if (!strcmp(mode, "badseq"))
        send_step(t, c, 1, 77, dim, 0, 0, 0);
    else if (!strcmp(mode, "badlen"))
        send_step(t, c, 1, 1, dim, 5, 0, 0);
    else if (!strcmp(mode, "badcrc"))
        send_step(t, c, 1, 1, dim, 0, 1, 0);
    else if (!strcmp(mode, "tokens"))
        send_step(t, c, 5, 1, dim, 0, 0, 1);
    else if (!strcmp(mode, "badtokens"))
        send_step(t, c, 1, 1, dim, 0, 0, 2);
    else if (!strcmp(mode, "badkvreq")) {
        uint32_t kseq = 9, kn = 1;
        struct wire_coop_kv_req q = {.req = 1,
                                     .layer0 = 0,
                                     .layer1 = 1,
                                     .dtype = WIRE_F16,
                                     .count = 1,
                                     .seq = &kseq,
                                     .n = &kn};
        len = wire_coop_kv_req_encode(buf, sizeof buf, &q);
        while (tp_send(c, buf, len) == TP_BUSY) tp_poll(t, 10);
    } else
        send_step(t, c, 5, 1, dim, 0, 0, 0);
    const uint8_t *m;
    size_t n;
    until = clock_now() + 5;
    int r = wait_msg(t, c, until, &m, &n);
    if (expect_reply) {
        struct wire_coop_token tk[4];
        struct wire_coop_tokens rep;
        if (r != 1 || wire_coop_tokens_decode(&rep, m, n, tk, 4, err)) {
            printf("no reply: %s\n", r == 1 ? err : r == 0 ? tp_conn_error(c) : "timeout");
            return 1;
        }
        if (good) {
            printf("reply: step %llu status %u, %u token(s)%s%s\n", (unsigned long long)rep.step,
                   rep.status, rep.n, rep.status ? ": " : "", rep.error);
            return rep.status || rep.n != 1;
        }
        send_step(t, c, 3, 1, dim, 0, 0, 0);
        r = wait_msg(t, c, clock_now() + 5, &m, &n);
    }
    if (r == 0) {
        printf("closed: %s\n", tp_conn_error(c));
        return 0;
    }
    printf("still open after a bad message (%s)\n", r == 1 ? "it answered" : "no answer");
    return 1;
}
