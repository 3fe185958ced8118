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
 *    next launch check to report as its own;
 *  - a row's bits do not depend on M (1, 130, 256) or on its position in
 *    the batch (0 .. 255), at Llama-3-8B's shapes on a device;
 *  - gpu/gemv.cu (GEMV_ON) against the double product and cuBLAS, and
 *    position-invariant over M = 3 .. 21; AUTO measures a shape once and
 *    fixes it; cuda_gemm_xwt_rows runs a padded chunk in place with the
 *    padded path's bits and no copy.
 * Without CUDA built or without a device: SKIP (77). */
#include <stdio.h>

#ifndef PG_HAVE_CUDA
int main(void)
{
    printf("SKIP: the CUDA executor is not built (meson found no nvcc/cuBLAS)\n");
    return 77;
}
#else

#include <math.h>
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
     * runtime's last error is clear for the next launch check. N from the
     * device's total memory: a fixed N of 2^28 (128 GiB of padding) fit
     * on a 141 GiB H200, and the product then read w far out of bounds. */
    size_t free_b = 0, total_b = 0;
    check_cuda(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
    const size_t n_big = total_b / ((size_t)CUDA_GEMM_FIXED_ROWS * 4u) + 1u;
    assert_true(n_big <= (size_t)INT32_MAX); /* up to 1 TiB of device memory */
    assert_int_equal(cuda_gemm_xwt(g, y, PGK_F32, x, w, PGK_F32, M_PART, (int32_t)n_big, K, &err),
                     PG_ENOMEM);
    assert_non_null(strstr(err.msg, "padding buffer"));
    assert_int_equal(cudaGetLastError(), cudaSuccess);

    cuda_gemm_destroy(g);
    cudaFree(x);
    cudaFree(w);
    cudaFree(y);
    cudaStreamDestroy(st);
}

/* Batch invariance of the fixed 128-row mode at the shapes a real model
 * has: a row's output bits must not depend on M or on its position in the
 * batch (a stream-K or split-K kernel picked per tile would break that:
 * cuda_gemm.c). Row x0 is computed alone (M = 1, position 0), then placed
 * at positions 0, 63, 64, 127 (M = 130, 256), 128, 129 (M = 130), 255
 * (M = 256) among random rows; its output row must be bit-identical each
 * time. On a device: Llama-3-8B's V x H (lm_head, f32 out), 2I x H
 * (gate_up), H x I (down) and (nh + 2 nkv) hd x H in bf16; on the emulator
 * (whose fake cuBLAS sums in one fixed order) small shapes, which check the
 * test's own bookkeeping. */
static void test_row_position_invariance(void **state)
{
    (void)state;
#ifdef PG_CUDA_EMU
    static const int32_t shapes[][3] = {{96, 64, PGK_F32}, {64, 160, PGK_BF16}, {40, 16, PGK_F32}};
#else
    static const int32_t shapes[][3] = {
        {128256, 4096, PGK_F32}, {28672, 4096, PGK_BF16}, {4096, 14336, PGK_BF16},
        {6144, 4096, PGK_BF16}};
#endif
    static const int32_t cases[][2] = {{130, 0}, {130, 63}, {130, 64}, {130, 127}, {130, 128},
                                       {130, 129}, {256, 64}, {256, 127}, {256, 255}};
    cudaStream_t st;
    check_cuda(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "cudaStreamCreate");
    cuda_gemm *g = NULL;
    pg_error err;
    assert_int_equal(cuda_gemm_create(&g, st, &err), 0);
    cuda_gemm_set_fixed_rows(g, CUDA_GEMM_FIXED_ROWS);
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
        const int32_t Nc = shapes[c][0], Kc = shapes[c][1], ydt = shapes[c][2];
        const int in_dt = PGK_BF16;
        const size_t xb = 2, yb = pgk_dtype_bytes(ydt), Mmax = 256;
        uint16_t *hx = malloc(Mmax * (size_t)Kc * xb), *hw = malloc((size_t)Nc * (size_t)Kc * xb);
        unsigned char *ref = malloc((size_t)Nc * yb), *got = malloc((size_t)Nc * yb);
        assert_true(hx && hw && ref && got);
        uint32_t r = 777u + (uint32_t)c;
        /* bf16 in [0.5, 2) with a random sign: exponents 0x3f0 .. 0x3ff */
        for (size_t i = 0; i < Mmax * (size_t)Kc; i++) {
            r = r * 1664525u + 1013904223u;
            hx[i] = (uint16_t)((r >> 31) << 15 | (0x3f00u + ((r >> 8) & 0xffu)));
        }
        for (size_t i = 0; i < (size_t)Nc * (size_t)Kc; i++) {
            r = r * 1664525u + 1013904223u;
            hw[i] = (uint16_t)((r >> 31) << 15 | (0x3f00u + ((r >> 8) & 0xffu)));
        }
        void *x = NULL, *w = NULL, *y = NULL;
        check_cuda(cudaMalloc(&x, Mmax * (size_t)Kc * xb), "cudaMalloc x");
        check_cuda(cudaMalloc(&w, (size_t)Nc * (size_t)Kc * xb), "cudaMalloc w");
        check_cuda(cudaMalloc(&y, Mmax * (size_t)Nc * yb), "cudaMalloc y");
        check_cuda(cudaMemcpy(w, hw, (size_t)Nc * (size_t)Kc * xb, cudaMemcpyHostToDevice), "upload w");
        /* row x0 = hx row 0, alone */
        check_cuda(cudaMemcpy(x, hx, (size_t)Kc * xb, cudaMemcpyHostToDevice), "upload x0");
        assert_int_equal(cuda_gemm_xwt(g, y, ydt, x, w, in_dt, 1, Nc, Kc, &err), 0);
        check_cuda(cudaStreamSynchronize(st), "cudaStreamSynchronize");
        check_cuda(cudaMemcpy(ref, y, (size_t)Nc * yb, cudaMemcpyDeviceToHost), "download");
        for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
            const int32_t M = cases[k][0], pos = cases[k][1];
            /* rows 1.. of hx as the others, row 0 moved to pos */
            check_cuda(cudaMemcpy(x, hx + (size_t)Kc, (size_t)(Mmax - 1) * (size_t)Kc * xb,
                                  cudaMemcpyHostToDevice), "upload rows");
            check_cuda(cudaMemcpy((char *)x + (size_t)pos * (size_t)Kc * xb, hx, (size_t)Kc * xb,
                                  cudaMemcpyHostToDevice), "upload x0");
            assert_int_equal(cuda_gemm_xwt(g, y, ydt, x, w, in_dt, M, Nc, Kc, &err), 0);
            check_cuda(cudaStreamSynchronize(st), "cudaStreamSynchronize");
            check_cuda(cudaMemcpy(got, (char *)y + (size_t)pos * (size_t)Nc * yb, (size_t)Nc * yb,
                                  cudaMemcpyDeviceToHost), "download");
            if (memcmp(ref, got, (size_t)Nc * yb) != 0)
                fail_msg("gemm Nc %d Kc %d: the row at position %d of M %d differs from the row "
                         "alone (cuBLAS picked a position-dependent kernel: pin the algorithm, "
                         "gpu/README.md)", (int)Nc, (int)Kc, (int)pos, (int)M);
        }
        cudaFree(x);
        cudaFree(w);
        cudaFree(y);
        free(hx);
        free(hw);
        free(ref);
        free(got);
    }
    cuda_gemm_destroy(g);
    cudaStreamDestroy(st);
}

/* bf16 with a random sign in [0.5, 2) */
static uint16_t rnd_bf16(uint32_t *r)
{
    *r = *r * 1664525u + 1013904223u;
    return (uint16_t)((*r >> 31) << 15 | (0x3f00u + ((*r >> 8) & 0xffu)));
}

static double bf16_d(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return (double)f;
}

/* gpu/gemv.cu (cuda_gemm's GEMV_ON) against its twin, the reference product
 * in double (and cuBLAS, the path it replaces), on random bf16 rows: within
 * f32 accumulation's bound (f32 out) or one bf16 rounding (bf16 out); a
 * row's bits the same alone, at every position of M = 3, 8, 9, 13, 21
 * rows (tiles of 8: first, middle, last), so the GEMV is position-invariant;
 * K not a multiple of 8 stays on cuBLAS; every GEMV launch is counted as a
 * product and no padding copy is made. */
static void test_gemv(void **state)
{
    (void)state;
    static const int32_t shapes[][3] = {{40, 64, PGK_F32}, {24, 264, PGK_BF16}, {17, 8, PGK_F32},
                                        {33, 520, PGK_BF16}};
    static const int32_t Ms[] = {3, 8, 9, 13, 21};
    cudaStream_t st;
    check_cuda(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "cudaStreamCreate");
    cuda_gemm *g = NULL, *gc = NULL;
    pg_error err;
    assert_int_equal(cuda_gemm_create(&g, st, &err), 0);
    assert_int_equal(cuda_gemm_create(&gc, st, &err), 0);
    cuda_gemm_set_fixed_rows(g, CUDA_GEMM_FIXED_ROWS);
    cuda_gemm_set_fixed_rows(gc, CUDA_GEMM_FIXED_ROWS);
    cuda_gemm_set_gemv(g, CUDA_GEMM_GEMV_ON);
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
        const int32_t Nc = shapes[c][0], Kc = shapes[c][1], ydt = shapes[c][2], Mmax = 21;
        const size_t yb = pgk_dtype_bytes(ydt);
        uint16_t *hx = malloc((size_t)Mmax * Kc * 2), *hw = malloc((size_t)Nc * Kc * 2);
        unsigned char *ref = malloc((size_t)Nc * yb), *got = malloc((size_t)Mmax * Nc * yb);
        unsigned char *cub = malloc((size_t)Nc * yb);
        assert_true(hx && hw && ref && got && cub);
        uint32_t r = 99u + (uint32_t)c;
        for (size_t i = 0; i < (size_t)Mmax * Kc; i++)
            hx[i] = rnd_bf16(&r);
        for (size_t i = 0; i < (size_t)Nc * Kc; i++)
            hw[i] = rnd_bf16(&r);
        void *x = NULL, *w = NULL, *y = NULL;
        check_cuda(cudaMalloc(&x, (size_t)Mmax * Kc * 2), "cudaMalloc x");
        check_cuda(cudaMalloc(&w, (size_t)Nc * Kc * 2), "cudaMalloc w");
        check_cuda(cudaMalloc(&y, (size_t)Mmax * Nc * yb), "cudaMalloc y");
        check_cuda(cudaMemcpy(w, hw, (size_t)Nc * Kc * 2, cudaMemcpyHostToDevice), "upload w");
        check_cuda(cudaMemcpy(x, hx, (size_t)Kc * 2, cudaMemcpyHostToDevice), "upload x0");
        uint64_t p0, c0, p1, c1;
        cuda_gemm_counts(g, &p0, &c0);
        assert_int_equal(cuda_gemm_xwt(g, y, ydt, x, w, PGK_BF16, 1, Nc, Kc, &err), 0);
        cuda_gemm_counts(g, &p1, &c1);
        assert_int_equal(p1 - p0, 1); /* one GEMV launch */
        assert_int_equal(c1 - c0, 0);
        check_cuda(cudaStreamSynchronize(st), "sync");
        check_cuda(cudaMemcpy(ref, y, (size_t)Nc * yb, cudaMemcpyDeviceToHost), "download");
        assert_int_equal(cuda_gemm_xwt(gc, y, ydt, x, w, PGK_BF16, 1, Nc, Kc, &err), 0);
        check_cuda(cudaStreamSynchronize(st), "sync");
        check_cuda(cudaMemcpy(cub, y, (size_t)Nc * yb, cudaMemcpyDeviceToHost), "download");
        for (int32_t n = 0; n < Nc; n++) { /* against the double product, and cuBLAS */
            double d = 0, a = 0;
            for (int32_t k = 0; k < Kc; k++) {
                d += bf16_d(hx[k]) * bf16_d(hw[(size_t)n * Kc + k]);
                a += fabs(bf16_d(hx[k]) * bf16_d(hw[(size_t)n * Kc + k]));
            }
            double gv, cv;
            if (ydt == PGK_F32) {
                float f, h;
                memcpy(&f, ref + (size_t)n * 4, 4);
                memcpy(&h, cub + (size_t)n * 4, 4);
                gv = f;
                cv = h;
            } else {
                uint16_t f, h;
                memcpy(&f, ref + (size_t)n * 2, 2);
                memcpy(&h, cub + (size_t)n * 2, 2);
                gv = bf16_d(f);
                cv = bf16_d(h);
            }
            const double tol = (ydt == PGK_F32 ? 0.0 : fabs(d) / 128.0) + 1e-5 * a;
            if (fabs(gv - d) > tol || fabs(cv - d) > tol)
                fail_msg("gemv N %d K %d column %d: expected %.9g, got %.9g (cuBLAS %.9g)", (int)Nc,
                         (int)Kc, (int)n, d, gv, cv);
        }
        for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++)
            for (int32_t pos = 0; pos < Ms[mi]; pos++) {
                const int32_t M = Ms[mi];
                check_cuda(cudaMemcpy(x, hx + Kc, (size_t)(Mmax - 1) * Kc * 2, cudaMemcpyHostToDevice),
                           "upload rows");
                check_cuda(cudaMemcpy((char *)x + (size_t)pos * Kc * 2, hx, (size_t)Kc * 2,
                                      cudaMemcpyHostToDevice), "upload x0");
                assert_int_equal(cuda_gemm_xwt(g, y, ydt, x, w, PGK_BF16, M, Nc, Kc, &err), 0);
                check_cuda(cudaStreamSynchronize(st), "sync");
                check_cuda(cudaMemcpy(got, (char *)y + (size_t)pos * Nc * yb, (size_t)Nc * yb,
                                      cudaMemcpyDeviceToHost), "download");
                if (memcmp(ref, got, (size_t)Nc * yb) != 0)
                    fail_msg("gemv N %d K %d: the row at position %d of M %d differs from the row "
                             "alone", (int)Nc, (int)Kc, (int)pos, (int)M);
            }
        cudaFree(x);
        cudaFree(w);
        cudaFree(y);
        free(hx);
        free(hw);
        free(ref);
        free(got);
        free(cub);
    }
    /* K = 12 (rows not 16-byte multiples): cuBLAS, padded (2 copies) */
    void *x = NULL, *w = NULL, *y = NULL;
    check_cuda(cudaMalloc(&x, 12 * 2), "cudaMalloc x");
    check_cuda(cudaMalloc(&w, 4 * 12 * 2), "cudaMalloc w");
    check_cuda(cudaMalloc(&y, 4 * 4), "cudaMalloc y");
    check_cuda(cudaMemset(x, 0, 12 * 2), "memset x");
    check_cuda(cudaMemset(w, 0, 4 * 12 * 2), "memset w");
    uint64_t p0, c0, p1, c1;
    cuda_gemm_counts(g, &p0, &c0);
    assert_int_equal(cuda_gemm_xwt(g, y, PGK_F32, x, w, PGK_BF16, 1, 4, 12, &err), 0);
    cuda_gemm_counts(g, &p1, &c1);
    assert_int_equal(p1 - p0, 1);
    assert_int_equal(c1 - c0, 2);
    check_cuda(cudaStreamSynchronize(st), "sync");
    cudaFree(x);
    cudaFree(w);
    cudaFree(y);
    cuda_gemm_destroy(g);
    cuda_gemm_destroy(gc);
    cudaStreamDestroy(st);
}

/* AUTO: a shape's first product measures both paths once and fixes the
 * choice (a second product of the shape measures nothing: one product
 * counted); an ineligible shape (f32) is never measured; OFF is cuBLAS.
 * Which path AUTO keeps is timing and not asserted (meaningless on the
 * emulator); both paths are tested above. */
static void test_gemv_auto(void **state)
{
    (void)state;
    cudaStream_t st;
    check_cuda(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "cudaStreamCreate");
    cuda_gemm *g = NULL;
    pg_error err;
    assert_int_equal(cuda_gemm_create(&g, st, &err), 0);
    cuda_gemm_set_fixed_rows(g, CUDA_GEMM_FIXED_ROWS);
    cuda_gemm_set_gemv(g, CUDA_GEMM_GEMV_AUTO);
    void *x = NULL, *w = NULL, *y = NULL;
    check_cuda(cudaMalloc(&x, 128 * 64 * 4), "cudaMalloc x");
    check_cuda(cudaMalloc(&w, 32 * 64 * 4), "cudaMalloc w");
    check_cuda(cudaMalloc(&y, 128 * 32 * 4), "cudaMalloc y");
    check_cuda(cudaMemset(x, 0, 128 * 64 * 4), "memset x");
    check_cuda(cudaMemset(w, 0, 32 * 64 * 4), "memset w");
    int32_t n, k;
    int gemv;
    assert_int_equal(cuda_gemm_gemv_shapes(g, 0, &n, &k, &gemv), 0);
    assert_int_equal(cuda_gemm_xwt(g, y, PGK_BF16, x, w, PGK_BF16, 2, 32, 64, &err), 0);
    assert_int_equal(cuda_gemm_gemv_shapes(g, 0, &n, &k, &gemv), 1);
    assert_int_equal(n, 32);
    assert_int_equal(k, 64);
    uint64_t p0, c0, p1, c1;
    cuda_gemm_counts(g, &p0, &c0);
    assert_int_equal(cuda_gemm_xwt(g, y, PGK_BF16, x, w, PGK_BF16, 5, 32, 64, &err), 0);
    cuda_gemm_counts(g, &p1, &c1);
    assert_int_equal(p1 - p0, 1);
    assert_int_equal(cuda_gemm_gemv_shapes(g, 0, &n, &k, &gemv), 1);
    assert_int_equal(cuda_gemm_xwt(g, y, PGK_F32, x, w, PGK_F32, 2, 32, 64, &err), 0);
    assert_int_equal(cuda_gemm_gemv_shapes(g, 0, &n, &k, &gemv), 1);
    printf("    auto: 32 x 64 bf16 -> %s\n", gemv ? "gemv.cu" : "cuBLAS");
    cuda_gemm_set_gemv(g, CUDA_GEMM_GEMV_OFF);
    assert_int_equal(cuda_gemm_gemv_shapes(g, 0, &n, &k, &gemv), 0);
    check_cuda(cudaStreamSynchronize(st), "sync");
    cudaFree(x);
    cudaFree(w);
    cudaFree(y);
    cuda_gemm_destroy(g);
    cudaStreamDestroy(st);
}

/* cuda_gemm_xwt_rows: a last partial chunk whose 128 padded rows both
 * buffers hold runs in place — no padding copy, the same bits as through
 * the padding buffers — and writes y's rows past M (allowed); a buffer
 * one row short of the chunk goes through the padding (2 copies). */
static void test_in_place_rows(void **state)
{
    (void)state;
    enum { NI = 24, KI = 40, MI = 5, R = CUDA_GEMM_FIXED_ROWS };
    cudaStream_t st;
    check_cuda(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "cudaStreamCreate");
    cuda_gemm *g = NULL;
    pg_error err;
    assert_int_equal(cuda_gemm_create(&g, st, &err), 0);
    cuda_gemm_set_fixed_rows(g, R);
    static float hx[R * KI], hw[NI * KI], y1[R * NI], y2[R * NI];
    uint32_t r = 4242u;
    for (size_t i = 0; i < R * KI; i++)
        hx[i] = (float)((r = r * 1664525u + 1013904223u) >> 20) / 4096.0f - 0.5f;
    for (size_t i = 0; i < NI * KI; i++)
        hw[i] = (float)((r = r * 1664525u + 1013904223u) >> 20) / 4096.0f - 0.5f;
    float *x = NULL, *w = NULL, *y = NULL;
    check_cuda(cudaMalloc((void **)&x, sizeof hx), "cudaMalloc x");
    check_cuda(cudaMalloc((void **)&w, sizeof hw), "cudaMalloc w");
    check_cuda(cudaMalloc((void **)&y, sizeof y1), "cudaMalloc y");
    check_cuda(cudaMemcpy(x, hx, sizeof hx, cudaMemcpyHostToDevice), "upload x");
    check_cuda(cudaMemcpy(w, hw, sizeof hw, cudaMemcpyHostToDevice), "upload w");
    for (int pass = 0; pass < 3; pass++) {
        check_cuda(cudaMemset(y, 0x7f, sizeof y1), "memset y");
        uint64_t p0, c0, p1, c1;
        cuda_gemm_counts(g, &p0, &c0);
        const int64_t rows = pass == 0 ? MI : pass == 1 ? R : R - 1;
        assert_int_equal(cuda_gemm_xwt_rows(g, y, rows, PGK_F32, x, rows, w, PGK_F32, MI, NI, KI, &err), 0);
        cuda_gemm_counts(g, &p1, &c1);
        assert_int_equal(p1 - p0, 1);
        assert_int_equal(c1 - c0, pass == 1 ? 0 : 2);
        check_cuda(cudaStreamSynchronize(st), "sync");
        check_cuda(cudaMemcpy(pass ? y2 : y1, y, sizeof y1, cudaMemcpyDeviceToHost), "download");
        if (pass)
            assert_memory_equal(y1, y2, (size_t)MI * NI * sizeof(float));
        if (pass == 1) /* row MI was computed too */
            assert_true(memcmp(&y2[MI * NI], &y1[MI * NI], NI * sizeof(float)) != 0);
    }
    cudaFree(x);
    cudaFree(w);
    cudaFree(y);
    cuda_gemm_destroy(g);
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
        cmocka_unit_test(test_row_position_invariance),
        cmocka_unit_test(test_gemv),
        cmocka_unit_test(test_gemv_auto),
        cmocka_unit_test(test_in_place_rows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#endif /* PG_HAVE_CUDA */
