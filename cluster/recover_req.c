#include "cluster/recover_req.h"

#include "os/common/errmsg.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#define ID_MAX 9007199254740992.0 /* 2^53: larger ids do not survive a JSON number */

static int add_voter(struct recover_req *r, uint64_t id, char *err)
{
    for (int i = 0; i < r->n_voters; i++)
        if (r->voters[i] == id)
            return errmsg_set(err, "\"voters\": node %llu is named twice", (unsigned long long)id);
    if (r->n_voters == CL_MAX_NODES)
        return errmsg_set(err, "\"voters\": more than %d nodes", CL_MAX_NODES);
    r->voters[r->n_voters++] = id;
    return 0;
}

static int parse_voters(struct recover_req *r, const cJSON *a, char *err)
{
    if (!cJSON_IsArray(a)) return errmsg_set(err, "\"voters\" is not an array of node ids");
    const cJSON *v;
    cJSON_ArrayForEach(v, a)
    {
        double d = v->valuedouble;
        if (!cJSON_IsNumber(v) || d < 1 || d > ID_MAX || d != (double)(uint64_t)d)
            return errmsg_set(err, "\"voters\": every entry must be a node id (an integer >= 1)");
        if (add_voter(r, (uint64_t)d, err)) return -1;
    }
    if (!r->n_voters) return errmsg_set(err, "\"voters\" is empty: name at least this node");
    return 0;
}

int recover_req_parse(struct recover_req *r, const char *body, size_t len, char *err)
{
    memset(r, 0, sizeof *r);
    cJSON *root = body && len ? cJSON_ParseWithLength(body, len) : NULL;
    int rc = -1, seen_voters = 0, seen_force = 0;
    if (!root) {
        errmsg_set(err, "the body is not JSON: expected {\"voters\":[ids],\"force\":false}");
        goto out;
    }
    if (!cJSON_IsObject(root)) {
        errmsg_set(err, "the body is not a JSON object: expected {\"voters\":[ids]}");
        goto out;
    }
    const cJSON *f;
    cJSON_ArrayForEach(f, root)
    {
        const char *k = f->string ? f->string : "";
        if (!strcmp(k, "voters")) {
            if (seen_voters++) {
                errmsg_set(err, "\"voters\" is given twice");
                goto out;
            }
            if (parse_voters(r, f, err)) goto out;
        } else if (!strcmp(k, "force")) {
            if (seen_force++ || !cJSON_IsBool(f)) {
                errmsg_set(err, "\"force\" must be given once, as true or false");
                goto out;
            }
            r->force = cJSON_IsTrue(f);
        } else {
            errmsg_set(err, "unknown field \"%.64s\" (known: \"voters\", \"force\")", k);
            goto out;
        }
    }
    if (!seen_voters) {
        errmsg_set(err, "\"voters\" is missing: the node ids of the new configuration");
        goto out;
    }
    rc = 0;
out:
    cJSON_Delete(root);
    return rc;
}

int recover_list_parse(struct recover_req *r, const char *list, char *err)
{
    memset(r, 0, sizeof *r);
    const char *p = list ? list : "";
    for (;;) {
        char *end;
        if (*p < '0' || *p > '9')
            return errmsg_set(err, "'%.64s' is not a list of node ids (ID,ID,...)", list);
        unsigned long long id = strtoull(p, &end, 10);
        if (!id || (double)id > ID_MAX || (*end && *end != ','))
            return errmsg_set(err, "'%.64s' is not a list of node ids (ID,ID,...)", list);
        if (add_voter(r, id, err)) return errmsg_prefix(err, "'%.64s': ", list);
        if (!*end) return 0;
        p = end + 1;
    }
}

static int known(const struct recover_view *v, uint64_t id)
{
    for (int i = 0; i < v->n_known; i++)
        if (v->known[i] == id) return 1;
    return 0;
}

int recover_check(const struct recover_req *r, const struct recover_view *v, char *err)
{
    int self = 0;
    for (int i = 0; i < r->n_voters; i++) {
        self |= r->voters[i] == v->self;
        if (!known(v, r->voters[i])) {
            errmsg_set(err,
                       "node %llu is not a member this node knows (not in raft's configuration, "
                       "the cluster's state or --cluster)",
                       (unsigned long long)r->voters[i]);
            return 400;
        }
    }
    if (!self) {
        errmsg_set(err,
                   "the voters do not name this node (%llu): recovery re-initialises raft on the "
                   "node that receives it, so send it to one of the voters",
                   (unsigned long long)v->self);
        return 400;
    }
    if (r->force) return 0;
    if (v->leader == v->self) {
        errmsg_set(err,
                   "node %llu is the leader: the cluster has its quorum; a forced configuration "
                   "would split it (add \"force\":true to override)",
                   (unsigned long long)v->self);
        return 409;
    }
    if (v->leader) {
        errmsg_set(err,
                   "node %llu sees a leader (node %llu): the cluster has its quorum; a forced "
                   "configuration would split it (add \"force\":true to override)",
                   (unsigned long long)v->self, (unsigned long long)v->leader);
        return 409;
    }
    if (v->leaderless_ms < v->need_ms) {
        errmsg_set(err,
                   "node %llu has had no leader for only %llu ms: an election may still end it; "
                   "retry after %llu ms without one (or add \"force\":true)",
                   (unsigned long long)v->self, (unsigned long long)v->leaderless_ms,
                   (unsigned long long)v->need_ms);
        return 409;
    }
    return 0;
}
