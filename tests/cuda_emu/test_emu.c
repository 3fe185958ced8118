/* test_emu (suite gpu-emu): the CUDA emulator's own behaviour — what it
 * computes (shuffles, votes, conversions, cuBLAS) and that each of its
 * checks fires (races, poisoned shared memory, divergent barriers, masks,
 * launch limits, pinned-buffer reuse, missing synchronization, host
 * pointers passed to kernels, graph capture). Run with EMU_ON_ERROR=count:
 * an emulator-detected error is counted (emu_error_count) instead of
 * ending the process, so each negative case asserts its error. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "dtype.h"
#include "emu_selftest.h"
#include "test_support.h"

static void *dmalloc(size_t bytes)
{
    void *p = NULL;
    assert_int_equal(cudaMalloc(&p, bytes), cudaSuccess);
    return p;
}

static void test_conversions(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float a = pg_bf16_to_f32((uint16_t)h), b = pg_f16_to_f32((uint16_t)h);
        float fa, fb;
        /* the emulator's to-f32 through a round trip of its own rounding */
        uint16_t ra, rb;
        fa = emu_test_bf16_to_f32((uint16_t)h);
        fb = emu_test_f16_to_f32((uint16_t)h);
        assert_memory_equal(&fa, &a, 4);
        assert_memory_equal(&fb, &b, 4);
        if (a == a) {
            ra = emu_test_f32_to_bf16(a);
            assert_int_equal(ra, h);
        }
        if (b == b) {
            rb = emu_test_f32_to_f16(b);
            assert_int_equal(rb, h);
        }
    }
    /* rounding: random f32 and the halfway cases, against weights/dtype */
    pg_test_rng rng = {7};
    for (int i = 0; i < 2000000; i++) {
        uint32_t u = (uint32_t)pg_test_rng_int(&rng, 0, 0x7fffffff) * 2u + (uint32_t)(i & 1);
        if (i % 4 == 0)
            u = (u & 0xffff0000u) | 0x8000u; /* bf16 ties */
        if (i % 4 == 1)
            u = (u & 0xffffe000u) | 0x1000u; /* f16 ties */
        float f;
        memcpy(&f, &u, 4);
        if (f != f)
            continue;
        assert_int_equal(emu_test_f32_to_bf16(f), pg_f32_to_bf16(f));
        assert_int_equal(emu_test_f32_to_f16(f), pg_f32_to_f16(f));
    }
}

static void test_warp_ops(void **state)
{
    (void)state;
    int32_t *d = dmalloc(9 * 32 * 4), h[9 * 32];
    assert_int_equal(emu_st_warp_ops(d), 0);
    assert_int_equal(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost), cudaSuccess);
    unsigned ballot = 0;
    for (int l = 0; l < 32; l += 3)
        ballot |= 1u << l;
    for (int l = 0; l < 32; l++) {
        assert_int_equal(h[l], (l ^ 5) * 10);
        assert_int_equal(h[32 + l], (l + 3 < 32 ? l + 3 : l) * 10);
        assert_int_equal(h[64 + l], (l >= 2 ? l - 2 : l) * 10);
        assert_int_equal(h[96 + l], 70);
        assert_int_equal((unsigned)h[128 + l], ballot);
        assert_int_equal(h[160 + l], 1);
        assert_int_equal(h[192 + l], 0);
        assert_int_equal(h[224 + l], (l ^ 1) * 10);
        assert_int_equal(h[256 + l], 31 * 32 / 2);
    }
    cudaFree(d);
    assert_int_equal(emu_error_count(), 0);
}

static void test_atomics(void **state)
{
    (void)state;
    int32_t *d = dmalloc(12), h[3] = {0, 0, -1};
    assert_int_equal(cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice), cudaSuccess);
    assert_int_equal(emu_st_atomics(d, (float *)(d + 1), d + 2, 5, 96), 0);
    assert_int_equal(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost), cudaSuccess);
    float f;
    memcpy(&f, &h[1], 4);
    assert_int_equal(h[0], 479 * 480 / 2);
    assert_true(f == 480.0f);
    assert_int_equal(h[2], 479);
    cudaFree(d);
}

static void test_race_detected(void **state)
{
    (void)state;
    const int n = 256;
    float *in = dmalloc(n * 4), *out = dmalloc(n * 4), h[256];
    for (int i = 0; i < n; i++)
        h[i] = (float)i;
    assert_int_equal(cudaMemcpy(in, h, sizeof h, cudaMemcpyHostToDevice), cudaSuccess);
    long e0 = emu_error_count();
    assert_int_equal(emu_st_block_sum(out, in, n, 1), 0);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    assert_int_equal(emu_error_count(), e0);
    assert_int_equal(emu_st_block_sum(out, in, n, 0), 0); /* the barrier removed */
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    assert_true(emu_error_count() > e0);
    cudaFree(in);
    cudaFree(out);
}

static void test_shared_poisoned(void **state)
{
    (void)state;
    float *out = dmalloc(64 * 4), h[64];
    assert_int_equal(emu_st_read_poison(out, 64), 0);
    assert_int_equal(cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int i = 0; i < 64; i++)
        assert_true(isnan(h[i]));
    cudaFree(out);
}

static void test_divergence_and_masks(void **state)
{
    (void)state;
    float *out = dmalloc(64 * 4);
    long e0 = emu_error_count();
    assert_int_equal(emu_st_divergent_barrier(out), 0);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    assert_true(emu_error_count() > e0);
    e0 = emu_error_count();
    assert_int_equal(emu_st_bad_mask((int32_t *)out), 0);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    assert_true(emu_error_count() > e0);
    cudaFree(out);
}

static void test_launch_limits(void **state)
{
    (void)state;
    float *out = dmalloc(1024 * 4);
    assert_int_equal(emu_st_bounded(out, 128), cudaSuccess);
    assert_int_equal(emu_st_bounded(out, 256), cudaErrorLaunchOutOfResources);
    assert_int_equal(emu_st_grid(out, 1, 1, 1025), cudaErrorInvalidConfiguration);
    assert_int_equal(emu_st_grid(out, 1, 65536, 32), cudaErrorInvalidConfiguration);
    assert_int_equal(emu_st_grid(out, 0, 1, 32), cudaErrorInvalidConfiguration);
    assert_int_equal(emu_st_smem(out, 64, 48 * 1024, 0), cudaSuccess);
    assert_int_equal(emu_st_smem(out, 64, 64 * 1024, 0), cudaErrorInvalidValue);
    assert_int_equal(emu_st_smem(out, 64, 64 * 1024, 64 * 1024), cudaSuccess);
    assert_int_equal(emu_st_smem(out, 64, 80 * 1024, 0), cudaErrorInvalidValue); /* over the opt-in */
    assert_int_equal(emu_st_smem(out, 64, 64 * 1024, 100 * 1024), cudaErrorInvalidValue);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidValue); /* the last error, then reset */
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    cudaFree(out);
}

static void test_aligned_load8(void **state)
{
    (void)state;
    uint16_t h[16];
    for (int i = 0; i < 16; i++)
        h[i] = pg_f32_to_bf16((float)i);
    uint16_t *d = dmalloc(sizeof h);
    float *out = dmalloc(8 * 4), r[8];
    assert_int_equal(cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice), cudaSuccess);
    assert_int_equal(emu_st_load8(out, d + 8), 0);
    assert_int_equal(cudaMemcpy(r, out, sizeof r, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int i = 0; i < 8; i++)
        assert_true(r[i] == (float)(8 + i));
    cudaFree(d);
    cudaFree(out);
}

static void test_host_pointer_argument(void **state)
{
    (void)state;
    float host[64];
    long e0 = emu_error_count();
    assert_int_equal(emu_st_add_one(host, 64, NULL), 0);
    assert_true(emu_error_count() > e0);
    cudaDeviceSynchronize();
}

/* queued work runs only at synchronization points */
static void test_pinned_and_sync(void **state)
{
    (void)state;
    cudaStream_t st;
    assert_int_equal(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
    float *pin = NULL, *d = dmalloc(64 * 4);
    assert_int_equal(cudaMallocHost((void **)&pin, 64 * 4), cudaSuccess);
    for (int i = 0; i < 64; i++)
        pin[i] = (float)i;
    assert_int_equal(cudaMemcpyAsync(d, pin, 64 * 4, cudaMemcpyHostToDevice, st), cudaSuccess);
    assert_int_equal(emu_st_add_one(d, 64, st), 0);
    float *pout = NULL;
    assert_int_equal(cudaMallocHost((void **)&pout, 64 * 4), cudaSuccess);
    assert_int_equal(cudaMemcpyAsync(pout, d, 64 * 4, cudaMemcpyDeviceToHost, st), cudaSuccess);
    /* read before the synchronization: not there yet */
    assert_true(isnan(pout[3]));
    assert_int_equal(cudaStreamSynchronize(st), cudaSuccess);
    assert_true(pout[3] == 4.0f);
    /* back into the buffer a queued copy still reads: legal (stream order) */
    assert_int_equal(cudaMemcpyAsync(d, pin, 64 * 4, cudaMemcpyHostToDevice, st), cudaSuccess);
    assert_int_equal(cudaMemcpyAsync(pin, d, 64 * 4, cudaMemcpyDeviceToHost, st), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(st), cudaSuccess);
    assert_true(pin[3] == 3.0f);
    cudaFreeHost(pout);

    /* a pinned source modified before its copy ran */
    long e0 = emu_error_count();
    assert_int_equal(cudaMemcpyAsync(d, pin, 64 * 4, cudaMemcpyHostToDevice, st), cudaSuccess);
    pin[5] = -1.0f;
    assert_int_equal(cudaStreamSynchronize(st), cudaSuccess);
    assert_true(emu_error_count() > e0);

    /* ... and waiting for an event before reusing it is fine */
    cudaEvent_t ev;
    assert_int_equal(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), cudaSuccess);
    e0 = emu_error_count();
    assert_int_equal(cudaMemcpyAsync(d, pin, 64 * 4, cudaMemcpyHostToDevice, st), cudaSuccess);
    assert_int_equal(cudaEventRecord(ev, st), cudaSuccess);
    assert_int_equal(cudaEventSynchronize(ev), cudaSuccess);
    pin[5] = -2.0f;
    assert_int_equal(cudaStreamSynchronize(st), cudaSuccess);
    assert_int_equal(emu_error_count(), e0);
    cudaEventDestroy(ev);
    cudaFreeHost(pin);
    cudaFree(d);
    cudaStreamDestroy(st);
}

static void test_graph_capture(void **state)
{
    (void)state;
    cudaStream_t st;
    assert_int_equal(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
    float *pin = NULL, *d = dmalloc(16 * 4), *out = NULL;
    assert_int_equal(cudaMallocHost((void **)&pin, 16 * 4), cudaSuccess);
    assert_int_equal(cudaMallocHost((void **)&out, 16 * 4), cudaSuccess);
    cudaGraph_t g;
    cudaGraphExec_t ge;
    assert_int_equal(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal), cudaSuccess);
    assert_int_equal(cudaMemcpyAsync(d, pin, 16 * 4, cudaMemcpyHostToDevice, st), cudaSuccess);
    assert_int_equal(emu_st_add_one(d, 16, st), 0);
    assert_int_equal(cudaMemcpyAsync(out, d, 16 * 4, cudaMemcpyDeviceToHost, st), cudaSuccess);
    assert_int_equal(cudaStreamEndCapture(st, &g), cudaSuccess);
    assert_int_equal(cudaGraphInstantiate(&ge, g, 0), cudaSuccess);
    for (int rep = 0; rep < 3; rep++) {
        for (int i = 0; i < 16; i++)
            pin[i] = (float)(i * 10 + rep);
        assert_int_equal(cudaGraphLaunch(ge, st), cudaSuccess);
        assert_int_equal(cudaStreamSynchronize(st), cudaSuccess);
        for (int i = 0; i < 16; i++)
            assert_true(out[i] == (float)(i * 10 + rep) + 1.0f);
    }
    /* synchronizing inside a capture invalidates it */
    assert_int_equal(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal), cudaSuccess);
    assert_int_equal(emu_st_add_one(d, 16, st), 0);
    assert_int_equal(cudaStreamSynchronize(st), cudaErrorStreamCaptureUnsupported);
    cudaGraph_t g2;
    assert_int_equal(cudaStreamEndCapture(st, &g2), cudaErrorStreamCaptureInvalidated);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    cudaFreeHost(pin);
    cudaFreeHost(out);
    cudaFree(d);
    cudaStreamDestroy(st);
}

/* What CUDA forbids while a stream is captured (global mode) invalidates
 * the capture; a replay after a captured buffer was freed is reported. */
static void test_graph_capture_rules(void **state)
{
    (void)state;
    cudaStream_t st;
    assert_int_equal(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
    float *d = dmalloc(16 * 4), *pin = NULL;
    assert_int_equal(cudaMallocHost((void **)&pin, 16 * 4), cudaSuccess);
    cudaEvent_t ev;
    assert_int_equal(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), cudaSuccess);
    assert_int_equal(cudaEventRecord(ev, st), cudaSuccess);
    cudaGraph_t g = NULL;
    /* an allocation */
    void *p = NULL;
    assert_int_equal(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal), cudaSuccess);
    assert_int_equal(cudaMalloc(&p, 64), cudaErrorStreamCaptureUnsupported);
    assert_int_equal(cudaStreamEndCapture(st, &g), cudaErrorStreamCaptureInvalidated);
    /* an event synchronization (even of an event recorded before) */
    assert_int_equal(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal), cudaSuccess);
    assert_int_equal(cudaEventSynchronize(ev), cudaErrorStreamCaptureUnsupported);
    assert_int_equal(cudaStreamEndCapture(st, &g), cudaErrorStreamCaptureInvalidated);
    /* a copy to pageable memory (it would synchronize) */
    float host[16];
    assert_int_equal(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal), cudaSuccess);
    assert_int_equal(cudaMemcpyAsync(host, d, sizeof host, cudaMemcpyDeviceToHost, st),
                     cudaErrorStreamCaptureUnsupported);
    assert_int_equal(cudaStreamEndCapture(st, &g), cudaErrorStreamCaptureInvalidated);
    /* cuBLAS without a workspace would allocate one */
    cublasHandle_t h;
    assert_int_equal(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
    assert_int_equal(cublasSetStream(h, st), CUBLAS_STATUS_SUCCESS);
    const float one = 1.0f, zero = 0.0f;
    assert_int_equal(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal), cudaSuccess);
    assert_int_not_equal(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, 2, 2, 2, &one, d, CUDA_R_32F, 2, d,
                                      CUDA_R_32F, 2, &zero, d + 8, CUDA_R_32F, 2,
                                      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                         CUBLAS_STATUS_SUCCESS);
    assert_int_equal(cudaStreamEndCapture(st, &g), cudaErrorStreamCaptureInvalidated);
    cublasDestroy(h);
    (void)cudaGetLastError(); /* the failed calls above set it */
    /* kernel arguments are frozen at capture; a freed buffer is reported */
    float *d2 = dmalloc(16 * 4);
    cudaGraphExec_t ge;
    assert_int_equal(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal), cudaSuccess);
    assert_int_equal(emu_st_add_one(d2, 16, st), 0);
    assert_int_equal(cudaStreamEndCapture(st, &g), cudaSuccess);
    assert_int_equal(cudaGraphInstantiate(&ge, g, 0), cudaSuccess);
    assert_int_equal(cudaMemset(d2, 0, 16 * 4), cudaSuccess);
    assert_int_equal(cudaGraphLaunch(ge, st), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(st), cudaSuccess);
    assert_int_equal(cudaMemcpy(host, d2, sizeof host, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_true(host[3] == 1.0f);
    long e0 = emu_error_count();
    cudaFree(d2);
    float *d3 = dmalloc(16 * 4); /* may well reuse d2's address: still another buffer */
    assert_int_equal(cudaGraphLaunch(ge, st), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(st), cudaSuccess);
    assert_true(emu_error_count() > e0);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    cudaFree(d3);
    cudaEventDestroy(ev);
    cudaFreeHost(pin);
    cudaFree(d);
    cudaStreamDestroy(st);
}

static void test_cublas(void **state)
{
    (void)state;
    /* C (m x n, ld 5) = A^T (A stored k x m, ld 4) . B (k x n, ld 3), f32 */
    const int m = 2, n = 2, k = 3;
    float A[4 * 2] = {1, 2, 3, 0, 4, 5, 6, 0}, B[3 * 2] = {1, 0, 2, -1, 1, 0};
    float C[5 * 2], *dA = dmalloc(sizeof A), *dB = dmalloc(sizeof B), *dC = dmalloc(sizeof C);
    void *ws = dmalloc(1 << 20);
    cudaMemcpy(dA, A, sizeof A, cudaMemcpyHostToDevice);
    cudaMemcpy(dB, B, sizeof B, cudaMemcpyHostToDevice);
    cublasHandle_t h;
    assert_int_equal(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
    assert_int_equal(cublasSetWorkspace(h, ws, 1 << 20), CUBLAS_STATUS_SUCCESS);
    const float one = 1.0f, zero = 0.0f;
    assert_int_equal(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, dA, CUDA_R_32F, 4, dB,
                                  CUDA_R_32F, 3, &zero, dC, CUDA_R_32F, 5, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT), CUBLAS_STATUS_SUCCESS);
    assert_int_equal(cudaMemcpy(C, dC, sizeof C, cudaMemcpyDeviceToHost), cudaSuccess);
    /* C[i][j] = sum_l A[l + i*4] * B[l + j*3] */
    assert_true(C[0] == 1 * 1 + 2 * 0 + 3 * 2 && C[1] == 4 * 1 + 5 * 0 + 6 * 2);
    assert_true(C[5] == 1 * -1 + 2 * 1 + 3 * 0 && C[6] == 4 * -1 + 5 * 1 + 6 * 0);
    /* leading dimensions smaller than the rows */
    assert_int_equal(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, dA, CUDA_R_32F, 2, dB,
                                  CUDA_R_32F, 3, &zero, dC, CUDA_R_32F, 5, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT), CUBLAS_STATUS_INVALID_VALUE);
    assert_int_equal(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, dA, CUDA_R_32F, 1, dB,
                                  CUDA_R_32F, 3, &zero, dC, CUDA_R_32F, 5, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT), CUBLAS_STATUS_INVALID_VALUE);
    /* a matrix that leaves its allocation: an emulator error */
    long e0 = emu_error_count();
    cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, dA, CUDA_R_32F, 4, dB, CUDA_R_32F, 3,
                 &zero, dC, CUDA_R_32F, 9, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    assert_true(emu_error_count() > e0);
    cublasDestroy(h);
    cudaFree(dA);
    cudaFree(dB);
    cudaFree(dC);
    cudaFree(ws);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conversions),
        cmocka_unit_test(test_warp_ops),
        cmocka_unit_test(test_atomics),
        cmocka_unit_test(test_race_detected),
        cmocka_unit_test(test_shared_poisoned),
        cmocka_unit_test(test_divergence_and_masks),
        cmocka_unit_test(test_launch_limits),
        cmocka_unit_test(test_aligned_load8),
        cmocka_unit_test(test_host_pointer_argument),
        cmocka_unit_test(test_pinned_and_sync),
        cmocka_unit_test(test_graph_capture),
        cmocka_unit_test(test_graph_capture_rules),
        cmocka_unit_test(test_cublas),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
