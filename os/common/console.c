#include "os/common/console.h"

#include "os/common/errmsg.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

void console_vsay(const char *prefix, const char *fmt, va_list ap)
{
    char line[ERRMSG_LEN + 64];
    int n = snprintf(line, sizeof line, "%s", prefix);
    if (n < 0) return;
    if ((size_t)n > sizeof line - 2) n = (int)sizeof line - 2;
    vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    size_t len = strlen(line);
    line[len++] = '\n';
    if (write(2, line, len) < 0) (void)0; /* nowhere else to say it */
}

void console_say(const char *prefix, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    console_vsay(prefix, fmt, ap);
    va_end(ap);
}
