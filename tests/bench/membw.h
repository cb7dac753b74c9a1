/* membw: the machine's memory read bandwidth, measured now, so benchmarks can print their
 * figures beside the limit they are chasing (decode reads every weight once per token).
 *
 * membw_read_gbs(threads) streams through a 1 GiB buffer (far larger than any last-level cache)
 * with `threads` threads, each reading its own contiguous slice with wide loads, and returns the
 * best of a few passes in GB/s (10^9 bytes per second), or -1 if the buffer cannot be had. It
 * takes about a second. */
#ifndef STRATA_MEMBW_H
#define STRATA_MEMBW_H

#include <stddef.h>

double membw_read_gbs(int threads);

/* The same probe in steps, for a benchmark that interleaves passes with its own work so that
 * both see the same machine (others' load on a shared host moves bandwidth by a third within
 * seconds): open touches a `bytes` buffer once; each pass reads it all and returns GB/s. */
struct membw;
struct membw *membw_open(int threads, size_t bytes);
double membw_pass(struct membw *m);
void membw_close(struct membw *m);

#endif
