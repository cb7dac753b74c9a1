/* The KV pool's shared blocks and the prefix cache over it: holders counted, the block freed
 * longest ago handed out first, a freed block's content findable until it is handed out again; a
 * match needs the same tokens from position 0 (same block tokens after another prefix never
 * match), whole blocks only, and dies with a block's reuse or a clear. */
#include "check.h"
#include "os/common/errmsg.h"
#include "serving/sched/prefix_cache.h"

#include <stdlib.h>

#define BS 4
#define NB 8

struct pool {
    struct kv_cache kv;
    void *mem;
    struct prefix_cache *px;
};

static void pool_open(struct pool *p)
{
    char err[ERRMSG_LEN];
    p->mem = calloc(1, kv_cache_bytes(KV_F32, 1, 1, BS, NB));
    CHECK(p->mem && kv_cache_init(&p->kv, p->mem, KV_F32, 1, 1, 1, BS, NB, err) == 0);
    p->px = prefix_cache_new(&p->kv, err);
    CHECKF(p->px, "%s", err);
}

static void pool_close(struct pool *p)
{
    prefix_cache_free(p->px);
    free(p->mem);
}

/* A sequence: n tokens in fresh blocks, every full block registered. */
static int fill(struct pool *p, const int *tok, int n, int *blocks)
{
    int nb = (n + BS - 1) / BS;
    for (int j = 0; j < nb; j++) {
        blocks[j] = kv_block_alloc(&p->kv);
        CHECK(blocks[j] >= 0);
    }
    for (int j = 0; j < n / BS; j++) prefix_cache_add(p->px, tok, blocks, j);
    return nb;
}

static void let_go(struct pool *p, const int *blocks, int nb)
{
    for (int j = nb - 1; j >= 0; j--) kv_block_free(&p->kv, blocks[j]);
}

TEST(blocks_count_holders_and_leave_oldest_first)
{
    struct pool p;
    pool_open(&p);
    for (int i = 0; i < NB; i++) CHECK_EQ_INT(kv_block_alloc(&p.kv), i); /* address order */
    CHECK_EQ_INT(kv_block_alloc(&p.kv), -1);
    kv_block_free(&p.kv, 5);
    kv_block_free(&p.kv, 2);
    CHECK(kv_block_ref(&p.kv, 3) == 0); /* 3 held twice */
    kv_block_free(&p.kv, 3);
    CHECK_EQ_INT(p.kv.n_free, 2);
    kv_block_free(&p.kv, 3);
    CHECK_EQ_INT(p.kv.n_free, 3);
    kv_block_free(&p.kv, 3); /* not held: nothing happens */
    CHECK_EQ_INT(p.kv.n_free, 3);
    /* taking a free block back keeps its generation; handing it out moves it */
    unsigned g2 = p.kv.gen[2];
    CHECK(kv_block_ref(&p.kv, 2) == 0 && p.kv.gen[2] == g2 && p.kv.n_free == 2);
    CHECK_EQ_INT(kv_block_alloc(&p.kv), 5); /* freed first */
    CHECK_EQ_INT(kv_block_alloc(&p.kv), 3);
    CHECK_EQ_INT(kv_block_alloc(&p.kv), -1);
    CHECK(kv_block_ref(&p.kv, NB) == -1 && kv_block_ref(&p.kv, -1) == -1);
    pool_close(&p);
}

TEST(match_takes_the_longest_registered_prefix)
{
    struct pool p;
    pool_open(&p);
    int a[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}; /* two full blocks and 3 positions */
    int ba[3], got[4];
    CHECK_EQ_INT(fill(&p, a, 11, ba), 3);
    CHECK_EQ_INT(prefix_cache_entries(p.px), 2);
    /* held by a and free: both findable */
    CHECK_EQ_INT(prefix_cache_match(p.px, a, 11, got, 4), 2);
    CHECK(got[0] == ba[0] && got[1] == ba[1] && p.kv.ref[ba[0]] == 2);
    let_go(&p, got, 2);
    let_go(&p, ba, 3);
    CHECK_EQ_INT(p.kv.n_free, NB);
    int b[] = {1, 2, 3, 4, 5, 6, 7, 9, 9, 9};
    CHECK_EQ_INT(prefix_cache_match(p.px, b, 10, got, 4), 1); /* block 1 differs */
    CHECK(got[0] == ba[0] && p.kv.n_free == NB - 1);
    let_go(&p, got, 1);
    CHECK_EQ_INT(prefix_cache_match(p.px, a, 7, got, 4), 1); /* whole blocks only */
    let_go(&p, got, 1);
    CHECK_EQ_INT(prefix_cache_match(p.px, a, 11, got, 1), 1); /* at most max_blocks */
    let_go(&p, got, 1);
    int c[] = {9, 9, 9, 9, 5, 6, 7, 8}; /* a's second block after another first one */
    CHECK_EQ_INT(prefix_cache_match(p.px, c, 8, got, 4), 0);
    int bc[2];
    fill(&p, c, 8, bc);
    CHECK_EQ_INT(prefix_cache_match(p.px, a, 11, got, 4), 2); /* a still whole */
    CHECK(got[1] == ba[1]);
    let_go(&p, got, 2);
    CHECK_EQ_INT(prefix_cache_match(p.px, c, 8, got, 4), 2);
    CHECK(got[0] == bc[0] && got[1] == bc[1]);
    let_go(&p, got, 2);
    let_go(&p, bc, 2);
    pool_close(&p);
}

TEST(a_reused_block_is_forgotten_with_what_follows_it)
{
    struct pool p;
    pool_open(&p);
    int a[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    int ba[3], got[3], other[NB];
    fill(&p, a, 12, ba);
    let_go(&p, ba, 3); /* free, in order ba[2], ba[1], ba[0] at the end of the list */
    /* the 5 blocks never used go first: a stays whole */
    for (int i = 0; i < 5; i++) other[i] = kv_block_alloc(&p.kv);
    CHECK_EQ_INT(prefix_cache_match(p.px, a, 12, got, 3), 3);
    let_go(&p, got, 3);
    /* then a's last block (freed first), then its middle one: the first stays findable alone */
    other[5] = kv_block_alloc(&p.kv);
    CHECK_EQ_INT(other[5], ba[2]);
    CHECK_EQ_INT(prefix_cache_match(p.px, a, 12, got, 3), 2);
    let_go(&p, got, 2);
    other[6] = kv_block_alloc(&p.kv);
    CHECK_EQ_INT(other[6], ba[1]);
    CHECK_EQ_INT(prefix_cache_match(p.px, a, 12, got, 3), 1);
    CHECK_EQ_INT(got[0], ba[0]);
    /* registering the reused middle block again under other tokens does not bring a back */
    int d[] = {1, 2, 3, 4, 0, 0, 0, 0};
    int bd[2] = {got[0], other[6]};
    prefix_cache_add(p.px, d, bd, 1);
    int g2[3];
    CHECK_EQ_INT(prefix_cache_match(p.px, a, 12, g2, 3), 1);
    let_go(&p, g2, 1);
    CHECK_EQ_INT(prefix_cache_match(p.px, d, 8, g2, 3), 2);
    CHECK(g2[1] == other[6]);
    let_go(&p, g2, 2);
    let_go(&p, got, 1);
    prefix_cache_clear(p.px);
    CHECK_EQ_INT(prefix_cache_entries(p.px), 0);
    CHECK_EQ_INT(prefix_cache_match(p.px, a, 12, got, 3), 0);
    let_go(&p, other, 7);
    CHECK_EQ_INT(p.kv.n_free, NB);
    pool_close(&p);
}

int main(void)
{
    RUN(blocks_count_holders_and_leave_oldest_first);
    RUN(match_takes_the_longest_registered_prefix);
    RUN(a_reused_block_is_forgotten_with_what_follows_it);
    CHECK_DONE();
}
