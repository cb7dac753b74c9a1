#include "serving/sched/prefix_cache.h"

#include "os/common/errmsg.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Per block: the entry it is registered under (gen 0 = none: kv generations start at 1 once a
 * block is handed out), its tokens, and its place in a hash bucket's chain. */
struct entry {
    uint64_t hash;
    unsigned gen;        /* the block's generation when registered */
    int parent;          /* -1: the first block of its sequence */
    unsigned parent_gen; /* the parent's generation then */
    int bucket;          /* -1: in no chain */
    int chain;           /* the next block in its bucket, -1 */
};

struct prefix_cache {
    struct kv_cache *kv;
    int bs, n_buckets; /* a power of two */
    struct entry *e;   /* per block */
    int *tok;          /* per block: block_size tokens */
    int *bucket;       /* first block of each chain, -1 */
};

#define HASH_START 0xcbf29ce484222325ull /* FNV-1a's offset basis */

/* The hash of a prefix: h (the tokens before) and n more tokens. */
static uint64_t mix(uint64_t h, const int *tok, int n)
{
    for (int i = 0; i < n; i++) {
        h ^= (uint32_t)tok[i];
        h *= 0x100000001b3ull; /* FNV-1a's prime over 32-bit words */
        h ^= h >> 29;
    }
    return h;
}

static int live(const struct prefix_cache *p, int b)
{
    return p->e[b].gen && p->e[b].gen == p->kv->gen[b];
}

static void unchain(struct prefix_cache *p, int b)
{
    struct entry *e = &p->e[b];
    if (e->bucket < 0) return;
    int *at = &p->bucket[e->bucket];
    while (*at >= 0 && *at != b) at = &p->e[*at].chain;
    if (*at == b) *at = e->chain;
    e->bucket = e->chain = -1;
    e->gen = 0;
}

struct prefix_cache *prefix_cache_new(struct kv_cache *kv, char *err)
{
    struct prefix_cache *p = calloc(1, sizeof *p);
    int nb = kv->n_blocks, n = 1;
    while (n < nb) n *= 2;
    if (p) {
        p->kv = kv;
        p->bs = kv->block_size;
        p->n_buckets = n;
        p->e = calloc((size_t)nb, sizeof *p->e);
        p->tok = malloc((size_t)nb * (size_t)kv->block_size * sizeof *p->tok);
        p->bucket = malloc((size_t)n * sizeof *p->bucket);
    }
    if (!p || !p->e || !p->tok || !p->bucket) {
        prefix_cache_free(p);
        errmsg_set(err, "prefix cache: out of memory for %d blocks", nb);
        return NULL;
    }
    for (int b = 0; b < nb; b++) p->e[b].bucket = p->e[b].chain = -1;
    for (int i = 0; i < n; i++) p->bucket[i] = -1;
    return p;
}

void prefix_cache_free(struct prefix_cache *p)
{
    if (!p) return;
    free(p->e);
    free(p->tok);
    free(p->bucket);
    free(p);
}

/* The live block registered with these tokens after `parent` (generation parent_gen), or -1. A
 * dead entry met on the way leaves its chain. */
static int find(struct prefix_cache *p, uint64_t h, const int *tok, int parent, unsigned parent_gen)
{
    int at = p->bucket[h & (uint64_t)(p->n_buckets - 1)];
    while (at >= 0) {
        int next = p->e[at].chain;
        if (!live(p, at)) {
            unchain(p, at);
        } else if (p->e[at].hash == h && p->e[at].parent == parent &&
                   (parent < 0 || p->e[at].parent_gen == parent_gen) &&
                   !memcmp(p->tok + (size_t)at * p->bs, tok, (size_t)p->bs * sizeof *tok)) {
            return at;
        }
        at = next;
    }
    return -1;
}

int prefix_cache_match(struct prefix_cache *p, const int *tok, int n, int *blocks, int max_blocks)
{
    uint64_t h = HASH_START;
    int got = 0, parent = -1;
    unsigned parent_gen = 0;
    for (int j = 0; j < max_blocks && (j + 1) * p->bs <= n; j++) {
        h = mix(h, tok + (size_t)j * p->bs, p->bs);
        int b = find(p, h, tok + (size_t)j * p->bs, parent, parent_gen);
        if (b < 0 || kv_block_ref(p->kv, b)) break;
        blocks[got++] = b;
        parent = b;
        parent_gen = p->kv->gen[b];
    }
    return got;
}

void prefix_cache_add(struct prefix_cache *p, const int *tok, const int *blocks, int j)
{
    int b = blocks[j], parent = j ? blocks[j - 1] : -1;
    if (live(p, b)) return;                      /* registered already (a block taken by a match) */
    if (parent >= 0 && !live(p, parent)) return; /* its prefix is not findable: nor is it */
    /* the parent's entry holds the hash of the tokens up to it: add this block's */
    uint64_t h = mix(parent >= 0 ? p->e[parent].hash : HASH_START, tok + (size_t)j * p->bs, p->bs);
    unsigned parent_gen = parent >= 0 ? p->kv->gen[parent] : 0;
    if (find(p, h, tok + (size_t)j * p->bs, parent, parent_gen) >= 0) return; /* a twin has it */
    unchain(p, b); /* a dead entry of its last life */
    struct entry *e = &p->e[b];
    *e = (struct entry){.hash = h,
                        .gen = p->kv->gen[b],
                        .parent = parent,
                        .parent_gen = parent_gen,
                        .bucket = (int)(h & (uint64_t)(p->n_buckets - 1))};
    memcpy(p->tok + (size_t)b * p->bs, tok + (size_t)j * p->bs, (size_t)p->bs * sizeof *tok);
    e->chain = p->bucket[e->bucket];
    p->bucket[e->bucket] = b;
}

void prefix_cache_clear(struct prefix_cache *p)
{
    for (int b = 0; b < p->kv->n_blocks; b++) unchain(p, b);
}

int prefix_cache_entries(const struct prefix_cache *p)
{
    int n = 0;
    for (int b = 0; b < p->kv->n_blocks; b++) n += live(p, b);
    return n;
}
