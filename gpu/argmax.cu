/* argmax: greedy sampling on the device (for a later device-side sampler;
 * saves the [L][V] f32 logits copy when every sequence is greedy). */
#include "cuda_common.cuh"

/* (value, id) is better than (bv, bi) when larger, or equal with a lower
 * id; starting from (-inf, -1), only a value > -inf is ever taken, so NaN
 * and -inf never win (core/sampler.c sampler_greedy: strict > from -inf). */
static __device__ __forceinline__ bool better(float v, int32_t i, float bv, int32_t bi)
{
    return v > bv || (v == bv && bi >= 0 && i < bi);
}

/* grid (rows), block 256: thread j scans v = j, j+256, ... keeping its best;
 * then a warp butterfly and a pass over the 8 warp winners (fixed order).
 *   ids[r] = argmax_v logits[r][v], ties -> lowest v; no v with
 *   logits[r][v] > -inf (all -inf or NaN) -> -1. */
static __global__ void argmax_kernel(int32_t *__restrict__ ids, const float *__restrict__ logits,
                                     int32_t V)
{
    __shared__ float sv[32];
    __shared__ int32_t si[32];
    const float *row = logits + (size_t)blockIdx.x * (size_t)V;
    float bv = -INFINITY;
    int32_t bi = -1;
    for (int32_t v = threadIdx.x; v < V; v += blockDim.x) {
        float x = row[v];
        if (better(x, v, bv, bi)) {
            bv = x;
            bi = v;
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int32_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (oi >= 0 && better(ov, oi, bv, bi)) {
            bv = ov;
            bi = oi;
        }
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        sv[warp] = bv;
        si[warp] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float b = -INFINITY;
        int32_t i = -1;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++)
            if (si[w] >= 0 && better(sv[w], si[w], b, i)) {
                b = sv[w];
                i = si[w];
            }
        ids[blockIdx.x] = i;
    }
}

extern "C" int pgk_argmax(int32_t *ids, const float *logits, int32_t rows, int32_t V,
                          pgk_launch *lk)
{
    if (rows < 1 || V < 1)
        return pg_error_set(lk->err, PG_EINVAL, "argmax: expected rows, V >= 1, got %d, %d",
                            (int)rows, (int)V);
    argmax_kernel<<<(unsigned)rows, 256, 0, lk->st>>>(ids, logits, V);
    return pgk_check_launch("argmax_kernel", lk);
}
