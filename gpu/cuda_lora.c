/* cuda_lora: the table's lora_add (core/executor.h) — one projection's LoRA
 * deltas for every row of the step, the rows' adapter slots read by the
 * kernels from the step's metadata on the device (begin_step copies
 * step_batch.lora_slots; a graphed step's fixed block always has them).
 * The slots are launched in tables of PGK_LORA_SLOTS (lora.cu: shrink, then
 * expand, per table); a table none of whose slots adapts the projection
 * launches nothing. See cuda_exec_internal.h. */
#include <math.h>
#include <string.h>

#include "cuda_exec_internal.h"

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* c->lora_sig over one call's values a graph would capture: the shapes and
 * each slot's A, B, scale and rank (NULL A: the slot only). Before the
 * argument checks of the slots: a call that fails is hashed too. */
static void lora_sig_call(cuda_exec *c, int32_t ldy, int32_t K, int32_t N, const void *const *A,
                          const void *const *B, const float *scale, const int32_t *rank,
                          int32_t n_slots)
{
    const int32_t dims[4] = {ldy, K, N, n_slots};
    uint64_t h = fnv(c->lora_sig, dims, sizeof dims);
    for (int32_t a = 0; a < n_slots; a++) {
        const uintptr_t p[2] = {(uintptr_t)A[a], A[a] ? (uintptr_t)B[a] : 0};
        h = fnv(h, p, sizeof p);
        if (A[a]) {
            h = fnv(h, &scale[a], sizeof scale[a]);
            h = fnv(h, &rank[a], sizeof rank[a]);
        }
    }
    c->lora_sig = h;
    c->lora_calls++;
}

int cx_lora_add(executor *ex, void *y, int32_t ldy, const void *x, int32_t K, int32_t N,
                const void *const *A, const void *const *B, const float *scale,
                const int32_t *rank, int32_t n_slots, const step_batch *b)
{
    cuda_exec *c = cx(ex);
    if (n_slots < 0 || K < 1 || N < 1 || ldy < N || !b)
        return pg_error_set(&c->err, PG_EINVAL,
                            "cuda lora_add: expected n_slots >= 0, K, N >= 1 and ldy >= N, got "
                            "n_slots %d, K %d, N %d, ldy %d", (int)n_slots, (int)K, (int)N, (int)ldy);
    lora_sig_call(c, ldy, K, N, A, B, scale, rank, n_slots);
    if (!b->lora_slots || n_slots == 0)
        return 0; /* no row of the step has an adapter */
    const pgk_batch *d = NULL;
    int rc = cx_step_batch_dev(c, b, "lora_add", &d);
    if (rc)
        return rc;
    if (!d->lora_slots)
        return pg_error_set(&c->err, PG_EINVAL,
                            "cuda lora_add: the step has lora_slots but its begin_step copied none");
    const int32_t T = b->num_tokens;
    /* the host's copy of the slots: checked, never used to choose the work
     * (a graph replays for other slots) */
    for (int32_t t = 0; t < T; t++)
        if (b->lora_slots[t] < -1 || b->lora_slots[t] >= n_slots)
            return pg_error_set(&c->err, PG_EINVAL,
                                "cuda lora_add: lora_slots[%d] = %d: expected -1 .. %d", (int)t,
                                (int)b->lora_slots[t], (int)n_slots - 1);
    int32_t rmax = 0;
    for (int32_t a = 0; a < n_slots; a++) {
        if (!A[a])
            continue;
        if (!B[a] || rank[a] < 1 || rank[a] > PG_LORA_MAX_RANK || !isfinite(scale[a]))
            return pg_error_set(&c->err, PG_EINVAL,
                                "cuda lora_add: slot %d: expected B, a rank of 1 .. %d and a finite "
                                "scale with A, got B %p, rank %d, scale %g", (int)a, PG_LORA_MAX_RANK,
                                (const void *)B[a], (int)rank[a], (double)scale[a]);
        rmax = rank[a] > rmax ? rank[a] : rmax;
    }
    if (rmax == 0)
        return 0; /* no slot adapts this projection */
    /* u [T][rmax]: a graph's fixed scratch (sized for PG_LORA_MAX_RANK at
     * the warm-up), else the eager one grown on demand */
    void *u = NULL;
    const size_t u_bytes = (size_t)T * (size_t)rmax * pgk_dtype_bytes(c->act_dt);
    if (cx_graph_bound(c)) {
        u = c->graphs->lora_u_d;
        if (!u || c->graphs->lora_u_cap < u_bytes)
            return pg_error_set(&c->err, PG_EINVAL,
                                "cuda lora_add: graph scratch of %zu bytes, expected %zu",
                                c->graphs->lora_u_cap, u_bytes);
    } else {
        rc = cx_device_grow(c->stream, &c->lora_u_d, &c->lora_u_cap, u_bytes,
                            "cudaMalloc (lora scratch)", &c->err);
        if (rc)
            return rc;
        u = c->lora_u_d;
    }
    for (int32_t s0 = 0; s0 < n_slots; s0 += PGK_LORA_SLOTS) {
        pgk_lora_tab tab;
        memset(&tab, 0, sizeof tab);
        tab.slot0 = s0;
        tab.n = n_slots - s0 < PGK_LORA_SLOTS ? n_slots - s0 : PGK_LORA_SLOTS;
        int any = 0;
        for (int32_t i = 0; i < tab.n; i++) {
            if (!A[s0 + i])
                continue;
            tab.A[i] = A[s0 + i];
            tab.B[i] = B[s0 + i];
            tab.scale[i] = scale[s0 + i];
            tab.rank[i] = rank[s0 + i];
            any = 1;
        }
        /* the tables run one after the other: a row is in one table only, so
         * the order changes nothing */
        if (any && (rc = pgk_lora_add(y, ldy, x, u, c->act_dt, T, K, N, d->lora_slots, &tab, &c->lk)))
            return rc;
    }
    return 0;
}
