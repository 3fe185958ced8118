/* kv_pool: the paged KV block pool (PagedAttention, Kwon et al. SOSP 2023;
 * the bookkeeping follows vLLM v1's KVCacheManager / BlockPool).
 *
 * A fixed pool of num_blocks physical blocks of block_size token slots.
 * Physical block b holds slots b*block_size .. b*block_size + block_size-1
 * in every layer's K and V plane (executor.h); the pool only does the
 * bookkeeping, never touches KV data.
 *
 * Each block is exactly one of
 *   free               ref 0, in the free queue, no cache entry
 *   cached-evictable   ref 0, in the free queue, has a prefix-cache entry
 *   referenced         ref > 0 (= number of block-table entries naming it),
 *                      not in the free queue, may have a cache entry
 * The free queue is a doubly linked list over block ids (O(1) removal from
 * the middle when a prefix-cache hit revives an evictable block). Allocation
 * takes from the head; freed blocks with a cache entry go to the tail (so
 * they are evicted last, LRU), freed blocks without one go to the head.
 * Taking an evictable block evicts it (its cache entry is removed).
 *
 * Which memory a run touches (the KV buffer's pages are faulted in, and on
 * a first touch zeroed by the kernel, as blocks are first written): the
 * queue starts in id order, so it is always [free blocks freed since,
 * newest first] [never-taken blocks, ascending id] [evictable blocks, least
 * recently freed first]. A never-taken block is taken only when no touched
 * block is free without a cache entry, and then the lowest id: the touched
 * blocks are always ids 0 .. n-1 (tests/core/test_kv_pool.c
 * test_touch_order, and the random walk checks it after every step).
 * Without prefix caching n is the peak of blocks in use. With prefix
 * caching a long run of distinct prompts walks the whole pool before its
 * first eviction: an evictable block is the only one holding its prefix,
 * and taking it before an untouched block would evict a prefix that vLLM
 * keeps (vllm/v1/core/block_pool.py: freed blocks, cached or not, are
 * appended to the free queue's tail and new blocks pop its head, so never
 * used blocks go first). A first touch costs the kernel 0.04 ms per MiB
 * when the host has the memory at hand (up to 2.6 ms on a VM that hands
 * freed memory back); a recomputed 16-token block costs a prefill, so the
 * cache is kept and the walk is the price (bench/RESULTS.md, 2026-11-28).
 *
 * Block tables live in the pool (so the invariant checker can see them) and
 * are named by a small integer handle. A table covers n_tokens token slots
 * with ceil(n_tokens / block_size) blocks (contiguous-layout tables may
 * hold more: their reservation).
 *
 * Prefix caching: when a block of a table becomes full (kv_pool_commit),
 * its hash = prefix_hash_block(parent hash, its token ids) and it enters
 * the hash map. "Full" may mean "being filled by the current step": the
 * scheduler commits a block as soon as every one of its tokens is scheduled
 * (computed this step or earlier), so a request admitted later in the same
 * step shares it (vLLM v1 caches blocks at allocation the same way); that
 * is sound because the forward writes every scheduled token's K/V of a
 * layer before any attention of that layer reads (core/model.c). A lookup (kv_pool_match_prefix) walks the chain block by
 * block and accepts a candidate only if its hash, its token ids AND its
 * parent block's identity (block id + the epoch it was allocated in) all
 * match the block matched one step earlier, so a 64-bit collision can
 * never return a wrong block. If an equal block is already cached, a newly
 * full duplicate is not inserted; it records the cached one as its
 * canonical identity so its own children still chain to the cache.
 *
 * Operations that can fail are check-then-commit: on PG_ENOSPACE nothing
 * is changed.
 */
#ifndef PG_KV_POOL_H
#define PG_KV_POOL_H

#include <stdbool.h>
#include <stdint.h>

#include "pg_error.h"

typedef struct kv_pool kv_pool;

typedef struct kv_pool_params {
    int32_t num_blocks;     /* >= 1 */
    int32_t block_size;     /* power of two in [1, 256] */
    bool prefix_caching;    /* cache full blocks by content hash */
} kv_pool_params;

typedef struct kv_pool_metrics {
    int32_t num_blocks;
    int32_t blocks_in_use;       /* referenced now */
    int32_t blocks_in_use_peak;
    int32_t blocks_cached;       /* with a prefix-cache entry (referenced or evictable) */
    int32_t blocks_evictable;    /* ref 0 with a cache entry */
    int64_t filled_slots;        /* written token slots of referenced blocks */
    int64_t allocated_slots;     /* blocks_in_use * block_size */
    uint64_t cow_copies;
    uint64_t evictions;          /* cached blocks taken for new content */
} kv_pool_metrics;

int kv_pool_create(kv_pool **out, const kv_pool_params *p, pg_error *err);
void kv_pool_destroy(kv_pool *p); /* accepts NULL */

int32_t kv_pool_block_size(const kv_pool *p);
int32_t kv_pool_num_blocks(const kv_pool *p);
/* Blocks that can be taken now (free + evictable). */
int32_t kv_pool_num_free(const kv_pool *p);
/* Ref count of a block (tests, fake backends). */
int32_t kv_pool_block_ref(const kv_pool *p, int32_t block);
/* Whether a block has a prefix-cache entry (tests, fake backends). */
bool kv_pool_block_cached(const kv_pool *p, int32_t block);
/* A counter bumped each time the block is taken for new content (not when
 * a prefix-cache hit revives it): slots written under an older epoch are
 * stale (tests, fake backends). */
uint32_t kv_pool_block_epoch(const kv_pool *p, int32_t block);
void kv_pool_get_metrics(const kv_pool *p, kv_pool_metrics *m);

/* ---- block tables ------------------------------------------------------- */
/* A new empty table; *table is its handle (valid until kv_pool_table_delete). */
int kv_pool_table_new(kv_pool *p, int32_t *table, pg_error *err);
/* Releases the table's blocks and the handle. */
void kv_pool_table_delete(kv_pool *p, int32_t table);
/* Releases every block of the table (ref -1 each, last block first so the
 * earlier blocks of a prefix are evicted later); the table becomes empty. */
void kv_pool_table_release(kv_pool *p, int32_t table);
/* Borrowed; valid until the next call that changes this table. */
const int32_t *kv_pool_table_blocks(const kv_pool *p, int32_t table, int32_t *n_blocks);
/* Blocks the table references now (its entries less the dropped ones). */
int32_t kv_pool_table_held(const kv_pool *p, int32_t table);
/* Sliding window (vLLM's SlidingWindowManager): drops the table's leading
 * blocks whose every slot is a position < lo, the lowest position any
 * query of this sequence will still read. Their entries become -1 (null:
 * the table keeps its length, slot arithmetic is unchanged) and lose their
 * reference; a block no other table names goes back to the free queue
 * like any released block (kept in the prefix cache as evictable). With
 * prefix caching only blocks before the last hashed one are dropped (the
 * next commit chains to that one's hash). A prefix-cache hit never returns
 * a dropped entry: kv_pool_match_prefix walks the chain from the root and
 * stops at the first block no longer cached, so a hit is always a run of
 * present blocks. Contiguous reservations are never dropped. Returns the
 * number of entries dropped now. */
int32_t kv_pool_drop_before(kv_pool *p, int32_t table, int32_t lo);
int32_t kv_pool_table_tokens(const kv_pool *p, int32_t table);
/* A counter that changes whenever the table changes other than by blocks
 * appended at its end (kv_pool_allocate's fresh blocks): release, a
 * copy-on-write replacement, dropped entries, a fork into it, prefix hits,
 * a reservation, a new handle. While it and the handle stay the same, the
 * entries a caller copied before are still the table's (the engine's block
 * table rows are updated by their new entries only: engine.c build_batch). */
uint32_t kv_pool_table_version(const kv_pool *p, int32_t table);

/* ---- prefix cache --------------------------------------------------------- */
/* Looks up the full blocks of ids[0 .. max_blocks*block_size-1] in order and
 * writes the physical ids of the leading blocks found to out (room for
 * max_blocks); returns how many. Read-only (no ref change). 0 when prefix
 * caching is off. */
int32_t kv_pool_match_prefix(const kv_pool *p, const int32_t *ids, int32_t max_blocks,
                             int32_t *out);
/* The same under a key (vLLM's block-hash extra keys: the LoRA adapter,
 * issue 33): a table's first block is hashed from prefix_hash_root(key) and
 * its parent identity is the key, so blocks computed under one key are
 * never found under another (even on a 64-bit hash collision). Key 0 is
 * kv_pool_match_prefix's (the base model). */
int32_t kv_pool_match_prefix_key(const kv_pool *p, uint32_t key, const int32_t *ids, int32_t max_blocks,
                                 int32_t *out);
/* Sets the key of an empty table (new tables have key 0); its committed
 * blocks chain from it. */
void kv_pool_table_set_key(kv_pool *p, int32_t table, uint32_t key);

/* ---- allocation (check-then-commit) --------------------------------------- */
/* Fresh blocks kv_pool_allocate would take for the same arguments,
 * including the copy-on-write block when the table's partly filled last
 * block is shared. */
int32_t kv_pool_blocks_needed(const kv_pool *p, int32_t table, const int32_t *hits,
                              int32_t n_hits, int32_t n_new_tokens);
bool kv_pool_can_allocate(const kv_pool *p, int32_t table, const int32_t *hits,
                          int32_t n_hits, int32_t n_new_tokens);
/* Blocks that would remain free or evictable after kv_pool_allocate with
 * the same arguments (hits revived from the evictable end count as taken);
 * negative when the pool is that many blocks short. kv_pool_can_allocate
 * is kv_pool_free_after(...) >= 0. The admission watermark uses it. */
int32_t kv_pool_free_after(const kv_pool *p, int32_t table, const int32_t *hits,
                           int32_t n_hits, int32_t n_new_tokens);
/* Extends the table by n_new_tokens slots: first, only on an empty table,
 * the prefix-cache hits (ref +1 each, n_hits*block_size tokens), then a
 * private copy of the last block if it is partly filled and shared
 * (copy-on-write: *cow_src / *cow_dst get the pair to copy, else -1), then
 * fresh blocks. PG_ENOSPACE (nothing changed) when the pool cannot give
 * enough blocks; PG_ENOMEM (nothing changed) if the table cannot grow. */
int kv_pool_allocate(kv_pool *p, int32_t table, const int32_t *hits, int32_t n_hits,
                     int32_t n_new_tokens, int32_t *cow_src, int32_t *cow_dst);
/* Contiguous layout: takes n_blocks fresh blocks for an empty table up
 * front (never shared, never cached). PG_ENOSPACE: nothing changed. */
int kv_pool_reserve(kv_pool *p, int32_t table, int32_t n_blocks);
/* Makes empty table dst share every block of src (ref +1 each), n_tokens
 * too (parallel sampling: the forks diverge by copy-on-write). PG_ENOMEM
 * (nothing changed) if the table cannot grow. */
int kv_pool_fork(kv_pool *p, int32_t src, int32_t dst);
/* Declares the first n_computed slots of the table written with ids[0 ..
 * n_computed-1] (the sequence's tokens), or scheduled to be written by the
 * current step before anything reads them: every block that is now full
 * and not hashed yet gets its hash and, with prefix caching, a cache entry
 * (findable by kv_pool_match_prefix at once). n_computed <= the table's
 * tokens. A caller that commits scheduled tokens must not then release the
 * table before the step's forward has run (the cache would name a block
 * whose K/V were never written). */
void kv_pool_commit(kv_pool *p, int32_t table, const int32_t *ids, int32_t n_computed);

/* ---- invariants ------------------------------------------------------------ */
/* Checks: every block is exactly one of free / cached-evictable / referenced;
 * the free queue is well linked and counted; ref count == number of table
 * entries naming the block (dropped entries are -1 and lead the table); no table holds more than ceil(n_tokens/bs)
 * blocks (or its reservation); every cache entry names a block whose stored
 * tokens hash (with its parent hash) to the entry's hash, and is findable.
 * Returns 0 or PG_EINVAL with the first violation in err. O(num_blocks +
 * table entries). */
int kv_pool_check(const kv_pool *p, pg_error *err);
/* Block table entries held now, summed over every table (dropped entries
 * not counted): the blocks the live sequences would hold if nothing were
 * shared (beam search's and parallel sampling's "without sharing"; the
 * bench's beam section). O(tables). */
int64_t kv_pool_table_entries(const kv_pool *p);

#endif /* PG_KV_POOL_H */
