/* kv_cache: the paged key/value cache.
 *
 * The cache is n_blocks fixed-size blocks of block_size token positions, carved from the arena's
 * "kv" pool. A block holds, for every layer, the keys and values of block_size positions:
 *   k[layer][block][slot][kv_dim], v likewise (f32).
 * A sequence owns a block table: position p lives in block table[p / block_size], slot
 * p % block_size. Blocks come from a free list; sequences of any length share the pool, and the
 * scheduler preempts a sequence (frees its blocks) when the list runs dry. Not thread-safe: the
 * scheduler thread owns it. */
#ifndef STRATA_KV_CACHE_H
#define STRATA_KV_CACHE_H

#include <stddef.h>

struct kv_cache {
    int n_layers, kv_dim;
    int block_size, n_blocks;
    float *k, *v;   /* n_layers * n_blocks * block_size * kv_dim each */
    int *free_list; /* stack of free block ids */
    int n_free;
};

size_t kv_cache_bytes(int n_layers, int kv_dim, int block_size, int n_blocks);
/* mem must hold kv_cache_bytes(...) bytes (from the arena). */
int kv_cache_init(struct kv_cache *c, void *mem, int n_layers, int kv_dim, int block_size,
                  int n_blocks, char *err);

/* Pop a free block; -1 when none is left. */
int kv_block_alloc(struct kv_cache *c);
void kv_block_free(struct kv_cache *c, int block);
int kv_blocks_for(const struct kv_cache *c, int n_positions);

static inline float *kv_key(const struct kv_cache *c, int layer, int block, int slot)
{
    return c->k + (((size_t)layer * c->n_blocks + block) * c->block_size + slot) * c->kv_dim;
}
static inline float *kv_value(const struct kv_cache *c, int layer, int block, int slot)
{
    return c->v + (((size_t)layer * c->n_blocks + block) * c->block_size + slot) * c->kv_dim;
}

#endif
