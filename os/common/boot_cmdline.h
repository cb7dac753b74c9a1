/* boot_cmdline: the appliance's settings from the kernel command line (`strata.*` keys).
 *
 * boot_cmdline_parse() reads a whole command line (/proc/cmdline) into a struct boot_config.
 * Keys without the "strata." prefix belong to the kernel and are ignored; an unknown strata.* key
 * or a malformed value is an error naming the key and the reason. Parsing does not stop at the
 * first error: every key is read, so that strata.on_error (halt|reboot|poweroff) is known even
 * when another key is bad; the first error is the one reported. A later key overrides an earlier
 * one (iPXE scripts append). The kernel's static ip=CLIENT:SERVER:GW:NETMASK (PXELINUX's
 * IPAPPEND 1) fills the address and gateway when no strata.ip is given. Values may be
 * double-quoted like the kernel allows:
 *   strata.args="--threads 2". Everything after a lone "--" belongs to init and is ignored.
 * The reference for every key is boot/cmdline.md. Shared by os/init (static musl) and the
 * server (os/runtime/pid1.c), so it depends on libc only. */
#ifndef STRATA_BOOT_CMDLINE_H
#define STRATA_BOOT_CMDLINE_H

#include <stdint.h>

#define BOOT_DNS_MAX 3

enum boot_on_error { BOOT_ON_ERROR_HALT = 0, BOOT_ON_ERROR_REBOOT, BOOT_ON_ERROR_POWEROFF };

struct boot_config {
    char model[256];   /* strata.model: /path in the initrd, or part:LABEL[/path]; "" = default */
    int node;          /* strata.node: 0..65535, -1 when absent */
    char role[32];     /* strata.role: serve (holds a model), join (pulls it from strata.peers) or
                          member (a cluster member with no model until the planner picks it);
                          another lower-case word is kept for the server; "" when absent */
    char peers[512];   /* strata.peers: ADDR[:PORT],... IPv4, checked; "" when absent */
    char cluster[512]; /* strata.cluster: ID@ADDR[:PORT],... the control plane's voters (IPv4,
                          ids 1..65535, checked); "" when absent */
    char rack[64];     /* strata.rack: this node's failure domain (`strata serve --rack`): 1..63
                          letters, digits, '.', '-', '_'; "" when absent */
    char api_key[128]; /* strata.api_key: printable, no spaces; "" when absent */
    int port;          /* strata.port: 1..65535, default 8080 */
    long hugepages;    /* strata.hugepages: 2 MiB pages to reserve, -1 when absent */
    int has_ip;        /* strata.ip=ADDR/PREFIX (PREFIX 0..32 or a dotted netmask): static */
    int ip_off;        /* strata.ip=off: the NIC comes up without an address */
    int ip_given;      /* some strata.ip= was on the line (the kernel's ip= then does not count) */
    /* Neither (no strata.ip, or strata.ip=dhcp): DHCPv4 on the NIC (os/common/dhcp_client.h). */
    uint32_t ip; /* host byte order */
    int prefix;
    int has_gw; /* strata.gw=ADDR */
    uint32_t gw;
    int n_dns; /* strata.dns=ADDR[,ADDR...] (at most BOOT_DNS_MAX) */
    uint32_t dns[BOOT_DNS_MAX];
    char iface[16];              /* strata.iface: the NIC to configure; "" = the first one found */
    enum boot_on_error on_error; /* strata.on_error, default halt */
    char console[64]; /* strata.console: device init and the server write to; "" = /dev/console */
    char args[512];   /* strata.args: extra arguments for `strata serve`, split on spaces */
    /* The fabric (boot/cmdline.md): strata.fabric=tcp|dpdk|rdma, strata.fabric_port (7000),
     * strata.key=HEX64 (the cluster key itself) or strata.key=/path (a file holding it: in the
     * initrd or on the model partition). "" when absent. */
    char fabric[8];
    int fabric_port;
    /* strata.fabric_ip=A.B.C.D/PREFIX on strata.fabric_iface=NAME: a NIC of its own for the
     * fabric (a back-end network); the fabric listens there. */
    int has_fabric_ip;
    uint32_t fabric_ip;
    int fabric_prefix;
    char fabric_iface[16];
    char key[65];
    char key_file[256];
    int watchdog; /* strata.watchdog: /dev/watchdog timeout in seconds, 0 = off (default) */
};

/* Fill *cfg with the defaults (the values above), then apply every strata.* key in line.
 * Returns 0, or -1 with err = "strata.ip=10.0.2.300/24: malformed address (want A.B.C.D/PREFIX,
 * dhcp or off)".
 */
int boot_cmdline_parse(const char *line, struct boot_config *cfg, char *err);

/* "10.0.2.15" into buf (16 bytes at least). */
const char *boot_ip_str(uint32_t ip, char *buf);

/* The on_error words, for messages. */
const char *boot_on_error_name(enum boot_on_error e);

#endif
