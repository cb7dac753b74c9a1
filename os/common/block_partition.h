/* block_partition: find a GPT partition by its name without udev (the appliance has none, so no
 * /dev/disk/by-partlabel): the block device whose /sys/class/block/NAME/uevent says
 * PARTNAME=label. Shared by init (the model partition) and the server (the EFI system partition). */
#ifndef STRATA_BLOCK_PARTITION_H
#define STRATA_BLOCK_PARTITION_H

#include <stddef.h>

/* 0 and "/dev/NAME" in dev, or -1 when no partition has that name (yet: disks probe
 * asynchronously, callers poll). */
int block_find_partition(const char *label, char *dev, size_t cap);

#endif
