/* emu_fiber: cooperative fibers for the CUDA emulator — one per CUDA thread
 * of a block, switched only at barriers and warp-synchronous operations.
 *
 * A hand-written x86-64 context switch (callee-saved registers + stack
 * pointer, ~10 ns) instead of swapcontext (a sigprocmask system call per
 * switch): a decode-attention block switches hundreds of thousands of times.
 * Under AddressSanitizer every switch is announced with
 * __sanitizer_start_switch_fiber / __sanitizer_finish_switch_fiber so ASan
 * knows which stack is live.
 *
 * Stacks are mmap'd once (EMU_FIBER_STACK_BYTES each, with a PROT_NONE guard
 * page below, so a kernel that overflows its stack faults instead of
 * corrupting its neighbour) and reused by every block of every launch.
 * Single OS thread: a fiber set belongs to the thread that created it. */
#ifndef EMU_FIBER_H
#define EMU_FIBER_H

#include <stddef.h>

namespace emu {

constexpr size_t FIBER_STACK_BYTES = 128u * 1024u;

/* Entry of a fiber: called once with arg; when it returns, the fiber
 * switches back to its scheduler for good (fiber_finished). */
typedef void (*fiber_fn)(void *arg);

struct fiber {
    void *sp;            /* saved stack pointer while switched out */
    char *stack_lo;      /* usable stack [stack_lo, stack_lo + FIBER_STACK_BYTES) */
    fiber_fn fn;
    void *arg;
    void *asan_fake;     /* ASan fake-stack handle of this fiber */
    int unfinished;      /* started and not returned (abandoned after an error) */
};

/* The scheduler's side: the OS thread's own stack. */
struct fiber_home {
    void *sp;
    void *asan_fake;
    const void *stack_bottom; /* the OS thread's stack, for ASan */
    size_t stack_size;
};

/* Allocates the stack of f (once; fiber_reset re-arms it). */
bool fiber_alloc(fiber *f);
void fiber_free(fiber *f);
/* Prepares f to run fn(arg) from the top of its stack on the next resume. */
void fiber_reset(fiber *f, fiber_fn fn, void *arg);
/* Runs f until it yields (fiber_yield) or finishes. */
void fiber_resume(fiber_home *home, fiber *f);
/* From inside f: back to home. */
void fiber_yield(fiber_home *home, fiber *f);

} // namespace emu

#endif
