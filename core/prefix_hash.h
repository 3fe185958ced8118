/* prefix_hash: the content hash of a full KV block for prefix caching.
 * A block's hash is chained from its parent's (the previous block of the
 * same sequence; PREFIX_HASH_ROOT for the first block) and its token ids,
 * so equal hashes mean "same tokens after the same prefix" up to 64-bit
 * collisions. The block pool never trusts a hash alone: it also compares
 * the token ids and the parent block's identity (kv_pool.c).
 *
 * The mix is splitmix64's finalizer (Steele, Lea, Flood 2014) applied per
 * token; no third-party code.
 */
#ifndef PG_PREFIX_HASH_H
#define PG_PREFIX_HASH_H

#include <stdint.h>

#define PREFIX_HASH_ROOT UINT64_C(0x6a09e667f3bcc908)

/* The chain's root under a key (kv_pool_match_prefix_key): PREFIX_HASH_ROOT
 * for key 0, a mix of the key otherwise. */
uint64_t prefix_hash_root(uint32_t key);

/* Hash of a block holding ids[0..n-1] whose parent block hashed to parent. */
uint64_t prefix_hash_block(uint64_t parent, const int32_t *ids, int32_t n);

#endif /* PG_PREFIX_HASH_H */
