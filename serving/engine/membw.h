/* membw: the machine's memory read bandwidth, measured now, so benchmarks can print their
 * figures beside the limit they are chasing (decode reads every weight once per token).
 *
 * membw_read_gbs(threads) streams through a 1 GiB buffer (far larger than any last-level cache)
 * with `threads` threads, each reading its own contiguous slice with wide loads, and returns the
 * best of a few passes in GB/s (10^9 bytes per second), or -1 if the buffer cannot be had. It
 * takes about a second. */
#ifndef STRATA_MEMBW_H
#define STRATA_MEMBW_H

double membw_read_gbs(int threads);

#endif
