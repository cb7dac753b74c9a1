/* prefix_cache: which KV blocks hold which token prefixes, so that a request whose prompt begins
 * as an earlier one's did (a chat's system prompt, the turns a client sends again) takes those
 * blocks instead of computing them again (automatic prefix caching, as vLLM's).
 *
 * A full block (block_size positions whose keys and values are computed) is registered under its
 * tokens and the block before it in its sequence (its parent). A lookup walks a prompt block by
 * block from position 0 and takes a block only if its tokens are the prompt's and its parent is
 * the block it took just before: a hit means the same tokens at the same positions all the way
 * from the start, so the same keys and values (the hash only finds the candidates; the tokens and
 * the parent decide). Nothing is owned here: a registered block no sequence holds stays on the
 * kv_cache free list (freed longest ago goes first), and its entry is dead as soon as the block
 * is handed out again (its generation moved). The caller registers only blocks computed with
 * every layer by this node (never a split step's, cluster/coop.h) and clears the cache when that
 * changes. Not thread-safe: the scheduler thread owns it. */
#ifndef STRATA_PREFIX_CACHE_H
#define STRATA_PREFIX_CACHE_H

#include "serving/engine/kv_cache.h"

struct prefix_cache;

/* NULL (err) when out of memory. kv outlives it. */
struct prefix_cache *prefix_cache_new(struct kv_cache *kv, char *err);
void prefix_cache_free(struct prefix_cache *p);

/* The longest run of registered blocks that begins tok[0, n) (whole blocks only, at most
 * max_blocks): each one gets a holder (kv_block_ref) and goes to blocks[]. Returns how many. */
int prefix_cache_match(struct prefix_cache *p, const int *tok, int n, int *blocks, int max_blocks);

/* Block j of a sequence is full and computed: blocks[j] holds the positions of tokens
 * tok[j * block_size, (j + 1) * block_size), its parent is blocks[j - 1] (none for j = 0, which
 * must itself be registered or reached by a match for j > 0 to count). A block whose content is
 * registered already (another block) is left out. */
void prefix_cache_add(struct prefix_cache *p, const int *tok, const int *blocks, int j);

/* Forget every entry (the layers this node computes changed). */
void prefix_cache_clear(struct prefix_cache *p);

/* Live entries (tests; a walk over every block). */
int prefix_cache_entries(const struct prefix_cache *p);

#endif
