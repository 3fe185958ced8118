/* emu_runtime: the cudart API on the host — the fake device, memory,
 * copies, errors. Streams, events and graphs are in emu_stream.cc.
 *
 * The fake device: one GPU (EMU_DEVICE_COUNT=0 pretends there is none;
 * EMU_DEVICE_COUNT=N reports N identical devices, 0 .. N-1, all backed by
 * this process's one emulated memory: cudaSetDevice only selects the
 * ordinal cudaGetDevice returns, which is enough for pagedgen's one
 * device per process, --device cuda:0,1 forks a worker per device),
 * "cuda-emu (sm_80 subset)", EMU_DEVICE_MEM_MIB MiB (default 4096) of
 * memory of which 300 MiB are taken by the "context", 48 KiB of shared
 * memory per block by default and 99 KiB with the opt-in.
 *
 * Copies check what a device would fault on or silently get wrong:
 *   - the device side of a copy or memset must lie inside one cudaMalloc
 *     allocation (else cudaErrorInvalidValue), the host side must not be
 *     device memory;
 *   - host -> device from pinned memory reads the source when the stream
 *     runs the copy: the source is snapshotted at the call and a difference
 *     at run time is an emulator error ("modified before its copy
 *     completed");
 *   - host -> device from pageable memory is staged at the call (CUDA does
 *     the same), so the caller may reuse it at once;
 *   - device -> pinned host: the destination is filled with 0xff (NaN) at
 *     the call and written when the stream runs, so reading it before a
 *     synchronization reads NaN (not when a queued copy still reads that
 *     memory as its source: stream order makes that reuse legal);
 *   - device -> pageable host: CUDA returns only after the copy, so the
 *     stream is flushed and the copy done before returning. */
#include "emu_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <memory>
#include <vector>

namespace emu {

static cudaError_t g_last = cudaSuccess;

void set_last_error(cudaError_t e)
{
    g_last = e;
}

static int device_count()
{
    const char *v = getenv("EMU_DEVICE_COUNT");
    if (!v || !*v)
        return 1;
    long n = strtol(v, nullptr, 10);
    return n < 0 ? 0 : n > 64 ? 64 : (int)n;
}

static int g_device; /* cudaSetDevice's ordinal (process state, as the driver's current device) */

size_t device_total_bytes()
{
    const char *v = getenv("EMU_DEVICE_MEM_MIB");
    size_t mib = v && *v ? (size_t)strtoull(v, nullptr, 10) : 4096u;
    return mib << 20;
}

static const size_t CONTEXT_BYTES = (size_t)300 << 20;

static cudaError_t ret(cudaError_t e)
{
    if (e != cudaSuccess)
        g_last = e;
    return e;
}

} // namespace emu

using namespace emu;

extern "C" {

const char *cudaGetErrorName(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError: return "cudaErrorInitializationError";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorDevicesUnavailable: return "cudaErrorDevicesUnavailable";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorLaunchOutOfResources: return "cudaErrorLaunchOutOfResources";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureUnmatched: return "cudaErrorStreamCaptureUnmatched";
    case cudaErrorStreamCaptureImplicit: return "cudaErrorStreamCaptureImplicit";
    case cudaErrorUnknown: return "cudaErrorUnknown";
    }
    return "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorDevicesUnavailable: return "CUDA-capable device(s) is/are busy or unavailable";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    default: return "emulated CUDA error";
    }
}

cudaError_t cudaGetLastError(void)
{
    cudaError_t e = g_last;
    g_last = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void)
{
    return g_last;
}

cudaError_t cudaGetDeviceCount(int *count)
{
    *count = device_count();
    return *count ? cudaSuccess : ret(cudaErrorNoDevice);
}

cudaError_t cudaSetDevice(int device)
{
    if (device < 0 || device >= device_count())
        return ret(cudaErrorInvalidDevice);
    /* test hook: EMU_FAIL_DEVICE=K makes device K unusable (the CLI's
     * multi-device tests: one worker fails, the others go on) */
    const char *fail = getenv("EMU_FAIL_DEVICE");
    if (fail && *fail && atoi(fail) == device)
        return ret(cudaErrorDevicesUnavailable);
    g_device = device;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device)
{
    *device = g_device;
    return device_count() ? cudaSuccess : ret(cudaErrorNoDevice);
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int device)
{
    if (device < 0 || device >= device_count())
        return ret(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "cuda-emu (sm_80 subset, host emulation)");
    p->totalGlobalMem = device_total_bytes();
    p->sharedMemPerBlock = DEFAULT_SMEM_BYTES;
    p->sharedMemPerBlockOptin = OPTIN_SMEM_BYTES;
    p->regsPerBlock = 65536;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = 1024;
    p->maxThreadsDim[1] = 1024;
    p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 0x7fffffff;
    p->maxGridSize[1] = 65535;
    p->maxGridSize[2] = 65535;
    p->major = 8;
    p->minor = 0;
    p->multiProcessorCount = 8;
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes)
{
    size_t total = device_total_bytes(), used = CONTEXT_BYTES + mem_device_in_use();
    *total_bytes = total;
    *free_bytes = used < total ? total - used : 0;
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t bytes)
{
    cudaError_t e = capture_violation(nullptr, "cudaMalloc");
    if (e != cudaSuccess)
        return ret(e);
    size_t f, t;
    cudaMemGetInfo(&f, &t);
    *p = bytes <= f ? mem_alloc(bytes, MEM_DEVICE) : nullptr;
    return *p ? cudaSuccess : ret(cudaErrorMemoryAllocation);
}

cudaError_t cudaFree(void *p)
{
    if (!p)
        return cudaSuccess;
    cudaError_t e = capture_violation(nullptr, "cudaFree");
    if (e != cudaSuccess)
        return ret(e);
    flush_all(); /* cudaFree synchronizes the device */
    return mem_free(p, MEM_DEVICE) ? cudaSuccess : ret(cudaErrorInvalidValue);
}

cudaError_t cudaMallocHost(void **p, size_t bytes)
{
    cudaError_t e = capture_violation(nullptr, "cudaMallocHost");
    if (e != cudaSuccess)
        return ret(e);
    *p = mem_alloc(bytes, MEM_PINNED);
    return *p ? cudaSuccess : ret(cudaErrorMemoryAllocation);
}

cudaError_t cudaFreeHost(void *p)
{
    if (!p)
        return cudaSuccess;
    cudaError_t e = capture_violation(nullptr, "cudaFreeHost");
    if (e != cudaSuccess)
        return ret(e);
    flush_all();
    return mem_free(p, MEM_PINNED) ? cudaSuccess : ret(cudaErrorInvalidValue);
}

/* Pinned ranges that queued host -> device copies will still read. */
struct pending_read {
    const unsigned char *p;
    size_t bytes;
    std::shared_ptr<bool> done;
};
static std::vector<pending_read> g_pending;

static bool pending_overlap(const unsigned char *p, size_t bytes)
{
    bool hit = false;
    for (size_t i = 0; i < g_pending.size();) {
        if (*g_pending[i].done) {
            g_pending.erase(g_pending.begin() + (long)i);
            continue;
        }
        hit = hit || (p < g_pending[i].p + g_pending[i].bytes && g_pending[i].p < p + bytes);
        i++;
    }
    return hit;
}

static bool is_device(const void *p)
{
    const allocation *a = mem_find(p);
    return a && a->kind == MEM_DEVICE;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t st)
{
    if (bytes == 0)
        return cudaSuccess;
    if (kind == cudaMemcpyDefault)
        kind = is_device(dst) ? (is_device(src) ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                              : (is_device(src) ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
    const bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    const bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if ((dst_dev ? !mem_range_is(dst, bytes, MEM_DEVICE) : is_device(dst)) ||
        (src_dev ? !mem_range_is(src, bytes, MEM_DEVICE) : is_device(src))) {
        fprintf(stderr, "cuda-emu: cudaMemcpyAsync(%p, %p, %zu, kind %d): a pointer is not where "
                "the kind says or the range leaves its allocation\n", dst, src, bytes, (int)kind);
        return ret(cudaErrorInvalidValue);
    }
    unsigned char *d = (unsigned char *)dst;
    const unsigned char *s = (const unsigned char *)src;
    const bool pinned_src = !src_dev && mem_range_is(src, bytes, MEM_PINNED);
    const bool pinned_dst = !dst_dev && mem_range_is(dst, bytes, MEM_PINNED);
    if (src_dev && !dst_dev && !pinned_dst) {
        /* device -> pageable: returns after the copy */
        cudaError_t e = capture_violation(st, "cudaMemcpyAsync to pageable memory");
        if (e != cudaSuccess)
            return ret(e);
        flush(st);
        memcpy(d, s, bytes);
        return cudaSuccess;
    }
    if (!src_dev && !pinned_src) {
        /* pageable -> device: staged now */
        cudaError_t e = capture_violation(st, "cudaMemcpyAsync from pageable memory");
        if (e != cudaSuccess)
            return ret(e);
        auto stage = std::make_shared<std::vector<unsigned char>>(s, s + bytes);
        return enqueue(st, [d, stage]() {
            return std::function<void()>([d, stage]() { memcpy(d, stage->data(), stage->size()); });
        }, "cudaMemcpyAsync", {d});
    }
    if (pinned_src) {
        return enqueue(st, [d, s, bytes]() {
            auto snap = std::make_shared<std::vector<unsigned char>>(s, s + bytes);
            auto done = std::make_shared<bool>(false);
            g_pending.push_back(pending_read{s, bytes, done});
            return std::function<void()>([d, s, bytes, snap, done]() {
                *done = true;
                if (memcmp(s, snap->data(), bytes) != 0) {
                    size_t k = 0;
                    while (s[k] == (*snap)[k])
                        k++;
                    fatal("pinned host buffer %p (%zu bytes) was modified at byte %zu after "
                          "cudaMemcpyAsync queued its copy to the device and before the copy ran "
                          "(reused without waiting for the copy)", (const void *)s, bytes, k);
                }
                memcpy(d, s, bytes);
            });
        }, "cudaMemcpyAsync (pinned -> device)", {d, s});
    }
    if (pinned_dst) {
        return enqueue(st, [d, s, bytes]() {
            if (!pending_overlap(d, bytes))
                memset(d, 0xff, bytes); /* not there until the stream ran the copy */
            return std::function<void()>([d, s, bytes]() { memcpy(d, s, bytes); });
        }, "cudaMemcpyAsync (device -> pinned)", {s, d});
    }
    return enqueue(st, [d, s, bytes]() {
        return std::function<void()>([d, s, bytes]() { memmove(d, s, bytes); });
    }, "cudaMemcpyAsync (device -> device)", {d, s});
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind)
{
    cudaError_t e = capture_violation(nullptr, "cudaMemcpy");
    if (e != cudaSuccess)
        return ret(e);
    e = cudaMemcpyAsync(dst, src, bytes, kind, nullptr);
    if (e == cudaSuccess)
        flush(nullptr);
    return e;
}

cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t st)
{
    if (bytes == 0)
        return cudaSuccess;
    if (!mem_range_is(p, bytes, MEM_DEVICE)) {
        fprintf(stderr, "cuda-emu: cudaMemsetAsync(%p, %zu): not inside one device allocation\n",
                p, bytes);
        return ret(cudaErrorInvalidValue);
    }
    unsigned char *d = (unsigned char *)p;
    return enqueue(st, [d, value, bytes]() {
        return std::function<void()>([d, value, bytes]() { memset(d, value, bytes); });
    }, "cudaMemsetAsync", {d});
}

cudaError_t cudaMemset(void *p, int value, size_t bytes)
{
    cudaError_t e = cudaMemsetAsync(p, value, bytes, nullptr);
    if (e == cudaSuccess)
        flush(nullptr);
    return e;
}

cudaError_t cudaFuncSetAttribute(const void *func, cudaFuncAttribute attr, int value)
{
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize)
        return ret(set_max_dynamic_smem(func, value));
    return cudaSuccess;
}

} // extern "C"
