/* kv_pool: paged KV block pool, block tables, prefix cache (see kv_pool.h). */
#include "kv_pool.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "prefix_hash.h"

#define KV_NONE (-1)

typedef struct kv_block {
    int32_t ref;            /* table entries naming this block */
    int32_t prev, next;     /* free-queue links (KV_NONE at the ends) */
    bool in_queue;
    bool hashed;            /* full, content known: hash/parent/chain valid */
    bool cached;            /* in the hash map */
    int32_t n_filled;       /* written slots (0..block_size) */
    uint32_t epoch;         /* bumped each time the block is taken fresh */
    uint64_t hash;          /* prefix_hash_block(parent_hash, tokens) */
    uint64_t parent_hash;
    int32_t parent_id;      /* identity of the parent chain block, KV_NONE = root */
    uint32_t parent_epoch;
    int32_t chain_id;       /* identity children chain to: self if cached, the
                               cached equal block if a duplicate, KV_NONE if
                               not chainable */
    uint32_t chain_epoch;
    int32_t map_next;       /* next block in the same hash bucket */
} kv_block;

typedef struct kv_table {
    int32_t *blocks;        /* [cap] physical ids, n_blocks valid */
    int32_t n_blocks, cap;
    int32_t n_tokens;       /* slots covered (written or being written) */
    int32_t n_reserved;     /* contiguous layout: blocks taken up front */
    int32_t n_hashed;       /* leading blocks already given a hash */
    int32_t n_dropped;      /* leading entries dropped behind a sliding window
                               (KV_NONE, no reference) */
    uint32_t version;       /* bumped whenever an entry below n_blocks changes or
                               n_blocks shrinks (kv_pool_table_version) */
    uint32_t key;           /* prefix-cache key of its first block (kv_pool_table_set_key) */
    bool live;
} kv_table;

struct kv_pool {
    int32_t num_blocks, block_size;
    bool prefix_caching;
    kv_block *blocks;       /* [num_blocks] */
    int32_t *tokens;        /* [num_blocks][block_size] ids of hashed blocks */
    int32_t head, tail, n_queue;
    int32_t *buckets;       /* [n_buckets] first block of each hash chain */
    uint32_t bucket_mask;
    kv_table *tables;       /* [n_tables] */
    int32_t n_tables, cap_tables;
    int32_t *free_tables;   /* stack of dead handles */
    int32_t n_free_tables;
    /* metrics */
    int32_t peak_in_use;
    int32_t n_cached, n_evictable;
    int64_t filled_in_use;  /* sum of n_filled over referenced blocks */
    uint64_t cow_copies, evictions;
};

/* ---- free queue ----------------------------------------------------------- */

static void queue_remove(kv_pool *p, int32_t b)
{
    kv_block *k = &p->blocks[b];
    assert(k->in_queue);
    if (k->prev != KV_NONE) p->blocks[k->prev].next = k->next; else p->head = k->next;
    if (k->next != KV_NONE) p->blocks[k->next].prev = k->prev; else p->tail = k->prev;
    k->prev = k->next = KV_NONE;
    k->in_queue = false;
    p->n_queue--;
    if (k->cached) p->n_evictable--;
}

static void queue_push_tail(kv_pool *p, int32_t b)
{
    kv_block *k = &p->blocks[b];
    assert(!k->in_queue);
    k->prev = p->tail;
    k->next = KV_NONE;
    if (p->tail != KV_NONE) p->blocks[p->tail].next = b; else p->head = b;
    p->tail = b;
    k->in_queue = true;
    p->n_queue++;
    if (k->cached) p->n_evictable++;
}

static void queue_push_head(kv_pool *p, int32_t b)
{
    kv_block *k = &p->blocks[b];
    assert(!k->in_queue);
    k->next = p->head;
    k->prev = KV_NONE;
    if (p->head != KV_NONE) p->blocks[p->head].prev = b; else p->tail = b;
    p->head = b;
    k->in_queue = true;
    p->n_queue++;
    if (k->cached) p->n_evictable++;
}

/* ---- hash map (intrusive chaining over block ids) ------------------------- */

static void map_insert(kv_pool *p, int32_t b)
{
    uint32_t i = (uint32_t)p->blocks[b].hash & p->bucket_mask;
    p->blocks[b].map_next = p->buckets[i];
    p->buckets[i] = b;
    p->blocks[b].cached = true;
    p->n_cached++;
}

static void map_remove(kv_pool *p, int32_t b)
{
    uint32_t i = (uint32_t)p->blocks[b].hash & p->bucket_mask;
    int32_t *link = &p->buckets[i];
    while (*link != b) {
        assert(*link != KV_NONE);
        link = &p->blocks[*link].map_next;
    }
    *link = p->blocks[b].map_next;
    p->blocks[b].map_next = KV_NONE;
    p->blocks[b].cached = false;
    p->n_cached--;
}

/* The cached block with this hash, parent identity and tokens, or KV_NONE. */
static int32_t map_find(const kv_pool *p, uint64_t hash, int32_t parent_id,
                        uint32_t parent_epoch, const int32_t *ids)
{
    int32_t b = p->buckets[(uint32_t)hash & p->bucket_mask];
    for (; b != KV_NONE; b = p->blocks[b].map_next) {
        const kv_block *k = &p->blocks[b];
        /* a root block's parent_epoch is its key (kv_pool_table_set_key) */
        if (k->hash != hash || k->parent_id != parent_id || k->parent_epoch != parent_epoch) continue;
        if (memcmp(&p->tokens[(size_t)b * (size_t)p->block_size], ids,
                   (size_t)p->block_size * sizeof *ids) != 0) continue;
        return b;
    }
    return KV_NONE;
}

/* ---- block life ----------------------------------------------------------- */

static void block_ref(kv_pool *p, int32_t b)
{
    kv_block *k = &p->blocks[b];
    if (k->ref == 0) {
        if (k->in_queue) queue_remove(p, b);
        p->filled_in_use += k->n_filled;
    }
    k->ref++;
}

static void block_unref(kv_pool *p, int32_t b)
{
    kv_block *k = &p->blocks[b];
    assert(k->ref > 0);
    if (--k->ref == 0) {
        p->filled_in_use -= k->n_filled;
        if (k->cached) queue_push_tail(p, b); else queue_push_head(p, b);
    }
}

/* Takes the head of the free queue for new content (evicting its cache
 * entry), with ref 1. The caller checked there is one. */
static int32_t block_take_fresh(kv_pool *p)
{
    int32_t b = p->head;
    assert(b != KV_NONE);
    queue_remove(p, b);
    kv_block *k = &p->blocks[b];
    if (k->cached) {
        map_remove(p, b);
        p->evictions++;
    }
    k->hashed = false;
    k->n_filled = 0;
    k->epoch++;
    k->chain_id = KV_NONE;
    k->parent_id = KV_NONE;
    k->ref = 1;
    return b;
}

static int32_t pool_in_use(const kv_pool *p) { return p->num_blocks - p->n_queue; }

static void note_peak(kv_pool *p)
{
    if (pool_in_use(p) > p->peak_in_use) p->peak_in_use = pool_in_use(p);
}

/* ---- create / destroy ----------------------------------------------------- */

int kv_pool_create(kv_pool **out, const kv_pool_params *pp, pg_error *err)
{
    *out = NULL;
    if (pp->num_blocks < 1 || pp->num_blocks > (1 << 28))
        return pg_error_set(err, PG_EINVAL, "kv_pool: num_blocks must be in [1, 2^28], got %d",
                            (int)pp->num_blocks);
    if (pp->block_size < 1 || pp->block_size > 256 || (pp->block_size & (pp->block_size - 1)))
        return pg_error_set(err, PG_EINVAL,
                            "kv_pool: block_size must be a power of two in [1, 256], got %d",
                            (int)pp->block_size);
    kv_pool *p = calloc(1, sizeof *p);
    if (!p) goto fail_alloc;
    p->num_blocks = pp->num_blocks;
    p->block_size = pp->block_size;
    p->prefix_caching = pp->prefix_caching;
    uint32_t nb = 1;
    while (nb < (uint32_t)pp->num_blocks) nb <<= 1;
    p->bucket_mask = nb - 1;
    p->blocks = calloc((size_t)pp->num_blocks, sizeof *p->blocks);
    p->tokens = malloc((size_t)pp->num_blocks * (size_t)pp->block_size * sizeof *p->tokens);
    p->buckets = malloc((size_t)nb * sizeof *p->buckets);
    if (!p->blocks || !p->tokens || !p->buckets) goto fail_alloc;
    for (uint32_t i = 0; i < nb; i++) p->buckets[i] = KV_NONE;
    p->head = p->tail = KV_NONE;
    for (int32_t b = 0; b < p->num_blocks; b++) {
        kv_block *k = &p->blocks[b];
        k->prev = k->next = k->map_next = KV_NONE;
        k->parent_id = k->chain_id = KV_NONE;
        queue_push_tail(p, b);
    }
    *out = p;
    return PG_OK;
fail_alloc:
    kv_pool_destroy(p);
    return pg_error_set(err, PG_ENOMEM, "kv_pool: out of memory for %d blocks of %d tokens",
                        (int)pp->num_blocks, (int)pp->block_size);
}

void kv_pool_destroy(kv_pool *p)
{
    if (!p) return;
    for (int32_t t = 0; t < p->n_tables; t++) free(p->tables[t].blocks);
    free(p->tables);
    free(p->free_tables);
    free(p->buckets);
    free(p->tokens);
    free(p->blocks);
    free(p);
}

int32_t kv_pool_block_size(const kv_pool *p) { return p->block_size; }
int32_t kv_pool_num_blocks(const kv_pool *p) { return p->num_blocks; }
int32_t kv_pool_num_free(const kv_pool *p) { return p->n_queue; }

int32_t kv_pool_block_ref(const kv_pool *p, int32_t block)
{
    if (block < 0 || block >= p->num_blocks) return -1;
    return p->blocks[block].ref;
}

bool kv_pool_block_cached(const kv_pool *p, int32_t block)
{
    return block >= 0 && block < p->num_blocks && p->blocks[block].cached;
}

uint32_t kv_pool_block_epoch(const kv_pool *p, int32_t block)
{
    return block >= 0 && block < p->num_blocks ? p->blocks[block].epoch : 0;
}

void kv_pool_get_metrics(const kv_pool *p, kv_pool_metrics *m)
{
    memset(m, 0, sizeof *m);
    m->num_blocks = p->num_blocks;
    m->blocks_in_use = pool_in_use(p);
    m->blocks_in_use_peak = p->peak_in_use;
    m->blocks_cached = p->n_cached;
    m->blocks_evictable = p->n_evictable;
    m->filled_slots = p->filled_in_use;
    m->allocated_slots = (int64_t)m->blocks_in_use * p->block_size;
    m->cow_copies = p->cow_copies;
    m->evictions = p->evictions;
}

/* ---- tables --------------------------------------------------------------- */

int kv_pool_table_new(kv_pool *p, int32_t *table, pg_error *err)
{
    int32_t t;
    if (p->n_free_tables > 0) {
        t = p->free_tables[--p->n_free_tables];
    } else {
        if (p->n_tables == p->cap_tables) {
            int32_t cap = p->cap_tables ? 2 * p->cap_tables : 16;
            kv_table *nt = realloc(p->tables, (size_t)cap * sizeof *nt);
            if (!nt) goto oom;
            p->tables = nt;
            int32_t *nf = realloc(p->free_tables, (size_t)cap * sizeof *nf);
            if (!nf) goto oom;
            p->free_tables = nf;
            p->cap_tables = cap;
        }
        t = p->n_tables++;
        memset(&p->tables[t], 0, sizeof p->tables[t]);
    }
    kv_table *tb = &p->tables[t];
    tb->n_blocks = tb->n_tokens = tb->n_reserved = tb->n_hashed = tb->n_dropped = 0;
    tb->key = 0;
    tb->version++; /* a reused handle is not the table a caller saw before */
    tb->live = true;
    *table = t;
    return PG_OK;
oom:
    return pg_error_set(err, PG_ENOMEM, "kv_pool: out of memory for block tables");
}

void kv_pool_table_release(kv_pool *p, int32_t table)
{
    kv_table *tb = &p->tables[table];
    for (int32_t i = tb->n_blocks - 1; i >= tb->n_dropped; i--) block_unref(p, tb->blocks[i]);
    tb->n_blocks = tb->n_tokens = tb->n_reserved = tb->n_hashed = tb->n_dropped = 0;
    tb->version++;
}

int32_t kv_pool_drop_before(kv_pool *p, int32_t table, int32_t lo)
{
    kv_table *tb = &p->tables[table];
    if (tb->n_reserved > 0 || lo <= 0) return 0;
    int32_t n = lo / p->block_size; /* blocks whose every slot is < lo */
    /* with prefix caching the next commit chains to the last hashed block:
     * keep it (and anything not hashed yet) */
    if (p->prefix_caching && n > tb->n_hashed - 1) n = tb->n_hashed - 1;
    if (n > tb->n_blocks) n = tb->n_blocks;
    int32_t dropped = 0;
    /* later blocks first, as kv_pool_table_release: the earliest block of
     * a cached prefix is evicted last */
    for (int32_t i = n - 1; i >= tb->n_dropped; i--) {
        block_unref(p, tb->blocks[i]);
        tb->blocks[i] = KV_NONE;
        dropped++;
    }
    if (n > tb->n_dropped) tb->n_dropped = n;
    if (dropped > 0) tb->version++;
    return dropped;
}

int32_t kv_pool_table_held(const kv_pool *p, int32_t table)
{
    return p->tables[table].n_blocks - p->tables[table].n_dropped;
}

void kv_pool_table_delete(kv_pool *p, int32_t table)
{
    if (table < 0 || table >= p->n_tables || !p->tables[table].live) return;
    kv_pool_table_release(p, table);
    p->tables[table].live = false;
    p->free_tables[p->n_free_tables++] = table;
}

const int32_t *kv_pool_table_blocks(const kv_pool *p, int32_t table, int32_t *n_blocks)
{
    *n_blocks = p->tables[table].n_blocks;
    return p->tables[table].blocks;
}

int32_t kv_pool_table_tokens(const kv_pool *p, int32_t table) { return p->tables[table].n_tokens; }

uint32_t kv_pool_table_version(const kv_pool *p, int32_t table) { return p->tables[table].version; }

/* Grows a table's block array to hold n entries; false on OOM (nothing changed). */
static bool table_reserve_cap(kv_table *tb, int32_t n)
{
    if (n <= tb->cap) return true;
    int32_t cap = tb->cap ? tb->cap : 8;
    while (cap < n) cap *= 2;
    int32_t *nb = realloc(tb->blocks, (size_t)cap * sizeof *nb);
    if (!nb) return false;
    tb->blocks = nb;
    tb->cap = cap;
    return true;
}

/* ---- prefix cache --------------------------------------------------------- */

int32_t kv_pool_match_prefix(const kv_pool *p, const int32_t *ids, int32_t max_blocks,
                             int32_t *out)
{
    return kv_pool_match_prefix_key(p, 0, ids, max_blocks, out);
}

void kv_pool_table_set_key(kv_pool *p, int32_t table, uint32_t key)
{
    assert(p->tables[table].n_blocks == 0);
    p->tables[table].key = key;
}

int32_t kv_pool_match_prefix_key(const kv_pool *p, uint32_t key, const int32_t *ids, int32_t max_blocks,
                                 int32_t *out)
{
    if (!p->prefix_caching) return 0;
    uint64_t parent_hash = prefix_hash_root(key);
    int32_t parent_id = KV_NONE;
    uint32_t parent_epoch = key;
    int32_t n = 0;
    for (; n < max_blocks; n++) {
        const int32_t *blk = ids + (size_t)n * (size_t)p->block_size;
        uint64_t h = prefix_hash_block(parent_hash, blk, p->block_size);
        int32_t b = map_find(p, h, parent_id, parent_epoch, blk);
        if (b == KV_NONE) break;
        out[n] = b;
        parent_hash = h;
        parent_id = b;
        parent_epoch = p->blocks[b].epoch;
    }
    return n;
}

void kv_pool_commit(kv_pool *p, int32_t table, const int32_t *ids, int32_t n_computed)
{
    kv_table *tb = &p->tables[table];
    if (!p->prefix_caching) return;
    assert(n_computed <= tb->n_tokens);
    int32_t n_full = n_computed / p->block_size;
    if (n_full > tb->n_blocks) n_full = tb->n_blocks;
    for (int32_t i = tb->n_hashed; i < n_full; i++) {
        int32_t b = tb->blocks[i];
        kv_block *k = &p->blocks[b];
        if (k->hashed) continue; /* a prefix hit or a block shared by a fork */
        const int32_t *blk = ids + (size_t)i * (size_t)p->block_size;
        uint64_t parent_hash = prefix_hash_root(tb->key);
        int32_t parent_id = KV_NONE;
        uint32_t parent_epoch = tb->key;
        bool chainable = true;
        if (i > 0) {
            const kv_block *pk = &p->blocks[tb->blocks[i - 1]];
            assert(pk->hashed);
            parent_hash = pk->hash;
            parent_id = pk->chain_id;
            parent_epoch = pk->chain_epoch;
            chainable = pk->chain_id != KV_NONE;
        }
        assert(k->n_filled == p->block_size);
        k->hash = prefix_hash_block(parent_hash, blk, p->block_size);
        k->parent_hash = parent_hash;
        k->parent_id = parent_id;
        k->parent_epoch = parent_epoch;
        k->hashed = true;
        k->chain_id = KV_NONE;
        if (!chainable) continue;
        int32_t dup = map_find(p, k->hash, parent_id, parent_epoch, blk);
        if (dup != KV_NONE) {
            k->chain_id = dup;
            k->chain_epoch = p->blocks[dup].epoch;
        } else {
            memcpy(&p->tokens[(size_t)b * (size_t)p->block_size], blk,
                   (size_t)p->block_size * sizeof *blk);
            map_insert(p, b);
            k->chain_id = b;
            k->chain_epoch = k->epoch;
        }
    }
    if (n_full > tb->n_hashed) tb->n_hashed = n_full;
}

/* ---- allocation ----------------------------------------------------------- */

static int32_t ceil_div(int32_t a, int32_t b) { return (a + b - 1) / b; }

/* Fresh blocks needed, and how many of the hits sit in the free queue. */
static int32_t blocks_needed(const kv_pool *p, const kv_table *tb, const int32_t *hits,
                             int32_t n_hits, int32_t n_new_tokens, int32_t *hits_in_queue)
{
    int32_t bs = p->block_size;
    int32_t have = tb->n_blocks + n_hits;
    int32_t tokens = tb->n_tokens + n_hits * bs;
    int32_t need = ceil_div(tokens + n_new_tokens, bs) - have;
    if (need < 0) need = 0;
    if (n_new_tokens > 0 && tokens % bs != 0 && tb->n_blocks > 0) {
        /* writes go into the partly filled last block: copy it if shared */
        int32_t last = tb->blocks[tokens / bs];
        if (p->blocks[last].ref > 1) need++;
    }
    int32_t inq = 0;
    for (int32_t i = 0; i < n_hits; i++)
        if (p->blocks[hits[i]].ref == 0) inq++;
    *hits_in_queue = inq;
    return need;
}

int32_t kv_pool_blocks_needed(const kv_pool *p, int32_t table, const int32_t *hits,
                              int32_t n_hits, int32_t n_new_tokens)
{
    int32_t inq;
    return blocks_needed(p, &p->tables[table], hits, n_hits, n_new_tokens, &inq);
}

int32_t kv_pool_free_after(const kv_pool *p, int32_t table, const int32_t *hits,
                           int32_t n_hits, int32_t n_new_tokens)
{
    int32_t inq;
    int32_t need = blocks_needed(p, &p->tables[table], hits, n_hits, n_new_tokens, &inq);
    return p->n_queue - inq - need;
}

bool kv_pool_can_allocate(const kv_pool *p, int32_t table, const int32_t *hits,
                          int32_t n_hits, int32_t n_new_tokens)
{
    return kv_pool_free_after(p, table, hits, n_hits, n_new_tokens) >= 0;
}

static void fill_to(kv_pool *p, kv_table *tb, int32_t from, int32_t to)
{
    int32_t bs = p->block_size;
    for (int32_t i = from / bs; i < ceil_div(to, bs); i++) {
        kv_block *k = &p->blocks[tb->blocks[i]];
        int32_t end = (i + 1) * bs < to ? bs : to - i * bs;
        if (end > k->n_filled) {
            if (k->ref > 0) p->filled_in_use += end - k->n_filled;
            k->n_filled = end;
        }
    }
}

int kv_pool_allocate(kv_pool *p, int32_t table, const int32_t *hits, int32_t n_hits,
                     int32_t n_new_tokens, int32_t *cow_src, int32_t *cow_dst)
{
    kv_table *tb = &p->tables[table];
    int32_t bs = p->block_size;
    int32_t inq;
    if (cow_src) *cow_src = KV_NONE;
    if (cow_dst) *cow_dst = KV_NONE;
    assert(n_hits == 0 || tb->n_blocks == 0);
    int32_t need = blocks_needed(p, tb, hits, n_hits, n_new_tokens, &inq);
    if (need > p->n_queue - inq) return PG_ENOSPACE;
    int32_t total_blocks = ceil_div(tb->n_tokens + n_hits * bs + n_new_tokens, bs);
    if (total_blocks < tb->n_blocks + n_hits) total_blocks = tb->n_blocks + n_hits;
    if (!table_reserve_cap(tb, total_blocks)) return PG_ENOMEM;
    /* commit: hits first (they leave the queue before fresh blocks are taken) */
    for (int32_t i = 0; i < n_hits; i++) {
        block_ref(p, hits[i]);
        tb->blocks[tb->n_blocks++] = hits[i];
    }
    if (n_hits > 0) {
        tb->n_tokens = n_hits * bs;
        tb->n_hashed = n_hits;
        tb->version++;
    }
    if (n_new_tokens > 0 && tb->n_tokens % bs != 0) {
        int32_t li = tb->n_tokens / bs;
        int32_t src = tb->blocks[li];
        if (p->blocks[src].ref > 1) {
            int32_t dst = block_take_fresh(p);
            p->blocks[dst].n_filled = p->blocks[src].n_filled;
            p->filled_in_use += p->blocks[dst].n_filled;
            block_unref(p, src);
            tb->blocks[li] = dst;
            tb->version++; /* an entry a caller may have copied changed */
            p->cow_copies++;
            if (cow_src) *cow_src = src;
            if (cow_dst) *cow_dst = dst;
        }
    }
    while (tb->n_blocks < total_blocks) tb->blocks[tb->n_blocks++] = block_take_fresh(p);
    fill_to(p, tb, tb->n_tokens, tb->n_tokens + n_new_tokens);
    tb->n_tokens += n_new_tokens;
    note_peak(p);
    return PG_OK;
}

int kv_pool_reserve(kv_pool *p, int32_t table, int32_t n_blocks)
{
    kv_table *tb = &p->tables[table];
    assert(tb->n_blocks == 0);
    if (n_blocks > p->n_queue) return PG_ENOSPACE;
    if (!table_reserve_cap(tb, n_blocks)) return PG_ENOMEM;
    for (int32_t i = 0; i < n_blocks; i++) tb->blocks[tb->n_blocks++] = block_take_fresh(p);
    tb->n_reserved = n_blocks;
    tb->version++;
    note_peak(p);
    return PG_OK;
}

int kv_pool_fork(kv_pool *p, int32_t src, int32_t dst)
{
    kv_table *s = &p->tables[src], *d = &p->tables[dst];
    assert(d->n_blocks == 0 && s->n_reserved == 0);
    if (!table_reserve_cap(d, s->n_blocks)) return PG_ENOMEM;
    for (int32_t i = 0; i < s->n_blocks; i++) {
        if (i >= s->n_dropped) block_ref(p, s->blocks[i]);
        d->blocks[i] = s->blocks[i];
    }
    d->n_blocks = s->n_blocks;
    d->n_tokens = s->n_tokens;
    d->n_hashed = s->n_hashed;
    d->n_dropped = s->n_dropped;
    d->version++;
    return PG_OK;
}

int64_t kv_pool_table_entries(const kv_pool *p)
{
    int64_t n = 0;
    for (int32_t t = 0; t < p->n_tables; t++)
        if (p->tables[t].live) n += p->tables[t].n_blocks - p->tables[t].n_dropped;
    return n;
}

/* ---- invariant checker ---------------------------------------------------- */

int kv_pool_check(const kv_pool *p, pg_error *err)
{
    int32_t bs = p->block_size;
    int rc = PG_OK;
    int32_t *refs = calloc((size_t)p->num_blocks, sizeof *refs);
    if (!refs) return pg_error_set(err, PG_ENOMEM, "kv_pool_check: out of memory");
    /* tables */
    for (int32_t t = 0; t < p->n_tables; t++) {
        const kv_table *tb = &p->tables[t];
        if (!tb->live) {
            if (tb->n_blocks != 0) {
                rc = pg_error_set(err, PG_EINVAL, "kv_pool: dead table %d holds %d blocks",
                                  (int)t, (int)tb->n_blocks);
                goto out;
            }
            continue;
        }
        int32_t allowed = ceil_div(tb->n_tokens, bs);
        if (tb->n_reserved > allowed) allowed = tb->n_reserved;
        if (tb->n_blocks != allowed) {
            rc = pg_error_set(err, PG_EINVAL,
                              "kv_pool: table %d covers %d tokens: expected %d blocks, found %d",
                              (int)t, (int)tb->n_tokens, (int)allowed, (int)tb->n_blocks);
            goto out;
        }
        if (tb->n_dropped < 0 || tb->n_dropped > tb->n_blocks ||
            (p->prefix_caching && tb->n_dropped > 0 && tb->n_dropped >= tb->n_hashed)) {
            rc = pg_error_set(err, PG_EINVAL, "kv_pool: table %d: %d dropped blocks of %d (%d hashed)",
                              (int)t, (int)tb->n_dropped, (int)tb->n_blocks, (int)tb->n_hashed);
            goto out;
        }
        for (int32_t i = 0; i < tb->n_blocks; i++) {
            int32_t b = tb->blocks[i];
            if (i < tb->n_dropped) {
                if (b != KV_NONE) {
                    rc = pg_error_set(err, PG_EINVAL, "kv_pool: table %d entry %d: dropped, but "
                                      "names block %d", (int)t, (int)i, (int)b);
                    goto out;
                }
                continue;
            }
            if (b < 0 || b >= p->num_blocks) {
                rc = pg_error_set(err, PG_EINVAL, "kv_pool: table %d entry %d: block %d out of range",
                                  (int)t, (int)i, (int)b);
                goto out;
            }
            refs[b]++;
            int32_t filled = tb->n_tokens - i * bs;
            if (filled > bs) filled = bs;
            if (filled > 0 && p->blocks[b].n_filled < filled) {
                rc = pg_error_set(err, PG_EINVAL,
                                  "kv_pool: table %d entry %d: block %d has %d filled slots, "
                                  "expected at least %d", (int)t, (int)i, (int)b,
                                  (int)p->blocks[b].n_filled, (int)filled);
                goto out;
            }
        }
    }
    /* blocks: ref counts and states */
    int32_t n_in_queue = 0, n_cached = 0, n_evictable = 0;
    int64_t filled = 0;
    for (int32_t b = 0; b < p->num_blocks; b++) {
        const kv_block *k = &p->blocks[b];
        if (k->ref != refs[b]) {
            rc = pg_error_set(err, PG_EINVAL, "kv_pool: block %d: ref count %d, but %d table entries",
                              (int)b, (int)k->ref, (int)refs[b]);
            goto out;
        }
        if ((k->ref == 0) != k->in_queue) {
            rc = pg_error_set(err, PG_EINVAL, "kv_pool: block %d: ref %d but %s the free queue",
                              (int)b, (int)k->ref, k->in_queue ? "in" : "not in");
            goto out;
        }
        if (k->cached && !k->hashed) {
            rc = pg_error_set(err, PG_EINVAL, "kv_pool: block %d cached without a hash", (int)b);
            goto out;
        }
        if (k->in_queue) n_in_queue++;
        if (k->cached) n_cached++;
        if (k->cached && k->in_queue) n_evictable++;
        if (k->ref > 0) filled += k->n_filled;
        if (k->cached) {
            const int32_t *blk = &p->tokens[(size_t)b * (size_t)bs];
            if (prefix_hash_block(k->parent_hash, blk, bs) != k->hash) {
                rc = pg_error_set(err, PG_EINVAL,
                                  "kv_pool: block %d: cache entry hash does not match its tokens",
                                  (int)b);
                goto out;
            }
            if (map_find(p, k->hash, k->parent_id, k->parent_epoch, blk) != b) {
                rc = pg_error_set(err, PG_EINVAL,
                                  "kv_pool: block %d: cache entry not findable (or duplicated)",
                                  (int)b);
                goto out;
            }
        }
    }
    /* the free queue: linked both ways, counted */
    int32_t walked = 0, prev = KV_NONE;
    for (int32_t b = p->head; b != KV_NONE; b = p->blocks[b].next) {
        if (!p->blocks[b].in_queue || p->blocks[b].prev != prev || walked > p->num_blocks) {
            rc = pg_error_set(err, PG_EINVAL, "kv_pool: free queue broken at block %d", (int)b);
            goto out;
        }
        prev = b;
        walked++;
    }
    if (prev != p->tail || walked != n_in_queue || walked != p->n_queue) {
        rc = pg_error_set(err, PG_EINVAL,
                          "kv_pool: free queue: counted %d, walked %d, flagged %d blocks",
                          (int)p->n_queue, (int)walked, (int)n_in_queue);
        goto out;
    }
    int32_t in_map = 0;
    for (uint32_t i = 0; i <= p->bucket_mask; i++)
        for (int32_t b = p->buckets[i]; b != KV_NONE; b = p->blocks[b].map_next) in_map++;
    if (in_map != n_cached || n_cached != p->n_cached || n_evictable != p->n_evictable) {
        rc = pg_error_set(err, PG_EINVAL,
                          "kv_pool: cache: %d entries in the map, %d blocks flagged, counter %d; "
                          "evictable %d vs counter %d", (int)in_map, (int)n_cached,
                          (int)p->n_cached, (int)n_evictable, (int)p->n_evictable);
        goto out;
    }
    if (filled != p->filled_in_use) {
        rc = pg_error_set(err, PG_EINVAL, "kv_pool: filled slots %lld, counter %lld",
                          (long long)filled, (long long)p->filled_in_use);
        goto out;
    }
out:
    free(refs);
    return rc;
}
