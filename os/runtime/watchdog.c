/* watchdog: see watchdog.h. The Linux watchdog API (Documentation/watchdog/watchdog-api.rst). */
#include "os/runtime/watchdog.h"

#include "os/common/errmsg.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/watchdog.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

static struct {
    int fd, timeout;
    time_t last_pet;
    char identity[40];
} W = {.fd = -1};

int watchdog_open(const char *dev, int timeout_s, char *err)
{
    int fd = open(dev, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return errmsg_set(err,
                          "%s: %s (no watchdog driver bound: i6300esb, iTCO_wdt, sp5100_tco, "
                          "wdat_wdt)",
                          dev, strerror(errno));
    struct watchdog_info info;
    memset(&info, 0, sizeof info);
    if (ioctl(fd, WDIOC_GETSUPPORT, &info) == 0)
        snprintf(W.identity, sizeof W.identity, "%.32s", (const char *)info.identity);
    int t = timeout_s;
    if (ioctl(fd, WDIOC_SETTIMEOUT, &t) < 0) {
        int e = errno;
        /* Opening armed it: disarm before giving up, or it reboots the machine later. */
        if (write(fd, "V", 1) < 0) (void)0;
        close(fd);
        return errmsg_set(err, "%s (%s): timeout %d s: %s", dev, W.identity, timeout_s,
                          strerror(e));
    }
    if (ioctl(fd, WDIOC_GETTIMEOUT, &t) < 0) t = timeout_s;
    W.fd = fd;
    W.timeout = t;
    W.last_pet = 0;
    watchdog_pet();
    return 0;
}

void watchdog_pet(void)
{
    if (W.fd < 0) return;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (now.tv_sec == W.last_pet) return;
    W.last_pet = now.tv_sec;
    int dummy = 0;
    if (ioctl(W.fd, WDIOC_KEEPALIVE, &dummy) < 0 && write(W.fd, "\0", 1) < 0) (void)0;
}

void watchdog_close(void)
{
    if (W.fd < 0) return;
    if (write(W.fd, "V", 1) < 0) (void)0;
    close(W.fd);
    W.fd = -1;
}

int watchdog_active(void)
{
    return W.fd >= 0;
}

int watchdog_timeout(void)
{
    return W.timeout;
}

const char *watchdog_identity(void)
{
    return W.identity;
}
