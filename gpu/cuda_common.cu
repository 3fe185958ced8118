/* cuda_common: dtype names and the launch check (and count) shared by every
 * launcher. */
#include "cuda_common.cuh"

extern "C" size_t pgk_dtype_bytes(int dt)
{
    switch (dt) {
    case PGK_BF16: return 2;
    case PGK_F16: return 2;
    case PGK_F32: return 4;
    default: return 0;
    }
}

extern "C" const char *pgk_dtype_name(int dt)
{
    switch (dt) {
    case PGK_BF16: return "bf16";
    case PGK_F16: return "f16";
    case PGK_F32: return "f32";
    default: return "?";
    }
}

extern "C" int pgk_check_stream(const char *what, pgk_launch *lk)
{
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return pg_error_set(lk->err, PG_EDEVICE, "%s: launch failed: %s: %s", what,
                            cudaGetErrorName(e), cudaGetErrorString(e));
    if (lk->sync_each) {
        e = cudaStreamSynchronize(lk->st);
        if (e != cudaSuccess)
            return pg_error_set(lk->err, PG_EDEVICE, "%s: kernel failed (PAGEDGEN_CUDA_SYNC): %s: %s",
                                what, cudaGetErrorName(e), cudaGetErrorString(e));
    }
    return 0;
}

extern "C" int pgk_check_launch(const char *kernel, pgk_launch *lk)
{
    lk->kernels++;
    return pgk_check_stream(kernel, lk);
}
