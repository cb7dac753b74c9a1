/* wall_clock: the wall clock (CLOCK_REALTIME, milliseconds since the epoch) the server reads for
 * the times it stamps or compares with another machine's: the leader's stamp on each log command,
 * a signed request's skew. Durations use the monotonic clock (os/runtime/clock.h) instead.
 * A test hook (cmd/test_hooks.h, --test-clock-file) may move it by an offset, as an NTP step moves
 * the real one, to test clock jumps on a shared machine; nothing else sets the offset. Any thread. */
#ifndef STRATA_WALL_CLOCK_H
#define STRATA_WALL_CLOCK_H

#include <stdint.h>

uint64_t wall_clock_ms(void);
void wall_clock_set_offset_ms(int64_t off_ms);
int64_t wall_clock_offset_ms(void);

#endif
