/* boot_slots: the appliance's two boot slots on the EFI system partition, firmware style.
 *
 * The disk's ESP holds systemd-boot (\EFI\BOOT\BOOTX64.EFI) and, in \EFI\Linux, one unified kernel
 * image per slot, named
 *     strata-GEN-SLOT[+LEFT[-DONE]].efi        e.g. strata-1-a.efi, strata-2-b+2.efi
 * GEN is the generation (1 for the image as built, +1 per update), SLOT is a or b. A name with a
 * "+LEFT[-DONE]" counter is on trial: systemd-boot's boot counting (Automatic Boot Assessment)
 * renames it to +LEFT-1-DONE+1 before each boot of it, and once LEFT is 0 the entry is bad and
 * sorted before every other, so the loader's default (the last entry in version order that is not
 * bad) is the newest generation still good or on trial. A name without a counter is good.
 *
 * An update writes the slot that is not the newest good one, as GEN+1 with a counter of N tries,
 * after removing whatever that slot held; the model partition is untouched. When the new image
 * has served (/health 200), the server renames its entry to drop the counter, as
 * systemd-bless-boot does. Names are handled here without I/O; boot_slots_install/bless do the
 * file operations on a mounted ESP directory (the caller mounts it: os/esp.h). */
#ifndef STRATA_BOOT_SLOTS_H
#define STRATA_BOOT_SLOTS_H

#include <stddef.h>

#define BOOT_SLOTS_DIR  "EFI/Linux" /* relative to the ESP's root */
#define BOOT_SLOTS_NAME 64          /* longest entry name handled */

struct boot_entry {
    unsigned gen;
    char slot;      /* 'a' or 'b' */
    int left, done; /* the counter; -1 when absent (left -1: good, not on trial) */
};

/* 0 and *e when name is one of ours (case-insensitive, as FAT and systemd-boot are), else -1. */
int boot_entry_parse(const char *name, struct boot_entry *e);

/* The update plan for a directory holding names[0..n): *slot gets the slot to write, new_name the
 * entry to create (strata-GEN-SLOT+TRIES.efi), and every existing name of that slot is listed in
 * remove[] (*n_remove, at most n). -1 with err when no entry is good (nothing to fall back to) or
 * tries is not 1..9. */
int boot_slots_plan(const char *const *names, int n, int tries, char *slot, char *new_name,
                    size_t cap, int *remove, int *n_remove, char *err);

/* The good name for an entry on trial: the name without its counter. -1 when name is not ours or
 * has no counter. */
int boot_entry_blessed_name(const char *name, char *out, size_t cap);

/* Install image (a file) into the ESP mounted at esp: copy under a temporary name, fsync, rename
 * to the planned name, remove the slot's old entries. installed gets the new entry's name. */
int boot_slots_install(const char *esp, const char *image, int tries, char *installed, size_t cap,
                       char *err);

/* Mark the booted entry good: path is the loader's LoaderBootCountPath
 * ("\EFI\Linux\strata-2-b+1-1.efi"); renames it in the ESP mounted at esp. blessed gets the new
 * name, or "" when the entry had no counter (nothing to do). */
int boot_slots_bless(const char *esp, const char *path, char *blessed, size_t cap, char *err);

#endif
