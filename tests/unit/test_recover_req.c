/* The operator's recovery request (cluster/recover_req.h): the JSON body of POST
 * /v1/cluster/recover, the --cluster-recover list, and the check of a request against what the
 * node sees (this node named, only known members, no leader for long enough unless forced). */
#include "check.h"

#include "cluster/recover_req.h"
#include "os/common/errmsg.h"

static int parse(struct recover_req *r, const char *body, char *err)
{
    return recover_req_parse(r, body, strlen(body), err);
}

TEST(body_accepts_voters_and_force)
{
    struct recover_req r;
    char err[ERRMSG_LEN];
    CHECKF(!parse(&r, "{\"voters\":[1,3]}", err), "%s", err);
    CHECK(r.n_voters == 2 && r.voters[0] == 1 && r.voters[1] == 3 && !r.force);
    CHECKF(!parse(&r, " {\"force\":true, \"voters\":[7]} ", err), "%s", err);
    CHECK(r.n_voters == 1 && r.voters[0] == 7 && r.force);
    CHECKF(!parse(&r, "{\"voters\":[9007199254740992],\"force\":false}", err), "%s", err);
    CHECK(r.voters[0] == 9007199254740992ull && !r.force);
    /* Only the given length counts: what follows it is not part of the body. */
    CHECKF(!recover_req_parse(&r, "{\"voters\":[2]}garbage", 14, err), "%s", err);
    CHECK(r.n_voters == 1 && r.voters[0] == 2);
}

TEST(body_rejects_with_the_reason)
{
    static const struct {
        const char *body, *why;
    } bad[] = {
        {"", "not JSON"},
        {"{\"voters\":[1]", "not JSON"},
        {"[1,3]", "not a JSON object"},
        {"{}", "\"voters\" is missing"},
        {"{\"voters\":[]}", "\"voters\" is empty"},
        {"{\"voters\":1}", "not an array"},
        {"{\"voters\":[0]}", "an integer >= 1"},
        {"{\"voters\":[-1]}", "an integer >= 1"},
        {"{\"voters\":[1.5]}", "an integer >= 1"},
        {"{\"voters\":[\"1\"]}", "an integer >= 1"},
        {"{\"voters\":[1e300]}", "an integer >= 1"},
        {"{\"voters\":[3,1,3]}", "node 3 is named twice"},
        {"{\"voters\":[1],\"voters\":[2]}", "given twice"},
        {"{\"voters\":[1],\"force\":1}", "\"force\" must be given once, as true or false"},
        {"{\"voters\":[1],\"force\":true,\"force\":true}", "\"force\" must be given once"},
        {"{\"voter\":[1]}", "unknown field \"voter\""},
    };
    struct recover_req r;
    char err[ERRMSG_LEN];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        CHECKF(parse(&r, bad[i].body, err) == -1, "'%s' accepted", bad[i].body);
        CHECKF(strstr(err, bad[i].why), "'%s': \"%s\", expected \"%s\"", bad[i].body, err,
               bad[i].why);
    }
    char many[512] = "{\"voters\":[";
    for (int i = 1; i <= CL_MAX_NODES + 1; i++)
        snprintf(many + strlen(many), sizeof many - strlen(many), "%s%d", i > 1 ? "," : "", i);
    strcat(many, "]}");
    CHECK(parse(&r, many, err) == -1 && strstr(err, "more than 32 nodes"));
}

TEST(list_parses_and_rejects)
{
    struct recover_req r;
    char err[ERRMSG_LEN];
    CHECKF(!recover_list_parse(&r, "1,3", err), "%s", err);
    CHECK(r.n_voters == 2 && r.voters[0] == 1 && r.voters[1] == 3 && !r.force);
    CHECKF(!recover_list_parse(&r, "12", err), "%s", err);
    CHECK(r.n_voters == 1 && r.voters[0] == 12);
    const char *bad[] = {"", ",", "1,", ",1", "1,,3", "0", "1;3", "a", "1 ,3", "-1", "+1", NULL};
    for (int i = 0; bad[i]; i++) {
        CHECKF(recover_list_parse(&r, bad[i], err) == -1, "'%s' accepted", bad[i]);
        CHECKF(strstr(err, "is not a list of node ids"), "'%s': %s", bad[i], err);
    }
    CHECK(recover_list_parse(&r, NULL, err) == -1);
    CHECK(recover_list_parse(&r, "2,1,2", err) == -1 && strstr(err, "node 2 is named twice"));
}

TEST(check_names_self_known_and_no_leader)
{
    const uint64_t known[] = {1, 2, 3, 2, 5};
    struct recover_view v = {.self = 1,
                             .known = known,
                             .n_known = 5,
                             .leader = 0,
                             .leaderless_ms = 5000,
                             .need_ms = 2000};
    struct recover_req r = {.voters = {1, 3}, .n_voters = 2};
    char err[ERRMSG_LEN];
    CHECKF(recover_check(&r, &v, err) == 0, "%s", err);
    r = (struct recover_req){.voters = {1}, .n_voters = 1};
    CHECK(recover_check(&r, &v, err) == 0);

    r = (struct recover_req){.voters = {2, 3}, .n_voters = 2, .force = 1};
    CHECK_EQ_INT(recover_check(&r, &v, err), 400);
    CHECKF(strstr(err, "do not name this node (1)"), "%s", err);
    r = (struct recover_req){.voters = {1, 4}, .n_voters = 2, .force = 1};
    CHECK_EQ_INT(recover_check(&r, &v, err), 400);
    CHECKF(strstr(err, "node 4 is not a member"), "%s", err);

    /* A leader seen, or not long enough without one: refused unless forced. */
    r = (struct recover_req){.voters = {1}, .n_voters = 1};
    v.leader = 2;
    CHECK_EQ_INT(recover_check(&r, &v, err), 409);
    CHECKF(strstr(err, "sees a leader (node 2)") && strstr(err, "\"force\":true"), "%s", err);
    v.leader = 1;
    CHECK_EQ_INT(recover_check(&r, &v, err), 409);
    CHECKF(strstr(err, "node 1 is the leader"), "%s", err);
    v.leader = 0;
    v.leaderless_ms = 1999;
    CHECK_EQ_INT(recover_check(&r, &v, err), 409);
    CHECKF(strstr(err, "no leader for only 1999 ms"), "%s", err);
    r.force = 1;
    CHECK(recover_check(&r, &v, err) == 0);
    v.leader = 2;
    CHECK(recover_check(&r, &v, err) == 0);
}

int main(void)
{
    RUN(body_accepts_voters_and_force);
    RUN(body_rejects_with_the_reason);
    RUN(list_parses_and_rejects);
    RUN(check_names_self_known_and_no_leader);
    CHECK_DONE();
}
