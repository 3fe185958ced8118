/* copy_blocks: copy-on-write of whole KV blocks in every plane (vLLM's
 * copy_blocks). One launch for all pairs and planes. */
#include "cuda_common.cuh"

/* grid (n_pairs, n_planes), block 256: for pair k, plane p:
 *   kv[p*plane + dst*block + i] = kv[p*plane + src*block + i],  i < block_elems
 * src = pairs[2k], dst = pairs[2k+1]; copied in 16-byte words when every
 * offset is a multiple of 16 bytes (vec16), else element by element. */
template <typename KV>
static __global__ void copy_blocks_kernel(KV *kv, size_t plane_elems, size_t block_elems,
                                          const int32_t *__restrict__ pairs, int vec16)
{
    int32_t k = blockIdx.x;
    size_t p = blockIdx.y;
    size_t src = p * plane_elems + (size_t)pairs[2 * k] * block_elems;
    size_t dst = p * plane_elems + (size_t)pairs[2 * k + 1] * block_elems;
    if (vec16) {
        const uint4 *s = reinterpret_cast<const uint4 *>(kv + src);
        uint4 *d = reinterpret_cast<uint4 *>(kv + dst);
        size_t n = block_elems * sizeof(KV) / 16u;
        for (size_t i = threadIdx.x; i < n; i += blockDim.x)
            d[i] = s[i];
    } else {
        for (size_t i = threadIdx.x; i < block_elems; i += blockDim.x)
            kv[dst + i] = kv[src + i];
    }
}

extern "C" int pgk_copy_blocks(void *kv, int kv_dt, int32_t n_planes, size_t plane_elems,
                               size_t block_elems, const int32_t *d_pairs, int32_t n_pairs,
                               pgk_launch *lk)
{
    int rc = pgk_check_kv_dtype("copy_blocks", kv_dt, lk->err);
    if (rc)
        return rc;
    if (n_pairs == 0)
        return 0;
    if (n_pairs < 0 || n_planes < 1 || n_planes > 65535 || block_elems == 0 ||
        block_elems > plane_elems)
        return pg_error_set(lk->err, PG_EINVAL,
                            "copy_blocks: expected n_pairs >= 0, 1 <= n_planes <= 65535 and "
                            "0 < block_elems <= plane_elems, got %d, %d, %zu, %zu",
                            (int)n_pairs, (int)n_planes, block_elems, plane_elems);
    size_t eb = pgk_dtype_bytes(kv_dt);
    int vec16 = pgk_aligned(kv, 16) && (block_elems * eb) % 16u == 0 && (plane_elems * eb) % 16u == 0;
    dim3 grid((unsigned)n_pairs, (unsigned)n_planes);
    PGK_DISPATCH_KV(kv_dt, copy_blocks_kernel<KV><<<grid, 256, 0, lk->st>>>(
        (KV *)kv, plane_elems, block_elems, d_pairs, vec16));
    return pgk_check_launch("copy_blocks_kernel", lk);
}
