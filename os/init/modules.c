/* Kernel modules, in the order image/mkinitrd.sh wrote into /etc/modules (dependencies first,
 * from modinfo depends=: Debian's kernel package has no modules.dep and init has no modprobe). */
#include "os/common/errmsg.h"
#include "os/init/init.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static int load_one(const char *path, char *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errmsg_set(err, "%s: %s", path, strerror(errno));
    long rc = syscall(SYS_finit_module, fd, "", 0);
    int e = errno;
    close(fd);
    if (rc && e != EEXIST) return errmsg_set(err, "%s: finit_module: %s", path, strerror(e));
    return 0;
}

int init_modules(const char *list, int *loaded, int *failed, char *err)
{
    *loaded = *failed = 0;
    FILE *f = fopen(list, "re");
    if (!f) {
        if (errno == ENOENT) return 0; /* an image without modules */
        return errmsg_set(err, "%s: %s", list, strerror(errno));
    }
    char path[512], why[ERRMSG_LEN];
    while (fgets(path, sizeof path, f)) {
        path[strcspn(path, "\r\n")] = 0;
        if (!path[0] || path[0] == '#') continue;
        const char *name = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
        if (load_one(path, why)) {
            init_say("modules", "warning: %s (continuing: the hardware may be absent)", why);
            (*failed)++;
        } else {
            init_say("modules", "%s", name);
            (*loaded)++;
        }
    }
    fclose(f);
    return 0;
}
