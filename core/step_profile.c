/* step_profile: see step_profile.h. */
#include "step_profile.h"

#include <string.h>
#include <time.h>

void step_profile_init(step_profile *p, int32_t n_layers)
{
    memset(p, 0, sizeof *p);
    for (int k = 0; k < OPP_KINDS; k++)
        p->launches[k] = -1;
    p->n_layers = n_layers;
}

double step_profile_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

const char *step_profile_phase_name(step_phase ph)
{
    static const char *const names[SP_COUNT] = {"schedule", "metadata", "h2d copy", "launch",
                                                "next step ahead", "wait for device", "d2h copy", "sample",
                                                "output"};
    return (unsigned)ph < SP_COUNT ? names[ph] : "?";
}

void step_profile_add(step_profile *p, step_phase ph, double t0)
{
    if (p && (unsigned)ph < SP_COUNT)
        p->cur[ph] += step_profile_now() - t0;
}

void step_profile_print(const step_profile *p, FILE *f, const char *prefix)
{
    static const char *const kinds[OPP_KINDS] = {"steps with prefill", "decode steps"};
    for (int k = 0; k < OPP_KINDS; k++) {
        if (p->steps[k] == 0)
            continue;
        const double n = (double)p->steps[k];
        const double step_ms = p->step_s[k] * 1e3 / n;
        fprintf(f, "%sstep profile, %s: %lld steps, %.1f sequences per step, %.3f ms per step "
                   "(%lld run as graph replays)\n", prefix, kinds[k], (long long)p->steps[k],
                (double)p->seqs[k] / n, step_ms, (long long)p->graph_steps[k]);
        double sum = 0.0;
        for (int ph = 0; ph < SP_COUNT; ph++) {
            const double ms = p->phase_s[k][ph] * 1e3 / n;
            sum += ms;
            fprintf(f, "%s  %-16s %10.3f ms/step %6.1f%%\n", prefix,
                    step_profile_phase_name((step_phase)ph), ms,
                    step_ms > 0.0 ? 100.0 * ms / step_ms : 0.0);
        }
        const double rest = step_ms - sum;
        fprintf(f, "%s  %-16s %10.3f ms/step %6.1f%%\n", prefix, "(between phases)", rest,
                step_ms > 0.0 ? 100.0 * rest / step_ms : 0.0);
        if (p->op_steps[k] > 0) {
            const double m = (double)p->op_steps[k];
            const double nl = p->n_layers > 0 ? (double)p->n_layers : 1.0;
            double dev = 0.0;
            for (int op = 0; op < OPP_COUNT; op++)
                dev += p->op_dev_ms[k][op];
            fprintf(f, "%s  device time per op (cuda events, %lld eager steps): %.3f ms per step\n",
                    prefix, (long long)p->op_steps[k], dev / m);
            for (int op = 0; op < OPP_COUNT; op++) {
                if (p->op_marks[k][op] == 0)
                    continue; /* not an op of this model (a dense model's moe rows) */
                const double ms = p->op_dev_ms[k][op] / m;
                /* embed and the head run once a step, the others once a layer */
                const double share = dev > 0.0 ? 100.0 * ms * m / dev : 0.0;
                if (op != OPP_EMBED && op != OPP_HEAD)
                    fprintf(f, "%s    %-22s %10.1f us/step %10.2f us/layer %6.1f%%\n", prefix,
                            op_profile_name((op_profile_op)op), ms * 1e3, ms * 1e3 / nl, share);
                else
                    fprintf(f, "%s    %-22s %10.1f us/step %19s %6.1f%%\n", prefix,
                            op_profile_name((op_profile_op)op), ms * 1e3, "once a step", share);
            }
        }
    }
    if (p->launches[OPP_DECODE] >= 0)
        fprintf(f, "%skernel launches per decode step: %lld (%d layers)\n", prefix,
                (long long)p->launches[OPP_DECODE], (int)p->n_layers);
    else /* the cpu executor, or no decode step ran op by op */
        fprintf(f, "%skernel launches per decode step: n/a (%d layers)\n", prefix, (int)p->n_layers);
}
