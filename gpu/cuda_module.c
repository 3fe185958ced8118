/* cuda_module: the table of the CUDA executor's entry points (see
 * cuda_module.h), the only symbol the shared module exports. */
#include "cuda_module.h"

#ifndef PG_CUDA_MODULE_VERSION
#define PG_CUDA_MODULE_VERSION "unknown"
#endif
#ifdef PG_CUDA_EMU
#define PG_CUDA_MODULE_FLAVOR "cuda-emu"
#else
#define PG_CUDA_MODULE_FLAVOR "cuda"
#endif

static const cuda_module module_table = {
    .abi = CUDA_MODULE_ABI,
    .table_bytes = (uint32_t)sizeof(cuda_module),
    .executor_bytes = (uint32_t)sizeof(executor),
    .executor_ops_bytes = (uint32_t)sizeof(executor_ops),
    .params_bytes = (uint32_t)sizeof(cuda_executor_params),
    .error_bytes = (uint32_t)sizeof(pg_error),
    .version = PG_CUDA_MODULE_VERSION,
    .flavor = PG_CUDA_MODULE_FLAVOR,
    .device_count = cuda_device_count,
    .executor_params_default = cuda_executor_params_default,
    .executor_create = cuda_executor_create,
    .executor_set_graphs = cuda_executor_set_graphs,
    .executor_graph_stats = cuda_executor_graph_stats,
    .executor_launch_counts = cuda_executor_launch_counts,
};

__attribute__((visibility("default"))) const cuda_module *cuda_module_v1(uint32_t abi)
{
    return abi == CUDA_MODULE_ABI ? &module_table : NULL;
}
