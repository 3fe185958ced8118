/* isa_digest: a digest of the CPU executor's results on stories260K, for
 * test_isa_identity to compare across builds of cpu/ for different x86-64
 * levels (tests/ops/meson.build links this file against each), across GEMM
 * variants and across glibc's libm variants (GLIBC_TUNABLES set by the
 * caller). The model exercises every op the CPU executor has: embed,
 * rmsnorm, matmul (fused QKV, O, gate|up, down), rope, kv_write, paged
 * attention (GQA), silu_mul, gather_rows, logits.
 *
 *   isa_digest <auto|generic|avx2|avx512> [exact|bf16|int8]
 *
 * The second argument picks the matmul precision (cpu_gemm_modes.h; bf16
 * stores the weights bf16, int8 int8), exact by default.
 * Prints "digest <16 hex digits>" (FNV-1a over the logits bytes after every
 * logits-golden and greedy-golden prompt, run as one prefill and as one
 * token per step) and "gemm <variant> <mode> kernel <the mode's kernel,
 * cpu_gemm_mode_kernel_name>". Exit 77 (skip) when the variant
 * cannot run here or the test data is absent. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cpu_executor.h"
#include "cpu_gemm.h"
#include "cpu_gemm_modes.h"
#include "golden_support.h"

typedef struct digest_args {
    cpu_gemm_variant variant;
    cpu_matmul_precision precision;
} digest_args;

static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static void test_digest(void **state)
{
    const digest_args *a = *state;
    pg_golden_set set;
    if (pg_golden_set_load(&set) != 0) {
        pg_golden_set_free(&set);
        fail_msg("stories260K: cannot load the model");
    }
    pg_error err = {{0}};
    executor *ex = NULL;
    cpu_executor_params cp = {.threads = 2, .gemm_variant = (int32_t)a->variant,
                              .matmul_precision = (int32_t)a->precision};
    if (a->precision == CPU_MATMUL_BF16)
        cp.wt_dtype = CPU_WT_BF16;
    else if (a->precision == CPU_MATMUL_INT8)
        cp.wt_dtype = CPU_WT_I8;
    if (cpu_executor_create(&ex, &cp, &err) != 0)
        fail_msg("cpu executor: %s", err.msg);
    const int32_t bs = 16, V = set.cfg.vocab_size;
    model_params mp = {.num_kv_blocks = 64, .block_size = bs, .max_num_batched_tokens = 512, .max_num_seqs = 4};
    model *m = NULL;
    if (model_create(&m, ex, &set.cfg, set.st, &mp, &err) != 0)
        fail_msg("model_create: %s", err.msg);
    float *logits = malloc((size_t)V * sizeof *logits);
    assert_non_null(logits);
    uint64_t h = 1469598103934665603ull;
    for (int k = 0; k < set.n_lg + set.n_g; k++) {
        const int32_t *ids = k < set.n_lg ? set.lg[k].prompt_ids : set.g[k - set.n_lg].prompt_ids;
        const int32_t n = k < set.n_lg ? set.lg[k].n_prompt : set.g[k - set.n_lg].n_prompt;
        if (n > mp.num_kv_blocks * bs || n > mp.max_num_batched_tokens)
            continue;
        pg_golden_run_prompt(m, ids, n, n, bs, logits);
        h = fnv1a(h, logits, (size_t)V * sizeof *logits);
        pg_golden_run_prompt(m, ids, n, 1, bs, logits);
        h = fnv1a(h, logits, (size_t)V * sizeof *logits);
    }
    printf("gemm %s %s kernel %s\ndigest %016llx\n",
           cpu_gemm_variant_name(a->variant == CPU_GEMM_AUTO ? cpu_gemm_variant_best() : a->variant),
           cpu_matmul_precision_name(a->precision), cpu_gemm_mode_kernel_name(a->precision, a->variant),
           (unsigned long long)h);
    fflush(stdout);
    free(logits);
    model_destroy(m);
    ex->op->destroy(ex);
    pg_golden_set_free(&set);
}

int main(int argc, char **argv)
{
    digest_args a = {CPU_GEMM_VARIANT_COUNT, argc == 3 ? CPU_MATMUL_COUNT : CPU_MATMUL_EXACT};
    for (int v = 0; (argc == 2 || argc == 3) && v < (int)CPU_GEMM_VARIANT_COUNT; v++)
        if (strcmp(argv[1], cpu_gemm_variant_name((cpu_gemm_variant)v)) == 0)
            a.variant = (cpu_gemm_variant)v;
    for (int p = 0; argc == 3 && p < (int)CPU_MATMUL_COUNT; p++)
        if (strcmp(argv[2], cpu_matmul_precision_name((cpu_matmul_precision)p)) == 0)
            a.precision = (cpu_matmul_precision)p;
    if (a.variant == CPU_GEMM_VARIANT_COUNT || a.precision == CPU_MATMUL_COUNT) {
        fprintf(stderr, "usage: isa_digest auto|generic|avx2|avx512 [exact|bf16|int8]\n");
        return 2;
    }
    if (!cpu_gemm_variant_available(a.variant)) {
        printf("SKIP gemm variant %s: this CPU does not run it\n", argv[1]);
        return 77;
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test_prestate(test_digest, &a)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
