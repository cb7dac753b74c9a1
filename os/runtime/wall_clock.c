#include "os/runtime/wall_clock.h"

#include <stdatomic.h>
#include <time.h>

static atomic_llong offset_ms;

uint64_t wall_clock_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int64_t ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000 + atomic_load(&offset_ms);
    return ms > 0 ? (uint64_t)ms : 0;
}

void wall_clock_set_offset_ms(int64_t off_ms)
{
    atomic_store(&offset_ms, off_ms);
}

int64_t wall_clock_offset_ms(void)
{
    return atomic_load(&offset_ms);
}
