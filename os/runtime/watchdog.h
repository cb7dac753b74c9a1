/* watchdog: the hardware watchdog (/dev/watchdog: i6300esb in QEMU, iTCO_wdt on Intel chipsets,
 * sp5100_tco on AMD, wdat_wdt where ACPI describes one). Once opened it resets the machine unless
 * it is petted within the timeout: the server pets it from its main loop, so a hung server -- a
 * deadlock, a loop that never returns to its poll -- reboots the appliance instead of sitting
 * there. strata.watchdog=SECONDS arms it (os/runtime/pid1.c); off by default.
 *
 * watchdog_open sets the timeout (the driver may round it; watchdog_timeout() says what it took).
 * watchdog_pet is cheap enough for every loop iteration: it talks to the device at most once a
 * second. watchdog_close is the magic close (write 'V'): the device stops counting, for a clean
 * shutdown or a halt that must keep its message on the console. Async-signal-safe except open.
 * One watchdog per process; not thread-safe against concurrent open/close. */
#ifndef STRATA_WATCHDOG_H
#define STRATA_WATCHDOG_H

#define WATCHDOG_DEV "/dev/watchdog"

/* Returns 0, or -1 with err ("/dev/watchdog: No such file or directory (no watchdog driver
 * bound: i6300esb, iTCO_wdt, sp5100_tco, wdat_wdt)"). */
int watchdog_open(const char *dev, int timeout_s, char *err);
void watchdog_pet(void);
void watchdog_close(void);
int watchdog_active(void);
int watchdog_timeout(void);
/* The driver's name for itself ("i6300ESB timer"), "" before open. */
const char *watchdog_identity(void);

#endif
