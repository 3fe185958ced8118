/* emu_hooks: C entry points into the CUDA emulator for tests (emu_hooks.cc):
 * what an emulated run did, and the emulator's own conversions. */
#ifndef EMU_HOOKS_H
#define EMU_HOOKS_H

#include <stdint.h>

/* Emulator-detected errors so far (non-zero only with EMU_ON_ERROR=count:
 * otherwise the first one ends the process). */
long emu_error_count(void);
/* Blocks executed so far by kernels whose name (as written at the launch,
 * without template arguments) is `kernel` (counted once per launch, not
 * once per thread order). */
long emu_blocks_launched(const char *kernel);
uint16_t emu_test_f32_to_bf16(float f);
uint16_t emu_test_f32_to_f16(float f);
float emu_test_bf16_to_f32(uint16_t h);
float emu_test_f16_to_f32(uint16_t h);

#endif
