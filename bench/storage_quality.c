/* storage_quality: what the CPU storage types and matmul precision modes
 * cost in accuracy (issues 13 and 20).
 *
 *   storage_quality MODEL_DIR [N_TOKENS] [THREADS]
 *
 * Teacher-forces one fixed token sequence through the model once per
 * storage configuration (weights f32 / bf16 / int8 x KV cache f32 / bf16 /
 * f16; and --matmul-precision bf16 and int8, cpu_gemm_modes.h, on their own
 * storage), one token per step, and compares every position's full log-softmax
 * with the f32 / f32 run's:
 *   mean NLL        -mean log p(token[i+1] | tokens[..i]) (perplexity-style)
 *   max |dlogprob|  over every position and every vocabulary entry
 *   max |d next|    over every position, of the text's next token only
 *   top-1 agree     positions whose argmax equals f32 / f32's
 * The sequence: with a tokenizer.json, a fixed English paragraph (tokenized
 * with BOS); without one, fixed pseudo-random ids (splitmix64, seed 1) — the
 * NLL is then near log V and only the deltas mean something.
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "cpu_executor.h"
#include "cpu_gemm_modes.h"
#include "cpu_wt.h"
#include "model.h"
#include "safetensors.h"
#include "tokenizer.h"

static const char *const text =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with "
    "her friends. One day, she saw a big red ball under a tree. She ran to the ball and picked it up. "
    "\"Can I play with you?\" asked a small boy. Lily smiled and said, \"Yes, let's play together!\" "
    "They threw the ball back and forth until the sun went down. Then Lily went home, ate her dinner "
    "and went to bed. She dreamed about the ball and her new friend. The next morning, the boy came "
    "to her house with his dog. The dog was very happy and wagged its tail. They all went to the park "
    "again and played all day long.";

typedef struct qcfg {
    cpu_wt wt;
    cpu_kv kv;
    cpu_matmul_precision matmul;
} qcfg;

static const qcfg cfgs[] = {
    {CPU_WT_F32, CPU_KV_F32, CPU_MATMUL_EXACT},  {CPU_WT_F32, CPU_KV_BF16, CPU_MATMUL_EXACT},
    {CPU_WT_F32, CPU_KV_F16, CPU_MATMUL_EXACT},  {CPU_WT_BF16, CPU_KV_F32, CPU_MATMUL_EXACT},
    {CPU_WT_BF16, CPU_KV_BF16, CPU_MATMUL_EXACT}, {CPU_WT_I8, CPU_KV_F32, CPU_MATMUL_EXACT},
    {CPU_WT_I8, CPU_KV_BF16, CPU_MATMUL_EXACT},  {CPU_WT_BF16, CPU_KV_BF16, CPU_MATMUL_BF16},
    {CPU_WT_I8, CPU_KV_BF16, CPU_MATMUL_INT8},
};
#define N_CFG ((int)(sizeof cfgs / sizeof cfgs[0]))

/* log-softmax of logits [V] into out [V] (double) */
static void log_softmax(double *out, const float *logits, int32_t V)
{
    double mx = -INFINITY, z = 0.0;
    for (int32_t v = 0; v < V; v++)
        mx = (double)logits[v] > mx ? (double)logits[v] : mx;
    for (int32_t v = 0; v < V; v++)
        z += exp((double)logits[v] - mx);
    const double lz = mx + log(z);
    for (int32_t v = 0; v < V; v++)
        out[v] = (double)logits[v] - lz;
}

/* Runs ids [n] through one configuration: lp [n - 1][V] log-probabilities
 * of the next token at every position. */
static int run(const char *dir, const llama_config *cfg, const st_file *st, const qcfg *q, int32_t threads,
               const int32_t *ids, int32_t n, double *lp)
{
    executor *ex = NULL;
    model *m = NULL;
    pg_error err = {{0}};
    cpu_executor_params cp = {.threads = threads, .wt_dtype = (int32_t)q->wt, .kv_dtype = (int32_t)q->kv,
                              .matmul_precision = (int32_t)q->matmul};
    const int32_t bs = 16, nb = (n + bs - 1) / bs;
    model_params mp = {.num_kv_blocks = nb, .block_size = bs, .max_num_batched_tokens = 16, .max_num_seqs = 1};
    int rc = cpu_executor_create(&ex, &cp, &err);
    if (!rc)
        rc = model_create(&m, ex, cfg, st, &mp, &err);
    const int32_t V = cfg->vocab_size;
    float *logits = malloc((size_t)V * sizeof *logits);
    int32_t *table = malloc((size_t)nb * sizeof *table);
    if (!rc && (!logits || !table))
        rc = pg_error_set(&err, PG_ENOMEM, "out of memory");
    for (int32_t b = 0; !rc && b < nb; b++)
        table[b] = b;
    for (int32_t i = 0; !rc && i + 1 < n; i++) {
        int32_t qs[2] = {0, 1}, len = i + 1, row = 0, slot = i;
        step_batch b = {.num_tokens = 1, .num_seqs = 1, .block_size = bs, .token_ids = &ids[i], .positions = &i,
                        .slots = &slot, .query_start = qs, .seq_lens = &len, .block_tables = table,
                        .block_table_stride = nb, .max_seq_len = len, .max_query_len = 1, .num_logits = 1,
                        .logits_rows = &row};
        rc = model_forward(m, &b, logits, &err);
        if (!rc)
            log_softmax(lp + (size_t)i * V, logits, V);
    }
    if (rc)
        fprintf(stderr, "storage_quality: %s with weights %s, kv %s: %s\n", dir, cpu_wt_name(q->wt),
                cpu_kv_name(q->kv), err.msg);
    free(logits);
    free(table);
    model_destroy(m);
    if (ex)
        ex->op->destroy(ex);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: storage_quality MODEL_DIR [N_TOKENS] [THREADS]\n");
        return 2;
    }
    const char *dir = argv[1];
    int32_t n = argc > 2 ? (int32_t)strtol(argv[2], NULL, 10) : 256;
    const int32_t threads = argc > 3 ? (int32_t)strtol(argv[3], NULL, 10) : 0;
    llama_config cfg;
    st_file *st = NULL;
    pg_error err = {{0}};
    if (llama_config_load(&cfg, dir, &err) || st_open(&st, dir, &err)) {
        fprintf(stderr, "storage_quality: %s\n", err.msg);
        return 1;
    }
    if (n < 2 || n > cfg.max_position_embeddings)
        n = cfg.max_position_embeddings < 256 ? cfg.max_position_embeddings : 256;
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    const char *source = "pseudo-random ids";
    tokenizer *tok = NULL;
    char tpath[1100];
    snprintf(tpath, sizeof tpath, "%s/tokenizer.json", dir);
    FILE *tf = fopen(tpath, "r");
    if (tf) {
        fclose(tf);
        int32_t *enc = NULL;
        size_t n_enc = 0;
        if (tok_load(&tok, dir, &err) == 0 && tok_encode(tok, text, strlen(text), true, &enc, &n_enc, &err) == 0) {
            n = (size_t)n < n_enc ? n : (int32_t)n_enc;
            memcpy(ids, enc, (size_t)n * sizeof *ids);
            source = "a fixed English paragraph";
            free(enc);
        } else {
            fprintf(stderr, "storage_quality: tokenizer: %s (using pseudo-random ids)\n", err.msg);
            tf = NULL;
        }
        tok_free(tok);
    }
    if (!tf) {
        uint64_t s = 1;
        for (int32_t i = 0; i < n; i++) {
            uint64_t z = (s += 0x9E3779B97F4A7C15u);
            z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9u;
            z = (z ^ (z >> 27)) * 0x94D049BB133111EBu;
            ids[i] = (int32_t)((z ^ (z >> 31)) % (uint64_t)cfg.vocab_size);
        }
    }
    const size_t V = (size_t)cfg.vocab_size, per = (size_t)(n - 1) * V;
    double *ref = malloc(per * sizeof *ref), *lp = malloc(per * sizeof *lp);
    if (!ids || !ref || !lp) {
        fprintf(stderr, "storage_quality: out of memory\n");
        return 1;
    }
    st_dtype ck = ST_F32;
    const st_tensor *et = st_find(st, "model.embed_tokens.weight");
    if (et)
        ck = et->dtype;
    printf("storage_quality: %s (checkpoint %s), %d tokens of %s, teacher-forced one per step\n", dir,
           st_dtype_name(ck), (int)n, source);
    printf("  %-7s %-5s %-6s %10s %10s %14s %12s %12s\n", "weights", "kv", "matmul", "mean NLL", "d NLL",
           "max |dlogprob|", "max |d next|", "top-1 agree");
    int rc = 0;
    for (int k = 0; k < N_CFG && rc == 0; k++) {
        double *out = k == 0 ? ref : lp;
        if ((rc = run(dir, &cfg, st, &cfgs[k], threads, ids, n, out)) != 0)
            break;
        double nll = 0.0, nll_ref = 0.0, maxd = 0.0, maxn = 0.0;
        int32_t agree = 0;
        for (int32_t i = 0; i + 1 < n; i++) {
            const double *a = ref + (size_t)i * V, *b = out + (size_t)i * V;
            nll -= b[ids[i + 1]];
            nll_ref -= a[ids[i + 1]];
            maxn = fmax(maxn, fabs(a[ids[i + 1]] - b[ids[i + 1]]));
            size_t am = 0, bm = 0;
            for (size_t v = 0; v < V; v++) {
                maxd = fmax(maxd, fabs(a[v] - b[v]));
                am = a[v] > a[am] ? v : am;
                bm = b[v] > b[bm] ? v : bm;
            }
            agree += am == bm;
        }
        nll /= n - 1;
        nll_ref /= n - 1;
        printf("  %-7s %-5s %-6s %10.5f %+10.5f %14.5f %12.5f %7d/%-4d\n", cpu_wt_name(cfgs[k].wt),
               cpu_kv_name(cfgs[k].kv), cpu_matmul_precision_name(cfgs[k].matmul), nll, nll - nll_ref, maxd, maxn, (int)agree, (int)(n - 1));
    }
    free(ids);
    free(ref);
    free(lp);
    st_close(st);
    return rc ? 1 : 0;
}
