/* test_kv_pool: the paged block pool on its own — allocation is
 * check-then-commit, ref counts, the free queue order, prefix-cache hits
 * and collision safety, copy-on-write, contiguous reservations, and the
 * invariant checker after every operation of a random walk. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kv_pool.h"
#include "test_support.h"

static kv_pool *make_pool(int32_t num_blocks, int32_t bs, bool cache)
{
    kv_pool_params pp = {.num_blocks = num_blocks, .block_size = bs, .prefix_caching = cache};
    kv_pool *p = NULL;
    pg_error err;
    assert_int_equal(kv_pool_create(&p, &pp, &err), PG_OK);
    return p;
}

static void check(const kv_pool *p)
{
    pg_error err = {{0}};
    int rc = kv_pool_check(p, &err);
    if (rc != PG_OK) fail_msg("%s", err.msg);
}

static int32_t new_table(kv_pool *p)
{
    int32_t t;
    pg_error err;
    assert_int_equal(kv_pool_table_new(p, &t, &err), PG_OK);
    return t;
}

static void test_create_refuses_bad_params(void **state)
{
    (void)state;
    kv_pool_params pp = {.num_blocks = 8, .block_size = 12, .prefix_caching = true};
    kv_pool *p = NULL;
    pg_error err = {{0}};
    assert_int_equal(kv_pool_create(&p, &pp, &err), PG_EINVAL);
    assert_null(p);
    assert_non_null(strstr(err.msg, "block_size"));
    pp.block_size = 512;
    assert_int_equal(kv_pool_create(&p, &pp, &err), PG_EINVAL);
    pp.block_size = 16;
    pp.num_blocks = 0;
    assert_int_equal(kv_pool_create(&p, &pp, &err), PG_EINVAL);
    assert_non_null(strstr(err.msg, "num_blocks"));
}

static void test_allocate_release_and_failed_call_changes_nothing(void **state)
{
    (void)state;
    kv_pool *p = make_pool(4, 16, true);
    int32_t a = new_table(p), b = new_table(p);
    assert_int_equal(kv_pool_allocate(p, a, NULL, 0, 33, NULL, NULL), PG_OK); /* 3 blocks */
    check(p);
    assert_int_equal(kv_pool_num_free(p), 1);
    assert_int_equal(kv_pool_table_tokens(p, a), 33);
    /* growing inside the last block takes nothing */
    assert_int_equal(kv_pool_blocks_needed(p, a, NULL, 0, 15), 0);
    assert_int_equal(kv_pool_allocate(p, a, NULL, 0, 15, NULL, NULL), PG_OK);
    assert_int_equal(kv_pool_num_free(p), 1);
    /* b wants 2 blocks, only 1 free: refused, nothing changes */
    assert_false(kv_pool_can_allocate(p, b, NULL, 0, 17));
    kv_pool_metrics before, after;
    kv_pool_get_metrics(p, &before);
    assert_int_equal(kv_pool_allocate(p, b, NULL, 0, 17, NULL, NULL), PG_ENOSPACE);
    kv_pool_get_metrics(p, &after);
    assert_memory_equal(&before, &after, sizeof before);
    assert_int_equal(kv_pool_table_tokens(p, b), 0);
    check(p);
    /* utilization: 48 slots filled of 48 */
    assert_int_equal(after.filled_slots, 48);
    assert_int_equal(after.allocated_slots, 48);
    assert_true(kv_pool_can_allocate(p, b, NULL, 0, 16));
    kv_pool_table_delete(p, a);
    check(p);
    assert_int_equal(kv_pool_num_free(p), 4);
    assert_int_equal(kv_pool_allocate(p, b, NULL, 0, 64, NULL, NULL), PG_OK);
    assert_int_equal(kv_pool_num_free(p), 0);
    kv_pool_get_metrics(p, &after);
    assert_int_equal(after.blocks_in_use_peak, 4);
    kv_pool_table_delete(p, b);
    check(p);
    kv_pool_destroy(p);
}

static void fill_ids(int32_t *ids, int32_t n, int32_t base)
{
    for (int32_t i = 0; i < n; i++) ids[i] = base + i * 7 % 13;
}

/* Prefix-cache keys (the LoRA adapter, issue 33): blocks committed by a
 * table of key 3 are found under key 3 only, never under key 0 or 5, even
 * with the same tokens; a table of key 0 caches its own copy beside them. */
static void test_prefix_keys(void **state)
{
    (void)state;
    const int32_t bs = 4;
    kv_pool *p = make_pool(16, bs, true);
    int32_t ids[12], hits[3];
    fill_ids(ids, 12, 100);
    int32_t a = new_table(p);
    kv_pool_table_set_key(p, a, 3);
    assert_int_equal(kv_pool_allocate(p, a, NULL, 0, 12, NULL, NULL), PG_OK);
    kv_pool_commit(p, a, ids, 12);
    check(p);
    assert_int_equal(kv_pool_match_prefix_key(p, 3, ids, 3, hits), 3);
    assert_int_equal(kv_pool_match_prefix(p, ids, 3, hits), 0);
    assert_int_equal(kv_pool_match_prefix_key(p, 5, ids, 3, hits), 0);
    int32_t b = new_table(p); /* key 0 */
    assert_int_equal(kv_pool_allocate(p, b, NULL, 0, 12, NULL, NULL), PG_OK);
    kv_pool_commit(p, b, ids, 12);
    check(p);
    kv_pool_metrics m;
    kv_pool_get_metrics(p, &m);
    assert_int_equal(m.blocks_cached, 6); /* not deduplicated across keys */
    assert_int_equal(kv_pool_match_prefix(p, ids, 3, hits), 3);
    const int32_t *bb = kv_pool_table_blocks(p, b, &(int32_t){0});
    assert_int_equal(hits[0], bb[0]);
    assert_int_equal(kv_pool_match_prefix_key(p, 3, ids, 3, hits), 3);
    assert_int_not_equal(hits[0], bb[0]);
    /* a released handle comes back with key 0 */
    kv_pool_table_delete(p, a);
    int32_t c = new_table(p);
    assert_int_equal(kv_pool_allocate(p, c, NULL, 0, 4, NULL, NULL), PG_OK);
    kv_pool_commit(p, c, ids, 4);
    check(p);
    kv_pool_table_delete(p, b);
    kv_pool_table_delete(p, c);
    check(p);
    kv_pool_destroy(p);
}

static void test_prefix_cache_hit_revives_evictable_blocks(void **state)
{
    (void)state;
    const int32_t bs = 4;
    kv_pool *p = make_pool(8, bs, true);
    int32_t ids[14];
    fill_ids(ids, 14, 100);
    int32_t a = new_table(p);
    assert_int_equal(kv_pool_allocate(p, a, NULL, 0, 14, NULL, NULL), PG_OK); /* 4 blocks */
    kv_pool_commit(p, a, ids, 14); /* 3 full blocks cached */
    check(p);
    int32_t n;
    const int32_t *ablk = kv_pool_table_blocks(p, a, &n);
    int32_t a_blocks[4];
    memcpy(a_blocks, ablk, sizeof a_blocks);
    kv_pool_metrics m;
    kv_pool_get_metrics(p, &m);
    assert_int_equal(m.blocks_cached, 3);
    kv_pool_table_delete(p, a);
    check(p);
    kv_pool_get_metrics(p, &m);
    assert_int_equal(m.blocks_evictable, 3);
    assert_int_equal(m.blocks_in_use, 0);

    /* a new request with the same first 10 tokens: 2 full blocks hit */
    int32_t ids2[12];
    memcpy(ids2, ids, 10 * sizeof *ids2);
    ids2[10] = 1;
    ids2[11] = 2;
    int32_t hits[3];
    assert_int_equal(kv_pool_match_prefix(p, ids2, 3, hits), 2);
    assert_int_equal(hits[0], a_blocks[0]);
    assert_int_equal(hits[1], a_blocks[1]);
    int32_t b = new_table(p);
    assert_int_equal(kv_pool_blocks_needed(p, b, hits, 2, 4), 1);
    assert_int_equal(kv_pool_allocate(p, b, hits, 2, 4, NULL, NULL), PG_OK);
    check(p);
    assert_int_equal(kv_pool_block_ref(p, a_blocks[0]), 1);
    assert_int_equal(kv_pool_table_tokens(p, b), 12);
    /* a_blocks[2] is still evictable and findable with the full prefix */
    assert_int_equal(kv_pool_match_prefix(p, ids, 3, hits), 3);
    /* a different first block: the same later tokens do not match (chain) */
    int32_t ids3[12];
    memcpy(ids3, ids, sizeof ids3);
    ids3[0] = 999;
    assert_int_equal(kv_pool_match_prefix(p, ids3, 3, hits), 0);
    kv_pool_table_delete(p, b);
    check(p);
    kv_pool_destroy(p);
}

static void test_eviction_order_is_lru_and_removes_entries(void **state)
{
    (void)state;
    const int32_t bs = 2;
    kv_pool *p = make_pool(4, bs, true);
    int32_t ids[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int32_t a = new_table(p);
    assert_int_equal(kv_pool_allocate(p, a, NULL, 0, 5, NULL, NULL), PG_OK); /* 3 blocks */
    kv_pool_commit(p, a, ids, 5);
    kv_pool_table_delete(p, a); /* 2 cached to the tail, the partial one to the head */
    check(p);
    int32_t hits[5];
    assert_int_equal(kv_pool_match_prefix(p, ids, 2, hits), 2);
    /* taking 2 fresh blocks uses the never-cached ones first: cache intact */
    int32_t b = new_table(p);
    assert_int_equal(kv_pool_allocate(p, b, NULL, 0, 4, NULL, NULL), PG_OK);
    check(p);
    assert_int_equal(kv_pool_match_prefix(p, ids, 2, hits), 2);
    /* one more block evicts the least recently freed cached block: the
     * second block of the prefix was freed first (release goes last block
     * first), so the first block survives */
    int32_t c = new_table(p);
    assert_int_equal(kv_pool_allocate(p, c, NULL, 0, 1, NULL, NULL), PG_OK);
    check(p);
    assert_int_equal(kv_pool_match_prefix(p, ids, 2, hits), 1);
    kv_pool_metrics m;
    kv_pool_get_metrics(p, &m);
    assert_int_equal(m.evictions, 1);
    assert_int_equal(m.blocks_cached, 1);
    kv_pool_table_delete(p, b);
    kv_pool_table_delete(p, c);
    check(p);
    kv_pool_destroy(p);
}

static void test_copy_on_write_after_fork(void **state)
{
    (void)state;
    const int32_t bs = 4;
    kv_pool *p = make_pool(8, bs, true);
    int32_t ids[6] = {5, 6, 7, 8, 9, 10};
    int32_t a = new_table(p), b = new_table(p), c = new_table(p);
    assert_int_equal(kv_pool_allocate(p, a, NULL, 0, 6, NULL, NULL), PG_OK);
    kv_pool_commit(p, a, ids, 6);
    pg_error err;
    assert_int_equal(kv_pool_fork(p, a, b), PG_OK);
    assert_int_equal(kv_pool_fork(p, a, c), PG_OK);
    check(p);
    int32_t n;
    int32_t shared_last = kv_pool_table_blocks(p, a, &n)[1];
    assert_int_equal(kv_pool_block_ref(p, shared_last), 3);
    int32_t src, dst;
    /* a writes position 6 into the shared partial block: copy first */
    assert_int_equal(kv_pool_blocks_needed(p, a, NULL, 0, 1), 1);
    assert_int_equal(kv_pool_allocate(p, a, NULL, 0, 1, &src, &dst), PG_OK);
    assert_int_equal(src, shared_last);
    assert_int_not_equal(dst, shared_last);
    assert_int_equal(kv_pool_table_blocks(p, a, &n)[1], dst);
    assert_int_equal(kv_pool_block_ref(p, shared_last), 2);
    check(p);
    assert_int_equal(kv_pool_allocate(p, b, NULL, 0, 1, &src, &dst), PG_OK);
    assert_int_equal(src, shared_last);
    /* c is the last holder: writes in place */
    assert_int_equal(kv_pool_blocks_needed(p, c, NULL, 0, 1), 0);
    assert_int_equal(kv_pool_allocate(p, c, NULL, 0, 1, &src, &dst), PG_OK);
    assert_int_equal(src, -1);
    assert_int_equal(kv_pool_table_blocks(p, c, &n)[1], shared_last);
    /* the full first block stays shared */
    assert_int_equal(kv_pool_block_ref(p, kv_pool_table_blocks(p, c, &n)[0]), 3);
    kv_pool_metrics m;
    kv_pool_get_metrics(p, &m);
    assert_int_equal(m.cow_copies, 2);
    check(p);
    (void)err;
    kv_pool_table_delete(p, a);
    kv_pool_table_delete(p, b);
    kv_pool_table_delete(p, c);
    check(p);
    assert_int_equal(kv_pool_num_free(p), 8);
    kv_pool_destroy(p);
}

static void test_duplicate_blocks_chain_to_the_cached_copy(void **state)
{
    (void)state;
    const int32_t bs = 2;
    kv_pool *p = make_pool(16, bs, true);
    int32_t x[6] = {1, 2, 3, 4, 5, 6};
    int32_t y[6] = {1, 2, 3, 4, 9, 9};
    int32_t a = new_table(p), b = new_table(p);
    /* both computed in the same step: neither could hit the other */
    assert_int_equal(kv_pool_allocate(p, a, NULL, 0, 6, NULL, NULL), PG_OK);
    assert_int_equal(kv_pool_allocate(p, b, NULL, 0, 6, NULL, NULL), PG_OK);
    kv_pool_commit(p, a, x, 6);
    kv_pool_commit(p, b, y, 6);
    check(p);
    kv_pool_metrics m;
    kv_pool_get_metrics(p, &m);
    assert_int_equal(m.blocks_cached, 4); /* x's 3 + y's divergent last block */
    int32_t hits[3], n;
    assert_int_equal(kv_pool_match_prefix(p, y, 3, hits), 3);
    const int32_t *bb = kv_pool_table_blocks(p, b, &n);
    assert_int_equal(hits[2], bb[2]); /* found through x's first two blocks */
    assert_int_not_equal(hits[0], bb[0]);
    kv_pool_table_delete(p, a);
    kv_pool_table_delete(p, b);
    check(p);
    kv_pool_destroy(p);
}

static void test_contiguous_reservation(void **state)
{
    (void)state;
    kv_pool *p = make_pool(10, 4, false);
    int32_t a = new_table(p), b = new_table(p);
    assert_int_equal(kv_pool_reserve(p, a, 6), PG_OK);
    assert_int_equal(kv_pool_reserve(p, b, 6), PG_ENOSPACE);
    assert_int_equal(kv_pool_num_free(p), 4);
    assert_int_equal(kv_pool_blocks_needed(p, a, NULL, 0, 24), 0);
    assert_int_equal(kv_pool_allocate(p, a, NULL, 0, 5, NULL, NULL), PG_OK);
    check(p);
    kv_pool_metrics m;
    kv_pool_get_metrics(p, &m);
    assert_int_equal(m.filled_slots, 5);
    assert_int_equal(m.allocated_slots, 24);
    int32_t ids[8] = {0};
    kv_pool_commit(p, a, ids, 5); /* caching off: nothing cached */
    int32_t hits[2];
    assert_int_equal(kv_pool_match_prefix(p, ids, 1, hits), 0);
    kv_pool_table_delete(p, a);
    kv_pool_table_delete(p, b);
    check(p);
    assert_int_equal(kv_pool_num_free(p), 10);
    kv_pool_destroy(p);
}

/* Blocks ever taken for content (epoch > 0: what the KV buffer's pages
 * have been written at). The pool hands out never-taken blocks in address
 * order, so they are always the leading ids 0 .. n-1: checked here. */
static int32_t touched_prefix(const kv_pool *p)
{
    const int32_t nb = kv_pool_num_blocks(p);
    int32_t n = 0;
    while (n < nb && kv_pool_block_epoch(p, n) > 0) n++;
    for (int32_t b = n; b < nb; b++)
        if (kv_pool_block_epoch(p, b) > 0)
            fail_msg("block %d was taken before untouched block %d", (int)b, (int)n);
    return n;
}

/* Touched blocks that are free and hold no cache entry (reusable without
 * evicting anything and without touching a new page). */
static int32_t touched_free_uncached(const kv_pool *p, int32_t touched)
{
    int32_t n = 0;
    for (int32_t b = 0; b < touched; b++)
        if (kv_pool_block_ref(p, b) == 0 && !kv_pool_block_cached(p, b)) n++;
    return n;
}

/* A random walk of every operation, the checker after each one; at the end
 * every block is free or evictable. */
static void test_random_walk_keeps_invariants(void **state)
{
    (void)state;
    pg_test_rng rng = {.s = 1234};
    for (int round = 0; round < 6; round++) {
        const int32_t bs = 1 << pg_test_rng_int(&rng, 0, 4);
        const int32_t nb = pg_test_rng_int(&rng, 4, 40);
        kv_pool *p = make_pool(nb, bs, round % 3 != 2);
        enum { NT = 8, MAXT = 200 };
        int32_t tables[NT];
        int32_t toks[NT][MAXT];
        for (int i = 0; i < NT; i++) tables[i] = new_table(p);
        for (int op = 0; op < 3000; op++) {
            int i = pg_test_rng_int(&rng, 0, NT - 1);
            int32_t t = tables[i];
            int32_t len = kv_pool_table_tokens(p, t);
            int kind = pg_test_rng_int(&rng, 0, 9);
            if (kind <= 5) {
                int32_t add = pg_test_rng_int(&rng, 1, 2 * bs + 1);
                if (len + add > MAXT) add = MAXT - len;
                if (add <= 0) continue;
                int32_t hits[MAXT], n_hits = 0;
                if (len == 0) {
                    /* a prompt from a small alphabet: prefixes repeat */
                    for (int32_t k = 0; k < add; k++) toks[i][k] = pg_test_rng_int(&rng, 0, 1);
                    n_hits = kv_pool_match_prefix(p, toks[i], (add - 1) / bs, hits);
                    add -= n_hits * bs;
                } else {
                    for (int32_t k = len; k < len + add; k++)
                        toks[i][k] = pg_test_rng_int(&rng, 0, 1);
                }
                kv_pool_metrics before, after;
                kv_pool_get_metrics(p, &before);
                const int32_t touched0 = touched_prefix(p);
                bool can = kv_pool_can_allocate(p, t, hits, n_hits, add);
                int rc = kv_pool_allocate(p, t, hits, n_hits, add, NULL, NULL);
                assert_int_equal(rc, can ? PG_OK : PG_ENOSPACE);
                if (rc == PG_OK) {
                    /* the touch order: a never-taken block only once no
                     * touched block is free without a cache entry, and a
                     * cached block evicted only once every block is touched */
                    const int32_t touched1 = touched_prefix(p);
                    if (touched1 > touched0)
                        assert_int_equal(touched_free_uncached(p, touched1), 0);
                    kv_pool_get_metrics(p, &after);
                    if (after.evictions > before.evictions) assert_int_equal(touched1, nb);
                    kv_pool_commit(p, t, toks[i], kv_pool_table_tokens(p, t));
                } else {
                    kv_pool_get_metrics(p, &after);
                    assert_memory_equal(&before, &after, sizeof before);
                }
            } else if (kind <= 7) {
                kv_pool_table_release(p, t);
            } else {
                int j = pg_test_rng_int(&rng, 0, NT - 1);
                if (j != i && kv_pool_table_tokens(p, tables[j]) > 0 && len == 0) {
                    assert_int_equal(kv_pool_fork(p, tables[j], t), PG_OK);
                    memcpy(toks[i], toks[j], sizeof toks[i]);
                }
            }
            check(p);
            /* every table's blocks hold what its tokens say (hits are exact) */
        }
        for (int i = 0; i < NT; i++) kv_pool_table_delete(p, tables[i]);
        check(p);
        kv_pool_metrics m;
        kv_pool_get_metrics(p, &m);
        assert_int_equal(m.blocks_in_use, 0);
        assert_int_equal(kv_pool_num_free(p), nb);
        kv_pool_destroy(p);
    }
}


/* kv_pool_free_after: what stays takeable after an allocation, hits revived
 * from the evictable end counted as taken; the epoch moves only when a
 * block is taken fresh (a hit keeps it). */
static void test_free_after_cached_and_epoch(void **state)
{
    (void)state;
    const int32_t bs = 4;
    kv_pool *p = make_pool(8, bs, true);
    int32_t ids[12];
    fill_ids(ids, 12, 7);
    int32_t a = new_table(p);
    assert_int_equal(kv_pool_free_after(p, a, NULL, 0, 9), 8 - 3);
    assert_int_equal(kv_pool_free_after(p, a, NULL, 0, 33), -1);
    assert_false(kv_pool_can_allocate(p, a, NULL, 0, 33));
    assert_int_equal(kv_pool_allocate(p, a, NULL, 0, 9, NULL, NULL), PG_OK);
    int32_t n;
    int32_t b0 = kv_pool_table_blocks(p, a, &n)[0];
    uint32_t ep0 = kv_pool_block_epoch(p, b0);
    assert_false(kv_pool_block_cached(p, b0));
    /* committed when scheduled: findable before anything is computed */
    kv_pool_commit(p, a, ids, 9);
    assert_true(kv_pool_block_cached(p, b0));
    assert_false(kv_pool_block_cached(p, kv_pool_table_blocks(p, a, &n)[2])); /* partial */
    assert_false(kv_pool_block_cached(p, -1));
    kv_pool_table_delete(p, a);
    check(p);
    /* two evictable hits + 1 fresh block of 8 takeable: 5 stay */
    int32_t hits[2], b = new_table(p);
    assert_int_equal(kv_pool_match_prefix(p, ids, 2, hits), 2);
    assert_int_equal(kv_pool_free_after(p, b, hits, 2, 3), 5);
    assert_int_equal(kv_pool_allocate(p, b, hits, 2, 3, NULL, NULL), PG_OK);
    assert_int_equal(kv_pool_num_free(p), 5);
    assert_int_equal(kv_pool_block_epoch(p, b0), ep0);
    kv_pool_table_delete(p, b);
    /* taking every block fresh evicts b0 and moves its epoch */
    int32_t c = new_table(p);
    assert_int_equal(kv_pool_allocate(p, c, NULL, 0, 32, NULL, NULL), PG_OK);
    assert_int_not_equal(kv_pool_block_epoch(p, b0), ep0);
    assert_false(kv_pool_block_cached(p, b0));
    kv_pool_table_delete(p, c);
    check(p);
    kv_pool_destroy(p);
}


/* Sliding window: kv_pool_drop_before nulls the leading entries wholly
 * below lo and drops their references; a block a fork still names stays
 * referenced, a freed one stays in the prefix cache (evictable) and a
 * later hit still finds the whole chain while it is cached, but stops at
 * the first evicted block. The last hashed block is kept for the chain. */
static void test_drop_before_window(void **state)
{
    (void)state;
    const int32_t bs = 4;
    kv_pool *p = make_pool(12, bs, true);
    int32_t ids[22];
    fill_ids(ids, 22, 300);
    int32_t a = new_table(p);
    assert_int_equal(kv_pool_allocate(p, a, NULL, 0, 18, NULL, NULL), PG_OK); /* 5 blocks */
    kv_pool_commit(p, a, ids, 18); /* 4 full blocks hashed and cached */
    int32_t n, a_blocks[5];
    memcpy(a_blocks, kv_pool_table_blocks(p, a, &n), sizeof a_blocks);
    int32_t f = new_table(p);
    assert_int_equal(kv_pool_fork(p, a, f), PG_OK);
    assert_int_equal(kv_pool_table_held(p, a), 5);
    /* lo = 9: blocks 0 and 1 (positions 0..7) hold only positions < 9 */
    assert_int_equal(kv_pool_drop_before(p, a, 9), 2);
    assert_int_equal(kv_pool_drop_before(p, a, 9), 0); /* idempotent */
    check(p);
    const int32_t *t = kv_pool_table_blocks(p, a, &n);
    assert_int_equal(n, 5);
    assert_int_equal(t[0], -1);
    assert_int_equal(t[1], -1);
    assert_int_equal(t[2], a_blocks[2]);
    assert_int_equal(kv_pool_table_held(p, a), 3);
    assert_int_equal(kv_pool_block_ref(p, a_blocks[0]), 1); /* the fork's */
    /* lo past everything: the last hashed block (3) stays for the chain */
    assert_int_equal(kv_pool_drop_before(p, a, 18), 1);
    assert_int_equal(kv_pool_table_held(p, a), 2);
    /* the fork drops too: blocks 0, 1 are free now, still cached */
    assert_int_equal(kv_pool_drop_before(p, f, 9), 2);
    check(p);
    assert_int_equal(kv_pool_block_ref(p, a_blocks[0]), 0);
    assert_true(kv_pool_block_cached(p, a_blocks[0]));
    kv_pool_metrics m;
    kv_pool_get_metrics(p, &m);
    assert_int_equal(m.blocks_in_use, 3); /* a: 3, 4; f: 2, 3, 4 (shared) */
    /* a hit walks the chain over the dropped (evictable) blocks */
    int32_t hits[5];
    assert_int_equal(kv_pool_match_prefix(p, ids, 4, hits), 4);
    assert_int_equal(hits[0], a_blocks[0]);
    /* a grows after the drop: new blocks chain to the kept hashed block */
    assert_int_equal(kv_pool_allocate(p, a, NULL, 0, 4, NULL, NULL), PG_OK);
    kv_pool_commit(p, a, ids, 22);
    check(p);
    assert_int_equal(kv_pool_match_prefix(p, ids, 5, hits), 5);
    /* evict the freed blocks: the chain stops at block 0, nothing is hit */
    int32_t g = new_table(p);
    assert_int_equal(kv_pool_allocate(p, g, NULL, 0, 4 * kv_pool_num_free(p), NULL, NULL), PG_OK);
    assert_false(kv_pool_block_cached(p, a_blocks[0]) && kv_pool_block_cached(p, a_blocks[1]));
    assert_int_equal(kv_pool_match_prefix(p, ids, 5, hits), kv_pool_block_cached(p, a_blocks[0]) ? 1 : 0);
    kv_pool_table_delete(p, g);
    kv_pool_table_delete(p, f);
    kv_pool_table_delete(p, a);
    check(p);
    kv_pool_get_metrics(p, &m);
    assert_int_equal(m.blocks_in_use, 0);
    kv_pool_destroy(p);
}

/* Which pages of the KV buffer a run writes: a block never taken before is
 * taken only when no touched block is free without a cache entry, and then
 * the lowest such id (so the pages written are the leading ones, in
 * proportion to the blocks the run has held); a cached prefix is evicted
 * only when every block has been touched (it outlives untouched blocks, as
 * in vLLM's FreeKVCacheBlockQueue, where never-used blocks precede the
 * freed cached ones). Without prefix caching a run of one request at a
 * time never leaves its first blocks. */
static void test_touch_order(void **state)
{
    (void)state;
    const int32_t bs = 2;
    kv_pool *p = make_pool(8, bs, true);
    int32_t ids[6] = {1, 2, 3, 4, 5, 6};
    int32_t a = new_table(p), n;
    assert_int_equal(kv_pool_allocate(p, a, NULL, 0, 5, NULL, NULL), PG_OK);
    const int32_t *blk = kv_pool_table_blocks(p, a, &n);
    assert_int_equal(n, 3);
    for (int32_t i = 0; i < 3; i++) assert_int_equal(blk[i], i);
    kv_pool_commit(p, a, ids, 5); /* blocks 0 and 1 cached, 2 partly filled */
    kv_pool_table_delete(p, a);
    check(p);
    /* the touched uncached block first, then the untouched ones in address
     * order, while the cached prefix stays */
    int32_t b = new_table(p);
    assert_int_equal(kv_pool_allocate(p, b, NULL, 0, 2 * bs, NULL, NULL), PG_OK);
    blk = kv_pool_table_blocks(p, b, &n);
    assert_int_equal(n, 2);
    assert_int_equal(blk[0], 2);
    assert_int_equal(blk[1], 3);
    assert_int_equal(kv_pool_allocate(p, b, NULL, 0, 4 * bs, NULL, NULL), PG_OK);
    blk = kv_pool_table_blocks(p, b, &n);
    for (int32_t i = 2; i < 6; i++) assert_int_equal(blk[i], i + 2);
    int32_t hits[3];
    assert_int_equal(kv_pool_match_prefix(p, ids, 2, hits), 2);
    kv_pool_metrics m;
    kv_pool_get_metrics(p, &m);
    assert_int_equal(m.evictions, 0);
    check(p);
    kv_pool_table_delete(p, b);
    kv_pool_destroy(p);

    /* no prefix caching: 50 requests of 3 blocks one after another touch 3 */
    p = make_pool(64, bs, false);
    for (int r = 0; r < 50; r++) {
        int32_t t = new_table(p);
        assert_int_equal(kv_pool_allocate(p, t, NULL, 0, 3 * bs, NULL, NULL), PG_OK);
        kv_pool_table_delete(p, t);
    }
    assert_int_equal(touched_prefix(p), 3);
    kv_pool_destroy(p);

    /* prefix caching, distinct prompts: every released prefix is still
     * found while untouched blocks remain; the walk touches the pool */
    p = make_pool(12, bs, true);
    int32_t pr[6][4];
    for (int r = 0; r < 6; r++) {
        for (int32_t k = 0; k < 4; k++) pr[r][k] = 100 * r + k;
        int32_t t = new_table(p);
        assert_int_equal(kv_pool_allocate(p, t, NULL, 0, 4, NULL, NULL), PG_OK);
        kv_pool_commit(p, t, pr[r], 4);
        kv_pool_table_delete(p, t);
        check(p);
        for (int q = 0; q <= r; q++) assert_int_equal(kv_pool_match_prefix(p, pr[q], 2, hits), 2);
        assert_int_equal(touched_prefix(p), 2 * (r + 1));
    }
    kv_pool_destroy(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_refuses_bad_params),
        cmocka_unit_test(test_allocate_release_and_failed_call_changes_nothing),
        cmocka_unit_test(test_prefix_cache_hit_revives_evictable_blocks),
        cmocka_unit_test(test_eviction_order_is_lru_and_removes_entries),
        cmocka_unit_test(test_copy_on_write_after_fork),
        cmocka_unit_test(test_duplicate_blocks_chain_to_the_cached_copy),
        cmocka_unit_test(test_contiguous_reservation),
        cmocka_unit_test(test_random_walk_keeps_invariants),
        cmocka_unit_test(test_free_after_cached_and_epoch),
        cmocka_unit_test(test_drop_before_window),
        cmocka_unit_test(test_touch_order),
        cmocka_unit_test(test_prefix_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
