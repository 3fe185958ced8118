/* qkv_steps: the steps that turn a token's qkv row into what attention reads
 * — bias, q/k norm, RoPE, the KV-cache store — written once as device
 * functions. Their own kernels (bias.cu, qk_norm.cu, rope.cu, kv_write.cu)
 * and the fused kernel (rope_kv.cu) call these same functions, so the fused
 * kernel computes the same operations in the same order, with the same
 * roundings to the activation type between steps: the same bits
 * (tests/gpu/test_cuda_executor.c test_rope_kv_fused compares them).
 */
#ifndef PG_QKV_STEPS_CUH
#define PG_QKV_STEPS_CUH

#include "cuda_common.cuh"

#define ROPE_MAX_HALF 256 /* hd <= 512 */

/* nn.Linear's bias after a bias-free product: y + b in f32, rounded once. */
template <typename T>
static __device__ __forceinline__ T qkv_bias_add(T y, float b)
{
    return from_f32<T>(to_f32(y) + b);
}

/* One head's RMSNorm (Qwen3RMSNorm over hd) by one whole warp: lane l owns
 * elements l, l + 32, ...;
 *   ss = warp_sum(sum of v*v over the lane's elements)    (f32)
 *   v[i] = v[i] * (1 / sqrtf(ss / hd + eps)) * w[i]
 * Each element is read and written by the same lane. */
template <typename T>
static __device__ __forceinline__ void qkv_head_norm(T *v, const float *__restrict__ w, int32_t hd,
                                                     float eps, int lane)
{
    float ss = 0.0f;
    for (int32_t i = lane; i < hd; i += 32) {
        float x = to_f32(v[i]);
        ss += x * x;
    }
    ss = warp_sum(ss);
    const float inv = 1.0f / sqrtf(ss / (float)hd + eps);
    for (int32_t i = lane; i < hd; i += 32)
        v[i] = from_f32<T>(to_f32(v[i]) * inv * w[i]);
}

/* The rotation angles of one token: (sin, cos) of pos * inv_freq[i] for
 * i = tid, tid + nthreads, ... < half (the accurate sincosf). */
static __device__ __forceinline__ void rope_angles(float *sn, float *cs, float pos,
                                                   const float *__restrict__ inv_freq, int32_t half,
                                                   int tid, int nthreads)
{
    for (int32_t i = tid; i < half; i += nthreads)
        sincosf(pos * inv_freq[i], &sn[i], &cs[i]);
}

/* rotate_half on the pair (x[i], x[i + half]) of one head. */
template <typename T>
static __device__ __forceinline__ void rope_rotate(T *x, int32_t i, int32_t half, float s, float c)
{
    float x0 = to_f32(x[i]), x1 = to_f32(x[i + half]);
    x[i] = from_f32<T>(x0 * c - x1 * s);
    x[i + half] = from_f32<T>(x1 * c + x0 * s);
}

/* One element into the KV cache's type. */
template <typename T, typename KV>
static __device__ __forceinline__ KV kv_store(T x)
{
    return from_f32<KV>(to_f32(x));
}

#endif /* PG_QKV_STEPS_CUH */
