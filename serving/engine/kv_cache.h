/* kv_cache: the paged key/value cache.
 *
 * The cache is n_blocks fixed-size blocks of block_size token positions, carved from the arena's
 * "kv" pool. A block holds, for every layer, the keys and values of block_size positions:
 *   keys   k[layer][block][kv_dim][slot]             (transposed within the block: one
 *                                                     dimension of block_size consecutive
 *                                                     positions is contiguous)
 *   values v[layer][block][kv_head][slot][head_dim]  (a kv head's values of the block's
 *                                                     positions are one contiguous run)
 * The keys are transposed so that attention's scores come out as vectors of positions (one
 * multiply-add per dimension, no horizontal sums); the values are grouped by kv head so that a
 * head's weighted sum over a block reads one sequential run (see fwd_simd.inc). Elements are f16
 * (the default: half the bytes each decoded token's attention reads, and twice the positions in the
 * same memory) or f32 (exact; --kv-type f32). f16 is IEEE half with round-to-nearest-even, as
 * llama.cpp's default cache; values beyond +-65504 become infinite.
 * A sequence owns a block table: position p lives in block table[p / block_size], slot
 * p % block_size. Blocks come from a free list; sequences of any length share the pool, and the
 * scheduler preempts a sequence (frees its blocks) when the list runs dry. A block may be held by
 * several sequences (a shared prompt prefix, serving/sched/prefix_cache.h): it counts its
 * holders and goes back to the list when the last lets go. The list hands out the block freed
 * longest ago, so a freed block keeps its keys and values as long as the pool allows, and a
 * block's generation moves each time it is handed out (what it held is gone then). Not
 * thread-safe: the scheduler thread owns it. */
#ifndef STRATA_KV_CACHE_H
#define STRATA_KV_CACHE_H

#include <stddef.h>

enum kv_type { KV_DEFAULT = 0, KV_F32 = 1, KV_F16 = 2 };

struct kv_cache {
    int type; /* KV_F32 or KV_F16 */
    int n_layers, kv_dim, head_dim;
    int block_size, n_blocks;
    size_t elt;  /* bytes per element: 4 or 2 */
    void *k, *v; /* n_layers * n_blocks * block_size * kv_dim elements each */
    /* Per block: its holders (0: on the free list), its generation, and the free list's links
     * (a queue, oldest freed first out; -1 ends it). After the planes, in the same memory. */
    int *ref, *next, *prev;
    unsigned *gen;
    int head, tail;
    int n_free;
};

/* "f32" / "f16" (KV_DEFAULT reads as f16); kv_type_parse returns KV_DEFAULT for anything
 * else. */
const char *kv_type_name(int type);
int kv_type_parse(const char *s);

/* type: KV_F32 or KV_F16 (KV_DEFAULT means f16). */
size_t kv_cache_bytes(int type, int n_layers, int kv_dim, int block_size, int n_blocks);
/* mem must hold kv_cache_bytes(...) bytes (from the arena). */
int kv_cache_init(struct kv_cache *c, void *mem, int type, int n_layers, int kv_dim, int head_dim,
                  int block_size, int n_blocks, char *err);

/* The free block freed longest ago, now held once (its generation moves); -1 when none is left. */
int kv_block_alloc(struct kv_cache *c);
/* One holder lets go; the last puts the block at the end of the free list, contents kept. */
void kv_block_free(struct kv_cache *c, int block);
/* One more holder of a block that is held or free (then it leaves the list, contents and
 * generation unchanged): a shared prefix. -1 for a block id out of range. */
int kv_block_ref(struct kv_cache *c, int block);
int kv_blocks_for(const struct kv_cache *c, int n_positions);

/* A block's keys: kv_dim x block_size elements (float or uint16_t f16, as c->type says); the
 * key of position slot, dimension i, is element i * block_size + slot. */
static inline void *kv_key_block(const struct kv_cache *c, int layer, int block)
{
    return (char *)c->k +
           ((size_t)layer * c->n_blocks + block) * c->block_size * c->kv_dim * c->elt;
}
/* A block's values: kv_dim / head_dim runs of block_size x head_dim elements, one per kv head;
 * the value of position slot, dimension i = g * head_dim + d, is element
 * (g * block_size + slot) * head_dim + d. */
static inline void *kv_value_block(const struct kv_cache *c, int layer, int block)
{
    return (char *)c->v +
           ((size_t)layer * c->n_blocks + block) * c->block_size * c->kv_dim * c->elt;
}
/* Keys and values of positions [p0, p0 + n) of one layer of the sequence whose block table is
 * `blocks`, as n rows of kv_dim elements each (row i is position p0 + i, elements in dimension
 * order, c->elt bytes each in the cache's type, host byte order): what a peer that ran those
 * layers for the sequence hands over (cluster/coop.h). kv_rows_write stores such rows. */
void kv_rows_read(const struct kv_cache *c, int layer, const int *blocks, int p0, int n, void *k,
                  void *v);
void kv_rows_write(struct kv_cache *c, int layer, const int *blocks, int p0, int n, const void *k,
                   const void *v);

/* Element i (0 <= i < kv_dim) of position slot's values, for code that walks them one by one. */
static inline void *kv_value_at(const struct kv_cache *c, int layer, int block, int slot, int i)
{
    size_t g = (size_t)(i / c->head_dim), d = (size_t)(i % c->head_dim);
    return (char *)kv_value_block(c, layer, block) +
           ((g * c->block_size + slot) * c->head_dim + d) * c->elt;
}

#endif
