/* emu_device: the CUDA C++ device-language subset of gpu/, for host C++.
 *
 * What a .cu file of gpu/ sees once emu_rewrite.py has rewritten it (the
 * only source changes: `k<<<grid, block, smem, st>>>(args)` becomes
 * emu_launch(...), and `__shared__` / `extern __shared__` declarations
 * become EMU_SHARED_ARRAY / emu_dynamic_shared()):
 *   - qualifiers (__global__, __device__, __forceinline__, __launch_bounds__)
 *     expand to nothing or `inline`; launch bounds are checked at the launch
 *     (the rewrite passes each kernel's bound);
 *   - threadIdx / blockIdx / blockDim / gridDim read the current emulated
 *     thread (one fiber per CUDA thread, emu_block.cc);
 *   - __syncthreads and the warp-synchronous intrinsics (__shfl*_sync,
 *     __ballot_sync, __any_sync, __all_sync, __syncwarp) are barriers over
 *     the block or the lanes named by `mask`; a lane outside its own mask,
 *     lanes of one warp with different masks or operations, a source lane
 *     outside the mask and a barrier some thread can no longer reach are
 *     reported as errors (CUDA: undefined behaviour);
 *   - vector types (uint4, float4, float2, ...) carry the device's alignment,
 *     so a misaligned vector load is caught by UBSan's alignment check
 *     (-fsanitize=alignment, always on in the emulated build);
 *   - atomics are __atomic builtins (blocks may run on several OS threads);
 *   - math: the host libm (expf, sincosf, ...): bit-exactness with the
 *     device's libdevice is NOT claimed (see README.md).
 */
#ifndef EMU_DEVICE_H
#define EMU_DEVICE_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "include/cuda_runtime_api.h"
#include "emu_half.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) alignas(n)

/* ---- vector types (alignment as in vector_types.h) ----------------------- */
struct uint3 { unsigned int x, y, z; };
struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
};
struct alignas(16) uint4 { unsigned int x, y, z, w; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(8) uint2 { unsigned int x, y; };
struct alignas(8) int2 { int x, y; };
struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };

static inline float2 make_float2(float x, float y) { return float2{x, y}; }
static inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }

static inline float2 __bfloat1622float2(__nv_bfloat162 h)
{
    return float2{__bfloat162float(h.x), __bfloat162float(h.y)};
}
static inline float2 __half22float2(__half2 h)
{
    return float2{__half2float(h.x), __half2float(h.y)};
}
static inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b)
{
    return __nv_bfloat162{__float2bfloat16_rn(a), __float2bfloat16_rn(b)};
}
static inline __half2 __floats2half2_rn(float a, float b)
{
    return __half2{__float2half_rn(a), __float2half_rn(b)};
}

/* ---- the current thread --------------------------------------------------- */
namespace emu {

struct block_exec;

/* One emulated CUDA thread (a fiber of block_exec). */
struct thread_ctx {
    uint3 tid;
    int linear;           /* tid.x + tid.y * bx + tid.z * bx * by */
    int state;            /* emu_block.cc */
    block_exec *blk;
};

/* The block being executed by this OS thread and its grid coordinates. */
struct grid_ctx {
    uint3 bid;
    dim3 bdim, gdim;
};

extern thread_local thread_ctx *t_thread;
extern thread_local grid_ctx t_grid;

void syncthreads();
/* Warp-synchronous operation: kind, participating lanes, this lane's
 * 64-bit value and its parameter (source lane, xor mask, delta);
 * returns the result for this lane. */
enum warp_kind { WARP_SHFL, WARP_SHFL_XOR, WARP_SHFL_DOWN, WARP_SHFL_UP, WARP_BALLOT,
                 WARP_ANY, WARP_ALL, WARP_SYNC };
uint64_t warp_op(warp_kind kind, unsigned mask, uint64_t value, int param, int width);

/* Shared memory of the current block (poisoned with 0xff bytes — NaN in
 * every float format — at block start). */
void *dynamic_shared();
void *static_shared(const char *key, size_t bytes, size_t align);

template <typename V> static inline uint64_t to_bits(V v)
{
    static_assert(sizeof(V) <= 8 && std::is_trivially_copyable<V>::value, "warp op on a type > 8 bytes");
    uint64_t u = 0;
    memcpy(&u, &v, sizeof v);
    return u;
}
template <typename V> static inline V from_bits(uint64_t u)
{
    V v;
    memcpy(&v, &u, sizeof v);
    return v;
}

} // namespace emu

#define threadIdx (emu::t_thread->tid)
#define blockIdx (emu::t_grid.bid)
#define blockDim (emu::t_grid.bdim)
#define gridDim (emu::t_grid.gdim)
static constexpr int warpSize = 32;

static inline void __syncthreads() { emu::syncthreads(); }
static inline void __syncwarp(unsigned mask = 0xffffffffu) { emu::warp_op(emu::WARP_SYNC, mask, 0, 0, 32); }

template <typename V> static inline V __shfl_sync(unsigned mask, V v, int src, int width = 32)
{
    return emu::from_bits<V>(emu::warp_op(emu::WARP_SHFL, mask, emu::to_bits(v), src, width));
}
template <typename V> static inline V __shfl_xor_sync(unsigned mask, V v, int lane_mask, int width = 32)
{
    return emu::from_bits<V>(emu::warp_op(emu::WARP_SHFL_XOR, mask, emu::to_bits(v), lane_mask, width));
}
template <typename V> static inline V __shfl_down_sync(unsigned mask, V v, unsigned delta, int width = 32)
{
    return emu::from_bits<V>(emu::warp_op(emu::WARP_SHFL_DOWN, mask, emu::to_bits(v), (int)delta, width));
}
template <typename V> static inline V __shfl_up_sync(unsigned mask, V v, unsigned delta, int width = 32)
{
    return emu::from_bits<V>(emu::warp_op(emu::WARP_SHFL_UP, mask, emu::to_bits(v), (int)delta, width));
}
static inline unsigned __ballot_sync(unsigned mask, int pred)
{
    return (unsigned)emu::warp_op(emu::WARP_BALLOT, mask, pred != 0, 0, 32);
}
static inline int __any_sync(unsigned mask, int pred)
{
    return (int)emu::warp_op(emu::WARP_ANY, mask, pred != 0, 0, 32);
}
static inline int __all_sync(unsigned mask, int pred)
{
    return (int)emu::warp_op(emu::WARP_ALL, mask, pred != 0, 0, 32);
}

/* ---- shared memory (emitted by emu_rewrite.py) ----------------------------- */
/* `__shared__ T name dims;` -> EMU_SHARED_ARRAY(T, name, dims); */
#define EMU_SHARED_ARRAY(T, name, dims)                                                  \
    typedef T emu_shared_type_##name dims;                                               \
    emu_shared_type_##name &name = *static_cast<emu_shared_type_##name *>(               \
        emu::static_shared(__FILE__ ":" #name, sizeof(emu_shared_type_##name),           \
                           alignof(emu_shared_type_##name)))
/* `extern __shared__ T name[];` -> T *name = static_cast<T *>(emu_dynamic_shared()); */
static inline void *emu_dynamic_shared() { return emu::dynamic_shared(); }

/* ---- integer / float helpers of the CUDA math API ------------------------- */
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline unsigned long min(unsigned long a, unsigned long b) { return a < b ? a : b; }
static inline unsigned long max(unsigned long a, unsigned long b) { return a > b ? a : b; }
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
/* __expf, __logf, __sincosf: glibc declares functions of these names with
 * the accurate semantics, which the fast device versions approximate. */
static inline float __fdividef(float a, float b) { return a / b; }
static inline float __frcp_rn(float x) { return 1.0f / x; }
static inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
/* single-rounding arithmetic that nvcc never fuses into an FMA (gpu/cm_exp.cuh);
 * here the host's IEEE * + - (the emulated kernels are built without FMA) */
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline unsigned __float_as_uint(float x)
{
    unsigned u;
    memcpy(&u, &x, sizeof u);
    return u;
}
static inline float __uint_as_float(unsigned u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* ---- atomics --------------------------------------------------------------- */
template <typename V> static inline V atomicAdd(V *p, V v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
static inline float atomicAdd(float *p, float v)
{
    float old, nv;
    __atomic_load(p, &old, __ATOMIC_RELAXED);
    do {
        nv = old + v;
    } while (!__atomic_compare_exchange(p, &old, &nv, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    return old;
}
template <typename V> static inline V atomicMax(V *p, V v)
{
    V old = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (old < v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return old;
}
template <typename V> static inline V atomicMin(V *p, V v)
{
    V old = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (old > v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return old;
}
template <typename V> static inline V atomicExch(V *p, V v) { return __atomic_exchange_n(p, v, __ATOMIC_RELAXED); }
template <typename V> static inline V atomicCAS(V *p, V cmp, V v)
{
    __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return cmp;
}
static inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

/* ---- launches (emitted by emu_rewrite.py) ---------------------------------- */
namespace emu {

/* One kernel launch as the runtime queues it. */
struct launch_desc {
    const char *name;           /* the kernel expression as written */
    const void *func;           /* identity for cudaFuncSetAttribute */
    dim3 grid, block;
    size_t smem_bytes;
    unsigned bound;             /* __launch_bounds__ max threads, 0 = none */
    std::vector<const void *> ptr_args; /* every pointer argument */
    void (*run)(const void *args); /* runs the kernel body for the current thread */
    void *args;                 /* owned: the converted argument tuple */
    void (*free_args)(void *args);
};

/* Validates the configuration (CUDA's launch errors, returned later by
 * cudaGetLastError) and queues the launch on st. */
void launch(cudaStream_t st, launch_desc *d);

struct cfg {
    dim3 grid, block;
    size_t smem;
    cudaStream_t st;
};

template <typename V> static inline void collect_ptr(std::vector<const void *> &out, const V &v)
{
    if constexpr (std::is_pointer<V>::value)
        out.push_back((const void *)v);
}

template <typename... P> struct kernel_call {
    void (*fn)(P...);
    std::tuple<typename std::decay<P>::type...> args;
    static void run(const void *self)
    {
        const kernel_call *k = static_cast<const kernel_call *>(self);
        std::apply(k->fn, k->args);
    }
    static void destroy(void *self) { delete static_cast<kernel_call *>(self); }
};

} // namespace emu

static inline emu::cfg emu_make_cfg(dim3 grid, dim3 block, size_t smem = 0, cudaStream_t st = nullptr)
{
    return emu::cfg{grid, block, smem, st};
}

template <typename... P, typename... A>
static inline void emu_launch(void (*fn)(P...), const char *name, unsigned bound, emu::cfg c, A &&...a)
{
    static_assert(sizeof...(P) == sizeof...(A), "emu_launch: argument count differs from the kernel's");
    auto *k = new emu::kernel_call<P...>{fn, std::tuple<typename std::decay<P>::type...>(std::forward<A>(a)...)};
    emu::launch_desc d;
    d.name = name;
    d.func = (const void *)fn;
    d.grid = c.grid;
    d.block = c.block;
    d.smem_bytes = c.smem;
    d.bound = bound;
    std::apply([&](const auto &...v) { (emu::collect_ptr(d.ptr_args, v), ...); }, k->args);
    d.run = &emu::kernel_call<P...>::run;
    d.args = k;
    d.free_args = &emu::kernel_call<P...>::destroy;
    emu::launch(c.st, &d);
}

/* the C++ overload of cuda_runtime.h: cudaFuncSetAttribute(kernel, ...) */
template <typename... P>
static inline cudaError_t cudaFuncSetAttribute(void (*fn)(P...), cudaFuncAttribute attr, int value)
{
    return cudaFuncSetAttribute((const void *)fn, attr, value);
}

#endif
