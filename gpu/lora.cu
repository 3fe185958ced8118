/* lora: one projection's LoRA deltas added to its output (executor.h
 * lora_add; PEFT's lora.Linear.forward, result + lora_B(lora_A(x)) *
 * scaling), per row, for a batch whose rows use different adapters —
 * Punica's SGMV idea (Chen et al., "Punica: Multi-Tenant LoRA Serving",
 * MLSys 2024) kept simple: each row reads its own adapter slot from the
 * step's metadata on the device, so rows of any adapters (or none) share
 * one launch, and the grid depends on T, the largest rank and N only.
 *
 *   shrink  u[t][j]  = round_act( sum_k x[t][k] * A[a][j][k] )     j < rank[a]
 *   expand  y[t][n]  = round_act( y[t][n] + scale[a] * sum_j u[t][j] * B[a][n][j] )
 *
 * for every row t with a = slots[t] a slot of this launch whose A is not
 * NULL; other rows are not touched.
 *
 * Order of the sums, and why a row's bits depend on nothing but its own
 * x row, its adapter, K, N and the rank:
 *  - shrink: output (t, j) is one warp; lane l accumulates the 8-element
 *    slices k0 = 8 l, 8 l + 256, ... of x[t] and A[a][j], each slice in k
 *    order with fmaf (acc = fmaf(x, a, acc)); the 32 lanes are added by
 *    warp_sum's fixed xor butterfly (gemv.cu's order). It depends on K
 *    only. The 16-byte path (K % 8 == 0, aligned rows) and the scalar path
 *    (any K) visit the same elements in the same order: the same bits.
 *  - expand: output (t, n) is one thread: dot = fmaf(u[j], B[n][j], dot)
 *    for j = 0, 1, ..., rank-1 (the contract's "j increasing"), then
 *    __fmul_rn(scale, dot), then __fadd_rn(y, that), rounded once to act —
 *    the explicit roundings keep nvcc from fusing the scale and the add
 *    into an fma (the emulator's host code never fuses).
 * No atomics, no reduction across rows or blocks; which block runs a row,
 * how many rows the launch has and what the neighbours use change nothing.
 *
 * The per-slot table (A, B, scale, rank) is a kernel argument by value:
 * a CUDA graph captures it with the launch (cuda_executor.h, "LoRA").
 * tests/gpu/test_cuda_lora.c holds a C twin of these exact orders (bit for
 * bit) and the contract's double reference.
 */
#include "cuda_common.cuh"

enum { SHRINK_WARPS = 8, EXPAND_THREADS = 256 };

/* the contract's bound (core/executor.h PG_LORA_MAX_RANK), repeated here
 * because core/ headers are not seen by nvcc; checked by the launcher */
#define LORA_MAX_RANK 512

/* the slot of row t in this launch's table, or -1 */
static __device__ __forceinline__ int lora_row_slot(const int32_t *__restrict__ slots, int32_t t,
                                                    const pgk_lora_tab &tab)
{
    const int32_t a = slots[t] - tab.slot0;
    if (a < 0 || a >= tab.n || tab.A[a] == nullptr)
        return -1;
    return a;
}

/* grid (T, ceil(rmax / 8)), block 256 = 8 warps: warp q of block (t, jb)
 * computes u[t][8 jb + q]. x [T][K] T, A[a] [rank][K] T, u [T][u_stride] T.
 * VEC: K % 8 == 0 and x, every A[a] 16-byte aligned (8-element loads). */
template <typename T, bool VEC>
static __global__ void __launch_bounds__(32 * SHRINK_WARPS)
lora_shrink_kernel(T *__restrict__ u, int32_t u_stride, const T *__restrict__ x, int32_t K,
                   const int32_t *__restrict__ slots, const pgk_lora_tab tab)
{
    const int32_t t = (int32_t)blockIdx.x;
    const int a = lora_row_slot(slots, t, tab);
    const int lane = threadIdx.x & 31, q = threadIdx.x >> 5;
    const int32_t j = (int32_t)blockIdx.y * SHRINK_WARPS + q;
    if (a < 0 || j >= tab.rank[a])
        return; /* the whole warp (or block): warp_sum below is per warp */
    const T *xr = x + (size_t)t * (size_t)K;
    const T *ar = (const T *)tab.A[a] + (size_t)j * (size_t)K;
    float acc = 0.0f;
    for (int32_t k0 = lane * 8; k0 < K; k0 += 256) {
        if (VEC) {
            float xv[8], av[8];
            load8(xv, xr + k0);
            load8(av, ar + k0);
#pragma unroll
            for (int e = 0; e < 8; e++)
                acc = fmaf(xv[e], av[e], acc);
        } else {
            const int32_t end = K - k0 < 8 ? K : k0 + 8;
            for (int32_t k = k0; k < end; k++)
                acc = fmaf(to_f32(xr[k]), to_f32(ar[k]), acc);
        }
    }
    const float s = warp_sum(acc);
    if (lane == 0)
        u[(size_t)t * (size_t)u_stride + j] = from_f32<T>(s);
}

/* grid (T, ceil(N / 256)), block 256: thread i of block (t, nb) computes
 * y[t][256 nb + i]. u [T][u_stride] T, B[a] [N][rank] T, y [T][ldy] T.
 * VEC: every adapted slot's rank % 8 == 0 and B[a] 16-byte aligned. */
template <typename T, bool VEC>
static __global__ void __launch_bounds__(EXPAND_THREADS)
lora_expand_kernel(T *__restrict__ y, int32_t ldy, const T *__restrict__ u, int32_t u_stride,
                   int32_t N, const int32_t *__restrict__ slots, const pgk_lora_tab tab)
{
    __shared__ float us[LORA_MAX_RANK];
    const int32_t t = (int32_t)blockIdx.x;
    const int a = lora_row_slot(slots, t, tab);
    if (a < 0)
        return; /* the whole block: the barrier below is per block */
    const int32_t r = tab.rank[a];
    for (int32_t j = (int32_t)threadIdx.x; j < r; j += EXPAND_THREADS)
        us[j] = to_f32(u[(size_t)t * (size_t)u_stride + j]);
    __syncthreads();
    const int32_t n = (int32_t)blockIdx.y * EXPAND_THREADS + (int32_t)threadIdx.x;
    if (n >= N)
        return;
    const T *br = (const T *)tab.B[a] + (size_t)n * (size_t)r;
    float dot = 0.0f;
    if (VEC) {
        for (int32_t j0 = 0; j0 < r; j0 += 8) {
            float bv[8];
            load8(bv, br + j0);
#pragma unroll
            for (int e = 0; e < 8; e++)
                dot = fmaf(us[j0 + e], bv[e], dot);
        }
    } else {
        for (int32_t j = 0; j < r; j++)
            dot = fmaf(us[j], to_f32(br[j]), dot);
    }
    T *yp = y + (size_t)t * (size_t)ldy + n;
    *yp = from_f32<T>(__fadd_rn(to_f32(*yp), __fmul_rn(tab.scale[a], dot)));
}

extern "C" int pgk_lora_add(void *y, int32_t ldy, const void *x, void *u, int dt, int32_t T,
                            int32_t K, int32_t N, const int32_t *d_slots, const pgk_lora_tab *tab,
                            pgk_launch *lk)
{
    int rc = pgk_check_act_dtype("lora_add", dt, lk->err);
    if (rc)
        return rc;
    if (T < 1 || K < 1 || N < 1 || ldy < N || !d_slots || tab->n < 1 || tab->n > PGK_LORA_SLOTS)
        return pg_error_set(lk->err, PG_EINVAL,
                            "lora_add: expected T, K, N >= 1, ldy >= N, the step's slots on the device "
                            "and 1 .. %d slots, got T %d, K %d, N %d, ldy %d, %d slots",
                            PGK_LORA_SLOTS, (int)T, (int)K, (int)N, (int)ldy, (int)tab->n);
    if (!pgk_aligned(u, 16))
        return pg_error_set(lk->err, PG_EINVAL, "lora_add: expected 16-byte aligned scratch, got %p", u);
    int32_t rmax = 0;
    bool vec_a = K % 8 == 0 && pgk_aligned(x, 16), vec_b = true;
    for (int32_t a = 0; a < tab->n; a++) {
        if (!tab->A[a])
            continue;
        const int32_t r = tab->rank[a];
        if (!tab->B[a] || r < 1 || r > LORA_MAX_RANK)
            return pg_error_set(lk->err, PG_EINVAL,
                                "lora_add: slot %d: expected B and a rank of 1 .. %d with A, got B %p, "
                                "rank %d", (int)(tab->slot0 + a), LORA_MAX_RANK, tab->B[a], (int)r);
        rmax = r > rmax ? r : rmax;
        vec_a = vec_a && pgk_aligned(tab->A[a], 16);
        vec_b = vec_b && r % 8 == 0 && pgk_aligned(tab->B[a], 16);
    }
    if (rmax == 0)
        return 0; /* no slot of this table targets the projection */
    const dim3 g_shrink((unsigned)T, (unsigned)((rmax + SHRINK_WARPS - 1) / SHRINK_WARPS));
    const dim3 g_expand((unsigned)T, (unsigned)((N + EXPAND_THREADS - 1) / EXPAND_THREADS));
    if (g_expand.y > 65535u)
        return pg_error_set(lk->err, PG_EINVAL, "lora_add: N %d: expected at most %d", (int)N,
                            65535 * EXPAND_THREADS);
    /* u's row stride is rmax (the call's), so u holds T x rmax elements */
    if (vec_a)
        PGK_DISPATCH_ACT(dt, lora_shrink_kernel<T, true><<<g_shrink, 32 * SHRINK_WARPS, 0, lk->st>>>(
                                 (T *)u, rmax, (const T *)x, K, d_slots, *tab));
    else
        PGK_DISPATCH_ACT(dt, lora_shrink_kernel<T, false><<<g_shrink, 32 * SHRINK_WARPS, 0, lk->st>>>(
                                 (T *)u, rmax, (const T *)x, K, d_slots, *tab));
    if ((rc = pgk_check_launch("lora_shrink_kernel", lk)))
        return rc;
    if (vec_b)
        PGK_DISPATCH_ACT(dt, lora_expand_kernel<T, true><<<g_expand, EXPAND_THREADS, 0, lk->st>>>(
                                 (T *)y, ldy, (const T *)u, rmax, N, d_slots, *tab));
    else
        PGK_DISPATCH_ACT(dt, lora_expand_kernel<T, false><<<g_expand, EXPAND_THREADS, 0, lk->st>>>(
                                 (T *)y, ldy, (const T *)u, rmax, N, d_slots, *tab));
    return pgk_check_launch("lora_expand_kernel", lk);
}
