/* emu_memory: device and pinned host allocations. Both are ordinary heap
 * blocks of their exact size (posix_memalign, 256-byte aligned like
 * cudaMalloc), so AddressSanitizer reports a kernel or a copy that runs past
 * one; a registry (start -> size, kind) answers "which allocation is this
 * pointer in" for the launch and copy checks. Device memory is limited to
 * the fake device's size (cudaMemGetInfo). Single-threaded: the runtime is
 * called from one host thread. */
#include "emu_internal.h"

#include <stdlib.h>

#include <map>

namespace emu {

static std::map<uintptr_t, allocation> &registry()
{
    static std::map<uintptr_t, allocation> *r = new std::map<uintptr_t, allocation>();
    return *r;
}

static size_t g_device_in_use;
static uint64_t g_serial;

const allocation *mem_find(const void *p)
{
    auto &r = registry();
    uintptr_t u = (uintptr_t)p;
    auto it = r.upper_bound(u);
    if (it == r.begin())
        return nullptr;
    --it;
    const allocation &a = it->second;
    size_t span = a.bytes ? a.bytes : 1;
    return u - it->first < span ? &a : nullptr;
}

bool mem_range_is(const void *p, size_t bytes, mem_kind kind)
{
    const allocation *a = mem_find(p);
    if (!a || a->kind != kind)
        return false;
    return (size_t)((const unsigned char *)p - a->base) + bytes <= a->bytes;
}

void *mem_alloc(size_t bytes, mem_kind kind)
{
    if (kind == MEM_DEVICE && bytes > device_total_bytes() - g_device_in_use)
        return nullptr;
    void *p = nullptr;
    if (posix_memalign(&p, 256, bytes ? bytes : 1) != 0)
        return nullptr;
    registry()[(uintptr_t)p] = allocation{(unsigned char *)p, bytes, kind, ++g_serial};
    if (kind == MEM_DEVICE)
        g_device_in_use += bytes;
    return p;
}

bool mem_free(void *p, mem_kind kind)
{
    auto &r = registry();
    auto it = r.find((uintptr_t)p);
    if (it == r.end() || it->second.kind != kind)
        return false;
    if (kind == MEM_DEVICE)
        g_device_in_use -= it->second.bytes;
    r.erase(it);
    free(p);
    return true;
}

size_t mem_device_in_use()
{
    return g_device_in_use;
}

} // namespace emu
