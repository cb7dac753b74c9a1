/* pid1: the server as the machine's only process (PID 1 on the appliance, after os/init execs it).
 *
 * `strata serve` calls pid1_init() first, before it starts any thread. When getpid() != 1 it does
 * nothing and returns 0, so the same binary serves on a workstation. As PID 1 it:
 *   - reaps children (SIGCHLD), should anything ever fork;
 *   - turns SIGTERM, SIGINT, SIGPWR and the ACPI power button (QEMU `system_powerdown`; read from
 *     the "Power Button" evdev device, there is no acpid) into a shutdown request: on_shutdown(ctx)
 *     runs once on pid1's watcher thread (not in a signal handler); the server then stops and
 *     returns from its command. If it has not returned after PID1_GRACE_S, or on_shutdown is NULL,
 *     the machine powers off anyway;
 *   - makes leaving main() safe: PID 1 must never exit (the kernel panics and the reason scrolls
 *     away). After a requested shutdown, exit means sync + power off. An exit nobody asked for is a
 *     fatal error: it prints "strata: fatal: ..." and halts, reboots or powers off as
 *     strata.on_error on the kernel command line says (default halt). A crash (SIGSEGV, SIGBUS,
 *     SIGILL, SIGFPE, SIGABRT) takes the same path, its line naming the signal and the faulting
 *     address (the handlers run on an alternate stack, so a stack overflow is reported too);
 *   - with strata.watchdog=SECONDS, arms /dev/watchdog (os/runtime/watchdog.h), petted by pid1_tick()
 *     from the server's main loop; closed with the magic close on a clean shutdown and before a
 *     halt or power off;
 *   - renews the DHCP lease os/init obtained, on a thread of its own (os/runtime/dhcp_renew.h).
 * pid1_init must be called before other threads exist: the signals it handles are blocked in the
 * caller and so in every thread created afterwards, and read on its own thread. */
#ifndef STRATA_PID1_H
#define STRATA_PID1_H

#define PID1_GRACE_S 10

/* Returns 0 (also when not PID 1), or -1 with err set. */
int pid1_init(void (*on_shutdown)(void *ctx), void *ctx, char *err);

/* The main loop's heartbeat: pets the hardware watchdog when strata.watchdog armed it (cheap:
 * call it every iteration; a loop that stops calling it reboots the machine after the timeout). */
void pid1_tick(void);

/* 1 when this process is PID 1 (whether or not pid1_init ran). */
int pid1_active(void);

/* 1 once a shutdown was requested (signal or power button). */
int pid1_shutdown_requested(void);

/* User-space processes on the machine, kernel threads not counted: 1 on the appliance. -1 when
 * /proc cannot be read. For /health ("pid", "processes"). */
int pid1_process_count(void);

/* Print "strata: fatal: REASON" and, as PID 1, halt/reboot/power off per strata.on_error; else
 * exit(1). For errors the server cannot serve through (model missing, port taken). */
void pid1_fatal(const char *reason) __attribute__((noreturn));

#endif
