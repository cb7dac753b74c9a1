/* pid1: see pid1.h. The watcher thread waits on a signalfd and the power button's evdev device;
 * atexit() and the crash handlers make every way out of the process end in halt, reboot or power
 * off instead of a kernel panic. */
#include "os/runtime/pid1.h"

#include "os/common/boot_cmdline.h"
#include "os/common/dhcp_lease.h"
#include "os/runtime/dhcp_renew.h"
#include "os/common/errmsg.h"
#include "os/runtime/watchdog.h"
#include "os/common/small_file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/input.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/reboot.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_BUTTONS 4

static struct {
    int active;
    enum boot_on_error on_error;
    int watchdog_s;
    void (*on_shutdown)(void *);
    void *ctx;
    volatile sig_atomic_t shutdown; /* a shutdown was asked for: exit means power off */
    int sfd;
    int buttons[MAX_BUTTONS], n_buttons;
} P = {.sfd = -1};

int pid1_active(void)
{
    return getpid() == 1;
}
int pid1_shutdown_requested(void)
{
    return P.shutdown != 0;
}

static void say(const char *msg)
{
    /* write(2) only: also used from signal handlers. */
    if (write(2, msg, strlen(msg)) < 0) (void)0;
}

static void __attribute__((noreturn)) machine_stop(int how)
{
    sync();
    reboot(how);
    for (;;) pause(); /* reboot() failed: stay, never exit as PID 1 */
}

static int on_error_cmd(void)
{
    return P.on_error == BOOT_ON_ERROR_REBOOT     ? RB_AUTOBOOT
           : P.on_error == BOOT_ON_ERROR_POWEROFF ? RB_POWER_OFF
                                                  : RB_HALT_SYSTEM;
}

static const char *on_error_doing(void)
{
    return P.on_error == BOOT_ON_ERROR_REBOOT     ? "rebooting"
           : P.on_error == BOOT_ON_ERROR_POWEROFF ? "powering off"
                                                  : "halting";
}

void pid1_fatal(const char *reason)
{
    char line[ERRMSG_LEN + 128];
    snprintf(line, sizeof line, "strata: fatal: %s\n", reason);
    say(line);
    if (!P.active) exit(1);
    snprintf(line, sizeof line, "strata: %s (strata.on_error=%s)\n", on_error_doing(),
             boot_on_error_name(P.on_error));
    say(line);
    /* A halt keeps the reason on the console: the watchdog must not reboot it away. */
    if (P.on_error != BOOT_ON_ERROR_REBOOT) watchdog_close();
    machine_stop(on_error_cmd());
}

static void at_exit(void)
{
    if (!P.active) return;
    if (P.shutdown) {
        watchdog_close();
        say("strata: shutdown complete, powering off\n");
        machine_stop(RB_POWER_OFF);
    }
    pid1_fatal("the server exited without a shutdown request");
}

/* "0x" and 16 hex digits, without stdio (signal handlers). */
static void say_hex(unsigned long v)
{
    char b[19] = "0x";
    for (int i = 0; i < 16; i++) b[2 + i] = "0123456789abcdef"[(v >> (60 - 4 * i)) & 15];
    b[18] = 0;
    say(b);
}

static void on_crash(int sig, siginfo_t *si, void *uc)
{
    (void)uc;
    /* Async-signal-safe: fixed strings and syscalls only. */
    const char *name = sig == SIGSEGV  ? "SIGSEGV"
                       : sig == SIGBUS ? "SIGBUS"
                       : sig == SIGILL ? "SIGILL"
                       : sig == SIGFPE ? "SIGFPE"
                                       : "SIGABRT";
    say("strata: fatal: crashed with ");
    say(name);
    if (sig != SIGABRT && si) {
        say(" at address ");
        say_hex((unsigned long)si->si_addr);
    }
    say(P.on_error == BOOT_ON_ERROR_REBOOT     ? "; rebooting (strata.on_error=reboot)\n"
        : P.on_error == BOOT_ON_ERROR_POWEROFF ? "; powering off (strata.on_error=poweroff)\n"
                                               : "; halting (strata.on_error=halt)\n");
    if (P.on_error != BOOT_ON_ERROR_REBOOT) watchdog_close();
    machine_stop(on_error_cmd());
}

static void no_op(int sig)
{
    (void)sig;
}

/* PID 1 gets no signal whose disposition is SIG_DFL (the kernel drops them at send time), so every
 * handled signal needs a handler even though it is blocked and read through the signalfd. */
static int install_handlers(sigset_t *set, char *err)
{
    static const int watched[] = {SIGTERM, SIGINT, SIGPWR, SIGCHLD, SIGHUP};
    static const int crashes[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sigemptyset(set);
    sa.sa_handler = no_op;
    for (size_t i = 0; i < sizeof watched / sizeof watched[0]; i++) {
        if (sigaction(watched[i], &sa, NULL))
            return errmsg_set(err, "sigaction: %s", strerror(errno));
        sigaddset(set, watched[i]);
    }
    /* The crash handlers run on their own stack, so that a stack overflow is reported too. */
    static char altstack[64 * 1024];
    stack_t ss = {.ss_sp = altstack, .ss_size = sizeof altstack};
    if (sigaltstack(&ss, NULL)) return errmsg_set(err, "sigaltstack: %s", strerror(errno));
    sa.sa_handler = NULL;
    sa.sa_sigaction = on_crash;
    sa.sa_flags = SA_RESETHAND | SA_SIGINFO | SA_ONSTACK;
    for (size_t i = 0; i < sizeof crashes / sizeof crashes[0]; i++)
        if (sigaction(crashes[i], &sa, NULL))
            return errmsg_set(err, "sigaction: %s", strerror(errno));
    /* Writing to a client that left must not kill the machine. */
    signal(SIGPIPE, SIG_IGN);
    return 0;
}

/* evdev devices named "Power Button" (ACPI button driver: button.ko + evdev.ko in the image) or
 * "gpio-keys" (a power key on a GPIO line: QEMU's arm64 virt machine, gpio_keys.ko); only their
 * KEY_POWER presses count. */
static void open_power_buttons(void)
{
    DIR *d = opendir("/sys/class/input");
    if (!d) return;
    for (struct dirent *e; (e = readdir(d)) && P.n_buttons < MAX_BUTTONS;) {
        if (strncmp(e->d_name, "event", 5)) continue;
        char path[300], name[128] = {0};
        snprintf(path, sizeof path, "/sys/class/input/%s/device/name", e->d_name);
        if (small_file_read(path, name, sizeof name, NULL) <= 0 ||
            (!strstr(name, "Power Button") && strncmp(name, "gpio-keys", 9)))
            continue;
        snprintf(path, sizeof path, "/dev/input/%s", e->d_name);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) P.buttons[P.n_buttons++] = fd;
    }
    closedir(d);
}

static void request_shutdown(const char *why)
{
    if (P.shutdown) return;
    P.shutdown = 1;
    char line[160];
    snprintf(line, sizeof line, "strata: %s: shutting down\n", why);
    say(line);
    if (!P.on_shutdown) machine_stop(RB_POWER_OFF);
    P.on_shutdown(P.ctx);
}

static void *watcher(void *arg)
{
    (void)arg;
    struct pollfd pf[1 + MAX_BUTTONS];
    time_t deadline = 0;
    for (;;) {
        int n = 0;
        pf[n++] = (struct pollfd){.fd = P.sfd, .events = POLLIN};
        for (int i = 0; i < P.n_buttons; i++)
            pf[n++] = (struct pollfd){.fd = P.buttons[i], .events = POLLIN};
        int rc = poll(pf, (nfds_t)n, P.shutdown ? 1000 : -1);
        if (P.shutdown && time(NULL) >= deadline) {
            say("strata: the server did not stop in time, powering off\n");
            machine_stop(RB_POWER_OFF);
        }
        if (rc <= 0) continue;
        if (pf[0].revents & POLLIN) {
            struct signalfd_siginfo si;
            while (read(P.sfd, &si, sizeof si) == (ssize_t)sizeof si) {
                if (si.ssi_signo == SIGCHLD) {
                    while (waitpid(-1, NULL, WNOHANG) > 0) {
                    }
                } else if (si.ssi_signo != SIGHUP) {
                    request_shutdown(si.ssi_signo == SIGTERM  ? "SIGTERM"
                                     : si.ssi_signo == SIGINT ? "SIGINT"
                                                              : "SIGPWR");
                    deadline = time(NULL) + PID1_GRACE_S;
                }
            }
        }
        for (int i = 1; i < n; i++) {
            struct input_event ev;
            if (!(pf[i].revents & POLLIN) || read(pf[i].fd, &ev, sizeof ev) != (ssize_t)sizeof ev)
                continue;
            if (ev.type == EV_KEY && ev.code == KEY_POWER && ev.value == 1) {
                request_shutdown("power button");
                deadline = time(NULL) + PID1_GRACE_S;
            }
        }
    }
    return NULL;
}

static void read_cmdline(struct boot_config *cfg)
{
    char line[4096];
    small_file_read("/proc/cmdline", line, sizeof line, NULL); /* "" when unreadable */
    /* Errors were init's to report; on_error is read whatever else is wrong. */
    boot_cmdline_parse(line, cfg, NULL);
}

/* Armed before main() runs: a PID-1 process that leaves main() for any reason -- a usage error
 * before the server even reached pid1_init() included -- goes through at_exit() instead of
 * panicking the kernel. */
__attribute__((constructor)) static void pid1_arm(void)
{
    if (!pid1_active()) return;
    struct boot_config cfg;
    read_cmdline(&cfg);
    P.on_error = cfg.on_error;
    P.watchdog_s = cfg.watchdog;
    P.active = 1;
    atexit(at_exit);
}

int pid1_init(void (*on_shutdown)(void *ctx), void *ctx, char *err)
{
    static int done;
    if (!pid1_active() || done) return 0;
    done = 1;
    P.on_shutdown = on_shutdown;
    P.ctx = ctx;
    sigset_t set;
    if (install_handlers(&set, err)) return -1;
    if (pthread_sigmask(SIG_BLOCK, &set, NULL)) return errmsg_set(err, "pthread_sigmask failed");
    P.sfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
    if (P.sfd < 0) return errmsg_set(err, "signalfd: %s", strerror(errno));
    open_power_buttons();
    pthread_t t;
    int rc = pthread_create(&t, NULL, watcher, NULL);
    if (rc) return errmsg_set(err, "pid1 watcher thread: %s", strerror(rc));
    pthread_detach(t);
    char line[ERRMSG_LEN + 160];
    snprintf(line, sizeof line,
             "strata: PID 1: reaping children, shutdown on SIGTERM/SIGINT/SIGPWR%s, "
             "strata.on_error=%s\n",
             P.n_buttons ? " and the power button" : " (no power button device)",
             boot_on_error_name(P.on_error));
    say(line);
    if (P.watchdog_s > 0) {
        if (watchdog_open(WATCHDOG_DEV, P.watchdog_s, err))
            return errmsg_prefix(err, "strata.watchdog=%d: ", P.watchdog_s);
        snprintf(line, sizeof line,
                 "strata: watchdog: %s (%s) armed, %d s; petted from the main loop\n", WATCHDOG_DEV,
                 watchdog_identity(), watchdog_timeout());
        say(line);
    }
    /* Last: the renewal thread inherits the signal mask set above. */
    if (dhcp_renew_start(DHCP_LEASE_FILE, err)) return -1;
    return 0;
}

void pid1_tick(void)
{
    watchdog_pet();
}

int pid1_process_count(void)
{
    DIR *d = opendir("/proc");
    if (!d) return -1;
    int count = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
        char path[300], buf[1024];
        snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
        if (small_file_read(path, buf, sizeof buf, NULL) <= 0) continue;
        /* Field 9 is the task flags; PF_KTHREAD marks kernel threads. The command name (field 2)
         * may hold spaces, so count fields after its closing parenthesis. */
        char *p = strrchr(buf, ')');
        if (!p) continue;
        unsigned long flags = 0;
        int field = 2;
        for (char *save = NULL, *tok = strtok_r(p + 1, " ", &save); tok;
             tok = strtok_r(NULL, " ", &save))
            if (++field == 9) {
                flags = strtoul(tok, NULL, 10);
                break;
            }
        if (!(flags & 0x00200000UL)) count++;
    }
    closedir(d);
    return count;
}
