/* embed: x[t] = table[token_ids[t]] (the embedding lookup).
 * Bandwidth: T * H elements read and written; negligible next to the
 * weights a step reads. */
#include "cuda_common.cuh"

/* grid (T), block 256: thread i copies x[t][i + k*blockDim] for k = 0, 1, ...
 *   x[t][i] = table[id][i], id = token_ids[t]; id outside [0, V) -> 0.
 * x [T][H], table [V][H], same element type. */
template <typename T>
static __global__ void embed_kernel(T *__restrict__ x, const T *__restrict__ table,
                                    const int32_t *__restrict__ token_ids, int32_t H, int32_t V)
{
    int32_t t = blockIdx.x;
    int32_t id = token_ids[t];
    T *row = x + (size_t)t * H;
    if (id < 0 || id >= V) {
        for (int32_t i = threadIdx.x; i < H; i += blockDim.x)
            row[i] = from_f32<T>(0.0f);
        return;
    }
    const T *src = table + (size_t)id * H;
    for (int32_t i = threadIdx.x; i < H; i += blockDim.x)
        row[i] = src[i];
}

extern "C" int pgk_embed(void *x, const void *table, int dt, int32_t H, int32_t V,
                         const pgk_batch *b, pgk_launch *lk)
{
    int rc = pgk_check_act_dtype("embed", dt, lk->err);
    if (rc)
        return rc;
    if (H < 1 || V < 1 || b->num_tokens < 1)
        return pg_error_set(lk->err, PG_EINVAL, "embed: expected H, V, T >= 1, got %d, %d, %d",
                            (int)H, (int)V, (int)b->num_tokens);
    dim3 grid((unsigned)b->num_tokens);
    PGK_DISPATCH_ACT(dt, embed_kernel<T><<<grid, 256, 0, lk->st>>>(
        (T *)x, (const T *)table, b->token_ids, H, V));
    return pgk_check_launch("embed_kernel", lk);
}
