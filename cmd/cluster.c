/* strata cluster: an operator's signed requests to a running cluster (docs/control.md).
 *
 *   strata cluster recover --key-file K --voters 1,2 [--force] [--api HOST:PORT] [--node ID]
 *                          [--api-key KEY]
 *
 * POST /v1/cluster/recover {"voters":[1,2],"force":false} to the node at --api (default
 * 127.0.0.1:8080), signed with the cluster key (cluster/signed_request.h): a node without an API
 * key refuses it unsigned. The signature names the node it is for (--node, or the node_id its
 * GET /v1/cluster says), the time and a fresh nonce, so it works once, on that node, within
 * SIGNED_SKEW_MS. Prints the node's answer; exits 0 when it recovered, 1 otherwise, 2 on usage. */
#include "cluster/recover_req.h"
#include "cluster/signed_request.h"
#include "cmd/commands.h"
#include "cmd/options.h"
#include "os/common/errmsg.h"
#include "os/runtime/http_fetch.h"
#include "os/runtime/wall_clock.h"
#include "transport/auth.h"

#include <cjson/cJSON.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PATH_RECOVER "/v1/cluster/recover"

static int usage(void)
{
    fprintf(stderr,
            "usage: strata cluster recover --key-file K --voters ID[,ID...] [--force]\n"
            "                              [--api HOST:PORT] [--node ID] [--api-key KEY]\n");
    return 2;
}

/* The node's id, from its GET /v1/cluster. */
static int node_of(const char *url, const char *auth, uint64_t *node, char *err)
{
    int status;
    char *body;
    size_t len;
    if (http_exchange("GET", url, auth, NULL, 0, &status, &body, &len, err)) return -1;
    cJSON *j = status == 200 ? cJSON_Parse(body) : NULL;
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(j, "node_id");
    int rc = cJSON_IsNumber(id) && id->valuedouble >= 1 ? 0 : -1;
    if (!rc)
        *node = (uint64_t)id->valuedouble;
    else
        errmsg_set(err, "%s: HTTP %d, no node_id in the answer (give --node)", url, status);
    cJSON_Delete(j);
    free(body);
    return rc;
}

static int run_recover(int argc, char **argv)
{
    const char *key_file = NULL, *voters = NULL, *api = "127.0.0.1:8080", *api_key = NULL;
    long node = 0;
    int force = 0;
    const struct opt table[] = {
        {"--key-file", OPT_STR, &key_file, 0, 0, NULL, "K"},
        {"--voters", OPT_STR, &voters, 0, 0, NULL, "ID,..."},
        {"--force", OPT_FLAG, &force, 0, 0, NULL, NULL},
        {"--api", OPT_STR, &api, 0, 0, NULL, "HOST:PORT"},
        {"--node", OPT_LONG, &node, 1, 1e15, NULL, "ID"},
        {"--api-key", OPT_STR, &api_key, 0, 0, NULL, "KEY"},
    };
    char err[ERRMSG_LEN];
    if (opts_parse(table, sizeof table / sizeof table[0], argc, argv, err)) {
        fprintf(stderr, "strata cluster recover: %s\n", err);
        return usage();
    }
    if (!key_file || !voters) return usage();
    struct recover_req rq;
    struct cluster_key key;
    if (recover_list_parse(&rq, voters, err) || auth_init(err) ||
        cluster_key_load(&key, key_file, err)) {
        fprintf(stderr, "strata cluster recover: %s\n", err);
        return 1;
    }
    char url[256], auth[300] = "";
    if (api_key) snprintf(auth, sizeof auth, "Authorization: Bearer %s\r\n", api_key);
    uint64_t id = (uint64_t)node;
    snprintf(url, sizeof url, "http://%s/v1/cluster", api);
    if (!id && node_of(url, auth, &id, err)) {
        fprintf(stderr, "strata cluster recover: %s\n", err);
        return 1;
    }
    char body[64 + 24 * CL_MAX_NODES];
    size_t bl = (size_t)snprintf(body, sizeof body, "{\"voters\":[");
    for (int i = 0; i < rq.n_voters; i++)
        bl += (size_t)snprintf(body + bl, sizeof body - bl, "%s%llu", i ? "," : "",
                               (unsigned long long)rq.voters[i]);
    bl +=
        (size_t)snprintf(body + bl, sizeof body - bl, "],\"force\":%s}", force ? "true" : "false");
    uint8_t nonce[SIGNED_NONCE_LEN];
    randombytes_buf(nonce, sizeof nonce);
    char sig[SIGNED_HEADER_MAX], hdr[sizeof auth + SIGNED_HEADER_MAX + 32];
    if (!signed_request_sign(sig, sizeof sig, &key, id, wall_clock_ms(), nonce, "POST",
                             PATH_RECOVER, body, bl)) {
        fprintf(stderr, "strata cluster recover: cannot sign the request\n");
        return 1;
    }
    sodium_memzero(&key, sizeof key);
    snprintf(hdr, sizeof hdr, "%sX-Strata-Signature: %s\r\n", auth, sig);
    snprintf(url, sizeof url, "http://%s%s", api, PATH_RECOVER);
    int status;
    char *resp;
    size_t rl;
    if (http_exchange("POST", url, hdr, body, bl, &status, &resp, &rl, err)) {
        fprintf(stderr, "strata cluster recover: %s\n", err);
        return 1;
    }
    printf("%s%s", resp, rl && resp[rl - 1] == '\n' ? "" : "\n");
    if (status != 200)
        fprintf(stderr, "strata cluster recover: node %llu answered HTTP %d\n",
                (unsigned long long)id, status);
    free(resp);
    return status == 200 ? 0 : 1;
}

static int run_cluster(int argc, char **argv)
{
    if (argc < 2) return usage();
    if (!strcmp(argv[1], "recover")) return run_recover(argc - 1, argv + 1);
    fprintf(stderr, "strata cluster: unknown action '%s'\n", argv[1]);
    return usage();
}

const struct command cmd_cluster = {
    "cluster", run_cluster,
    "cluster recover --key-file K --voters 1,2 [--api HOST:PORT]  (a signed request to a cluster)"};
