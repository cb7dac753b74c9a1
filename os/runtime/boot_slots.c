/* boot_slots: see boot_slots.h. */
#include "os/runtime/boot_slots.h"

#include "os/common/errmsg.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

/* Digits at *p as an int (at most 6 of them); advances *p. -1 when none. */
static long digits(const char **p)
{
    long v = 0;
    int n = 0;
    while (isdigit((unsigned char)**p) && n < 6) v = v * 10 + (*(*p)++ - '0'), n++;
    if (isdigit((unsigned char)**p)) return -1;
    return n ? v : -1;
}

int boot_entry_parse(const char *name, struct boot_entry *e)
{
    const char *p = name;
    if (strncasecmp(p, "strata-", 7)) return -1;
    p += 7;
    long gen = digits(&p);
    if (gen < 1 || *p++ != '-') return -1;
    char slot = (char)tolower((unsigned char)*p++);
    if (slot != 'a' && slot != 'b') return -1;
    long left = -1, done = -1;
    if (*p == '+') {
        p++;
        if ((left = digits(&p)) < 0) return -1;
        if (*p == '-') {
            p++;
            if ((done = digits(&p)) < 0) return -1;
        }
    }
    if (strcasecmp(p, ".efi")) return -1;
    e->gen = (unsigned)gen;
    e->slot = slot;
    e->left = (int)left;
    e->done = (int)done;
    return 0;
}

int boot_slots_plan(const char *const *names, int n, int tries, char *slot, char *new_name,
                    size_t cap, int *remove, int *n_remove, char *err)
{
    if (tries < 1 || tries > 9) return errmsg_set(err, "boot slots: tries %d (want 1..9)", tries);
    unsigned max_gen = 0, good_gen = 0;
    char good_slot = 0;
    struct boot_entry e;
    for (int i = 0; i < n; i++) {
        if (boot_entry_parse(names[i], &e)) continue;
        if (e.gen > max_gen) max_gen = e.gen;
        if (e.left == -1 && e.gen >= good_gen) good_gen = e.gen, good_slot = e.slot;
    }
    if (!good_slot)
        return errmsg_set(err, "boot slots: no good entry in %s (nothing to fall back to)",
                          BOOT_SLOTS_DIR);
    *slot = good_slot == 'a' ? 'b' : 'a';
    *n_remove = 0;
    for (int i = 0; i < n; i++)
        if (!boot_entry_parse(names[i], &e) && e.slot == *slot) remove[(*n_remove)++] = i;
    if ((size_t)snprintf(new_name, cap, "strata-%u-%c+%d.efi", max_gen + 1, *slot, tries) >= cap)
        return errmsg_set(err, "boot slots: name too long");
    return 0;
}

int boot_entry_blessed_name(const char *name, char *out, size_t cap)
{
    struct boot_entry e;
    if (boot_entry_parse(name, &e) || e.left < 0) return -1;
    if ((size_t)snprintf(out, cap, "strata-%u-%c.efi", e.gen, e.slot) >= cap) return -1;
    return 0;
}

/* The names in esp/EFI/Linux (at most max, each < BOOT_SLOTS_NAME). */
static int list_dir(const char *dir, char names[][BOOT_SLOTS_NAME], int max, int *n, char *err)
{
    DIR *d = opendir(dir);
    if (!d) return errmsg_set(err, "%s: %s", dir, strerror(errno));
    *n = 0;
    for (struct dirent *de; (de = readdir(d)) && *n < max;) {
        if (de->d_name[0] == '.' || strlen(de->d_name) >= BOOT_SLOTS_NAME) continue;
        snprintf(names[(*n)++], BOOT_SLOTS_NAME, "%s", de->d_name);
    }
    closedir(d);
    return 0;
}

static int copy_file(const char *src, const char *dst, char *err)
{
    int in = open(src, O_RDONLY | O_CLOEXEC);
    if (in < 0) return errmsg_set(err, "%s: %s", src, strerror(errno));
    int out = open(dst, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out < 0) {
        errmsg_set(err, "%s: %s", dst, strerror(errno));
        close(in);
        return -1;
    }
    static char buf[1 << 16];
    int rc = 0;
    for (;;) {
        ssize_t r = read(in, buf, sizeof buf);
        if (r < 0) {
            rc = errmsg_set(err, "%s: read: %s", src, strerror(errno));
            break;
        }
        if (r == 0) break;
        for (ssize_t off = 0; off < r;) {
            ssize_t w = write(out, buf + off, (size_t)(r - off));
            if (w < 0) {
                rc = errmsg_set(err, "%s: write: %s", dst, strerror(errno));
                break;
            }
            off += w;
        }
        if (rc) break;
    }
    if (!rc && fsync(out)) rc = errmsg_set(err, "%s: fsync: %s", dst, strerror(errno));
    close(in);
    if (close(out) && !rc) rc = errmsg_set(err, "%s: close: %s", dst, strerror(errno));
    return rc;
}

/* A UKI is a PE file: "MZ", and "PE\0\0" where the header at 0x3c points. Anything else (an HTML
 * error page, a truncated download) must not become a boot entry. */
static int check_pe(const char *path, char *err)
{
    unsigned char h[64], sig[4];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errmsg_set(err, "%s: %s", path, strerror(errno));
    int ok = pread(fd, h, sizeof h, 0) == (ssize_t)sizeof h && h[0] == 'M' && h[1] == 'Z';
    if (ok) {
        off_t pe = (off_t)(h[60] | h[61] << 8 | h[62] << 16 | (unsigned)h[63] << 24);
        ok = pread(fd, sig, 4, pe) == 4 && !memcmp(sig, "PE\0\0", 4);
    }
    close(fd);
    if (!ok) return errmsg_set(err, "%s: not an EFI (PE) image", path);
    return 0;
}

int boot_slots_install(const char *esp, const char *image, int tries, char *installed, size_t cap,
                       char *err)
{
    if (check_pe(image, err)) return -1;
    char dir[512], tmp[640], dst[640];
    snprintf(dir, sizeof dir, "%s/%s", esp, BOOT_SLOTS_DIR);
    static char names[64][BOOT_SLOTS_NAME];
    const char *ptrs[64];
    int n = 0, remove[64], n_remove = 0;
    char slot;
    if (list_dir(dir, names, 64, &n, err)) return -1;
    for (int i = 0; i < n; i++) ptrs[i] = names[i];
    if (boot_slots_plan(ptrs, n, tries, &slot, installed, cap, remove, &n_remove, err)) return -1;
    /* Remove the slot's old entries first: the ESP may have room for only two images. */
    for (int i = 0; i < n_remove; i++) {
        snprintf(dst, sizeof dst, "%s/%s", dir, names[remove[i]]);
        if (unlink(dst)) return errmsg_set(err, "%s: unlink: %s", dst, strerror(errno));
    }
    /* The temporary name does not end in .efi: the loader never sees a half-written entry. */
    snprintf(tmp, sizeof tmp, "%s/strata-%c.new", dir, slot);
    snprintf(dst, sizeof dst, "%s/%s", dir, installed);
    if (copy_file(image, tmp, err)) {
        unlink(tmp);
        return -1;
    }
    if (rename(tmp, dst)) return errmsg_set(err, "rename %s -> %s: %s", tmp, dst, strerror(errno));
    sync();
    return 0;
}

int boot_slots_bless(const char *esp, const char *path, char *blessed, size_t cap, char *err)
{
    blessed[0] = 0;
    const char *base = path;
    for (const char *p = path; *p; p++)
        if (*p == '\\' || *p == '/') base = p + 1;
    char good[BOOT_SLOTS_NAME];
    struct boot_entry e;
    if (boot_entry_parse(base, &e))
        return errmsg_set(err, "boot entry %s: not a strata slot entry", path);
    if (e.left < 0) return 0;
    boot_entry_blessed_name(base, good, sizeof good);
    char from[640], to[640];
    snprintf(from, sizeof from, "%s/%s/%s", esp, BOOT_SLOTS_DIR, base);
    snprintf(to, sizeof to, "%s/%s/%s", esp, BOOT_SLOTS_DIR, good);
    if (rename(from, to)) return errmsg_set(err, "rename %s -> %s: %s", from, to, strerror(errno));
    sync();
    snprintf(blessed, cap, "%s", good);
    return 0;
}
