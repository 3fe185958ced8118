/* moe_route: mixture-of-experts routing (executor.h moe_route), one thread
 * per row, the CPU twin's steps (cpu/cpu_moe.c cpu_op_moe_route) in its
 * order, so that for the same f32 logits the ids and weights are the CPU's
 * bits:
 *   mx = max over e (z[e] > mx ? z[e] : mx, e ascending)
 *   p[e] = cm_exp(z[e] - mx) / sum,  sum = p'[0] + p'[1] + ... (e ascending)
 *   rank r: the largest p[e] among the experts not taken yet, strictly
 *           greater wins (a tie goes to the lower id; a NaN never wins)
 *   w[r] = p[ids[r]], divided by w[0] + ... + w[k-1] (rank order) when
 *   norm_topk.
 * exp is cm_exp.cuh's (the CPU's polynomial, no FMA); the division and
 * the sums are single IEEE roundings as on the CPU. bf16 logits are
 * widened to f32 (exact) first. p[e] is recomputed where the top-k needs
 * it (the same expression, the same bits) instead of stored: no limit on
 * E, no local array.
 *
 * A row is the work of one thread: E exps for the sum and k E for the
 * selection (Qwen3-30B-A3B: 128 experts, top 8, about a thousand exps a
 * token and layer), negligible beside the experts' GEMMs.
 */
#include "cm_exp.cuh"

template <typename T>
static __device__ __forceinline__ float route_p(const T *z, int32_t e, float mx, float sum)
{
    return pgk_cm_expf(__fsub_rn(to_f32(z[e]), mx)) / sum;
}

/* grid ceil(T / 128), block 128: thread t routes row t. router [T][E] T;
 * ids [T][k] i32, weights [T][k] f32. */
template <typename T>
static __global__ void __launch_bounds__(128) moe_route_kernel(int32_t *__restrict__ ids, float *__restrict__ weights,
                                                               const T *__restrict__ router, int32_t T_rows,
                                                               int32_t E, int32_t k, int32_t norm_topk)
{
    const int32_t t = (int32_t)blockIdx.x * 128 + (int32_t)threadIdx.x;
    if (t >= T_rows)
        return;
    const T *z = router + (size_t)t * (size_t)E;
    float mx = to_f32(z[0]);
    for (int32_t e = 1; e < E; e++) {
        const float v = to_f32(z[e]);
        mx = v > mx ? v : mx;
    }
    float sum = 0.0f;
    for (int32_t e = 0; e < E; e++)
        sum = __fadd_rn(sum, pgk_cm_expf(__fsub_rn(to_f32(z[e]), mx)));
    int32_t *id = ids + (size_t)t * (size_t)k;
    float *w = weights + (size_t)t * (size_t)k;
    float wsum = 0.0f;
    for (int32_t r = 0; r < k; r++) {
        int32_t best = -1;
        float pb = 0.0f;
        for (int32_t e = 0; e < E; e++) {
            int taken = 0;
            for (int32_t q = 0; q < r; q++)
                taken |= id[q] == e;
            if (taken)
                continue;
            const float pe = route_p(z, e, mx, sum);
            if (best < 0 || pe > pb) {
                best = e;
                pb = pe;
            }
        }
        id[r] = best;
        w[r] = pb;
        wsum = __fadd_rn(wsum, pb);
    }
    if (norm_topk)
        for (int32_t r = 0; r < k; r++)
            w[r] = w[r] / wsum;
}

extern "C" int pgk_moe_route(int32_t *ids, float *weights, const void *router, int dt, int32_t T_rows,
                             int32_t E, int32_t k, int32_t norm_topk, pgk_launch *lk)
{
    int rc = pgk_check_act_dtype("moe_route", dt, lk->err);
    if (rc)
        return rc;
    if (T_rows < 1 || E < 1 || k < 1 || k > E)
        return pg_error_set(lk->err, PG_EINVAL, "moe_route: expected T >= 1 and 1 <= k <= E, got T %d, E %d, k %d",
                            (int)T_rows, (int)E, (int)k);
    const int32_t blocks = (T_rows + 127) / 128;
    PGK_DISPATCH_ACT(dt, moe_route_kernel<T><<<blocks, 128, 0, lk->st>>>(ids, weights, (const T *)router, T_rows,
                                                                          E, k, norm_topk));
    return pgk_check_launch("moe_route_kernel", lk);
}
