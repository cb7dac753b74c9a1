#include "os/runtime/arena.h"

#include "os/common/errmsg.h"
#include "os/runtime/log.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define HUGE_2M (2u << 20)

size_t arena_round(size_t size)
{
    return (size + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
}

/* A /proc/meminfo field ("MemAvailable: %llu kB" style), or 0 if absent. */
static unsigned long long meminfo(const char *fmt)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long v = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, fmt, &v) == 1) break;
    fclose(f);
    return v;
}

static size_t mem_available(void)
{
    return (size_t)meminfo("MemAvailable: %llu kB") * 1024;
}

int arena_open(struct arena *a, size_t size, unsigned flags, char *err)
{
    memset(a, 0, sizeof *a);
    if (size == 0) size = ARENA_ALIGN;
    size_t avail = mem_available();
    if (avail && size > avail)
        return errmsg_set(err, "arena: need %zu MiB but only %zu MiB of memory is available",
                          size >> 20, avail >> 20);

    void *p = MAP_FAILED;
    size_t huge_size = (size + HUGE_2M - 1) & ~(size_t)(HUGE_2M - 1);
    size_t huge_free = (size_t)meminfo("HugePages_Free: %llu") * HUGE_2M;
    if (!(flags & ARENA_NO_HUGEPAGES) && huge_free < huge_size)
        log_info("arena", "%zu MiB of free hugepages for %zu MiB; asking for transparent ones",
                 huge_free >> 20, huge_size >> 20);
    else if (!(flags & ARENA_NO_HUGEPAGES)) {
        p = mmap(NULL, huge_size, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB | MAP_POPULATE, -1, 0);
        if (p != MAP_FAILED) {
            a->hugepages = 1;
            a->size = huge_size;
        } else {
            log_warn("arena", "no 2 MiB hugepages for %zu MiB (%s); asking for transparent ones",
                     huge_size >> 20, strerror(errno));
        }
    }
    if (p == MAP_FAILED && !(flags & ARENA_NO_HUGEPAGES)) {
        /* No reserved hugepages: ask for transparent ones (THP in "madvise" mode), on a 2 MiB
         * aligned range. Decode streams the whole weight image per token; with 4 KiB pages the
         * hardware prefetcher stops at every page boundary and every page costs a TLB miss. */
        size_t len = huge_size + HUGE_2M;
        uint8_t *q = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (q != MAP_FAILED) {
            uint8_t *al = (uint8_t *)(((uintptr_t)q + HUGE_2M - 1) & ~(uintptr_t)(HUGE_2M - 1));
            if (al > q) munmap(q, (size_t)(al - q));
            if (q + len > al + huge_size)
                munmap(al + huge_size, (size_t)(q + len - al - huge_size));
            madvise(al, huge_size, MADV_HUGEPAGE);
            p = al;
            a->size = huge_size;
        }
    }
    if (p == MAP_FAILED) {
        size_t page = (size_t)sysconf(_SC_PAGESIZE);
        a->size = (size + page - 1) & ~(page - 1);
        p = mmap(NULL, a->size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            return errmsg_set(err, "arena: mmap of %zu MiB failed: %s", a->size >> 20,
                              strerror(errno));
    }
    a->base = p;
    if (!(flags & ARENA_NO_LOCK)) {
        if (mlock(a->base, a->size) == 0)
            a->locked = 1;
        else
            log_warn("arena", "mlock of %zu MiB failed (%s); memory may page out", a->size >> 20,
                     strerror(errno));
    }
    return 0;
}

void *arena_carve(struct arena *a, const char *name, size_t size, char *err)
{
    size_t need = arena_round(size);
    if (a->n_pools == ARENA_MAX_POOLS) {
        errmsg_set(err, "arena: pool %s: more than %d pools", name, ARENA_MAX_POOLS);
        return NULL;
    }
    if (need > a->size - a->used) {
        errmsg_set(err, "arena: pool %s needs %zu bytes but only %zu of %zu are left", name, need,
                   a->size - a->used, a->size);
        return NULL;
    }
    struct arena_pool *pool = &a->pools[a->n_pools++];
    pool->name = name;
    pool->offset = a->used;
    pool->size = need;
    a->used += need;
    /* Anonymous mappings start zeroed; pools are never reused, so no memset is needed. */
    return a->base + pool->offset;
}

const struct arena_pool *arena_find(const struct arena *a, const char *name)
{
    for (int i = 0; i < a->n_pools; i++)
        if (strcmp(a->pools[i].name, name) == 0) return &a->pools[i];
    return NULL;
}

void arena_close(struct arena *a)
{
    if (a->base) {
        if (a->locked) munlock(a->base, a->size);
        munmap(a->base, a->size);
    }
    memset(a, 0, sizeof *a);
}
