/* cuda_common: dtype names and the launch check shared by every launcher. */
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

/* Launch checks so far (pgk_launches): the process's one counter, as the
 * process has one device and one executor (cuda_executor.h); read as a
 * difference around a forward (--profile-steps). */
static unsigned long long launch_count;

extern "C" uint64_t pgk_launches(void)
{
    return (uint64_t)__atomic_load_n(&launch_count, __ATOMIC_RELAXED);
}

extern "C" void pgk_count_launches(unsigned n)
{
    __atomic_fetch_add(&launch_count, (unsigned long long)n, __ATOMIC_RELAXED);
}

extern "C" int pgk_check_launch(const char *kernel, cudaStream_t st, int sync_each, pg_error *err)
{
    pgk_count_launches(1);
    return pgk_check_error(kernel, st, sync_each, err);
}

extern "C" int pgk_check_error(const char *kernel, cudaStream_t st, int sync_each, pg_error *err)
{
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return pg_error_set(err, PG_EDEVICE, "%s: launch failed: %s: %s", kernel,
                            cudaGetErrorName(e), cudaGetErrorString(e));
    if (sync_each) {
        e = cudaStreamSynchronize(st);
        if (e != cudaSuccess)
            return pg_error_set(err, PG_EDEVICE, "%s: kernel failed (PAGEDGEN_CUDA_SYNC): %s: %s",
                                kernel, cudaGetErrorName(e), cudaGetErrorString(e));
    }
    return 0;
}
