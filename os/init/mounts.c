/* The file systems a bare initramfs lacks, the console, and hugepages. */
#include "os/common/errmsg.h"
#include "os/init/init.h"
#include "os/common/small_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

static int mount_one(const char *src, const char *dir, const char *type, unsigned long flags,
                     const char *data, char *err)
{
    if (mkdir(dir, 0755) && errno != EEXIST)
        return errmsg_set(err, "mkdir %s: %s", dir, strerror(errno));
    if (mount(src, dir, type, flags, data) && errno != EBUSY)
        return errmsg_set(err, "mount %s on %s: %s", type, dir, strerror(errno));
    return 0;
}

int init_mounts(char *err)
{
    if (mount_one("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL, err) ||
        mount_one("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL, err) ||
        mount_one("devtmpfs", "/dev", "devtmpfs", MS_NOSUID, "mode=0755", err) ||
        mount_one("tmpfs", "/run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755", err) ||
        mount_one("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777", err))
        return -1;
    return 0;
}

int init_console(const char *dev, char *err)
{
    const char *path = dev && dev[0] ? dev : "/dev/console";
    /* Keep the kernel's console when it gave us one and no other was asked for. */
    if (!(dev && dev[0]) && fcntl(2, F_GETFD) >= 0) return 0;
    int fd = open(path, O_RDWR | O_NOCTTY);
    if (fd < 0) return errmsg_set(err, "console %s: %s", path, strerror(errno));
    for (int i = 0; i < 3; i++)
        if (fd != i && dup2(fd, i) < 0)
            return errmsg_set(err, "console %s: dup2: %s", path, strerror(errno));
    if (fd > 2) close(fd);
    return 0;
}

static int write_file(const char *path, const char *text, char *err)
{
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return errmsg_set(err, "%s: %s", path, strerror(errno));
    ssize_t n = write(fd, text, strlen(text));
    int e = errno;
    close(fd);
    if (n != (ssize_t)strlen(text)) return errmsg_set(err, "%s: write: %s", path, strerror(e));
    return 0;
}

static long read_long(const char *path)
{
    char buf[32];
    if (small_file_read(path, buf, sizeof buf, NULL) <= 0) return -1;
    long v = 0;
    for (char *p = buf; *p >= '0' && *p <= '9'; p++) v = v * 10 + (*p - '0');
    return v;
}

int init_hugepages(long n, char *err)
{
    char num[32];
    snprintf(num, sizeof num, "%ld", n);
    const char *knob = "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages";
    if (write_file(knob, num, err)) return errmsg_prefix(err, "strata.hugepages=%ld: ", n);
    /* The kernel grants what it can find contiguous; fewer than asked is an error the user must
     * see now, not an allocation failure deep in the server later. */
    long got = read_long(knob);
    if (got != n)
        return errmsg_set(err, "strata.hugepages=%ld: the kernel reserved only %ld 2 MiB pages", n,
                          got);
    if (mount_one("hugetlbfs", "/dev/hugepages", "hugetlbfs", MS_NOSUID | MS_NODEV, "pagesize=2M",
                  err))
        return -1;
    init_say("hugepages", "%ld x 2 MiB reserved, hugetlbfs on /dev/hugepages", got);
    return 0;
}

/* The kernel's panic=N, or 0 when the command line has none. */
static long cmdline_panic(const char *line)
{
    for (const char *p = line; (p = strstr(p, "panic=")); p++) {
        if (p != line && p[-1] != ' ') continue;
        long v = 0;
        int neg = p[6] == '-';
        for (const char *d = p + 6 + neg; *d >= '0' && *d <= '9'; d++) v = v * 10 + (*d - '0');
        return neg ? -v : v;
    }
    return 0;
}

int init_panic_policy(const struct boot_config *cfg, const char *cmdline, char *err)
{
    long secs = 0;
    if (cfg->on_error == BOOT_ON_ERROR_REBOOT) {
        secs = cmdline_panic(cmdline);
        if (secs <= 0) secs = 10;
    }
    char num[32];
    snprintf(num, sizeof num, "%ld", secs);
    if (write_file("/proc/sys/kernel/panic", num, err) ||
        write_file("/proc/sys/kernel/panic_on_oops", secs ? "1" : "0", err))
        return -1;
    if (secs)
        init_say("panic", "a kernel panic or oops reboots after %ld s (strata.on_error=reboot)",
                 secs);
    else
        init_say("panic", "a kernel panic stays on the console (strata.on_error=%s)",
                 boot_on_error_name(cfg->on_error));
    return 0;
}
