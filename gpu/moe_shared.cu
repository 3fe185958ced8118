/* moe_shared: Qwen2-MoE's gated shared expert added to the routed experts'
 * sum (executor.h moe_shared_add; Qwen2MoeSparseMoeBlock:
 * F.sigmoid(shared_expert_gate(h)) * shared_expert(h), then added):
 *   s = 1 / (1 + cm_exp(-gate[t]))            f32, the CPU twin's sigmoid
 *   out[t][n] = out[t][n] + s * shared[t][n]  one rounding per * and +
 * (cm_exp.cuh; __fmul_rn / __fadd_rn: no FMA, so the f32 mode gives
 * cpu/cpu_moe.c's bits), rounded to the activation type once. */
#include "cm_exp.cuh"

/* grid-stride over T * N: out, shared [T][N] T, gate [T] T */
template <typename T>
static __global__ void moe_shared_add_kernel(T *__restrict__ out, const T *__restrict__ shared,
                                             const T *__restrict__ gate, int32_t T_rows, int32_t N)
{
    const size_t n = (size_t)T_rows * (size_t)N;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const size_t t = i / (size_t)N;
        const float s = 1.0f / __fadd_rn(1.0f, pgk_cm_expf(-to_f32(gate[t])));
        out[i] = from_f32<T>(__fadd_rn(to_f32(out[i]), __fmul_rn(s, to_f32(shared[i]))));
    }
}

extern "C" int pgk_moe_shared_add(void *out, const void *shared, const void *gate, int dt, int32_t T_rows,
                                  int32_t N, pgk_launch *lk)
{
    int rc = pgk_check_act_dtype("moe_shared_add", dt, lk->err);
    if (rc)
        return rc;
    if (T_rows < 1 || N < 1)
        return pg_error_set(lk->err, PG_EINVAL, "moe_shared_add: expected T, N >= 1, got %d, %d", (int)T_rows,
                            (int)N);
    size_t blocks = ((size_t)T_rows * (size_t)N + 255) / 256;
    if (blocks > 65535)
        blocks = 65535;
    PGK_DISPATCH_ACT(dt, moe_shared_add_kernel<T><<<(int32_t)blocks, 256, 0, lk->st>>>(
        (T *)out, (const T *)shared, (const T *)gate, T_rows, N));
    return pgk_check_launch("moe_shared_add_kernel", lk);
}
