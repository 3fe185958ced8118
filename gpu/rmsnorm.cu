/* rmsnorm: HF LlamaRMSNorm with the residual add fused in front
 * (executor.h): with residual, residual += x, then out = rmsnorm(residual) * w;
 * without, out = rmsnorm(x) * w. In f32:
 *   out[i] = v[i] * rsqrt(mean(v^2) + eps) * w[i]
 * where v is the row as stored in the activation type (the sum of squares
 * is taken over the rounded residual, the values the next layer reads).
 * Bandwidth: 3 (or 4 with residual) * rows * dim elements. */
#include "cuda_common.cuh"

/* grid (rows), block nt (a function of dim only, so a row's reduction order
 * never depends on the batch): thread i owns elements i, i+nt, i+2nt, ...
 *   pass 1: v = round(residual[r][i] + x[r][i]) (stored back) or x[r][i];
 *           ss += v*v                (f32, fixed order; block_sum)
 *   pass 2: out[r][i] = v * inv * w[i],  inv = 1 / sqrtf(ss / dim + eps)
 * Each element is read and written by the same thread in both passes, so
 * out may alias x or residual.
 * out, x, residual [rows][dim] T; w [dim] f32. */
template <typename T>
static __global__ void rmsnorm_kernel(T *out, T *residual, const T *x,
                                      const float *__restrict__ w, int32_t dim, float eps)
{
    __shared__ float scratch[32];
    size_t base = (size_t)blockIdx.x * (size_t)dim;
    float ss = 0.0f;
    if (residual) {
        for (int32_t i = threadIdx.x; i < dim; i += blockDim.x) {
            T r = from_f32<T>(to_f32(residual[base + i]) + to_f32(x[base + i]));
            residual[base + i] = r;
            float v = to_f32(r);
            ss += v * v;
        }
    } else {
        for (int32_t i = threadIdx.x; i < dim; i += blockDim.x) {
            float v = to_f32(x[base + i]);
            ss += v * v;
        }
    }
    ss = block_sum(ss, scratch);
    float inv = 1.0f / sqrtf(ss / (float)dim + eps);
    const T *src = residual ? residual : x;
    for (int32_t i = threadIdx.x; i < dim; i += blockDim.x)
        out[base + i] = from_f32<T>(to_f32(src[base + i]) * inv * w[i]);
}

extern "C" int pgk_rmsnorm(void *out, void *residual, const void *x, const float *w, int dt,
                           int32_t rows, int32_t dim, float eps, pgk_launch *lk)
{
    int rc = pgk_check_act_dtype("rmsnorm", dt, lk->err);
    if (rc)
        return rc;
    if (rows < 1 || dim < 1)
        return pg_error_set(lk->err, PG_EINVAL, "rmsnorm: expected rows, dim >= 1, got %d, %d",
                            (int)rows, (int)dim);
    if (!(eps >= 0.0f))
        return pg_error_set(lk->err, PG_EINVAL, "rmsnorm: eps must be >= 0, got %g", (double)eps);
    int nt = dim >= 2048 ? 512 : dim >= 512 ? 256 : dim >= 128 ? 128 : 32;
    PGK_DISPATCH_ACT(dt, rmsnorm_kernel<T><<<(unsigned)rows, nt, 0, lk->st>>>(
        (T *)out, (T *)residual, (const T *)x, w, dim, eps));
    return pgk_check_launch("rmsnorm_kernel", lk);
}
