/* cuda_runtime.h of the CUDA emulator: the runtime API plus, in C++, the
 * device-side language subset (emu_device.h) that the .cu files of gpu/ use
 * once tests/cuda_emu/emu_rewrite.py has turned their launches and shared
 * declarations into calls. */
#ifndef EMU_CUDA_RUNTIME_H
#define EMU_CUDA_RUNTIME_H

#include "cuda_runtime_api.h"

#ifdef __cplusplus
#include "../emu_device.h"
#endif

#endif
