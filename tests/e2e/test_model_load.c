/* model: load-time checks (names, shapes, dtypes, out of memory) and the
 * forward over a ragged paged batch against a plain double-precision
 * reference forward (Hugging Face LlamaForCausalLM semantics, rotate_half
 * RoPE), on a tiny random checkpoint written by the test itself.
 *
 * The random model mixes dtypes (F32, F16, BF16), is untied (lm_head.weight)
 * and uses GQA; the batch mixes a prefill, a chunked prefill and decodes, on
 * scattered block tables, and a copy-on-write copy of a partial block.
 * Qwen2 (q/k/v biases) and Qwen3 (q/k norms, head_dim != hidden / heads,
 * tied) models, with and without per-layer windows, against a double
 * reference of modeling_qwen2.py / modeling_qwen3.py: logits, greedy tokens
 * and logprobs; and on every CPU storage type.
 *
 * Built with PG_MODEL_LOAD_CUDA (tests/cuda_emu: emu_qwen_model; tests/gpu:
 * qwen_model_cuda) only the Qwen reference test runs, on the CUDA executor
 * in f32 precision (head_dim 8: the CUDA attention's smallest); without a
 * device it exits 77. */
#include <math.h>
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
#include "engine.h"
#include "model.h"
#ifdef PG_MODEL_LOAD_CUDA
#include "cuda_executor.h"
#endif
#include "pooling.h"
#include "safetensors.h"
#include "test_support.h"

/* ---- the tiny config ------------------------------------------------------ */

enum { TH = 16, TI = 24, TNL = 2, TNH = 4, TNKV = 2, THD = 4, TV = 32 };
#define TQ (TNH * THD)
#define TKVD (TNKV * THD)

static llama_config tiny_config(bool tie)
{
    llama_config c;
    memset(&c, 0, sizeof c);
    snprintf(c.architecture, sizeof c.architecture, "LlamaForCausalLM");
    c.hidden_size = TH;
    c.intermediate_size = TI;
    c.num_hidden_layers = TNL;
    c.num_attention_heads = TNH;
    c.num_key_value_heads = TNKV;
    c.head_dim = THD;
    c.vocab_size = TV;
    c.rms_norm_eps = 1e-5f;
    c.rope_theta = 10000.0f;
    c.max_position_embeddings = 64;
    c.tie_word_embeddings = tie;
    c.bos_token_id = 1;
    c.eos_token_ids[0] = 2;
    c.n_eos_token_ids = 1;
    return c;
}

/* ---- a minimal safetensors writer ---------------------------------------- */

typedef struct wt_tensor {
    char name[96];
    st_dtype dtype;
    int ndim;
    int64_t shape[2];
    float *values;     /* [numel] the exact values the file holds (after rounding) */
} wt_tensor;

typedef struct wt_set {
    wt_tensor t[64];
    int n;
} wt_set;

static size_t numel(const wt_tensor *t)
{
    size_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= (size_t)t->shape[i];
    return n;
}

/* Adds a random tensor; values are rounded to dtype so that the file is exact. */
static void wt_add(wt_set *s, pg_test_rng *rng, const char *name, st_dtype dt, int ndim,
                   int64_t d0, int64_t d1, float lo, float hi)
{
    wt_tensor *t = &s->t[s->n++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = dt;
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = d1;
    size_t n = numel(t);
    t->values = malloc(n * sizeof(float));
    assert_non_null(t->values);
    for (size_t i = 0; i < n; i++) {
        float v = pg_test_rng_uniform(rng, lo, hi);
        if (dt == ST_F16)
            v = pg_f16_to_f32(pg_f32_to_f16(v));
        else if (dt == ST_BF16)
            v = pg_bf16_to_f32(pg_f32_to_bf16(v));
        t->values[i] = v;
    }
}

static wt_tensor *wt_find(wt_set *s, const char *name)
{
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->t[i].name, name) == 0)
            return &s->t[i];
    return NULL;
}

static void wt_remove(wt_set *s, const char *name)
{
    wt_tensor *t = wt_find(s, name);
    assert_non_null(t);
    free(t->values);
    *t = s->t[--s->n];
}

static void wt_free(wt_set *s)
{
    for (int i = 0; i < s->n; i++)
        free(s->t[i].values);
    s->n = 0;
}

static void put_le(unsigned char *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

/* Writes dir/model.safetensors. */
static void wt_write(const wt_set *s, const char *dir)
{
    char header[16384];
    size_t hl = 0, off = 0;
    hl += (size_t)snprintf(header + hl, sizeof header - hl, "{");
    for (int i = 0; i < s->n; i++) {
        const wt_tensor *t = &s->t[i];
        size_t nb = numel(t) * st_dtype_size(t->dtype);
        hl += (size_t)snprintf(header + hl, sizeof header - hl,
                               "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", i ? "," : "", t->name,
                               st_dtype_name(t->dtype));
        for (int d = 0; d < t->ndim; d++)
            hl += (size_t)snprintf(header + hl, sizeof header - hl, "%s%lld", d ? "," : "",
                                   (long long)t->shape[d]);
        hl += (size_t)snprintf(header + hl, sizeof header - hl, "],\"data_offsets\":[%zu,%zu]}",
                               off, off + nb);
        off += nb;
        assert_true(hl < sizeof header - 64);
    }
    hl += (size_t)snprintf(header + hl, sizeof header - hl, "}");
    while (hl % 8)
        header[hl++] = ' ';
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    unsigned char len8[8];
    put_le(len8, hl, 8);
    assert_int_equal(fwrite(len8, 1, 8, f), 8);
    assert_int_equal(fwrite(header, 1, hl, f), hl);
    for (int i = 0; i < s->n; i++) {
        const wt_tensor *t = &s->t[i];
        size_t n = numel(t), es = st_dtype_size(t->dtype);
        unsigned char *buf = malloc(n * es + 1);
        assert_non_null(buf);
        for (size_t k = 0; k < n; k++) {
            float v = t->values[k];
            if (t->dtype == ST_F32) {
                uint32_t u;
                memcpy(&u, &v, 4);
                put_le(buf + 4 * k, u, 4);
            } else if (t->dtype == ST_F16) {
                put_le(buf + 2 * k, pg_f32_to_f16(v), 2);
            } else if (t->dtype == ST_BF16) {
                put_le(buf + 2 * k, pg_f32_to_bf16(v), 2);
            } else { /* I32: stored as integers (only used to test refusal) */
                put_le(buf + 4 * k, (uint32_t)(int32_t)v, 4);
            }
        }
        assert_int_equal(fwrite(buf, 1, n * es, f), n * es);
        free(buf);
    }
    assert_int_equal(fclose(f), 0);
}

/* The full tiny checkpoint (untied unless tie). */
static void tiny_weights(wt_set *s, bool tie, uint64_t seed)
{
    pg_test_rng rng = {seed};
    char name[96];
    s->n = 0;
    wt_add(s, &rng, "model.embed_tokens.weight", ST_F32, 2, TV, TH, -1.0f, 1.0f);
    for (int l = 0; l < TNL; l++) {
        const float a = 0.5f; /* ~ uniform(-a, a), keeps activations O(1) */
#define ADD(suffix, dt, nd, d0, d1, lo, hi) \
    (snprintf(name, sizeof name, "model.layers.%d." suffix, l), \
     wt_add(s, &rng, name, dt, nd, d0, d1, lo, hi))
        ADD("input_layernorm.weight", ST_F32, 1, TH, 0, 0.5f, 1.5f);
        ADD("self_attn.q_proj.weight", ST_F16, 2, TQ, TH, -a, a);
        ADD("self_attn.k_proj.weight", ST_BF16, 2, TKVD, TH, -a, a);
        ADD("self_attn.v_proj.weight", ST_F32, 2, TKVD, TH, -a, a);
        ADD("self_attn.o_proj.weight", ST_F32, 2, TH, TQ, -a, a);
        ADD("post_attention_layernorm.weight", ST_BF16, 1, TH, 0, 0.5f, 1.5f);
        ADD("mlp.gate_proj.weight", ST_F32, 2, TI, TH, -a, a);
        ADD("mlp.up_proj.weight", ST_F16, 2, TI, TH, -a, a);
        ADD("mlp.down_proj.weight", ST_F32, 2, TH, TI, -a, a);
#undef ADD
    }
    wt_add(s, &rng, "model.norm.weight", ST_F32, 1, TH, 0, 0.5f, 1.5f);
    if (!tie)
        wt_add(s, &rng, "lm_head.weight", ST_BF16, 2, TV, TH, -1.0f, 1.0f);
}

/* ---- reference forward (double, contiguous, one sequence) ---------------- */

/* Values of tensor model.layers.{l}.{suffix}, or of `suffix` itself when l < 0. */
static const float *W(wt_set *s, int l, const char *suffix)
{
    char name[96];
    if (l < 0)
        snprintf(name, sizeof name, "%s", suffix);
    else
        snprintf(name, sizeof name, "model.layers.%d.%s", l, suffix);
    wt_tensor *t = wt_find(s, name);
    assert_non_null(t);
    return t->values;
}

static void ref_rmsnorm(double *out, const double *x, const float *w, int n, double eps)
{
    double ss = 0;
    for (int i = 0; i < n; i++)
        ss += x[i] * x[i];
    double r = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++)
        out[i] = x[i] * r * (double)w[i];
}

static void ref_matvec(double *y, const double *x, const float *w, int N, int K)
{
    for (int n = 0; n < N; n++) {
        double acc = 0;
        for (int k = 0; k < K; k++)
            acc += x[k] * (double)w[(size_t)n * (size_t)K + (size_t)k];
        y[n] = acc;
    }
}

static void ref_rope(double *head, int pos)
{
    int half = THD / 2;
    for (int i = 0; i < half; i++) {
        double inv = pow(10000.0, -(2.0 * i) / THD);
        double c = cos(pos * inv), sn = sin(pos * inv);
        double a = head[i], b = head[i + half];
        head[i] = a * c - b * sn;        /* x * cos + rotate_half(x) * sin */
        head[i + half] = b * c + a * sn;
    }
}

/* The final-norm hidden state of every position of the last reference
 * forward (what the lm_head reads; what embeddings pool). */
static double ref_hidden[32][TH];

/* logits [n][TV] (may be NULL) for every position of tokens[0..n). window 0: full causal
 * attention; W > 0: MistralForCausalLM's sliding window, position t sees
 * keys j with t - W < j <= t (transformers masking_utils
 * sliding_window_overlay: kv_idx > q_idx - sliding_window). */
static void ref_forward_window(wt_set *s, bool tie, const int32_t *tokens, int n, int window, double *logits)
{
    enum { MAXN = 32 };
    assert_true(n <= MAXN);
    static double x[MAXN][TH], k[TNL][MAXN][TKVD], v[TNL][MAXN][TKVD];
    const float *emb = W(s, -1, "model.embed_tokens.weight");
    for (int t = 0; t < n; t++)
        for (int i = 0; i < TH; i++)
            x[t][i] = emb[tokens[t] * TH + i];
    for (int l = 0; l < TNL; l++) {
        for (int t = 0; t < n; t++) {
            double h[TH], q[TQ], o[TQ], a[TH], g[TI], u[TI], m[TI], d[TH];
            ref_rmsnorm(h, x[t], W(s, l, "input_layernorm.weight"), TH, 1e-5);
            ref_matvec(q, h, W(s, l, "self_attn.q_proj.weight"), TQ, TH);
            ref_matvec(k[l][t], h, W(s, l, "self_attn.k_proj.weight"), TKVD, TH);
            ref_matvec(v[l][t], h, W(s, l, "self_attn.v_proj.weight"), TKVD, TH);
            for (int hh = 0; hh < TNH; hh++)
                ref_rope(q + hh * THD, t);
            for (int hh = 0; hh < TNKV; hh++)
                ref_rope(k[l][t] + hh * THD, t);
            for (int hh = 0; hh < TNH; hh++) {
                int kvh = hh / (TNH / TNKV);
                double sc[MAXN], mx = -1e300, sum = 0;
                const int lo = window > 0 && t - window + 1 > 0 ? t - window + 1 : 0;
                for (int j = lo; j <= t; j++) {
                    double dot = 0;
                    for (int i = 0; i < THD; i++)
                        dot += q[hh * THD + i] * k[l][j][kvh * THD + i];
                    sc[j] = dot / sqrt((double)THD);
                    if (sc[j] > mx)
                        mx = sc[j];
                }
                for (int j = lo; j <= t; j++)
                    sum += (sc[j] = exp(sc[j] - mx));
                for (int i = 0; i < THD; i++) {
                    double acc = 0;
                    for (int j = lo; j <= t; j++)
                        acc += sc[j] / sum * v[l][j][kvh * THD + i];
                    o[hh * THD + i] = acc;
                }
            }
            ref_matvec(a, o, W(s, l, "self_attn.o_proj.weight"), TH, TQ);
            for (int i = 0; i < TH; i++)
                x[t][i] += a[i];
            ref_rmsnorm(h, x[t], W(s, l, "post_attention_layernorm.weight"), TH,
                        1e-5);
            ref_matvec(g, h, W(s, l, "mlp.gate_proj.weight"), TI, TH);
            ref_matvec(u, h, W(s, l, "mlp.up_proj.weight"), TI, TH);
            for (int i = 0; i < TI; i++)
                m[i] = g[i] / (1.0 + exp(-g[i])) * u[i];
            ref_matvec(d, m, W(s, l, "mlp.down_proj.weight"), TH, TI);
            for (int i = 0; i < TH; i++)
                x[t][i] += d[i];
        }
    }
    const float *head = tie ? emb : W(s, -1, "lm_head.weight");
    for (int t = 0; t < n; t++) {
        double *h = ref_hidden[t]; /* the final-norm hidden state (embeddings) */
        ref_rmsnorm(h, x[t], W(s, -1, "model.norm.weight"), TH, 1e-5);
        if (logits)
            ref_matvec(logits + (size_t)t * TV, h, head, TV, TH);
    }
}

static void ref_forward(wt_set *s, bool tie, const int32_t *tokens, int n, double *logits)
{
    ref_forward_window(s, tie, tokens, n, 0, logits);
}

/* ---- fixtures ------------------------------------------------------------- */

typedef struct fixture {
    char dir[256];
    executor *ex;
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    if (!f)
        return -1;
    snprintf(f->dir, sizeof f->dir, "/tmp/pg_test_model_load_XXXXXX");
    if (!mkdtemp(f->dir))
        return -1;
    pg_error err;
#ifdef PG_MODEL_LOAD_CUDA
    cuda_executor_params cp = cuda_executor_params_default();
    cp.precision = 1; /* f32: the reference's tolerances */
    if (cuda_executor_create(&f->ex, &cp, &err)) {
#else
    cpu_executor_params cp = {.threads = 2};
    if (cpu_executor_create(&f->ex, &cp, &err)) {
#endif
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    char path[300];
    snprintf(path, sizeof path, "%s/model.safetensors", f->dir);
    unlink(path);
    rmdir(f->dir);
    f->ex->op->destroy(f->ex);
    free(f);
    return 0;
}

static const model_params tiny_params = {
    .num_kv_blocks = 12, .block_size = 2, .max_num_batched_tokens = 16, .max_num_seqs = 4};

/* Writes s, opens it and tries model_create; returns the status, err filled. */
static int try_load(fixture *f, wt_set *s, const llama_config *cfg, model **m, st_file **st,
                    pg_error *err)
{
    wt_write(s, f->dir);
    char path[300];
    snprintf(path, sizeof path, "%s/model.safetensors", f->dir);
    int rc = st_open(st, path, err);
    assert_int_equal(rc, 0);
    return model_create(m, f->ex, cfg, *st, &tiny_params, err);
}

static void expect_load_error(fixture *f, wt_set *s, const llama_config *cfg, const char *want1,
                              const char *want2)
{
    model *m = NULL;
    st_file *st = NULL;
    pg_error err;
    err.msg[0] = 0;
    int rc = try_load(f, s, cfg, &m, &st, &err);
    printf("    load error: %s\n", err.msg);
    assert_int_not_equal(rc, 0);
    assert_null(m);
    assert_non_null(strstr(err.msg, want1));
    if (want2)
        assert_non_null(strstr(err.msg, want2));
    st_close(st);
}

/* ---- tests ---------------------------------------------------------------- */

static void test_wrong_shape_named(void **state)
{
    fixture *f = *state;
    llama_config cfg = tiny_config(false);
    wt_set s;
    tiny_weights(&s, false, 1);
    /* k_proj of layer 1 given as [Q][H] = [16,16] instead of [KVD][H] = [8,16] */
    wt_remove(&s, "model.layers.1.self_attn.k_proj.weight");
    pg_test_rng rng = {9};
    wt_add(&s, &rng, "model.layers.1.self_attn.k_proj.weight", ST_F32, 2, TQ, TH, -1, 1);
    expect_load_error(f, &s, &cfg, "model.layers.1.self_attn.k_proj.weight", "expected [8,16]");
    expect_load_error(f, &s, &cfg, "got [16,16]", NULL);
    wt_free(&s);

    /* a 1-d norm weight of the wrong length */
    tiny_weights(&s, false, 1);
    wt_remove(&s, "model.norm.weight");
    wt_add(&s, &rng, "model.norm.weight", ST_F32, 1, TH + 1, 0, 0, 1);
    expect_load_error(f, &s, &cfg, "model.norm.weight", "expected [16]");
    wt_free(&s);
}

static void test_missing_tensor_named(void **state)
{
    fixture *f = *state;
    llama_config cfg = tiny_config(false);
    wt_set s;
    tiny_weights(&s, false, 2);
    wt_remove(&s, "model.layers.0.mlp.up_proj.weight");
    expect_load_error(f, &s, &cfg, "model.layers.0.mlp.up_proj.weight", "not found");
    wt_free(&s);

    /* untied config but no lm_head.weight */
    tiny_weights(&s, true, 2);
    expect_load_error(f, &s, &cfg, "lm_head.weight", "not found");
    wt_free(&s);
}

static void test_wrong_dtype_named(void **state)
{
    fixture *f = *state;
    llama_config cfg = tiny_config(true);
    wt_set s;
    tiny_weights(&s, true, 3);
    wt_remove(&s, "model.embed_tokens.weight");
    pg_test_rng rng = {5};
    wt_add(&s, &rng, "model.embed_tokens.weight", ST_I32, 2, TV, TH, 0, 3);
    expect_load_error(f, &s, &cfg, "model.embed_tokens.weight", "I32");
    wt_free(&s);
}

static void test_out_of_memory_says_numbers(void **state)
{
#if defined(__SANITIZE_ADDRESS__)
    (void)state;
    skip(); /* ASan aborts on absurd allocation sizes instead of returning NULL */
#else
    fixture *f = *state;
    llama_config cfg = tiny_config(true);
    wt_set s;
    tiny_weights(&s, true, 4);
    wt_write(&s, f->dir);
    char path[300];
    snprintf(path, sizeof path, "%s/model.safetensors", f->dir);
    st_file *st = NULL;
    pg_error err;
    assert_int_equal(st_open(&st, path, &err), 0);
    /* 2^31-1 blocks of 256 tokens: ~ 16 TiB of cache */
    model_params p = tiny_params;
    p.num_kv_blocks = INT32_MAX;
    p.block_size = 256;
    model *m = NULL;
    int rc = model_create(&m, f->ex, &cfg, st, &p, &err);
    printf("    oom error: %s\n", err.msg);
    assert_int_equal(rc, PG_ENOMEM);
    assert_null(m);
    assert_non_null(strstr(err.msg, "kv cache"));
    assert_non_null(strstr(err.msg, "2147483647 blocks"));
    st_close(st);
    wt_free(&s);
#endif
}

static void test_sizes(void **state)
{
    fixture *f = *state;
    llama_config cfg = tiny_config(false);
    /* f32 executor: 2 layers * (K+V) * block_size * nkv * hd * 4 bytes */
    assert_int_equal(model_kv_bytes_per_block(&cfg, f->ex, 16), 2u * 2u * 16u * TNKV * THD * 4u);
    size_t per_layer = (size_t)(TQ + 2 * TKVD) * TH + (size_t)TH * TQ + 3u * TI * TH;
    size_t wt = 2u * TV * TH + TNL * per_layer;
    size_t f32 = 2u * TNL * TH + TH + THD / 2;
    assert_int_equal(model_weight_bytes(&cfg, f->ex), (wt + f32) * 4u);
    cfg.tie_word_embeddings = true;
    assert_int_equal(model_weight_bytes(&cfg, f->ex), (wt - (size_t)TV * TH + f32) * 4u);
}

static double max_abs(const double *x, int n)
{
    double m = 0;
    for (int i = 0; i < n; i++)
        if (fabs(x[i]) > m)
            m = fabs(x[i]);
    return m;
}

static void expect_close(const float *got, const double *want, const char *what)
{
    double scale = max_abs(want, TV), worst = 0;
    for (int i = 0; i < TV; i++) {
        double d = fabs((double)got[i] - want[i]);
        if (d > worst)
            worst = d;
    }
    printf("    %s: max |diff| %.3g (max |logit| %.3g)\n", what, worst, scale);
    assert_true(worst <= 1e-4 * scale);
}

/* Three steps on scattered blocks (block_size 2):
 *   step 1: A prefill 5 tokens (samples) + B first chunk 3 of 7 (no logits)
 *   step 2: A decode 1 token (samples) + B rest 4 tokens (samples)
 *   copy A's partial last block, then
 *   step 3: A decodes on its table and A' (same context, the copy) on another:
 *           identical logits, both equal to the reference. */
static void test_forward_matches_reference(void **state)
{
    fixture *f = *state;
    for (int tie = 0; tie <= 1; tie++) {
        llama_config cfg = tiny_config(tie);
        wt_set s;
        tiny_weights(&s, tie, 42 + (uint64_t)tie);
        model *m = NULL;
        st_file *st = NULL;
        pg_error err;
        int rc = try_load(f, &s, &cfg, &m, &st, &err);
        if (rc)
            fprintf(stderr, "%s\n", err.msg);
        assert_int_equal(rc, 0);
        st_close(st); /* weights are only borrowed during model_create */

        const int32_t A[7] = {1, 7, 3, 30, 12, 5, 9};
        const int32_t B[7] = {1, 22, 4, 4, 17, 31, 0};
        double refA[7][TV], refB[7][TV];
        ref_forward(&s, tie, A, 7, &refA[0][0]);
        ref_forward(&s, tie, B, 7, &refB[0][0]);

        /* block tables: A [5,2,7,8], B [1,6,3,0], A' [5,2,4,9] */
        enum { STRIDE = 4 };
        int32_t bt[3 * STRIDE] = {5, 2, 7, 8, 1, 6, 3, 0, 5, 2, 4, 9};
#define SLOT(row, pos) (bt[(row) * STRIDE + (pos) / 2] * 2 + (pos) % 2)
        float logits[4 * TV];

        /* step 1 */
        int32_t t1[8], p1[8], sl1[8];
        for (int i = 0; i < 5; i++) {
            t1[i] = A[i];
            p1[i] = i;
            sl1[i] = SLOT(0, i);
        }
        for (int i = 0; i < 3; i++) {
            t1[5 + i] = B[i];
            p1[5 + i] = i;
            sl1[5 + i] = SLOT(1, i);
        }
        int32_t qs1[3] = {0, 5, 8}, lens1[2] = {5, 3}, rows1[1] = {4};
        step_batch b1 = {.num_tokens = 8, .num_seqs = 2, .block_size = 2, .token_ids = t1,
                         .positions = p1, .slots = sl1, .query_start = qs1, .seq_lens = lens1,
                         .block_tables = bt, .block_table_stride = STRIDE, .max_seq_len = 5,
                         .max_query_len = 5, .num_logits = 1, .logits_rows = rows1};
        /* step 0: B's first chunk alone, no logits (a cache-only step; step 1
         * rewrites the same slots with the same values) */
        int32_t qs0[2] = {0, 3};
        step_batch b0 = b1;
        b0.num_tokens = 3;
        b0.num_seqs = 1;
        b0.token_ids = t1 + 5;
        b0.positions = p1 + 5;
        b0.slots = sl1 + 5;
        b0.query_start = qs0;
        b0.seq_lens = lens1 + 1;
        b0.block_tables = bt + STRIDE;
        b0.max_seq_len = 3;
        b0.max_query_len = 3;
        b0.num_logits = 0;
        b0.logits_rows = NULL;
        for (int i = 0; i < 4 * TV; i++)
            logits[i] = -7.0f;
        assert_int_equal(model_forward(m, &b0, logits, &err), 0);
        for (int i = 0; i < 4 * TV; i++)
            assert_true(logits[i] == -7.0f); /* nothing written */
        assert_int_equal(model_forward(m, &b1, logits, &err), 0);
        expect_close(logits, refA[4], "A after prefill");

        /* step 2 */
        int32_t t2[5] = {A[5], B[3], B[4], B[5], B[6]};
        int32_t p2[5] = {5, 3, 4, 5, 6};
        int32_t sl2[5] = {SLOT(0, 5), SLOT(1, 3), SLOT(1, 4), SLOT(1, 5), SLOT(1, 6)};
        int32_t qs2[3] = {0, 1, 5}, lens2[2] = {6, 7}, rows2[2] = {0, 4};
        step_batch b2 = b1;
        b2.num_tokens = 5;
        b2.token_ids = t2;
        b2.positions = p2;
        b2.slots = sl2;
        b2.query_start = qs2;
        b2.seq_lens = lens2;
        b2.max_seq_len = 7;
        b2.max_query_len = 4;
        b2.num_logits = 2;
        b2.logits_rows = rows2;
        assert_int_equal(model_forward(m, &b2, logits, &err), 0);
        expect_close(logits, refA[5], "A decode");
        expect_close(logits + TV, refB[6], "B chunked prefill");

        /* copy-on-write: A's block 7 (positions 4, 5) -> 4; out-of-range refused */
        int32_t pair[2] = {7, 4};
        assert_int_equal(model_copy_blocks(m, pair, 1, &err), 0);
        int32_t bad[2] = {7, 12};
        assert_int_equal(model_copy_blocks(m, bad, 1, &err), PG_EINVAL);
        assert_non_null(strstr(err.msg, "12"));

        /* step 3: rows A (table row 0) and A' (table row 2) */
        int32_t bt3[2 * STRIDE] = {5, 2, 7, 8, 5, 2, 4, 9};
        int32_t t3[2] = {A[6], A[6]}, p3[2] = {6, 6};
        int32_t sl3[2] = {8 * 2 + 0, 9 * 2 + 0};
        int32_t qs3[3] = {0, 1, 2}, lens3[2] = {7, 7}, rows3[2] = {0, 1};
        step_batch b3 = b1;
        b3.num_tokens = 2;
        b3.token_ids = t3;
        b3.positions = p3;
        b3.slots = sl3;
        b3.query_start = qs3;
        b3.seq_lens = lens3;
        b3.block_tables = bt3;
        b3.max_seq_len = 7;
        b3.max_query_len = 1;
        b3.num_logits = 2;
        b3.logits_rows = rows3;
        assert_int_equal(model_forward(m, &b3, logits, &err), 0);
        expect_close(logits, refA[6], "A decode 2");
        assert_memory_equal(logits, logits + TV, TV * sizeof(float));

        /* a batch over the workspace limits is refused */
        step_batch big = b3;
        big.num_tokens = tiny_params.max_num_batched_tokens + 1;
        assert_int_equal(model_forward(m, &big, logits, &err), PG_EINVAL);
        assert_non_null(strstr(err.msg, "max_num_batched_tokens"));
        step_batch wrong_bs = b3;
        wrong_bs.block_size = 4;
        assert_int_equal(model_forward(m, &wrong_bs, logits, &err), PG_EINVAL);

        engine_backend be = model_backend(m);
        assert_int_equal(be.vocab_size, TV);
        assert_ptr_equal(be.ctx, m);
        model_destroy(m);
        wt_free(&s);
#undef SLOT
    }
}

/* A tiny MistralForCausalLM with sliding_window 5 (block size 2: the
 * window spans parts of three blocks): a prefill of 9, a chunk of 7, then 4
 * decodes, on a scattered block table; every sampled row equals the double
 * reference with the window, and (so that the test can fail) the window
 * changes the logits against full attention from position 5 on. */
static void test_forward_sliding_window(void **state)
{
    fixture *f = *state;
    enum { N = 20, W = 5 };
    llama_config cfg = tiny_config(false);
    snprintf(cfg.architecture, sizeof cfg.architecture, "MistralForCausalLM");
    cfg.sliding_window = W;
    wt_set s;
    tiny_weights(&s, false, 7);
    model *m = NULL;
    st_file *st = NULL;
    pg_error err;
    int rc = try_load(f, &s, &cfg, &m, &st, &err);
    if (rc)
        fprintf(stderr, "%s\n", err.msg);
    assert_int_equal(rc, 0);
    st_close(st);

    int32_t tok[N];
    for (int i = 0; i < N; i++)
        tok[i] = (int32_t)((i * 7 + 3) % TV);
    static double ref[N][TV], full[N][TV];
    ref_forward_window(&s, false, tok, N, W, &ref[0][0]);
    ref_forward(&s, false, tok, N, &full[0][0]);
    double diff = 0;
    for (int i = 0; i < TV; i++)
        diff = fmax(diff, fabs(ref[N - 1][i] - full[N - 1][i]));
    assert_true(diff > 1e-3 * max_abs(full[N - 1], TV));

    int32_t bt[10] = {11, 3, 8, 0, 5, 9, 1, 10, 2, 7};
    /* steps: [start, end) of positions; logits at the last */
    const int32_t steps[][2] = {{0, 9}, {9, 16}, {16, 17}, {17, 18}, {18, 19}, {19, 20}};
    float logits[TV];
    for (size_t k = 0; k < sizeof steps / sizeof steps[0]; k++) {
        const int32_t p0 = steps[k][0], p1 = steps[k][1], q = p1 - p0;
        int32_t pos[16], slots[16], qs[2] = {0, q}, len = p1, row = q - 1;
        for (int32_t i = 0; i < q; i++) {
            pos[i] = p0 + i;
            slots[i] = bt[(p0 + i) / 2] * 2 + (p0 + i) % 2;
        }
        step_batch b = {.num_tokens = q, .num_seqs = 1, .block_size = 2, .token_ids = tok + p0,
                        .positions = pos, .slots = slots, .query_start = qs, .seq_lens = &len,
                        .block_tables = bt, .block_table_stride = 10, .max_seq_len = len,
                        .max_query_len = q, .num_logits = 1, .logits_rows = &row};
        assert_int_equal(model_forward(m, &b, logits, &err), 0);
        char what[64];
        snprintf(what, sizeof what, "window %d, position %d", W, (int)(p1 - 1));
        expect_close(logits, ref[p1 - 1], what);
    }
    model_destroy(m);
    wt_free(&s);
}

/* ---- Qwen2 / Qwen3 (llama_family) ------------------------------------------ */

/* A tiny Qwen-shaped model: hd may differ from H / nh (Qwen3), three layers
 * so that a window can sit on some of them. */
enum { QH = 16, QI = 24, QNL = 3, QNH = 4, QNKV = 2, QV = 32 };

static llama_config qwen_config(int qwen3, int32_t hd, bool tie)
{
    llama_config c = tiny_config(tie);
    snprintf(c.architecture, sizeof c.architecture, qwen3 ? "Qwen3ForCausalLM" : "Qwen2ForCausalLM");
    c.hidden_size = QH;
    c.intermediate_size = QI;
    c.num_hidden_layers = QNL;
    c.num_attention_heads = QNH;
    c.num_key_value_heads = QNKV;
    c.head_dim = hd;
    c.vocab_size = QV;
    c.rms_norm_eps = 1e-6f;
    c.rope_theta = 1000000.0f;
    c.family.qkv_bias = !qwen3;
    c.family.qk_norm = qwen3 != 0;
    return c;
}

/* Every tensor bf16-exact (so that bf16 storage is lossless), biases and
 * norms in f32 as Qwen checkpoints keep them in bf16 too. */
static void qwen_weights(wt_set *s, const llama_config *c, uint64_t seed)
{
    pg_test_rng rng = {seed};
    char name[96];
    const int64_t H = c->hidden_size, I = c->intermediate_size, hd = c->head_dim;
    const int64_t Q = c->num_attention_heads * hd, KVD = c->num_key_value_heads * hd, V = c->vocab_size;
    s->n = 0;
    wt_add(s, &rng, "model.embed_tokens.weight", ST_BF16, 2, V, H, -1.0f, 1.0f);
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const float a = 0.5f;
#define ADD(suffix, dt, nd, d0, d1, lo, hi) \
    (snprintf(name, sizeof name, "model.layers.%d." suffix, l), wt_add(s, &rng, name, dt, nd, d0, d1, lo, hi))
        ADD("input_layernorm.weight", ST_BF16, 1, H, 0, 0.5f, 1.5f);
        ADD("self_attn.q_proj.weight", ST_BF16, 2, Q, H, -a, a);
        ADD("self_attn.k_proj.weight", ST_BF16, 2, KVD, H, -a, a);
        ADD("self_attn.v_proj.weight", ST_BF16, 2, KVD, H, -a, a);
        if (c->family.qkv_bias) { /* large enough to move the logits */
            ADD("self_attn.q_proj.bias", ST_BF16, 1, Q, 0, -1.0f, 1.0f);
            ADD("self_attn.k_proj.bias", ST_F32, 1, KVD, 0, -1.0f, 1.0f);
            ADD("self_attn.v_proj.bias", ST_F16, 1, KVD, 0, -1.0f, 1.0f);
        }
        if (c->family.qk_norm) {
            ADD("self_attn.q_norm.weight", ST_BF16, 1, hd, 0, 0.25f, 2.0f);
            ADD("self_attn.k_norm.weight", ST_F32, 1, hd, 0, 0.25f, 2.0f);
        }
        ADD("self_attn.o_proj.weight", ST_BF16, 2, H, Q, -a, a);
        ADD("post_attention_layernorm.weight", ST_BF16, 1, H, 0, 0.5f, 1.5f);
        ADD("mlp.gate_proj.weight", ST_BF16, 2, I, H, -a, a);
        ADD("mlp.up_proj.weight", ST_BF16, 2, I, H, -a, a);
        ADD("mlp.down_proj.weight", ST_BF16, 2, H, I, -a, a);
#undef ADD
    }
    wt_add(s, &rng, "model.norm.weight", ST_BF16, 1, H, 0, 0.5f, 1.5f);
    if (!c->tie_word_embeddings)
        wt_add(s, &rng, "lm_head.weight", ST_BF16, 2, V, H, -1.0f, 1.0f);
}

/* transformers' Qwen2RMSNorm / Qwen3RMSNorm in double (= LlamaRMSNorm) */
static void qref_rmsnorm(double *v, const double *x, const float *w, int n, double eps)
{
    double ss = 0;
    for (int i = 0; i < n; i++)
        ss += x[i] * x[i];
    const double r = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++)
        v[i] = x[i] * r * (double)w[i];
}

/* logits [n][V] of every position of tokens[0..n), in double, after
 * modeling_qwen2.py / modeling_qwen3.py (transformers v5 main 008e5743):
 *   q = q_proj(h) (+ bias: Qwen2); Qwen3: q = q_norm(q.view(.., hd)), k alike;
 *   apply_rotary_pos_emb (rotate_half, inv_freq = theta^(-2i/hd));
 *   softmax(q k^T * hd^-0.5 + causal mask (+ the layer's sliding window)) v;
 *   o_proj (no bias); residual; post_attention_layernorm; SwiGLU; residual;
 *   norm; lm_head (tied: embed_tokens). */
static void qwen_ref_forward(wt_set *s, const llama_config *c, const int32_t *tokens, int n, double *logits)
{
    const int H = c->hidden_size, I = c->intermediate_size, NL = c->num_hidden_layers;
    const int nh = c->num_attention_heads, nkv = c->num_key_value_heads, hd = c->head_dim, V = c->vocab_size;
    const int Q = nh * hd, KVD = nkv * hd;
    const double eps = c->rms_norm_eps, theta = c->rope_theta;
    double *x = calloc((size_t)n * H, sizeof *x), *k = calloc((size_t)NL * n * KVD, sizeof *k);
    double *v = calloc((size_t)NL * n * KVD, sizeof *v), *sc = calloc((size_t)n, sizeof *sc);
    double *h = calloc((size_t)(H + I), sizeof *h), *q = calloc((size_t)Q, sizeof *q), *o = calloc((size_t)Q, sizeof *o);
    double *g = calloc((size_t)I, sizeof *g), *u = calloc((size_t)I, sizeof *u), *d = calloc((size_t)H, sizeof *d);
    assert_true(x && k && v && sc && h && q && o && g && u && d);
    const float *emb = W(s, -1, "model.embed_tokens.weight");
    for (int t = 0; t < n; t++)
        for (int i = 0; i < H; i++)
            x[(size_t)t * H + i] = emb[(size_t)tokens[t] * H + i];
    for (int l = 0; l < NL; l++) {
        const int window = llama_layer_window(c, l);
        for (int t = 0; t < n; t++) {
            double *xt = x + (size_t)t * H, *kt = k + ((size_t)l * n + t) * KVD, *vt = v + ((size_t)l * n + t) * KVD;
            qref_rmsnorm(h, xt, W(s, l, "input_layernorm.weight"), H, eps);
            ref_matvec(q, h, W(s, l, "self_attn.q_proj.weight"), Q, H);
            ref_matvec(kt, h, W(s, l, "self_attn.k_proj.weight"), KVD, H);
            ref_matvec(vt, h, W(s, l, "self_attn.v_proj.weight"), KVD, H);
            if (c->family.qkv_bias) {
                const float *bq = W(s, l, "self_attn.q_proj.bias"), *bk = W(s, l, "self_attn.k_proj.bias");
                const float *bv = W(s, l, "self_attn.v_proj.bias");
                for (int i = 0; i < Q; i++)
                    q[i] += (double)bq[i];
                for (int i = 0; i < KVD; i++) {
                    kt[i] += (double)bk[i];
                    vt[i] += (double)bv[i];
                }
            }
            for (int hh = 0; hh < nh + nkv; hh++) {
                double *head = hh < nh ? q + hh * hd : kt + (hh - nh) * hd;
                if (c->family.qk_norm)
                    qref_rmsnorm(head, head,
                                 W(s, l, hh < nh ? "self_attn.q_norm.weight" : "self_attn.k_norm.weight"), hd, eps);
                for (int i = 0; i < hd / 2; i++) {
                    const double inv = pow(theta, -(2.0 * i) / hd), cs = cos(t * inv), sn = sin(t * inv);
                    const double a0 = head[i], b0 = head[i + hd / 2];
                    head[i] = a0 * cs - b0 * sn;
                    head[i + hd / 2] = b0 * cs + a0 * sn;
                }
            }
            for (int hh = 0; hh < nh; hh++) {
                const int kvh = hh / (nh / nkv);
                const int lo = window > 0 && t - window + 1 > 0 ? t - window + 1 : 0;
                double mx = -1e300, sum = 0;
                for (int j = lo; j <= t; j++) {
                    double dot = 0;
                    for (int i = 0; i < hd; i++)
                        dot += q[hh * hd + i] * k[((size_t)l * n + j) * KVD + (size_t)kvh * hd + i];
                    sc[j] = dot / sqrt((double)hd);
                    mx = fmax(mx, sc[j]);
                }
                for (int j = lo; j <= t; j++)
                    sum += (sc[j] = exp(sc[j] - mx));
                for (int i = 0; i < hd; i++) {
                    double acc = 0;
                    for (int j = lo; j <= t; j++)
                        acc += sc[j] / sum * v[((size_t)l * n + j) * KVD + (size_t)kvh * hd + i];
                    o[hh * hd + i] = acc;
                }
            }
            ref_matvec(d, o, W(s, l, "self_attn.o_proj.weight"), H, Q);
            for (int i = 0; i < H; i++)
                xt[i] += d[i];
            qref_rmsnorm(h, xt, W(s, l, "post_attention_layernorm.weight"), H, eps);
            ref_matvec(g, h, W(s, l, "mlp.gate_proj.weight"), I, H);
            ref_matvec(u, h, W(s, l, "mlp.up_proj.weight"), I, H);
            for (int i = 0; i < I; i++)
                g[i] = g[i] / (1.0 + exp(-g[i])) * u[i];
            ref_matvec(d, g, W(s, l, "mlp.down_proj.weight"), H, I);
            for (int i = 0; i < H; i++)
                xt[i] += d[i];
        }
    }
    const float *head_w = c->tie_word_embeddings ? emb : W(s, -1, "lm_head.weight");
    for (int t = 0; t < n; t++) {
        qref_rmsnorm(h, x + (size_t)t * H, W(s, -1, "model.norm.weight"), H, eps);
        ref_matvec(logits + (size_t)t * V, h, head_w, V, H);
    }
    free(x), free(k), free(v), free(sc), free(h), free(q), free(o), free(g), free(u), free(d);
}

/* log_softmax of n logits (double) */
static void log_softmax_d(double *out, const double *z, int n)
{
    double mx = -1e300, sum = 0;
    for (int i = 0; i < n; i++)
        mx = fmax(mx, z[i]);
    for (int i = 0; i < n; i++)
        sum += exp(z[i] - mx);
    for (int i = 0; i < n; i++)
        out[i] = z[i] - mx - log(sum);
}

/* The tolerance of expect_row: 1e-4 (f32 arithmetic); the CUDA executor's
 * bf16 precision is held to 5e-2 of max |logit| (test_cuda_e2e's bound for
 * the goldens), its logprobs and greedy token checked where that bound
 * decides them. */
static double qwen_tol = 1e-4;

/* The engine's checks of one sampled row: logits within qwen_tol of max
 * |logit|, the same greedy token, every logprob within qwen_tol. */
static void expect_row(const float *got, const double *want, const char *what)
{
    double zg[QV], lg[QV], lw[QV];
    int ag = 0, aw = 0;
    for (int i = 0; i < QV; i++) {
        zg[i] = got[i];
        ag = got[i] > got[ag] ? i : ag;
        aw = want[i] > want[aw] ? i : aw;
    }
    log_softmax_d(lg, zg, QV);
    log_softmax_d(lw, want, QV);
    double worst = 0, scale = max_abs(want, QV), dl = 0, second = -1e300;
    for (int i = 0; i < QV; i++) {
        worst = fmax(worst, fabs(zg[i] - want[i]));
        dl = fmax(dl, fabs(lg[i] - lw[i]));
        if (i != aw)
            second = fmax(second, want[i]);
    }
    printf("    %s: max |dlogit| %.3g (max |logit| %.3g), max |dlogprob| %.3g, greedy %d / %d\n", what, worst, scale,
           dl, ag, aw);
    assert_true(worst <= qwen_tol * scale);
    assert_true(dl <= 2.0 * qwen_tol * scale); /* a logprob moves by at most 2 max |dlogit| */
    if (qwen_tol <= 1e-4)
        assert_true(dl <= 1e-4);
    if (want[aw] - second > 2.0 * qwen_tol * scale)
        assert_int_equal(ag, aw);
}

/* Runs sequences A (12 tokens) and B (9) through ragged steps: both
 * prefill (A 6, B 3: B without logits), then A decodes while B prefills a
 * chunk of 4, then both decode to their ends; every sampled row is checked
 * against the double reference. Returns the logits of the last step
 * ([2][V]) in last (for comparing storage types). */
static void qwen_run(executor *ex, wt_set *s, const llama_config *cfg, const char *dir, const char *tag,
                     float *last)
{
    enum { NA = 12, NB = 9, BS = 2, STRIDE = 8 };
    const int32_t A[NA] = {1, 7, 3, 30, 12, 5, 9, 9, 21, 2, 17, 4};
    const int32_t B[NB] = {1, 22, 4, 4, 17, 31, 0, 8, 13};
    double *refA = calloc((size_t)NA * QV, sizeof(double)), *refB = calloc((size_t)NB * QV, sizeof(double));
    assert_true(refA && refB);
    qwen_ref_forward(s, cfg, A, NA, refA);
    qwen_ref_forward(s, cfg, B, NB, refB);

    char path[300];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    st_file *st = NULL;
    pg_error err;
    assert_int_equal(st_open(&st, path, &err), 0);
    model_params mp = {.num_kv_blocks = 16, .block_size = BS, .max_num_batched_tokens = 16, .max_num_seqs = 4};
    model *m = NULL;
    int rc = model_create(&m, ex, cfg, st, &mp, &err);
    if (rc)
        fprintf(stderr, "%s\n", err.msg);
    assert_int_equal(rc, 0);
    st_close(st);
#ifdef PG_MODEL_LOAD_CUDA
    /* the decode steps replay CUDA graphs (captured anew for each model:
     * its buffers are baked in), per-layer windows included */
    assert_int_equal(cuda_executor_set_graphs(ex, 2, 16, &err), 0);
    long captures0 = 0, replays0 = 0, captures1 = 0, replays1 = 0;
    cuda_executor_graph_stats(ex, &captures0, &replays0);
#endif

    /* scattered tables: A rows 0, B row 1 */
    const int32_t bt[2 * STRIDE] = {9, 2, 14, 5, 0, 11, 3, 15, 7, 12, 1, 10, 6, 13, 8, 4};
    int32_t doneA = 0, doneB = 0;
    /* per step: tokens of A, tokens of B */
    const int32_t plan[][2] = {{6, 3}, {1, 4}, {1, 1}, {1, 1}, {1, 0}, {1, 0}, {1, 0}};
    float logits[2 * QV];
    for (size_t k = 0; k < sizeof plan / sizeof plan[0]; k++) {
        int32_t tok[16], pos[16], slot[16], qs[3] = {0}, lens[2], rows[2];
        int32_t T = 0, S = 0, L = 0, maxq = 0, maxlen = 0;
        int32_t rowmap[2];
        for (int sq = 0; sq < 2; sq++) {
            const int32_t q = plan[k][sq];
            if (q == 0)
                continue;
            const int32_t *ids = sq ? B : A;
            int32_t *done = sq ? &doneB : &doneA;
            for (int32_t i = 0; i < q; i++) {
                const int32_t p = *done + i;
                tok[T] = ids[p];
                pos[T] = p;
                slot[T] = bt[sq * STRIDE + p / BS] * BS + p % BS;
                T++;
            }
            *done += q;
            lens[S] = *done;
            rowmap[S] = sq;
            qs[S + 1] = T;
            maxq = q > maxq ? q : maxq;
            maxlen = *done > maxlen ? *done : maxlen;
            /* B's first chunk samples nothing (a chunked prefill) */
            if (!(sq == 1 && k == 0))
                rows[L++] = T - 1;
            S++;
        }
        int32_t tables[2 * STRIDE];
        for (int32_t si = 0; si < S; si++)
            memcpy(tables + si * STRIDE, bt + rowmap[si] * STRIDE, STRIDE * sizeof(int32_t));
        step_batch b = {.num_tokens = T, .num_seqs = S, .block_size = BS, .token_ids = tok, .positions = pos,
                        .slots = slot, .query_start = qs, .seq_lens = lens, .block_tables = tables,
                        .block_table_stride = STRIDE, .max_seq_len = maxlen, .max_query_len = maxq,
                        .num_logits = L, .logits_rows = rows};
        rc = model_forward(m, &b, logits, &err);
        if (rc)
            fprintf(stderr, "%s\n", err.msg);
        assert_int_equal(rc, 0);
        int32_t r = 0;
        for (int32_t si = 0; si < S; si++) {
            if (rowmap[si] == 1 && k == 0)
                continue;
            const int32_t p = lens[si] - 1;
            char what[128];
            snprintf(what, sizeof what, "%s %c position %d", tag, rowmap[si] ? 'B' : 'A', (int)p);
            if (!last) /* f32 storage: the reference; other storage types: compared to it by the caller */
                expect_row(logits + (size_t)r * QV, (rowmap[si] ? refB : refA) + (size_t)p * QV, what);
            r++;
        }
        if (last && k == sizeof plan / sizeof plan[0] - 1)
            memcpy(last, logits, (size_t)L * QV * sizeof(float));
    }
#ifdef PG_MODEL_LOAD_CUDA
    cuda_executor_graph_stats(ex, &captures1, &replays1);
    printf("    %s: %ld graph captures, %ld replays\n", tag, captures1 - captures0, replays1 - replays0);
    assert_true(replays1 > replays0);
#endif
    model_destroy(m);
    free(refA);
    free(refB);
}

/* A Qwen2-style model (q/k/v biases, untied, hd = H / nh) and a
 * Qwen3-style one (q/k norms, hd 8 != H / nh = 4, tied embeddings) against
 * the double reference; then the same with a window on layer 1 only (Qwen2,
 * layer_types) and on layers 1, 2 (Qwen3, max_window_layers 1), where the
 * reference shows the window changes the logits. */
static void test_qwen_matches_reference(void **state)
{
    fixture *f = *state;
#ifdef PG_MODEL_LOAD_CUDA
    const int32_t qwen2_hd = 8; /* CUDA attention: head_dim 8 .. 256 */
#else
    const int32_t qwen2_hd = 4; /* hidden / heads, as Qwen2 configs have it */
#endif
    for (int qwen3 = 0; qwen3 <= 1; qwen3++) {
        for (int windowed = 0; windowed <= 1; windowed++) {
            llama_config cfg = qwen_config(qwen3, qwen3 ? 8 : qwen2_hd, qwen3 != 0);
            if (windowed) {
                cfg.family.layer_window = 3;
                cfg.family.window_layers[0] = qwen3 ? 0x6u : 0x2u;
            }
            wt_set s;
            qwen_weights(&s, &cfg, 100 + (uint64_t)(qwen3 * 2 + windowed));
            wt_write(&s, f->dir);
            if (windowed) { /* so that the test can fail: the window matters */
                llama_config full = cfg;
                full.family.layer_window = 0;
                double a[12 * QV], b[12 * QV];
                const int32_t ids[12] = {1, 7, 3, 30, 12, 5, 9, 9, 21, 2, 17, 4};
                qwen_ref_forward(&s, &cfg, ids, 12, a);
                qwen_ref_forward(&s, &full, ids, 12, b);
                double diff = 0;
                for (int i = 0; i < QV; i++)
                    diff = fmax(diff, fabs(a[11 * QV + i] - b[11 * QV + i]));
                assert_true(diff > 1e-3 * max_abs(b + 11 * QV, QV));
            }
            char tag[64];
            snprintf(tag, sizeof tag, "%s%s", qwen3 ? "qwen3" : "qwen2", windowed ? " windowed" : "");
            qwen_run(f->ex, &s, &cfg, f->dir, tag, NULL);
            wt_free(&s);
        }
    }
}

#ifdef PG_MODEL_LOAD_CUDA
/* The CUDA executor's default bf16 precision (bias.cu and qk_norm.cu in
 * bf16) through the same models and steps, at bf16's tolerance. */
static void test_qwen_cuda_bf16(void **state)
{
    fixture *f = *state;
    executor *ex = NULL;
    pg_error err;
    cuda_executor_params cp = cuda_executor_params_default(); /* bf16 activations, weights, KV */
    assert_int_equal(cuda_executor_create(&ex, &cp, &err), 0);
    qwen_tol = 5e-2;
    for (int qwen3 = 0; qwen3 <= 1; qwen3++) {
        llama_config cfg = qwen_config(qwen3, 8, qwen3 != 0);
        cfg.family.layer_window = 3;
        cfg.family.window_layers[0] = 0x2u;
        wt_set s;
        qwen_weights(&s, &cfg, 300 + (uint64_t)qwen3);
        wt_write(&s, f->dir);
        qwen_run(ex, &s, &cfg, f->dir, qwen3 ? "qwen3 bf16" : "qwen2 bf16", NULL);
        wt_free(&s);
    }
    qwen_tol = 1e-4;
    ex->op->destroy(ex);
}
#endif

#ifdef PG_MODEL_LOAD_CUDA
/* Launches per decode step (cuda_executor_launch_counts) on a Qwen3-style
 * model with q/k norms AND q|k|v biases (3 layers, f32 and bf16), where
 * the fused rope_kv stands for four ops: one decode step of one sequence
 * after a prefill of 5 tokens must count 9 a layer — 5 kernels (rmsnorm,
 * rope_kv, decode attention, rmsnorm, silu_mul) + 4 cuBLAS products (in
 * place: max_num_batched_tokens 128 holds a padded chunk) — plus embed 1,
 * the head's gathers 2, final rmsnorm 1, lm_head 1 and its 2 padding
 * copies: 34 (gpu/README.md "Launches per decode step"). With rope_kv
 * taken out of the table the model runs bias, q/k norm, rope and kv_write
 * one by one: 3 kernels more a layer, and the same logits bit for bit. */
static void test_qwen_launches_per_step(void **state)
{
    fixture *f = *state;
    llama_config cfg = qwen_config(1, 8, true);
    cfg.family.qkv_bias = true; /* both differences at once */
    wt_set s;
    qwen_weights(&s, &cfg, 400);
    wt_write(&s, f->dir);
    char path[300];
    snprintf(path, sizeof path, "%s/model.safetensors", f->dir);
    const int32_t ids[6] = {1, 7, 3, 30, 12, 5};
    for (int precision = 0; precision <= 1; precision++) {
        float want[QV], got[QV];
        for (int fused = 1; fused >= 0; fused--) {
            executor *ex = NULL;
            pg_error err;
            cuda_executor_params cp = cuda_executor_params_default();
            cp.precision = precision;
            assert_int_equal(cuda_executor_create(&ex, &cp, &err), 0);
            const executor_ops *ops = ex->op;
            executor_ops unfused = *ops;
            unfused.rope_kv = NULL;
            st_file *st = NULL;
            assert_int_equal(st_open(&st, path, &err), 0);
            model_params mp = {.num_kv_blocks = 16, .block_size = 4, .max_num_batched_tokens = 128,
                               .max_num_seqs = 4};
            model *m = NULL;
            if (model_create(&m, ex, &cfg, st, &mp, &err))
                fail_msg("model_create: %s", err.msg);
            st_close(st);
            if (!fused)
                ex->op = &unfused;
            int32_t pos[6], slots[6], bt[2] = {3, 1};
            for (int32_t p = 0; p < 6; p++) {
                pos[p] = p;
                slots[p] = bt[p / 4] * 4 + p % 4;
            }
            for (int step = 0; step < 2; step++) { /* prefill 5, then decode 1 */
                const int32_t t0 = step ? 5 : 0, q = step ? 1 : 5, len = t0 + q, row = q - 1;
                int32_t qs[2] = {0, q};
                step_batch b = {.num_tokens = q, .num_seqs = 1, .block_size = 4, .token_ids = ids + t0,
                                .positions = pos + t0, .slots = slots + t0, .query_start = qs,
                                .seq_lens = &len, .block_tables = bt, .block_table_stride = 2,
                                .max_seq_len = len, .max_query_len = q, .num_logits = 1,
                                .logits_rows = &row};
                if (model_forward(m, &b, fused ? want : got, &err))
                    fail_msg("model_forward: %s", err.msg);
            }
            ex->op = ops;
            cuda_launch_counts c;
            cuda_executor_launch_counts(ex, NULL, &c);
            printf("    qwen3+bias %s %s: one decode step: %llu launches = %llu kernels + %llu cuBLAS + "
                   "%llu copies (%d layers)\n", precision ? "f32" : "bf16", fused ? "fused" : "unfused",
                   (unsigned long long)c.total, (unsigned long long)c.kernels,
                   (unsigned long long)c.gemms, (unsigned long long)c.copies, (int)QNL);
            assert_int_equal(c.kernels, 1 + QNL * 5 + 3 + (fused ? 0 : 3 * QNL));
            assert_int_equal(c.gemms, QNL * 4 + 1);
            assert_int_equal(c.copies, 2);
            if (fused)
                assert_int_equal(c.total, 34);
            model_destroy(m);
            ex->op->destroy(ex);
        }
        assert_memory_equal(got, want, sizeof got);
    }
    wt_free(&s);
}
#endif

/* The new tensors' shapes are checked and named at load. */
static void test_qwen_tensors_checked(void **state)
{
    fixture *f = *state;
    llama_config cfg = qwen_config(0, 4, false);
    wt_set s;
    qwen_weights(&s, &cfg, 5);
    wt_remove(&s, "model.layers.2.self_attn.v_proj.bias");
    expect_load_error(f, &s, &cfg, "model.layers.2.self_attn.v_proj.bias", "not found");
    pg_test_rng rng = {3};
    wt_add(&s, &rng, "model.layers.2.self_attn.v_proj.bias", ST_F32, 1, 16, 0, -1, 1);
    expect_load_error(f, &s, &cfg, "model.layers.2.self_attn.v_proj.bias", "expected [8]");
    wt_free(&s);

    cfg = qwen_config(1, 8, true);
    qwen_weights(&s, &cfg, 6);
    wt_remove(&s, "model.layers.0.self_attn.k_norm.weight");
    wt_add(&s, &rng, "model.layers.0.self_attn.k_norm.weight", ST_F32, 1, 4, 0, 0, 1);
    expect_load_error(f, &s, &cfg, "model.layers.0.self_attn.k_norm.weight", "expected [8]");
    wt_free(&s);

    /* sizes: biases and norms counted as f32 */
    llama_config c2 = qwen_config(0, 4, false), c3 = qwen_config(1, 8, true);
    llama_config l2 = c2, l3 = c3;
    l2.family.qkv_bias = false;
    l3.family.qk_norm = false;
    assert_int_equal(model_weight_bytes(&c2, f->ex) - model_weight_bytes(&l2, f->ex),
                     (size_t)QNL * (QNH + 2 * QNKV) * 4 * 4u);
    assert_int_equal(model_weight_bytes(&c3, f->ex) - model_weight_bytes(&l3, f->ex), (size_t)QNL * 2 * 8 * 4u);
}

/* Every CPU storage type runs the new ops (biases and norms stay f32):
 * bf16 storage of this bf16-exact checkpoint gives f32 storage's bits, int8
 * stays within 5% of max |logit| (test_storage_model's bound). */
static void test_storage_types_qwen(void **state)
{
    fixture *f = *state;
    for (int qwen3 = 0; qwen3 <= 1; qwen3++) {
        llama_config cfg = qwen_config(qwen3, qwen3 ? 8 : 4, qwen3 != 0);
        wt_set s;
        qwen_weights(&s, &cfg, 200 + (uint64_t)qwen3);
        wt_write(&s, f->dir);
        float got[3][2 * QV] = {{0}}; /* the last step samples one row */
        for (int wt = 0; wt < 3; wt++) {
            executor *ex = NULL;
            pg_error err;
            cpu_executor_params cp = {.threads = 2, .wt_dtype = wt};
            assert_int_equal(cpu_executor_create(&ex, &cp, &err), 0);
            qwen_run(ex, &s, &cfg, f->dir, "storage", got[wt]);
            ex->op->destroy(ex);
        }
        assert_memory_equal(got[0], got[1], sizeof got[0]);
        double worst = 0, scale = 0;
        for (int i = 0; i < 2 * QV; i++) {
            worst = fmax(worst, fabs((double)got[2][i] - (double)got[0][i]));
            scale = fmax(scale, fabs((double)got[0][i]));
        }
        printf("    %s int8: max |dlogit| %.3g of max |logit| %.3g\n", qwen3 ? "qwen3" : "qwen2", worst, scale);
        assert_true(worst <= 0.05 * scale);
        wt_free(&s);
    }
}

/* ---- embeddings ------------------------------------------------------------ */

/* The pooled embedding of tokens[0..n) in double from the reference
 * forward: vLLM's pooler (last / mean / cls, then [:dims], then
 * F.normalize). */
static void ref_embedding(wt_set *s, const int32_t *tokens, int n, const pooling_params *pp, double *out)
{
    ref_forward_window(s, false, tokens, n, 0, NULL);
    int d = pp->dimensions > 0 ? pp->dimensions : TH;
    double ss = 0;
    for (int j = 0; j < d; j++) {
        double v = 0;
        if (pp->type == POOLING_LAST)
            v = ref_hidden[n - 1][j];
        else if (pp->type == POOLING_CLS)
            v = ref_hidden[0][j];
        else {
            for (int t = 0; t < n; t++)
                v += ref_hidden[t][j];
            v /= n;
        }
        out[j] = v;
        ss += v * v;
    }
    if (pp->normalize)
        for (int j = 0; j < d; j++)
            out[j] /= sqrt(ss);
}

typedef struct emb_run {
    float vec[6][TH];      /* per embedding request, by its user index */
    int32_t dim[6];
    int32_t n_generated;
    uint64_t preemptions;
    int32_t emb_preemptions;   /* of the embedding requests */
} emb_run;

/* Runs the embedding requests (prompts P[k] of lengths NP[k], params pp[k])
 * through an engine over m with the given token budget and pool (blocks of
 * 2 tokens), with or without two generation requests queued between them. */
static void run_embeddings(model *m, int32_t budget, int32_t blocks, bool mixed, const int32_t (*P)[7],
                           const int32_t *NP, const pooling_params *pp, int n, emb_run *out)
{
    engine_params ep = engine_params_default();
    ep.block_size = 2;
    ep.num_blocks = blocks;
    ep.max_num_seqs = tiny_params.max_num_seqs;
    ep.max_num_batched_tokens = budget;
    ep.max_model_len = 16;
    ep.watermark = 0.0f;
    engine_backend be = model_backend(m);
    engine *e = NULL;
    pg_error err;
    assert_int_equal(engine_create(&e, &ep, &be, NULL, &err), 0);
    const int32_t G[4] = {1, 9, 8, 7};
    sampling_params sp = sampling_params_default();
    sp.temperature = 0.0f;
    sp.max_tokens = 3;
    memset(out, 0, sizeof *out);
    for (int k = 0; k < n; k++) {
        if (mixed && k < 2)
            assert_int_equal(engine_add_request(e, G, 4 - k, &sp, (void *)(intptr_t)(100 + k), NULL, &err), 0);
        int rc = engine_add_embed_request(e, P[k], NP[k], &pp[k], (void *)(intptr_t)k, NULL, &err);
        if (rc)
            fprintf(stderr, "%s\n", err.msg);
        assert_int_equal(rc, 0);
    }
    int done = 0;
    while (engine_has_unfinished(e)) {
        int rc = engine_step(e, &err);
        if (rc)
            fprintf(stderr, "%s\n", err.msg);
        assert_int_equal(rc, 0);
        request_output *o;
        while (engine_pop_finished(e, &o)) {
            intptr_t u = (intptr_t)o->user;
            if (u >= 100) {
                assert_null(o->embedding);
                out->n_generated += o->outputs[0].n_tokens;
            } else {
                assert_non_null(o->embedding);
                assert_int_equal(o->n_outputs, 0);
                assert_int_equal(o->n_prompt_tokens, NP[u]);
                memcpy(out->vec[u], o->embedding, (size_t)o->n_embedding * sizeof(float));
                out->dim[u] = o->n_embedding;
                out->emb_preemptions += o->n_preemptions;
                done++;
            }
            request_output_free(o);
        }
    }
    assert_int_equal(done, n);
    engine_stats st;
    engine_get_stats(e, &st);
    out->preemptions = st.preemptions;
    engine_destroy(e);
}

/* Embedding requests end to end (engine + model on the cpu): the pooled
 * vectors equal the double reference's within 1e-5 (normalized) for last,
 * mean and cls pooling, Matryoshka truncation and normalize off; and they
 * are bit-identical alone, chunked (3 tokens a step), batched with
 * generation requests, and preempted (recomputed) in a pool of 5 blocks;
 * and the same from the checkpoint saved headless (no "model.", no lm_head). */
static void test_embeddings_match_reference(void **state)
{
    fixture *f = *state;
    llama_config cfg = tiny_config(false);
    wt_set s;
    tiny_weights(&s, false, 7);
    model *m = NULL;
    st_file *st = NULL;
    pg_error err;
    assert_int_equal(try_load(f, &s, &cfg, &m, &st, &err), 0);
    st_close(st);

    const int32_t P[6][7] = {{1, 7, 3, 30, 12, 5, 9}, {1, 22, 4, 4, 17, 31, 0}, {1, 7, 3, 30, 12, 5, 9},
                             {3}, {1, 5, 5, 2, 8}, {1, 22, 4, 4, 17, 31, 0}};
    const int32_t NP[6] = {7, 7, 7, 1, 5, 7};
    const pooling_params pp[6] = {
        {.type = POOLING_LAST, .normalize = true},
        {.type = POOLING_MEAN, .normalize = true},
        {.type = POOLING_CLS, .normalize = true},
        {.type = POOLING_MEAN, .normalize = true},
        {.type = POOLING_LAST, .normalize = true, .dimensions = 8},
        {.type = POOLING_MEAN, .normalize = false},
    };
    static emb_run alone, chunked, mixed, tight;
    const int32_t nb = tiny_params.num_kv_blocks;
    run_embeddings(m, 16, nb, false, P, NP, pp, 6, &alone);
    run_embeddings(m, 3, nb, false, P, NP, pp, 6, &chunked);
    run_embeddings(m, 5, nb, true, P, NP, pp, 6, &mixed);
    run_embeddings(m, 4, 5, true, P, NP, pp, 6, &tight); /* 10 KV slots: preemption */
    assert_int_equal(mixed.n_generated, 6);
    assert_int_equal(tight.n_generated, 6);
    printf("    preemptions with 5 blocks: %llu, of embedding requests %d\n",
           (unsigned long long)tight.preemptions, (int)tight.emb_preemptions);
    assert_true(tight.emb_preemptions > 0);
    for (int k = 0; k < 6; k++) {
        double ref[TH];
        ref_embedding(&s, P[k], NP[k], &pp[k], ref);
        int d = pp[k].dimensions > 0 ? pp[k].dimensions : TH;
        assert_int_equal(alone.dim[k], d);
        double worst = 0, norm = 0;
        for (int j = 0; j < d; j++) {
            double diff = fabs((double)alone.vec[k][j] - ref[j]);
            if (diff > worst)
                worst = diff;
            norm += (double)alone.vec[k][j] * (double)alone.vec[k][j];
        }
        printf("    embedding %d (%s, dims %d, normalize %d): max |diff| vs double %.3g, norm %.9f\n", k,
               pooling_type_name(pp[k].type), d, (int)pp[k].normalize, worst, sqrt(norm));
        assert_true(worst <= 1e-5 * (pp[k].normalize ? 1.0 : 1.0 + max_abs(ref, d)));
        if (pp[k].normalize)
            assert_true(fabs(sqrt(norm) - 1.0) < 1e-6);
        /* batch invariance: the same bits however the prompt was run */
        assert_memory_equal(alone.vec[k], chunked.vec[k], (size_t)d * sizeof(float));
        assert_memory_equal(alone.vec[k], mixed.vec[k], (size_t)d * sizeof(float));
        assert_memory_equal(alone.vec[k], tight.vec[k], (size_t)d * sizeof(float));
    }
    /* the same prompt pooled three ways gives three different vectors */
    assert_true(memcmp(alone.vec[0], alone.vec[2], sizeof alone.vec[0]) != 0);
    assert_true(model_has_lm_head(m));
    model_destroy(m);

    /* the same weights saved as sentence-transformers saves a base model
     * (Qwen3-Embedding-8B: no "model." prefix, no lm_head.weight though
     * untied): the same vectors, and no logits */
    wt_set bare = s; /* shallow: the values stay s's */
    int nb2 = 0;
    for (int i = 0; i < s.n; i++) {
        if (strcmp(s.t[i].name, "lm_head.weight") == 0)
            continue;
        bare.t[nb2] = s.t[i];
        if (strncmp(s.t[i].name, "model.", 6) == 0)
            memmove(bare.t[nb2].name, bare.t[nb2].name + 6, strlen(bare.t[nb2].name + 6) + 1);
        nb2++;
    }
    bare.n = nb2;
    assert_int_equal(try_load(f, &bare, &cfg, &m, &st, &err), 0);
    st_close(st);
    assert_false(model_has_lm_head(m));
    static emb_run headless;
    run_embeddings(m, 3, nb, false, P, NP, pp, 6, &headless);
    assert_memory_equal(headless.vec, alone.vec, sizeof alone.vec);
    int32_t tok1 = 1, pos1 = 0, slot1 = 0, qs1[2] = {0, 1}, len1 = 1, bt1 = 0, row1 = 0;
    step_batch b1 = {.num_tokens = 1, .num_seqs = 1, .block_size = 2, .token_ids = &tok1, .positions = &pos1,
                     .slots = &slot1, .query_start = qs1, .seq_lens = &len1, .block_tables = &bt1,
                     .block_table_stride = 1, .max_seq_len = 1, .max_query_len = 1, .num_logits = 1,
                     .logits_rows = &row1};
    float lg[TV];
    assert_int_equal(model_forward(m, &b1, lg, &err), PG_EUNSUPPORTED);
    printf("    %s\n", err.msg);
    model_destroy(m);
    wt_free(&s);
}

int main(void)
{
#ifdef PG_MODEL_LOAD_CUDA
    if (cuda_device_count() == 0) {
        printf("SKIP: no CUDA device\n");
        return 77;
    }
    cmocka_set_test_filter("test_qwen_*"); /* test_qwen_*: any executor; the others are the CPU's */
#endif
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_wrong_shape_named),
        cmocka_unit_test(test_missing_tensor_named),
        cmocka_unit_test(test_wrong_dtype_named),
        cmocka_unit_test(test_out_of_memory_says_numbers),
        cmocka_unit_test(test_forward_matches_reference),
        cmocka_unit_test(test_forward_sliding_window),
        cmocka_unit_test(test_qwen_matches_reference),
        cmocka_unit_test(test_qwen_tensors_checked),
        cmocka_unit_test(test_storage_types_qwen),
#ifdef PG_MODEL_LOAD_CUDA
        cmocka_unit_test(test_qwen_cuda_bf16),
        cmocka_unit_test(test_qwen_launches_per_step),
#endif
        cmocka_unit_test(test_embeddings_match_reference),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
