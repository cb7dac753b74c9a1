/* ctl_probe: a control connection driven by hand, to test that a node believes only the id its
 * handshake proved (cluster/sealed_conn.h, docs/control.md "Node identity").
 *
 *   build/tools/ctl_probe KEYFILE CONTROL_ADDR AS OPEN_AS [LOAD_AS]
 *       connects to a node's control port as node AS (the handshake proves AS), sends an OPEN of
 *       the control channel in the name of OPEN_AS, then, with LOAD_AS, a load report in the name
 *       of LOAD_AS, and then a state read (MSGC_STATE_REQ). Prints one line: "answered" when the
 *       node sent the state back, or "closed: WHY" when it closed the connection first (within
 *       3 s). Exit 0 answered, 1 closed, 3 the handshake failed. */
#include "cluster/cluster_cmd.h"
#include "cluster/sealed_conn.h"
#include "os/common/errmsg.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uv_loop_t loop;
static uv_timer_t timer;
static uint64_t as, open_as, load_as;
static int result = -1;
static char why[256];

static void send_msg(struct sconn *c, const struct cl_msg *m)
{
    static uint8_t buf[CL_CMD_MAX * 4];
    size_t n = cluster_cmd_msg_encode(buf, sizeof buf, m);
    if (n) sealed_conn_send(c, buf, n);
}

static void on_ready(struct sconn *c, int status, const char *w)
{
    if (status) {
        result = 3;
        snprintf(why, sizeof why, "%s", w);
        return;
    }
    struct cl_msg m = {.type = MSGC_OPEN};
    m.u.open.channel = CHAN_CTL;
    m.u.open.id = open_as;
    snprintf(m.u.open.addr, sizeof m.u.open.addr, "127.0.0.1:1");
    send_msg(c, &m);
    if (load_as) {
        memset(&m, 0, sizeof m);
        m.type = MSGC_LOAD;
        m.u.load.node.id = load_as;
        m.u.load.node.role = ROLE_JOINER;
        snprintf(m.u.load.node.addr, sizeof m.u.load.node.addr, "127.0.0.1:1");
        snprintf(m.u.load.node.gpu, sizeof m.u.load.node.gpu, "cpu");
        send_msg(c, &m);
    }
    m = (struct cl_msg){.type = MSGC_STATE_REQ};
    send_msg(c, &m);
}

static void on_msg(struct sconn *c, const uint8_t *msg, size_t len)
{
    struct cl_msg m;
    char err[ERRMSG_LEN];
    if (!cluster_cmd_msg_decode(&m, msg, len, err) && m.type == MSGC_STATE && result < 0) {
        result = 0;
        sealed_conn_close(c, "done");
    }
}

static void on_close(struct sconn *c, const char *w)
{
    (void)c;
    if (result < 0) {
        result = 1;
        snprintf(why, sizeof why, "%s", w);
    }
    uv_stop(&loop);
}

static void on_timer(uv_timer_t *t)
{
    (void)t;
    if (result < 0) snprintf(why, sizeof why, "nothing within 3 s"), result = 1;
    uv_stop(&loop);
}

int main(int argc, char **argv)
{
    char err[ERRMSG_LEN];
    struct cluster_key key;
    if (argc < 5) {
        fprintf(stderr, "usage: ctl_probe KEYFILE CONTROL_ADDR AS OPEN_AS [LOAD_AS]\n");
        return 2;
    }
    as = strtoull(argv[3], NULL, 10);
    open_as = strtoull(argv[4], NULL, 10);
    load_as = argc > 5 ? strtoull(argv[5], NULL, 10) : 0;
    if (auth_init(err) || cluster_key_load(&key, argv[1], err)) {
        fprintf(stderr, "ctl_probe: %s\n", err);
        return 3;
    }
    uv_loop_init(&loop);
    struct sconn_cbs cbs = {.on_ready = on_ready, .on_msg = on_msg, .on_close = on_close};
    if (!sealed_conn_connect(&loop, &key, as, 0, argv[2], &cbs, NULL, err)) {
        fprintf(stderr, "ctl_probe: %s\n", err);
        return 3;
    }
    uv_timer_init(&loop, &timer);
    uv_timer_start(&timer, on_timer, 3000, 0);
    uv_run(&loop, UV_RUN_DEFAULT);
    if (result == 0)
        printf("answered\n");
    else
        printf("%s: %s\n", result == 3 ? "handshake failed" : "closed", why);
    return result;
}
