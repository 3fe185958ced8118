/* cuda_fp16.h of the CUDA emulator: __half and its intrinsics (emu_half.h). */
#ifndef EMU_CUDA_FP16_H
#define EMU_CUDA_FP16_H
#include "../emu_device.h"
#endif
