#include "cluster/sim/sim_net.h"

#include "os/common/errmsg.h"

#include <simgrid/actor.h>
#include <simgrid/engine.h>
#include <simgrid/host.h>
#include <simgrid/semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* Per process: SimGrid's engine is a process-wide singleton (see the header). */
static struct {
    int n_inst, n_servers;
    sg_host_t *hosts; /* inst..., mem..., ssd..., remote */
    sg_sem_t sem;
    double now; /* the driver's clock; SimGrid's lags it while nothing is in flight */
    int in_flight;
    struct xfer *done_head, *done_tail; /* completed, callbacks not yet run */
    void (*main)(void *);
    void *arg;
} net;

struct xfer {
    sg_host_t from, to;
    double bytes;
    void (*done)(void *);
    void *ctx;
    struct xfer *next;
};

int sim_net_host_inst(int i)
{
    return i;
}
int sim_net_host_mem(int s)
{
    return net.n_inst + s;
}
int sim_net_host_ssd(int s)
{
    return net.n_inst + net.n_servers + s;
}
int sim_net_host_remote(void)
{
    return net.n_inst + 2 * net.n_servers;
}
double sim_net_now(void)
{
    return net.now;
}
int sim_net_in_flight(void)
{
    return net.in_flight;
}

static void write_platform(FILE *f, const struct sim_topology *t)
{
    double lat = t->latency_s;
    fprintf(f, "<?xml version='1.0'?>\n<!DOCTYPE platform SYSTEM "
               "\"https://simgrid.org/simgrid.dtd\">\n<platform version=\"4.1\">\n"
               "<zone id=\"fabric\" routing=\"Floyd\">\n<router id=\"sw\"/>\n");
    for (int i = 0; i < t->n_inst; i++) {
        fprintf(f, "<host id=\"g%d\" speed=\"1Gf\"/>\n", i);
        fprintf(f,
                "<link id=\"nic%d\" bandwidth=\"%.17gBps\" latency=\"%.17gs\" "
                "sharing_policy=\"SPLITDUPLEX\"/>\n",
                i, t->nic_Bps[i], lat);
        fprintf(f, "<link id=\"pcie%d\" bandwidth=\"%.17gBps\" latency=\"%.17gs\"/>\n", i,
                t->pcie_Bps[i], lat);
        if (t->nvlink_Bps[i] > 0)
            fprintf(f, "<link id=\"nv%d\" bandwidth=\"%.17gBps\" latency=\"%.17gs\"/>\n", i,
                    t->nvlink_Bps[i], lat);
    }
    for (int s = 0; s < t->n_servers; s++) {
        fprintf(f, "<host id=\"mem%d\" speed=\"1Gf\"/>\n<host id=\"ssd%d\" speed=\"1Gf\"/>\n", s,
                s);
        fprintf(f, "<link id=\"ssdl%d\" bandwidth=\"%.17gBps\" latency=\"%.17gs\"/>\n", s,
                t->ssd_Bps, lat);
    }
    fprintf(f, "<host id=\"remote\" speed=\"1Gf\"/>\n");
    fprintf(f, "<link id=\"remotel\" bandwidth=\"%.17gBps\" latency=\"%.17gs\"/>\n", t->remote_Bps,
            lat);
    for (int i = 0; i < t->n_inst; i++) {
        fprintf(f,
                "<route src=\"g%d\" dst=\"sw\" symmetrical=\"NO\"><link_ctn id=\"nic%d\" "
                "direction=\"UP\"/></route>\n",
                i, i);
        fprintf(f,
                "<route src=\"sw\" dst=\"g%d\" symmetrical=\"NO\"><link_ctn id=\"nic%d\" "
                "direction=\"DOWN\"/></route>\n",
                i, i);
        fprintf(f,
                "<route src=\"mem%d\" dst=\"g%d\" symmetrical=\"NO\"><link_ctn "
                "id=\"pcie%d\"/></route>\n",
                t->server[i], i, i);
        fprintf(f,
                "<route src=\"ssd%d\" dst=\"g%d\" symmetrical=\"NO\"><link_ctn id=\"ssdl%d\"/>"
                "<link_ctn id=\"pcie%d\"/></route>\n",
                t->server[i], i, t->server[i], i);
        for (int j = i + 1; j < t->n_inst; j++)
            if (t->server[j] == t->server[i] && t->nvlink_Bps[i] > 0 && t->nvlink_Bps[j] > 0)
                fprintf(f,
                        "<route src=\"g%d\" dst=\"g%d\"><link_ctn id=\"nv%d\"/><link_ctn "
                        "id=\"nv%d\"/></route>\n",
                        i, j, i, j);
    }
    fprintf(f, "<route src=\"remote\" dst=\"sw\" symmetrical=\"NO\"><link_ctn "
               "id=\"remotel\"/></route>\n</zone>\n</platform>\n");
}

int sim_net_boot(const struct sim_topology *t, char *err)
{
    char path[] = "/tmp/strata-sim-XXXXXX.xml";
    int fd = mkstemps(path, 4);
    if (fd < 0) return errmsg_set(err, "sim: platform file: cannot create in /tmp");
    FILE *f = fdopen(fd, "w");
    if (!f) {
        close(fd);
        unlink(path);
        return errmsg_set(err, "sim: platform file %s: cannot open", path);
    }
    write_platform(f, t);
    if (fclose(f)) {
        unlink(path);
        return errmsg_set(err, "sim: platform file %s: write failed", path);
    }
    /* Flow-level max-min sharing without TCP corrections: closed forms hold exactly. */
    char a0[] = "strata-sim", a1[] = "--cfg=network/model:CM02",
         a2[] = "--cfg=network/crosstraffic:0", a3[] = "--log=root.thres:critical",
         a4[] = "--cfg=contexts/stack-size:256";
    char *argv[] = {a0, a1, a2, a3, a4, NULL};
    int argc = 5;
    simgrid_init(&argc, argv);
    simgrid_load_platform(path);
    if (!getenv("STRATA_SIM_KEEP_PLATFORM")) /* debugging: keep it */
        unlink(path);
    else
        fprintf(stderr, "sim: platform in %s\n", path);
    net.n_inst = t->n_inst;
    net.n_servers = t->n_servers;
    int n = t->n_inst + 2 * t->n_servers + 1;
    net.hosts = calloc(n, sizeof *net.hosts);
    if (!net.hosts) return errmsg_set(err, "sim: out of memory for %d hosts", n);
    char name[32];
    for (int i = 0; i < n; i++) {
        if (i < t->n_inst)
            snprintf(name, sizeof name, "g%d", i);
        else if (i < t->n_inst + t->n_servers)
            snprintf(name, sizeof name, "mem%d", i - t->n_inst);
        else if (i < t->n_inst + 2 * t->n_servers)
            snprintf(name, sizeof name, "ssd%d", i - t->n_inst - t->n_servers);
        else
            snprintf(name, sizeof name, "remote");
        net.hosts[i] = sg_host_by_name(name);
        if (!net.hosts[i]) return errmsg_set(err, "sim: platform lacks host %s", name);
    }
    net.sem = sg_sem_init(0);
    return 0;
}

static void xfer_main(int argc, char **argv)
{
    (void)argc, (void)argv;
    struct xfer *x = sg_actor_self_get_data();
    sg_host_sendto(x->from, x->to, x->bytes);
    x->next = NULL;
    if (net.done_tail)
        net.done_tail->next = x;
    else
        net.done_head = x;
    net.done_tail = x;
    sg_sem_release(net.sem);
}

/* SimGrid's clock catches up with the driver's before anything new is put on the network. */
static void sync_clock(void)
{
    if (net.now > simgrid_get_clock()) sg_actor_sleep_until(net.now);
}

void sim_net_send(int from, int to, double bytes, void (*done)(void *ctx), void *ctx)
{
    struct xfer *x = malloc(sizeof *x);
    if (!x) abort(); /* a few dozen bytes: nothing sensible to do without them */
    *x = (struct xfer){
        .from = net.hosts[from], .to = net.hosts[to], .bytes = bytes, .done = done, .ctx = ctx};
    sync_clock();
    net.in_flight++;
    sg_actor_t a = sg_actor_init("xfer", net.hosts[from]);
    sg_actor_set_data(a, x);
    sg_actor_start(a, xfer_main, 0, NULL);
}

static void run_completions(void)
{
    while (net.done_head) {
        struct xfer *x = net.done_head;
        net.done_head = x->next;
        if (!net.done_head) net.done_tail = NULL;
        net.in_flight--;
        x->done(x->ctx);
        free(x);
    }
}

void sim_net_wait_until(double t)
{
    if (net.in_flight == 0) {
        if (t > net.now) net.now = t;
        return;
    }
    sync_clock();
    double dt = t - simgrid_get_clock();
    int timed_out = 1;
    if (dt > 0) timed_out = sg_sem_acquire_timeout(net.sem, dt) != 0;
    /* SimGrid's clock after a timeout may sit a rounding error short of t: t it is */
    net.now = timed_out && !net.done_head ? t : simgrid_get_clock();
    if (net.now > t && !net.done_head) net.now = t;
    run_completions();
}

static void driver_main(int argc, char **argv)
{
    (void)argc, (void)argv;
    net.main(net.arg);
    while (net.in_flight > 0) { /* let stragglers end so SimGrid exits cleanly */
        sg_sem_acquire_timeout(net.sem, 1e9);
        net.now = simgrid_get_clock();
        run_completions();
    }
}

void sim_net_run(void (*main)(void *), void *arg)
{
    net.main = main;
    net.arg = arg;
    sg_actor_create("driver", net.hosts[0], driver_main, 0, NULL);
    simgrid_run();
}
