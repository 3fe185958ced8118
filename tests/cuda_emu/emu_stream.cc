/* emu_stream: streams, events and graphs. Work queued on a stream does not
 * run when it is queued: it runs only where CUDA guarantees completion —
 * cudaStreamSynchronize, cudaEventSynchronize (up to the event),
 * cudaDeviceSynchronize, cudaFree / cudaFreeHost (which synchronize the
 * device), a blocking cudaMemcpy, a device->pageable cudaMemcpyAsync. So
 * host code that reads a result, or reuses a buffer, without the
 * synchronization CUDA requires sees the wrong data (and the copy checks of
 * emu_runtime.cc name it), however fast the "device" is.
 *
 * Streams run in order; work on different streams is only ordered by
 * events (cudaStreamWaitEvent flushes the event's stream first).
 *
 * Graphs: between cudaStreamBeginCapture and cudaStreamEndCapture, work
 * queued on the stream becomes the graph's nodes (in order: a chain); a
 * call CUDA forbids during capture (synchronizing, allocating, a pageable
 * copy) invalidates the capture, whose end then fails with
 * cudaErrorStreamCaptureInvalidated. Only the global capture mode is
 * modelled: an event synchronization or query from any host code during a
 * capture invalidates it too, and so does an event record on the capturing
 * stream (event nodes are not emulated). Kernel arguments, copy addresses
 * and sizes, and cuBLAS's operands are frozen when captured; cudaGraphLaunch
 * submits the nodes again (each pinned copy snapshots its source at that
 * moment), after checking that every device pointer a node uses still
 * lies in the allocation it was captured in (enqueue with dev_ptrs). */
#include "emu_internal.h"

#include <stdio.h>

#include <chrono>
#include <deque>
#include <memory>
#include <string>
#include <vector>

struct emu_stream {
    std::deque<std::function<void()>> q;
    unsigned flags;
    bool capturing, invalidated;
    struct emu_graph *graph;
};

struct emu_event {
    emu_stream *st;
    uint64_t recorded, completed;
    double t_ms;      /* host steady clock when the last record completed */
};

static double emu_now_ms()
{
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

struct emu_graph {
    std::vector<emu::work> nodes;
};

struct emu_graph_exec {
    std::vector<emu::work> nodes;
};

namespace emu {

static emu_stream g_default;
static std::vector<emu_stream *> &streams()
{
    static std::vector<emu_stream *> *s = new std::vector<emu_stream *>{&g_default};
    return *s;
}

static emu_stream *S(cudaStream_t st)
{
    return st ? st : &g_default;
}

bool capturing(cudaStream_t st)
{
    return S(st)->capturing;
}

cudaError_t capture_violation(cudaStream_t st, const char *what)
{
    cudaError_t e = cudaSuccess;
    for (emu_stream *s : streams())
        if (s->capturing && (!st || s == st) && !s->invalidated) {
            fprintf(stderr, "cuda-emu: %s during stream capture: the capture is invalidated\n", what);
            s->invalidated = true;
            e = cudaErrorStreamCaptureUnsupported;
        }
    return e;
}

cudaError_t enqueue(cudaStream_t st, work w, const char *what)
{
    emu_stream *s = S(st);
    if (s->capturing) {
        if (!s->invalidated)
            s->graph->nodes.push_back(std::move(w));
        return cudaSuccess;
    }
    (void)what;
    s->q.push_back(w());
    return cudaSuccess;
}

cudaError_t enqueue(cudaStream_t st, work w, const char *what,
                    const std::vector<const void *> &dev_ptrs)
{
    if (!capturing(st) || dev_ptrs.empty())
        return enqueue(st, std::move(w), what);
    struct pin {
        const void *p;
        uint64_t serial;
    };
    std::vector<pin> pins;
    for (const void *p : dev_ptrs) {
        const allocation *a = p ? mem_find(p) : nullptr;
        if (a)
            pins.push_back(pin{p, a->serial});
    }
    std::string name = what;
    work checked = [w, pins, name]() {
        for (const pin &q : pins) {
            const allocation *a = mem_find(q.p);
            if (!a || a->serial != q.serial) {
                fatal("graph replay: %s: device pointer %p was freed (or freed and reallocated) "
                      "after the capture: the graph still uses the old buffer", name.c_str(), q.p);
                return std::function<void()>([]() {});
            }
        }
        return w();
    };
    return enqueue(st, std::move(checked), what);
}

void flush(cudaStream_t st)
{
    emu_stream *s = S(st);
    while (!s->q.empty()) {
        std::function<void()> f = std::move(s->q.front());
        s->q.pop_front();
        f();
    }
}

void flush_all()
{
    for (emu_stream *s : streams())
        flush(s == &g_default ? nullptr : s);
}

} // namespace emu

using namespace emu;

extern "C" {

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *st, unsigned int flags)
{
    if (!st)
        return cudaErrorInvalidValue;
    emu_stream *s = new emu_stream();
    s->flags = flags;
    streams().push_back(s);
    *st = s;
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *st)
{
    return cudaStreamCreateWithFlags(st, cudaStreamDefault);
}

cudaError_t cudaStreamDestroy(cudaStream_t st)
{
    if (!st)
        return cudaErrorInvalidResourceHandle;
    flush(st); /* CUDA: pending work completes, then the stream is released */
    auto &v = streams();
    for (size_t i = 0; i < v.size(); i++)
        if (v[i] == st) {
            v.erase(v.begin() + (long)i);
            delete st;
            return cudaSuccess;
        }
    return cudaErrorInvalidResourceHandle;
}

cudaError_t cudaStreamSynchronize(cudaStream_t st)
{
    cudaError_t e = capture_violation(st, "cudaStreamSynchronize");
    if (e != cudaSuccess)
        return e;
    flush(st);
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void)
{
    cudaError_t e = capture_violation(nullptr, "cudaDeviceSynchronize");
    if (e != cudaSuccess)
        return e;
    flush_all();
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *ev, unsigned int flags)
{
    (void)flags;
    if (!ev)
        return cudaErrorInvalidValue;
    *ev = new emu_event();
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *ev)
{
    return cudaEventCreateWithFlags(ev, cudaEventDefault);
}

cudaError_t cudaEventDestroy(cudaEvent_t ev)
{
    if (!ev)
        return cudaErrorInvalidResourceHandle;
    delete ev;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t st)
{
    if (!ev)
        return cudaErrorInvalidResourceHandle;
    if (capturing(st)) {
        fatal("cudaEventRecord on a capturing stream: event nodes are not emulated");
        return cudaErrorStreamCaptureUnsupported;
    }
    ev->st = S(st);
    uint64_t n = ++ev->recorded;
    return enqueue(st, [ev, n]() { return std::function<void()>([ev, n]() {
                       ev->completed = n;
                       ev->t_ms = emu_now_ms();
                   }); },
                   "event record");
}

/* The host time between the completions of two recorded events (the
 * emulation's, not a device's: only the structure of a timing is tested
 * here). cudaErrorNotReady while either has not completed. */
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    if (!ms || !start || !end)
        return cudaErrorInvalidValue;
    if (!start->recorded || !end->recorded)
        return cudaErrorInvalidResourceHandle;
    if (start->completed < start->recorded || end->completed < end->recorded)
        return cudaErrorNotReady;
    *ms = (float)(end->t_ms - start->t_ms);
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t ev)
{
    if (!ev)
        return cudaErrorInvalidResourceHandle;
    /* global capture mode: a synchronizing call from any host code while a
     * stream is captured is illegal (it could wait on captured work) */
    cudaError_t e = capture_violation(nullptr, "cudaEventSynchronize / cudaEventQuery");
    if (e != cudaSuccess)
        return e;
    while (ev->completed < ev->recorded && ev->st && !ev->st->q.empty()) {
        std::function<void()> f = std::move(ev->st->q.front());
        ev->st->q.pop_front();
        f();
    }
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t ev)
{
    /* a query that says "done" is a completion point: run up to the event */
    return cudaEventSynchronize(ev);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t st, cudaEvent_t ev, unsigned int flags)
{
    (void)flags;
    (void)st;
    return cudaEventSynchronize(ev);
}

cudaError_t cudaStreamBeginCapture(cudaStream_t st, cudaStreamCaptureMode mode)
{
    (void)mode;
    emu_stream *s = S(st);
    if (!st || s->capturing)
        return cudaErrorInvalidValue; /* the legacy stream cannot be captured */
    flush(st);
    s->capturing = true;
    s->invalidated = false;
    s->graph = new emu_graph();
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t st, cudaGraph_t *graph)
{
    emu_stream *s = S(st);
    if (!s->capturing)
        return cudaErrorStreamCaptureUnmatched;
    s->capturing = false;
    if (s->invalidated) {
        delete s->graph;
        s->graph = nullptr;
        *graph = nullptr;
        return cudaErrorStreamCaptureInvalidated;
    }
    *graph = s->graph;
    s->graph = nullptr;
    if (verbose())
        fprintf(stderr, "cuda-emu: graph captured (%zu nodes)\n", (*graph)->nodes.size());
    return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t st, cudaStreamCaptureStatus *status)
{
    emu_stream *s = S(st);
    *status = !s->capturing ? cudaStreamCaptureStatusNone
              : s->invalidated ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive;
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags)
{
    (void)flags;
    if (!exec || !graph)
        return cudaErrorInvalidValue;
    *exec = new emu_graph_exec{graph->nodes};
    return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t st)
{
    if (!exec)
        return cudaErrorInvalidValue;
    if (verbose())
        fprintf(stderr, "cuda-emu: graph launch (%zu nodes)\n", exec->nodes.size());
    for (const work &w : exec->nodes) {
        cudaError_t e = enqueue(st, w, "graph node");
        if (e != cudaSuccess)
            return e;
    }
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec)
{
    delete exec;
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph)
{
    delete graph;
    return cudaSuccess;
}

} // extern "C"
