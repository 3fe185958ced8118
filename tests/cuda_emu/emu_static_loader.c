/* emu_static_loader: cli/cuda_loader.h for a test that links the emulated
 * executor and gpu/cuda_module.c statically (test_cli_device_emu): the
 * module's table without dlopen. The process-level tests load the real
 * module through cli/cuda_loader.c (test_cli_emu.py). */
#include "cuda_loader.h"

int cli_cuda_load(const cuda_module **out, pg_error *err)
{
    *out = cuda_module_v1(CUDA_MODULE_ABI);
    if (!*out)
        return pg_error_set(err, PG_EFORMAT, "emu_static_loader: expected abi %u, refused", CUDA_MODULE_ABI);
    return PG_OK;
}

int cli_cuda_driver_device_count(void)
{
    return cuda_module_v1(CUDA_MODULE_ABI)->device_count();
}
