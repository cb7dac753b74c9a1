#include "os/runtime/log.h"
#include "os/runtime/clock.h"

#include <stdarg.h>
#include <stdio.h>
#include <time.h>

static int quiet;

void log_set_quiet(int q)
{
    quiet = q;
}

static void emit(const char *level, const char *subsys, const char *fmt, va_list ap)
{
    char line[1024];
    vsnprintf(line, sizeof line, fmt, ap);
    /* One fprintf per line so lines from different threads do not interleave. */
    fprintf(stderr, "[%9.3f] %s%s: %s\n", clock_now(), level, subsys, line);
}

void log_info(const char *subsys, const char *fmt, ...)
{
    if (quiet) return;
    va_list ap;
    va_start(ap, fmt);
    emit("", subsys, fmt, ap);
    va_end(ap);
}

void log_warn(const char *subsys, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    emit("warning: ", subsys, fmt, ap);
    va_end(ap);
}

void log_error(const char *subsys, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    emit("error: ", subsys, fmt, ap);
    va_end(ap);
}
