/* strata update: write a new unified kernel image into the inactive boot slot (os/boot_slots.h).
 *
 *   strata update [--tries N] [--esp DIR] FILE|http://PEER[:PORT]/PATH
 *
 * The image comes from a file or over HTTP from a peer in the cluster (os/http_fetch.h). It goes
 * into the EFI system partition mounted at DIR, or, without --esp, the partition named "EFI"
 * mounted on /run/esp for the time of the update. The new entry is on trial for N boots (default
 * 2): it becomes the loader's default, and if it never reaches /health 200 within N boots the
 * loader falls back to the slot that served before. The model partition is not touched. */
#include "os/runtime/boot_slots.h"
#include "os/common/errmsg.h"
#include "os/runtime/esp.h"
#include "os/runtime/http_fetch.h"
#include "cmd/commands.h"
#include "cmd/options.h"

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
    const struct opt table[] = {
        {"--tries", OPT_INT, &tries, 1, 9, NULL, "N"},
        {"--esp", OPT_STR, &esp, 0, 0, NULL, "DIR"},
        {"", OPT_STR, &src, 0, 0, NULL, "FILE|http://PEER/PATH"},
    };
    char perr[ERRMSG_LEN];
    if (opts_parse(table, sizeof table / sizeof table[0], argc, argv, perr)) {
        fprintf(stderr, "strata update: %s\n", perr);
        return usage();
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
    "update [--tries N] [--esp DIR] FILE|http://PEER/PATH  (a new image into the inactive boot "
    "slot)"};
