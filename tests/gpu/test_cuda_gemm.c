/* test_cuda_gemm (suite gpu; suite gpu-emu on the host-emulated device,
 * tests/cuda_emu): cuda_gemm's fixed-rows mode and CUDA graph capture
 * (gpu/cuda_gemm.h). The products themselves are checked against the CPU
 * twin by tests/ops; here:
 *  - a call that would have to grow the padding buffers while its stream is
 *    captured is refused with a message that says so, and allocates
 *    nothing (an allocation would invalidate the capture);
 *  - a call of whole 128-row chunks grows them too (what the graphs'
 *    warm-up at max_batch 256 makes), so a later partial chunk of the same
 *    (N, K) is capturable, and its replay gives the eager call's bits;
 *  - a padding allocation that fails leaves no CUDA error behind for the
 *    next launch check to report as its own.
 * Without CUDA built or without a device: SKIP (77). */
#include <stdio.h>

#ifndef PG_HAVE_CUDA
int main(void)
{
    printf("SKIP: the CUDA executor is not built (meson found no nvcc/cuBLAS)\n");
    return 77;
}
#else

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cuda_runtime_api.h>

#include "cuda_executor.h"
#include "cuda_gemm.h"
#include "cuda_kernels.h"
#include "test_support.h"

enum { N = 24, K = 16, M_FULL = CUDA_GEMM_FIXED_ROWS, M_PART = 5 };

static void check_cuda(cudaError_t e, const char *what)
{
    if (e != cudaSuccess)
        fail_msg("%s: %s", what, cudaGetErrorString(e));
}

static void test_padding_and_capture(void **state)
{
    (void)state;
    cudaStream_t st;
    check_cuda(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "cudaStreamCreate");
    cuda_gemm *g = NULL;
    pg_error err;
    assert_int_equal(cuda_gemm_create(&g, st, &err), 0);
    cuda_gemm_set_fixed_rows(g, CUDA_GEMM_FIXED_ROWS);

    static float hx[M_FULL * K], hw[N * K], y_eager[M_PART * N], y_graph[M_PART * N];
    uint32_t r = 12345u;
    for (size_t i = 0; i < M_FULL * K; i++)
        hx[i] = (float)((r = r * 1664525u + 1013904223u) >> 20) / 4096.0f - 0.5f;
    for (size_t i = 0; i < N * K; i++)
        hw[i] = (float)((r = r * 1664525u + 1013904223u) >> 20) / 4096.0f - 0.5f;
    float *x = NULL, *w = NULL, *y = NULL;
    check_cuda(cudaMalloc((void **)&x, sizeof hx), "cudaMalloc x");
    check_cuda(cudaMalloc((void **)&w, sizeof hw), "cudaMalloc w");
    check_cuda(cudaMalloc((void **)&y, (size_t)M_FULL * N * 4u), "cudaMalloc y");
    check_cuda(cudaMemcpy(x, hx, sizeof hx, cudaMemcpyHostToDevice), "upload x");
    check_cuda(cudaMemcpy(w, hw, sizeof hw, cudaMemcpyHostToDevice), "upload w");

    /* 1. nothing grown yet: a partial chunk inside a capture is refused */
    const uint64_t gen0 = cuda_gemm_buffers_generation(g);
    check_cuda(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture");
    assert_int_equal(cuda_gemm_xwt(g, y, PGK_F32, x, w, PGK_F32, M_PART, N, K, &err), PG_EINVAL);
    assert_non_null(strstr(err.msg, "captured into a CUDA graph"));
    cudaGraph_t graph = NULL;
    /* the refusal did nothing illegal: the (empty) capture is still valid */
    check_cuda(cudaStreamEndCapture(st, &graph), "cudaStreamEndCapture after the refusal");
    if (graph)
        cudaGraphDestroy(graph);
    assert_int_equal(cuda_gemm_buffers_generation(g), gen0);

    /* 2. whole chunks only (M = 128) grow the buffers for (N, K) too */
    assert_int_equal(cuda_gemm_xwt(g, y, PGK_F32, x, w, PGK_F32, M_FULL, N, K, &err), 0);
    const uint64_t gen1 = cuda_gemm_buffers_generation(g);
    assert_true(gen1 > gen0);
    assert_int_equal(cuda_gemm_xwt(g, y, PGK_F32, x, w, PGK_F32, M_PART, N, K, &err), 0);
    check_cuda(cudaStreamSynchronize(st), "cudaStreamSynchronize"); /* st is non-blocking */
    check_cuda(cudaMemcpy(y_eager, y, sizeof y_eager, cudaMemcpyDeviceToHost), "download");
    check_cuda(cudaMemsetAsync(y, 0, (size_t)M_FULL * N * 4u, st), "cudaMemsetAsync");
    check_cuda(cudaStreamSynchronize(st), "cudaStreamSynchronize");
    check_cuda(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture");
    int rc = cuda_gemm_xwt(g, y, PGK_F32, x, w, PGK_F32, M_PART, N, K, &err);
    cudaError_t e = cudaStreamEndCapture(st, &graph);
    if (rc)
        fail_msg("captured partial chunk: %s", err.msg);
    check_cuda(e, "cudaStreamEndCapture");
    cudaGraphExec_t exec = NULL;
    check_cuda(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
    check_cuda(cudaGraphLaunch(exec, st), "cudaGraphLaunch");
    check_cuda(cudaStreamSynchronize(st), "cudaStreamSynchronize");
    check_cuda(cudaMemcpy(y_graph, y, sizeof y_graph, cudaMemcpyDeviceToHost), "download");
    assert_memory_equal(y_eager, y_graph, sizeof y_eager);
    assert_int_equal(cuda_gemm_buffers_generation(g), gen1);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);

    /* 3. a padding buffer too large for the device: PG_ENOMEM, and the
     * runtime's last error is clear for the next launch check */
    assert_int_equal(cuda_gemm_xwt(g, y, PGK_F32, x, w, PGK_F32, M_PART, (int32_t)1 << 28, K, &err),
                     PG_ENOMEM);
    assert_non_null(strstr(err.msg, "padding buffer"));
    assert_int_equal(cudaGetLastError(), cudaSuccess);

    cuda_gemm_destroy(g);
    cudaFree(x);
    cudaFree(w);
    cudaFree(y);
    cudaStreamDestroy(st);
}

int main(void)
{
    if (cuda_device_count() == 0) {
        printf("SKIP: no CUDA device\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_padding_and_capture),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#endif /* PG_HAVE_CUDA */
