/* test_lora_adapter: PEFT LoRA adapters written here (a tiny safetensors
 * writer) against stories260K's config (H 64, I 172, 5 layers, 8 heads,
 * 4 kv heads, head_dim 8): every accepted key, PEFT's matching rules
 * (list suffixes, regex fullmatch, all-linear, exclude_modules,
 * layers_to_transform / layers_pattern, rank_pattern / alpha_pattern in
 * order), scales (alpha / r, rslora), dtypes, both tensor-name forms, every
 * refusal naming its key or tensor, shape mismatches naming both shapes,
 * truncated files, and random mutations that must never crash. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "dtype.h"
#include "lora_adapter.h"
#include "lora_config.h"
#include "safetensors.h"
#include "test_support.h"

static llama_config base;

static int setup(void **state)
{
    (void)state;
    pg_error e;
    if (llama_config_load(&base, pg_test_shared_path("models/stories260K"), &e) != PG_OK) {
        fprintf(stderr, "stories260K config: %s\n", e.msg);
        return -1;
    }
    return 0;
}

/* ---- a tiny safetensors writer ------------------------------------------- */

#define MAXT 128
typedef struct tensor_spec {
    char name[200];
    st_dtype dtype;
    int64_t d0, d1;
    int ndim;
    float *want;      /* the f32 values after the dtype's rounding */
    uint8_t *bytes;
    size_t nbytes;
} tensor_spec;

typedef struct adapter_img {
    tensor_spec t[MAXT];
    int n;
    pg_test_rng rng;
} adapter_img;

static void img_init(adapter_img *a, uint64_t seed)
{
    memset(a, 0, sizeof *a);
    a->rng.s = seed;
}

static void img_free(adapter_img *a)
{
    for (int k = 0; k < a->n; k++) {
        free(a->t[k].want);
        free(a->t[k].bytes);
    }
    a->n = 0;
}

static tensor_spec *img_add(adapter_img *a, const char *name, st_dtype dt, int64_t d0, int64_t d1)
{
    assert_true(a->n < MAXT);
    tensor_spec *t = &a->t[a->n++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = dt;
    t->d0 = d0;
    t->d1 = d1;
    t->ndim = 2;
    size_t n = (size_t)(d0 * d1);
    t->want = calloc(n + 1, sizeof(float));
    t->nbytes = n * st_dtype_size(dt);
    t->bytes = calloc(t->nbytes + 1, 1);
    assert_non_null(t->want);
    assert_non_null(t->bytes);
    for (size_t i = 0; i < n; i++) {
        float v = pg_test_rng_uniform(&a->rng, -1.f, 1.f);
        if (dt == ST_F32) {
            memcpy(t->bytes + 4 * i, &v, 4);
            t->want[i] = v;
        } else if (dt == ST_BF16) {
            uint16_t h = pg_f32_to_bf16(v);
            memcpy(t->bytes + 2 * i, &h, 2);
            t->want[i] = pg_bf16_to_f32(h);
        } else if (dt == ST_F16) {
            uint16_t h = pg_f32_to_f16(v);
            memcpy(t->bytes + 2 * i, &h, 2);
            t->want[i] = pg_f16_to_f32(h);
        } /* other dtypes: zero bytes */
    }
    return t;
}

/* The module name of layer l, projection p. */
static const char *module(int l, lora_proj p)
{
    static char b[128];
    snprintf(b, sizeof b, "model.layers.%d.%s.%s", l, lora_proj_block(p), lora_proj_name(p));
    return b;
}

enum { FORM_PEFT = 0, FORM_ADAPTER_NAME, FORM_NO_PREFIX };

static const char *tname(int l, lora_proj p, bool is_a, int form)
{
    static char b[200];
    snprintf(b, sizeof b, "%s%s.%s%s.weight", form == FORM_NO_PREFIX ? "" : "base_model.model.", module(l, p),
             is_a ? "lora_A" : "lora_B", form == FORM_ADAPTER_NAME ? ".default" : "");
    return b;
}

/* A and B of (l, p) at rank r, the right shapes for stories260K. */
static void add_pair(adapter_img *a, int l, lora_proj p, int r, st_dtype dt, int form)
{
    int32_t in, out;
    lora_proj_dims(&base, p, &in, &out);
    img_add(a, tname(l, p, true, form), dt, r, in);
    img_add(a, tname(l, p, false, form), dt, out, r);
}

/* The whole safetensors file image (malloc'd). */
static uint8_t *img_bytes(const adapter_img *a, size_t *len)
{
    char *h = malloc(64 * 1024);
    assert_non_null(h);
    size_t hl = 0, off = 0;
    hl += (size_t)sprintf(h + hl, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int k = 0; k < a->n; k++) {
        const tensor_spec *t = &a->t[k];
        hl += (size_t)sprintf(h + hl, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld,%lld],\"data_offsets\":[%zu,%zu]}",
                              t->name, st_dtype_name(t->dtype), (long long)t->d0, (long long)t->d1, off,
                              off + t->nbytes);
        off += t->nbytes;
    }
    h[hl++] = '}';
    *len = 8 + hl + off;
    uint8_t *b = malloc(*len);
    assert_non_null(b);
    for (int k = 0; k < 8; k++) b[k] = (uint8_t)((uint64_t)hl >> (8 * k));
    memcpy(b + 8, h, hl);
    size_t p = 8 + hl;
    for (int k = 0; k < a->n; k++) {
        memcpy(b + p, a->t[k].bytes, a->t[k].nbytes);
        p += a->t[k].nbytes;
    }
    free(h);
    return b;
}

/* Builds through st_parse + lora_adapter_build; returns the status. */
static int build(const adapter_img *a, const char *cfg, lora_adapter **out, pg_error *e)
{
    size_t len;
    uint8_t *img = img_bytes(a, &len);
    st_tensor *ts = NULL;
    size_t nt = 0;
    int rc = st_parse(img, len, "adapter_model.safetensors", &ts, &nt, e);
    assert_int_equal(rc, 0);
    rc = lora_adapter_build(out, cfg, strlen(cfg), "adapter_config.json", ts, nt, "adapter_model.safetensors", &base, e);
    if (rc) assert_null(*out);
    st_tensors_free(ts, nt);
    free(img);
    return rc;
}

static void expect_refused(const adapter_img *a, const char *cfg, const char *sub1, const char *sub2)
{
    lora_adapter *ad = NULL;
    pg_error e = {{0}};
    int rc = build(a, cfg, &ad, &e);
    if (rc == 0 || !strstr(e.msg, sub1) || (sub2 && !strstr(e.msg, sub2))) {
        fprintf(stderr, "config %s\n  rc %d, message '%s'\n  expected '%s' and '%s'\n", cfg, rc, e.msg, sub1,
                sub2 ? sub2 : "");
        fail();
    }
    lora_adapter_free(ad);
}

static lora_adapter *expect_ok(const adapter_img *a, const char *cfg)
{
    lora_adapter *ad = NULL;
    pg_error e = {{0}};
    if (build(a, cfg, &ad, &e) != 0) {
        fprintf(stderr, "config %s\n  refused: %s\n", cfg, e.msg);
        fail();
    }
    return ad;
}

/* The loaded matrices equal what was written (after the dtype's rounding). */
static void check_values(const lora_adapter *ad, const adapter_img *a, int form)
{
    for (int l = 0; l < ad->n_layers; l++)
        for (int p = 0; p < LORA_NPROJ; p++) {
            const lora_weights *w = lora_adapter_at(ad, l, (lora_proj)p);
            for (int isa = 0; isa < 2; isa++) {
                const char *nm = tname(l, (lora_proj)p, isa, form);
                const tensor_spec *t = NULL;
                for (int k = 0; k < a->n; k++)
                    if (strcmp(a->t[k].name, nm) == 0) t = &a->t[k];
                if (!w->r) {
                    assert_null(t);
                    assert_null(w->A);
                    assert_null(w->B);
                    continue;
                }
                assert_non_null(t);
                const float *got = isa ? w->A : w->B;
                assert_int_equal(t->d0, isa ? w->r : w->out);
                assert_int_equal(t->d1, isa ? w->in : w->r);
                assert_memory_equal(got, t->want, (size_t)(t->d0 * t->d1) * sizeof(float));
            }
        }
}

/* ---- accepted configs ------------------------------------------------------ */

static void test_basic_q_v(void **state)
{
    (void)state;
    adapter_img a;
    img_init(&a, 1);
    for (int l = 0; l < 5; l++) {
        add_pair(&a, l, LORA_Q, 4, ST_F32, FORM_PEFT);
        add_pair(&a, l, LORA_V, 4, ST_F32, FORM_PEFT);
    }
    const char *cfg = "{\"peft_type\":\"LORA\",\"task_type\":\"CAUSAL_LM\",\"r\":4,\"lora_alpha\":8,"
                      "\"lora_dropout\":0.05,\"target_modules\":[\"v_proj\",\"q_proj\"],\"bias\":\"none\","
                      "\"fan_in_fan_out\":false,\"use_rslora\":false,\"use_dora\":false,\"modules_to_save\":null,"
                      "\"rank_pattern\":{},\"alpha_pattern\":{},\"layers_to_transform\":null,"
                      "\"layers_pattern\":null,\"init_lora_weights\":true,\"inference_mode\":true,"
                      "\"base_model_name_or_path\":\"karpathy/stories260K\",\"revision\":null}";
    lora_adapter *ad = expect_ok(&a, cfg);
    assert_string_equal(ad->base_model_name_or_path, "karpathy/stories260K");
    assert_int_equal(ad->n_adapted, 10);
    assert_int_equal(ad->max_rank, 4);
    assert_int_equal(ad->r, 4);
    for (int l = 0; l < 5; l++) {
        const lora_weights *q = lora_adapter_at(ad, l, LORA_Q), *v = lora_adapter_at(ad, l, LORA_V);
        assert_int_equal(q->r, 4);
        assert_int_equal(q->in, 64);
        assert_int_equal(q->out, 64);
        assert_int_equal(v->out, 32);
        assert_true(q->scale == 2.0f && v->scale == 2.0f);
        assert_int_equal(lora_adapter_at(ad, l, LORA_K)->r, 0);
        assert_int_equal(lora_adapter_at(ad, l, LORA_DOWN)->r, 0);
    }
    check_values(ad, &a, FORM_PEFT);
    lora_adapter_free(ad);
    img_free(&a);
}

/* bf16 / f16 converted exactly; all seven projections (dims of each);
 * fan_in_fan_out true read and ignored (PEFT resets it on nn.Linear). */
static void test_dtypes_and_all_projections(void **state)
{
    (void)state;
    static const st_dtype dts[] = {ST_F32, ST_BF16, ST_F16};
    for (int k = 0; k < 3; k++) {
        adapter_img a;
        img_init(&a, 10 + (uint64_t)k);
        for (int l = 0; l < 5; l++)
            for (int p = 0; p < LORA_NPROJ; p++) add_pair(&a, l, (lora_proj)p, 2, dts[k], FORM_PEFT);
        lora_adapter *ad = expect_ok(&a, "{\"r\":2,\"lora_alpha\":3,\"fan_in_fan_out\":true,"
                                         "\"target_modules\":[\"q_proj\",\"k_proj\",\"v_proj\",\"o_proj\","
                                         "\"gate_proj\",\"up_proj\",\"down_proj\"]}");
        assert_int_equal(ad->n_adapted, 35);
        assert_true(lora_adapter_at(ad, 0, LORA_GATE)->out == 172 && lora_adapter_at(ad, 0, LORA_DOWN)->in == 172);
        assert_true(lora_adapter_at(ad, 4, LORA_O)->in == 64 && lora_adapter_at(ad, 4, LORA_K)->out == 32);
        assert_true(lora_adapter_at(ad, 2, LORA_UP)->scale == 1.5f);
        check_values(ad, &a, FORM_PEFT);
        lora_adapter_free(ad);
        img_free(&a);
    }
}

/* Both name forms (adapter name segment, no base_model.model. prefix);
 * both forms of one tensor at once are refused. */
static void test_name_forms(void **state)
{
    (void)state;
    for (int form = FORM_ADAPTER_NAME; form <= FORM_NO_PREFIX; form++) {
        adapter_img a;
        img_init(&a, 20 + (uint64_t)form);
        for (int l = 0; l < 5; l++) add_pair(&a, l, LORA_O, 3, ST_F32, form);
        lora_adapter *ad = expect_ok(&a, "{\"r\":3,\"lora_alpha\":6,\"target_modules\":[\"o_proj\"]}");
        check_values(ad, &a, form);
        lora_adapter_free(ad);
        img_free(&a);
    }
    adapter_img a;
    img_init(&a, 23);
    for (int l = 0; l < 5; l++) add_pair(&a, l, LORA_O, 3, ST_F32, FORM_PEFT);
    img_add(&a, tname(2, LORA_O, true, FORM_ADAPTER_NAME), ST_F32, 3, 64);
    expect_refused(&a, "{\"r\":3,\"target_modules\":[\"o_proj\"]}", "model.layers.2.self_attn.o_proj.lora_A",
                   "a second lora_A");
    img_free(&a);
}

static void test_rslora_scale(void **state)
{
    (void)state;
    adapter_img a;
    img_init(&a, 30);
    for (int l = 0; l < 5; l++) add_pair(&a, l, LORA_Q, 4, ST_F32, FORM_PEFT);
    lora_adapter *ad = expect_ok(&a, "{\"r\":4,\"lora_alpha\":16,\"use_rslora\":true,\"target_modules\":[\"q_proj\"]}");
    assert_true(ad->use_rslora);
    assert_true(lora_adapter_at(ad, 3, LORA_Q)->scale == 8.0f); /* 16 / sqrt(4), not 16 / 4 */
    lora_adapter_free(ad);
    ad = expect_ok(&a, "{\"r\":4,\"lora_alpha\":16,\"target_modules\":[\"q_proj\"]}");
    assert_true(lora_adapter_at(ad, 3, LORA_Q)->scale == 4.0f);
    lora_adapter_free(ad);
    img_free(&a);
}

/* rank_pattern / alpha_pattern: PEFT's get_pattern_key, first key in file
 * order that matches (.*\.)?(key)$ — so a bare "q_proj" key matches every
 * layer's q_proj and a full name only its own; regex keys work; rslora uses
 * the pattern's rank. */
static void test_rank_alpha_pattern(void **state)
{
    (void)state;
    adapter_img a;
    img_init(&a, 40);
    for (int l = 0; l < 5; l++) {
        add_pair(&a, l, LORA_Q, l == 1 ? 2 : 8, ST_F32, FORM_PEFT);
        add_pair(&a, l, LORA_V, 6, ST_F32, FORM_PEFT);
    }
    const char *cfg = "{\"r\":8,\"lora_alpha\":16,\"target_modules\":[\"q_proj\",\"v_proj\"],"
                      "\"rank_pattern\":{\"model.layers.1.self_attn.q_proj\":2,\"v_proj\":6,\"q_proj\":3},"
                      "\"alpha_pattern\":{\"layers\\\\.[23]\\\\..*q_proj\":32,\"q_proj\":4}}";
    /* "q_proj":3 comes after the layer-1 key: layer 0's q would want rank 3 */
    expect_refused(&a, cfg, "model.layers.0.self_attn.q_proj.lora_A.weight", "expected [3,64]");
    cfg = "{\"r\":8,\"lora_alpha\":16,\"target_modules\":[\"q_proj\",\"v_proj\"],"
          "\"rank_pattern\":{\"model.layers.1.self_attn.q_proj\":2,\"v_proj\":6,\"self_attn.q\":3,"
          "\"q_proj\":8},"
          "\"alpha_pattern\":{\"layers\\\\.[23]\\\\..*q_proj\":32,\"q_proj\":4}}";
    lora_adapter *ad = expect_ok(&a, cfg);
    /* "self_attn.q" matches no full module name ((.*\.)?(key)$ needs the end);
     * layer 1's q matches the first key and the last: the first wins */
    assert_int_equal(lora_adapter_at(ad, 0, LORA_Q)->r, 8);
    assert_int_equal(lora_adapter_at(ad, 1, LORA_Q)->r, 2);
    assert_int_equal(lora_adapter_at(ad, 4, LORA_V)->r, 6);
    assert_int_equal(ad->max_rank, 8);
    assert_true(lora_adapter_at(ad, 0, LORA_Q)->scale == 0.5f);  /* alpha 4 / r 8 */
    assert_true(lora_adapter_at(ad, 1, LORA_Q)->scale == 2.0f);  /* 4 / 2 */
    assert_true(lora_adapter_at(ad, 2, LORA_Q)->scale == 4.0f);  /* 32 / 8: the regex key first */
    assert_true(lora_adapter_at(ad, 3, LORA_Q)->scale == 4.0f);
    assert_true(lora_adapter_at(ad, 4, LORA_Q)->scale == 0.5f);
    assert_true(fabsf(lora_adapter_at(ad, 0, LORA_V)->scale - 16.f / 6.f) < 1e-6f);
    check_values(ad, &a, FORM_PEFT);
    lora_adapter_free(ad);
    /* with rslora: alpha / sqrt(pattern rank) */
    cfg = "{\"r\":8,\"lora_alpha\":16,\"use_rslora\":true,\"target_modules\":[\"q_proj\",\"v_proj\"],"
          "\"rank_pattern\":{\"model.layers.1.self_attn.q_proj\":2,\"v_proj\":6}}";
    ad = expect_ok(&a, cfg);
    assert_true(fabsf(lora_adapter_at(ad, 1, LORA_Q)->scale - 16.f / sqrtf(2.f)) < 1e-6f);
    assert_true(fabsf(lora_adapter_at(ad, 2, LORA_Q)->scale - 16.f / sqrtf(8.f)) < 1e-6f);
    lora_adapter_free(ad);
    img_free(&a);
}

static void test_layers_to_transform(void **state)
{
    (void)state;
    adapter_img a;
    img_init(&a, 50);
    add_pair(&a, 1, LORA_DOWN, 2, ST_F32, FORM_PEFT);
    add_pair(&a, 3, LORA_DOWN, 2, ST_F32, FORM_PEFT);
    static const char *const ok[] = {
        "{\"r\":2,\"target_modules\":[\"down_proj\"],\"layers_to_transform\":[1,3]}",
        "{\"r\":2,\"target_modules\":[\"down_proj\"],\"layers_to_transform\":[3,1],\"layers_pattern\":\"layers\"}",
        "{\"r\":2,\"target_modules\":[\"down_proj\"],\"layers_to_transform\":[1,3],\"layers_pattern\":[\"h\",\"layers\"]}",
        "{\"r\":2,\"target_modules\":[\"mlp.down_proj\"],\"layers_to_transform\":[1,3],\"layers_pattern\":\"lay.rs\"}",
    };
    for (size_t k = 0; k < sizeof ok / sizeof ok[0]; k++) {
        lora_adapter *ad = expect_ok(&a, ok[k]);
        assert_int_equal(ad->n_adapted, 2);
        assert_int_equal(lora_adapter_at(ad, 1, LORA_DOWN)->r, 2);
        assert_int_equal(lora_adapter_at(ad, 3, LORA_DOWN)->r, 2);
        assert_int_equal(lora_adapter_at(ad, 0, LORA_DOWN)->r, 0);
        check_values(ad, &a, FORM_PEFT);
        lora_adapter_free(ad);
    }
    /* without layers_to_transform every layer is selected: 0, 2, 4 missing */
    expect_refused(&a, "{\"r\":2,\"target_modules\":[\"down_proj\"]}",
                   "model.layers.0.mlp.down_proj.lora_A.weight", "not found");
    /* an empty list means no selection (PEFT) */
    expect_refused(&a, "{\"r\":2,\"target_modules\":[\"down_proj\"],\"layers_to_transform\":[]}",
                   "model.layers.0.mlp.down_proj", "not found");
    /* a pattern that names no segment selects nothing */
    expect_refused(&a, "{\"r\":2,\"target_modules\":[\"down_proj\"],\"layers_to_transform\":[1,3],"
                       "\"layers_pattern\":\"h\"}", "'target_modules' selects none", NULL);
    /* tensors of a layer the config leaves out are refused */
    expect_refused(&a, "{\"r\":2,\"target_modules\":[\"down_proj\"],\"layers_to_transform\":1}",
                   "model.layers.3.mlp.down_proj.lora_A.weight", "not selected");
    img_free(&a);
    /* an int; and an exact module name ignores layers_to_transform (PEFT's
     * `key in target_modules` branch) */
    img_init(&a, 51);
    add_pair(&a, 2, LORA_UP, 2, ST_F32, FORM_PEFT);
    add_pair(&a, 4, LORA_GATE, 2, ST_F32, FORM_PEFT);
    lora_adapter *ad = expect_ok(&a, "{\"r\":2,\"target_modules\":[\"up_proj\",\"model.layers.4.mlp.gate_proj\"],"
                                     "\"layers_to_transform\":2}");
    assert_int_equal(ad->n_adapted, 2);
    lora_adapter_free(ad);
    img_free(&a);
}

/* A string target_modules is a regex that must fullmatch; all-linear. */
static void test_regex_targets(void **state)
{
    (void)state;
    adapter_img a;
    img_init(&a, 60);
    for (int l = 0; l < 2; l++)
        for (int p = LORA_GATE; p <= LORA_DOWN; p++) add_pair(&a, l, (lora_proj)p, 2, ST_BF16, FORM_PEFT);
    lora_adapter *ad =
        expect_ok(&a, "{\"r\":2,\"target_modules\":\"model\\\\.layers\\\\.[01]\\\\.mlp\\\\.(gate|up|down)_proj\"}");
    assert_int_equal(ad->n_adapted, 6);
    check_values(ad, &a, FORM_PEFT);
    lora_adapter_free(ad);
    /* fullmatch, not match or search: a pattern matching a part only
     * selects nothing */
    expect_refused(&a, "{\"r\":2,\"target_modules\":\"model\\\\.layers\\\\.[01]\\\\.mlp\\\\.(gate|up|down)\"}",
                   "selects none", NULL);
    expect_refused(&a, "{\"r\":2,\"target_modules\":\"mlp\\\\.(gate|up|down)_proj\"}", "selects none", NULL);
    /* ... or more than the tensors hold */
    expect_refused(&a, "{\"r\":2,\"target_modules\":\".*mlp\\\\.(gate|up|down)_proj\"}",
                   "model.layers.2.mlp.gate_proj.lora_A.weight", "not found");
    expect_refused(&a, "{\"r\":2,\"target_modules\":\"model\\\\.layers\\\\.([01]\"}", "'target_modules'",
                   "does not compile");
    expect_refused(&a, "{\"r\":2,\"target_modules\":\".*_proj\",\"layers_to_transform\":[0]}",
                   "'layers_to_transform' cannot be used", NULL);
    expect_refused(&a, "{\"r\":2,\"target_modules\":\".*_proj\",\"layers_pattern\":\"layers\"}",
                   "'layers_pattern' cannot be used", NULL);
    expect_refused(&a, "{\"r\":2,\"target_modules\":[\"up_proj\"],\"layers_pattern\":\"layers\"}",
                   "'layers_pattern' without 'layers_to_transform'", NULL);
    img_free(&a);

    img_init(&a, 61);
    for (int l = 0; l < 5; l++)
        for (int p = 0; p < LORA_NPROJ; p++) add_pair(&a, l, (lora_proj)p, 1, ST_F16, FORM_PEFT);
    ad = expect_ok(&a, "{\"r\":1,\"target_modules\":\"ALL-LINEAR\"}");
    assert_int_equal(ad->n_adapted, 35);
    lora_adapter_free(ad);
    img_free(&a);
}

static void test_exclude_modules(void **state)
{
    (void)state;
    adapter_img a;
    img_init(&a, 70);
    for (int l = 0; l < 5; l++)
        if (l != 2) add_pair(&a, l, LORA_K, 2, ST_F32, FORM_PEFT);
    lora_adapter *ad = expect_ok(&a, "{\"r\":2,\"target_modules\":[\"k_proj\"],"
                                     "\"exclude_modules\":[\"model.layers.2.self_attn.k_proj\"]}");
    assert_int_equal(ad->n_adapted, 4);
    lora_adapter_free(ad);
    ad = expect_ok(&a, "{\"r\":2,\"target_modules\":\".*k_proj\",\"exclude_modules\":\".*\\\\.2\\\\..*\"}");
    assert_int_equal(ad->n_adapted, 4);
    assert_int_equal(lora_adapter_at(ad, 2, LORA_K)->r, 0);
    lora_adapter_free(ad);
    img_free(&a);
}

/* ---- refusals ---------------------------------------------------------------- */

static void test_refused_keys(void **state)
{
    (void)state;
    adapter_img a;
    img_init(&a, 80);
    for (int l = 0; l < 5; l++) add_pair(&a, l, LORA_Q, 2, ST_F32, FORM_PEFT);
    static const struct {
        const char *extra, *sub;
    } cases[] = {
        {"\"use_dora\":true", "'use_dora'"},
        {"\"modules_to_save\":[\"lm_head\"]", "'modules_to_save'"},
        {"\"lora_bias\":true", "'lora_bias'"},
        {"\"trainable_token_indices\":[5,6]", "'trainable_token_indices'"},
        {"\"target_parameters\":[\"w\"]", "'target_parameters'"},
        {"\"layer_replication\":[[0,2],[1,3]]", "'layer_replication'"},
        {"\"alora_invocation_tokens\":[1]", "'alora_invocation_tokens'"},
        {"\"use_qalora\":true", "'use_qalora'"},
        {"\"bias\":\"all\"", "'bias'"},
        {"\"bias\":\"lora_only\"", "'bias'"},
        {"\"peft_type\":\"IA3\"", "'peft_type'"},
        {"\"r\":0", "'r'"},
        {"\"r\":2.5", "'r'"},
        {"\"lora_alpha\":\"x\"", "'lora_alpha'"},
        {"\"use_rslora\":1", "'use_rslora'"},
        {"\"rank_pattern\":{\"q_proj\":0}", "'rank_pattern'"},
        {"\"rank_pattern\":[]", "'rank_pattern'"},
        {"\"alpha_pattern\":{\"q_proj\":null}", "'alpha_pattern'"},
        {"\"layers_to_transform\":[-1]", "'layers_to_transform'"},
        {"\"layers_to_transform\":\"1\"", "'layers_to_transform'"},
        {"\"exclude_modules\":5", "'exclude_modules'"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char cfg[512];
        snprintf(cfg, sizeof cfg, "{\"r\":2,\"target_modules\":[\"q_proj\"],%s}", cases[k].extra);
        /* a duplicate key: json_obj_get takes the first, so put the case first */
        if (strncmp(cases[k].extra, "\"r\"", 3) == 0)
            snprintf(cfg, sizeof cfg, "{%s,\"target_modules\":[\"q_proj\"]}", cases[k].extra);
        expect_refused(&a, cfg, cases[k].sub, NULL);
    }
    /* the same keys at their off values are accepted, beside the rest of
     * what PEFT 0.20's save_pretrained writes */
    lora_adapter *ad = expect_ok(&a, "{\"r\":2,\"target_modules\":[\"q_proj\"],\"use_dora\":false,"
                                     "\"modules_to_save\":[],\"lora_bias\":false,\"trainable_token_indices\":null,"
                                     "\"target_parameters\":null,\"layer_replication\":null,"
                                     "\"alora_invocation_tokens\":null,\"use_qalora\":false,\"bias\":\"none\","
                                     "\"peft_type\":\"LORA\",\"exclude_modules\":null,\"loftq_config\":{},"
                                     "\"megatron_config\":null,\"megatron_core\":\"megatron.core\","
                                     "\"runtime_config\":{\"ephemeral_gpu_offload\":false},\"eva_config\":null,"
                                     "\"corda_config\":null,\"qalora_group_size\":16,\"auto_mapping\":null,"
                                     "\"arrow_config\":null,\"ensure_weight_tying\":false,\"use_bdlora\":null,"
                                     "\"kasa_config\":null,\"velora_config\":null,\"monteclora_config\":null}");
    lora_adapter_free(ad);
    expect_refused(&a, "{\"r\":2}", "'target_modules' is absent", NULL);
    expect_refused(&a, "{\"r\":2,\"target_modules\":null}", "'target_modules' is absent", NULL);
    expect_refused(&a, "{\"r\":2,\"target_modules\":[]}", "'target_modules' is an empty list", NULL);
    expect_refused(&a, "{\"r\":2,\"target_modules\":[\"q_proj\",\"lm_head\"]}", "'target_modules' selects 'lm_head'",
                   NULL);
    expect_refused(&a, "{\"r\":2,\"target_modules\":[\"q_proj\",\"embed_tokens\"]}",
                   "'target_modules' selects 'model.embed_tokens'", NULL);
    expect_refused(&a, "{\"r\":2,\"target_modules\":\"(lm_head|.*q_proj)\"}", "'target_modules' selects 'lm_head'",
                   NULL);
    expect_refused(&a, "{\"r\":2,\"target_modules\":[\"wq\"]}", "'target_modules' selects none", NULL);
    expect_refused(&a, "[1]", "expected a json object", NULL);
    img_free(&a);
}

static void test_refused_tensors(void **state)
{
    (void)state;
    static const struct {
        const char *name, *sub;
    } cases[] = {
        {"base_model.model.model.embed_tokens.lora_embedding_A", "LoRA on an embedding"},
        {"base_model.model.lm_head.lora_A.weight", "'lm_head'"},
        {"base_model.model.model.embed_tokens.lora_A.weight", "'model.embed_tokens'"},
        {"base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector", "'use_dora'"},
        {"base_model.model.model.layers.0.self_attn.q_proj.lora_B.bias", "'lora_bias'"},
        {"base_model.model.lm_head.modules_to_save.default.weight", "'modules_to_save'"},
        {"base_model.model.model.embed_tokens.token_adapter.trainable_tokens_delta", "'trainable_token_indices'"},
        {"base_model.model.model.norm.weight", "is not the lora_A / lora_B weight"},
        {"base_model.model.model.layers.0.self_attn.qkv_proj.lora_A.weight", "is not the lora_A / lora_B weight"},
        {"base_model.model.model.layers.00.self_attn.q_proj.lora_A.weight", "is not the lora_A / lora_B weight"},
        {"base_model.model.model.layers.0.mlp.q_proj.lora_A.weight", "is not the lora_A / lora_B weight"},
        {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight.x", "is not the lora_A / lora_B weight"},
        {"base_model.model.model.layers.5.self_attn.q_proj.lora_A.weight", "layer 5, the base model has 5"},
        {"base_model.model.model.layers.1.self_attn.k_proj.lora_A.weight", "not selected"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        adapter_img a;
        img_init(&a, 90);
        for (int l = 0; l < 5; l++) add_pair(&a, l, LORA_Q, 2, ST_F32, FORM_PEFT);
        img_add(&a, cases[k].name, ST_F32, 2, 64);
        expect_refused(&a, "{\"r\":2,\"target_modules\":[\"q_proj\"]}", cases[k].name, cases[k].sub);
        img_free(&a);
    }
    /* a missing B; a wrong dtype */
    adapter_img a;
    img_init(&a, 91);
    for (int l = 0; l < 5; l++) add_pair(&a, l, LORA_Q, 2, ST_F32, FORM_PEFT);
    free(a.t[7].want);
    free(a.t[7].bytes);
    a.n--;
    memmove(&a.t[7], &a.t[8], (size_t)(a.n - 7) * sizeof a.t[0]);
    expect_refused(&a, "{\"r\":2,\"target_modules\":[\"q_proj\"]}",
                   "'base_model.model.model.layers.3.self_attn.q_proj.lora_B.weight' not found", NULL);
    img_free(&a);
    img_init(&a, 92);
    for (int l = 0; l < 5; l++) add_pair(&a, l, LORA_Q, 2, l == 4 ? ST_I32 : ST_F32, FORM_PEFT);
    expect_refused(&a, "{\"r\":2,\"target_modules\":[\"q_proj\"]}", "model.layers.4.self_attn.q_proj.lora_A",
                   "dtype I32");
    img_free(&a);
}

/* A shape that does not fit the base model names the tensor and both shapes. */
static void test_shape_mismatch(void **state)
{
    (void)state;
    adapter_img a;
    img_init(&a, 100);
    for (int l = 0; l < 5; l++) add_pair(&a, l, LORA_K, 4, ST_F32, FORM_PEFT);
    /* the config's rank differs from the tensors' */
    expect_refused(&a, "{\"r\":8,\"target_modules\":[\"k_proj\"]}",
                   "'base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight': expected [8,64]", "got [4,64]");
    img_free(&a);
    /* k_proj's B as if kv heads were 8 (out 64 instead of 32) */
    img_init(&a, 101);
    for (int l = 0; l < 5; l++) add_pair(&a, l, LORA_K, 4, ST_F32, FORM_PEFT);
    a.t[5].d0 = 64;
    a.t[5].nbytes *= 2;
    a.t[5].bytes = realloc(a.t[5].bytes, a.t[5].nbytes);
    memset(a.t[5].bytes, 0, a.t[5].nbytes);
    expect_refused(&a, "{\"r\":4,\"target_modules\":[\"k_proj\"]}",
                   "'base_model.model.model.layers.2.self_attn.k_proj.lora_B.weight': expected [32,4]", "got [64,4]");
    img_free(&a);
    /* A transposed (fan_in_fan_out does not change nn.Linear's layout) */
    img_init(&a, 102);
    for (int l = 0; l < 5; l++) add_pair(&a, l, LORA_DOWN, 4, ST_F32, FORM_PEFT);
    a.t[0].d0 = 172;
    a.t[0].d1 = 4;
    expect_refused(&a, "{\"r\":4,\"target_modules\":[\"down_proj\"],\"fan_in_fan_out\":true}",
                   "expected [4,172]", "got [172,4]");
    img_free(&a);
}

/* ---- the folder ----------------------------------------------------------------- */

typedef struct tmpdir {
    char path[256];
} tmpdir;

static const char *tmp_file(const tmpdir *d, const char *name)
{
    static char p[512];
    snprintf(p, sizeof p, "%s/%s", d->path, name);
    return p;
}

static void write_file(const char *path, const void *buf, size_t len)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

static const char *const dir_files[] = {"adapter_config.json", "adapter_model.safetensors", "adapter_model.bin",
                                        "added_tokens.json", "new_embeddings.safetensors", NULL};

static void test_load_folder(void **state)
{
    (void)state;
    tmpdir d;
    const char *tb = getenv("TMPDIR");
    snprintf(d.path, sizeof d.path, "%s/pg_lora_XXXXXX", tb && *tb ? tb : "/tmp");
    assert_non_null(mkdtemp(d.path));
    adapter_img a;
    img_init(&a, 110);
    for (int l = 0; l < 5; l++) add_pair(&a, l, LORA_UP, 3, ST_BF16, FORM_PEFT);
    size_t len;
    uint8_t *img = img_bytes(&a, &len);
    const char *cfg = "{\"r\":3,\"lora_alpha\":6,\"target_modules\":[\"up_proj\"],\"base_model_name_or_path\":\"b\"}";
    pg_error e = {{0}};
    lora_adapter *ad = NULL;

    /* nothing there */
    assert_int_equal(lora_adapter_load(&ad, d.path, &base, &e), PG_EIO);
    assert_non_null(strstr(e.msg, "adapter_model.safetensors: not found"));
    /* a pickle only */
    write_file(tmp_file(&d, "adapter_config.json"), cfg, strlen(cfg));
    write_file(tmp_file(&d, "adapter_model.bin"), "PK", 2);
    assert_int_equal(lora_adapter_load(&ad, d.path, &base, &e), PG_EUNSUPPORTED);
    assert_non_null(strstr(e.msg, "adapter_model.bin"));
    assert_null(ad);

    write_file(tmp_file(&d, "adapter_model.safetensors"), img, len);
    assert_int_equal(lora_adapter_load(&ad, d.path, &base, &e), 0);
    assert_string_equal(ad->base_model_name_or_path, "b");
    assert_int_equal(ad->n_adapted, 5);
    check_values(ad, &a, FORM_PEFT);
    lora_adapter_free(ad);
    ad = NULL;

    /* an empty added_tokens.json is fine, a non-empty one is refused */
    write_file(tmp_file(&d, "added_tokens.json"), "{}", 2);
    assert_int_equal(lora_adapter_load(&ad, d.path, &base, &e), 0);
    lora_adapter_free(ad);
    ad = NULL;
    write_file(tmp_file(&d, "added_tokens.json"), "{\"<x>\":512}", 11);
    assert_int_equal(lora_adapter_load(&ad, d.path, &base, &e), PG_EUNSUPPORTED);
    assert_non_null(strstr(e.msg, "added_tokens.json"));
    unlink(tmp_file(&d, "added_tokens.json"));
    write_file(tmp_file(&d, "new_embeddings.safetensors"), "x", 1);
    assert_int_equal(lora_adapter_load(&ad, d.path, &base, &e), PG_EUNSUPPORTED);
    assert_non_null(strstr(e.msg, "new_embeddings.safetensors"));
    unlink(tmp_file(&d, "new_embeddings.safetensors"));

    /* every truncation of the safetensors file is refused, never crashes */
    for (size_t cut = 0; cut < len; cut += (cut < 600 ? 1 : 97)) {
        write_file(tmp_file(&d, "adapter_model.safetensors"), img, cut);
        ad = NULL;
        assert_int_not_equal(lora_adapter_load(&ad, d.path, &base, &e), 0);
        assert_null(ad);
        assert_non_null(strstr(e.msg, "adapter_model.safetensors"));
    }
    /* a truncated config */
    write_file(tmp_file(&d, "adapter_model.safetensors"), img, len);
    write_file(tmp_file(&d, "adapter_config.json"), cfg, strlen(cfg) / 2);
    assert_int_not_equal(lora_adapter_load(&ad, d.path, &base, &e), 0);
    assert_non_null(strstr(e.msg, "adapter_config.json"));

    for (const char *const *f = dir_files; *f; f++) unlink(tmp_file(&d, *f));
    rmdir(d.path);
    free(img);
    img_free(&a);
}

/* Random byte flips in the config and the image: refused or accepted, never
 * a crash or a leak (run under ASan by scripts/test). */
static void test_mutations(void **state)
{
    (void)state;
    adapter_img a;
    img_init(&a, 120);
    for (int l = 0; l < 2; l++) add_pair(&a, l, LORA_V, 2, ST_F16, FORM_PEFT);
    size_t len;
    uint8_t *img = img_bytes(&a, &len);
    const char *cfg0 = "{\"r\":2,\"lora_alpha\":4,\"target_modules\":[\"v_proj\"],\"layers_to_transform\":[0,1],"
                       "\"rank_pattern\":{\"v_proj\":2},\"alpha_pattern\":{\"layers\\\\.1\\\\..*\":3}}";
    size_t cl = strlen(cfg0);
    char *cfg = malloc(cl + 1);
    uint8_t *m = malloc(len);
    pg_test_rng r = {121};
    int accepted = 0;
    static const char alphabet[] = "{}[]\",:0123456789.*\\|()_abcdeqpvrtlsnu -";
    for (int it = 0; it < 3000; it++) {
        memcpy(cfg, cfg0, cl + 1);
        memcpy(m, img, len);
        int flips = pg_test_rng_int(&r, 1, 3);
        for (int f = 0; f < flips; f++) {
            if (it & 1)
                cfg[pg_test_rng_int(&r, 0, (int)cl - 1)] = alphabet[pg_test_rng_int(&r, 0, (int)sizeof alphabet - 2)];
            else
                m[pg_test_rng_int(&r, 0, (int)(len - 1))] ^= (uint8_t)(1u << pg_test_rng_int(&r, 0, 7));
        }
        st_tensor *ts = NULL;
        size_t nt = 0;
        pg_error e;
        if (st_parse(m, len, "adapter_model.safetensors", &ts, &nt, &e)) continue;
        lora_adapter *ad = NULL;
        int rc = lora_adapter_build(&ad, cfg, cl, "adapter_config.json", ts, nt, "adapter_model.safetensors", &base, &e);
        if (rc == 0) {
            accepted++;
            assert_non_null(ad);
            assert_true(ad->n_adapted >= 1);
        } else {
            assert_null(ad);
            assert_true(e.msg[0] != 0);
        }
        lora_adapter_free(ad);
        st_tensors_free(ts, nt);
    }
    assert_true(accepted > 0); /* flips inside the data area are accepted */
    free(cfg);
    free(m);
    free(img);
    img_free(&a);
}

/* lora_config_targets directly, on names outside our seven projections */
static void test_config_rules(void **state)
{
    (void)state;
    lora_config c;
    pg_error e;
    const char *j = "{\"target_modules\":[\"q_proj\"],\"layers_to_transform\":[7]}";
    assert_int_equal(lora_config_parse(&c, j, strlen(j), "cfg", &e), 0);
    assert_int_equal(c.r, 8);
    assert_true(c.lora_alpha == 8.0);
    assert_int_equal(lora_config_targets(&c, "model.layers.7.self_attn.q_proj"), 1);
    assert_int_equal(lora_config_targets(&c, "model.layers.17.self_attn.q_proj"), 0);
    assert_int_equal(lora_config_targets(&c, "model.layers.7.self_attn.xq_proj"), 0);
    /* the first numbered segment is the layer (PEFT's lazy .*?) */
    assert_int_equal(lora_config_targets(&c, "model.layers.7.experts.3.q_proj"), 1);
    assert_int_equal(lora_config_targets(&c, "model.layers.3.experts.7.q_proj"), 0);
    assert_int_equal(lora_config_targets(&c, "q_proj"), 1); /* exact: no layer check */
    lora_config_free(&c);
}

/* scripts/make-synthetic-lora writes what this library reads: its
 * layers_to_transform, rank_pattern, rslora and --zero-b arrive as written
 * (skipped where /usr/bin/python3 with numpy is missing). */
static void test_synthetic_script(void **state)
{
    (void)state;
    if (system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") != 0) {
        fprintf(stderr, "no /usr/bin/python3 with numpy: skipped\n");
        skip();
    }
    char dir[256], cmd[2048];
    const char *tb = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/pg_lora_script_XXXXXX", tb && *tb ? tb : "/tmp");
    assert_non_null(mkdtemp(dir));
    char shared[1024];
    snprintf(shared, sizeof shared, "%s", pg_test_shared_path("models/stories260K"));
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/scripts/make-synthetic-lora %s %s --r 4 --alpha 8 --rslora "
             "--rank-pattern layers.1.self_attn.q_proj=2 --layers 0,1,3 --dtype bf16 --zero-b --seed 7",
             pg_test_source_root(), shared, dir);
    assert_int_equal(system(cmd), 0);
    lora_adapter *ad = NULL;
    pg_error e = {{0}};
    if (lora_adapter_load(&ad, dir, &base, &e) != 0) {
        fprintf(stderr, "%s\n", e.msg);
        fail();
    }
    assert_string_equal(ad->base_model_name_or_path + strlen(ad->base_model_name_or_path) - 11, "stories260K");
    assert_int_equal(ad->n_adapted, 3 * LORA_NPROJ);
    assert_int_equal(lora_adapter_at(ad, 1, LORA_Q)->r, 2);
    assert_int_equal(lora_adapter_at(ad, 1, LORA_K)->r, 4);
    assert_int_equal(lora_adapter_at(ad, 2, LORA_K)->r, 0);
    assert_true(fabsf(lora_adapter_at(ad, 1, LORA_Q)->scale - 8.f / sqrtf(2.f)) < 1e-6f);
    assert_true(lora_adapter_at(ad, 3, LORA_DOWN)->scale == 4.0f);
    for (int l = 0; l < 5; l++)
        for (int p = 0; p < LORA_NPROJ; p++) {
            const lora_weights *w = lora_adapter_at(ad, l, (lora_proj)p);
            double sa = 0;
            for (int64_t i = 0; i < (int64_t)w->r * w->in; i++) sa += fabs(w->A[i]);
            for (int64_t i = 0; i < (int64_t)w->out * w->r; i++) assert_true(w->B[i] == 0.0f);
            assert_true(w->r == 0 || sa > 0);
        }
    lora_adapter_free(ad);
    snprintf(cmd, sizeof cmd, "rm -r '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_basic_q_v),
        cmocka_unit_test(test_dtypes_and_all_projections),
        cmocka_unit_test(test_name_forms),
        cmocka_unit_test(test_rslora_scale),
        cmocka_unit_test(test_rank_alpha_pattern),
        cmocka_unit_test(test_layers_to_transform),
        cmocka_unit_test(test_regex_targets),
        cmocka_unit_test(test_exclude_modules),
        cmocka_unit_test(test_refused_keys),
        cmocka_unit_test(test_refused_tensors),
        cmocka_unit_test(test_shape_mismatch),
        cmocka_unit_test(test_load_folder),
        cmocka_unit_test(test_mutations),
        cmocka_unit_test(test_config_rules),
        cmocka_unit_test(test_synthetic_script),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
