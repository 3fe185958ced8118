/* op_profile: see op_profile.h. */
#include "op_profile.h"

#include <time.h>

double op_profile_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

const char *op_profile_name(op_profile_op op)
{
    static const char *const names[OPP_COUNT] = {
        "embed",   "input rmsnorm", "qkv matmul",    "rope",           "kv_write",  "attention",
        "o matmul", "post rmsnorm", "gate_up matmul", "silu_mul",      "down matmul", "moe router",
        "moe experts", "head (norm, lm_head)"};
    return (unsigned)op < OPP_COUNT ? names[op] : "?";
}

void op_profile_print(const op_profile *p, FILE *f, const char *prefix)
{
    static const char *const kinds[OPP_KINDS] = {"steps with prefill", "decode steps"};
    for (int k = 0; k < OPP_KINDS; k++) {
        if (p->steps[k] == 0)
            continue;
        double total = 0.0;
        for (int op = 0; op < OPP_COUNT; op++)
            total += p->seconds[k][op];
        const double tokens = p->tokens[k] > 0 ? (double)p->tokens[k] : 1.0;
        fprintf(f, "%sop profile, %s: %lld steps, %lld tokens, %.1f ms in the forward (%.1f us/token)\n", prefix,
                kinds[k], (long long)p->steps[k], (long long)p->tokens[k], total * 1e3, total * 1e6 / tokens);
        for (int op = 0; op < OPP_COUNT; op++) {
            const double s = p->seconds[k][op];
            fprintf(f, "%s  %-22s %10.1f ms %10.2f us/token %6.1f%%\n", prefix, op_profile_name((op_profile_op)op),
                    s * 1e3, s * 1e6 / tokens, total > 0.0 ? 100.0 * s / total : 0.0);
        }
    }
}
