/* dhcp_renew: see dhcp_renew.h. Times follow RFC 2131 4.4.5: between attempts wait half the time
 * left to the next boundary (T2, then the lease's end), at least one second. */
#include "os/runtime/dhcp_renew.h"

#include "os/common/boot_cmdline.h"
#include "os/common/console.h"
#include "os/common/dhcp_client.h"
#include "os/common/errmsg.h"
#include "os/common/net_config.h"

#include <errno.h>
#include <stdarg.h>
#include <net/if.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define ACQUIRE_TIMEOUT 60

/* One console line, "strata: " + the message (which starts with "dhcp: ", as errors from
 * os/common/dhcp_client.c and os/common/net_config.c are prefixed by the callers here). */
#define say(...) console_say("strata: ", __VA_ARGS__)

static void sleep_until(double t)
{
    struct timespec ts = {(time_t)t, (long)((t - (double)(time_t)t) * 1e9)};
    while (clock_nanosleep(CLOCK_BOOTTIME, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

/* Make the interface match the new lease where it differs from the old. */
static void apply(const struct dhcp_lease *old, const struct dhcp_lease *n)
{
    char err[ERRMSG_LEN];
    int index = (int)if_nametoindex(n->iface);
    int moved = old->ip != n->ip || old->prefix != n->prefix;
    if (moved) {
        if (netcfg_addr(index, n->iface, n->ip, n->prefix, 1, err)) say("dhcp: warning: %s", err);
        if (old->ip && netcfg_addr(index, n->iface, old->ip, old->prefix, 0, err))
            say("dhcp: warning: %s", err);
    }
    if (n->router && (moved || n->router != old->router) &&
        netcfg_default_route(index, n->router, err))
        say("dhcp: warning: %s", err);
    if ((n->n_dns != old->n_dns || memcmp(n->dns, old->dns, sizeof n->dns)) &&
        netcfg_resolv_conf(n->dns, n->n_dns, err))
        say("dhcp: warning: %s", err);
}

/* The lease is gone (expired or refused): drop the address, then ask until a server answers. */
static void start_over(struct dhcp_lease *l, const char *why)
{
    char err[ERRMSG_LEN], a[16];
    say("dhcp: %s: %s; removing %s and asking for a new lease", l->iface, why,
        boot_ip_str(l->ip, a));
    int index = (int)if_nametoindex(l->iface);
    if (netcfg_addr(index, l->iface, l->ip, l->prefix, 0, err)) say("dhcp: warning: %s", err);
    struct dhcp_lease old = *l, n;
    old.ip = 0; /* already removed */
    old.router = 0;
    while (dhcp_acquire(l->iface, ACQUIRE_TIMEOUT, &n, err)) say("%s; still asking", err);
    apply(&old, &n);
    *l = n;
}

int dhcp_renew_once(struct dhcp_lease *l, const char *path)
{
    char err[ERRMSG_LEN], d[200];
    const char *what = "renewed";
    if (l->lease_s == DHCP_LEASE_INFINITE) return 1;
    for (;;) {
        double now = dhcp_now(), t1 = l->start + l->t1_s, t2 = l->start + l->t2_s,
               end = l->start + l->lease_s;
        if (now < t1) {
            sleep_until(t1);
            continue;
        }
        if (now >= end) {
            start_over(l, "the lease expired");
            what = "new lease";
            break;
        }
        struct dhcp_lease n = *l;
        int rebinding = now >= t2;
        double limit = (rebinding ? end : t2) - now;
        int rc = dhcp_renew(&n, rebinding, limit < 8 ? limit : 8, err);
        if (rc == 0) {
            apply(l, &n);
            *l = n;
            what = rebinding ? "rebound" : "renewed";
            break;
        }
        if (rc == 1) {
            start_over(l, "the server refused the renewal (NAK)");
            what = "new lease";
            break;
        }
        double left = (rebinding ? end : t2) - dhcp_now(), wait = left / 2 > 1 ? left / 2 : 1;
        if (wait > left) wait = left;
        if (wait > 0.5)
            say("%s; %s again in %.0f s", err, rebinding ? "rebinding" : "renewing", wait);
        else
            say("%s; %s", err, rebinding ? "the lease runs out now" : "rebinding (broadcast) now");
        if (wait > 0) sleep_until(dhcp_now() + wait);
    }
    if (path && dhcp_lease_save(path, l, err)) say("dhcp: warning: %s", err);
    say("dhcp: %s; %s, next renewal in %u s", dhcp_lease_describe(l, d, sizeof d), what, l->t1_s);
    return 0;
}

static struct {
    struct dhcp_lease l;
    char path[256];
} R;

static void *renew_main(void *arg)
{
    (void)arg;
    while (dhcp_renew_once(&R.l, R.path) == 0) {
    }
    return NULL;
}

int dhcp_renew_start(const char *path, char *err)
{
    struct dhcp_lease l;
    if (access(path, F_OK)) return 0;
    if (dhcp_lease_load(path, &l, err)) return -1;
    char a[16], s[16];
    if (l.lease_s == DHCP_LEASE_INFINITE) {
        say("dhcp: %s: %s has an infinite lease: nothing to renew", l.iface, boot_ip_str(l.ip, a));
        return 0;
    }
    double t1 = l.start + l.t1_s - dhcp_now();
    say("dhcp: %s: keeping %s/%d from %s; first renewal in %.0f s", l.iface, boot_ip_str(l.ip, a),
        l.prefix, boot_ip_str(l.server_id, s), t1 > 0 ? t1 : 0);
    R.l = l;
    snprintf(R.path, sizeof R.path, "%s", path);
    pthread_t t;
    int rc = pthread_create(&t, NULL, renew_main, NULL);
    if (rc) return errmsg_set(err, "dhcp renewal thread: %s", strerror(rc));
    pthread_detach(t);
    return 0;
}
