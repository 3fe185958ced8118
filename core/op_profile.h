/* op_profile: where a run's forward time goes, op by op (--profile-ops).
 *
 * model_forward adds the wall time of every executor op it calls to the
 * op's total, kept apart for steps that prefill (any sequence with more
 * than one query token) and pure decode steps, whose costs differ in kind
 * (GEMMs vs GEMVs, attention over a chunk vs one row). The CPU executor
 * runs each op to completion before it returns, so these are the op's own
 * times; an asynchronous executor (CUDA) would report launch times, so the
 * CLI offers the profile on the CPU only.
 *
 * Owned by whoever creates it (the CLI); the model borrows it
 * (model_set_op_profile) and is the only writer. Not thread-safe: one
 * model, one thread, like model_forward itself.
 */
#ifndef PG_OP_PROFILE_H
#define PG_OP_PROFILE_H

#include <stdint.h>
#include <stdio.h>

/* The ops of one step, in the order the forward runs them. */
typedef enum op_profile_op {
    OPP_EMBED = 0,
    OPP_INPUT_NORM,  /* input rmsnorm (+ the previous layer's residual add) */
    OPP_QKV,
    OPP_ROPE,
    OPP_KV_WRITE,
    OPP_ATTENTION,
    OPP_O,
    OPP_POST_NORM,   /* post-attention rmsnorm (+ residual add) */
    OPP_GATE_UP,
    OPP_SILU_MUL,
    OPP_DOWN,
    OPP_MOE_ROUTER,  /* MoE layers: router matmul + routing */
    OPP_MOE_EXPERTS, /* MoE layers: the routed experts (+ the shared expert) */
    OPP_HEAD,        /* gather rows, final rmsnorm, lm_head, logits to the host */
    OPP_COUNT
} op_profile_op;

/* Step kinds, kept apart. */
enum { OPP_PREFILL = 0, OPP_DECODE = 1, OPP_KINDS = 2 };

typedef struct op_profile {
    double seconds[OPP_KINDS][OPP_COUNT]; /* summed over the layers and steps */
    int64_t steps[OPP_KINDS];
    int64_t tokens[OPP_KINDS];            /* query tokens of those steps */
} op_profile;

/* Monotonic wall clock in seconds. */
double op_profile_now(void);

/* The op's printed name ("qkv matmul", ...). */
const char *op_profile_name(op_profile_op op);

/* Writes the table: per kind, each op's total ms, us per token and share of
 * the kind's forward time, then the kind's total. Kinds with no steps are
 * left out; nothing is written when there are none at all. */
void op_profile_print(const op_profile *p, FILE *f, const char *prefix);

#endif /* PG_OP_PROFILE_H */
