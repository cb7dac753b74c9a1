/* Where the model comes from: a file in the initrd, or a GPT partition found by its name (the
 * disk image's "strata-model" partition, ext4, mounted read-only). */
#include "os/common/errmsg.h"
#include "os/common/block_partition.h"
#include "os/init/init.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Seconds to wait for the partition: disk drivers (nvme, ahci + sd_mod, virtio_blk) probe
 * asynchronously after their module loads and scan the partition table as they go; a SATA link
 * can take seconds to come up on real hardware. */
#define PART_WAIT_S 30

static double since(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) / 1e9;
}

static int mount_partition(const char *label, char *err)
{
    char dev[300];
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int said = 0;
    while (block_find_partition(label, dev, sizeof dev)) {
        if (!said) {
            init_say("model", "waiting up to %d s for partition %s (disks probe asynchronously)",
                     PART_WAIT_S, label);
            said = 1;
        }
        if (since(&t0) >= PART_WAIT_S)
            return errmsg_set(err,
                              "strata.model=part:%s: no partition named %s after %d s "
                              "(no disk driver for this controller in the image?)",
                              label, label, PART_WAIT_S);
        struct timespec ts = {0, 50000000L};
        nanosleep(&ts, NULL);
    }
    if (said) init_say("model", "partition %s appeared after %.1f s", label, since(&t0));
    if (mkdir(INIT_MODEL_MOUNT, 0755) && errno != EEXIST)
        return errmsg_set(err, "mkdir %s: %s", INIT_MODEL_MOUNT, strerror(errno));
    if (mount(dev, INIT_MODEL_MOUNT, "ext4", MS_RDONLY | MS_NOSUID | MS_NODEV, NULL))
        return errmsg_set(err, "strata.model=part:%s: mount %s (ext4): %s", label, dev,
                          strerror(errno));
    init_say("model", "partition %s (%s) mounted read-only on %s", label, dev, INIT_MODEL_MOUNT);
    return 0;
}

int init_model(const struct boot_config *cfg, char *path, size_t cap, char *err)
{
    const char *m = cfg->model[0] ? cfg->model : INIT_DEFAULT_MODEL;
    if (!strncmp(m, "part:", 5)) {
        char label[128];
        const char *slash = strchr(m + 5, '/');
        size_t n = slash ? (size_t)(slash - (m + 5)) : strlen(m + 5);
        if (n >= sizeof label) return errmsg_set(err, "strata.model=%s: label too long", m);
        memcpy(label, m + 5, n);
        label[n] = 0;
        if (mount_partition(label, err)) return -1;
        snprintf(path, cap, "%s%s", INIT_MODEL_MOUNT, slash ? slash : INIT_DEFAULT_MODEL);
    } else {
        snprintf(path, cap, "%s", m);
    }
    struct stat st;
    if (stat(path, &st))
        return errmsg_set(
            err, "strata.model=%s: model %s: %s%s", m, path, strerror(errno),
            cfg->model[0] ? "" : " (no strata.model= given and none baked into the image)");
    if (!S_ISREG(st.st_mode)) return errmsg_set(err, "strata.model=%s: %s is not a file", m, path);
    init_say("model", "%s (%.1f MiB)", path, (double)st.st_size / (1 << 20));
    return 0;
}
