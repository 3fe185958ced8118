/* ops_executors: see ops_executors.h. */
#include "ops_executors.h"

#include "cpu_executor.h"
#include "cpu_gemm.h"

static int ops_create_cpu(executor **out, pg_error *err)
{
    cpu_executor_params p = {.threads = 0};
    return cpu_executor_create(out, &p, err);
}

/* The CPU executor with a GEMM variant other than the best one this machine
 * runs (cpu_gemm.h): every variant must give the same bits, which
 * test_invariance checks against "cpu". The best one is "cpu" itself, so
 * it is not repeated; one the CPU cannot run is a SKIP. */
static int ops_create_cpu_variant(executor **out, cpu_gemm_variant v, pg_error *err)
{
    if (v == cpu_gemm_variant_best())
        return pg_error_set(err, PG_EUNSUPPORTED, "gemm variant %s is the default here (executor \"cpu\")",
                            cpu_gemm_variant_name(v));
    if (!cpu_gemm_variant_available(v))
        return pg_error_set(err, PG_EUNSUPPORTED, "this CPU does not run gemm variant %s", cpu_gemm_variant_name(v));
    cpu_executor_params p = {.threads = 0, .gemm_variant = (int32_t)v};
    return cpu_executor_create(out, &p, err);
}

static int ops_create_cpu_avx2(executor **out, pg_error *err)
{
    return ops_create_cpu_variant(out, CPU_GEMM_AVX2, err);
}

static int ops_create_cpu_generic(executor **out, pg_error *err)
{
    return ops_create_cpu_variant(out, CPU_GEMM_GENERIC, err);
}

#ifdef PG_HAVE_CUDA
/* The CUDA executor (gpu/): its create function goes here; return
 * PG_EUNSUPPORTED when no device is present so the cases print SKIP. */
#include "cuda_executor.h"

/* precision 0: bf16 activations, weights and KV (the default);
 * precision 1: f32 everywhere, checked to the f32 tolerance. */
static int ops_create_cuda_p(executor **out, int precision, pg_error *err)
{
    if (cuda_device_count() == 0)
        return pg_error_set(err, PG_EUNSUPPORTED, "no CUDA device");
    cuda_executor_params p = cuda_executor_params_default();
    p.precision = precision;
    return cuda_executor_create(out, &p, err);
}

static int ops_create_cuda(executor **out, pg_error *err)
{
    return ops_create_cuda_p(out, 0, err);
}

static int ops_create_cuda_f32(executor **out, pg_error *err)
{
    return ops_create_cuda_p(out, 1, err);
}
#endif

static const ops_executor_entry ops_entries[] = {
    {"cpu", ops_create_cpu},
    {"cpu-avx2", ops_create_cpu_avx2},
    {"cpu-generic", ops_create_cpu_generic},
#ifdef PG_HAVE_CUDA
    {"cuda", ops_create_cuda},
    {"cuda-f32", ops_create_cuda_f32},
#endif
};

int32_t ops_executor_count(void)
{
    return (int32_t)(sizeof ops_entries / sizeof ops_entries[0]);
}

const ops_executor_entry *ops_executor_get(int32_t i)
{
    return (i >= 0 && i < ops_executor_count()) ? &ops_entries[i] : NULL;
}

double ops_executor_tolerance(const executor *ex)
{
    return ex->act_bytes >= 4 ? 1e-5 : 2e-2;
}
