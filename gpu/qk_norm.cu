/* qk_norm: Qwen3's q_norm / k_norm (modeling_qwen3.py Qwen3Attention:
 * q_norm(q_proj(x).view(..., head_dim)) before RoPE; Qwen3RMSNorm is
 * LlamaRMSNorm over the head_dim values of one head). In place on the q and
 * k heads of qkv, in f32, rounded once to the activation type:
 *   v[i] = round(v[i] * rsqrt(mean(v^2) + eps) * w[i])
 * with w = q_w for the nh q heads and k_w for the nkv k heads; the v heads
 * are untouched. Bandwidth: 2 * T * (nh + nkv) * hd elements. */
#include "qkv_steps.cuh" /* qkv_head_norm (shared with rope_kv.cu) */

/* grid (T * (nh + nkv)): block x is head h = x % (nh + nkv) of token
 * t = x / (nh + nkv); block 32 (one warp, whatever the batch, so a head's
 * reduction order is fixed): lane l owns elements l, l + 32, ...
 *   ss = warp_sum(sum of v*v over the lane's elements)    (f32)
 *   v[i] = v[i] * (1 / sqrtf(ss / hd + eps)) * w[i]
 * Each element is read and written by the same lane.
 * qkv [T][(nh + 2 nkv) * hd] T; q_w, k_w [hd] f32. */
template <typename T>
static __global__ void qk_norm_kernel(T *qkv, const float *__restrict__ q_w, const float *__restrict__ k_w,
                                      int32_t nh, int32_t nkv, int32_t hd, float eps)
{
    const int32_t nheads = nh + nkv;
    const size_t t = blockIdx.x / (unsigned)nheads;
    const int32_t h = (int32_t)(blockIdx.x % (unsigned)nheads);
    T *v = qkv + t * (size_t)(nh + 2 * nkv) * (size_t)hd + (size_t)h * (size_t)hd;
    qkv_head_norm(v, h < nh ? q_w : k_w, hd, eps, threadIdx.x);
}

extern "C" int pgk_qk_norm(void *qkv, const float *q_w, const float *k_w, int dt, int32_t T_rows, int32_t nh,
                           int32_t nkv, int32_t hd, float eps, pgk_launch *lk)
{
    int rc = pgk_check_act_dtype("qk_norm", dt, lk->err);
    if (rc)
        return rc;
    if (T_rows < 1 || nh < 1 || nkv < 1 || hd < 1)
        return pg_error_set(lk->err, PG_EINVAL, "qk_norm: expected T, nh, nkv, hd >= 1, got %d, %d, %d, %d",
                            (int)T_rows, (int)nh, (int)nkv, (int)hd);
    if (!(eps >= 0.0f))
        return pg_error_set(lk->err, PG_EINVAL, "qk_norm: eps must be >= 0, got %g", (double)eps);
    const int64_t blocks = (int64_t)T_rows * (int64_t)(nh + nkv);
    if (blocks > INT32_MAX)
        return pg_error_set(lk->err, PG_EINVAL, "qk_norm: T * (nh + nkv) = %lld blocks: expected at most %d",
                            (long long)blocks, (int)INT32_MAX);
    PGK_DISPATCH_ACT(dt, qk_norm_kernel<T><<<(unsigned)blocks, 32, 0, lk->st>>>(
        (T *)qkv, q_w, k_w, nh, nkv, hd, eps));
    return pgk_check_launch("qk_norm_kernel", lk);
}
