/* esp: the EFI system partition and the boot loader's variables, seen from the running appliance.
 *
 * esp_mount() finds the GPT partition named ESP_PARTNAME ("EFI", as image/build.sh names it; no
 * udev here, so the name comes from /sys/class/block/X/uevent's PARTNAME) and mounts it (vfat) on
 * dir. esp_boot_count_path() reads systemd-boot's LoaderBootCountPath variable (efivarfs, mounted
 * on /sys/firmware/efi/efivars when it is not yet): the ESP path of the entry that booted when that
 * entry is on trial; "" when the loader set none (no boot counting, or not booted by systemd-boot).
 * esp_bless_booted() is what the server calls once it serves: it marks the booted slot good
 * (os/runtime/boot_slots.h) and says what it did in one line. */
#ifndef STRATA_ESP_H
#define STRATA_ESP_H

#include <stddef.h>

#define ESP_PARTNAME "EFI"
#define ESP_MOUNT    "/run/esp"

int esp_mount(const char *dir, char *err);
void esp_unmount(const char *dir);
int esp_boot_count_path(char *path, size_t cap, char *err);

/* 0 and msg = "\EFI\Linux\strata-2-b+1-1.efi marked good (now strata-2-b.efi)" or "no boot
 * counting (...)"; -1 with err when the entry could not be renamed. */
int esp_bless_booted(char *msg, size_t cap, char *err);

#endif
