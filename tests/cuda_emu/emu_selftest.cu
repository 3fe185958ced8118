/* emu_selftest: small kernels that exercise the emulator itself (each
 * feature and each check), compiled through emu_rewrite.py like gpu/'s.
 * Launchers are C-callable for test_emu.c; they launch on the legacy
 * stream and synchronize. Not a part of gpu/: this file never sees nvcc. */
#include "../../gpu/cuda_common.cuh"

extern "C" {
#include "emu_selftest.h"
}

/* out[lane] for one warp: the shuffle and vote results, see EMU_ST_* */
static __global__ void warp_ops_kernel(int32_t *out)
{
    int lane = threadIdx.x & 31;
    int32_t v = lane * 10;
    out[0 * 32 + lane] = __shfl_xor_sync(0xffffffffu, v, 5);
    out[1 * 32 + lane] = __shfl_down_sync(0xffffffffu, v, 3);
    out[2 * 32 + lane] = __shfl_up_sync(0xffffffffu, v, 2);
    out[3 * 32 + lane] = __shfl_sync(0xffffffffu, v, 7);
    out[4 * 32 + lane] = (int32_t)__ballot_sync(0xffffffffu, lane % 3 == 0);
    out[5 * 32 + lane] = __any_sync(0xffffffffu, lane == 31);
    out[6 * 32 + lane] = __all_sync(0xffffffffu, lane < 31);
    out[7 * 32 + lane] = __shfl_xor_sync(0xffffffffu, v, 1, 8);
    float s = warp_sum((float)lane);
    out[8 * 32 + lane] = (int32_t)s;
}

/* block sum through shared memory, with or without the barrier that
 * separates the writes from the reads */
static __global__ void block_sum_kernel(float *out, const float *in, int with_barrier)
{
    __shared__ float buf[256];
    buf[threadIdx.x] = in[threadIdx.x];
    if (with_barrier)
        __syncthreads();
    float s = 0.0f;
    for (unsigned i = 0; i < blockDim.x; i++)
        s += buf[i];
    out[threadIdx.x] = s;
}

/* reads dynamic shared memory nobody wrote: the emulator's poison */
static __global__ void read_poison_kernel(float *out)
{
    extern __shared__ float dyn[];
    out[threadIdx.x] = dyn[threadIdx.x];
}

/* thread 0 leaves, the others meet at a barrier: undefined on a device */
static __global__ void divergent_barrier_kernel(float *out)
{
    if (threadIdx.x == 0)
        return;
    __syncthreads();
    out[threadIdx.x] = 1.0f;
}

/* a shuffle whose mask leaves out the calling lane */
static __global__ void bad_mask_kernel(int32_t *out)
{
    out[threadIdx.x] = __shfl_xor_sync(0x0000ffffu, (int32_t)threadIdx.x, 1);
}

static __global__ void __launch_bounds__(128) bounded_kernel(float *out)
{
    out[threadIdx.x] = 1.0f;
}

static __global__ void smem_kernel(float *out)
{
    extern __shared__ float dyn[];
    dyn[threadIdx.x] = 2.0f;
    __syncthreads();
    out[threadIdx.x] = dyn[threadIdx.x];
}

/* load8 (cuda_common.cuh) of a bf16 row at element offset `off` */
static __global__ void load8_kernel(float *out, const bf16_t *p)
{
    float v[8];
    load8(v, p);
    for (int i = 0; i < 8; i++)
        out[i] = v[i];
}

/* every thread of every block adds its index: atomics across blocks */
static __global__ void atomic_kernel(int32_t *sum, float *fsum, int32_t *mx)
{
    int32_t i = (int32_t)(blockIdx.x * blockDim.x + threadIdx.x);
    atomicAdd(sum, i);
    atomicAdd(fsum, 1.0f);
    atomicMax(mx, i);
}

static __global__ void add_one_kernel(float *x, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] += 1.0f;
}

extern "C" int emu_st_warp_ops(int32_t *d_out)
{
    warp_ops_kernel<<<1, 32>>>(d_out);
    return (int)cudaGetLastError();
}

extern "C" int emu_st_block_sum(float *d_out, const float *d_in, int n, int with_barrier)
{
    block_sum_kernel<<<1, n>>>(d_out, d_in, with_barrier);
    return (int)cudaGetLastError();
}

extern "C" int emu_st_read_poison(float *d_out, int n)
{
    read_poison_kernel<<<1, n, (size_t)n * sizeof(float)>>>(d_out);
    return (int)cudaGetLastError();
}

extern "C" int emu_st_divergent_barrier(float *d_out)
{
    divergent_barrier_kernel<<<1, 64>>>(d_out);
    return (int)cudaGetLastError();
}

extern "C" int emu_st_bad_mask(int32_t *d_out)
{
    bad_mask_kernel<<<1, 32>>>(d_out);
    return (int)cudaGetLastError();
}

extern "C" int emu_st_bounded(float *d_out, int threads)
{
    bounded_kernel<<<1, threads>>>(d_out);
    return (int)cudaGetLastError();
}

extern "C" int emu_st_smem(float *d_out, int threads, size_t smem_bytes, int optin_bytes)
{
    if (optin_bytes > 0) {
        cudaError_t e = cudaFuncSetAttribute(smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             optin_bytes);
        if (e != cudaSuccess)
            return (int)e;
    }
    smem_kernel<<<dim3(1), dim3((unsigned)threads), smem_bytes>>>(d_out);
    return (int)cudaGetLastError();
}

extern "C" int emu_st_load8(float *d_out, const uint16_t *d_bf16)
{
    load8_kernel<<<1, 1>>>(d_out, reinterpret_cast<const bf16_t *>(d_bf16));
    return (int)cudaGetLastError();
}

extern "C" int emu_st_add_one(float *d_x, int n, cudaStream_t st)
{
    add_one_kernel<<<(unsigned)((n + 63) / 64), 64, 0, st>>>(d_x, n);
    return (int)cudaGetLastError();
}

extern "C" int emu_st_grid(float *d_out, unsigned gx, unsigned gy, unsigned bx)
{
    add_one_kernel<<<dim3(gx, gy), bx>>>(d_out, 1);
    return (int)cudaGetLastError();
}

extern "C" int emu_st_atomics(int32_t *d_sum, float *d_fsum, int32_t *d_max, unsigned blocks,
                              unsigned threads)
{
    atomic_kernel<<<blocks, threads>>>(d_sum, d_fsum, d_max);
    return (int)cudaGetLastError();
}
