/* cuda_bf16.h of the CUDA emulator: __nv_bfloat16 and its intrinsics (emu_half.h). */
#ifndef EMU_CUDA_BF16_H
#define EMU_CUDA_BF16_H
#include "../emu_device.h"
#endif
