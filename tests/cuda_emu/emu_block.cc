/* emu_block: one thread block — a fiber per CUDA thread, scheduled
 * cooperatively.
 *
 * A thread runs until it reaches __syncthreads, a warp-synchronous
 * operation or its end, then hands control back to the scheduler, which
 * resumes the runnable threads in the launch's order: forward (0, 1, ...),
 * reverse, or a fresh random permutation each pass. Between two barriers the
 * threads of a block thus run one after the other in different orders; a
 * result that depends on that order is a race (emu_launch.cc compares the
 * orders bit for bit).
 *
 * Barriers: __syncthreads releases when every thread of the block has
 * arrived; a thread that has exited while others wait at (or later reach) a
 * barrier is an error (CUDA: undefined). Warp operations release when every
 * lane named in `mask` has arrived with the same operation and mask. When no
 * thread can run and some have not finished, the block is deadlocked: an
 * error naming what each waits for.
 *
 * Shared memory: the dynamic part (the launch's smem bytes) and each static
 * __shared__ array are separate heap blocks of their exact size (so ASan sees
 * an access past their end), filled with 0xff bytes — NaN as f32, bf16 and
 * f16, -1 as int — when the block starts. */
#include "emu_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <string>
#include <vector>

#include "emu_fiber.h"

namespace emu {

thread_local thread_ctx *t_thread;
thread_local grid_ctx t_grid;

enum { TH_RUNNABLE, TH_BARRIER, TH_WARP, TH_DONE };

struct warp_state {
    unsigned arrived;       /* lanes arrived at the pending operation */
    unsigned mask;          /* its mask */
    int kind;               /* its warp_kind */
    int width;
    uint32_t gen;           /* completed operations (selects the buffer) */
    uint64_t val[2][32];
    int param[2][32];
};

struct static_region {
    const char *key;
    void *p;
};

struct block_exec {
    const launch_desc *d;
    int n;                  /* threads */
    int done;
    int at_barrier;
    bool reported;          /* one divergence report per block */
    std::vector<thread_ctx> th;
    std::vector<warp_state> warps;
    void *dyn;
    size_t static_bytes;
    std::vector<static_region> statics;
    fiber_home home;
};

/* Fibers are allocated once per OS thread and reused (up to 1024). */
static thread_local std::vector<fiber> *t_fibers;

static fiber *fibers(int n)
{
    if (!t_fibers)
        t_fibers = new std::vector<fiber>();
    while ((int)t_fibers->size() < n) {
        fiber f;
        if (!fiber_alloc(&f)) {
            fprintf(stderr, "cuda-emu: cannot allocate a fiber stack\n");
            abort();
        }
        t_fibers->push_back(f);
    }
    return t_fibers->data();
}

static const char *kind_name(int k)
{
    static const char *const names[] = {"__shfl_sync", "__shfl_xor_sync", "__shfl_down_sync",
                                        "__shfl_up_sync", "__ballot_sync", "__any_sync",
                                        "__all_sync", "__syncwarp"};
    return k >= 0 && k < 8 ? names[k] : "?";
}

static void where(char *buf, size_t cap, const thread_ctx *t)
{
    snprintf(buf, cap, "%s block (%u,%u,%u) thread (%u,%u,%u)", t->blk->d->name, t_grid.bid.x,
             t_grid.bid.y, t_grid.bid.z, t->tid.x, t->tid.y, t->tid.z);
}

static void thread_main(void *arg)
{
    thread_ctx *t = (thread_ctx *)arg;
    t->blk->d->run(t->blk->d->args);
    block_exec *b = t->blk;
    t->state = TH_DONE;
    b->done++;
    if (b->at_barrier > 0 && !b->reported) {
        b->reported = true;
        char w[160];
        where(w, sizeof w, t);
        fatal("%s exited while %d threads wait at __syncthreads (a barrier not every thread "
              "reaches: undefined behaviour)", w, b->at_barrier);
    }
}

static void yield_to_scheduler()
{
    thread_ctx *t = t_thread;
    block_exec *b = t->blk;
    fiber_yield(&b->home, &fibers(0)[t->linear]);
    t_thread = t; /* the scheduler set it to t before resuming */
}

void syncthreads()
{
    thread_ctx *t = t_thread;
    block_exec *b = t->blk;
    if (b->done > 0 && !b->reported) {
        b->reported = true;
        char w[160];
        where(w, sizeof w, t);
        fatal("%s reached __syncthreads after %d threads of its block exited (a barrier not every "
              "thread reaches: undefined behaviour)", w, b->done);
    }
    t->state = TH_BARRIER;
    if (++b->at_barrier == b->n) {
        for (auto &o : b->th)
            o.state = TH_RUNNABLE;
        b->at_barrier = 0;
    }
    yield_to_scheduler();
}

uint64_t warp_op(warp_kind kind, unsigned mask, uint64_t value, int param, int width)
{
    thread_ctx *t = t_thread;
    block_exec *b = t->blk;
    const int lane = t->linear & 31, wi = t->linear >> 5;
    warp_state &w = b->warps[(size_t)wi];
    char at[160];
    const int lanes_here = b->n - wi * 32 < 32 ? b->n - wi * 32 : 32;
    const unsigned exist = lanes_here == 32 ? 0xffffffffu : ((1u << lanes_here) - 1u);
    if (!((mask >> lane) & 1u)) {
        where(at, sizeof at, t);
        fatal("%s: %s with mask 0x%08x that does not name the calling lane %d", at,
              kind_name(kind), mask, lane);
    }
    if (mask & ~exist) {
        where(at, sizeof at, t);
        fatal("%s: %s mask 0x%08x names lanes that do not exist (warp of %d threads)", at,
              kind_name(kind), mask, lanes_here);
    }
    if (width < 1 || width > 32 || (width & (width - 1))) {
        where(at, sizeof at, t);
        fatal("%s: %s width %d: expected a power of two <= 32", at, kind_name(kind), width);
    }
    if (w.arrived == 0) {
        w.mask = mask;
        w.kind = kind;
        w.width = width;
    } else if (w.mask != mask || w.kind != kind || w.width != width) {
        where(at, sizeof at, t);
        fatal("%s: %s mask 0x%08x while lanes 0x%08x of its warp wait at %s mask 0x%08x "
              "(divergent warp-synchronous operations)", at, kind_name(kind), mask, w.arrived,
              kind_name(w.kind), w.mask);
    }
    const uint32_t gen = w.gen;
    const int buf = (int)(gen & 1u);
    w.val[buf][lane] = value;
    w.param[buf][lane] = param;
    w.arrived |= 1u << lane;
    if (w.arrived == mask) {
        w.arrived = 0;
        w.gen++;
        for (int l = 0; l < 32; l++)
            if ((mask >> l) & 1u)
                b->th[(size_t)(wi * 32 + l)].state = TH_RUNNABLE;
    } else {
        t->state = TH_WARP;
    }
    yield_to_scheduler();

    const uint64_t *v = w.val[buf];
    const int seg = lane & ~(width - 1);
    int src = lane;
    switch (kind) {
    case WARP_SHFL:
        src = seg + (param & (width - 1));
        break;
    case WARP_SHFL_XOR:
        src = lane ^ param;
        if (src < seg || src >= seg + width)
            src = lane;
        break;
    case WARP_SHFL_DOWN:
        src = lane + param;
        if (src >= seg + width)
            src = lane;
        break;
    case WARP_SHFL_UP:
        src = lane - param;
        if (src < seg)
            src = lane;
        break;
    case WARP_BALLOT:
    case WARP_ANY:
    case WARP_ALL: {
        unsigned bits = 0;
        for (int l = 0; l < 32; l++)
            if (((mask >> l) & 1u) && v[l])
                bits |= 1u << l;
        if (kind == WARP_BALLOT)
            return bits;
        return kind == WARP_ANY ? bits != 0 : bits == mask;
    }
    case WARP_SYNC:
        return 0;
    }
    if (src < 0 || src > 31 || !((mask >> src) & 1u)) {
        where(at, sizeof at, t);
        fatal("%s: %s reads lane %d, which is not in mask 0x%08x (undefined value)", at,
              kind_name(kind), src, mask);
        return value;
    }
    return v[src];
}

void *dynamic_shared()
{
    return t_thread->blk->dyn;
}

void *static_shared(const char *key, size_t bytes, size_t align)
{
    block_exec *b = t_thread->blk;
    for (auto &r : b->statics)
        if (r.key == key || strcmp(r.key, key) == 0)
            return r.p;
    b->static_bytes += (bytes + 15u) & ~(size_t)15u;
    if (b->static_bytes > DEFAULT_SMEM_BYTES)
        fatal("%s: %zu bytes of static __shared__ memory: the limit is %zu", b->d->name,
              b->static_bytes, (size_t)DEFAULT_SMEM_BYTES);
    size_t lim = dynamic_smem_limit(b->d->func);
    if (b->static_bytes + b->d->smem_bytes > lim)
        fatal("%s: %zu bytes of static plus %zu of dynamic shared memory exceed the %zu the launch "
              "may use", b->d->name, b->static_bytes, b->d->smem_bytes, lim);
    void *p = nullptr;
    if (posix_memalign(&p, align < 16 ? 16 : align, bytes ? bytes : 1) != 0) {
        fprintf(stderr, "cuda-emu: out of host memory\n");
        abort();
    }
    memset(p, 0xff, bytes);
    b->statics.push_back(static_region{key, p});
    return p;
}

/* The next thread to resume: the first runnable one in this pass's order. */
static void make_order(std::vector<int> &ord, int n, order_kind k, uint64_t *rng)
{
    ord.resize((size_t)n);
    for (int i = 0; i < n; i++)
        ord[(size_t)i] = k == ORDER_REV ? n - 1 - i : i;
    if (k == ORDER_RAND)
        for (int i = n - 1; i > 0; i--) {
            *rng ^= *rng << 13;
            *rng ^= *rng >> 7;
            *rng ^= *rng << 17;
            int j = (int)(*rng % (uint64_t)(i + 1));
            int tmp = ord[(size_t)i];
            ord[(size_t)i] = ord[(size_t)j];
            ord[(size_t)j] = tmp;
        }
}

void run_block(const launch_desc *d, uint3 bid, order_kind ord_kind, uint64_t rng_seed)
{
    block_exec b;
    b.d = d;
    b.n = (int)(d->block.x * d->block.y * d->block.z);
    b.done = 0;
    b.at_barrier = 0;
    b.reported = false;
    b.static_bytes = 0;
    b.th.resize((size_t)b.n);
    b.warps.assign((size_t)((b.n + 31) / 32), warp_state{});
    b.dyn = malloc(d->smem_bytes ? d->smem_bytes : 1);
    if (!b.dyn) {
        fprintf(stderr, "cuda-emu: out of host memory\n");
        abort();
    }
    memset(b.dyn, 0xff, d->smem_bytes);
    t_grid.bid = bid;
    t_grid.bdim = d->block;
    t_grid.gdim = d->grid;
    fiber *fb = fibers(b.n);
    for (int i = 0; i < b.n; i++) {
        thread_ctx &t = b.th[(size_t)i];
        t.linear = i;
        t.tid.x = (unsigned)i % d->block.x;
        t.tid.y = ((unsigned)i / d->block.x) % d->block.y;
        t.tid.z = (unsigned)i / (d->block.x * d->block.y);
        t.state = TH_RUNNABLE;
        t.blk = &b;
        fiber_reset(&fb[i], thread_main, &t);
    }
    uint64_t rng = rng_seed | 1u;
    std::vector<int> ord;
    while (b.done < b.n) {
        make_order(ord, b.n, ord_kind, &rng);
        bool progress = false;
        for (int i : ord) {
            thread_ctx &t = b.th[(size_t)i];
            if (t.state != TH_RUNNABLE)
                continue;
            t_thread = &t;
            fiber_resume(&b.home, &fb[i]);
            progress = true;
        }
        if (!progress) {
            std::string what;
            for (int wi = 0; wi < (int)b.warps.size(); wi++)
                if (b.warps[(size_t)wi].arrived) {
                    char s[128];
                    snprintf(s, sizeof s, " warp %d: lanes 0x%08x wait at %s mask 0x%08x;", wi,
                             b.warps[(size_t)wi].arrived, kind_name(b.warps[(size_t)wi].kind),
                             b.warps[(size_t)wi].mask);
                    what += s;
                }
            fatal("%s block (%u,%u,%u): deadlock: %d threads finished, %d wait at __syncthreads;%s",
                  d->name, bid.x, bid.y, bid.z, b.done, b.at_barrier, what.c_str());
            break; /* EMU_ON_ERROR=count: abandon the block's fibers */
        }
    }
    t_thread = nullptr;
    for (auto &r : b.statics)
        free(r.p);
    free(b.dyn);
}

} // namespace emu
