/* gemv: y = x . w^T for few rows (decode: M = the batch), bf16 x and w,
 * bf16 or f32 y — the weights streamed once per 8 rows with 16-byte loads,
 * instead of cuBLAS's 128-row product (cuda_gemm.c chooses per (N, K) at
 * its first use, fixed for the run: cuda_gemm.h).
 *
 * Order of the sum, and why a row's bits do not depend on M or on its
 * position: output y[m][n] is computed by one warp; lane l reads the
 * 8-element slices k0 = 8 l, 8 l + 256, 8 l + 512, ... of w[n] and x[m]
 * (one uint4 each) and accumulates acc = fmaf(x[k0+j], w[k0+j], acc) for
 * j = 0..7, slice after slice; then the 32 lanes' partial sums are added by
 * warp_sum's fixed xor butterfly. That order depends on K alone: the same
 * for every row m, every M and every tile of rows, so the kernel is
 * position-invariant like gpu/'s other kernels (tests/gpu/test_cuda_gemm.c
 * test_gemv). It is NOT cuBLAS's order: the two give different last bits
 * for the same row, which is why the choice is made once per shape and
 * never per step.
 */
#include "cuda_common.cuh"

enum { GEMV_ROWS = 8, GEMV_WARPS = 8 };

/* grid (ceil(N / 8), ceil(M / 8)), block 256 = 8 warps: warp q of block
 * (bx, by) computes column n = 8 bx + q for the rows m = 8 by .. 8 by + 7
 * (< M). x [M][K] bf16, w [N][K] bf16 (rows 16-byte aligned: K % 8 == 0),
 * y [M][N] Y. */
template <typename Y>
static __global__ void gemv_kernel(Y *__restrict__ y, const bf16_t *__restrict__ x,
                                   const bf16_t *__restrict__ w, int32_t M, int32_t N, int32_t K)
{
    const int lane = threadIdx.x & 31, q = threadIdx.x >> 5;
    const int32_t n = (int32_t)blockIdx.x * GEMV_WARPS + q;
    const int32_t m0 = (int32_t)blockIdx.y * GEMV_ROWS;
    if (n >= N)
        return; /* the whole warp: warp_sum below is per warp */
    const int32_t rows = M - m0 < GEMV_ROWS ? M - m0 : GEMV_ROWS;
    const bf16_t *wr = w + (size_t)n * (size_t)K;
    float acc[GEMV_ROWS];
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; r++)
        acc[r] = 0.0f;
    for (int32_t k0 = lane * 8; k0 < K; k0 += 256) {
        float wv[8];
        load8(wv, wr + k0);
#pragma unroll
        for (int r = 0; r < GEMV_ROWS; r++) {
            if (r >= rows)
                break;
            float xv[8];
            load8(xv, x + (size_t)(m0 + r) * (size_t)K + k0);
#pragma unroll
            for (int j = 0; j < 8; j++)
                acc[r] = fmaf(xv[j], wv[j], acc[r]);
        }
    }
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; r++) {
        if (r >= rows)
            break;
        const float s = warp_sum(acc[r]);
        if (lane == 0)
            y[(size_t)(m0 + r) * (size_t)N + n] = from_f32<Y>(s);
    }
}

extern "C" int pgk_gemv(void *y, int y_dt, const void *x, const void *w, int32_t M, int32_t N,
                        int32_t K, pgk_launch *lk)
{
    if (M < 1 || N < 1 || K < 8 || K % 8 != 0 || (y_dt != PGK_BF16 && y_dt != PGK_F32))
        return pg_error_set(lk->err, PG_EINVAL,
                            "gemv: expected M, N >= 1, K a multiple of 8 and a bf16 or f32 output, got "
                            "M %d, N %d, K %d, %s", (int)M, (int)N, (int)K, pgk_dtype_name(y_dt));
    if (!pgk_aligned(x, 16) || !pgk_aligned(w, 16))
        return pg_error_set(lk->err, PG_EINVAL, "gemv: expected 16-byte aligned x and w, got %p, %p",
                            x, w);
    const int64_t gy = ((int64_t)M + GEMV_ROWS - 1) / GEMV_ROWS;
    if (gy > 65535)
        return pg_error_set(lk->err, PG_EINVAL, "gemv: M %d: expected at most %d rows", (int)M,
                            65535 * GEMV_ROWS);
    dim3 grid((unsigned)((N + GEMV_WARPS - 1) / GEMV_WARPS), (unsigned)gy);
    if (y_dt == PGK_BF16)
        gemv_kernel<bf16_t><<<grid, 32 * GEMV_WARPS, 0, lk->st>>>(
            (bf16_t *)y, (const bf16_t *)x, (const bf16_t *)w, M, N, K);
    else
        gemv_kernel<float><<<grid, 32 * GEMV_WARPS, 0, lk->st>>>(
            (float *)y, (const bf16_t *)x, (const bf16_t *)w, M, N, K);
    return pgk_check_launch("gemv_kernel", lk);
}
