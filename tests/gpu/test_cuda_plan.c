/* test_cuda_plan: the CUDA executor's host-side planning (gpu/cuda_plan.c),
 * built into this test directly so that it runs on every machine, with or
 * without CUDA: head sizes, decode partitions and shared memory, prefill
 * tiles, KV-cache sizing from --gpu-memory-utilization, graph buckets. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "cuda_plan.h"

static void test_head_dims(void **state)
{
    (void)state;
    const int32_t ok[] = {8, 16, 32, 64, 128, 256};
    const int32_t bad[] = {0, -8, 4, 12, 48, 80, 96, 112, 160, 512};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        assert_true(cuda_plan_head_dim_supported(ok[i]));
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_false(cuda_plan_head_dim_supported(bad[i]));
}

static void test_num_partitions(void **state)
{
    (void)state;
    assert_int_equal(cuda_plan_num_partitions(1, 512), 1);
    assert_int_equal(cuda_plan_num_partitions(512, 512), 1);
    assert_int_equal(cuda_plan_num_partitions(513, 512), 2);
    assert_int_equal(cuda_plan_num_partitions(1024, 512), 2);
    assert_int_equal(cuda_plan_num_partitions(1025, 512), 3);
    assert_int_equal(cuda_plan_num_partitions(131072, 512), 256);
    assert_int_equal(cuda_plan_num_partitions(0, 512), 1);
    assert_int_equal(cuda_plan_num_partitions(INT32_MAX, 64), (int32_t)(((int64_t)INT32_MAX + 63) / 64));
}

static void test_decode_plan(void **state)
{
    (void)state;
    cuda_decode_plan p;
    pg_error err;
    /* Llama-3-8B: hd 128, G 4: 512-token partitions fit the default 48 KiB */
    assert_int_equal(cuda_plan_decode(&p, 128, 4, 4096, CUDA_PLAN_SMEM_DEFAULT_BYTES, &err), 0);
    assert_int_equal(p.threads, 128);
    assert_int_equal(p.group_threads, 16);
    assert_int_equal(p.partition_size, 512);
    assert_int_equal(p.max_partitions, 8);
    /* q [4][128] + scores [4][512] + red [128*8] + stats [7*4], f32 */
    assert_int_equal(p.smem_bytes, (4 * 128 + 4 * 512 + 128 * 8 + 28) * 4);
    assert_int_equal(p.splits, 8);
    /* stories260K: hd 8, G 2, one thread per key */
    assert_int_equal(cuda_plan_decode(&p, 8, 2, 257, CUDA_PLAN_SMEM_DEFAULT_BYTES, &err), 0);
    assert_int_equal(p.group_threads, 1);
    assert_int_equal(p.max_partitions, 1);
    /* a group larger than 8 heads is processed in chunks of 8: same smem as 8 */
    cuda_decode_plan p8;
    assert_int_equal(cuda_plan_decode(&p8, 256, 8, 100, CUDA_PLAN_SMEM_DEFAULT_BYTES, &err), 0);
    assert_int_equal(cuda_plan_decode(&p, 256, 16, 100, CUDA_PLAN_SMEM_DEFAULT_BYTES, &err), 0);
    assert_int_equal(p.smem_bytes, p8.smem_bytes);
    assert_true(p.smem_bytes <= CUDA_PLAN_SMEM_DEFAULT_BYTES);
    /* the partition size depends on (hd, G) and the limit, never on the context */
    cuda_decode_plan a, b;
    assert_int_equal(cuda_plan_decode(&a, 64, 4, 1, CUDA_PLAN_SMEM_DEFAULT_BYTES, &err), 0);
    assert_int_equal(cuda_plan_decode(&b, 64, 4, 100000, CUDA_PLAN_SMEM_DEFAULT_BYTES, &err), 0);
    assert_int_equal(a.partition_size, b.partition_size);
    assert_int_equal(b.max_partitions, cuda_plan_num_partitions(100000, b.partition_size));
    /* the grid is bounded whatever the context (128k: 256 partitions, 32 blocks) */
    assert_int_equal(b.splits, CUDA_PLAN_DECODE_MAX_SPLITS);
    assert_int_equal(cuda_plan_decode(&b, 128, 4, 131072, CUDA_PLAN_SMEM_DEFAULT_BYTES, &err), 0);
    assert_int_equal(b.max_partitions, 256);
    assert_int_equal(b.splits, 32);
    /* a tight limit picks a smaller partition, or fails with the numbers */
    assert_int_equal(cuda_plan_decode(&p, 128, 8, 1000, 20000, &err), 0);
    assert_true(p.partition_size < 512 && p.smem_bytes <= 20000);
    assert_int_equal(cuda_plan_decode(&p, 128, 8, 1000, 1000, &err), PG_EUNSUPPORTED);
    assert_non_null(strstr(err.msg, "shared memory"));
    /* invalid arguments */
    assert_int_equal(cuda_plan_decode(&p, 96, 4, 10, CUDA_PLAN_SMEM_DEFAULT_BYTES, &err),
                     PG_EUNSUPPORTED);
    assert_non_null(strstr(err.msg, "head_dim 96"));
    assert_int_equal(cuda_plan_decode(&p, 64, 0, 10, CUDA_PLAN_SMEM_DEFAULT_BYTES, &err), PG_EINVAL);
    assert_int_equal(cuda_plan_decode(&p, 64, 1, 0, CUDA_PLAN_SMEM_DEFAULT_BYTES, &err), PG_EINVAL);
}

static void test_prefill_plan(void **state)
{
    (void)state;
    cuda_prefill_plan p;
    pg_error err;
    const int32_t hds[] = {8, 16, 32, 64, 128, 256};
    for (size_t i = 0; i < sizeof hds / sizeof hds[0]; i++) {
        int32_t hd = hds[i];
        assert_int_equal(cuda_plan_prefill(&p, hd, 4, 1000, CUDA_PLAN_SMEM_DEFAULT_BYTES, &err), 0);
        assert_true(p.rows_per_block >= 8 && p.rows_per_block <= 64);
        assert_true(p.keys_per_tile >= 8 && p.keys_per_tile <= 32);
        assert_true(p.smem_bytes <= CUDA_PLAN_SMEM_DEFAULT_BYTES);
        size_t R = (size_t)p.rows_per_block, BK = (size_t)p.keys_per_tile;
        assert_int_equal(p.smem_bytes,
                         4 * (2 * R * (size_t)hd + BK * (size_t)(hd + 1) + BK * (size_t)hd + R * BK + 3 * R));
        /* every row of the longest query is covered: grid_x * R >= q * G */
        assert_true((int64_t)p.grid_x * p.rows_per_block >= 1000 * 4);
        assert_true((int64_t)(p.grid_x - 1) * p.rows_per_block < 1000 * 4);
    }
    assert_int_equal(cuda_plan_prefill(&p, 128, 4, 2, CUDA_PLAN_SMEM_DEFAULT_BYTES, &err), 0);
    assert_int_equal(p.rows_per_block, 16);
    assert_int_equal(p.keys_per_tile, 16);
    assert_int_equal(p.grid_x, 1);
    /* a GQA group larger than a block's rows still covers every row */
    assert_int_equal(cuda_plan_prefill(&p, 256, 16, 3, CUDA_PLAN_SMEM_DEFAULT_BYTES, &err), 0);
    assert_int_equal(p.rows_per_block, 8);
    assert_int_equal(p.grid_x, 6);
    assert_int_equal(cuda_plan_prefill(&p, 80, 4, 3, CUDA_PLAN_SMEM_DEFAULT_BYTES, &err),
                     PG_EUNSUPPORTED);
    assert_int_equal(cuda_plan_prefill(&p, 64, 4, 0, CUDA_PLAN_SMEM_DEFAULT_BYTES, &err), PG_EINVAL);
    assert_int_equal(cuda_plan_prefill(&p, 256, 4, 10, 4096, &err), PG_EUNSUPPORTED);
}

static void test_blocks(void **state)
{
    (void)state;
    assert_int_equal(cuda_plan_blocks(0, 256, 1024), 1);
    assert_int_equal(cuda_plan_blocks(1, 256, 1024), 1);
    assert_int_equal(cuda_plan_blocks(256, 256, 1024), 1);
    assert_int_equal(cuda_plan_blocks(257, 256, 1024), 2);
    assert_int_equal(cuda_plan_blocks((size_t)1 << 40, 256, 65535), 65535);
    assert_int_equal(cuda_plan_blocks(1000, 0, 0), 1000);
}

static void test_kv_blocks(void **state)
{
    (void)state;
    pg_error err;
    int32_t n = -1;
    const size_t GiB = (size_t)1 << 30, MiB = (size_t)1 << 20;
    /* 80 GiB card, 16 GiB in use after loading, 0.9 -> 72 - 16 - 1 = 55 GiB for KV */
    cuda_mem_plan_in in = {.total_bytes = 80 * GiB, .free_bytes = 64 * GiB, .utilization = 0.9,
                           .reserve_bytes = 1 * GiB, .kv_bytes_per_block = 2 * MiB,
                           .min_blocks = 1};
    assert_int_equal(cuda_plan_kv_blocks(&n, &in, &err), 0);
    double budget = 80.0 * 0.9 * 1024 - 16 * 1024 - 1024; /* MiB */
    assert_int_equal(n, (int32_t)(budget / 2.0));
    /* exactly one block's worth */
    in = (cuda_mem_plan_in){.total_bytes = 1000, .free_bytes = 1000, .utilization = 1.0,
                            .reserve_bytes = 0, .kv_bytes_per_block = 1000, .min_blocks = 1};
    assert_int_equal(cuda_plan_kv_blocks(&n, &in, &err), 0);
    assert_int_equal(n, 1);
    /* one byte short -> a clear error with the numbers */
    in.reserve_bytes = 1;
    assert_int_equal(cuda_plan_kv_blocks(&n, &in, &err), PG_ENOMEM);
    assert_non_null(strstr(err.msg, "kv cache"));
    assert_non_null(strstr(err.msg, "utilization"));
    /* weights larger than the allowed share */
    in = (cuda_mem_plan_in){.total_bytes = 80 * GiB, .free_bytes = 10 * GiB, .utilization = 0.5,
                            .reserve_bytes = 0, .kv_bytes_per_block = MiB, .min_blocks = 1};
    assert_int_equal(cuda_plan_kv_blocks(&n, &in, &err), PG_ENOMEM);
    /* min_blocks */
    in = (cuda_mem_plan_in){.total_bytes = 100 * MiB, .free_bytes = 100 * MiB, .utilization = 1.0,
                            .reserve_bytes = 0, .kv_bytes_per_block = MiB, .min_blocks = 101};
    assert_int_equal(cuda_plan_kv_blocks(&n, &in, &err), PG_ENOMEM);
    in.min_blocks = 100;
    assert_int_equal(cuda_plan_kv_blocks(&n, &in, &err), 0);
    assert_int_equal(n, 100);
    /* invalid */
    in.utilization = 0.0;
    assert_int_equal(cuda_plan_kv_blocks(&n, &in, &err), PG_EINVAL);
    in.utilization = 1.5;
    assert_int_equal(cuda_plan_kv_blocks(&n, &in, &err), PG_EINVAL);
    in.utilization = 0.5;
    in.kv_bytes_per_block = 0;
    assert_int_equal(cuda_plan_kv_blocks(&n, &in, &err), PG_EINVAL);
    in.kv_bytes_per_block = 1;
    in.free_bytes = in.total_bytes + 1;
    assert_int_equal(cuda_plan_kv_blocks(&n, &in, &err), PG_EINVAL);
}

/* context tiers of the graphs: x4 from 512, clamped to max_model_len */
static void test_graph_context(void **state)
{
    (void)state;
    int32_t b = 0;
    assert_int_equal(cuda_plan_graph_context(1, 131072, &b), 0);
    assert_int_equal(b, 512);
    assert_int_equal(cuda_plan_graph_context(512, 131072, &b), 0);
    assert_int_equal(cuda_plan_graph_context(513, 131072, &b), 1);
    assert_int_equal(b, 2048);
    assert_int_equal(cuda_plan_graph_context(8193, 131072, &b), 3);
    assert_int_equal(b, 32768);
    assert_int_equal(cuda_plan_graph_context(131072, 131072, &b), 4);
    assert_int_equal(b, 131072);
    assert_int_equal(cuda_plan_graph_tiers(131072), 5);
    assert_int_equal(cuda_plan_graph_context(600, 700, &b), 1); /* clamped */
    assert_int_equal(b, 700);
    assert_int_equal(cuda_plan_graph_tiers(700), 2);
    assert_int_equal(cuda_plan_graph_tiers(512), 1);
    assert_int_equal(cuda_plan_graph_context(300, 256, &b), -1);
    assert_int_equal(cuda_plan_graph_context(0, 256, &b), -1);
}

static void test_graph_sizes(void **state)
{
    (void)state;
    int32_t s[64];
    int32_t n = cuda_plan_graph_sizes(s, 64, 32);
    const int32_t want[] = {1, 2, 4, 8, 16, 24, 32};
    assert_int_equal(n, 7);
    assert_memory_equal(s, want, sizeof want);
    n = cuda_plan_graph_sizes(s, 64, 30); /* max itself is added */
    const int32_t want30[] = {1, 2, 4, 8, 16, 24, 30};
    assert_int_equal(n, 7);
    assert_memory_equal(s, want30, sizeof want30);
    assert_int_equal(cuda_plan_graph_sizes(s, 64, 1), 1);
    assert_int_equal(s[0], 1);
    assert_int_equal(cuda_plan_graph_sizes(s, 64, 3), 3); /* 1, 2, 3 */
    assert_int_equal(s[2], 3);
    assert_int_equal(cuda_plan_graph_sizes(s, 64, 0), 0);
    /* cap: the count is the full count, only cap are written */
    s[2] = -7;
    assert_int_equal(cuda_plan_graph_sizes(s, 2, 256), 3 + 32);
    assert_int_equal(s[2], -7);

    /* the bucket is the smallest size >= batch, and always one of the sizes */
    n = cuda_plan_graph_sizes(s, 64, 256);
    for (int32_t b = 1; b <= 256; b++) {
        int32_t k = cuda_plan_graph_bucket(b, 256);
        assert_true(k >= b);
        int found = 0;
        for (int32_t i = 0; i < n; i++) {
            if (s[i] == k)
                found = 1;
            if (s[i] >= b)
                assert_true(s[i] >= k); /* no smaller bucket fits */
        }
        assert_true(found);
    }
    assert_int_equal(cuda_plan_graph_bucket(3, 256), 4);
    assert_int_equal(cuda_plan_graph_bucket(9, 256), 16);
    assert_int_equal(cuda_plan_graph_bucket(17, 256), 24);
    assert_int_equal(cuda_plan_graph_bucket(29, 30), 30);
    assert_int_equal(cuda_plan_graph_bucket(0, 256), -1);
    assert_int_equal(cuda_plan_graph_bucket(257, 256), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_head_dims),
        cmocka_unit_test(test_num_partitions),
        cmocka_unit_test(test_decode_plan),
        cmocka_unit_test(test_prefill_plan),
        cmocka_unit_test(test_blocks),
        cmocka_unit_test(test_kv_blocks),
        cmocka_unit_test(test_graph_context),
        cmocka_unit_test(test_graph_sizes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
