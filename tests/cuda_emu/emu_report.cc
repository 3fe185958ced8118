/* emu_report: error reporting and the emulator's settings (environment
 * variables, read once):
 *   EMU_ON_ERROR=exit|count  exit (default): an emulator-detected error ends
 *                            the process with status 3; count: only counted
 *                            (the emulator's own tests check the count)
 *   EMU_ORDERS=fwd,rev,rand  thread orders every launch runs in (compared)
 *   EMU_SEED=n               seed of the random order (default 1)
 *   EMU_VERBOSE=1            one line per executed launch on stderr, and
 *                            one per graph captured and per graph launch */
#include "emu_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

namespace emu {

static long g_errors;

static const char *env(const char *name, const char *def)
{
    const char *v = getenv(name);
    return v && *v ? v : def;
}

void fatal(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("cuda-emu: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    __atomic_add_fetch(&g_errors, 1, __ATOMIC_RELAXED);
    if (strcmp(env("EMU_ON_ERROR", "exit"), "count") != 0) {
        fflush(stdout);
        fflush(stderr);
        _exit(3);
    }
}

long error_count()
{
    return __atomic_load_n(&g_errors, __ATOMIC_RELAXED);
}

int orders(order_kind *out, int cap)
{
    const char *s = env("EMU_ORDERS", "fwd,rev,rand");
    int n = 0;
    while (*s && n < cap) {
        size_t len = strcspn(s, ",");
        if (len == 3 && strncmp(s, "fwd", 3) == 0)
            out[n++] = ORDER_FWD;
        else if (len == 3 && strncmp(s, "rev", 3) == 0)
            out[n++] = ORDER_REV;
        else if (len == 4 && strncmp(s, "rand", 4) == 0)
            out[n++] = ORDER_RAND;
        else {
            fprintf(stderr, "cuda-emu: EMU_ORDERS: unknown order '%.*s' (expected fwd, rev, rand)\n",
                    (int)len, s);
            _exit(2);
        }
        s += len + (s[len] == ',');
    }
    if (n == 0)
        out[n++] = ORDER_FWD;
    return n;
}

uint64_t seed()
{
    return strtoull(env("EMU_SEED", "1"), nullptr, 10);
}

bool verbose()
{
    static int v = -1;
    if (v < 0)
        v = strcmp(env("EMU_VERBOSE", "0"), "1") == 0;
    return v == 1;
}

} // namespace emu
