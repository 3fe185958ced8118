/* tests/cuda_emu/test_cli_device_emu: the measured cuda KV plan of
 * cli_model_create (cli/device.c) on the emulated device, whose
 * cudaMemGetInfo meters every cudaMalloc: the probe model is loaded, the
 * profile step (the largest step) runs through the real cuda executor and
 * its kernels, what it leaves allocated (the executor's logits, metadata and
 * GEMM padding buffers) is measured and counted as in use, and the plan
 * follows vLLM's rule from those numbers (stories260K from the shared test
 * data). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "config.h"
#include "cuda_executor.h"
#include "device.h"
#include "model.h"
#include "options.h"
#include "safetensors.h"
#include "test_support.h"

static void parse(cli_options *o, int argc, char **argv)
{
    pg_error err;
    if (cli_options_parse(o, argc, argv, &err) != PG_OK)
        fail_msg("parse: %s", err.msg);
}

static size_t free_now(executor *ex)
{
    size_t f = 0, t = 0;
    assert_int_equal(ex->op->mem_info(ex, &f, &t), PG_OK);
    return f;
}

/* Plans on a fresh emulated executor with --max-num-seqs 8
 * --max-num-batched-tokens 40 (a profile step of 8 sequences of 5 tokens)
 * and the utilization `util`; checks the numbers against the device's meter
 * and vLLM's rule. */
static void plan_once(const llama_config *cfg, const st_file *w, const char *util, cli_kv_plan *plan)
{
    pg_error err;
    executor *ex = NULL;
    cuda_executor_params p = cuda_executor_params_default();
    if (cuda_executor_create(&ex, &p, &err))
        fail_msg("cuda_executor_create: %s", err.msg);
    const size_t free_open = free_now(ex);
    cli_options o;
    char *argv[] = {(char *)"pagedgen", (char *)"-m", (char *)"d", (char *)"--max-num-seqs", (char *)"8",
                    (char *)"--max-num-batched-tokens", (char *)"40",
                    (char *)"--gpu-memory-utilization", (char *)util, NULL};
    parse(&o, 9, argv);
    model *m = NULL;
    if (cli_model_create(&m, plan, &o, ex, cfg, w, 512, &err) != PG_OK)
        fail_msg("cli_model_create: %s", err.msg);
    assert_true(plan->measured);
    const size_t bpb = plan->bytes_per_block;
    /* the step grew the executor's buffers: at least the logits [8][V] f32 */
    assert_true(plan->profile_bytes >= (uint64_t)8 * (uint64_t)cfg->vocab_size * 4u);
    assert_true(plan->load_bytes == free_open - plan->free_after_load_bytes);
    /* the final model holds the load (its pool counted as one block) and
     * the rest of its pool; the profile's buffers stay allocated */
    assert_true(free_now(ex) ==
                plan->free_after_load_bytes - plan->profile_bytes - (size_t)(plan->num_blocks - 1) * bpb);
    double used = (double)(plan->total_bytes - plan->free_after_load_bytes + plan->profile_bytes);
    double budget = strtod(util, NULL) * (double)plan->total_bytes - used - (double)plan->reserve_bytes;
    int64_t want = (int64_t)(budget / (double)bpb), cap = 8 * 32;
    assert_int_equal(plan->num_blocks, want < cap ? want : cap);
    model_destroy(m);
    ex->op->destroy(ex);
}

static void test_measured_plan_emu(void **state)
{
    (void)state;
    pg_error err;
    llama_config cfg;
    st_file *w = NULL;
    const char *dir = pg_test_shared_path("models/stories260K");
    if (llama_config_load(&cfg, dir, &err) != PG_OK || st_open(&w, dir, &err) != PG_OK)
        fail_msg("%s", err.msg);
    cli_kv_plan plan;
    plan_once(&cfg, w, "0.9", &plan);
    assert_int_equal(plan.capped_to, 256); /* 0.9 x 4 GiB: room for far more */
    /* a utilization that leaves room for 100.5 blocks by the first run's
     * numbers: 100 blocks, and one profile's worth fewer would be wrong */
    const double bpb = (double)plan.bytes_per_block;
    double need = (double)(plan.total_bytes - plan.free_after_load_bytes + plan.profile_bytes) +
                  (double)plan.reserve_bytes + 100.5 * bpb;
    char util[32];
    snprintf(util, sizeof util, "%.7f", need / (double)plan.total_bytes);
    plan_once(&cfg, w, util, &plan);
    assert_int_equal(plan.capped_to, 0);
    assert_true(plan.num_blocks >= 99 && plan.num_blocks <= 101);
    assert_true((double)plan.profile_bytes > 2.0 * bpb); /* so the profile changed the plan */
    st_close(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_measured_plan_emu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
