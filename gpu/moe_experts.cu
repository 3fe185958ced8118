/* moe_experts: the two kernels around the experts' products (executor.h
 * moe_experts; the products themselves are cuda_gemm.c's, per expert, and
 * the SiLU activation.cu's — gpu/cuda_moe.c runs the whole op):
 *
 *   gather   xs[s] = x[perm[s]]           the rows grouped by expert, then
 *            by row index (perm built by the host); perm[s] < 0 marks a
 *            gap slot (alignment padding between groups), left unwritten
 *   combine  out[t] = sum_{r < k} w[t][r] * ys[pos[t][r]]
 *            f32: acc = w0 * y0, then acc = acc + w_r * y_r in rank order,
 *            one rounding per product and per sum (__fmul_rn / __fadd_rn:
 *            no FMA, the CPU twin's bits in the f32 mode), rounded to the
 *            activation type once at the end.
 * Both are elementwise over (row, column): no reduction across rows, so a
 * row's result depends on its own data only. */
#include "cuda_common.cuh"

/* grid-stride over S * H: xs [S][H] T, x [T][H] T, perm [S] i32 */
template <typename T>
static __global__ void moe_gather_kernel(T *__restrict__ xs, const T *__restrict__ x,
                                         const int32_t *__restrict__ perm, int32_t S, int32_t H)
{
    const size_t n = (size_t)S * (size_t)H;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const size_t s = i / (size_t)H, h = i % (size_t)H;
        const int32_t row = perm[s];
        if (row >= 0)
            xs[i] = x[(size_t)row * (size_t)H + h];
    }
}

/* grid-stride over T * H: out [T][H] T, ys [S][H] T, pos [T][k] i32 (slots
 * of ys), weights [T][k] f32 */
template <typename T>
static __global__ void moe_combine_kernel(T *__restrict__ out, const T *__restrict__ ys,
                                          const int32_t *__restrict__ pos, const float *__restrict__ weights,
                                          int32_t T_rows, int32_t H, int32_t k)
{
    const size_t n = (size_t)T_rows * (size_t)H;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const size_t t = i / (size_t)H, h = i % (size_t)H;
        const int32_t *p = pos + t * (size_t)k;
        const float *w = weights + t * (size_t)k;
        float acc = __fmul_rn(w[0], to_f32(ys[(size_t)p[0] * (size_t)H + h]));
        for (int32_t r = 1; r < k; r++)
            acc = __fadd_rn(acc, __fmul_rn(w[r], to_f32(ys[(size_t)p[r] * (size_t)H + h])));
        out[i] = from_f32<T>(acc);
    }
}

static int32_t moe_blocks(size_t n)
{
    size_t b = (n + 255) / 256;
    return b > 65535 ? 65535 : (int32_t)(b < 1 ? 1 : b);
}

extern "C" int pgk_moe_gather(void *xs, const void *x, const int32_t *perm, int dt, int32_t S, int32_t H,
                              pgk_launch *lk)
{
    int rc = pgk_check_act_dtype("moe_gather", dt, lk->err);
    if (rc)
        return rc;
    if (S < 1 || H < 1)
        return pg_error_set(lk->err, PG_EINVAL, "moe_gather: expected S, H >= 1, got %d, %d", (int)S, (int)H);
    PGK_DISPATCH_ACT(dt, moe_gather_kernel<T><<<moe_blocks((size_t)S * (size_t)H), 256, 0, lk->st>>>(
        (T *)xs, (const T *)x, perm, S, H));
    return pgk_check_launch("moe_gather_kernel", lk);
}

extern "C" int pgk_moe_combine(void *out, const void *ys, const int32_t *pos, const float *weights, int dt,
                               int32_t T_rows, int32_t H, int32_t k, pgk_launch *lk)
{
    int rc = pgk_check_act_dtype("moe_combine", dt, lk->err);
    if (rc)
        return rc;
    if (T_rows < 1 || H < 1 || k < 1)
        return pg_error_set(lk->err, PG_EINVAL, "moe_combine: expected T, H, k >= 1, got %d, %d, %d",
                            (int)T_rows, (int)H, (int)k);
    PGK_DISPATCH_ACT(dt, moe_combine_kernel<T><<<moe_blocks((size_t)T_rows * (size_t)H), 256, 0, lk->st>>>(
        (T *)out, (const T *)ys, pos, weights, T_rows, H, k));
    return pgk_check_launch("moe_combine_kernel", lk);
}
