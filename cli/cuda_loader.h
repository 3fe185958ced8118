/* cuda_loader: finds, loads and checks the CUDA module (gpu/cuda_module.h)
 * at run time, so that the pagedgen binary links no CUDA library and a run
 * on the cpu never maps one (ARCHITECTURE.md, "CUDA only when used").
 *
 * Where the module is looked for, in order:
 *   1. $PAGEDGEN_CUDA_MODULE, a path to the .so (when set, the only place:
 *      e.g. tests/cuda_emu's emulated module);
 *   2. beside the executable (the directory of /proc/self/exe): the build
 *      tree, build/libpagedgen-cuda.so next to build/pagedgen;
 *   3. the install layout, <exe dir>/CLI_CUDA_MODULE_REL/libpagedgen-cuda.so
 *      (meson: ../<libdir>/pagedgen).
 * The module stays loaded for the life of the process (executors it created
 * point into it); loading it again returns the same table.
 */
#ifndef PG_CLI_CUDA_LOADER_H
#define PG_CLI_CUDA_LOADER_H

#include "cuda_module.h"
#include "pg_error.h"

#define CLI_CUDA_MODULE_ENV "PAGEDGEN_CUDA_MODULE"

/* Loads the module: *out is its table (borrowed, valid for the process).
 * PG_EUNSUPPORTED with every path tried and dlopen's reason when it cannot
 * be found or loaded (the CUDA libraries it needs missing included);
 * PG_EFORMAT when it is not a pagedgen CUDA module of this build (entry,
 * abi, version or struct sizes differ). */
int cli_cuda_load(const cuda_module **out, pg_error *err);

/* CUDA devices the driver reports, for --device auto, without loading the
 * module nor cuBLAS: dlopen("libcuda.so.1"), cuInit(0), cuDeviceGetCount.
 * 0 when there is no driver (no libcuda.so.1: a machine without an NVIDIA
 * driver returns at once), no device, or any call fails. */
int cli_cuda_driver_device_count(void);

#endif /* PG_CLI_CUDA_LOADER_H */
