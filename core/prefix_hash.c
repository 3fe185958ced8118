/* prefix_hash: chained block hashes (see prefix_hash.h). */
#include "prefix_hash.h"

static uint64_t prefix_hash_mix(uint64_t z)
{
    /* splitmix64 finalizer */
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

uint64_t prefix_hash_block(uint64_t parent, const int32_t *ids, int32_t n)
{
    uint64_t h = prefix_hash_mix(parent ^ ((uint64_t)(uint32_t)n << 32));
    for (int32_t i = 0; i < n; i++) {
        h += UINT64_C(0x9e3779b97f4a7c15);
        h = prefix_hash_mix(h ^ (uint64_t)(uint32_t)ids[i]);
    }
    return h;
}

uint64_t prefix_hash_root(uint32_t key)
{
    return key == 0 ? PREFIX_HASH_ROOT : prefix_hash_mix(PREFIX_HASH_ROOT ^ ((uint64_t)key << 1 | 1));
}
