/* emu_misaligned: negative control — load8 (gpu/cuda_common.cuh) of a bf16
 * row 2 bytes off its 16-byte alignment. On a device: a misaligned address
 * fault; here UBSan's alignment check must stop the process (meson runs it
 * through emu_expect_error.py, which requires that failure and its message). */
#include <stdint.h>
#include <stdio.h>

#include <cuda_runtime_api.h>

#include "emu_selftest.h"

int main(void)
{
    uint16_t *d = NULL;
    float *out = NULL;
    if (cudaMalloc((void **)&d, 64) != cudaSuccess || cudaMalloc((void **)&out, 32) != cudaSuccess)
        return 1;
    cudaMemset(d, 0, 64);
    emu_st_load8(out, d + 1);
    cudaDeviceSynchronize();
    printf("misaligned load not detected\n");
    return 0;
}
