/* init: the appliance's PID 1 stage (static musl). It runs a fixed list of steps, prints each on
 * the console as "strata-init: STEP: what it did", and ends by execve()ing the server so that the
 * server becomes PID 1 and the only process. A step returns 0, or -1 with one line in err; init
 * prints "strata-init: error: LINE" and then halts, reboots or powers off as strata.on_error says.
 * Each step lives in its own file; the parser of the command line is os/common/boot_cmdline.c. */
#ifndef STRATA_INIT_H
#define STRATA_INIT_H

#include "os/common/boot_cmdline.h"
#include "os/common/console.h"

#include <stddef.h>

/* Paths inside the image, fixed by image/build.sh. */
#define INIT_SERVER        "/bin/strata"
#define INIT_MODULE_LIST   "/etc/modules"
#define INIT_DEFAULT_MODEL "/model.gguf"
#define INIT_MODEL_MOUNT   "/mnt/model"

/* Console lines: "strata-init: STEP: ..." (STEP a string literal; os/common/console.h). */
#define init_say(step, ...) console_say("strata-init: " step ": ", __VA_ARGS__)

/* mounts.c: proc, sysfs, devtmpfs, tmpfs on /run and /tmp. */
int init_mounts(char *err);
/* mounts.c: make fds 0-2 the console when the kernel could not (no /dev/console in the cpio);
 * dev is strata.console or "" for /dev/console. */
int init_console(const char *dev, char *err);
/* mounts.c: reserve n 2 MiB hugepages and mount hugetlbfs on /dev/hugepages. */
int init_hugepages(long n, char *err);

/* modules.c: finit_module() every module the list file names, in order. A module that fails
 * (hardware absent) is a warning, not an error: *loaded and *failed count them. */
int init_modules(const char *list, int *loaded, int *failed, char *err);

/* cpu.c: 0 when the CPU has what the server's libraries are compiled for (x86-64-v2; on aarch64
 * armv8-a+crc), else -1 with err naming the missing features and the fix. */
int init_cpu_check(char *err);

/* mounts.c: /proc/sys/kernel/panic from strata.on_error: reboot -> the kernel's panic=N (10 s
 * when the command line has none) and panic_on_oops; halt, poweroff -> 0, the panic stays on the
 * console. cmdline is the whole kernel command line. */
int init_panic_policy(const struct boot_config *cfg, const char *cmdline, char *err);

/* nvidia.c: the /dev/nvidia* nodes when the NVIDIA driver is loaded (devtmpfs makes none for it);
 * *made counts them (0 without the driver). */
int init_nvidia_nodes(int *made, char *err);

/* net.c: lo up; the NIC (cfg->iface, else the first Ethernet one, or with DHCP the first with a
 * link) up, with strata.ip/gw/dns, nothing (strata.ip=off), or by default a DHCP lease, which is
 * written to DHCP_LEASE_FILE for the server to renew. Netlink and a packet socket only. */
int init_net(const struct boot_config *cfg, char *err);

/* model.c: the model file the server gets: cfg->model, /model.gguf by default, or for
 * part:LABEL[/path] the file on the GPT partition named LABEL, mounted read-only. */
int init_model(const struct boot_config *cfg, char *path, size_t cap, char *err);

/* fabric.c: on the fabric when strata.fabric, strata.peers, strata.key or strata.role=join is
 * given. Appends --fabric KIND --listen IP:PORT --key-file F [--node-id N] [--peers LIST] to the
 * server's argv (the key of strata.key=HEX is written to /run/strata/cluster.key, 0600; without
 * strata.key, /mnt/model/cluster.key on the model partition is used). */
int init_on_fabric(const struct boot_config *cfg);
int init_is_joiner(const struct boot_config *cfg); /* strata.role=join: no model, pull it */
/* strata.role=member: a cluster member with no model until the planner scales it up */
int init_is_member(const struct boot_config *cfg);
#define INIT_CONTROL_PORT "7100" /* strata.cluster's default control port */
int init_fabric_args(const struct boot_config *cfg, char **argv, int *n, int max, char *err);
/* The command line for the console with the values of strata.key and strata.api_key as ***. */
void init_mask_secrets(const char *line, char *out, size_t cap);

#endif
