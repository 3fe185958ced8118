/* emu_launch: kernel launches — CUDA's launch-time checks, then (when the
 * stream reaches the launch) the grid executed once per thread order with
 * the results compared bit for bit.
 *
 * Launch checks (failures are CUDA launch errors: nothing runs and
 * cudaGetLastError returns them, as on a device):
 *   block: 1 .. 1024 threads, x, y <= 1024, z <= 64; grid: x < 2^31,
 *   y, z <= 65535, none 0; threads <= the kernel's __launch_bounds__;
 *   dynamic shared memory <= 48 KiB, or <= the limit set with
 *   cudaFuncSetAttribute(MaxDynamicSharedMemorySize), itself <= 99 KiB
 *   (the opt-in limit of sm_86/sm_89, the smallest of gpu/'s targets).
 * Argument checks (emulator errors): every non-null pointer argument points
 * into device memory from cudaMalloc (not pinned or pageable host memory).
 *
 * Races: the allocations the pointer arguments point into are the only
 * memory a kernel of gpu/ can reach. They are saved before the launch; the
 * grid runs in the first order, its results are kept, the inputs restored,
 * and every other order must reproduce the results exactly. Blocks run in
 * the same order policy (forward, reverse, random) as their threads. */
#include "emu_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace emu {

static std::map<const void *, int> g_max_dyn_smem; /* kernel -> opt-in bytes */
static std::map<std::string, long> g_blocks;        /* kernel name -> blocks run */

long blocks_launched(const char *name)
{
    auto it = g_blocks.find(name);
    return it == g_blocks.end() ? 0 : it->second;
}

cudaError_t set_max_dynamic_smem(const void *func, int bytes)
{
    if (bytes < 0 || (size_t)bytes > OPTIN_SMEM_BYTES)
        return cudaErrorInvalidValue;
    g_max_dyn_smem[func] = bytes;
    return cudaSuccess;
}

size_t dynamic_smem_limit(const void *func)
{
    auto it = g_max_dyn_smem.find(func);
    size_t optin = it == g_max_dyn_smem.end() ? 0 : (size_t)it->second;
    return optin > DEFAULT_SMEM_BYTES ? optin : DEFAULT_SMEM_BYTES;
}

static void free_desc(launch_desc *d)
{
    d->free_args(d->args);
    delete d;
}

void launch(cudaStream_t st, launch_desc *in)
{
    const dim3 g = in->grid, b = in->block;
    const unsigned long long threads = (unsigned long long)b.x * b.y * b.z;
    cudaError_t e = cudaSuccess;
    if (b.x == 0 || b.y == 0 || b.z == 0 || threads > 1024 || b.x > 1024 || b.y > 1024 || b.z > 64 ||
        g.x == 0 || g.y == 0 || g.z == 0 || g.x > 0x7fffffffu || g.y > 65535 || g.z > 65535) {
        fprintf(stderr, "cuda-emu: launch of %s: invalid configuration grid (%u,%u,%u) block (%u,%u,%u)\n",
                in->name, g.x, g.y, g.z, b.x, b.y, b.z);
        e = cudaErrorInvalidConfiguration;
    } else if (in->bound && threads > in->bound) {
        fprintf(stderr, "cuda-emu: launch of %s: %llu threads exceed __launch_bounds__(%u)\n",
                in->name, threads, in->bound);
        e = cudaErrorLaunchOutOfResources;
    } else if (in->smem_bytes > dynamic_smem_limit(in->func)) {
        fprintf(stderr, "cuda-emu: launch of %s: %zu bytes of dynamic shared memory exceed the %zu "
                "allowed (48 KiB unless raised with cudaFuncSetAttribute)\n",
                in->name, in->smem_bytes, dynamic_smem_limit(in->func));
        e = cudaErrorInvalidValue;
    }
    if (e != cudaSuccess) {
        in->free_args(in->args);
        set_last_error(e);
        return;
    }
    for (size_t i = 0; i < in->ptr_args.size(); i++) {
        const void *p = in->ptr_args[i];
        const allocation *a = p ? mem_find(p) : nullptr;
        if (p && (!a || a->kind != MEM_DEVICE))
            fatal("launch of %s: pointer argument %zu (%p) is not device memory from cudaMalloc",
                  in->name, i, p);
    }
    /* shared: a captured launch runs once per graph replay */
    std::shared_ptr<launch_desc> d(new launch_desc(*in), free_desc);
    cudaError_t qe = enqueue(st, [d]() { return std::function<void()>([d]() { execute_launch(d.get()); }); },
                             in->name, in->ptr_args);
    if (qe != cudaSuccess)
        set_last_error(qe);
}

static void run_grid(const launch_desc *d, order_kind ord, uint64_t rng_seed)
{
    const dim3 g = d->grid;
    const unsigned long long nb = (unsigned long long)g.x * g.y * g.z;
    std::vector<unsigned long long> idx(nb);
    for (unsigned long long i = 0; i < nb; i++)
        idx[i] = ord == ORDER_REV ? nb - 1 - i : i;
    uint64_t rng = rng_seed * 0x9e3779b97f4a7c15ull | 1u;
    if (ord == ORDER_RAND)
        for (unsigned long long i = nb; i > 1; i--) {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            unsigned long long j = rng % i;
            unsigned long long t = idx[i - 1];
            idx[i - 1] = idx[j];
            idx[j] = t;
        }
    for (unsigned long long i = 0; i < nb; i++) {
        unsigned long long k = idx[i];
        uint3 bid = {(unsigned)(k % g.x), (unsigned)((k / g.x) % g.y), (unsigned)(k / ((unsigned long long)g.x * g.y))};
        run_block(d, bid, ord, rng_seed + k);
    }
}

static const char *order_name(order_kind k)
{
    return k == ORDER_FWD ? "forward" : k == ORDER_REV ? "reverse" : "random";
}

void execute_launch(launch_desc *d)
{
    static uint64_t launches;
    const uint64_t rng_seed = seed() * 1000003u + launches++;
    order_kind ord[3];
    const int n_ord = orders(ord, 3);
    g_blocks[d->name] += (long)d->grid.x * d->grid.y * d->grid.z;
    if (verbose())
        fprintf(stderr, "cuda-emu: %s grid (%u,%u,%u) block (%u,%u,%u) smem %zu\n", d->name,
                d->grid.x, d->grid.y, d->grid.z, d->block.x, d->block.y, d->block.z, d->smem_bytes);
    if (n_ord == 1) {
        run_grid(d, ord[0], rng_seed);
        return;
    }
    /* the distinct allocations the kernel can reach */
    std::vector<const allocation *> allocs;
    for (const void *p : d->ptr_args) {
        const allocation *a = p ? mem_find(p) : nullptr;
        bool seen = false;
        for (const allocation *o : allocs)
            seen = seen || o == a;
        if (a && !seen)
            allocs.push_back(a);
    }
    /* snapshots in buffers kept from launch to launch (allocating megabytes
     * per launch costs more than the copies under ASan's allocator) */
    static std::vector<std::vector<unsigned char>> before, after;
    if (before.size() < allocs.size()) {
        before.resize(allocs.size());
        after.resize(allocs.size());
    }
    for (size_t i = 0; i < allocs.size(); i++) {
        if (before[i].size() < allocs[i]->bytes) {
            before[i].resize(allocs[i]->bytes);
            after[i].resize(allocs[i]->bytes);
        }
        memcpy(before[i].data(), allocs[i]->base, allocs[i]->bytes);
    }
    run_grid(d, ord[0], rng_seed);
    for (size_t i = 0; i < allocs.size(); i++)
        memcpy(after[i].data(), allocs[i]->base, allocs[i]->bytes);
    for (int o = 1; o < n_ord; o++) {
        for (size_t i = 0; i < allocs.size(); i++)
            memcpy(allocs[i]->base, before[i].data(), allocs[i]->bytes);
        run_grid(d, ord[o], rng_seed);
        for (size_t i = 0; i < allocs.size(); i++) {
            const unsigned char *x = after[i].data(), *y = allocs[i]->base;
            if (memcmp(x, y, allocs[i]->bytes) == 0)
                continue;
            size_t k = 0;
            while (x[k] == y[k])
                k++;
            size_t w = k & ~(size_t)3;
            float fx = 0, fy = 0;
            if (w + 4 <= allocs[i]->bytes) {
                memcpy(&fx, x + w, 4);
                memcpy(&fy, y + w, 4);
            }
            fatal("race in %s: thread orders %s and %s give different results: allocation %p "
                  "(%zu bytes) differs first at byte %zu (as f32 at byte %zu: %.9g vs %.9g)",
                  d->name, order_name(ord[0]), order_name(ord[o]), (void *)allocs[i]->base,
                  allocs[i]->bytes, k, w, (double)fx, (double)fy);
            return;
        }
    }
}

} // namespace emu
