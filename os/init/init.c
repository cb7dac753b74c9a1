/* strata-init: see init.h. The steps, in order, then execve of the server. */
#include "os/init/init.h"

#include "os/common/errmsg.h"
#include "os/common/small_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/reboot.h>
#include <unistd.h>

/* A failed step: say why, then do what strata.on_error asks. Never returns: PID 1 must not exit
 * (the kernel would panic and the reason would scroll away). */
static void __attribute__((noreturn)) fail(enum boot_on_error on_error, const char *why)
{
    init_say("error", "%s", why);
    init_say("error", "%s (strata.on_error=%s)",
             on_error == BOOT_ON_ERROR_REBOOT     ? "rebooting"
             : on_error == BOOT_ON_ERROR_POWEROFF ? "powering off"
                                                  : "halting",
             boot_on_error_name(on_error));
    sync();
    reboot(on_error == BOOT_ON_ERROR_REBOOT     ? RB_AUTOBOOT
           : on_error == BOOT_ON_ERROR_POWEROFF ? RB_POWER_OFF
                                                : RB_HALT_SYSTEM);
    for (;;) pause();
}

static int read_cmdline(char *buf, size_t cap, char *err)
{
    return small_file_read("/proc/cmdline", buf, cap, err) < 0 ? -1 : 0;
}

/* argv for `strata serve`: the model (none for a joiner), the port, the API key, the fabric
 * (fabric.c), then strata.args split on spaces. */
static void exec_server(const struct boot_config *cfg, const char *model, char *err)
{
    static char args[sizeof cfg->args], port[16], node[16];
    char *argv[96], *envp[8];
    int n = 0, e = 0;
    argv[n++] = "strata";
    argv[n++] = "serve";
    if (model) {
        argv[n++] = "-m";
        argv[n++] = (char *)model;
    }
    argv[n++] = "--host";
    argv[n++] = "0.0.0.0";
    snprintf(port, sizeof port, "%d", cfg->port);
    argv[n++] = "--port";
    argv[n++] = port;
    if (cfg->api_key[0]) {
        argv[n++] = "--api-key";
        argv[n++] = (char *)cfg->api_key;
    }
    if (init_fabric_args(cfg, argv, &n, 80, err)) return;
    memcpy(args, cfg->args, sizeof args);
    for (char *save = NULL, *a = strtok_r(args, " ", &save); a && n < 94;
         a = strtok_r(NULL, " ", &save))
        argv[n++] = a;
    argv[n] = NULL;

    /* Cluster settings travel in the environment: the server reads what it knows. */
    static char env_node[32], env_role[48], env_peers[560];
    envp[e++] = "PATH=/bin";
    envp[e++] = "HOME=/";
    snprintf(node, sizeof node, "%d", cfg->node);
    if (cfg->node >= 0)
        snprintf(env_node, sizeof env_node, "STRATA_NODE=%s", node), envp[e++] = env_node;
    if (cfg->role[0])
        snprintf(env_role, sizeof env_role, "STRATA_ROLE=%s", cfg->role), envp[e++] = env_role;
    if (cfg->peers[0])
        snprintf(env_peers, sizeof env_peers, "STRATA_PEERS=%s", cfg->peers), envp[e++] = env_peers;
    envp[e] = NULL;

    char shown[1024];
    size_t off = 0;
    for (int i = 0; i < n && off < sizeof shown - 1; i++) {
        int hide = i > 0 && !strcmp(argv[i - 1], "--api-key");
        off += (size_t)snprintf(shown + off, sizeof shown - off, "%s%s", i ? " " : "",
                                hide ? "***" : argv[i]);
    }
    init_say("exec", "%s (as PID %d)", shown, (int)getpid());
    execve(INIT_SERVER, argv, envp);
    errmsg_set(err, "exec %s: %s", INIT_SERVER, strerror(errno));
}

int main(void)
{
    char err[ERRMSG_LEN], line[4096], shown[4096], model[512];
    struct boot_config cfg;

    if (init_mounts(err)) fail(BOOT_ON_ERROR_HALT, err);
    /* The console may differ from /dev/console only by the command line, which needs /proc. */
    if (read_cmdline(line, sizeof line, err)) fail(BOOT_ON_ERROR_HALT, err);
    int bad = boot_cmdline_parse(line, &cfg, err);
    if (init_console(bad ? "" : cfg.console, err)) fail(cfg.on_error, err);
    init_say("start", "strata init, PID %d", (int)getpid());
    init_mask_secrets(line, shown, sizeof shown);
    init_say("cmdline", "%s", shown[0] ? shown : "(empty)");
    if (bad) fail(cfg.on_error, err);
    if (init_panic_policy(&cfg, line, err)) fail(cfg.on_error, err);
    if (init_cpu_check(err)) fail(cfg.on_error, err);

    if (cfg.hugepages >= 0) {
        if (init_hugepages(cfg.hugepages, err)) fail(cfg.on_error, err);
    }
    int loaded = 0, failed = 0;
    if (init_modules(INIT_MODULE_LIST, &loaded, &failed, err)) fail(cfg.on_error, err);
    init_say("modules", "%d loaded, %d failed", loaded, failed);
    int nodes = 0;
    if (init_nvidia_nodes(&nodes, err)) fail(cfg.on_error, err);
    if (nodes) init_say("nvidia", "%d device nodes (/dev/nvidiactl ...)", nodes);
    if (init_net(&cfg, err)) fail(cfg.on_error, err);
    /* A joiner has no model: it pulls it from its peers; a cluster member gets one when the
     * planner picks it (strata.model=part:... still mounts the partition, e.g. for its
     * cluster.key). */
    int joiner = init_is_joiner(&cfg) || init_is_member(&cfg);
    if ((!joiner || cfg.model[0]) && init_model(&cfg, model, sizeof model, err))
        fail(cfg.on_error, err);
    exec_server(&cfg, joiner ? NULL : model, err);
    fail(cfg.on_error, err);
}
