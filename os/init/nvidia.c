/* The NVIDIA driver's device nodes. nvidia.ko registers character devices but no device class, so
 * devtmpfs creates nothing; on a distribution nvidia-modprobe or udev makes the nodes. Here init
 * does: /dev/nvidiactl (195:255), /dev/nvidiaN (195:N, the minor from the driver's
 * /proc/driver/nvidia/gpus/PCI/information "Device Minor:"), /dev/nvidia-modeset (195:254) when
 * nvidia-modeset is loaded, and /dev/nvidia-uvm, /dev/nvidia-uvm-tools (the major the kernel gave
 * "nvidia-uvm" in /proc/devices, minors 0 and 1). Nothing to do when /sys/module/nvidia is absent.
 */
#include "os/common/errmsg.h"
#include "os/init/init.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#define NV_MAJOR 195

static int node(const char *path, int major, int minor, int *made, char *err)
{
    if (mknod(path, S_IFCHR | 0666, makedev(major, minor)) && errno != EEXIST)
        return errmsg_set(err, "mknod %s (%d:%d): %s", path, major, minor, strerror(errno));
    (*made)++;
    return 0;
}

/* The major /proc/devices lists for name, or -1. */
static int proc_major(const char *name)
{
    FILE *f = fopen("/proc/devices", "re");
    if (!f) return -1;
    char line[128], dev[64];
    int major = -1, m;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "%d %63s", &m, dev) == 2 && !strcmp(dev, name)) major = m;
    fclose(f);
    return major;
}

static int gpu_minor(const char *dir)
{
    char path[512], line[256];
    snprintf(path, sizeof path, "/proc/driver/nvidia/gpus/%s/information", dir);
    FILE *f = fopen(path, "re");
    if (!f) return -1;
    int minor = -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "Device Minor:", 13)) minor = atoi(line + 13);
    fclose(f);
    return minor;
}

int init_nvidia_nodes(int *made, char *err)
{
    *made = 0;
    if (access("/sys/module/nvidia", F_OK)) return 0; /* no driver loaded */
    if (node("/dev/nvidiactl", NV_MAJOR, 255, made, err)) return -1;
    DIR *d = opendir("/proc/driver/nvidia/gpus");
    for (struct dirent *e; d && (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        int minor = gpu_minor(e->d_name);
        if (minor < 0 || minor > 253) continue;
        char path[32];
        snprintf(path, sizeof path, "/dev/nvidia%d", minor);
        if (node(path, NV_MAJOR, minor, made, err)) {
            closedir(d);
            return -1;
        }
    }
    if (d) closedir(d);
    if (access("/sys/module/nvidia_modeset", F_OK) == 0)
        if (node("/dev/nvidia-modeset", NV_MAJOR, 254, made, err)) return -1;
    int uvm = proc_major("nvidia-uvm");
    if (uvm >= 0 && (node("/dev/nvidia-uvm", uvm, 0, made, err) ||
                     node("/dev/nvidia-uvm-tools", uvm, 1, made, err)))
        return -1;
    return 0;
}
