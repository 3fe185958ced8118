/* kv_write: stores each token's k and v heads into its KV slot (vLLM's
 * reshape_and_cache). Bandwidth: 2 * T * nkv * hd elements read and written. */
#include "qkv_steps.cuh" /* kv_store (shared with rope_kv.cu) */

/* grid (T), block 128: thread j copies elements e = j, j+128, ... of the
 * nkv * hd of token t (e = kvh * hd + d):
 *   k_cache[slot][kvh][d] = qkv[t][(nh + kvh) * hd + d]
 *   v_cache[slot][kvh][d] = qkv[t][(nh + nkv + kvh) * hd + d]
 * slot = slots[t] = block_id * block_size + offset; the planes are
 * [num_blocks][block_size][nkv][hd], so slot * nkv * hd + e addresses it.
 * A negative slot (padding) is skipped. */
template <typename T, typename KV>
static __global__ void kv_write_kernel(KV *__restrict__ k_cache, KV *__restrict__ v_cache,
                                       const T *__restrict__ qkv,
                                       const int32_t *__restrict__ slots, int32_t nh,
                                       int32_t nkv, int32_t hd)
{
    int32_t t = blockIdx.x;
    int32_t slot = slots[t];
    if (slot < 0)
        return;
    int32_t n = nkv * hd;
    const T *row = qkv + (size_t)t * (size_t)(nh + 2 * nkv) * (size_t)hd;
    const T *k = row + (size_t)nh * hd;
    const T *v = k + (size_t)n;
    size_t dst = (size_t)slot * (size_t)n;
    for (int32_t e = threadIdx.x; e < n; e += blockDim.x) {
        k_cache[dst + e] = kv_store<T, KV>(k[e]);
        v_cache[dst + e] = kv_store<T, KV>(v[e]);
    }
}

extern "C" int pgk_kv_write(void *k_cache, void *v_cache, int kv_dt, const void *qkv, int dt,
                            int32_t nh, int32_t nkv, int32_t hd, const pgk_batch *b,
                            pgk_launch *lk)
{
    int rc = pgk_check_act_kv_pair("kv_write", dt, kv_dt, lk->err);
    if (rc)
        return rc;
    if (nh < 1 || nkv < 1 || hd < 1 || b->num_tokens < 1)
        return pg_error_set(lk->err, PG_EINVAL,
                            "kv_write: expected nh, nkv, hd, T >= 1, got %d, %d, %d, %d",
                            (int)nh, (int)nkv, (int)hd, (int)b->num_tokens);
    unsigned grid = (unsigned)b->num_tokens;
    PGK_DISPATCH_ACT_KV(dt, kv_dt, kv_write_kernel<T, KV><<<grid, 128, 0, lk->st>>>(
        (KV *)k_cache, (KV *)v_cache, (const T *)qkv, b->slots, nh, nkv, hd));
    return pgk_check_launch("kv_write_kernel", lk);
}
