/* test_tokenizer: the tokenizer against Hugging Face's own tokenizations
 * (../shared/goldens/tokenize-*.jsonl, made by transformers.js; the *-pyref
 * files by Python transformers: ids, tokens, both decodes), the stories260K
 * prompts and greedy completion (decoded through the incremental decoder),
 * the stream invariant on random id sequences, and a few hand-made
 * tokenizers for the parts the goldens do not reach (Metaspace, Split
 * behaviours, invalid byte runs, the Unicode normalization forms, \s). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <utf8proc.h>

#include "json.h"
#include "test_support.h"
#include "tokenizer.h"

/* ---- helpers ---- */

static tokenizer *load_dir(const char *rel)
{
    tokenizer *t = NULL;
    pg_error err = {{0}};
    int rc = tok_load(&t, pg_test_shared_path(rel), &err);
    if (rc)
        fprintf(stderr, "tok_load %s: %s\n", rel, err.msg);
    assert_int_equal(rc, 0);
    return t;
}

/* ids of a JSON array field; returns count, -1 when absent. */
static long get_ids(const json_doc *d, const char *key, int32_t **out)
{
    int a = json_obj_get(d, 0, key);
    *out = NULL;
    if (!json_is_array(d, a))
        return -1;
    int n = json_size(d, a);
    *out = malloc(((size_t)n + 1) * sizeof **out);
    int i = a + 1;
    for (int k = 0; k < n; k++, i = json_skip(d, i)) {
        int64_t v;
        assert_int_equal(json_get_int(d, i, 0, INT32_MAX, &v, NULL), 0);
        (*out)[k] = (int32_t)v;
    }
    return n;
}

static char *get_str(const json_doc *d, const char *key, size_t *len)
{
    int v = json_obj_get(d, 0, key);
    char *s = NULL;
    if (!json_is_string(d, v))
        return NULL;
    assert_int_equal(json_get_string(d, v, &s, len, NULL), 0);
    return s;
}

static void print_ids(const char *what, const int32_t *ids, size_t n)
{
    fprintf(stderr, "    %s [", what);
    for (size_t i = 0; i < n && i < 40; i++)
        fprintf(stderr, "%s%d", i ? "," : "", (int)ids[i]);
    fprintf(stderr, "%s]\n", n > 40 ? ",..." : "");
}

typedef struct file_stats {
    int lines, ok, shown;
} file_stats;

static void mismatch(file_stats *st, const char *file, int line, const char *field,
                     const char *text, const int32_t *exp, size_t ne, const int32_t *got,
                     size_t ng, const char *exps, const char *gots)
{
    if (st->shown++ >= 4)
        return;
    fprintf(stderr, "  %s:%d %s mismatch, text \"%.120s\"\n", file, line, field, text);
    if (exp) {
        print_ids("expected", exp, ne);
        print_ids("got     ", got, ng);
    } else {
        fprintf(stderr, "    expected \"%.200s\"\n    got      \"%.200s\"\n", exps, gots);
    }
}

static bool ids_eq(const int32_t *a, size_t na, const int32_t *b, size_t nb)
{
    return na == nb && (na == 0 || memcmp(a, b, na * sizeof *a) == 0);
}

/* Checks every line of goldens/<file> with tokenizer t. Fields that a line
 * lacks are not checked. Returns the number of mismatching lines. */
static int check_golden(tokenizer *t, const char *file, const char *ids_key)
{
    size_t flen;
    char rel[256];
    snprintf(rel, sizeof rel, "goldens/%s", file);
    char *buf = pg_test_read_file(pg_test_shared_path(rel), &flen);
    assert_non_null(buf);
    file_stats st = {0, 0, 0};
    char *line = buf;
    while (line < buf + flen) {
        char *nl = memchr(line, '\n', (size_t)(buf + flen - line));
        size_t ll = nl ? (size_t)(nl - line) : (size_t)(buf + flen - line);
        if (ll == 0) {
            line += 1;
            continue;
        }
        st.lines++;
        json_doc d;
        assert_int_equal(json_parse(&d, line, ll, file, NULL), 0);
        size_t tl;
        char *text = get_str(&d, "text", &tl);
        assert_non_null(text);
        bool good = true;
        pg_error err;
        int32_t *exp, *got;
        size_t ng;
        long ne = get_ids(&d, ids_key, &exp);
        if (ne >= 0) {
            assert_int_equal(tok_encode(t, text, tl, true, &got, &ng, &err), 0);
            if (!ids_eq(exp, (size_t)ne, got, ng)) {
                good = false;
                mismatch(&st, file, st.lines, ids_key, text, exp, (size_t)ne, got, ng, "", "");
            }
            free(got);
        }
        int32_t *ns;
        long nns = get_ids(&d, "ids_no_special", &ns);
        if (nns >= 0) {
            assert_int_equal(tok_encode(t, text, tl, false, &got, &ng, &err), 0);
            if (!ids_eq(ns, (size_t)nns, got, ng)) {
                good = false;
                mismatch(&st, file, st.lines, "ids_no_special", text, ns, (size_t)nns, got, ng, "",
                         "");
            }
            free(got);
        }
        /* tokens = the vocabulary strings of ids_no_special; the pyref files
         * have none, and their tokens are those of ids or (llama_encoded)
         * of the ids without BOS */
        int tk = json_obj_get(&d, 0, "tokens");
        int32_t *tids = nns >= 0 ? ns : exp, *plain = NULL;
        long ntids = nns >= 0 ? nns : ne;
        if (json_is_array(&d, tk) && nns < 0 && json_size(&d, tk) != ne) {
            size_t np;
            assert_int_equal(tok_encode(t, text, tl, false, &plain, &np, &err), 0);
            tids = plain;
            ntids = (long)np;
        }
        if (json_is_array(&d, tk) && ntids >= 0) {
            bool same = json_size(&d, tk) == ntids;
            int i = tk + 1;
            for (long k = 0; same && k < ntids; k++, i = json_skip(&d, i)) {
                char *want;
                size_t wl;
                assert_int_equal(json_get_string(&d, i, &want, &wl, NULL), 0);
                const char *piece = tok_piece(t, tids[k]);
                same = piece && strlen(piece) == wl && memcmp(piece, want, wl) == 0;
                if (!same)
                    mismatch(&st, file, st.lines, "tokens", text, NULL, 0, NULL, 0, want,
                             piece ? piece : "(none)");
                free(want);
            }
            if (!same && json_size(&d, tk) != ntids)
                mismatch(&st, file, st.lines, "tokens (count)", text, NULL, 0, NULL, 0, "", "");
            good = good && same;
        }
        free(plain);
        /* decoded = decode(ids_no_special, skip_special=false, no cleanup) */
        size_t dl;
        char *dec = get_str(&d, "decoded", &dl);
        if (dec && nns >= 0) {
            char *o;
            size_t ol;
            assert_int_equal(tok_decode(t, ns, (size_t)nns, false, &o, &ol, &err), 0);
            if (ol != dl || memcmp(o, dec, dl) != 0) {
                good = false;
                mismatch(&st, file, st.lines, "decoded", text, NULL, 0, NULL, 0, dec, o);
            }
            free(o);
        }
        /* decoded_skip_special = decode(ids, skip_special) with the config's cleanup */
        char *dss = get_str(&d, "decoded_skip_special", &dl);
        int32_t *all = ne >= 0 ? exp : ns;
        long nall = ne >= 0 ? ne : nns;
        if (dss && nall >= 0) {
            char *o;
            size_t ol;
            unsigned fl = TOK_DECODE_SKIP_SPECIAL | (tok_cleanup_default(t) ? TOK_DECODE_CLEANUP : 0);
            assert_int_equal(tok_decode_ex(t, all, (size_t)nall, fl, &o, &ol, &err), 0);
            if (ol != dl || memcmp(o, dss, dl) != 0) {
                good = false;
                mismatch(&st, file, st.lines, "decoded_skip_special", text, NULL, 0, NULL, 0, dss, o);
            }
            free(o);
        }
        char *dws = get_str(&d, "decoded_with_special", &dl);
        if (dws && ne >= 0) {
            char *o;
            size_t ol;
            unsigned fl = tok_cleanup_default(t) ? TOK_DECODE_CLEANUP : 0;
            assert_int_equal(tok_decode_ex(t, exp, (size_t)ne, fl, &o, &ol, &err), 0);
            if (ol != dl || memcmp(o, dws, dl) != 0) {
                good = false;
                mismatch(&st, file, st.lines, "decoded_with_special", text, NULL, 0, NULL, 0, dws, o);
            }
            free(o);
        }
        st.ok += good;
        free(exp);
        free(ns);
        free(dec);
        free(dss);
        free(dws);
        free(text);
        json_doc_free(&d);
        line += ll + 1;
    }
    free(buf);
    fprintf(stderr, "%-32s %d/%d lines match\n", file, st.ok, st.lines);
    assert_true(st.lines > 0);
    return st.lines - st.ok;
}

/* ---- golden files ---- */

static void test_llama2(void **state)
{
    (void)state;
    tokenizer *t = load_dir("tokenizers/llama2");
    int bad = check_golden(t, "tokenize-llama2.jsonl", "ids");
    bad += check_golden(t, "tokenize-llama2-pyref.jsonl", "ids");
    tok_free(t);
    assert_int_equal(bad, 0);
}

static void test_codellama(void **state)
{
    (void)state;
    tokenizer *t = load_dir("tokenizers/codellama-7b");
    int bad = check_golden(t, "tokenize-codellama-7b.jsonl", "ids");
    tok_free(t);
    assert_int_equal(bad, 0);
}

static void test_mistral(void **state)
{
    (void)state;
    tokenizer *t = load_dir("tokenizers/mistral-7b");
    int bad = check_golden(t, "tokenize-mistral-7b.jsonl", "ids");
    tok_free(t);
    assert_int_equal(bad, 0);
}

static void test_llama3(void **state)
{
    (void)state;
    tokenizer *t = load_dir("tokenizers/llama3");
    assert_int_equal(tok_vocab_size(t), 128256);
    assert_int_equal(tok_bos_id(t), 128000);
    assert_int_equal(tok_eos_id(t), 128001);
    assert_true(tok_is_special(t, 128009));
    assert_true(tok_cleanup_default(t));
    int bad = check_golden(t, "tokenize-llama3.jsonl", "ids");
    /* pyref: Llama 3.2 adds BOS; this revision does not: compare without */
    bad += check_golden(t, "tokenize-llama3-pyref.jsonl", "no-such-field");
    tok_free(t);
    assert_int_equal(bad, 0);
}

/* Qwen3: NFC normalizer, Split regex with single digits + ByteLevel, no
 * BOS, and added tokens of which only the first 14 are special: <think>,
 * <tool_call> & co. stay in decode(skip_special_tokens=true). */
static void test_qwen3(void **state)
{
    (void)state;
    tokenizer *t = load_dir("tokenizers/qwen3");
    assert_int_equal(tok_vocab_size(t), 151669);
    assert_int_equal(tok_bos_id(t), -1);
    assert_int_equal(tok_eos_id(t), 151645); /* <|im_end|> */
    assert_false(tok_cleanup_default(t));
    assert_true(tok_is_special(t, 151643));  /* <|endoftext|> */
    assert_true(tok_is_special(t, 151656));  /* <|video_pad|> */
    assert_false(tok_is_special(t, 151657)); /* <tool_call> */
    assert_false(tok_is_special(t, 151667)); /* <think> */
    assert_string_equal(tok_piece(t, 151668), "</think>");
    int bad = check_golden(t, "tokenize-qwen3.jsonl", "ids");

    /* <|im_start|> and <|im_end|> go, <think> and <tool_call> stay */
    static const char chat[] = "<|im_start|>assistant\n<think>\n2+2</think>\n\n"
                               "<tool_call>x</tool_call><|im_end|>";
    int32_t *ids;
    size_t n;
    pg_error err;
    assert_int_equal(tok_encode(t, chat, sizeof chat - 1, true, &ids, &n, &err), 0);
    assert_int_equal(ids[0], 151644);
    assert_int_equal(ids[n - 1], 151645);
    char *o;
    size_t ol;
    assert_int_equal(tok_decode(t, ids, n, true, &o, &ol, &err), 0);
    assert_string_equal(o, "assistant\n<think>\n2+2</think>\n\n<tool_call>x</tool_call>");
    free(o);
    assert_int_equal(tok_decode(t, ids, n, false, &o, &ol, &err), 0);
    assert_string_equal(o, chat);
    free(o);
    free(ids);

    /* NFC before the pre-tokenizer: e + U+0301 is é; digits one by one */
    int32_t *a, *b;
    size_t na, nb;
    assert_int_equal(tok_encode(t, "caf\x65\xCC\x81 2024", 11, false, &a, &na, &err), 0);
    assert_int_equal(tok_encode(t, "caf\xC3\xA9 2024", 10, false, &b, &nb, &err), 0);
    assert_true(ids_eq(a, na, b, nb));
    assert_int_equal(na, 7); /* "caf", "é", " ", "2", "0", "2", "4" */
    free(a);
    free(b);
    tok_free(t);
    assert_int_equal(bad, 0);
}

/* ---- stories260K: prompts and a streamed greedy completion ---- */

static void test_stories260k(void **state)
{
    (void)state;
    tokenizer *t = load_dir("models/stories260K");
    assert_int_equal(tok_vocab_size(t), 512);
    assert_int_equal(tok_bos_id(t), 1);
    assert_int_equal(tok_eos_id(t), 2);
    size_t flen;
    char *buf = pg_test_read_file(pg_test_shared_path("goldens/stories260K-greedy.jsonl"), &flen);
    assert_non_null(buf);
    int lines = 0;
    for (char *line = buf; line < buf + flen;) {
        char *nl = memchr(line, '\n', (size_t)(buf + flen - line));
        size_t ll = nl ? (size_t)(nl - line) : (size_t)(buf + flen - line);
        if (ll == 0) {
            line++;
            continue;
        }
        json_doc d;
        assert_int_equal(json_parse(&d, line, ll, "stories260K-greedy.jsonl", NULL), 0);
        size_t pl, cl;
        char *prompt = get_str(&d, "prompt", &pl);
        char *ctext = get_str(&d, "completion_text", &cl);
        int32_t *pids, *cids, *got;
        long np = get_ids(&d, "prompt_token_ids", &pids);
        long nc = get_ids(&d, "completion_token_ids", &cids);
        assert_true(prompt && ctext && np >= 0 && nc >= 0);
        size_t ng;
        pg_error err;
        assert_int_equal(tok_encode(t, prompt, pl, true, &got, &ng, &err), 0);
        if (!ids_eq(pids, (size_t)np, got, ng)) {
            fprintf(stderr, "stories260K prompt \"%s\"\n", prompt);
            print_ids("expected", pids, (size_t)np);
            print_ids("got     ", got, ng);
            fail();
        }
        free(got);
        tok_stream *s;
        assert_int_equal(tok_stream_create(&s, t, true, pids, (size_t)np, &err), 0);
        char *acc = malloc(cl + 4096);
        size_t al = 0;
        for (long k = 0; k < nc; k++) {
            const char *p;
            size_t n;
            assert_int_equal(tok_stream_push(s, cids[k], &p, &n, &err), 0);
            assert_true(al + n < cl + 4096);
            memcpy(acc + al, p, n);
            al += n;
        }
        const char *p;
        size_t n;
        assert_int_equal(tok_stream_finish(s, &p, &n, &err), 0);
        memcpy(acc + al, p, n);
        al += n;
        if (al != cl || memcmp(acc, ctext, cl) != 0) {
            fprintf(stderr, "stories260K completion mismatch\n  expected \"%.200s\"\n  got      \"%.*s\"\n",
                    ctext, (int)(al > 200 ? 200 : al), acc);
            fail();
        }
        tok_stream_free(s);
        free(acc);
        free(prompt);
        free(ctext);
        free(pids);
        free(cids);
        json_doc_free(&d);
        lines++;
        line += ll + 1;
    }
    fprintf(stderr, "stories260K-greedy.jsonl         %d/%d prompts and completions match\n", lines,
            lines);
    assert_true(lines > 0);
    free(buf);
    tok_free(t);
}

/* ---- stream invariant on random ids ---- */

static bool valid_utf8(const unsigned char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned char c = s[i];
        size_t k = c < 0x80 ? 1 : (c >= 0xC2 && c < 0xE0) ? 2 : (c >= 0xE0 && c < 0xF0) ? 3
                                 : (c >= 0xF0 && c < 0xF5) ? 4 : 0;
        if (k == 0 || i + k > n)
            return false;
        for (size_t j = 1; j < k; j++)
            if ((s[i + j] & 0xC0) != 0x80)
                return false;
        i += k;
    }
    return true;
}

static void stream_random(tokenizer *t, uint64_t seed, int rounds)
{
    pg_test_rng r = {seed};
    int32_t V = tok_vocab_size(t);
    int checked = 0;
    for (int round = 0; round < rounds; round++) {
        int32_t ids[64];
        int n = pg_test_rng_int(&r, 1, 64), np = pg_test_rng_int(&r, 0, n);
        for (int i = 0; i < n; i++) {
            int kind = pg_test_rng_int(&r, 0, 9);
            if (kind < 4) /* bytes: <0x..> pieces (llama2) or low ids (byte-level) */
                ids[i] = pg_test_rng_int(&r, 0, V < 300 ? V - 1 : 270);
            else if (kind == 4)
                ids[i] = pg_test_rng_int(&r, V > 128256 - 1 ? 128000 : 0, V - 1);
            else
                ids[i] = pg_test_rng_int(&r, 0, V - 1);
        }
        bool skip = round & 1;
        pg_error err;
        char *all, *pre;
        size_t la, lp;
        assert_int_equal(tok_decode(t, ids, (size_t)n, skip, &all, &la, &err), 0);
        assert_int_equal(tok_decode(t, ids, (size_t)np, skip, &pre, &lp, &err), 0);
        tok_stream *s;
        assert_int_equal(tok_stream_create(&s, t, skip, ids, (size_t)np, &err), 0);
        char acc[64 * 256];
        size_t al = 0;
        for (int i = np; i <= n; i++) {
            const char *p;
            size_t k;
            if (i < n)
                assert_int_equal(tok_stream_push(s, ids[i], &p, &k, &err), 0);
            else
                assert_int_equal(tok_stream_finish(s, &p, &k, &err), 0);
            assert_true(valid_utf8((const unsigned char *)p, k)); /* never half a char */
            assert_true(al + k <= sizeof acc);
            memcpy(acc + al, p, k);
            al += k;
        }
        tok_stream_free(s);
        /* When decode(prompt) is a prefix of decode(all) (the prompt does
         * not end inside a character), the stream gave exactly the rest. */
        if (lp <= la && memcmp(all, pre, lp) == 0) {
            if (al != la - lp || memcmp(acc, all + lp, al) != 0) {
                fprintf(stderr, "stream mismatch round %d: expected \"%.*s\" got \"%.*s\"\n", round,
                        (int)(la - lp), all + lp, (int)al, acc);
                fail();
            }
            checked++;
        }
        free(all);
        free(pre);
    }
    assert_true(checked > rounds / 2);
}

static void test_stream_random(void **state)
{
    (void)state;
    tokenizer *t = load_dir("tokenizers/llama2");
    stream_random(t, 7, 400);
    tok_free(t);
    t = load_dir("tokenizers/llama3");
    stream_random(t, 8, 400);
    tok_free(t);
    t = load_dir("tokenizers/qwen3");
    stream_random(t, 9, 400);
    tok_free(t);
}

/* ---- hand-made tokenizers ---- */

static tokenizer *mem_tok(const char *json)
{
    tokenizer *t = NULL;
    pg_error err = {{0}};
    int rc = tok_load_from_memory(&t, json, strlen(json), NULL, 0, "mem", &err);
    if (rc)
        fprintf(stderr, "mem tokenizer: %s\n", err.msg);
    assert_int_equal(rc, 0);
    return t;
}

static void expect_ids(tokenizer *t, const char *text, const int32_t *exp, size_t ne)
{
    int32_t *got;
    size_t ng;
    pg_error err;
    assert_int_equal(tok_encode(t, text, strlen(text), false, &got, &ng, &err), 0);
    if (!ids_eq(exp, ne, got, ng)) {
        fprintf(stderr, "text \"%s\"\n", text);
        print_ids("expected", exp, ne);
        print_ids("got     ", got, ng);
        fail();
    }
    free(got);
}

static void expect_text(tokenizer *t, const int32_t *ids, size_t n, const char *exp)
{
    char *o;
    size_t ol;
    pg_error err;
    assert_int_equal(tok_decode(t, ids, n, false, &o, &ol, &err), 0);
    assert_string_equal(o, exp);
    free(o);
}

/* Metaspace pre-tokenizer, string merges, and ByteFallback's rule for an
 * invalid run (one U+FFFD per byte, as Rust tokenizers). */
static void test_metaspace_bytefallback(void **state)
{
    (void)state;
    tokenizer *t = mem_tok(
        "{\"added_tokens\":[{\"id\":0,\"content\":\"<unk>\",\"special\":true}],"
        "\"normalizer\":null,"
        "\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"\\u2581\","
        "\"prepend_scheme\":\"first\",\"split\":true},"
        "\"post_processor\":null,"
        "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":"
        "{\"String\":\"\\u2581\"},\"content\":\" \"},{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},"
        "{\"type\":\"Strip\",\"content\":\" \",\"start\":1,\"stop\":0}]},"
        "\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"byte_fallback\":true,\"fuse_unk\":true,"
        "\"vocab\":{\"<unk>\":0,\"<0xC3>\":1,\"<0xA9>\":2,\"<0xFF>\":3,\"\\u2581\":4,\"a\":5,\"b\":6,"
        "\"\\u2581a\":7,\"ab\":8,\"\\u2581ab\":9},"
        "\"merges\":[\"a b\",\"\\u2581 ab\",\"\\u2581 a\"]}}");
    /* "ab  a": ▁ab | ▁ | ▁a (MergedWithNext on ▁) */
    expect_ids(t, "ab  a", (const int32_t[]){9, 4, 7}, 3);
    /* é is not in the vocab: bytes */
    expect_ids(t, "\xC3\xA9", (const int32_t[]){4, 1, 2}, 3);
    /* unknown chars without byte tokens: one fused <unk> */
    expect_ids(t, "ab\xE2\x82\xAC", (const int32_t[]){9, 0}, 2);
    expect_text(t, (const int32_t[]){9, 4, 7}, 3, "ab  a");
    expect_text(t, (const int32_t[]){1, 2, 5}, 3, "\xC3\xA9" "a");
    /* <0xC3><0xFF> is not UTF-8: one U+FFFD per byte */
    expect_text(t, (const int32_t[]){5, 1, 3, 5}, 4, "a\xEF\xBF\xBD\xEF\xBF\xBD" "a");
    /* an unfinished run at the end, likewise */
    expect_text(t, (const int32_t[]){5, 1}, 2, "a\xEF\xBF\xBD");
    tok_free(t);
}

/* Split behaviours and invert, ["a","b"] merges, ByteLevel decode of an
 * invalid byte sequence (maximal subparts), and an lstrip/rstrip added token. */
static void test_split_bytelevel(void **state)
{
    (void)state;
    /* the JSON around the behaviour and invert values */
    const char *part1 =
        "{\"added_tokens\":[{\"id\":5,\"content\":\"<X>\",\"special\":true,\"lstrip\":true,"
        "\"rstrip\":true,\"normalized\":false}],"
        "\"normalizer\":null,"
        "\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"String\":\"-\"},\"behavior\":\"";
    const char *part2 = "\",\"invert\":";
    const char *part3 =
        "},\"post_processor\":null,\"decoder\":null,"
        "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"-\":1,\"a-\":2,\"-a\":3,\"aa\":4},"
        "\"merges\":[[\"a\",\"-\"],[\"-\",\"a\"],[\"a\",\"a\"]]}}";
    char json[2048];
    struct {
        const char *behavior, *invert;
        int32_t ids[8];
        size_t n;
    } cases[] = {
        /* "a-a--a": pieces by behaviour */
        {"Isolated", "false", {0, 1, 0, 1, 1, 0}, 6},
        {"Removed", "false", {0, 0, 0}, 3},
        {"MergedWithPrevious", "false", {2, 2, 1, 0}, 4},
        {"MergedWithNext", "false", {0, 3, 1, 3}, 4},
        {"Contiguous", "false", {0, 1, 0, 1, 1, 0}, 6},
        {"Removed", "true", {1, 1, 1}, 3},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        snprintf(json, sizeof json, "%s%s%s%s%s", part1, cases[k].behavior, part2, cases[k].invert,
                 part3);
        tokenizer *t = mem_tok(json);
        expect_ids(t, "a-a--a", cases[k].ids, cases[k].n);
        if (k == 0) {
            /* lstrip/rstrip eat the spaces around <X>; the decoder-less join puts spaces back */
            expect_ids(t, "a <X>  a", (const int32_t[]){0, 5, 0}, 3);
            expect_text(t, (const int32_t[]){0, 5, 0}, 3, "a <X> a");
        }
        tok_free(t);
    }
    /* ByteLevel: "Ā" (byte 0x00) etc.; an invalid sequence decodes lossily */
    tokenizer *t = mem_tok(
        "{\"added_tokens\":[],\"normalizer\":null,"
        "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true},"
        "\"post_processor\":{\"type\":\"ByteLevel\"},\"decoder\":{\"type\":\"ByteLevel\"},"
        "\"model\":{\"type\":\"BPE\",\"ignore_merges\":true,\"vocab\":{\"\\u00c3\":0,\"\\u00a9\":1,"
        "\"\\u0120\":2,\"h\":3,\"i\":4,\"\\u0120hi\":5,\"\\u00f0\":6,\"\\u00ff\":7},"
        "\"merges\":[]}}");
    expect_ids(t, " hi", (const int32_t[]){5}, 1); /* ignore_merges: whole word in vocab */
    expect_ids(t, "\xC3\xA9 h", (const int32_t[]){0, 1, 2, 3}, 4);
    /* F0 then 'h': one U+FFFD for the unfinished F0, then "h" */
    expect_text(t, (const int32_t[]){6, 3}, 2, "\xEF\xBF\xBDh");
    /* 0xFF (its char is U+00FF) never starts a sequence: U+FFFD */
    expect_text(t, (const int32_t[]){7, 3}, 2, "\xEF\xBF\xBDh");
    tok_free(t);
}

/* A byte-level tokenizer without merges: every byte of the normalized,
 * pre-tokenized text is its own id (the byte's value), so encode shows
 * exactly what the normalizer and the pre-tokenizer made of a text. pre is
 * a pre-tokenizer run before ByteLevel (or NULL); <X> (id 256) is an added
 * token matched in the raw text. */
static tokenizer *byte_tok(const char *normalizer, const char *pre)
{
    size_t cap = 16384;
    char *json = malloc(cap);
    assert_non_null(json);
    int w = snprintf(json, cap,
                     "{\"added_tokens\":[{\"id\":256,\"content\":\"<X>\",\"special\":true,"
                     "\"normalized\":false}],\"normalizer\":%s,\"pre_tokenizer\":{\"type\":"
                     "\"Sequence\",\"pretokenizers\":[%s%s{\"type\":\"ByteLevel\","
                     "\"add_prefix_space\":false,\"use_regex\":false}]},\"post_processor\":null,"
                     "\"decoder\":{\"type\":\"ByteLevel\"},\"model\":{\"type\":\"BPE\",\"vocab\":{",
                     normalizer, pre ? pre : "", pre ? "," : "");
    for (unsigned b = 0; b < 256; b++) {
        /* GPT-2 bytes_to_unicode */
        unsigned cp = b <= 32 ? 256 + b : (b >= 127 && b <= 160) ? 256 + 33 + (b - 127)
                    : b == 173 ? 256 + 67 : b;
        w += snprintf(json + w, cap - (size_t)w, "%s\"\\u%04x\":%u", b ? "," : "", cp, b);
    }
    snprintf(json + w, cap - (size_t)w, "},\"merges\":[]}}");
    tokenizer *t = mem_tok(json);
    free(json);
    return t;
}

/* encode(in) gives the bytes of out as ids (256: <X>, written "<X>" in out) */
static void expect_bytes(tokenizer *t, const char *in, size_t in_len, const char *out, size_t out_len)
{
    int32_t exp[256];
    size_t ne = 0;
    for (size_t i = 0; i < out_len; i++) {
        if (i + 3 <= out_len && memcmp(out + i, "<X>", 3) == 0) {
            exp[ne++] = 256;
            i += 2;
        } else {
            exp[ne++] = (unsigned char)out[i];
        }
    }
    int32_t *got;
    size_t ng;
    pg_error err;
    assert_int_equal(tok_encode(t, in, in_len, false, &got, &ng, &err), 0);
    if (!ids_eq(exp, ne, got, ng)) {
        fprintf(stderr, "text \"%.*s\"\n", (int)in_len, in);
        print_ids("expected", exp, ne);
        print_ids("got     ", got, ng);
        fail();
    }
    free(got);
}
#define EXPECT_BYTES(t, in, out) expect_bytes(t, in, sizeof in - 1, out, sizeof out - 1)

/* The Unicode normalizers (utf8proc): composition, canonical reordering,
 * Hangul, composition exclusions and singletons, U+0000 inside a text,
 * one normalization per piece between added tokens, NFD/NFKC/NFKD. */
static void test_unicode_normalizers(void **state)
{
    (void)state;
    tokenizer *t = byte_tok("{\"type\":\"NFC\"}", NULL);
    EXPECT_BYTES(t, "plain ascii", "plain ascii");                 /* the fast path */
    EXPECT_BYTES(t, "caf\x65\xCC\x81", "caf\xC3\xA9");            /* e + U+0301 -> U+00E9 */
    EXPECT_BYTES(t, "\xC3\xA9\xC3\xB1", "\xC3\xA9\xC3\xB1");       /* already NFC */
    EXPECT_BYTES(t, "\xE2\x84\xAB", "\xC3\x85");                  /* U+212B ANGSTROM SIGN -> U+00C5 */
    /* a + U+0307 (ccc 230) + U+0323 (ccc 220): reordered, then a + U+0323 = U+1EA1 */
    EXPECT_BYTES(t, "a\xCC\x87\xCC\xA3", "\xE1\xBA\xA1\xCC\x87");
    /* Hangul jamo L V T -> U+AC01 */
    EXPECT_BYTES(t, "\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8", "\xEA\xB0\x81");
    /* U+0958 is a composition exclusion: decomposed, never recomposed */
    EXPECT_BYTES(t, "\xE0\xA5\x98", "\xE0\xA4\x95\xE0\xA4\xBC");
    EXPECT_BYTES(t, "\xE0\xA4\x95\xE0\xA4\xBC", "\xE0\xA4\x95\xE0\xA4\xBC");
    /* U+0000 is text, not an end */
    EXPECT_BYTES(t, "a\0e\xCC\x81", "a\0\xC3\xA9");
    /* pieces between added tokens are normalized one by one (HF splits
     * non-normalized added tokens out of the raw text first) */
    EXPECT_BYTES(t, "e<X>\xCC\x81", "e<X>\xCC\x81");
    /* a mark alone, and a mark before a Latin-1 letter (no fast path) */
    EXPECT_BYTES(t, "\xCC\x81\xC3\xA9", "\xCC\x81\xC3\xA9");
    tok_free(t);

    t = byte_tok("{\"type\":\"NFD\"}", NULL);
    EXPECT_BYTES(t, "\xC3\xA9", "e\xCC\x81");
    EXPECT_BYTES(t, "\xEF\xAC\x81", "\xEF\xAC\x81"); /* U+FB01 fi: no canonical decomposition */
    tok_free(t);
    t = byte_tok("{\"type\":\"NFKC\"}", NULL);
    EXPECT_BYTES(t, "\xEF\xAC\x81 \xC2\xA0x\xC2\xB2", "fi  x2"); /* fi ligature, NBSP, superscript 2 */
    EXPECT_BYTES(t, "e\xCC\x81", "\xC3\xA9");
    tok_free(t);
    t = byte_tok("{\"type\":\"NFKD\"}", NULL);
    EXPECT_BYTES(t, "\xE2\x84\xAB\xEF\xAC\x81", "A\xCC\x8A" "fi");
    tok_free(t);
    /* in a Sequence, after a Replace */
    t = byte_tok("{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Replace\",\"pattern\":"
                 "{\"String\":\"E\"},\"content\":\"e\"},{\"type\":\"NFC\"}]}",
                 NULL);
    EXPECT_BYTES(t, "E\xCC\x81", "\xC3\xA9");
    tok_free(t);
    /* the other normalizers are still refused by name */
    tokenizer *bad = NULL;
    pg_error err = {{0}};
    static const char lower[] = "{\"normalizer\":{\"type\":\"Lowercase\"},\"model\":{\"type\":\"BPE\","
                                "\"vocab\":{\"a\":0},\"merges\":[]}}";
    assert_int_equal(tok_load_from_memory(&bad, lower, sizeof lower - 1, NULL, 0, "m", &err),
                     PG_EUNSUPPORTED);
    assert_non_null(strstr(err.msg, "normalizer type 'Lowercase' is not supported"));
}

/* tok_normalize skips utf8proc for NFC when every byte is below 0xCC (code
 * points below U+0300). Checked here on utf8proc's own data: no such code
 * point has a combining class or changes under NFC, and none is a
 * non-first part of any character's canonical decomposition (so none can
 * compose with what precedes it). */
static void test_nfc_fast_path_claim(void **state)
{
    (void)state;
    for (utf8proc_int32_t cp = 0; cp < 0x300; cp++) {
        assert_int_equal(utf8proc_get_property(cp)->combining_class, 0);
        utf8proc_uint8_t in[4], *out = NULL;
        utf8proc_ssize_t n = utf8proc_encode_char(cp, in);
        utf8proc_ssize_t r = utf8proc_map(in, n, &out, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        assert_true(r == n && memcmp(in, out, (size_t)n) == 0);
        free(out);
    }
    int decomposing = 0;
    for (utf8proc_int32_t cp = 0; cp < 0x110000; cp++) {
        if (cp >= 0xD800 && cp < 0xE000)
            continue;
        utf8proc_int32_t buf[32];
        int last = 0;
        utf8proc_ssize_t r = utf8proc_decompose_char(cp, buf, 32, UTF8PROC_DECOMPOSE, &last);
        assert_true(r >= 1 && r <= 32);
        for (utf8proc_ssize_t k = 1; k < r; k++)
            assert_true(buf[k] >= 0x300);
        decomposing += r > 1;
    }
    assert_true(decomposing > 10000); /* the decompositions (Hangul included) were there */
}

/* \s and \S mean Unicode White_Space, as in Oniguruma (HF's regex engine):
 * U+180E MONGOLIAN VOWEL SEPARATOR is not a space (PCRE2's own \s says it
 * is), U+0085 NEXT LINE is. */
static void test_regex_whitespace(void **state)
{
    (void)state;
    tokenizer *t = byte_tok("null", "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\s+\"},"
                                    "\"behavior\":\"Removed\",\"invert\":false}");
    EXPECT_BYTES(t, "a\xE1\xA0\x8E" "b\xC2\x85" "c\xE3\x80\x80" "d\t e", "a\xE1\xA0\x8E" "bcde");
    tok_free(t);
    t = byte_tok("null", "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"[^\\\\S\\\\n]+\"},"
                         "\"behavior\":\"Removed\",\"invert\":false}");
    EXPECT_BYTES(t, "a\xE1\xA0\x8E\n \xC2\x85" "b", "a\xE1\xA0\x8E\nb");
    tok_free(t);
    /* a quoted \s is a literal backslash and s */
    t = byte_tok("null", "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\Q\\\\s\\\\E\"},"
                         "\"behavior\":\"Removed\",\"invert\":false}");
    EXPECT_BYTES(t, "a\\sb c", "ab c");
    tok_free(t);
}

static void test_errors(void **state)
{
    (void)state;
    tokenizer *t = load_dir("models/stories260K");
    int32_t *ids;
    size_t n;
    pg_error err = {{0}};
    /* invalid UTF-8 is an error, never a crash */
    assert_int_equal(tok_encode(t, "a\xC3", 2, false, &ids, &n, &err), PG_EINVAL);
    assert_non_null(strstr(err.msg, "offset 1"));
    assert_int_equal(tok_encode(t, "\xED\xA0\x80", 3, false, &ids, &n, &err), PG_EINVAL);
    /* the empty text: BOS only / nothing */
    assert_int_equal(tok_encode(t, "", 0, true, &ids, &n, &err), 0);
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], 1);
    free(ids);
    assert_int_equal(tok_encode(t, "", 0, false, &ids, &n, &err), 0);
    assert_int_equal(n, 0);
    free(ids);
    assert_null(tok_piece(t, 512));
    assert_string_equal(tok_piece(t, 1), "<s>");
    tok_free(t);
    /* malformed files are refused with a message */
    tokenizer *bad = NULL;
    assert_int_not_equal(tok_load_from_memory(&bad, "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},"
                                                    "\"merges\":[\"a b\"]}}", 57, NULL, 0, "bad", &err), 0);
    assert_null(bad);
    assert_non_null(strstr(err.msg, "merges[0]"));
    assert_int_not_equal(tok_load_from_memory(&bad, "{\"model\":{\"type\":\"Unigram\"}}", 28, NULL, 0,
                                              "bad", &err), 0);
    assert_int_not_equal(tok_load(&bad, "/nonexistent", &err), 0);
}

/* Sequence nodes nest at most TOK_MAX_SEQ_DEPTH (4) deep below the top one,
 * in every stage: deeper is refused with a message, never a stack overflow
 * (the post_processor had no limit: nested 40000 deep it crashed the
 * loader). */
static void test_sequence_nesting(void **state)
{
    (void)state;
    static const struct {
        const char *stage, *key;
    } stages[] = {
        {"normalizer", "normalizers"},
        {"pre_tokenizer", "pretokenizers"},
        {"decoder", "decoders"},
        {"post_processor", "processors"},
    };
    static const int depths[] = {1, 5, 6, 400};
    for (size_t s = 0; s < sizeof stages / sizeof stages[0]; s++) {
        for (size_t k = 0; k < sizeof depths / sizeof depths[0]; k++) {
            /* {"<stage>": {"type":"Sequence","<key>":[ ... ]} x n, an empty innermost one */
            int n = depths[k];
            char open[64];
            int ol = snprintf(open, sizeof open, "{\"type\":\"Sequence\",\"%s\":[", stages[s].key);
            char head[64], tail[] = ",\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}";
            int hl = snprintf(head, sizeof head, "{\"%s\":", stages[s].stage);
            size_t len = (size_t)hl + (size_t)n * ((size_t)ol + 2) + strlen(tail);
            char *json = malloc(len + 1), *w = json;
            assert_non_null(json);
            memcpy(w, head, (size_t)hl);
            w += hl;
            for (int i = 0; i < n; i++, w += ol)
                memcpy(w, open, (size_t)ol);
            for (int i = 0; i < n; i++, w += 2)
                memcpy(w, "]}", 2);
            memcpy(w, tail, strlen(tail) + 1);
            assert_int_equal(strlen(json), len);
            tokenizer *t = NULL;
            pg_error err = {{0}};
            int rc = tok_load_from_memory(&t, json, len, NULL, 0, "nest", &err);
            if (n <= 5) {
                if (rc)
                    fprintf(stderr, "%s nested %d deep: %s\n", stages[s].stage, n, err.msg);
                assert_int_equal(rc, 0);
                tok_free(t);
            } else {
                assert_int_equal(rc, PG_EFORMAT);
                assert_null(t);
                char want[96];
                snprintf(want, sizeof want, "nest: %s Sequence: nested more than 4 deep",
                         stages[s].stage);
                assert_string_equal(err.msg, want);
            }
            free(json);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_sequence_nesting),
        cmocka_unit_test(test_metaspace_bytefallback),
        cmocka_unit_test(test_split_bytelevel),
        cmocka_unit_test(test_unicode_normalizers),
        cmocka_unit_test(test_nfc_fast_path_claim),
        cmocka_unit_test(test_regex_whitespace),
        cmocka_unit_test(test_stories260k),
        cmocka_unit_test(test_llama2),
        cmocka_unit_test(test_codellama),
        cmocka_unit_test(test_mistral),
        cmocka_unit_test(test_llama3),
        cmocka_unit_test(test_qwen3),
        cmocka_unit_test(test_stream_random),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
