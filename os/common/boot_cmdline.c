#include "os/common/boot_cmdline.h"

#include "os/common/errmsg.h"

#include <stdio.h>
#include <string.h>

#define PREFIX "strata."

/* ---- value parsers: each takes the whole value and fails on anything left over ------------- */

static int parse_long(const char *s, long lo, long hi, long *out)
{
    long v = 0;
    if (!*s) return -1;
    for (; *s; s++) {
        if (*s < '0' || *s > '9') return -1;
        v = v * 10 + (*s - '0');
        if (v > hi) return -1;
    }
    if (v < lo) return -1;
    *out = v;
    return 0;
}

/* Dotted quad, exactly four decimal parts 0..255, no leading '+'/'-' or spaces. Parses up to the
 * end of s or to stop (a delimiter), and sets *end past the address. */
static int parse_ipv4(const char *s, uint32_t *out, const char **end)
{
    uint32_t ip = 0;
    for (int part = 0; part < 4; part++) {
        if (part && *s++ != '.') return -1;
        if (*s < '0' || *s > '9') return -1;
        unsigned v = 0;
        int digits = 0;
        while (*s >= '0' && *s <= '9') {
            v = v * 10 + (unsigned)(*s++ - '0');
            if (++digits > 3 || v > 255) return -1;
        }
        ip = ip << 8 | v;
    }
    *out = ip;
    *end = s;
    return 0;
}

static int parse_ip_only(const char *s, uint32_t *out)
{
    const char *end;
    return parse_ipv4(s, out, &end) || *end ? -1 : 0;
}

/* ADDR/PREFIX where PREFIX is 0..32 or a contiguous dotted netmask (iPXE hands out netmasks). */
static int parse_cidr(const char *s, uint32_t *ip, int *prefix)
{
    const char *end;
    if (parse_ipv4(s, ip, &end) || *end != '/') return -1;
    s = end + 1;
    long p;
    if (!parse_long(s, 0, 32, &p)) {
        *prefix = (int)p;
        return 0;
    }
    uint32_t mask;
    if (parse_ip_only(s, &mask)) return -1;
    /* contiguous: the inverted mask plus one is a power of two */
    uint32_t inv = ~mask;
    if (inv & (inv + 1)) return -1;
    int n = 0;
    while (n < 32 && (mask & (0x80000000u >> n))) n++;
    *prefix = n;
    return 0;
}

/* ADDR[:PORT][,ADDR[:PORT]...] */
static int check_peers(const char *s)
{
    if (!*s) return -1;
    for (;;) {
        uint32_t ip;
        const char *end;
        if (parse_ipv4(s, &ip, &end)) return -1;
        s = end;
        if (*s == ':') {
            char num[8];
            size_t n = strcspn(s + 1, ",");
            if (n == 0 || n >= sizeof num) return -1;
            memcpy(num, s + 1, n);
            num[n] = 0;
            long port;
            if (parse_long(num, 1, 65535, &port)) return -1;
            s += 1 + n;
        }
        if (!*s) return 0;
        if (*s++ != ',') return -1;
    }
}

/* ID@A.B.C.D[:PORT],... with ids 1..65535 */
static int check_cluster(const char *s)
{
    if (!*s) return -1;
    for (;;) {
        char num[8];
        size_t n = strcspn(s, "@,");
        if (s[n] != '@' || n == 0 || n >= sizeof num) return -1;
        memcpy(num, s, n);
        num[n] = 0;
        long id;
        if (parse_long(num, 1, 65535, &id)) return -1;
        s += n + 1;
        size_t m = strcspn(s, ",");
        char one[64];
        if (m == 0 || m >= sizeof one) return -1;
        memcpy(one, s, m);
        one[m] = 0;
        if (check_peers(one) || strchr(one, ',')) return -1;
        s += m;
        if (!*s) return 0;
        if (*s++ != ',') return -1;
    }
}

static int is_word(const char *s, size_t max)
{
    size_t n = strlen(s);
    if (!n || n >= max) return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || *s == '-' || *s == '_'))
            return 0;
    return 1;
}

/* A rack name as the cluster's state takes it (cluster/cluster_cmd.h cluster_cmd_rack_ok; this file
 * depends on libc only): 1..max-1 letters, digits, '.', '-', '_'. */
static int is_rack(const char *s, size_t max)
{
    size_t n = strlen(s);
    if (!n || n >= max) return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '.' || *s == '-' || *s == '_'))
            return 0;
    return 1;
}

static int is_printable(const char *s, int spaces_ok)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || (unsigned char)*s > 0x7e || (!spaces_ok && *s == ' '))
            return 0;
    return 1;
}

static int copy_str(char *dst, size_t cap, const char *s)
{
    size_t n = strlen(s);
    if (n >= cap) return -1;
    memcpy(dst, s, n + 1);
    return 0;
}

/* ---- keys ----------------------------------------------------------------------------------- */

/* Apply one strata.KEY=VALUE (key without the prefix). */
static int apply_key(struct boot_config *c, const char *key, const char *val, char *err)
{
#define BAD(why) return errmsg_set(err, PREFIX "%s=%s: %s", key, val, why)
    long v;
    if (!strcmp(key, "model")) {
        if (!*val) BAD("empty (want /path/in/initrd or part:LABEL[/path])");
        if (val[0] != '/' && strncmp(val, "part:", 5))
            BAD("want /path/in/initrd or part:LABEL[/path]");
        if (!strncmp(val, "part:", 5) && (!val[5] || val[5] == '/'))
            BAD("part: needs a partition label");
        if (!is_printable(val, 0) || copy_str(c->model, sizeof c->model, val))
            BAD("unprintable or too long");
    } else if (!strcmp(key, "node")) {
        if (parse_long(val, 0, 65535, &v)) BAD("want a node number 0..65535");
        c->node = (int)v;
    } else if (!strcmp(key, "role")) {
        if (!is_word(val, sizeof c->role)) BAD("want a lower-case word (serve, cache, ...)");
        copy_str(c->role, sizeof c->role, val);
    } else if (!strcmp(key, "peers")) {
        if (check_peers(val) || copy_str(c->peers, sizeof c->peers, val))
            BAD("want A.B.C.D[:PORT][,A.B.C.D[:PORT]...]");
    } else if (!strcmp(key, "cluster")) {
        if (check_cluster(val) || copy_str(c->cluster, sizeof c->cluster, val))
            BAD("want ID@A.B.C.D[:PORT][,ID@A.B.C.D[:PORT]...] (ids 1..65535)");
    } else if (!strcmp(key, "rack")) {
        if (!is_rack(val, sizeof c->rack)) BAD("want 1..63 letters, digits, '.', '-' or '_'");
        copy_str(c->rack, sizeof c->rack, val);
    } else if (!strcmp(key, "api_key")) {
        if (!*val || !is_printable(val, 0) || copy_str(c->api_key, sizeof c->api_key, val))
            BAD("want 1..127 printable characters without spaces");
    } else if (!strcmp(key, "port")) {
        if (parse_long(val, 1, 65535, &v)) BAD("want a TCP port 1..65535");
        c->port = (int)v;
    } else if (!strcmp(key, "hugepages")) {
        if (parse_long(val, 0, 1L << 30, &v)) BAD("want a count of 2 MiB pages");
        c->hugepages = v;
    } else if (!strcmp(key, "ip")) {
        c->ip_given = 1;
        c->has_ip = c->ip_off = 0;
        if (!strcmp(val, "dhcp")) return 0;
        if (!strcmp(val, "off")) {
            c->ip_off = 1;
            return 0;
        }
        if (parse_cidr(val, &c->ip, &c->prefix))
            BAD("malformed address (want A.B.C.D/PREFIX, dhcp or off)");
        c->has_ip = 1;
    } else if (!strcmp(key, "gw")) {
        if (parse_ip_only(val, &c->gw)) BAD("malformed address (want A.B.C.D)");
        c->has_gw = 1;
    } else if (!strcmp(key, "dns")) {
        uint32_t d[BOOT_DNS_MAX];
        int n = 0;
        const char *s = val, *end;
        for (;;) {
            if (n == BOOT_DNS_MAX || parse_ipv4(s, &d[n], &end))
                BAD("want A.B.C.D[,A.B.C.D] (at most 3)");
            n++;
            s = end;
            if (!*s) break;
            if (*s++ != ',') BAD("want A.B.C.D[,A.B.C.D] (at most 3)");
        }
        memcpy(c->dns, d, sizeof d);
        c->n_dns = n;
    } else if (!strcmp(key, "iface")) {
        if (!*val || strlen(val) >= sizeof c->iface || !is_printable(val, 0) || strchr(val, '/'))
            BAD("want an interface name (eth0, enp1s0)");
        copy_str(c->iface, sizeof c->iface, val);
    } else if (!strcmp(key, "on_error")) {
        if (!strcmp(val, "halt"))
            c->on_error = BOOT_ON_ERROR_HALT;
        else if (!strcmp(val, "reboot"))
            c->on_error = BOOT_ON_ERROR_REBOOT;
        else if (!strcmp(val, "poweroff"))
            c->on_error = BOOT_ON_ERROR_POWEROFF;
        else
            BAD("want halt, reboot or poweroff");
    } else if (!strcmp(key, "console")) {
        if (strncmp(val, "/dev/", 5) || !val[5] || !is_printable(val, 0) ||
            copy_str(c->console, sizeof c->console, val))
            BAD("want a device path such as /dev/ttyS0");
    } else if (!strcmp(key, "fabric")) {
        if (strcmp(val, "tcp") && strcmp(val, "dpdk") && strcmp(val, "rdma"))
            BAD("want tcp, dpdk or rdma");
        copy_str(c->fabric, sizeof c->fabric, val);
    } else if (!strcmp(key, "fabric_port")) {
        if (parse_long(val, 1, 65535, &v)) BAD("want a port 1..65535");
        c->fabric_port = (int)v;
    } else if (!strcmp(key, "fabric_ip")) {
        if (parse_cidr(val, &c->fabric_ip, &c->fabric_prefix))
            BAD("malformed address (want A.B.C.D/PREFIX)");
        c->has_fabric_ip = 1;
    } else if (!strcmp(key, "fabric_iface")) {
        if (!*val || strlen(val) >= sizeof c->fabric_iface || !is_printable(val, 0) ||
            strchr(val, '/'))
            BAD("want an interface name (eth1, enp2s0)");
        copy_str(c->fabric_iface, sizeof c->fabric_iface, val);
    } else if (!strcmp(key, "key")) {
        /* The value is a secret: messages never repeat it. */
        if (val[0] == '/') {
            if (!is_printable(val, 0) || copy_str(c->key_file, sizeof c->key_file, val))
                return errmsg_set(err, PREFIX "key=/...: unprintable or too long a path");
            c->key[0] = 0;
        } else {
            size_t n = strlen(val);
            int hex = n == 64;
            for (size_t i = 0; hex && i < n; i++)
                hex = (val[i] >= '0' && val[i] <= '9') || (val[i] >= 'a' && val[i] <= 'f') ||
                      (val[i] >= 'A' && val[i] <= 'F');
            if (!hex)
                return errmsg_set(err, PREFIX "key=***: want 64 hex digits or /path/to/keyfile");
            copy_str(c->key, sizeof c->key, val);
            c->key_file[0] = 0;
        }
    } else if (!strcmp(key, "watchdog")) {
        if (!strcmp(val, "off")) {
            c->watchdog = 0;
        } else {
            if (parse_long(val, 0, 3600, &v)) BAD("want a timeout in seconds 1..3600, 0 or off");
            c->watchdog = (int)v;
        }
    } else if (!strcmp(key, "args")) {
        if (!is_printable(val, 1) || copy_str(c->args, sizeof c->args, val))
            BAD("want printable server arguments, at most 511 characters");
    } else {
        return errmsg_set(err, PREFIX "%s: unknown key (see boot/cmdline.md)", key);
    }
    return 0;
#undef BAD
}

/* Next whitespace-separated parameter into buf, with double quotes removed (the kernel lets a
 * quote enclose the value or the whole parameter). Returns 0 at the end of the line, -1 when the
 * parameter does not fit buf. */
static int next_param(const char **line, char *buf, size_t cap, int *ok)
{
    const char *s = *line;
    while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r') s++;
    if (!*s) return 0;
    size_t n = 0;
    int quoted = 0;
    *ok = 1;
    for (; *s && (quoted || !(*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r')); s++) {
        if (*s == '"') {
            quoted = !quoted;
            continue;
        }
        if (n + 1 < cap)
            buf[n++] = *s;
        else
            *ok = 0;
    }
    buf[n] = 0;
    *line = s;
    return 1;
}

/* The kernel's own ip=CLIENT:SERVER:GW:NETMASK[:...] (what PXELINUX's IPAPPEND 1 appends). Only
 * that static form is understood; anything else (ip=dhcp, ...) is the kernel's business. */
static int parse_kernel_ip(const char *v, uint32_t *ip, int *prefix, uint32_t *gw)
{
    uint32_t f[4];
    const char *end;
    for (int i = 0; i < 4; i++) {
        if (i == 2 && *v == ':') { /* an empty gateway field */
            f[2] = 0;
            v++;
            continue;
        }
        if (parse_ipv4(v, &f[i], &end)) return -1;
        v = end;
        if (i < 3 && *v++ != ':') return -1;
    }
    if (*v && *v != ':') return -1;
    uint32_t inv = ~f[3];
    if (inv & (inv + 1)) return -1;
    int n = 0;
    while (n < 32 && (f[3] & (0x80000000u >> n))) n++;
    *ip = f[0], *prefix = n, *gw = f[2];
    return 0;
}

int boot_cmdline_parse(const char *line, struct boot_config *cfg, char *err)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->node = -1;
    cfg->port = 8080;
    cfg->hugepages = -1;
    cfg->on_error = BOOT_ON_ERROR_HALT;
    cfg->fabric_port = 7000;
    if (!line) return 0;

    char param[1024], first[ERRMSG_LEN], one[ERRMSG_LEN];
    int failed = 0, ok, kernel_ip = 0, kernel_prefix = 0;
    uint32_t kip = 0, kgw = 0;
    first[0] = 0;
    while (next_param(&line, param, sizeof param, &ok)) {
        if (!strcmp(param, "--")) break;
        if (ok && !strncmp(param, "ip=", 3) &&
            !parse_kernel_ip(param + 3, &kip, &kernel_prefix, &kgw))
            kernel_ip = 1;
        if (strncmp(param, PREFIX, sizeof PREFIX - 1)) continue;
        char *key = param + sizeof PREFIX - 1, *eq = strchr(key, '=');
        const char *val = "";
        if (eq) *eq = 0, val = eq + 1;
        int rc;
        if (!ok)
            rc = errmsg_set(one, PREFIX "%s: value longer than %zu characters", key,
                            sizeof param - 1);
        else if (!eq)
            rc = errmsg_set(one, PREFIX "%s: needs a value (" PREFIX "%s=...)", key, key);
        else
            rc = apply_key(cfg, key, val, one);
        if (rc && !failed) {
            failed = 1;
            memcpy(first, one, sizeof first);
        }
    }
    if (!failed && cfg->has_fabric_ip && !cfg->fabric_iface[0]) {
        failed = 1;
        errmsg_set(first, PREFIX "fabric_ip: needs strata.fabric_iface (the fabric's NIC)");
    }
    if (failed) {
        if (err) memcpy(err, first, ERRMSG_LEN);
        return -1;
    }
    /* strata.ip/gw win over the kernel's ip= wherever they stand on the line. */
    if (kernel_ip && !cfg->ip_given) {
        cfg->has_ip = 1, cfg->ip = kip, cfg->prefix = kernel_prefix;
        if (kgw && !cfg->has_gw) cfg->has_gw = 1, cfg->gw = kgw;
    }
    return 0;
}

const char *boot_ip_str(uint32_t ip, char *buf)
{
    snprintf(buf, 16, "%u.%u.%u.%u", ip >> 24, (ip >> 16) & 255, (ip >> 8) & 255, ip & 255);
    return buf;
}

const char *boot_on_error_name(enum boot_on_error e)
{
    return e == BOOT_ON_ERROR_REBOOT ? "reboot" : e == BOOT_ON_ERROR_POWEROFF ? "poweroff" : "halt";
}
