#include "os/common/small_file.h"

#include "os/common/errmsg.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

int small_file_read(const char *path, char *buf, size_t cap, char *err)
{
    buf[0] = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errmsg_set(err, "%s: %s", path, strerror(errno));
    ssize_t n = read(fd, buf, cap - 1);
    int e = errno;
    close(fd);
    if (n < 0) return errmsg_set(err, "%s: %s", path, strerror(e));
    buf[n] = 0;
    return (int)n;
}
