/* ops_executors: see ops_executors.h. */
#include "ops_executors.h"

#include "cpu_executor.h"

static int ops_create_cpu(executor **out, pg_error *err)
{
    cpu_executor_params p = {.threads = 0};
    return cpu_executor_create(out, &p, err);
}

#ifdef PG_HAVE_CUDA
/* The CUDA executor (gpu/): its create function goes here; return
 * PG_EUNSUPPORTED when no device is present so the cases print SKIP. */
#endif

static const ops_executor_entry ops_entries[] = {
    {"cpu", ops_create_cpu},
#ifdef PG_HAVE_CUDA
    /* {"cuda", ops_create_cuda}, */
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
