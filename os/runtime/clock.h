/* clock: the one monotonic clock every part of the server, its tests and its benchmarks read.
 * CLOCK_MONOTONIC: never jumps with the wall clock (NTP, DHCP), counts from an arbitrary origin,
 * so only differences mean anything. */
#ifndef STRATA_CLOCK_H
#define STRATA_CLOCK_H

#include <stdint.h>

double clock_now(void);      /* seconds */
uint64_t clock_now_ns(void); /* nanoseconds */

#endif
