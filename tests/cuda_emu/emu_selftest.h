/* emu_selftest: C launchers of the emulator's self-test kernels
 * (emu_selftest.cu); each returns the cudaError_t of the launch as int.
 * Device pointers from cudaMalloc. */
#ifndef EMU_SELFTEST_H
#define EMU_SELFTEST_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

/* d_out [9][32]: shfl_xor 5, shfl_down 3, shfl_up 2, shfl 7, ballot(lane%3==0),
 * any(lane==31), all(lane<31), shfl_xor 1 width 8, warp_sum(lane) */
int emu_st_warp_ops(int32_t *d_out);
/* one block of n threads: out[i] = sum of in[0..n-1] through shared memory */
int emu_st_block_sum(float *d_out, const float *d_in, int n, int with_barrier);
/* out[i] = never-written dynamic shared memory */
int emu_st_read_poison(float *d_out, int n);
int emu_st_divergent_barrier(float *d_out);
int emu_st_bad_mask(int32_t *d_out);
/* a __launch_bounds__(128) kernel with `threads` threads */
int emu_st_bounded(float *d_out, int threads);
/* smem_bytes of dynamic shared memory, after an opt-in of optin_bytes (> 0) */
int emu_st_smem(float *d_out, int threads, size_t smem_bytes, int optin_bytes);
/* load8 of 8 bf16 at d_bf16 (needs 16-byte alignment) -> d_out[8] */
int emu_st_load8(float *d_out, const uint16_t *d_bf16);
/* x[i] += 1 for i < n on stream st */
int emu_st_add_one(float *d_x, int n, cudaStream_t st);
/* a launch with grid (gx, gy) and bx threads */
int emu_st_grid(float *d_out, unsigned gx, unsigned gy, unsigned bx);

/* sum += i, fsum += 1, max = max(max, i) over the blocks * threads thread
 * indices i, with atomicAdd / atomicMax */
int emu_st_atomics(int32_t *d_sum, float *d_fsum, int32_t *d_max, unsigned blocks, unsigned threads);

#include "emu_hooks.h"

#endif
