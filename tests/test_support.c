/* test_support: see test_support.h. */
#include "test_support.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static char shared_dir[4096];
static char path_buf[4096];

const char *pg_test_source_root(void)
{
    const char *s = getenv("PAGEDGEN_SOURCE_ROOT");
    return (s && *s) ? s : ".";
}

const char *pg_test_build_root(void)
{
    const char *s = getenv("PAGEDGEN_BUILD_ROOT");
    return (s && *s) ? s : ".";
}

const char *pg_test_shared_dir(void)
{
    if (shared_dir[0])
        return shared_dir;
    const char *env = getenv("PAGEDGEN_SHARED");
    if (env && *env)
        snprintf(shared_dir, sizeof shared_dir, "%s", env);
    else
        snprintf(shared_dir, sizeof shared_dir, "%s/../shared", pg_test_source_root());
    struct stat st;
    if (stat(shared_dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        const char *ci = getenv("CI");
        if (ci && strcmp(ci, "true") == 0) {
            fprintf(stderr, "FAIL: test data folder %s is missing (CI=true: this is an error; set PAGEDGEN_SHARED)\n", shared_dir);
            exit(1);
        }
        fprintf(stderr, "SKIP: test data folder %s is missing (set PAGEDGEN_SHARED)\n", shared_dir);
        exit(PG_TEST_SKIP);
    }
    return shared_dir;
}

const char *pg_test_shared_path(const char *rel)
{
    snprintf(path_buf, sizeof path_buf, "%s/%s", pg_test_shared_dir(), rel);
    return path_buf;
}

char *pg_test_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    size_t cap = 0, n = 0;
    for (;;) {
        if (n + 65536 + 1 > cap) {
            cap = cap ? cap * 2 : 131072;
            char *p = realloc(buf, cap);
            if (!p) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = p;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0)
            break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    if (len)
        *len = n;
    return buf;
}

uint64_t pg_test_rng_next(pg_test_rng *r)
{
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

float pg_test_rng_uniform(pg_test_rng *r, float lo, float hi)
{
    float u = (float)(pg_test_rng_next(r) >> 40) * (1.0f / 16777216.0f);
    return lo + (hi - lo) * u;
}

int pg_test_rng_int(pg_test_rng *r, int lo, int hi)
{
    uint64_t span = (uint64_t)((int64_t)hi - lo + 1);
    return lo + (int)(pg_test_rng_next(r) % span);
}

void pg_test_fill_uniform(pg_test_rng *r, float *x, size_t n, float lo, float hi)
{
    for (size_t i = 0; i < n; i++)
        x[i] = pg_test_rng_uniform(r, lo, hi);
}

void pg_test_logits_row(pg_test_rng *r, float *x, int32_t V, int kind)
{
    float scale = kind % 3 == 0 ? 0.05f : (kind % 3 == 1 ? 2.0f : 8.0f);
    for (int32_t v = 0; v < V; v++) {
        float u = pg_test_rng_uniform(r, -1.0f, 1.0f) + pg_test_rng_uniform(r, -1.0f, 1.0f);
        x[v] = u * scale;
        if (kind & 4)
            x[v] = roundf(x[v] * 4.0f) * 0.25f; /* ties */
    }
    if (kind & 8) {
        for (int k = 0; k < 1 + V / 50; k++)
            x[pg_test_rng_int(r, 0, V - 1)] = -INFINITY;
        x[pg_test_rng_int(r, 0, V - 1)] = NAN;
        if (kind & 16)
            x[pg_test_rng_int(r, 0, V - 1)] = INFINITY;
    }
}
