/* strata update: write a new unified kernel image into the inactive boot slot (os/runtime/boot_slots.h).
 *
 *   strata update [--tries N] [--esp DIR] FILE|http://PEER[:PORT]/PATH
 *
 * The image comes from a file or over HTTP from a peer in the cluster (os/runtime/http_fetch.h). It goes
 * into the EFI system partition mounted at DIR, or, without --esp, the partition named "EFI"
 * mounted on /run/esp for the time of the update. The new entry is on trial for N boots (default
 * 2): it becomes the loader's default, and if it never reaches /health 200 within N boots the
 * loader falls back to the slot that served before. The model partition is not touched. */
#include "os/runtime/boot_slots.h"
#include "os/common/errmsg.h"
#include "os/runtime/esp.h"
#include "os/runtime/http_fetch.h"
#include "cmd/commands.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int usage(void)
{
    fprintf(stderr, "usage: strata update [--tries N] [--esp DIR] FILE|http://PEER[:PORT]/PATH\n");
    return 2;
}

static int run_update(int argc, char **argv)
{
    const char *esp = NULL, *src = NULL;
    int tries = 2;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tries") && i + 1 < argc) {
            char *end;
            long t = strtol(argv[++i], &end, 10);
            if (*end || t < 1 || t > 9) {
                fprintf(stderr, "strata update: --tries %s: want 1..9\n", argv[i]);
                return 2;
            }
            tries = (int)t;
        } else if (!strcmp(argv[i], "--esp") && i + 1 < argc) {
            esp = argv[++i];
        } else if (argv[i][0] == '-' || src) {
            return usage();
        } else {
            src = argv[i];
        }
    }
    if (!src) return usage();

    char err[ERRMSG_LEN], tmp[64] = "", installed[BOOT_SLOTS_NAME];
    const char *image = src;
    if (!strncmp(src, "http://", 7)) {
        snprintf(tmp, sizeof tmp, "/tmp/strata-update.XXXXXX");
        int fd = mkstemp(tmp);
        if (fd < 0) {
            fprintf(stderr, "strata update: %s: cannot create a temporary file\n", tmp);
            return 1;
        }
        close(fd);
        long long bytes;
        fprintf(stderr, "strata update: fetching %s\n", src);
        if (http_fetch(src, tmp, &bytes, err)) {
            fprintf(stderr, "strata update: %s\n", err);
            unlink(tmp);
            return 1;
        }
        fprintf(stderr, "strata update: fetched %lld bytes\n", bytes);
        image = tmp;
    }
    int mounted = 0, rc = 0;
    if (!esp) {
        if (esp_mount(ESP_MOUNT, err)) {
            fprintf(stderr, "strata update: %s\n", err);
            rc = 1;
            goto out;
        }
        esp = ESP_MOUNT;
        mounted = 1;
    }
    if (boot_slots_install(esp, image, tries, installed, sizeof installed, err)) {
        fprintf(stderr, "strata update: %s\n", err);
        rc = 1;
    } else {
        printf("strata update: %s/%s/%s written: the next boot tries it %d time%s, then falls "
               "back\n",
               esp, BOOT_SLOTS_DIR, installed, tries, tries > 1 ? "s" : "");
    }
    if (mounted) esp_unmount(esp);
out:
    if (tmp[0]) unlink(tmp);
    return rc;
}

const struct command cmd_update = {
    "update", run_update,
    "update [--tries N] [--esp DIR] FILE|http://PEER[:PORT]/PATH (a new image into the inactive "
    "boot slot)"};
