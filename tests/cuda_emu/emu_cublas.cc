/* emu_cublas: cublasGemmEx on the host, column-major as cuBLAS defines it:
 *   C[i + j*ldc] = alpha * sum_l opA(i, l) * opB(l, j) + beta * C[i + j*ldc]
 *   opA(i, l) = A[i + l*lda] (OP_N) or A[l + i*lda] (OP_T), opB alike.
 * Checked like cuBLAS (CUBLAS_STATUS_INVALID_VALUE): m, n, k >= 0,
 * lda >= max(1, rows of A as stored), ldb likewise, ldc >= max(1, m), a
 * type combination cuBLAS supports for CUBLAS_COMPUTE_32F (bf16 or f32
 * inputs, f32 or the input type out), a stream and a workspace set. Every
 * matrix, as addressed through its leading dimension, must lie inside one
 * device allocation (an emulator error: on a device, an illegal address).
 * C is not read when beta == 0 (cuBLAS: C need not be initialized then).
 *
 * Arithmetic: f32 products accumulated in f32 in a fixed order (8
 * interleaved partial sums), then alpha/beta, then rounded once (RNE) to
 * C's type. cuBLAS's
 * real kernels sum in another order (tiles, split-K) and may differ in the
 * last bits: the emulation checks the call, the layout and the data flow,
 * not cuBLAS's choice of kernel (README.md). The work runs on the handle's
 * stream, queued like a kernel. */
#include "emu_internal.h"

#include <math.h>
#include <stdlib.h>

#include "include/cublas_v2.h"

struct emu_cublas {
    cudaStream_t st;
    void *workspace;
    size_t workspace_bytes;
    int math;
};

namespace emu {

static size_t type_bytes(cudaDataType t)
{
    return t == CUDA_R_32F ? 4 : (t == CUDA_R_16BF || t == CUDA_R_16F) ? 2 : 0;
}

static float load(const void *p, cudaDataType t, size_t i)
{
    if (t == CUDA_R_32F)
        return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    return t == CUDA_R_16BF ? bf16_to_f32(h) : f16_to_f32(h);
}

static void store(void *p, cudaDataType t, size_t i, float v)
{
    if (t == CUDA_R_32F)
        ((float *)p)[i] = v;
    else
        ((uint16_t *)p)[i] = t == CUDA_R_16BF ? f32_to_bf16_rn(v) : f32_to_f16_rn(v);
}

/* f32 dot product in a fixed order: 8 interleaved partial sums (lane q
 * takes l = q, q + 8, ...), added 0..7 in order, then the tail. */
static float dot(const float *x, const float *y, int k)
{
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int l = 0;
    for (; l + 8 <= k; l += 8)
        for (int q = 0; q < 8; q++)
            acc[q] += x[l + q] * y[l + q];
    float s = 0.0f;
    for (int q = 0; q < 8; q++)
        s += acc[q];
    for (; l < k; l++)
        s += x[l] * y[l];
    return s;
}

/* [p, p + the bytes a rows x cols column-major matrix with leading dim ld
 * spans) inside one device allocation */
static bool matrix_in_device(const void *p, cudaDataType t, int rows, int cols, int ld)
{
    if (rows == 0 || cols == 0)
        return true;
    size_t elems = (size_t)(cols - 1) * (size_t)ld + (size_t)rows;
    return mem_range_is(p, elems * type_bytes(t), MEM_DEVICE);
}

} // namespace emu

using namespace emu;

extern "C" {

cublasStatus_t cublasCreate(cublasHandle_t *handle)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        (void)cudaGetLastError();
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
    *handle = new emu_cublas();
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle)
{
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    flush(handle->st);
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t st)
{
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->st = st;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void *workspace, size_t bytes)
{
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (bytes && !mem_range_is(workspace, bytes, MEM_DEVICE))
        return CUBLAS_STATUS_INVALID_VALUE;
    if ((uintptr_t)workspace % 256u != 0)
        return CUBLAS_STATUS_INVALID_VALUE; /* cuBLAS: 256-byte aligned */
    handle->workspace = workspace;
    handle->workspace_bytes = bytes;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode)
{
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->math = (int)mode;
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasGetStatusName(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}

const char *cublasGetStatusString(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    default: return "emulated cuBLAS error";
    }
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void *alpha,
                            const void *A, cudaDataType Atype, int lda, const void *B,
                            cudaDataType Btype, int ldb, const void *beta, void *C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t algo)
{
    (void)algo;
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    const int a_rows = transa == CUBLAS_OP_N ? m : k, a_cols = transa == CUBLAS_OP_N ? k : m;
    const int b_rows = transb == CUBLAS_OP_N ? k : n, b_cols = transb == CUBLAS_OP_N ? n : k;
    if (m < 0 || n < 0 || k < 0 || (transa != CUBLAS_OP_N && transa != CUBLAS_OP_T) ||
        (transb != CUBLAS_OP_N && transb != CUBLAS_OP_T) || lda < (a_rows > 1 ? a_rows : 1) ||
        ldb < (b_rows > 1 ? b_rows : 1) || ldc < (m > 1 ? m : 1) || !alpha || !beta)
        return CUBLAS_STATUS_INVALID_VALUE;
    const bool in_ok = (Atype == CUDA_R_16BF || Atype == CUDA_R_32F || Atype == CUDA_R_16F) &&
                       Btype == Atype;
    const bool out_ok = Ctype == Atype || Ctype == CUDA_R_32F;
    if (!in_ok || !out_ok || (computeType != CUBLAS_COMPUTE_32F && computeType != CUBLAS_COMPUTE_32F_PEDANTIC))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (!handle->workspace && capturing(handle->st)) {
        /* without a workspace cuBLAS allocates one on first use: not
         * capturable (cuBLAS docs, "CUDA Graphs support") */
        capture_violation(handle->st, "cublasGemmEx without a workspace (cublasSetWorkspace)");
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
    if (!handle->workspace) {
        fatal("cublasGemmEx: no workspace set (cublasSetWorkspace): results would depend on "
              "cuBLAS's internal allocation");
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
    if (!matrix_in_device(A, Atype, a_rows, a_cols, lda) || !matrix_in_device(B, Btype, b_rows, b_cols, ldb) ||
        !matrix_in_device(C, Ctype, m, n, ldc)) {
        fatal("cublasGemmEx(m %d, n %d, k %d, lda %d, ldb %d, ldc %d): a matrix leaves its device "
              "allocation (A %p, B %p, C %p)", m, n, k, lda, ldb, ldc, A, B, C);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    const float al = *(const float *)alpha, be = *(const float *)beta;
    const size_t a_si = transa == CUBLAS_OP_N ? 1 : (size_t)lda, a_sl = transa == CUBLAS_OP_N ? (size_t)lda : 1;
    const size_t b_sl = transb == CUBLAS_OP_N ? 1 : (size_t)ldb, b_sj = transb == CUBLAS_OP_N ? (size_t)ldb : 1;
    cudaError_t e = enqueue(handle->st, [=]() {
        return std::function<void()>([=]() {
            /* op(A) as rows [m][k] and op(B) as columns [n][k], in f32
             * (buffers kept between calls) */
            static std::vector<float> abuf, bbuf;
            if (abuf.size() < (size_t)m * (size_t)k)
                abuf.resize((size_t)m * (size_t)k);
            if (bbuf.size() < (size_t)n * (size_t)k)
                bbuf.resize((size_t)n * (size_t)k);
            float *a = abuf.data(), *b = bbuf.data();
            for (int i = 0; i < m; i++)
                for (int l = 0; l < k; l++)
                    a[(size_t)i * (size_t)k + (size_t)l] = load(A, Atype, (size_t)i * a_si + (size_t)l * a_sl);
            for (int j = 0; j < n; j++)
                for (int l = 0; l < k; l++)
                    b[(size_t)j * (size_t)k + (size_t)l] = load(B, Btype, (size_t)l * b_sl + (size_t)j * b_sj);
            for (int j = 0; j < n; j++)
                for (int i = 0; i < m; i++) {
                    float acc = dot(&a[(size_t)i * (size_t)k], &b[(size_t)j * (size_t)k], k);
                    size_t c = (size_t)i + (size_t)j * (size_t)ldc;
                    float v = al * acc;
                    if (be != 0.0f)
                        v += be * load(C, Ctype, c);
                    store(C, Ctype, c, v);
                }
        });
    }, "cublasGemmEx", {A, B, C, handle->workspace});
    return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

} // extern "C"
