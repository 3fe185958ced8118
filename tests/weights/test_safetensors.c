/* test_safetensors: the real stories260K file, the codellama index with no
 * shards, a tiny sharded checkpoint written here, and a corpus of malformed
 * images (every truncation, lying lengths, bad offsets/shapes/dtypes, ...)
 * that must each be refused with a message naming the file and tensor. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "file_io.h"
#include "safetensors.h"
#include "test_support.h"

/* ---- building images ------------------------------------------------------ */

/* [u64 hlen_field][header][data_len bytes of a pattern] in an exact-size
 * malloc'd buffer (so ASan sees any read past it). */
static uint8_t *make_image_raw(uint64_t hlen_field, const char *header, size_t data_len, size_t *len)
{
    size_t hl = strlen(header);
    *len = 8 + hl + data_len;
    uint8_t *b = malloc(*len);
    assert_non_null(b);
    for (int k = 0; k < 8; k++)
        b[k] = (uint8_t)(hlen_field >> (8 * k));
    memcpy(b + 8, header, hl);
    for (size_t i = 0; i < data_len; i++)
        b[8 + hl + i] = (uint8_t)(i * 7 + 1);
    return b;
}

static uint8_t *make_image(const char *header, size_t data_len, size_t *len)
{
    return make_image_raw(strlen(header), header, data_len, len);
}

static void write_file(const char *path, const void *buf, size_t len)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

static void write_image(const char *path, const char *header, size_t data_len)
{
    size_t len;
    uint8_t *b = make_image(header, data_len, &len);
    write_file(path, b, len);
    free(b);
}

static int contains(const char *s, const char *sub)
{
    return sub == NULL || strstr(s, sub) != NULL;
}

/* Parses buf and expects a clean refusal whose message names the file and
 * holds both substrings (either may be NULL). */
static void expect_refused_buf(const uint8_t *buf, size_t len, const char *what, const char *sub1,
                               const char *sub2)
{
    st_tensor *t = (st_tensor *)(uintptr_t)1;
    size_t n = 99;
    pg_error e;
    strcpy(e.msg, "(unset)");
    int rc = st_parse(buf, len, "bad.safetensors", &t, &n, &e);
    if (rc == PG_OK) {
        st_tensors_free(t, n);
        fail_msg("%s: accepted, expected a refusal", what);
    }
    assert_null(t);
    assert_int_equal(n, 0);
    if (!contains(e.msg, "bad.safetensors") || !contains(e.msg, sub1) || !contains(e.msg, sub2))
        fail_msg("%s: message '%s' lacks '%s' / '%s'", what, e.msg, sub1 ? sub1 : "", sub2 ? sub2 : "");
}

static void expect_refused(const char *header, size_t data_len, const char *sub1, const char *sub2)
{
    size_t len;
    uint8_t *b = make_image(header, data_len, &len);
    expect_refused_buf(b, len, header, sub1, sub2);
    free(b);
}

/* A small valid image: two tensors covering a 32-byte data area exactly. */
#define VALID_HEADER                                                           \
    "{\"__metadata__\":{\"format\":\"pt\"},"                                   \
    "\"b\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"       \
    "\"a\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]}}"
#define VALID_DATA 32

/* ---- the pure parser: valid inputs ---------------------------------------- */

static void test_parse_valid(void **state)
{
    (void)state;
    size_t len;
    uint8_t *b = make_image(VALID_HEADER, VALID_DATA, &len);
    st_tensor *t;
    size_t n;
    pg_error e;
    assert_int_equal(st_parse(b, len, "ok.safetensors", &t, &n, &e), PG_OK);
    assert_int_equal(n, 2);
    /* sorted by name */
    assert_string_equal(t[0].name, "a");
    assert_string_equal(t[1].name, "b");
    assert_int_equal(t[0].dtype, ST_BF16);
    assert_int_equal(t[0].ndim, 1);
    assert_int_equal(t[0].shape[0], 4);
    assert_int_equal(t[0].nbytes, 8);
    assert_ptr_equal(t[0].data, b + 8 + strlen(VALID_HEADER) + 24);
    assert_int_equal(t[1].dtype, ST_F32);
    assert_int_equal(t[1].ndim, 2);
    assert_int_equal(t[1].shape[0], 2);
    assert_int_equal(t[1].shape[1], 3);
    assert_int_equal(t[1].nbytes, 24);
    assert_ptr_equal(t[1].data, b + 8 + strlen(VALID_HEADER));
    assert_string_equal(t[1].file, "ok.safetensors");
    st_tensors_free(t, n);
    free(b);
}

static void test_parse_valid_variants(void **state)
{
    (void)state;
    /* every non-float dtype parses; scalars (shape []) and empty tensors too;
     * an empty tensor overlaps nothing; header padding with spaces; escapes
     * in names are decoded */
    const char *h =
        "{\"i8\":{\"dtype\":\"I8\",\"shape\":[3],\"data_offsets\":[0,3]},"
        "\"u8\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[3,4]},"
        "\"i16\":{\"dtype\":\"I16\",\"shape\":[2],\"data_offsets\":[4,8]},"
        "\"i32\":{\"dtype\":\"I32\",\"shape\":[],\"data_offsets\":[8,12]},"
        "\"i64\":{\"dtype\":\"I64\",\"shape\":[1,1,1,1,1,1,1,1],\"data_offsets\":[16,24]},"
        "\"f64\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[24,32]},"
        "\"bool\":{\"dtype\":\"BOOL\",\"shape\":[2],\"data_offsets\":[32,34]},"
        "\"f16\":{\"data_offsets\":[34,38],\"shape\":[2,1],\"dtype\":\"F16\"},"
        "\"empty\":{\"dtype\":\"F32\",\"shape\":[0,5],\"data_offsets\":[4,4]},"
        "\"\\u00e9\\n\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[12,14]}}        ";
    size_t len;
    uint8_t *b = make_image(h, 38, &len);
    st_tensor *t;
    size_t n;
    pg_error e;
    int rc = st_parse(b, len, "v.safetensors", &t, &n, &e);
    if (rc)
        fail_msg("%s", e.msg);
    assert_int_equal(n, 10);
    for (size_t i = 1; i < n; i++)
        assert_true(strcmp(t[i - 1].name, t[i].name) < 0);
    assert_string_equal(t[n - 1].name, "\xc3\xa9\n");
    for (size_t i = 0; i < n; i++) {
        if (strcmp(t[i].name, "i32") == 0) {
            assert_int_equal(t[i].ndim, 0);
            assert_int_equal(t[i].nbytes, 4);
        }
        if (strcmp(t[i].name, "empty") == 0)
            assert_int_equal(t[i].nbytes, 0);
        if (strcmp(t[i].name, "i64") == 0)
            assert_int_equal(t[i].ndim, 8);
    }
    st_tensors_free(t, n);
    free(b);

    /* an empty header object: no tensors, not an error */
    b = make_image("{}", 0, &len);
    assert_int_equal(st_parse(b, len, "e.safetensors", &t, &n, &e), PG_OK);
    assert_int_equal(n, 0);
    st_tensors_free(t, n);
    free(b);
}

/* ---- the pure parser: the malformed corpus -------------------------------- */

static void test_truncated_everywhere(void **state)
{
    (void)state;
    size_t len;
    uint8_t *full = make_image(VALID_HEADER, VALID_DATA, &len);
    for (size_t cut = 0; cut < len; cut++) {
        uint8_t *b = malloc(cut ? cut : 1);
        memcpy(b, full, cut);
        char what[64];
        snprintf(what, sizeof what, "truncated at %zu of %zu", cut, len);
        expect_refused_buf(b, cut, what, NULL, NULL);
        free(b);
    }
    free(full);
}

static void test_lying_header_length(void **state)
{
    (void)state;
    size_t hl = strlen(VALID_HEADER), len;
    struct { uint64_t field; const char *sub1, *sub2; } cases[] = {
        {hl + VALID_DATA + 1, "header length", "runs past the end"}, /* past the file */
        {hl + 1, "header", NULL},           /* swallows a data byte: trailing garbage */
        {hl - 1, "header", "json"},         /* cuts the closing brace */
        {0, "header length 0", NULL},
        {1, "header length 1", NULL},
        {(uint64_t)ST_MAX_HEADER_BYTES + 1, "exceeds the cap", NULL},
        {UINT64_MAX, "exceeds the cap", NULL},
        {(uint64_t)1 << 63, "exceeds the cap", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint8_t *b = make_image_raw(cases[i].field, VALID_HEADER, VALID_DATA, &len);
        char what[64];
        snprintf(what, sizeof what, "header length field %llu", (unsigned long long)cases[i].field);
        expect_refused_buf(b, len, what, cases[i].sub1, cases[i].sub2);
        free(b);
    }
    /* fewer than 8 bytes */
    uint8_t tiny[3] = {1, 0, 0};
    expect_refused_buf(tiny, sizeof tiny, "3-byte file", "expected at least 8", NULL);
    expect_refused_buf(tiny, 0, "empty file", "expected at least 8", NULL);
}

#define T(dtype, shape, offs) "{\"dtype\":\"" dtype "\",\"shape\":" shape ",\"data_offsets\":" offs "}"

static void test_bad_entries(void **state)
{
    (void)state;
    /* offsets */
    expect_refused("{\"x\":" T("F32", "[2]", "[8,0]") "}", 8, "tensor 'x'", "begin > end");
    expect_refused("{\"x\":" T("F32", "[2]", "[4,12]") "}", 8, "tensor 'x'", "past the data area");
    expect_refused("{\"x\":" T("F32", "[2]", "[0,8]") ",\"y\":" T("F32", "[2]", "[4,12]") "}", 12,
                   "overlap", "'x'");
    expect_refused("{\"x\":" T("F32", "[4]", "[0,16]") ",\"y\":" T("F32", "[1]", "[8,12]") "}", 16,
                   "overlap", NULL); /* y inside x */
    expect_refused("{\"x\":" T("F32", "[2]", "[0,8]") ",\"y\":" T("F32", "[2]", "[0,8]") "}", 8, "overlap", NULL);
    expect_refused("{\"x\":" T("F32", "[2]", "[0]") "}", 8, "tensor 'x'", "expected 2 entries in data_offsets");
    expect_refused("{\"x\":" T("F32", "[2]", "[0,8,9]") "}", 8, "tensor 'x'", "data_offsets");
    expect_refused("{\"x\":" T("F32", "[2]", "[-1,8]") "}", 8, "tensor 'x'", "non-negative");
    expect_refused("{\"x\":" T("F32", "[2]", "[0,18446744073709551616]") "}", 8, "tensor 'x'", "data_offsets[1]");
    expect_refused("{\"x\":" T("F32", "[2]", "{}") "}", 8, "tensor 'x'", "array");
    /* shape and size */
    expect_refused("{\"x\":" T("F32", "[2]", "[0,12]") "}", 12, "tensor 'x'", "expected 8 bytes");
    expect_refused("{\"x\":" T("F32", "[3,2]", "[0,8]") "}", 8, "tensor 'x'", "expected 24 bytes");
    expect_refused("{\"x\":" T("F32", "[4294967296,4294967296,4294967296]", "[0,8]") "}", 8, "tensor 'x'",
                   "overflow");
    expect_refused("{\"x\":" T("F32", "[4611686018427387904]", "[0,8]") "}", 8, "tensor 'x'", "overflow");
    expect_refused("{\"x\":" T("F32", "[2,-1]", "[0,8]") "}", 8, "tensor 'x'", "shape[1]");
    expect_refused("{\"x\":" T("F32", "[2.0]", "[0,8]") "}", 8, "tensor 'x'", "non-negative integer");
    expect_refused("{\"x\":" T("F32", "[\"2\"]", "[0,8]") "}", 8, "tensor 'x'", "shape[0]");
    expect_refused("{\"x\":" T("F32", "[1,1,1,1,1,1,1,1,2]", "[0,8]") "}", 8, "tensor 'x'", "at most 8 dims");
    expect_refused("{\"x\":" T("F32", "2", "[0,8]") "}", 8, "tensor 'x'", "shape");
    /* dtype */
    expect_refused("{\"x\":" T("F8_E4M3", "[2]", "[0,2]") "}", 2, "tensor 'x'", "unknown dtype 'F8_E4M3'");
    expect_refused("{\"x\":" T("f32", "[2]", "[0,8]") "}", 8, "tensor 'x'", "unknown dtype");
    expect_refused("{\"x\":{\"dtype\":4,\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "tensor 'x'", "dtype");
    /* entry structure */
    expect_refused("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"extra\":1}}", 8,
                   "tensor 'x'", "unknown key 'extra'");
    expect_refused("{\"x\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, "tensor 'x'", "missing key 'data_offsets'");
    expect_refused("{\"x\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
                   "tensor 'x'", "duplicate key 'dtype'");
    expect_refused("{\"x\":[1,2]}", 8, "tensor 'x'", "expected an object");
    expect_refused("{\"x\":null}", 8, "tensor 'x'", NULL);
    /* names */
    expect_refused("{\"x\":" T("F32", "[1]", "[0,4]") ",\"x\":" T("F32", "[1]", "[4,8]") "}", 8, "tensor 'x'",
                   "duplicate name");
    expect_refused("{\"x\":" T("F32", "[1]", "[0,4]") ",\"\\u0078\":" T("F32", "[1]", "[4,8]") "}", 8,
                   "tensor 'x'", "duplicate name");
    expect_refused("{\"a\\u0000b\":" T("F32", "[1]", "[0,4]") "}", 4, "NUL", NULL);
    /* metadata */
    expect_refused("{\"__metadata__\":{\"format\":1}}", 0, "__metadata__", "'format'");
    expect_refused("{\"__metadata__\":[]}", 0, "__metadata__", NULL);
    expect_refused("{\"__metadata__\":{},\"__metadata__\":{}}", 0, "__metadata__", NULL);
    /* not json / not an object */
    expect_refused("hello world", 0, "header", "json");
    expect_refused("[1,2]", 0, "header", "expected a json object");
    expect_refused("\"x\"", 0, "header", NULL);
    expect_refused("{\"x\":" T("F32", "[2]", "[0,8]") "} {}", 8, "header", NULL);
    expect_refused("{\"x\" " T("F32", "[2]", "[0,8]") "}", 8, "header", NULL);        /* no colon */
    expect_refused("{\"x\":" T("F32", "[2]", "[0,8]") ",}", 8, "header", NULL);       /* trailing comma */
    expect_refused("{\"x\":{\"dtype\":\"F32\" \"shape\":[2],\"data_offsets\":[0,8]}}", 8, NULL, NULL);
    expect_refused("{\"x\":" T("F32", "[2,,]", "[0,8]") "}", 8, NULL, NULL);
    expect_refused("{\"x\":" T("F32", "[2]", "[0,8]") "\0}", 8, NULL, NULL);
}

/* ---- st_open on real and written files -------------------------------------- */

static void test_stories260k(void **state)
{
    (void)state;
    const char *dir = pg_test_shared_path("models/stories260K");
    st_file *f = NULL;
    pg_error e;
    int rc = st_open(&f, dir, &e);
    if (rc)
        fail_msg("%s", e.msg);
    assert_int_equal(st_count(f), 2 + 5 * 9);
    for (size_t i = 1; i < st_count(f); i++)
        assert_true(strcmp(st_at(f, i - 1)->name, st_at(f, i)->name) < 0);
    for (size_t i = 0; i < st_count(f); i++)
        assert_ptr_equal(st_find(f, st_at(f, i)->name), st_at(f, i));
    assert_null(st_at(f, st_count(f)));
    assert_null(st_find(f, "model.layers.5.self_attn.q_proj.weight"));
    assert_null(st_find(f, ""));

    const st_tensor *t;
    int64_t emb[2] = {512, 64};
    assert_int_equal(st_get(f, "model.embed_tokens.weight", 0, ST_F32, 2, emb, &t, &e), PG_OK);
    assert_int_equal(t->nbytes, 512 * 64 * 4);
    assert_string_equal(t->file, "model.safetensors");
    int64_t kv[2] = {32, 64};
    assert_int_equal(st_get(f, "model.layers.4.self_attn.k_proj.weight", 1, ST_F32, 2, kv, &t, &e), PG_OK);
    int64_t ff[2] = {64, 172};
    assert_int_equal(st_get(f, "model.layers.0.mlp.down_proj.weight", 0, ST_F32, 2, ff, &t, &e), PG_OK);
    int64_t n1[1] = {64};
    assert_int_equal(st_get(f, "model.norm.weight", 0, ST_F32, 1, n1, &t, &e), PG_OK);

    /* the bytes handed out are the file's bytes */
    size_t flen;
    char *raw = pg_test_read_file(pg_test_shared_path("models/stories260K/model.safetensors"), &flen);
    assert_non_null(raw);
    uint64_t hl = 0;
    for (int k = 7; k >= 0; k--)
        hl = (hl << 8) | (uint8_t)raw[k];
    t = st_find(f, "model.embed_tokens.weight");
    assert_memory_equal(t->data, raw + 8 + hl, t->nbytes); /* data_offsets [0, 131072] */
    free(raw);

    /* expected vs found */
    int64_t wrong[2] = {64, 512};
    assert_int_equal(st_get(f, "model.embed_tokens.weight", 0, ST_F32, 2, wrong, &t, &e), PG_EFORMAT);
    assert_null(t);
    assert_string_equal(e.msg,
                        "model.safetensors: tensor 'model.embed_tokens.weight': expected [64,512] F32, got [512,64] F32");
    assert_int_equal(st_get(f, "model.embed_tokens.weight", 0, ST_BF16, 2, emb, &t, &e), PG_EFORMAT);
    assert_string_equal(e.msg,
                        "model.safetensors: tensor 'model.embed_tokens.weight': expected [512,64] BF16, got [512,64] F32");
    assert_int_equal(st_get(f, "model.norm.weight", 1, ST_F32, 2, emb, &t, &e), PG_EFORMAT);
    assert_true(contains(e.msg, "expected [512,64] F32|F16|BF16, got [64] F32"));
    assert_int_equal(st_get(f, "lm_head.weight", 0, ST_F32, 2, emb, &t, &e), PG_EFORMAT);
    assert_string_equal(e.msg, "model.safetensors: tensor 'lm_head.weight' not found");
    st_close(f);

    /* the file path itself opens too */
    assert_int_equal(st_open(&f, pg_test_shared_path("models/stories260K/model.safetensors"), &e), PG_OK);
    assert_int_equal(st_count(f), 47);
    st_close(f);
    st_close(NULL);
}

static void test_codellama_index_without_shards(void **state)
{
    (void)state;
    st_file *f = (st_file *)(uintptr_t)1;
    pg_error e;
    int rc = st_open(&f, pg_test_shared_path("models/codellama-7b-sharded-index"), &e);
    assert_int_equal(rc, PG_EIO);
    assert_null(f);
    /* the first shard the weight_map names is 00002, needed by lm_head.weight */
    if (!contains(e.msg, "missing shard 'model-00002-of-00002.safetensors'") || !contains(e.msg, "lm_head.weight") ||
        !contains(e.msg, "model.safetensors.index.json"))
        fail_msg("message: %s", e.msg);
    /* the index file named directly gives the same answer */
    rc = st_open(&f, pg_test_shared_path("models/codellama-7b-sharded-index/model.safetensors.index.json"), &e);
    assert_int_equal(rc, PG_EIO);
    assert_true(contains(e.msg, "missing shard"));
}

typedef struct tmpdir {
    char path[256];
} tmpdir;

static void tmp_make(tmpdir *d)
{
    const char *base = getenv("TMPDIR");
    snprintf(d->path, sizeof d->path, "%s/pg_st_XXXXXX", base && *base ? base : "/tmp");
    assert_non_null(mkdtemp(d->path));
}

static const char *tmp_file(const tmpdir *d, const char *name)
{
    static char p[512];
    snprintf(p, sizeof p, "%s/%s", d->path, name);
    return p;
}

static void tmp_remove(const tmpdir *d, const char *const *names)
{
    for (; *names; names++)
        unlink(tmp_file(d, *names));
    rmdir(d->path);
}

#define SH1 "model-00001-of-00002.safetensors"
#define SH2 "model-00002-of-00002.safetensors"
#define IDX "model.safetensors.index.json"

static void write_index(const tmpdir *d, const char *weight_map)
{
    char buf[2048];
    snprintf(buf, sizeof buf, "{\"metadata\":{\"total_size\":28},\"weight_map\":%s}", weight_map);
    write_file(tmp_file(d, IDX), buf, strlen(buf));
}

static void test_sharded_checkpoint(void **state)
{
    (void)state;
    tmpdir d;
    tmp_make(&d);
    static const char *const files[] = {SH1, SH2, IDX, "model.safetensors", NULL};
    write_image(tmp_file(&d, SH1), "{\"a\":" T("F32", "[2]", "[0,8]") ",\"c\":" T("F16", "[2,3]", "[8,20]") "}", 20);
    write_image(tmp_file(&d, SH2), "{\"b\":" T("BF16", "[4]", "[0,8]") "}", 8);
    write_index(&d, "{\"a\":\"" SH1 "\",\"b\":\"" SH2 "\",\"c\":\"" SH1 "\"}");

    st_file *f = NULL;
    pg_error e;
    int rc = st_open(&f, d.path, &e);
    if (rc)
        fail_msg("%s", e.msg);
    assert_int_equal(st_count(f), 3);
    assert_string_equal(st_at(f, 0)->name, "a");
    assert_string_equal(st_at(f, 1)->name, "b");
    assert_string_equal(st_at(f, 2)->name, "c");
    assert_string_equal(st_find(f, "a")->file, SH1);
    assert_string_equal(st_find(f, "b")->file, SH2);
    assert_string_equal(st_find(f, "c")->file, SH1);
    const st_tensor *t;
    int64_t sc[2] = {2, 3};
    assert_int_equal(st_get(f, "c", 1, ST_F32, 2, sc, &t, &e), PG_OK);
    assert_int_equal(t->dtype, ST_F16);
    assert_int_equal(((const uint8_t *)t->data)[0], (uint8_t)(8 * 7 + 1)); /* byte 8 of the data area */
    int64_t sb[1] = {5};
    assert_int_equal(st_get(f, "b", 1, ST_F32, 1, sb, &t, &e), PG_EFORMAT);
    assert_string_equal(e.msg, SH2 ": tensor 'b': expected [5] F32|F16|BF16, got [4] BF16");
    assert_int_equal(st_get(f, "zz", 1, ST_F32, 1, sb, &t, &e), PG_EFORMAT);
    assert_string_equal(e.msg, IDX ": tensor 'zz' not found");
    st_close(f);

    /* the index is preferred over a model.safetensors beside it */
    write_image(tmp_file(&d, "model.safetensors"), "{\"z\":" T("F32", "[1]", "[0,4]") "}", 4);
    assert_int_equal(st_open(&f, d.path, &e), PG_OK);
    assert_int_equal(st_count(f), 3);
    st_close(f);

    /* the map names the wrong shard for a tensor */
    write_index(&d, "{\"a\":\"" SH2 "\",\"b\":\"" SH2 "\",\"c\":\"" SH1 "\"}");
    assert_int_equal(st_open(&f, d.path, &e), PG_EFORMAT);
    assert_true(contains(e.msg, "tensor 'a'") && contains(e.msg, "found in '" SH1 "'"));
    /* the map lists a tensor no shard holds */
    write_index(&d, "{\"a\":\"" SH1 "\",\"b\":\"" SH2 "\",\"c\":\"" SH1 "\",\"d\":\"" SH2 "\"}");
    assert_int_equal(st_open(&f, d.path, &e), PG_EFORMAT);
    assert_true(contains(e.msg, "tensor 'd'") && contains(e.msg, "does not hold it"));
    /* a shard file name with a path in it */
    write_index(&d, "{\"a\":\"../" SH1 "\"}");
    assert_int_equal(st_open(&f, d.path, &e), PG_EFORMAT);
    assert_true(contains(e.msg, "expected a file name"));
    /* not an index */
    write_index(&d, "[]");
    assert_int_equal(st_open(&f, d.path, &e), PG_EFORMAT);
    assert_true(contains(e.msg, "weight_map"));
    /* a missing shard names itself and a tensor */
    write_index(&d, "{\"a\":\"" SH1 "\",\"q\":\"model-00003-of-00003.safetensors\"}");
    assert_int_equal(st_open(&f, d.path, &e), PG_EIO);
    assert_true(contains(e.msg, "missing shard 'model-00003-of-00003.safetensors'") && contains(e.msg, "'q'"));
    /* the same tensor in two shards */
    write_image(tmp_file(&d, SH2), "{\"b\":" T("BF16", "[4]", "[0,8]") ",\"a\":" T("F32", "[2]", "[8,16]") "}", 16);
    write_index(&d, "{\"a\":\"" SH1 "\",\"b\":\"" SH2 "\",\"c\":\"" SH1 "\"}");
    assert_int_equal(st_open(&f, d.path, &e), PG_EFORMAT);
    assert_true(contains(e.msg, "tensor 'a' appears in both"));
    /* a malformed shard names the shard */
    write_image(tmp_file(&d, SH2), "{\"b\":" T("BF16", "[5]", "[0,8]") "}", 8);
    assert_int_equal(st_open(&f, d.path, &e), PG_EFORMAT);
    assert_true(contains(e.msg, SH2 ": tensor 'b': expected 10 bytes"));
    assert_null(f);
    tmp_remove(&d, files);
}

static void test_open_errors(void **state)
{
    (void)state;
    tmpdir d;
    tmp_make(&d);
    static const char *const files[] = {"x.safetensors", "model.safetensors", NULL};
    st_file *f = (st_file *)(uintptr_t)1;
    pg_error e;
    /* empty folder */
    assert_int_equal(st_open(&f, d.path, &e), PG_EIO);
    assert_null(f);
    assert_true(contains(e.msg, "found neither"));
    /* missing file */
    assert_int_equal(st_open(&f, tmp_file(&d, "nope.safetensors"), &e), PG_EIO);
    assert_true(contains(e.msg, "nope.safetensors"));
    /* an empty file */
    write_file(tmp_file(&d, "x.safetensors"), "", 0);
    assert_int_equal(st_open(&f, tmp_file(&d, "x.safetensors"), &e), PG_EFORMAT);
    assert_true(contains(e.msg, "x.safetensors: file is 0 bytes"));
    /* a malformed model.safetensors found through its folder */
    write_image(tmp_file(&d, "model.safetensors"), "{\"w\":" T("F32", "[3]", "[0,8]") "}", 8);
    assert_int_equal(st_open(&f, d.path, &e), PG_EFORMAT);
    assert_string_equal(e.msg, "model.safetensors: tensor 'w': expected 12 bytes (3 F32 elements), got data_offsets [0,8] (8 bytes)");
    tmp_remove(&d, files);
}

/* file_io: the checked reader every weights/ file goes through */
static void test_file_io(void **state)
{
    (void)state;
    tmpdir d;
    tmp_make(&d);
    static const char *const files[] = {"f.txt", "empty", NULL};
    write_file(tmp_file(&d, "f.txt"), "abc\0def", 7);
    char *buf = NULL;
    size_t len = 0;
    pg_error e;
    assert_int_equal(pg_read_file(tmp_file(&d, "f.txt"), 7, &buf, &len, &e), PG_OK);
    assert_int_equal(len, 7);
    assert_memory_equal(buf, "abc\0def", 8); /* NUL-terminated, inner NUL kept */
    pg_file_free(buf);
    assert_int_equal(pg_read_file(tmp_file(&d, "f.txt"), 6, &buf, &len, &e), PG_EFORMAT);
    assert_null(buf);
    assert_int_equal(len, 0);
    assert_true(contains(e.msg, "f.txt: file is 7 bytes, expected at most 6"));
    assert_int_equal(pg_read_file(d.path, 100, &buf, &len, &e), PG_EIO);
    assert_true(contains(e.msg, "expected a regular file, found a directory"));
    assert_int_equal(pg_read_file(tmp_file(&d, "missing"), 100, &buf, &len, &e), PG_EIO);
    assert_true(contains(e.msg, "missing: cannot open"));
    write_file(tmp_file(&d, "empty"), "", 0);
    assert_int_equal(pg_read_file(tmp_file(&d, "empty"), 0, &buf, &len, &e), PG_OK);
    assert_int_equal(len, 0);
    assert_int_equal(buf[0], '\0');
    pg_file_free(buf);
    pg_file_free(NULL);

    pg_map m;
    assert_int_equal(pg_map_file(tmp_file(&d, "f.txt"), &m, &e), PG_OK);
    assert_int_equal(m.size, 7);
    assert_memory_equal(m.data, "abc\0def", 7);
    pg_unmap_file(&m);
    assert_null(m.data);
    assert_int_equal(pg_map_file(tmp_file(&d, "empty"), &m, &e), PG_OK);
    assert_int_equal(m.size, 0);
    pg_unmap_file(&m);
    assert_int_equal(pg_map_file(d.path, &m, &e), PG_EIO);
    assert_true(pg_file_exists(tmp_file(&d, "f.txt")) && !pg_file_exists(d.path));
    assert_true(pg_dir_exists(d.path) && !pg_dir_exists(tmp_file(&d, "f.txt")));
    tmp_remove(&d, files);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_valid),
        cmocka_unit_test(test_parse_valid_variants),
        cmocka_unit_test(test_truncated_everywhere),
        cmocka_unit_test(test_lying_header_length),
        cmocka_unit_test(test_bad_entries),
        cmocka_unit_test(test_stories260k),
        cmocka_unit_test(test_codellama_index_without_shards),
        cmocka_unit_test(test_sharded_checkpoint),
        cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_file_io),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
