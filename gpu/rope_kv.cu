/* rope_kv: what lies between the qkv projection and attention, fused into
 * one launch per step — bias (Qwen2), q/k norm (Qwen3), RoPE, the KV-cache
 * store — so a token's qkv row is read from memory once instead of up to
 * four times and the step launches one kernel instead of up to four. The
 * twins are the four ops on their own (add_bias, qk_norm, rope, kv_write:
 * bias.cu, qk_norm.cu, rope.cu, kv_write.cu); both call the device
 * functions of qkv_steps.cuh in the same order with the same roundings, so
 * the results are the same bits (tests/gpu/test_cuda_executor.c
 * test_rope_kv_fused, and every golden through the model). */
#include "qkv_steps.cuh"

enum { ROPE_KV_NT = 128 };

/* grid (T), block ROPE_KV_NT (4 warps), token t = blockIdx.x, its row
 * r = qkv[t] [(nh + 2 nkv) * hd]:
 *   1. bias (b != NULL): r[e] = round(r[e] + b[e]) for every e (q, k and v),
 *      thread j on e = j, j + 128, ...                (bias.cu)
 *   2. q/k norm (q_w != NULL): head h of the nh + nkv q and k heads by warp
 *      h % 4, one whole warp per head                  (qk_norm.cu)
 *   3. RoPE: angles of frequencies i = j, j + 128, ... into shared memory,
 *      then pairs p = j, j + 128, ... of the (nh + nkv) * hd/2 pairs
 *                                                      (rope.cu)
 *   4. KV store (slots[t] >= 0): elements e = j, j + 128, ... of the k and v
 *      heads to k_cache, v_cache [slot][nkv][hd]        (kv_write.cu)
 * A barrier between steps: each step reads what other threads of the
 * block wrote (global memory written before __syncthreads is visible to
 * the block after it). qkv is written in place as the four ops would
 * leave it: attention reads q (and the prefill kernel k, v) from it. */
template <typename T, typename KV>
static __global__ void rope_kv_kernel(T *qkv, KV *__restrict__ k_cache, KV *__restrict__ v_cache,
                                      const float *__restrict__ bias, const float *__restrict__ q_w,
                                      const float *__restrict__ k_w, float eps,
                                      const float *__restrict__ inv_freq,
                                      const int32_t *__restrict__ positions,
                                      const int32_t *__restrict__ slots, int32_t nh, int32_t nkv,
                                      int32_t hd)
{
    __shared__ float sn[ROPE_MAX_HALF];
    __shared__ float cs[ROPE_MAX_HALF];
    const int32_t t = blockIdx.x;
    const int tid = threadIdx.x, nt = blockDim.x;
    const int32_t row_n = (nh + 2 * nkv) * hd;
    T *row = qkv + (size_t)t * (size_t)row_n;
    if (bias) {
        for (int32_t e = tid; e < row_n; e += nt)
            row[e] = qkv_bias_add(row[e], bias[e]);
        __syncthreads();
    }
    if (q_w) {
        const int lane = tid & 31, warp = tid >> 5, nw = nt >> 5;
        for (int32_t h = warp; h < nh + nkv; h += nw)
            qkv_head_norm(row + (size_t)h * hd, h < nh ? q_w : k_w, hd, eps, lane);
        __syncthreads();
    }
    const int32_t half = hd / 2, n_pairs = (nh + nkv) * half;
    rope_angles(sn, cs, (float)positions[t], inv_freq, half, tid, nt);
    __syncthreads();
    for (int32_t p = tid; p < n_pairs; p += nt) {
        const int32_t h = p / half, i = p % half;
        rope_rotate(row + (size_t)h * hd, i, half, sn[i], cs[i]);
    }
    const int32_t slot = slots[t];
    if (slot < 0)
        return; /* uniform over the block: no barrier after this */
    __syncthreads();
    const int32_t n = nkv * hd;
    const T *k = row + (size_t)nh * hd;
    const T *v = k + (size_t)n;
    const size_t dst = (size_t)slot * (size_t)n;
    for (int32_t e = tid; e < n; e += nt) {
        k_cache[dst + e] = kv_store<T, KV>(k[e]);
        v_cache[dst + e] = kv_store<T, KV>(v[e]);
    }
}

extern "C" int pgk_rope_kv(void *qkv, void *k_cache, void *v_cache, int kv_dt, const float *bias,
                           const float *q_w, const float *k_w, float eps, const float *inv_freq, int dt,
                           int32_t nh, int32_t nkv, int32_t hd, const pgk_batch *b, pgk_launch *lk)
{
    int rc = pgk_check_act_kv_pair("rope_kv", dt, kv_dt, lk->err);
    if (rc)
        return rc;
    if (nh < 1 || nkv < 1 || hd < 2 || hd % 2 != 0 || hd > 2 * ROPE_MAX_HALF || b->num_tokens < 1)
        return pg_error_set(lk->err, PG_EINVAL,
                            "rope_kv: expected nh, nkv, T >= 1 and an even hd in [2, %d], got nh %d, "
                            "nkv %d, hd %d, T %d", 2 * ROPE_MAX_HALF, (int)nh, (int)nkv, (int)hd,
                            (int)b->num_tokens);
    if ((q_w == NULL) != (k_w == NULL) || !(eps >= 0.0f))
        return pg_error_set(lk->err, PG_EINVAL,
                            "rope_kv: expected q_w and k_w both or neither and eps >= 0, got %s, %s, %g",
                            q_w ? "q_w" : "no q_w", k_w ? "k_w" : "no k_w", (double)eps);
    PGK_DISPATCH_ACT_KV(dt, kv_dt, rope_kv_kernel<T, KV><<<(unsigned)b->num_tokens, ROPE_KV_NT, 0, lk->st>>>(
        (T *)qkv, (KV *)k_cache, (KV *)v_cache, bias, q_w, k_w, eps, inv_freq, b->positions,
        b->slots, nh, nkv, hd));
    return pgk_check_launch("rope_kv_kernel", lk);
}
