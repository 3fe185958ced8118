/* emu_internal: what the emulator's own .cc files share (not seen by gpu/).
 *
 * Files, one concept each:
 *   emu_fiber.cc    context switch and fiber stacks
 *   emu_block.cc    one block: a fiber per thread, barriers, warp ops, shared memory
 *   emu_launch.cc   launch checks (CUDA's launch errors) and execution of a
 *                   grid in several thread orders, compared bit for bit
 *   emu_memory.cc   the registry of device and pinned allocations
 *   emu_stream.cc   streams, events, graphs: queued work run at completion points
 *   emu_runtime.cc  the cudart API (memory, copies, device, errors)
 *   emu_cublas.cc   cublasGemmEx and friends
 *   emu_report.cc   error reporting and the emulator's settings (environment)
 */
#ifndef EMU_INTERNAL_H
#define EMU_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <functional>
#include <vector>

#include "emu_device.h"

namespace emu {

/* ---- emu_report ------------------------------------------------------------ */

/* An error the emulator detected in the code under test (a race, a
 * divergent barrier, a pinned buffer reused too early, ...): printed with
 * "cuda-emu: error: " on stderr, counted, and — unless EMU_ON_ERROR=count
 * (the emulator's own tests) — the process exits with status 3, so no test
 * can pass over it. */
[[gnu::format(printf, 1, 2)]] void fatal(const char *fmt, ...);
/* Errors reported so far (EMU_ON_ERROR=count). */
long error_count();

/* Thread orders each launch is executed in (EMU_ORDERS, a comma list of
 * fwd, rev, rand; default "fwd,rev,rand"); results must be bit-identical. */
enum order_kind { ORDER_FWD, ORDER_REV, ORDER_RAND };
int orders(order_kind *out, int cap);
uint64_t seed();               /* EMU_SEED, default 1 */
bool verbose();                /* EMU_VERBOSE=1: one line per launch */

/* ---- emu_memory ------------------------------------------------------------ */

enum mem_kind { MEM_DEVICE, MEM_PINNED };
struct allocation {
    unsigned char *base;
    size_t bytes;
    mem_kind kind;
    uint64_t serial;   /* unique per allocation: a freed and reallocated
                          address is another allocation */
};
/* The allocation containing p (NULL when none). */
const allocation *mem_find(const void *p);
/* 1 when [p, p + bytes) lies inside one allocation of `kind`. */
bool mem_range_is(const void *p, size_t bytes, mem_kind kind);
void *mem_alloc(size_t bytes, mem_kind kind);     /* NULL when out of (fake) memory */
bool mem_free(void *p, mem_kind kind);            /* false: not an allocation start */
size_t mem_device_in_use();

/* Fake device (emu_runtime.cc) */
constexpr size_t DEFAULT_SMEM_BYTES = 48u * 1024u;
/* The smallest opt-in limit among gpu/'s targets (sm_86 / sm_89: 99 KiB). */
constexpr size_t OPTIN_SMEM_BYTES = 99u * 1024u;
size_t device_total_bytes();

/* ---- emu_block ------------------------------------------------------------- */

/* Runs block bid of launch d with every thread as a fiber, scheduled in
 * order `ord`; returns after every thread finished (errors are fatal). */
void run_block(const launch_desc *d, uint3 bid, order_kind ord, uint64_t rng_seed);
/* Static shared memory the current launch may still use. */
size_t dynamic_smem_limit(const void *func);

/* ---- emu_launch ------------------------------------------------------------ */

/* Executes a validated launch (called by the stream when it reaches it). */
void execute_launch(launch_desc *d);
/* Blocks executed by launches named `name` (once per launch). */
long blocks_launched(const char *name);
/* cudaFuncSetAttribute(MaxDynamicSharedMemorySize) bookkeeping */
cudaError_t set_max_dynamic_smem(const void *func, int bytes);

/* ---- emu_stream ------------------------------------------------------------ */

/* A unit of stream work in two halves: submit() runs when the work is
 * queued on a stream (cudaMemcpyAsync's call, or each cudaGraphLaunch of a
 * captured node) and returns the part that runs when the stream reaches it.
 * (A pinned host->device copy snapshots its source at submit and checks it
 * was not modified when it runs.) */
typedef std::function<std::function<void()>()> work;
/* Queues w on st (NULL: the legacy default stream); while st is being
 * captured, w becomes a node of its graph instead. */
cudaError_t enqueue(cudaStream_t st, work w, const char *what);
/* The same, for work that uses the device (or pinned) pointers dev_ptrs: while st is
 * being captured, the node remembers which allocation each pointer was in,
 * and every replay (cudaGraphLaunch) first checks that each is still that
 * allocation — a graph replayed after one of its buffers was freed (or
 * freed and reallocated, as a growing workspace is) would read or write
 * memory that is no longer the captured buffer: an emulator error, and the
 * node does nothing. */
cudaError_t enqueue(cudaStream_t st, work w, const char *what,
                    const std::vector<const void *> &dev_ptrs);
/* A call CUDA forbids during capture (synchronization, allocation, pageable
 * copies) on st (NULL: any capturing stream): invalidates the capture and
 * returns cudaErrorStreamCaptureUnsupported; cudaSuccess when none. */
cudaError_t capture_violation(cudaStream_t st, const char *what);
/* Runs everything queued on st / on every stream. */
void flush(cudaStream_t st);
void flush_all();
/* 1 when st is being captured (copies and launches go into its graph). */
bool capturing(cudaStream_t st);

/* ---- emu_runtime ------------------------------------------------------------ */

/* CUDA's "last error" (cudaGetLastError): set by failed launches. */
void set_last_error(cudaError_t e);

} // namespace emu

#endif
