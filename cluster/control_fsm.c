/* control_fsm: the replicated state machine (raft's FSM over cluster/cluster_state.h) and the
 * leader's proposals to it.
 *
 * Every log entry is one cl_cmd framed to 8 bytes; fsm_apply decodes and applies it to c->st under
 * mu (an entry every node rejects the same way is counted, so the states stay identical);
 * snapshots are cluster_state_encode. control_fsm_propose appends a command; its answer only counts
 * what failed (the tick decides again on what committed). Runs on the control thread. */
#include "cluster/control_internal.h"

#include <stdlib.h>
#include <string.h>

struct proposal {
    struct raft_apply req;
    struct control *c;
    int type; /* its command's (a CMD_SCALE counts as a decision once committed) */
};

static struct control *fsm_control(struct raft_fsm *fsm)
{
    return fsm->data;
}

/* A log entry: u32 length of the command, the command, zeros to a multiple of 8 bytes. raft's
 * libuv I/O lays entries out 8-byte aligned in its batches; entries of other lengths arrived
 * shifted at a node catching up on several entries in one AppendEntries, so every entry is padded
 * here (as dqlite's are) and carries its own length. */
static size_t entry_encode(const struct cl_cmd *cmd, uint8_t *out, size_t cap)
{
    if (cap < 8) return 0;
    size_t n = cluster_cmd_encode(out + 4, cap - 4, cmd);
    size_t padded = (4 + n + 7) & ~(size_t)7;
    if (!n || padded > cap) return 0;
    for (int i = 0; i < 4; i++) out[i] = (uint8_t)(n >> (8 * i));
    memset(out + 4 + n, 0, padded - 4 - n);
    return padded;
}

static int entry_decode(struct cl_cmd *cmd, const uint8_t *p, size_t len, char *err)
{
    if (len < 4 || len % 8) return errmsg_set(err, "log entry of %zu bytes: not framed", len);
    size_t n = (size_t)p[0] | (size_t)p[1] << 8 | (size_t)p[2] << 16 | (size_t)p[3] << 24;
    if (n > len - 4 || len - 4 - n >= 8)
        return errmsg_set(err, "log entry of %zu bytes claims a %zu-byte command", len, n);
    return cluster_cmd_decode(cmd, p + 4, n, err);
}

static int fsm_apply(struct raft_fsm *fsm, const struct raft_buffer *buf, void **result)
{
    struct control *c = fsm_control(fsm);
    struct cl_cmd cmd;
    char err[ERRMSG_LEN];
    *result = NULL;
    pthread_mutex_lock(&c->mu);
    if (entry_decode(&cmd, buf->base, buf->len, err)) {
        /* Every node rejects the same bytes the same way: the state stays identical. */
        c->st.applied++;
        c->st.rejected++;
        pthread_mutex_unlock(&c->mu);
        log_warn("cluster", "log entry not applied: %s", err);
        return 0;
    }
    cluster_state_apply(&c->st, &cmd);
    pthread_mutex_unlock(&c->mu);
    /* Every node says it on its console: a model the cluster lost, or found again. */
    if (cmd.type == CMD_MODEL && cmd.u.model.lost)
        log_error("cluster",
                  "model %s is lost: layers [%u, %u) of %u are held by no live node; requests "
                  "for it fail (503) until a node holding it returns",
                  cmd.u.model.name, cmd.u.model.first, cmd.u.model.n_layers, cmd.u.model.n_layers);
    else if (cmd.type == CMD_MODEL)
        log_info("cluster", "model %s is found again: node %llu holds all %u layers",
                 cmd.u.model.name, (unsigned long long)cmd.u.model.node, cmd.u.model.n_layers);
    return 0;
}

static int fsm_snapshot(struct raft_fsm *fsm, struct raft_buffer *bufs[], unsigned *n_bufs)
{
    struct control *c = fsm_control(fsm);
    size_t cap = cluster_state_encoded_max();
    struct raft_buffer *b = raft_malloc(sizeof *b);
    uint8_t *p = raft_malloc(cap);
    if (!b || !p) {
        raft_free(b);
        raft_free(p);
        return RAFT_NOMEM;
    }
    pthread_mutex_lock(&c->mu);
    size_t n = cluster_state_encode(&c->st, p, cap);
    pthread_mutex_unlock(&c->mu);
    b->base = p;
    b->len = n;
    *bufs = b;
    *n_bufs = 1;
    return n ? 0 : RAFT_TOOBIG;
}

static int fsm_restore(struct raft_fsm *fsm, struct raft_buffer *buf)
{
    struct control *c = fsm_control(fsm);
    struct cl_state *s = malloc(sizeof *s);
    char err[ERRMSG_LEN];
    if (!s) return RAFT_NOMEM;
    if (cluster_state_decode(s, buf->base, buf->len, err)) {
        log_warn("cluster", "snapshot not restored: %s", err);
        free(s);
        return RAFT_CORRUPT;
    }
    pthread_mutex_lock(&c->mu);
    c->st = *s;
    pthread_mutex_unlock(&c->mu);
    free(s);
    raft_free(buf->base);
    log_info("cluster", "restored a snapshot: %u members, %llu commands applied", c->st.n_members,
             (unsigned long long)c->st.applied);
    return 0;
}

void control_fsm_init(struct control *c)
{
    c->fsm = (struct raft_fsm){.version = 1,
                               .data = c,
                               .apply = fsm_apply,
                               .snapshot = fsm_snapshot,
                               .restore = fsm_restore};
}

static void proposed(struct raft_apply *req, int status, void *result)
{
    struct proposal *p = req->data;
    struct control *c = p->c;
    (void)result;
    c->inflight--;
    pthread_mutex_lock(&c->mu);
    if (status)
        c->proposals_failed++;
    else if (p->type == CMD_SCALE)
        c->decisions++;
    pthread_mutex_unlock(&c->mu);
    if (status) log_warn("cluster", "proposal not committed: %s", raft_strerror(status));
    free(p);
}

int control_fsm_propose(struct control *c, struct cl_cmd *cmd)
{
    cmd->t_ms = now_wall_ms();
    uint8_t tmp[CL_CMD_MAX + 8];
    size_t n = entry_encode(cmd, tmp, sizeof tmp);
    struct proposal *p = calloc(1, sizeof *p);
    struct raft_buffer b = {.base = n ? raft_malloc(n) : NULL, .len = n};
    if (!p || !b.base) {
        free(p);
        raft_free(b.base);
        return -1;
    }
    memcpy(b.base, tmp, n);
    p->c = c;
    p->type = cmd->type;
    p->req.data = p;
    int rc = raft_apply(&c->raft, &p->req, &b, 1, proposed);
    if (rc) {
        raft_free(b.base);
        free(p);
        log_warn("cluster", "propose: %s", raft_strerror(rc));
        return -1;
    }
    c->inflight++;
    return 0;
}
