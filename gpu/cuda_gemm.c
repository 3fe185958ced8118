/* cuda_gemm: cublasGemmEx behind one function (see cuda_gemm.h).
 *
 * Row- vs column-major, once. The model stores everything row-major (C
 * order): x [M][K], w [N][K] (nn.Linear), y [M][N], and wants
 *   y = x . w^T.
 * cuBLAS is column-major: a row-major [R][C] matrix is, read column-major,
 * its transpose [C][R] with leading dimension C. So our y is cuBLAS's
 * y^T (N x M, ld N), x is x^T (K x M, ld K), w is w^T (K x N, ld K), and
 *   y^T = (x . w^T)^T = w . x^T
 * which cuBLAS computes as op(A) . op(B) with A = w^T-as-stored transposed
 * back (OP_T: (K x N)^T = N x K = w) and B = x^T (OP_N, K x M):
 *   cublasGemmEx(OP_T, OP_N, m = N, n = M, k = K, A = w, lda = K,
 *                B = x, ldb = K, C = y, ldc = N).
 * No data is transposed in memory; the weights' rows stay contiguous in K,
 * which is what the tensor-core kernels like best ("TN" GEMM).
 *
 * Determinism. cuBLAS returns bit-identical results run after run for the
 * same problem (shape, pointers' alignment, GPU model and SM count, cuBLAS
 * version), given one stream and a workspace set with cublasSetWorkspace,
 * as here (cuBLAS docs, "Results reproducibility"). It does NOT promise that
 * row m of y is the same for different M: its heuristics pick a different
 * kernel (tile shape, split-K) as M changes, which changes the summation
 * order. So with one call of M rows a sequence's logits may differ in the
 * last bits between a step where it runs alone and one where it runs in a
 * batch of 64. The fixed-rows mode (the executor's default) closes the gap:
 * every call has exactly fixed_rows rows, so for a given (N, K) cuBLAS
 * always runs the same kernel with the same split of K, and an output row
 * is the same sum in the same order whatever the other rows are (rows of a
 * GEMM never mix). Untested on hardware so far: tests/ops/test_invariance
 * checks exactly this on a device.
 */
#include "cuda_gemm.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <cublas_v2.h>

#include "cuda_kernels.h"

struct cuda_gemm {
    cublasHandle_t handle;
    cudaStream_t stream;
    void *workspace;        /* CUDA_GEMM_WORKSPACE_BYTES, device */
    int32_t fixed_rows;     /* 0 = off */
    void *x_pad, *y_pad;    /* [fixed_rows][K] in, [fixed_rows][N] out (device, grown) */
    size_t x_pad_bytes, y_pad_bytes;
    uint64_t pad_generation; /* bumped by every grow (cuda_gemm_buffers_generation) */
    uint64_t products;      /* cuBLAS calls queued (cuda_gemm_counts) */
    uint64_t copies;        /* padding copies queued (device to device) */
    /* gpu/gemv.cu instead of cuBLAS, per (N, K, output type) */
    int gemv_mode;          /* CUDA_GEMM_GEMV_* */
    pgk_launch gemv_lk;     /* its launches (counted as products), on the stream */
    struct gemm_shape {
        int32_t N, K;
        int y_dt;
        int gemv;           /* the choice, fixed at the shape's first product */
        double cublas_s, gemv_s; /* what auto measured (seconds per product) */
    } *shapes;
    int32_t n_shapes, shapes_cap;
};

void cuda_gemm_counts(const cuda_gemm *g, uint64_t *products, uint64_t *copies)
{
    *products = g->products + g->gemv_lk.kernels;
    *copies = g->copies;
}

void cuda_gemm_set_gemv(cuda_gemm *g, int mode)
{
    g->gemv_mode = mode;
    g->n_shapes = 0; /* choices are per mode */
}

int32_t cuda_gemm_gemv_shapes(const cuda_gemm *g, int32_t i, int32_t *N, int32_t *K, int *gemv)
{
    if (i >= 0 && i < g->n_shapes) {
        *N = g->shapes[i].N;
        *K = g->shapes[i].K;
        *gemv = g->shapes[i].gemv;
    }
    return g->n_shapes;
}

uint64_t cuda_gemm_buffers_generation(const cuda_gemm *g)
{
    return g->pad_generation;
}

void cuda_gemm_set_fixed_rows(cuda_gemm *g, int32_t fixed_rows)
{
    g->fixed_rows = fixed_rows > 0 ? fixed_rows : 0;
}

static int gemm_cublas_fail(pg_error *err, const char *what, cublasStatus_t s)
{
    return pg_error_set(err, PG_EDEVICE, "cublas: %s: %s: %s", what, cublasGetStatusName(s),
                        cublasGetStatusString(s));
}

int cuda_gemm_create(cuda_gemm **out, cudaStream_t st, pg_error *err)
{
    cuda_gemm *g = calloc(1, sizeof *g);
    if (!g)
        return pg_error_set(err, PG_ENOMEM, "cublas: out of host memory");
    g->stream = st;
    g->gemv_lk.st = st;
    cublasStatus_t s = cublasCreate(&g->handle);
    if (s != CUBLAS_STATUS_SUCCESS) {
        free(g);
        return gemm_cublas_fail(err, "cublasCreate", s);
    }
    int rc = 0;
    cudaError_t ce = cudaMalloc(&g->workspace, CUDA_GEMM_WORKSPACE_BYTES);
    if (ce != cudaSuccess) {
        (void)cudaGetLastError();
        g->workspace = NULL;
        rc = pg_error_set(err, PG_ENOMEM, "cublas: workspace of %zu MiB: %s: %s",
                          CUDA_GEMM_WORKSPACE_BYTES >> 20, cudaGetErrorName(ce),
                          cudaGetErrorString(ce));
        goto fail;
    }
    if ((s = cublasSetStream(g->handle, st)) != CUBLAS_STATUS_SUCCESS) {
        rc = gemm_cublas_fail(err, "cublasSetStream", s);
        goto fail;
    }
    if ((s = cublasSetWorkspace(g->handle, g->workspace, CUDA_GEMM_WORKSPACE_BYTES)) !=
        CUBLAS_STATUS_SUCCESS) {
        rc = gemm_cublas_fail(err, "cublasSetWorkspace", s);
        goto fail;
    }
    /* Default math: no TF32 for f32 inputs; reductions stay in f32 */
    s = cublasSetMathMode(g->handle, (cublasMath_t)(CUBLAS_DEFAULT_MATH |
                                                    CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
    if (s != CUBLAS_STATUS_SUCCESS) {
        rc = gemm_cublas_fail(err, "cublasSetMathMode", s);
        goto fail;
    }
    *out = g;
    return 0;
fail:
    cuda_gemm_destroy(g);
    return rc;
}

void cuda_gemm_destroy(cuda_gemm *g)
{
    if (!g)
        return;
    if (g->handle)
        cublasDestroy(g->handle);
    if (g->workspace)
        cudaFree(g->workspace);
    if (g->x_pad)
        cudaFree(g->x_pad);
    if (g->y_pad)
        cudaFree(g->y_pad);
    free(g->shapes);
    free(g);
}

static cudaDataType_t gemm_type(int dt)
{
    return dt == PGK_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

/* One cublasGemmEx call: y [M][N] = x [M][K] . w [N][K]^T. */
static int gemm_call(cuda_gemm *g, void *y, int y_dt, const void *x, const void *w, int in_dt,
                     int32_t M, int32_t N, int32_t K, pg_error *err)
{
    const float alpha = 1.0f, beta = 0.0f;
    /* y^T[N][M] (col-major) = op_T(w) [N][K] . x^T [K][M]; see the top comment */
    cublasStatus_t s = cublasGemmEx(g->handle, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &alpha,
                                    w, gemm_type(in_dt), K,
                                    x, gemm_type(in_dt), K, &beta,
                                    y, gemm_type(y_dt), N,
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    g->products++;
    if (s != CUBLAS_STATUS_SUCCESS) {
        char what[96];
        snprintf(what, sizeof what, "cublasGemmEx M %d N %d K %d", (int)M, (int)N, (int)K);
        return gemm_cublas_fail(err, what, s);
    }
    return 0;
}

/* Grows *p to at least bytes (contents dropped, then zeroed: defined
 * padding rows, whose results are dropped). Never inside a CUDA graph
 * capture: an allocation there is illegal (the driver invalidates the
 * capture) and the graph would hold the freed buffer; the executor's
 * warm-up makes every shape's call uncaptured first. On error nothing is
 * freed unless the new allocation is what failed (then *p is NULL, *cap 0,
 * and the generation says the old buffer is gone). */
static int grow(cuda_gemm *g, void **p, size_t *cap, size_t bytes, const char *what,
                pg_error *err)
{
    if (*cap >= bytes)
        return 0;
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    cudaError_t e = cudaStreamIsCapturing(g->stream, &cs);
    if (e != cudaSuccess || cs != cudaStreamCaptureStatusNone) {
        (void)cudaGetLastError();
        return pg_error_set(err, PG_EINVAL,
                            "gemm: %s padding buffer of %zu bytes (has %zu) while the stream is "
                            "captured into a CUDA graph: expected it grown by an uncaptured call of "
                            "this shape first", what, bytes, *cap);
    }
    if (*p) {
        e = cudaFree(*p); /* waits for the work that used it */
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            return pg_error_set(err, PG_EDEVICE, "gemm: freeing the %s padding buffer: %s: %s",
                                what, cudaGetErrorName(e), cudaGetErrorString(e));
        }
    }
    *p = NULL;
    *cap = 0;
    g->pad_generation++;
    e = cudaMalloc(p, bytes);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* not left for the next launch check to report */
        *p = NULL;
        return pg_error_set(err, PG_ENOMEM, "gemm: %s padding buffer of %zu bytes: %s: %s", what,
                            bytes, cudaGetErrorName(e), cudaGetErrorString(e));
    }
    *cap = bytes;
    e = cudaMemsetAsync(*p, 0, bytes, g->stream);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return pg_error_set(err, PG_EDEVICE, "gemm: %s padding buffer clear: %s: %s", what,
                            cudaGetErrorName(e), cudaGetErrorString(e));
    }
    return 0;
}

int cuda_gemm_xwt(cuda_gemm *g, void *y, int y_dt, const void *x, const void *w, int in_dt,
                  int32_t M, int32_t N, int32_t K, pg_error *err)
{
    return cuda_gemm_xwt_rows(g, y, M, y_dt, x, M, w, in_dt, M, N, K, err);
}

/* The product through cuBLAS (fixed-rows chunks, or one call). */
static int cublas_xwt(cuda_gemm *g, void *y, int64_t y_rows, int y_dt, const void *x,
                      int64_t x_rows, const void *w, int in_dt, int32_t M, int32_t N, int32_t K,
                      pg_error *err)
{
    const int32_t mc = g->fixed_rows;
    if (mc == 0)
        return gemm_call(g, y, y_dt, x, w, in_dt, M, N, K, err);
    const size_t xb = pgk_dtype_bytes(in_dt), yb = pgk_dtype_bytes(y_dt);
    /* the padding buffers grow on every call, full chunks or not, to the
     * largest K and N seen: a warm-up step whose M is a multiple of mc then
     * sizes them for every later partial chunk of these shapes, which a
     * CUDA graph capture must not allocate (grow refuses there) */
    int rc;
    if ((rc = grow(g, &g->x_pad, &g->x_pad_bytes, (size_t)mc * (size_t)K * xb, "input", err)) ||
        (rc = grow(g, &g->y_pad, &g->y_pad_bytes, (size_t)mc * (size_t)N * yb, "output", err)))
        return rc;
    for (int32_t m0 = 0; m0 < M; m0 += mc) {
        const int32_t rows = M - m0 < mc ? M - m0 : mc;
        const char *xs = (const char *)x + (size_t)m0 * (size_t)K * xb;
        char *ys = (char *)y + (size_t)m0 * (size_t)N * yb;
        /* a whole chunk, or a last one whose padded rows both buffers hold:
         * in place (the padding rows of x are read, whatever they hold, and
         * those of y overwritten; rows of a GEMM never mix) */
        if (rows == mc || ((int64_t)m0 + mc <= x_rows && (int64_t)m0 + mc <= y_rows)) {
            rc = gemm_call(g, ys, y_dt, xs, w, in_dt, mc, N, K, err);
            if (rc)
                return rc;
            continue;
        }
        /* the last, partial chunk: through [mc] row buffers (the padding
         * rows hold zeros or older rows; rows of a GEMM never mix) */
        size_t xbytes = (size_t)rows * (size_t)K * xb, ybytes = (size_t)rows * (size_t)N * yb;
        cudaError_t e = cudaMemcpyAsync(g->x_pad, xs, xbytes, cudaMemcpyDeviceToDevice, g->stream);
        g->copies++;
        if (e != cudaSuccess)
            return pg_error_set(err, PG_EDEVICE, "gemm: padding copy: %s: %s", cudaGetErrorName(e),
                                cudaGetErrorString(e));
        rc = gemm_call(g, g->y_pad, y_dt, g->x_pad, w, in_dt, mc, N, K, err);
        if (rc)
            return rc;
        e = cudaMemcpyAsync(ys, g->y_pad, ybytes, cudaMemcpyDeviceToDevice, g->stream);
        g->copies++;
        if (e != cudaSuccess)
            return pg_error_set(err, PG_EDEVICE, "gemm: result copy: %s: %s", cudaGetErrorName(e),
                                cudaGetErrorString(e));
    }
    return 0;
}

/* gemv.cu can take the shape: bf16 in, rows of 16-byte multiples. */
static int gemv_eligible(int in_dt, int32_t K)
{
    return in_dt == PGK_BF16 && K % 8 == 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int one_product(cuda_gemm *g, int gemv, void *y, int64_t y_rows, int y_dt, const void *x,
                       int64_t x_rows, const void *w, int in_dt, int32_t M, int32_t N, int32_t K,
                       pg_error *err)
{
    if (!gemv)
        return cublas_xwt(g, y, y_rows, y_dt, x, x_rows, w, in_dt, M, N, K, err);
    g->gemv_lk.err = err;
    return pgk_gemv(y, y_dt, x, w, M, N, K, &g->gemv_lk);
}

/* Seconds per product of the first m rows by one path (host clock around
 * synchronized repetitions; the stream is drained first). */
static int time_path(cuda_gemm *g, int gemv, double *sec, void *y, int64_t y_rows, int y_dt,
                     const void *x, int64_t x_rows, const void *w, int in_dt, int32_t m, int32_t N,
                     int32_t K, pg_error *err)
{
    enum { REPS = 5 };
    int rc = one_product(g, gemv, y, y_rows, y_dt, x, x_rows, w, in_dt, m, N, K, err); /* warm */
    if (rc)
        return rc;
    cudaError_t e = cudaStreamSynchronize(g->stream);
    const double t0 = now_s();
    for (int r = 0; !rc && e == cudaSuccess && r < REPS; r++)
        rc = one_product(g, gemv, y, y_rows, y_dt, x, x_rows, w, in_dt, m, N, K, err);
    if (!rc && e == cudaSuccess)
        e = cudaStreamSynchronize(g->stream);
    if (!rc && e != cudaSuccess) {
        (void)cudaGetLastError();
        rc = pg_error_set(err, PG_EDEVICE, "gemm: timing the product %d x %d x %d: %s: %s", (int)m,
                          (int)N, (int)K, cudaGetErrorName(e), cudaGetErrorString(e));
    }
    *sec = (now_s() - t0) / REPS;
    return rc;
}

/* Whether (N, K, y_dt) runs on gemv.cu: by the mode, and in AUTO by the
 * measurement of its first product (at min(M, 8) rows, both paths on this
 * call's own operands; gemv only when it is at least 1.25x faster, so that
 * noise does not flip a close call), fixed from then on. */
static int choose(cuda_gemm *g, int *gemv, void *y, int64_t y_rows, int y_dt, const void *x,
                  int64_t x_rows, const void *w, int in_dt, int32_t M, int32_t N, int32_t K,
                  pg_error *err)
{
    *gemv = 0;
    if (g->gemv_mode == CUDA_GEMM_GEMV_OFF || !gemv_eligible(in_dt, K))
        return 0;
    if (g->gemv_mode == CUDA_GEMM_GEMV_ON) {
        *gemv = 1;
        return 0;
    }
    for (int32_t i = 0; i < g->n_shapes; i++)
        if (g->shapes[i].N == N && g->shapes[i].K == K && g->shapes[i].y_dt == y_dt) {
            *gemv = g->shapes[i].gemv;
            return 0;
        }
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(g->stream, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone) {
        (void)cudaGetLastError();
        return pg_error_set(err, PG_EINVAL,
                            "gemm: the product %d x %d x %d is not chosen yet while the stream is "
                            "captured: expected an uncaptured product of this shape first (the "
                            "warm-up)", (int)M, (int)N, (int)K);
    }
    if (g->n_shapes == g->shapes_cap) {
        int32_t cap = g->shapes_cap ? 2 * g->shapes_cap : 16;
        struct gemm_shape *n = realloc(g->shapes, (size_t)cap * sizeof *n);
        if (!n)
            return pg_error_set(err, PG_ENOMEM, "gemm: out of host memory");
        g->shapes = n;
        g->shapes_cap = cap;
    }
    struct gemm_shape sh = {N, K, y_dt, 0, 0.0, 0.0};
    const int32_t m = M < 8 ? M : 8;
    int rc = time_path(g, 0, &sh.cublas_s, y, y_rows, y_dt, x, x_rows, w, in_dt, m, N, K, err);
    if (!rc)
        rc = time_path(g, 1, &sh.gemv_s, y, y_rows, y_dt, x, x_rows, w, in_dt, m, N, K, err);
    if (rc)
        return rc;
    sh.gemv = sh.gemv_s * 1.25 < sh.cublas_s;
    g->shapes[g->n_shapes++] = sh;
    *gemv = sh.gemv;
    return 0;
}

int cuda_gemm_xwt_rows(cuda_gemm *g, void *y, int64_t y_rows, int y_dt, const void *x,
                       int64_t x_rows, const void *w, int in_dt, int32_t M, int32_t N, int32_t K,
                       pg_error *err)
{
    if (M < 1 || N < 1 || K < 1)
        return pg_error_set(err, PG_EINVAL, "gemm: expected M, N, K >= 1, got %d, %d, %d",
                            (int)M, (int)N, (int)K);
    if ((in_dt != PGK_BF16 && in_dt != PGK_F32) || (y_dt != in_dt && y_dt != PGK_F32))
        return pg_error_set(err, PG_EINVAL,
                            "gemm: dtypes in %s, out %s: expected bf16->bf16, bf16->f32 or f32->f32",
                            pgk_dtype_name(in_dt), pgk_dtype_name(y_dt));
    int gemv = 0;
    int rc = choose(g, &gemv, y, y_rows, y_dt, x, x_rows, w, in_dt, M, N, K, err);
    if (rc)
        return rc;
    return one_product(g, gemv, y, y_rows, y_dt, x, x_rows, w, in_dt, M, N, K, err);
}
