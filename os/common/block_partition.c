#include "os/common/block_partition.h"
#include "os/common/small_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int block_find_partition(const char *label, char *dev, size_t cap)
{
    DIR *d = opendir("/sys/class/block");
    if (!d) return -1;
    int found = -1;
    for (struct dirent *e; found && (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char path[300], buf[1024];
        snprintf(path, sizeof path, "/sys/class/block/%s/uevent", e->d_name);
        if (small_file_read(path, buf, sizeof buf, NULL) <= 0) continue;
        for (char *save = NULL, *l = strtok_r(buf, "\n", &save); l; l = strtok_r(NULL, "\n", &save))
            if (!strncmp(l, "PARTNAME=", 9) && !strcmp(l + 9, label)) {
                snprintf(dev, cap, "/dev/%s", e->d_name);
                found = 0;
            }
    }
    closedir(d);
    return found;
}
