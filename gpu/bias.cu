/* bias: nn.Linear's bias added after a bias-free matmul (Qwen2's q|k|v
 * projection biases, modeling_qwen2.py Qwen2Attention bias=True). In f32,
 * rounded once to the activation type:
 *   y[r][n] = round(y[r][n] + bias[n])
 * Elementwise and bandwidth-bound: 2 * rows * N elements moved. (PyTorch's
 * addmm adds the bias before the product's one rounding; in bf16 this is a
 * second rounding, in f32 the same value.) */
#include "qkv_steps.cuh" /* qkv_bias_add (shared with rope_kv.cu) */

/* grid-stride over e < rows * N: n = e % N.
 * y [rows][N] T, bias [N] f32. */
template <typename T>
static __global__ void add_bias_kernel(T *__restrict__ y, const float *__restrict__ bias, int32_t rows,
                                       int32_t N)
{
    size_t n = (size_t)rows * (size_t)N;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n;
         e += (size_t)gridDim.x * blockDim.x)
        y[e] = qkv_bias_add(y[e], bias[e % (size_t)N]);
}

extern "C" int pgk_add_bias(void *y, const float *bias, int dt, int32_t rows, int32_t N, pgk_launch *lk)
{
    int rc = pgk_check_act_dtype("add_bias", dt, lk->err);
    if (rc)
        return rc;
    if (rows < 1 || N < 1)
        return pg_error_set(lk->err, PG_EINVAL, "add_bias: expected rows, N >= 1, got %d, %d", (int)rows,
                            (int)N);
    size_t n = (size_t)rows * (size_t)N;
    int32_t blocks = (int32_t)((n + 255) / 256);
    if (blocks > 65535)
        blocks = 65535;
    PGK_DISPATCH_ACT(dt, add_bias_kernel<T><<<blocks, 256, 0, lk->st>>>((T *)y, bias, rows, N));
    return pgk_check_launch("add_bias_kernel", lk);
}
