/* cuda_common: what every .cu file of gpu/ shares — element load/store with
 * f32 conversion, warp reductions, the type dispatch switch and the launch
 * check. Device code only sees plain pointers; the element type is a
 * template parameter chosen once per launcher from a pgk_dtype code.
 *
 * Conversions: to_f32 is exact; from_f32 rounds to nearest even
 * (__float2bfloat16_rn, __float2half_rn), as the host's pg_f32_to_bf16.
 * No -use_fast_math anywhere: expf, sincosf and division are the accurate
 * versions, so the CUDA kernels stay close to the CPU twin.
 */
#ifndef PG_CUDA_COMMON_CUH
#define PG_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda_kernels.h"

typedef __nv_bfloat16 bf16_t;
typedef __half f16_t;

static __device__ __forceinline__ float to_f32(float v) { return v; }
static __device__ __forceinline__ float to_f32(bf16_t v) { return __bfloat162float(v); }
static __device__ __forceinline__ float to_f32(f16_t v) { return __half2float(v); }

template <typename T> static __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ bf16_t from_f32<bf16_t>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ f16_t from_f32<f16_t>(float v) { return __float2half_rn(v); }

/* Loads 8 consecutive elements p[0..7] as f32 (p 16-byte aligned for 2-byte
 * types, 32-byte aligned for f32: callers index by multiples of 8 elements
 * into buffers from cudaMalloc, whose rows are multiples of 8 elements). */
static __device__ __forceinline__ void load8(float out[8], const bf16_t *p)
{
    uint4 raw = *reinterpret_cast<const uint4 *>(p);
    const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&raw);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 f = __bfloat1622float2(h[i]);
        out[2 * i] = f.x;
        out[2 * i + 1] = f.y;
    }
}
static __device__ __forceinline__ void load8(float out[8], const f16_t *p)
{
    uint4 raw = *reinterpret_cast<const uint4 *>(p);
    const __half2 *h = reinterpret_cast<const __half2 *>(&raw);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 f = __half22float2(h[i]);
        out[2 * i] = f.x;
        out[2 * i + 1] = f.y;
    }
}
static __device__ __forceinline__ void load8(float out[8], const float *p)
{
    float4 a = reinterpret_cast<const float4 *>(p)[0];
    float4 b = reinterpret_cast<const float4 *>(p)[1];
    out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
    out[4] = b.x; out[5] = b.y; out[6] = b.z; out[7] = b.w;
}

static __device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __device__ __forceinline__ float warp_max(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum over a block of blockDim.x threads (a multiple of 32, <= 1024) in a
 * fixed order (lanes by xor-butterfly, then warps 0..nw-1 in order), so the
 * result does not depend on anything but the inputs. scratch: 32 floats of
 * shared memory. Every thread gets the sum. */
static __device__ __forceinline__ float block_sum(float v, float *scratch)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads(); /* scratch may still be read from an earlier call */
    if (lane == 0)
        scratch[warp] = v;
    __syncthreads();
    float s = 0.0f;
    for (int i = 0; i < nw; i++)
        s += scratch[i];
    return s;
}

/* Dispatch helpers: run `body` with T bound to the C type of the act dtype
 * code (BF16 or F32) and, for the _KV form, KV bound to the kv dtype. */
#define PGK_DISPATCH_ACT(dt, ...)                                       \
    do {                                                                \
        if ((dt) == PGK_BF16) { typedef bf16_t T; __VA_ARGS__; }        \
        else if ((dt) == PGK_F32) { typedef float T; __VA_ARGS__; }     \
    } while (0)

#define PGK_DISPATCH_KV(kdt, ...)                                       \
    do {                                                                \
        if ((kdt) == PGK_BF16) { typedef bf16_t KV; __VA_ARGS__; }      \
        else if ((kdt) == PGK_F16) { typedef f16_t KV; __VA_ARGS__; }   \
        else if ((kdt) == PGK_F32) { typedef float KV; __VA_ARGS__; }   \
    } while (0)

/* The (activation, kv) pairs the executor uses, and the only ones the
 * attention kernels are instantiated for: (bf16, bf16), (bf16, f16),
 * (f32, f32). Binds T and KV. */
#define PGK_DISPATCH_ACT_KV(dt, kdt, ...)                                               \
    do {                                                                                \
        if ((dt) == PGK_BF16 && (kdt) == PGK_BF16) { typedef bf16_t T; typedef bf16_t KV; __VA_ARGS__; } \
        else if ((dt) == PGK_BF16 && (kdt) == PGK_F16) { typedef bf16_t T; typedef f16_t KV; __VA_ARGS__; } \
        else if ((dt) == PGK_F32 && (kdt) == PGK_F32) { typedef float T; typedef float KV; __VA_ARGS__; } \
    } while (0)

/* Binds the compile-time head size HDC to hd (cuda_plan_head_dim_supported);
 * other values run nothing (the launcher checked hd before). */
#define PGK_HD_CASES(hd, ...)                                               \
    switch (hd) {                                                           \
    case 8: { constexpr int HDC = 8; __VA_ARGS__; } break;                  \
    case 16: { constexpr int HDC = 16; __VA_ARGS__; } break;                \
    case 32: { constexpr int HDC = 32; __VA_ARGS__; } break;                \
    case 64: { constexpr int HDC = 64; __VA_ARGS__; } break;                \
    case 128: { constexpr int HDC = 128; __VA_ARGS__; } break;              \
    case 256: { constexpr int HDC = 256; __VA_ARGS__; } break;              \
    default: break;                                                         \
    }

static inline int pgk_check_act_kv_pair(const char *kernel, int dt, int kdt, pg_error *err)
{
    if ((dt == PGK_BF16 && (kdt == PGK_BF16 || kdt == PGK_F16)) || (dt == PGK_F32 && kdt == PGK_F32))
        return 0;
    return pg_error_set(err, PG_EINVAL,
                        "%s: activation/kv dtypes %d/%d: expected bf16/bf16, bf16/f16 or f32/f32",
                        kernel, dt, kdt);
}

/* Precondition helper for launchers: activations are BF16 or F32. */
static inline int pgk_check_act_dtype(const char *kernel, int dt, pg_error *err)
{
    if (dt != PGK_BF16 && dt != PGK_F32)
        return pg_error_set(err, PG_EINVAL, "%s: activation dtype %d: expected bf16 or f32",
                            kernel, dt);
    return 0;
}

static inline int pgk_check_kv_dtype(const char *kernel, int dt, pg_error *err)
{
    if (dt != PGK_BF16 && dt != PGK_F16 && dt != PGK_F32)
        return pg_error_set(err, PG_EINVAL, "%s: kv dtype %d: expected bf16, f16 or f32",
                            kernel, dt);
    return 0;
}

static inline int pgk_aligned(const void *p, size_t bytes)
{
    return ((uintptr_t)p % bytes) == 0;
}

#endif /* PG_CUDA_COMMON_CUH */
