/* ops_executors: the executors the op conformance suite (tests/ops) runs
 * every case on. The CPU executor is always there; others register in
 * ops_executors.c under their build flag. */
#ifndef PG_OPS_EXECUTORS_H
#define PG_OPS_EXECUTORS_H

#include <stdint.h>

#include "executor.h"
#include "pg_error.h"

typedef struct ops_executor_entry {
    const char *name;
    /* Creates the executor with its default settings. PG_EUNSUPPORTED means
     * "not available on this machine" (e.g. no GPU): the suite prints SKIP. */
    int (*create)(executor **out, pg_error *err);
} ops_executor_entry;

int32_t ops_executor_count(void);
const ops_executor_entry *ops_executor_get(int32_t i);

/* Tolerance of an executor's results relative to max |reference| of an
 * output: tight for f32 activations, loose for bf16/f16. */
double ops_executor_tolerance(const executor *ex);

#endif /* PG_OPS_EXECUTORS_H */
