/* gather: dst[r] = src[logits_rows[r]] — picks the rows that need logits
 * (the last scheduled token of every sampling sequence) before the final
 * norm and lm_head, so those run on L rows instead of T. */
#include "cuda_common.cuh"

/* grid (L), block 256: dst[r][i] = src[rows[r]][i] for i = tid, tid+256, ...
 * dst [L][dim], src [T][dim]. */
template <typename T>
static __global__ void gather_rows_kernel(T *__restrict__ dst, const T *__restrict__ src,
                                          const int32_t *__restrict__ rows, int32_t dim)
{
    int32_t r = blockIdx.x;
    const T *s = src + (size_t)rows[r] * dim;
    T *d = dst + (size_t)r * dim;
    for (int32_t i = threadIdx.x; i < dim; i += blockDim.x)
        d[i] = s[i];
}

extern "C" int pgk_gather_rows(void *dst, const void *src, int dt, int32_t dim, const pgk_batch *b,
                               pgk_launch *lk)
{
    int rc = pgk_check_act_dtype("gather_rows", dt, lk->err);
    if (rc)
        return rc;
    if (dim < 1 || b->num_logits < 0)
        return pg_error_set(lk->err, PG_EINVAL, "gather_rows: expected dim >= 1 and L >= 0, got %d, %d",
                            (int)dim, (int)b->num_logits);
    if (b->num_logits == 0)
        return 0;
    dim3 grid((unsigned)b->num_logits);
    PGK_DISPATCH_ACT(dt, gather_rows_kernel<T><<<grid, 256, 0, lk->st>>>(
        (T *)dst, (const T *)src, b->logits_rows, dim));
    return pgk_check_launch("gather_rows_kernel", lk);
}
