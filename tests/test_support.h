/* test_support: what every test binary shares — where the test data is,
 * reading files, deterministic random inputs. Tests use cmocka; a test
 * binary that cannot run here (no GPU, no test data outside CI) exits 77,
 * which meson reports as SKIP. */
#ifndef PG_TEST_SUPPORT_H
#define PG_TEST_SUPPORT_H

#include <stddef.h>
#include <stdint.h>

#define PG_TEST_SKIP 77

/* The test data folder: $PAGEDGEN_SHARED, else ../shared beside the source
 * root. If it is missing: with CI=true the process fails (exit 1) — CI must
 * have its data —, otherwise it prints why and exits 77 (skip). */
const char *pg_test_shared_dir(void);
/* pg_test_shared_dir()/rel into a static buffer (overwritten by the next call). */
const char *pg_test_shared_path(const char *rel);
/* $PAGEDGEN_BUILD_ROOT (the meson build dir) or "." */
const char *pg_test_build_root(void);
/* $PAGEDGEN_SOURCE_ROOT or "." */
const char *pg_test_source_root(void);

/* Reads a whole file (NUL-terminated, malloc'd); NULL on failure. */
char *pg_test_read_file(const char *path, size_t *len);

/* A small deterministic PRNG (splitmix64) for fresh random inputs. */
typedef struct pg_test_rng {
    uint64_t s;
} pg_test_rng;
uint64_t pg_test_rng_next(pg_test_rng *r);
float pg_test_rng_uniform(pg_test_rng *r, float lo, float hi); /* [lo, hi) */
int pg_test_rng_int(pg_test_rng *r, int lo, int hi);            /* [lo, hi] */
void pg_test_fill_uniform(pg_test_rng *r, float *x, size_t n, float lo, float hi);
/* A random logits row x [V] for sampler tests, by kind's bits: kind % 3
 * picks the scale (flat 0.05, 2, peaked 8), & 4 quantizes to quarters (ties),
 * & 8 adds a few -inf and one NaN, & 16 (with 8) one +inf. */
void pg_test_logits_row(pg_test_rng *r, float *x, int32_t V, int kind);

#endif /* PG_TEST_SUPPORT_H */
