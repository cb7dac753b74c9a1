/* dhcp_lease: see dhcp_lease.h. */
#include "os/common/dhcp_lease.h"

#include "os/common/boot_cmdline.h"
#include "os/common/errmsg.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

double dhcp_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_BOOTTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static const char *mac_str(const uint8_t *m, char *buf)
{
    snprintf(buf, 18, "%02x:%02x:%02x:%02x:%02x:%02x", m[0], m[1], m[2], m[3], m[4], m[5]);
    return buf;
}

int dhcp_lease_save(const char *path, const struct dhcp_lease *l, char *err)
{
    char tmp[256], a[16], r[16], s[16], m1[18], m2[18], dns[64] = "";
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    /* The directory (/run/strata) may not exist yet. */
    char dir[256];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) {
        *slash = 0;
        if (mkdir(dir, 0755) && errno != EEXIST)
            return errmsg_set(err, "%s: %s", dir, strerror(errno));
    }
    for (int i = 0; i < l->n_dns; i++) {
        size_t n = strlen(dns);
        snprintf(dns + n, sizeof dns - n, "%s%s", i ? "," : "", boot_ip_str(l->dns[i], a));
    }
    FILE *f = fopen(tmp, "we");
    if (!f) return errmsg_set(err, "%s: %s", tmp, strerror(errno));
    fprintf(f,
            "iface=%s\nip=%s/%d\nrouter=%s\ndns=%s\nserver=%s\nserver_mac=%s\nmac=%s\n"
            "lease=%u\nt1=%u\nt2=%u\nstart=%.3f\n",
            l->iface, boot_ip_str(l->ip, a), l->prefix, boot_ip_str(l->router, r), dns,
            boot_ip_str(l->server_id, s), mac_str(l->server_mac, m1), mac_str(l->mac, m2),
            l->lease_s, l->t1_s, l->t2_s, l->start);
    if (fclose(f)) return errmsg_set(err, "%s: %s", tmp, strerror(errno));
    if (rename(tmp, path)) return errmsg_set(err, "%s: %s", path, strerror(errno));
    return 0;
}

/* Dotted quad, nothing else. */
static int parse_ip(const char *s, uint32_t *out, const char **end)
{
    uint32_t ip = 0;
    for (int part = 0; part < 4; part++) {
        if (part && *s++ != '.') return -1;
        if (*s < '0' || *s > '9') return -1;
        unsigned v = 0;
        for (int d = 0; *s >= '0' && *s <= '9'; d++) {
            if (d == 3) return -1;
            v = v * 10 + (unsigned)(*s++ - '0');
        }
        if (v > 255) return -1;
        ip = ip << 8 | v;
    }
    *out = ip;
    *end = s;
    return 0;
}

static int parse_mac(const char *s, uint8_t *m)
{
    unsigned v[6];
    int n = 0;
    if (sscanf(s, "%2x:%2x:%2x:%2x:%2x:%2x%n", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &n) != 6 ||
        s[n])
        return -1;
    for (int i = 0; i < 6; i++) m[i] = (uint8_t)v[i];
    return 0;
}

static int parse_u32(const char *s, uint32_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (!*s || *end || errno || v > 0xffffffffull || *s == '-') return -1;
    *out = (uint32_t)v;
    return 0;
}

static int apply(struct dhcp_lease *l, const char *k, const char *v)
{
    const char *end;
    if (!strcmp(k, "iface")) {
        if (!*v || strlen(v) >= sizeof l->iface) return -1;
        memcpy(l->iface, v, strlen(v) + 1);
    } else if (!strcmp(k, "ip")) {
        uint32_t p;
        if (parse_ip(v, &l->ip, &end) || *end != '/' || parse_u32(end + 1, &p) || p > 32) return -1;
        l->prefix = (int)p;
    } else if (!strcmp(k, "router")) {
        if (parse_ip(v, &l->router, &end) || *end) return -1;
    } else if (!strcmp(k, "dns")) {
        l->n_dns = 0;
        while (*v) {
            if (l->n_dns == DHCP_DNS_MAX || parse_ip(v, &l->dns[l->n_dns++], &end)) return -1;
            v = end;
            if (*v && *v++ != ',') return -1;
        }
    } else if (!strcmp(k, "server")) {
        if (parse_ip(v, &l->server_id, &end) || *end) return -1;
    } else if (!strcmp(k, "server_mac")) {
        return parse_mac(v, l->server_mac);
    } else if (!strcmp(k, "mac")) {
        return parse_mac(v, l->mac);
    } else if (!strcmp(k, "lease")) {
        return parse_u32(v, &l->lease_s);
    } else if (!strcmp(k, "t1")) {
        return parse_u32(v, &l->t1_s);
    } else if (!strcmp(k, "t2")) {
        return parse_u32(v, &l->t2_s);
    } else if (!strcmp(k, "start")) {
        char *e;
        l->start = strtod(v, &e);
        if (!*v || *e || l->start < 0) return -1;
    } else {
        return -2;
    }
    return 0;
}

int dhcp_lease_load(const char *path, struct dhcp_lease *l, char *err)
{
    static const char *keys[] = {"iface", "ip",    "router", "dns", "server", "server_mac",
                                 "mac",   "lease", "t1",     "t2",  "start"};
    memset(l, 0, sizeof *l);
    FILE *f = fopen(path, "re");
    if (!f) return errmsg_set(err, "%s: %s", path, strerror(errno));
    char line[256];
    unsigned seen = 0;
    int lineno = 0, rc = 0;
    while (!rc && fgets(line, sizeof line, f)) {
        lineno++;
        line[strcspn(line, "\n")] = 0;
        char *eq = strchr(line, '=');
        if (!eq) {
            rc = errmsg_set(err, "%s:%d: want KEY=VALUE", path, lineno);
            break;
        }
        *eq = 0;
        int k = apply(l, line, eq + 1);
        if (k == -2)
            rc = errmsg_set(err, "%s:%d: unknown key %s", path, lineno, line);
        else if (k)
            rc = errmsg_set(err, "%s:%d: %s=%s: malformed", path, lineno, line, eq + 1);
        for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
            if (!strcmp(keys[i], line)) seen |= 1u << i;
    }
    fclose(f);
    if (rc) return -1;
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (!(seen & (1u << i))) return errmsg_set(err, "%s: no %s= line", path, keys[i]);
    return 0;
}

const char *dhcp_lease_describe(const struct dhcp_lease *l, char *buf, size_t cap)
{
    char a[16], r[16], s[16], d[16];
    size_t n = (size_t)snprintf(buf, cap, "%s %s/%d", l->iface, boot_ip_str(l->ip, a), l->prefix);
    if (l->router && n < cap)
        n += (size_t)snprintf(buf + n, cap - n, " via %s", boot_ip_str(l->router, r));
    for (int i = 0; i < l->n_dns && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%s", i ? "," : ", DNS ",
                              boot_ip_str(l->dns[i], d));
    if (n < cap) {
        if (l->lease_s == DHCP_LEASE_INFINITE)
            snprintf(buf + n, cap - n, ", infinite lease from %s", boot_ip_str(l->server_id, s));
        else
            snprintf(buf + n, cap - n, ", lease %u s from %s", l->lease_s,
                     boot_ip_str(l->server_id, s));
    }
    return buf;
}
