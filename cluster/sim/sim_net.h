/* sim_net: the simulator's clock and network, on SimGrid (flow-level max-min sharing: the CM02
 * network model without TCP factors or cross traffic, so one flow alone takes latency +
 * bytes / bandwidth exactly and flows sharing a link split it evenly).
 *
 * Topology: a star (SimGrid Floyd routing; its Dijkstra zones hung on this graph in 3.32). Each GPU
 * instance i (a tensor-parallel group on one server) is a host "g<i>" with a full-duplex NIC link
 * to the switch (bandwidth nic_Bps) and, between instances of one server, a direct NVLink edge
 * (both instances' NVLink links). Each server s has a host "mem<s>" (host memory, reaching its
 * instances over each instance's PCIe link) and "ssd<s>" (one SSD link shared by the server, then
 * the instance's PCIe link). One host "remote" is the remote storage, behind one link of remote_Bps
 * to the switch (shared by every loader).
 *
 * SimGrid has one engine per process and it cannot be restarted, so a simulation runs in a
 * process of its own (callers fork; see sim_run). Hence this module's state is per process.
 *
 * The driver (the caller's event loop) runs as a SimGrid actor: sim_net_run(main, arg) starts it.
 * sim_net_send() starts a transfer (an actor doing sg_host_sendto) that calls done(ctx) at its
 * end, in simulated time; sim_net_wait_until(t) advances the clock to t or returns earlier when a
 * transfer completes (its callback has run then). */
#ifndef STRATA_SIM_NET_H
#define STRATA_SIM_NET_H

struct sim_topology {
    int n_inst;
    const int *server;        /* [n_inst] server of each instance */
    const double *nic_Bps;    /* [n_inst] */
    const double *nvlink_Bps; /* [n_inst], 0: none */
    const double *pcie_Bps;   /* [n_inst] host memory -> GPU */
    int n_servers;
    double ssd_Bps;    /* per server, shared */
    double remote_Bps; /* remote storage, shared by the cluster */
    double latency_s;  /* per link */
};

/* Writes the platform (a temporary XML file), initialises SimGrid. Once per process. */
int sim_net_boot(const struct sim_topology *t, char *err);
/* Runs main(arg) as the driver actor until it returns and every transfer has ended. */
void sim_net_run(void (*main)(void *), void *arg);

int sim_net_host_inst(int i);
int sim_net_host_mem(int server);
int sim_net_host_ssd(int server);
int sim_net_host_remote(void);

double sim_net_now(void);
void sim_net_send(int from, int to, double bytes, void (*done)(void *ctx), void *ctx);
int sim_net_in_flight(void);
/* Advance to t (>= now) unless a transfer completes first. With nothing in flight it just sets
 * the clock (no SimGrid round trip per event). */
void sim_net_wait_until(double t);

#endif
