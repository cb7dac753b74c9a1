/* arena: the one pinned allocation of the process, carved into pools.
 *
 * At start-up the process computes every pool's size from the model config and the serving limits
 * (arena_plan), then reserves the whole arena at once: 2 MiB hugepages when the kernel has them
 * reserved, otherwise a 2 MiB aligned mapping with madvise(MADV_HUGEPAGE) (transparent hugepages
 * where the kernel allows them), and mlock()s it so it never pages out. The
 * arena is later registered once with each device (ibv_reg_mr, cudaHostRegister,
 * rte_extmem_register) instead of per tensor. Pools are carved with a bump allocator and never
 * freed individually; arena_close releases everything.
 *
 * If the plan does not fit the machine, arena_open fails with one line that gives the numbers. */
#ifndef STRATA_ARENA_H
#define STRATA_ARENA_H

#include <stddef.h>
#include <stdint.h>

#define ARENA_MAX_POOLS 16
#define ARENA_ALIGN     64

struct arena_pool {
    const char *name; /* "weights", "kv", "activations", "net" */
    size_t offset;
    size_t size;
};

struct arena {
    uint8_t *base;
    size_t size;   /* bytes mapped (rounded up to the page size) */
    size_t used;   /* bump pointer */
    int hugepages; /* 1 if backed by 2 MiB hugepages */
    int locked;    /* 1 if mlock succeeded */
    int n_pools;
    struct arena_pool pools[ARENA_MAX_POOLS];
};

/* Reserve `size` bytes. flags: ARENA_NO_HUGEPAGES to skip the hugepage attempt (tests),
 * ARENA_NO_LOCK to skip mlock. Fails when `size` exceeds available memory (the message gives
 * the requested size and MemAvailable). */
#define ARENA_NO_HUGEPAGES 1u
#define ARENA_NO_LOCK      2u
int arena_open(struct arena *a, size_t size, unsigned flags, char *err);

/* Carve a named pool of `size` bytes aligned to ARENA_ALIGN. Returns NULL and writes err when the
 * arena is exhausted (naming the pool, its size and what is left). Memory is zeroed. */
void *arena_carve(struct arena *a, const char *name, size_t size, char *err);

/* The pool named `name`, or NULL. */
const struct arena_pool *arena_find(const struct arena *a, const char *name);

void arena_close(struct arena *a);

/* Bytes needed for a list of pool sizes, each rounded up to ARENA_ALIGN. */
size_t arena_round(size_t size);

#endif
