/* The fabric step: from strata.role/peers/fabric/key to the server's fabric options. */
#include "os/init/init.h"

#include "os/common/errmsg.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define KEY_DIR  "/run/strata"
#define KEY_PATH "/run/strata/cluster.key"
/* A key file on the model partition is found without being named. */
#define PARTITION_KEY INIT_MODEL_MOUNT "/cluster.key"

int init_is_joiner(const struct boot_config *cfg)
{
    return !strcmp(cfg->role, "join");
}

int init_is_member(const struct boot_config *cfg)
{
    return !strcmp(cfg->role, "member");
}

int init_on_fabric(const struct boot_config *cfg)
{
    return cfg->fabric[0] || cfg->peers[0] || cfg->key[0] || cfg->key_file[0] || cfg->cluster[0] ||
           init_is_joiner(cfg) || init_is_member(cfg);
}

/* "ID@A.B.C.D[:PORT],..." with the control port (7100) added where none is given. */
static int cluster_list(const struct boot_config *cfg, char *out, size_t cap, char *err)
{
    size_t o = 0;
    const char *s = cfg->cluster;
    while (*s) {
        size_t n = strcspn(s, ",");
        int has_port = memchr(s, ':', n) != NULL;
        int k = snprintf(out + o, cap - o, "%s%.*s%s", o ? "," : "", (int)n, s,
                         has_port ? "" : ":" INIT_CONTROL_PORT);
        if (k < 0 || (size_t)k >= cap - o) return errmsg_set(err, "strata.cluster: too long");
        o += (size_t)k;
        s += n;
        if (*s == ',') s++;
    }
    out[o] = 0;
    return 0;
}

/* strata.key=HEX goes to a file only the server can read (tmpfs on /run). */
static int write_key(const char *hex, char *err)
{
    if (mkdir(KEY_DIR, 0700) && errno != EEXIST)
        return errmsg_set(err, "strata.key: mkdir %s: %s", KEY_DIR, strerror(errno));
    int fd = open(KEY_PATH, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return errmsg_set(err, "strata.key: %s: %s", KEY_PATH, strerror(errno));
    char line[66];
    size_t n = (size_t)snprintf(line, sizeof line, "%s\n", hex);
    ssize_t w = write(fd, line, n);
    close(fd);
    if (w != (ssize_t)n) return errmsg_set(err, "strata.key: %s: short write", KEY_PATH);
    return 0;
}

/* "A.B.C.D[:PORT],..." with the default port added where none is given. */
static int peer_list(const struct boot_config *cfg, char *out, size_t cap, char *err)
{
    size_t o = 0;
    const char *s = cfg->peers;
    while (*s) {
        size_t n = strcspn(s, ",");
        int has_port = memchr(s, ':', n) != NULL;
        int k = snprintf(out + o, cap - o, "%s%.*s", o ? "," : "", (int)n, s);
        if (k < 0 || (size_t)k >= cap - o) return errmsg_set(err, "strata.peers: too long");
        o += (size_t)k;
        if (!has_port) {
            k = snprintf(out + o, cap - o, ":%d", cfg->fabric_port);
            if (k < 0 || (size_t)k >= cap - o) return errmsg_set(err, "strata.peers: too long");
            o += (size_t)k;
        }
        s += n;
        if (*s == ',') s++;
    }
    out[o] = 0;
    return 0;
}

int init_fabric_args(const struct boot_config *cfg, char **argv, int *n, int max, char *err)
{
    static char listen[32], node[16], peers[sizeof cfg->peers + 128], key_file[256],
        cluster[sizeof cfg->cluster + 128];
    if (!init_on_fabric(cfg)) return 0;
    if (init_is_joiner(cfg) && !cfg->peers[0])
        return errmsg_set(err, "strata.role=join: needs strata.peers (where to pull the model "
                               "from)");
    if (init_is_member(cfg) && !cfg->cluster[0])
        return errmsg_set(err, "strata.role=member: needs strata.cluster (the control plane's "
                               "nodes)");
    if (cfg->cluster[0] && cfg->node < 1)
        return errmsg_set(err, "strata.cluster: needs strata.node (this node's id, 1..65535)");
    if (cfg->key[0]) {
        if (write_key(cfg->key, err)) return -1;
        snprintf(key_file, sizeof key_file, "%s", KEY_PATH);
    } else if (cfg->key_file[0]) {
        if (access(cfg->key_file, R_OK))
            return errmsg_set(err, "strata.key=%s: %s", cfg->key_file, strerror(errno));
        snprintf(key_file, sizeof key_file, "%s", cfg->key_file);
    } else if (access(PARTITION_KEY, R_OK) == 0) {
        snprintf(key_file, sizeof key_file, "%s", PARTITION_KEY);
    } else {
        return errmsg_set(err,
                          "the fabric needs the cluster key: strata.key=HEX64, "
                          "strata.key=/path, or %s on the model partition",
                          PARTITION_KEY);
    }
    char ip[16];
    snprintf(listen, sizeof listen, "%s:%d",
             cfg->has_fabric_ip ? boot_ip_str(cfg->fabric_ip, ip)
             : cfg->has_ip      ? boot_ip_str(cfg->ip, ip)
                                : "0.0.0.0",
             cfg->fabric_port);
    if (*n + 16 > max) return errmsg_set(err, "too many server arguments");
    argv[(*n)++] = "--fabric";
    argv[(*n)++] = (char *)(cfg->fabric[0] ? cfg->fabric : "tcp");
    argv[(*n)++] = "--listen";
    argv[(*n)++] = listen;
    argv[(*n)++] = "--key-file";
    argv[(*n)++] = key_file;
    if (cfg->node >= 0) {
        snprintf(node, sizeof node, "%d", cfg->node);
        argv[(*n)++] = "--node-id";
        argv[(*n)++] = node;
    }
    if (cfg->peers[0]) {
        if (peer_list(cfg, peers, sizeof peers, err)) return -1;
        argv[(*n)++] = "--peers";
        argv[(*n)++] = peers;
    }
    if (cfg->cluster[0]) {
        if (cluster_list(cfg, cluster, sizeof cluster, err)) return -1;
        argv[(*n)++] = "--cluster";
        argv[(*n)++] = cluster;
        if (cfg->rack[0]) {
            argv[(*n)++] = "--rack";
            argv[(*n)++] = (char *)cfg->rack;
        }
        init_say("cluster", "node %d of %s%s%s%s", cfg->node, cluster,
                 cfg->rack[0] ? ", rack " : "", cfg->rack,
                 init_is_member(cfg) ? "; no model until the planner picks this node" : "");
    }
    init_say("fabric", "%s on %s, key %s%s%s", cfg->fabric[0] ? cfg->fabric : "tcp", listen,
             cfg->key[0] ? "from strata.key" : key_file,
             init_is_joiner(cfg) ? "; joining: the model comes from " : "",
             init_is_joiner(cfg) ? peers : "");
    return 0;
}

void init_mask_secrets(const char *line, char *out, size_t cap)
{
    static const char *const secret[] = {"strata.key=", "strata.api_key="};
    size_t o = 0;
    const char *s = line;
    while (*s && o + 1 < cap) {
        int masked = 0;
        for (size_t i = 0; i < sizeof secret / sizeof secret[0] && !masked; i++) {
            size_t k = strlen(secret[i]);
            if ((s == line || s[-1] == ' ' || s[-1] == '"') && !strncmp(s, secret[i], k)) {
                int n = snprintf(out + o, cap - o, "%s***", secret[i]);
                if (n < 0 || (size_t)n >= cap - o) {
                    out[o] = 0;
                    return;
                }
                o += (size_t)n;
                s += k;
                while (*s && *s != ' ' && *s != '\n') s++;
                masked = 1;
            }
        }
        if (!masked) out[o++] = *s++;
    }
    out[o] = 0;
}
