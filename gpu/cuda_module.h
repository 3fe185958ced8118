/* cuda_module: the one entry point of gpu/ built as a shared module
 * (build/libpagedgen-cuda.so; the emulated twin
 * build/tests/cuda_emu/libpagedgen-cuda-emu.so). The pagedgen binary links
 * no CUDA library: cli/cuda_loader.c dlopen()s the module only when
 * --device cuda is asked for or --device auto found a device, looks up
 * CUDA_MODULE_ENTRY and calls it; everything the CLI needs from the CUDA
 * executor goes through the table it returns. The model is llama.cpp's
 * dynamically loaded ggml backends (GGML_BACKEND_DL: one .so per backend,
 * one exported ggml_backend_init()); the reason is in ARCHITECTURE.md.
 *
 * Plain C, no CUDA header: cli/ includes it. The module exports
 * CUDA_MODULE_ENTRY and nothing else (gpu/cuda_module.map).
 *
 * Compatibility: the binary and the module share core/executor.h's structs
 * and cuda_executor_params by layout, so the loader refuses a module whose
 * abi, version string or struct sizes differ from its own (a stale module
 * from another build) instead of calling into it. Bump CUDA_MODULE_ABI when
 * the table changes.
 */
#ifndef PG_CUDA_MODULE_H
#define PG_CUDA_MODULE_H

#include <stdint.h>

#include "cuda_executor.h"
#include "executor.h"
#include "pg_error.h"

#define CUDA_MODULE_ABI 1u
/* The exported symbol, a cuda_module_entry_fn; its name carries the abi. */
#define CUDA_MODULE_ENTRY "cuda_module_v1"
/* The module's file name (meson: shared_module('pagedgen-cuda')). */
#define CUDA_MODULE_FILE "libpagedgen-cuda.so"

typedef struct cuda_module {
    uint32_t abi;                /* CUDA_MODULE_ABI the module was built with */
    uint32_t table_bytes;        /* sizeof(cuda_module) in the module */
    uint32_t executor_bytes;     /* sizeof(executor) */
    uint32_t executor_ops_bytes; /* sizeof(executor_ops) */
    uint32_t params_bytes;       /* sizeof(cuda_executor_params) */
    uint32_t error_bytes;        /* sizeof(pg_error) */
    const char *version;         /* the project version it was built from (meson) */
    const char *flavor;          /* "cuda" (libcudart + cuBLAS) or "cuda-emu" (tests/cuda_emu) */
    /* The functions of cuda_executor.h, same contracts. */
    int (*device_count)(void);
    cuda_executor_params (*executor_params_default)(void);
    int (*executor_create)(executor **out, const cuda_executor_params *p, pg_error *err);
    int (*executor_set_graphs)(executor *ex, int32_t max_batch, int32_t max_seq_len, pg_error *err);
    void (*executor_graph_stats)(executor *ex, long *captures, long *replays);
    /* appended (the table's size is checked, so an older module is refused) */
    void (*executor_launch_counts)(executor *ex, cuda_launch_counts *total,
                                   cuda_launch_counts *last_step);
} cuda_module;

/* The entry: the table (static storage, valid while the module is loaded;
 * the loader never unloads it), or NULL when the caller's abi is not the
 * module's. */
typedef const cuda_module *(*cuda_module_entry_fn)(uint32_t abi);

const cuda_module *cuda_module_v1(uint32_t abi);

#endif /* PG_CUDA_MODULE_H */
