/* esp: see esp.h. */
#include "os/runtime/esp.h"
#include "os/common/block_partition.h"

#include "os/runtime/boot_slots.h"
#include "os/common/errmsg.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#define EFIVARS    "/sys/firmware/efi/efivars"
#define LOADER_VAR "LoaderBootCountPath-4a67b082-0a4c-41cf-b6c7-440b29bb8c4f"

int esp_mount(const char *dir, char *err)
{
    char dev[300];
    if (block_find_partition(ESP_PARTNAME, dev, sizeof dev))
        return errmsg_set(err, "EFI system partition: no partition named %s", ESP_PARTNAME);
    if (mkdir(dir, 0755) && errno != EEXIST)
        return errmsg_set(err, "mkdir %s: %s", dir, strerror(errno));
    if (mount(dev, dir, "vfat", MS_NOSUID | MS_NODEV | MS_NOEXEC, "umask=0077") && errno != EBUSY)
        return errmsg_set(err, "mount %s (vfat) on %s: %s", dev, dir, strerror(errno));
    return 0;
}

void esp_unmount(const char *dir)
{
    sync();
    umount2(dir, 0);
}

int esp_boot_count_path(char *path, size_t cap, char *err)
{
    path[0] = 0;
    if (access("/sys/firmware/efi", F_OK)) return 0; /* not booted by UEFI */
    if (access(EFIVARS "/" LOADER_VAR, F_OK) &&
        mount("efivarfs", EFIVARS, "efivarfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) &&
        errno != EBUSY)
        return errmsg_set(err, "mount efivarfs on %s: %s", EFIVARS, strerror(errno));
    int fd = open(EFIVARS "/" LOADER_VAR, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT) return 0;
        return errmsg_set(err, "%s: %s", LOADER_VAR, strerror(errno));
    }
    /* 4 bytes of attributes, then UTF-16LE, NUL-terminated: the path is ASCII in practice. */
    unsigned char buf[4 + 2 * 512];
    ssize_t n = read(fd, buf, sizeof buf);
    close(fd);
    if (n < 4) return errmsg_set(err, "%s: short read", LOADER_VAR);
    size_t o = 0;
    for (ssize_t i = 4; i + 1 < n && o + 1 < cap; i += 2) {
        unsigned c = buf[i] | (unsigned)buf[i + 1] << 8;
        if (!c) break;
        if (c > 0x7e || c < 0x20) return errmsg_set(err, "%s: not an ASCII path", LOADER_VAR);
        path[o++] = (char)c;
    }
    path[o] = 0;
    return 0;
}

int esp_bless_booted(char *msg, size_t cap, char *err)
{
    char path[512], blessed[BOOT_SLOTS_NAME];
    if (esp_boot_count_path(path, sizeof path, err)) return -1;
    if (!path[0]) {
        snprintf(msg, cap, "no boot counting (the loader set no LoaderBootCountPath)");
        return 0;
    }
    if (esp_mount(ESP_MOUNT, err)) return errmsg_prefix(err, "marking %s good: ", path);
    int rc = boot_slots_bless(ESP_MOUNT, path, blessed, sizeof blessed, err);
    esp_unmount(ESP_MOUNT);
    if (rc) return -1;
    if (blessed[0])
        snprintf(msg, cap, "%s marked good (now %s)", path, blessed);
    else
        snprintf(msg, cap, "%s is already good", path);
    return 0;
}
