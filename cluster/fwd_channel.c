#include "cluster/fwd_channel.h"

#include "cluster/cluster_cmd.h"
#include "os/common/errmsg.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

/* One open in progress: shared by the caller's thread and the loop, freed by the last of them. */
struct fwd_req {
    pthread_mutex_t mu; /* refs, done, fd, err */
    int refs;           /* the caller (until it returns) and the loop (until it finished) */
    int done, fd;
    char err[ERRMSG_LEN];
    int efd; /* eventfd: done */
    uint64_t node;
    char addr[CL_STR_LEN + 1];
    struct fwd_channels *f;
    struct fwd_req *next;
};

struct fwd_channels {
    uv_loop_t *loop;
    const struct cluster_key *key;
    uint64_t self;
    char self_addr[CL_STR_LEN + 1];
    uv_async_t async;
    pthread_mutex_t mu; /* queue, stopped */
    struct fwd_req *queue;
    int stopped;
};

static void req_release(struct fwd_req *r)
{
    pthread_mutex_lock(&r->mu);
    int left = --r->refs;
    pthread_mutex_unlock(&r->mu);
    if (left) return;
    if (r->fd >= 0) close(r->fd); /* completed after its caller gave up */
    close(r->efd);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

/* The loop's last word on r: the channel's socket (fd >= 0) or why there is none. */
static void req_finish(struct fwd_req *r, int fd, const char *why)
{
    pthread_mutex_lock(&r->mu);
    r->done = 1;
    r->fd = fd;
    if (fd < 0) snprintf(r->err, sizeof r->err, "%s", why ? why : "closed");
    pthread_mutex_unlock(&r->mu);
    uint64_t one = 1;
    ssize_t w = write(r->efd, &one, sizeof one);
    (void)w;
    req_release(r);
}

/* ---------------------------------------------------------------- the loop's side */

static void chan_ready(struct sconn *s, int status, const char *why)
{
    struct fwd_req *r = s->data;
    char err[ERRMSG_LEN];
    s->data = NULL;
    s->cb = (struct sconn_cbs){0};
    if (!r) return;
    if (status) {
        /* The connect itself failing says so; anything later is the handshake: a node that
         * does not hold our key closes on our HELLO, or we refuse its HELLO_ACK. */
        char msg[ERRMSG_LEN];
        snprintf(msg, sizeof msg, "%s%.200s%s", strncmp(why, "connect", 7) ? "handshake: " : "",
                 why, strncmp(why, "connect", 7) ? " (is the cluster key the same?)" : "");
        return req_finish(r, -1, msg);
    }
    struct cl_msg m = {.type = MSGC_OPEN};
    m.u.open.channel = CHAN_FWD;
    m.u.open.id = r->f->self;
    snprintf(m.u.open.addr, sizeof m.u.open.addr, "%s", r->f->self_addr);
    uint8_t buf[128];
    size_t n = cluster_cmd_msg_encode(buf, sizeof buf, &m);
    int fd = n && !sealed_conn_send(s, buf, n) ? sealed_conn_relay_fd(s, err) : -1;
    if (fd < 0) {
        sealed_conn_close(s, "cannot open the forward channel");
        return req_finish(r, -1, n ? err : "cannot encode OPEN");
    }
    req_finish(r, fd, NULL);
}

static void chan_closed(struct sconn *s, const char *why)
{
    struct fwd_req *r = s->data; /* set only while the handshake runs */
    if (r) req_finish(r, -1, why);
}

static void start_one(struct fwd_channels *f, struct fwd_req *r)
{
    char err[ERRMSG_LEN];
    struct sconn_cbs cbs = {.on_ready = chan_ready, .on_close = chan_closed};
    if (!sealed_conn_connect(f->loop, f->key, f->self, r->node, r->addr, &cbs, r, err))
        req_finish(r, -1, err);
}

static void on_async(uv_async_t *a)
{
    struct fwd_channels *f = a->data;
    pthread_mutex_lock(&f->mu);
    struct fwd_req *r = f->queue;
    f->queue = NULL;
    pthread_mutex_unlock(&f->mu);
    while (r) {
        struct fwd_req *next = r->next;
        start_one(f, r);
        r = next;
    }
}

int fwd_channels_accept(struct sconn *s, char *err)
{
    return sealed_conn_relay_fd(s, err);
}

void fwd_channels_stop(struct fwd_channels *f)
{
    pthread_mutex_lock(&f->mu);
    f->stopped = 1;
    struct fwd_req *r = f->queue;
    f->queue = NULL;
    pthread_mutex_unlock(&f->mu);
    while (r) {
        struct fwd_req *next = r->next;
        req_finish(r, -1, "the control plane is stopping");
        r = next;
    }
    uv_close((uv_handle_t *)&f->async, NULL);
}

/* ---------------------------------------------------------------- the caller's side */

int fwd_channels_open(struct fwd_channels *f, uint64_t node, const char *addr, int timeout_ms,
                      int cancel_fd, char *err)
{
    struct fwd_req *r = calloc(1, sizeof *r);
    if (!r) return errmsg_set(err, "forward channel: out of memory");
    r->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (r->efd < 0) {
        free(r);
        return errmsg_set(err, "forward channel: eventfd: %s", strerror(errno));
    }
    pthread_mutex_init(&r->mu, NULL);
    r->refs = 2;
    r->fd = -1;
    r->node = node;
    r->f = f;
    snprintf(r->addr, sizeof r->addr, "%s", addr);
    pthread_mutex_lock(&f->mu);
    int stopped = f->stopped;
    if (!stopped) {
        r->next = f->queue;
        f->queue = r;
    }
    pthread_mutex_unlock(&f->mu);
    if (stopped) {
        r->refs = 1;
        req_release(r);
        return errmsg_set(err, "the control plane is stopping");
    }
    uv_async_send(&f->async);

    struct pollfd p[2] = {{.fd = r->efd, .events = POLLIN}, {.fd = cancel_fd, .events = POLLIN}};
    int n;
    do {
        n = poll(p, cancel_fd >= 0 ? 2 : 1, timeout_ms);
    } while (n < 0 && errno == EINTR);
    int rc;
    pthread_mutex_lock(&r->mu);
    if (r->done && r->fd >= 0) {
        rc = r->fd;
        r->fd = -1; /* ours now */
    } else if (r->done) {
        rc = errmsg_set(err, "%s", r->err);
    } else if (n > 0 && (p[1].revents & POLLIN)) {
        rc = -2;
    } else {
        rc = errmsg_set(err, "connect: no handshake within %d ms", timeout_ms);
    }
    pthread_mutex_unlock(&r->mu);
    req_release(r);
    return rc;
}

/* ---------------------------------------------------------------- lifecycle */

struct fwd_channels *fwd_channels_new(uv_loop_t *loop, const struct cluster_key *key, uint64_t self,
                                      const char *self_addr, char *err)
{
    struct fwd_channels *f = calloc(1, sizeof *f);
    if (!f) {
        errmsg_set(err, "forward channels: out of memory");
        return NULL;
    }
    f->loop = loop;
    f->key = key;
    f->self = self;
    snprintf(f->self_addr, sizeof f->self_addr, "%s", self_addr);
    pthread_mutex_init(&f->mu, NULL);
    if (uv_async_init(loop, &f->async, on_async)) {
        pthread_mutex_destroy(&f->mu);
        free(f);
        errmsg_set(err, "forward channels: uv_async_init failed");
        return NULL;
    }
    f->async.data = f;
    return f;
}

void fwd_channels_free(struct fwd_channels *f)
{
    if (!f) return;
    pthread_mutex_destroy(&f->mu);
    free(f);
}
