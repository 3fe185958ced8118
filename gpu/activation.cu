/* activation: SwiGLU's silu(gate) * up (LlamaMLP: act_fn(gate_proj(x)) *
 * up_proj(x)). Elementwise and bandwidth-bound: 3 * T * I elements moved. */
#include "cuda_common.cuh"

/* grid-stride over n = T * I: e = (t, i), t = e / I, i = e % I
 *   out[t][i] = silu(g) * u,  g = gate_up[t][i], u = gate_up[t][I + i],
 *   silu(g) = g / (1 + exp(-g))   (f32, accurate expf)
 * out [T][I], gate_up [T][2I]. */
template <typename T>
static __global__ void silu_mul_kernel(T *__restrict__ out, const T *__restrict__ gate_up,
                                       int32_t T_rows, int32_t I)
{
    size_t n = (size_t)T_rows * (size_t)I;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n;
         e += (size_t)gridDim.x * blockDim.x) {
        size_t t = e / (size_t)I, i = e % (size_t)I;
        float g = to_f32(gate_up[t * 2u * (size_t)I + i]);
        float u = to_f32(gate_up[t * 2u * (size_t)I + (size_t)I + i]);
        out[e] = from_f32<T>(g / (1.0f + expf(-g)) * u);
    }
}

extern "C" int pgk_silu_mul(void *out, const void *gate_up, int dt, int32_t T_rows, int32_t I,
                            pgk_launch *lk)
{
    int rc = pgk_check_act_dtype("silu_mul", dt, lk->err);
    if (rc)
        return rc;
    if (T_rows < 1 || I < 1)
        return pg_error_set(lk->err, PG_EINVAL, "silu_mul: expected T, I >= 1, got %d, %d",
                            (int)T_rows, (int)I);
    size_t n = (size_t)T_rows * (size_t)I;
    int32_t blocks = (int32_t)((n + 255) / 256);
    if (blocks > 65535)
        blocks = 65535;
    PGK_DISPATCH_ACT(dt, silu_mul_kernel<T><<<blocks, 256, 0, lk->st>>>(
        (T *)out, (const T *)gate_up, T_rows, I));
    return pgk_check_launch("silu_mul_kernel", lk);
}
