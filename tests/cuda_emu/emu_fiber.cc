/* emu_fiber: see emu_fiber.h. */
#include "emu_fiber.h"

#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define EMU_ASAN 1
#else
#define EMU_ASAN 0
#endif

#if !defined(__x86_64__)
#error "emu_fiber: the context switch is written for x86-64 (System V ABI)"
#endif

/* emu_ctx_switch(void **save_sp, void *new_sp): pushes the callee-saved
 * registers, saves rsp in *save_sp, loads new_sp and pops the other side's.
 * emu_ctx_start: first "return" of a new fiber: calls rbx(r12). */
extern "C" void emu_ctx_switch(void **save_sp, void *new_sp);
extern "C" void emu_ctx_start(void);
asm(".text\n"
    ".globl emu_ctx_switch\n"
    ".type emu_ctx_switch,@function\n"
    "emu_ctx_switch:\n"
    "    pushq %rbp\n"
    "    pushq %rbx\n"
    "    pushq %r12\n"
    "    pushq %r13\n"
    "    pushq %r14\n"
    "    pushq %r15\n"
    "    subq $8, %rsp\n"
    "    stmxcsr (%rsp)\n"
    "    fnstcw 4(%rsp)\n"
    "    movq %rsp, (%rdi)\n"
    "    movq %rsi, %rsp\n"
    "    ldmxcsr (%rsp)\n"
    "    fldcw 4(%rsp)\n"
    "    addq $8, %rsp\n"
    "    popq %r15\n"
    "    popq %r14\n"
    "    popq %r13\n"
    "    popq %r12\n"
    "    popq %rbx\n"
    "    popq %rbp\n"
    "    ret\n"
    ".size emu_ctx_switch,.-emu_ctx_switch\n"
    ".globl emu_ctx_start\n"
    ".type emu_ctx_start,@function\n"
    "emu_ctx_start:\n"
    "    movq %r12, %rdi\n"
    "    callq *%rbx\n"
    "    ud2\n"
    ".size emu_ctx_start,.-emu_ctx_start\n");

namespace emu {

static const size_t GUARD = 4096;

bool fiber_alloc(fiber *f)
{
    memset(f, 0, sizeof *f);
    void *p = mmap(nullptr, FIBER_STACK_BYTES + GUARD, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return false;
    mprotect(p, GUARD, PROT_NONE); /* stacks grow down: the guard is below */
    f->stack_lo = (char *)p + GUARD;
    return true;
}

void fiber_free(fiber *f)
{
    if (f->stack_lo)
        munmap(f->stack_lo - GUARD, FIBER_STACK_BYTES + GUARD);
    memset(f, 0, sizeof *f);
}

/* The first code a fiber runs (on its own stack). */
static void fiber_main(void *arg);

struct start_frame { /* what emu_ctx_switch pops, lowest address first */
    uint32_t mxcsr, fpucw;
    uint64_t r15, r14, r13, r12, rbx, rbp, ret;
};

void fiber_reset(fiber *f, fiber_fn fn, void *arg)
{
    f->fn = fn;
    f->arg = arg;
    f->asan_fake = nullptr;
#if EMU_ASAN
    /* a fiber that returned left no poisoned frame behind (instrumented
     * functions unpoison theirs on return); one abandoned mid-way did */
    if (f->unfinished)
        ASAN_UNPOISON_MEMORY_REGION(f->stack_lo, FIBER_STACK_BYTES);
#endif
    f->unfinished = 1;
    /* emu_ctx_switch pops the 64-byte frame and returns into
     * emu_ctx_start with rsp = fr + 64, which must be 16-byte aligned so that
     * its `call` enters fiber_main with the ABI's alignment */
    static_assert(sizeof(start_frame) == 64, "start_frame layout");
    uintptr_t top = (uintptr_t)(f->stack_lo + FIBER_STACK_BYTES - 64) & ~(uintptr_t)15;
    start_frame *fr = (start_frame *)(top - sizeof(start_frame));
    memset(fr, 0, sizeof *fr);
    uint32_t mx;
    uint16_t cw;
    asm volatile("stmxcsr %0" : "=m"(mx));
    asm volatile("fnstcw %0" : "=m"(cw));
    fr->mxcsr = mx;
    fr->fpucw = cw;
    fr->r12 = (uint64_t)(uintptr_t)f;
    fr->rbx = (uint64_t)(uintptr_t)&fiber_main;
    fr->ret = (uint64_t)(uintptr_t)&emu_ctx_start;
    f->sp = fr;
}

/* The home a running fiber returns to (set by fiber_resume). */
static thread_local fiber_home *t_home;
/* where a finished fiber's last stack pointer goes (never resumed) */
static thread_local void *t_discard_sp;

static void fiber_main(void *arg)
{
    fiber *f = (fiber *)arg;
#if EMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &t_home->stack_bottom, &t_home->stack_size);
#endif
    f->fn(f->arg);
    f->unfinished = 0;
    fiber_home *h = t_home;
#if EMU_ASAN
    /* this fiber never runs again: let ASan drop its fake stack */
    __sanitizer_start_switch_fiber(nullptr, h->stack_bottom, h->stack_size);
#endif
    emu_ctx_switch(&t_discard_sp, h->sp);
    __builtin_unreachable();
}

void fiber_resume(fiber_home *home, fiber *f)
{
    t_home = home;
#if EMU_ASAN
    __sanitizer_start_switch_fiber(&home->asan_fake, f->stack_lo, FIBER_STACK_BYTES);
#endif
    emu_ctx_switch(&home->sp, f->sp);
#if EMU_ASAN
    const void *from_bottom;
    size_t from_size;
    __sanitizer_finish_switch_fiber(home->asan_fake, &from_bottom, &from_size);
#endif
}

void fiber_yield(fiber_home *home, fiber *f)
{
#if EMU_ASAN
    __sanitizer_start_switch_fiber(&f->asan_fake, home->stack_bottom, home->stack_size);
#endif
    emu_ctx_switch(&f->sp, home->sp);
#if EMU_ASAN
    __sanitizer_finish_switch_fiber(f->asan_fake, &home->stack_bottom, &home->stack_size);
#endif
}

} // namespace emu
