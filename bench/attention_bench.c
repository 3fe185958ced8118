/* attention_bench: the CPU executor's paged attention (cpu/cpu_attention.c)
 * on the 110m model's shape (12 heads, 12 kv heads, head_dim 64, blocks of
 * 16), with the machine's ceilings beside the figures.
 *
 *   attention_bench [threads]      (default: all online cores)
 *
 * Steps, for an f32 and a bf16 cache: one prompt of 512 tokens prefilled
 * at once, 64 prompts of 128, and a decode step of 64 sequences at 512
 * tokens of context. Prints ms per call, GFLOP/s (4 * context * heads *
 * head_dim per query token: the QK and PV products, multiply + add, no fma
 * by the canonical order) and GB/s of K and V read once per query token
 * (what a decode streams; a prefill reads less, which is its point). Each
 * sequence's blocks are contiguous in the pool. Fixed seed, warm-up, best
 * of timed repetitions within ~0.5 s per point.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_machine.h"
#include "cpu_executor.h"
#include "executor.h"

enum { NH = 12, NKV = 12, HD = 64, BS = 16 };

typedef struct bench_step {
    step_batch b;
    int32_t *positions, *slots, *query_start, *seq_lens, *block_tables, *token_ids, *logits_rows;
    int32_t num_blocks;
} bench_step;

static void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size);
    if (!p) {
        fprintf(stderr, "attention_bench: out of memory\n");
        exit(1);
    }
    return p;
}

/* S sequences of seq_len tokens, the last q_len of each in the step */
static void step_build(bench_step *st, int32_t S, int32_t seq_len, int32_t q_len)
{
    const int32_t T = S * q_len, nb = (seq_len + BS - 1) / BS;
    memset(st, 0, sizeof *st);
    st->positions = xcalloc((size_t)T, sizeof(int32_t));
    st->slots = xcalloc((size_t)T, sizeof(int32_t));
    st->token_ids = xcalloc((size_t)T, sizeof(int32_t));
    st->query_start = xcalloc((size_t)S + 1, sizeof(int32_t));
    st->seq_lens = xcalloc((size_t)S, sizeof(int32_t));
    st->logits_rows = xcalloc((size_t)S, sizeof(int32_t));
    st->block_tables = xcalloc((size_t)S * (size_t)nb, sizeof(int32_t));
    for (int32_t s = 0; s < S; s++) {
        st->query_start[s + 1] = (s + 1) * q_len;
        st->seq_lens[s] = seq_len;
        st->logits_rows[s] = (s + 1) * q_len - 1;
        for (int32_t k = 0; k < nb; k++)
            st->block_tables[s * nb + k] = s * nb + k;
        for (int32_t i = 0; i < q_len; i++) {
            const int32_t t = s * q_len + i, p = seq_len - q_len + i;
            st->positions[t] = p;
            st->slots[t] = st->block_tables[s * nb + p / BS] * BS + p % BS;
        }
    }
    st->num_blocks = S * nb;
    st->b = (step_batch){.num_tokens = T, .num_seqs = S, .block_size = BS, .token_ids = st->token_ids,
                         .positions = st->positions, .slots = st->slots, .query_start = st->query_start,
                         .seq_lens = st->seq_lens, .block_tables = st->block_tables, .block_table_stride = nb,
                         .max_seq_len = seq_len, .max_query_len = q_len, .num_logits = S,
                         .logits_rows = st->logits_rows};
}

static void step_free(bench_step *st)
{
    free(st->positions);
    free(st->slots);
    free(st->token_ids);
    free(st->query_start);
    free(st->seq_lens);
    free(st->logits_rows);
    free(st->block_tables);
}

static void check(executor *ex, int rc, const char *what)
{
    if (rc) {
        fprintf(stderr, "attention_bench: %s: %s\n", what, ex->op->last_error(ex));
        exit(1);
    }
}

/* best seconds per call */
static double time_attention(executor *ex, void *out, const void *qkv, const void *kc, const void *vc,
                             const step_batch *b)
{
    const float scale = 1.0f / sqrtf((float)HD);
    check(ex, ex->op->begin_step(ex, b), "begin_step");
    check(ex, ex->op->attention(ex, out, qkv, kc, vc, NH, NKV, HD, scale, b), "attention"); /* warm-up */
    double best = 1e30;
    const double start = bench_now_s();
    int reps = 0;
    do {
        const double t0 = bench_now_s();
        check(ex, ex->op->attention(ex, out, qkv, kc, vc, NH, NKV, HD, scale, b), "attention");
        const double t = bench_now_s() - t0;
        best = t < best ? t : best;
        reps++;
    } while (bench_now_s() - start < 0.5 || reps < 3);
    return best;
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? (int)strtol(argv[1], NULL, 10) : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (threads < 1)
        threads = 1;
    bench_machine m;
    bench_machine_identify(&m);
    if (bench_machine_measure(&m, threads, 1) != 0)
        fprintf(stderr, "attention_bench: the ceilings could not be measured\n");
    printf("attention_bench: %s, %d threads; 12 heads, 12 kv heads, head_dim 64, block 16\n", m.cpu_model, threads);
    printf("ceilings: OpenBLAS sgemm %.1f GFLOP/s (fma), memory read %.1f GB/s\n\n", m.sgemm_gflops, m.read_gbs);

    const struct { const char *name; int32_t S, seq_len, q_len; } steps[] = {
        {"prefill 1 x 512", 1, 512, 512}, {"prefill 64 x 128", 64, 128, 128}, {"decode 64 at 512", 64, 512, 1},
    };
    const char *kv_names[] = {"f32", "bf16"};
    printf("%-18s %-5s | %9s %9s %12s\n", "step", "cache", "ms/call", "GFLOP/s", "KV GB/s");
    for (int kv = 0; kv < 2; kv++) {
        executor *ex = NULL;
        pg_error err = {{0}};
        cpu_executor_params p = {.threads = threads, .kv_dtype = kv};
        if (cpu_executor_create(&ex, &p, &err)) {
            fprintf(stderr, "attention_bench: cpu executor: %s\n", err.msg);
            return 1;
        }
        for (size_t s = 0; s < sizeof steps / sizeof steps[0]; s++) {
            bench_step st;
            step_build(&st, steps[s].S, steps[s].seq_len, steps[s].q_len);
            const int32_t T = st.b.num_tokens;
            const size_t nq = (size_t)T * (NH + 2 * NKV) * HD, nc = (size_t)st.num_blocks * BS * NKV * HD;
            float *host = xcalloc(nq > nc ? nq : nc, sizeof(float));
            uint64_t seed = 12345;
            for (size_t i = 0; i < (nq > nc ? nq : nc); i++) {
                seed = seed * 6364136223846793005ull + 1442695040888963407ull;
                host[i] = (float)((double)(seed >> 40) / (double)(1ull << 24)) - 0.5f;
            }
            void *qkv = ex->op->alloc(ex, EXEC_ACT, nq), *out = ex->op->alloc(ex, EXEC_ACT, (size_t)T * NH * HD);
            void *kc = ex->op->alloc(ex, EXEC_KV, nc), *vc = ex->op->alloc(ex, EXEC_KV, nc);
            if (!qkv || !out || !kc || !vc) {
                fprintf(stderr, "attention_bench: alloc failed: %s\n", ex->op->last_error(ex));
                return 1;
            }
            check(ex, ex->op->upload(ex, qkv, EXEC_ACT, 0, host, ST_F32, nq), "upload");
            check(ex, ex->op->upload(ex, kc, EXEC_KV, 0, host, ST_F32, nc), "upload");
            check(ex, ex->op->upload(ex, vc, EXEC_KV, 0, host, ST_F32, nc), "upload");
            const double t = time_attention(ex, out, qkv, kc, vc, &st.b);
            double ctx = 0.0;
            for (int32_t i = 0; i < T; i++)
                ctx += st.positions[i] + 1;
            const double flops = 4.0 * ctx * NH * HD, kv_bytes = 2.0 * ctx * NKV * HD * (kv ? 2.0 : 4.0);
            printf("%-18s %-5s | %9.2f %9.1f %12.1f\n", steps[s].name, kv_names[kv], t * 1e3, flops / t * 1e-9,
                   kv_bytes / t * 1e-9);
            ex->op->free(ex, qkv);
            ex->op->free(ex, out);
            ex->op->free(ex, kc);
            ex->op->free(ex, vc);
            free(host);
            step_free(&st);
        }
        ex->op->destroy(ex);
    }
    return 0;
}
