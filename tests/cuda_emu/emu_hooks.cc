/* emu_hooks: C entry points into the emulator for its tests (test_emu.c). */
#include "emu_internal.h"

#include <string.h>

extern "C" {
#include "emu_hooks.h"
}

extern "C" long emu_error_count(void)
{
    return emu::error_count();
}

extern "C" long emu_blocks_launched(const char *kernel)
{
    return emu::blocks_launched(kernel);
}

extern "C" uint16_t emu_test_f32_to_bf16(float f)
{
    return emu::f32_to_bf16_rn(f);
}

extern "C" uint16_t emu_test_f32_to_f16(float f)
{
    return emu::f32_to_f16_rn(f);
}

extern "C" float emu_test_bf16_to_f32(uint16_t h)
{
    return emu::bf16_to_f32(h);
}

extern "C" float emu_test_f16_to_f32(uint16_t h)
{
    return emu::f16_to_f32(h);
}
