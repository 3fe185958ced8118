/* cuda_step_profile: see cuda_step_profile.h. */
#include "cuda_step_profile.h"

#include <stdlib.h>

#include "cuda_kernels.h"

struct cuda_sprof {
    step_profile *p;          /* borrowed, NULL: off */
    cudaEvent_t *ev;          /* [cap] created on demand, reused every step */
    int *op;                  /* [cap] the op each event ends (-1: the start) */
    int32_t cap, n_created;
    int32_t n;                /* events recorded in this step's eager forward */
    int eager;                /* an eager forward started in this run_step */
    int broken;               /* a runtime call failed: no op times for this step */
    uint64_t launch0;         /* launches at the forward's start */
};

int cuda_sprof_set(cuda_sprof **s, step_profile *p)
{
    if (!*s) {
        if (!p)
            return PG_OK;
        if (!(*s = calloc(1, sizeof **s)))
            return PG_ENOMEM;
    }
    (*s)->p = p;
    (*s)->n = 0;
    (*s)->eager = 0;
    return PG_OK;
}

step_profile *cuda_sprof_profile(const cuda_sprof *s)
{
    return s ? s->p : NULL;
}

/* Room for one more event; 0 or -1. */
static int grow(cuda_sprof *s)
{
    if (s->n < s->n_created)
        return 0;
    if (s->n == s->cap) {
        int32_t cap = s->cap ? 2 * s->cap : 64;
        cudaEvent_t *ev = realloc(s->ev, (size_t)cap * sizeof *ev);
        if (!ev)
            return -1;
        s->ev = ev;
        int *op = realloc(s->op, (size_t)cap * sizeof *op);
        if (!op)
            return -1;
        s->op = op;
        s->cap = cap;
    }
    if (cudaEventCreate(&s->ev[s->n_created]) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    s->n_created++;
    return 0;
}

void cuda_sprof_mark(cuda_sprof *s, int op, cudaStream_t st, int bound, uint64_t launches)
{
    if (!s || !s->p)
        return;
    step_profile *p = s->p;
    if (op < 0) {
        s->launch0 = launches;
        if (!bound) { /* a capture records no events: op times of eager forwards only */
            s->eager = 1;
            s->broken = 0;
            s->n = 0;
        }
    } else {
        p->launches[p->kind] = (int64_t)(launches - s->launch0);
    }
    if (bound || !s->eager || s->broken)
        return;
    if (grow(s) != 0 || cudaEventRecord(s->ev[s->n], st) != cudaSuccess) {
        (void)cudaGetLastError();
        s->broken = 1;
        return;
    }
    s->op[s->n++] = op;
}

void cuda_sprof_step_done(cuda_sprof *s, int rc)
{
    if (!s || !s->p)
        return;
    step_profile *p = s->p;
    const int k = p->kind;
    if (!rc && !s->eager) {
        p->graph_steps[k]++;
    } else if (!rc && !s->broken && s->n >= 2) {
        /* after the logits' synchronization this returns at once; a step
         * without logits waits here for its last op */
        const double t0 = step_profile_now();
        cudaError_t e = cudaEventSynchronize(s->ev[s->n - 1]);
        step_profile_add(p, SP_WAIT, t0);
        double ms_op[OPP_COUNT] = {0};
        for (int32_t i = 1; i < s->n && e == cudaSuccess; i++) {
            float ms = 0.0f;
            e = cudaEventElapsedTime(&ms, s->ev[i - 1], s->ev[i]);
            if (s->op[i] >= 0 && s->op[i] < OPP_COUNT)
                ms_op[s->op[i]] += (double)ms;
        }
        if (e == cudaSuccess) {
            for (int op = 0; op < OPP_COUNT; op++)
                p->op_dev_ms[k][op] += ms_op[op];
            for (int32_t i = 1; i < s->n; i++)
                if (s->op[i] >= 0 && s->op[i] < OPP_COUNT)
                    p->op_marks[k][s->op[i]]++;
            p->op_steps[k]++;
        } else {
            (void)cudaGetLastError();
        }
    }
    s->n = 0;
    s->eager = 0;
    s->broken = 0;
}

void cuda_sprof_destroy(cuda_sprof *s)
{
    if (!s)
        return;
    for (int32_t i = 0; i < s->n_created; i++)
        cudaEventDestroy(s->ev[i]);
    free(s->ev);
    free(s->op);
    free(s);
}
