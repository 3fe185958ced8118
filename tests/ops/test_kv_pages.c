/* test_kv_pages: the CPU KV buffer's huge pages grown with the run
 * (cpu_executor.c cpu_kv_pages, issue 34 item 3): the ranges asked for
 * huge pages (cpu_kv_tail_range, by hand), and a buffer of two planes
 * written first at its leading slots and then past the lead — what it
 * holds is the same at every stage (the madvise calls, MADV_COLLAPSE
 * included, never change the data); where the kernel has transparent huge
 * pages in madvise mode, the small run's slots are in 4 KiB pages. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "cpu_executor.h"
#include "cpu_ops.h"
#include "test_support.h"

#define MIB ((uintptr_t)1 << 20)

static void test_tail_range(void **state)
{
    (void)state;
    uintptr_t lo = 0, hi = 0;
    /* a plane starting on a 2 MiB boundary: lead 2 MiB */
    assert_true(cpu_kv_tail_range(64 * MIB, 40 * MIB, &lo, &hi));
    assert_int_equal(lo, 66 * MIB);
    assert_int_equal(hi, 104 * MIB);
    /* starting 12 KiB past one: the lead runs to the second boundary after */
    assert_true(cpu_kv_tail_range(64 * MIB + 12288, 40 * MIB, &lo, &hi));
    assert_int_equal(lo, 68 * MIB);
    assert_int_equal(hi, 104 * MIB + 12288);
    /* the end rounded down to a whole 4 KiB page */
    assert_true(cpu_kv_tail_range(64 * MIB, 40 * MIB + 100, &lo, &hi));
    assert_int_equal(hi, 104 * MIB);
    /* a plane that ends inside its lead: nothing */
    assert_false(cpu_kv_tail_range(64 * MIB, 2 * MIB, &lo, &hi));
    assert_false(cpu_kv_tail_range(64 * MIB + 4096, 3 * MIB, &lo, &hi));
    assert_true(cpu_kv_tail_range(64 * MIB + 4096, 4 * MIB, &lo, &hi));
    assert_int_equal(lo, 68 * MIB);
    assert_int_equal(hi, 68 * MIB + 4096);
}

/* Resident and AnonHugePages kB of the mappings inside [lo, hi). */
static void smaps_of(uintptr_t lo, uintptr_t hi, long *rss_kb, long *huge_kb)
{
    *rss_kb = *huge_kb = 0;
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f)
        return;
    char line[512];
    int in = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long a, b;
        char c;
        long v;
        if (sscanf(line, "%lx-%lx%c", &a, &b, &c) == 3 && c == ' ')
            in = a < hi && b > lo; /* (the first mapping also holds malloc's header) */
        else if (in && sscanf(line, "Rss: %ld kB", &v) == 1)
            *rss_kb += v;
        else if (in && sscanf(line, "AnonHugePages: %ld kB", &v) == 1)
            *huge_kb += v;
    }
    fclose(f);
}

static int thp_madvise_mode(void)
{
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    char buf[128] = "";
    if (!f)
        return 0;
    if (!fgets(buf, sizeof buf, f))
        buf[0] = '\0';
    fclose(f);
    return strstr(buf, "[madvise]") != NULL;
}

/* One token per slot of `slots`: k = slot + 0.25 * i, v = -(slot + 0.5 * i). */
static void write_slots(executor *ex, char *kv, size_t plane, const int32_t *slots, int32_t T,
                        int32_t nkv, int32_t hd)
{
    const int32_t nh = nkv, width = (nh + 2 * nkv) * hd;
    float *qkv = calloc((size_t)T * (size_t)width, sizeof *qkv);
    assert_non_null(qkv);
    for (int32_t t = 0; t < T; t++)
        for (int32_t i = 0; i < nkv * hd; i++) {
            qkv[(size_t)t * width + (size_t)nh * hd + i] = (float)slots[t] + 0.25f * (float)i;
            qkv[(size_t)t * width + (size_t)(nh + nkv) * hd + i] = -((float)slots[t] + 0.5f * (float)i);
        }
    void *dq = ex->op->alloc(ex, EXEC_ACT, (size_t)T * (size_t)width);
    assert_non_null(dq);
    assert_int_equal(ex->op->upload(ex, dq, EXEC_ACT, 0, qkv, ST_F32, (size_t)T * (size_t)width), 0);
    int32_t *pos = calloc((size_t)T, sizeof *pos);
    int32_t qs[2] = {0, T}, lens[1] = {T};
    for (int32_t t = 0; t < T; t++)
        pos[t] = t;
    step_batch b = {.num_tokens = T, .num_seqs = 1, .block_size = 16, .positions = pos, .slots = slots,
                    .query_start = qs, .seq_lens = lens};
    assert_int_equal(ex->op->kv_write(ex, kv, kv + plane, dq, nh, nkv, hd, &b), 0);
    ex->op->free(ex, dq);
    free(pos);
    free(qkv);
}

static void check_slot(executor *ex, const char *kv, size_t plane, int32_t slot, int32_t nkv, int32_t hd)
{
    const size_t w = (size_t)nkv * (size_t)hd;
    float got[256];
    assert_true(w <= 256);
    for (int p = 0; p < 2; p++) {
        assert_int_equal(ex->op->download_f32(ex, got, kv + (size_t)p * plane + (size_t)slot * w * sizeof(float),
                                              EXEC_KV, w), 0);
        for (size_t i = 0; i < w; i++) {
            const float want = p == 0 ? (float)slot + 0.25f * (float)i : -((float)slot + 0.5f * (float)i);
            if (got[i] != want)
                fail_msg("plane %d slot %d element %zu: expected %g, got %g", p, (int)slot, i, (double)want,
                         (double)got[i]);
        }
    }
}

static void test_grow_keeps_data(void **state)
{
    (void)state;
    const int32_t nkv = 2, hd = 64; /* 512 bytes a slot (f32 KV) */
    const size_t slot_bytes = (size_t)nkv * hd * sizeof(float), plane = 16 * MIB;
    cpu_executor_params cp = {.threads = 2};
    executor *ex = NULL;
    pg_error err = {{0}};
    assert_int_equal(cpu_executor_create(&ex, &cp, &err), 0);
    char *kv = ex->op->alloc(ex, EXEC_KV, 2 * plane / sizeof(float));
    assert_non_null(kv);
    /* a small run: the leading slots of both planes */
    int32_t small[32];
    for (int32_t t = 0; t < 32; t++)
        small[t] = t;
    write_slots(ex, kv, plane, small, 32, nkv, hd);
    long rss = 0, huge = 0;
    smaps_of((uintptr_t)kv, (uintptr_t)kv + 2 * plane, &rss, &huge);
    if (thp_madvise_mode()) {
        assert_int_equal(huge, 0); /* 4 KiB pages: 16 KiB a plane, not 2 MiB */
        assert_true(rss < 1024);
    }
    for (int32_t t = 0; t < 32; t++)
        check_slot(ex, kv, plane, t, nkv, hd);
    /* past the lead (2 MiB = 4096 slots): the leads collapse; same data */
    const int32_t far = (int32_t)(3 * MIB / slot_bytes) + 5;
    int32_t big[2] = {40, far};
    write_slots(ex, kv, plane, big, 2, nkv, hd);
    for (int32_t t = 0; t < 32; t++)
        check_slot(ex, kv, plane, t, nkv, hd);
    check_slot(ex, kv, plane, 40, nkv, hd);
    check_slot(ex, kv, plane, far, nkv, hd);
    /* and a write after that still lands */
    int32_t later[1] = {far + 1000};
    write_slots(ex, kv, plane, later, 1, nkv, hd);
    check_slot(ex, kv, plane, far + 1000, nkv, hd);
    check_slot(ex, kv, plane, 3, nkv, hd);
    ex->op->free(ex, kv);
    ex->op->destroy(ex);
}

int main(int argc, char **argv)
{
    (void)argc;
    /* glibc's MALLOC_PERTURB_ (meson test sets it) fills every fresh
     * allocation, so every page of the buffer would be resident before the
     * first write: run again without it */
    if (getenv("MALLOC_PERTURB_")) {
        unsetenv("MALLOC_PERTURB_");
        execv("/proc/self/exe", argv);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tail_range),
        cmocka_unit_test(test_grow_keeps_data),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
