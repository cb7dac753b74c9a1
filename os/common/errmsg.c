#include "os/common/errmsg.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* Always returns -1 so callers can write `return errmsg_set(err, ...);`. */
int errmsg_set(char *err, const char *fmt, ...)
{
    if (!err) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, ERRMSG_LEN, fmt, ap);
    va_end(ap);
    return -1;
}

int errmsg_prefix(char *err, const char *fmt, ...)
{
    if (!err) return -1;
    char head[ERRMSG_LEN], tail[ERRMSG_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(head, sizeof head, fmt, ap);
    va_end(ap);
    memcpy(tail, err, ERRMSG_LEN);
    tail[ERRMSG_LEN - 1] = 0;
    size_t h = strnlen(head, ERRMSG_LEN - 1);
    memcpy(err, head, h);
    size_t t = strnlen(tail, ERRMSG_LEN - 1 - h);
    memcpy(err + h, tail, t);
    err[h + t] = 0;
    return -1;
}
