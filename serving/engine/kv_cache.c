#include "serving/engine/kv_cache.h"

#include "os/common/errmsg.h"

#include <stdint.h>
#include <string.h>

const char *kv_type_name(int type)
{
    return type == KV_F32 ? "f32" : "f16";
}

int kv_type_parse(const char *s)
{
    return !strcmp(s, "f32") ? KV_F32 : !strcmp(s, "f16") ? KV_F16 : KV_DEFAULT;
}

static size_t elt_bytes(int type)
{
    return type == KV_F32 ? sizeof(float) : sizeof(uint16_t);
}

/* Keys, values, the blocks' bookkeeping; each of the first two a multiple of 64 bytes, so the
 * values and the bookkeeping start aligned like the memory. */
static size_t plane_bytes(int type, int n_layers, int kv_dim, int block_size, int n_blocks)
{
    size_t per = (size_t)n_layers * n_blocks * block_size * kv_dim * elt_bytes(type);
    return (per + 63) / 64 * 64;
}

size_t kv_cache_bytes(int type, int n_layers, int kv_dim, int block_size, int n_blocks)
{
    return 2 * plane_bytes(type, n_layers, kv_dim, block_size, n_blocks) +
           4 * (size_t)n_blocks * sizeof(int) + 64;
}

int kv_cache_init(struct kv_cache *c, void *mem, int type, int n_layers, int kv_dim, int head_dim,
                  int block_size, int n_blocks, char *err)
{
    if (n_layers <= 0 || kv_dim <= 0 || head_dim <= 0 || kv_dim % head_dim || block_size <= 0 ||
        n_blocks <= 0)
        return errmsg_set(err,
                          "kv cache: bad geometry (%d layers, kv_dim %d, head_dim %d, %d blocks "
                          "of %d)",
                          n_layers, kv_dim, head_dim, n_blocks, block_size);
    if (type != KV_DEFAULT && type != KV_F32 && type != KV_F16)
        return errmsg_set(err, "kv cache: unknown element type %d", type);
    size_t per = plane_bytes(type, n_layers, kv_dim, block_size, n_blocks);
    c->type = type == KV_F32 ? KV_F32 : KV_F16;
    c->elt = elt_bytes(c->type);
    c->n_layers = n_layers;
    c->kv_dim = kv_dim;
    c->head_dim = head_dim;
    c->block_size = block_size;
    c->n_blocks = n_blocks;
    c->k = mem;
    c->v = (char *)mem + per;
    c->ref = (int *)((char *)mem + 2 * per);
    c->next = c->ref + n_blocks;
    c->prev = c->next + n_blocks;
    c->gen = (unsigned *)(c->prev + n_blocks);
    /* Out in order 0, 1, 2...: a fresh cache hands out blocks in address order. */
    for (int i = 0; i < n_blocks; i++) {
        c->ref[i] = 0;
        c->gen[i] = 0;
        c->next[i] = i + 1 < n_blocks ? i + 1 : -1;
        c->prev[i] = i - 1;
    }
    c->head = 0;
    c->tail = n_blocks - 1;
    c->n_free = n_blocks;
    return 0;
}

static void unlink_free(struct kv_cache *c, int b)
{
    if (c->prev[b] >= 0)
        c->next[c->prev[b]] = c->next[b];
    else
        c->head = c->next[b];
    if (c->next[b] >= 0)
        c->prev[c->next[b]] = c->prev[b];
    else
        c->tail = c->prev[b];
    c->n_free--;
}

int kv_block_alloc(struct kv_cache *c)
{
    int b = c->head;
    if (b < 0) return -1;
    unlink_free(c, b);
    c->ref[b] = 1;
    c->gen[b]++;
    return b;
}

void kv_block_free(struct kv_cache *c, int b)
{
    if (b < 0 || b >= c->n_blocks || c->ref[b] <= 0) return; /* not held: nothing to let go */
    if (--c->ref[b]) return;
    c->next[b] = -1;
    c->prev[b] = c->tail;
    if (c->tail >= 0)
        c->next[c->tail] = b;
    else
        c->head = b;
    c->tail = b;
    c->n_free++;
}

int kv_block_ref(struct kv_cache *c, int b)
{
    if (b < 0 || b >= c->n_blocks) return -1;
    if (!c->ref[b]) unlink_free(c, b);
    c->ref[b]++;
    return 0;
}

int kv_blocks_for(const struct kv_cache *c, int n_positions)
{
    return (n_positions + c->block_size - 1) / c->block_size;
}

/* Rows <-> the block layout, one element at a time: a handover moves at most a few MB, so the
 * gather's simplicity wins over a vectorized transpose. */
static void *key_at(const struct kv_cache *c, int layer, int block, int slot, int i)
{
    return (char *)kv_key_block(c, layer, block) + ((size_t)i * c->block_size + slot) * c->elt;
}

void kv_rows_read(const struct kv_cache *c, int layer, const int *blocks, int p0, int n, void *k,
                  void *v)
{
    char *ko = k, *vo = v;
    for (int r = 0; r < n; r++) {
        int p = p0 + r, blk = blocks[p / c->block_size], slot = p % c->block_size;
        for (int i = 0; i < c->kv_dim; i++, ko += c->elt, vo += c->elt) {
            memcpy(ko, key_at(c, layer, blk, slot, i), c->elt);
            memcpy(vo, kv_value_at(c, layer, blk, slot, i), c->elt);
        }
    }
}

void kv_rows_write(struct kv_cache *c, int layer, const int *blocks, int p0, int n, const void *k,
                   const void *v)
{
    const char *ki = k, *vi = v;
    for (int r = 0; r < n; r++) {
        int p = p0 + r, blk = blocks[p / c->block_size], slot = p % c->block_size;
        for (int i = 0; i < c->kv_dim; i++, ki += c->elt, vi += c->elt) {
            memcpy(key_at(c, layer, blk, slot, i), ki, c->elt);
            memcpy(kv_value_at(c, layer, blk, slot, i), vi, c->elt);
        }
    }
}
