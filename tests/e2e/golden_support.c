/* golden_support: stories260K model + goldens for the end to end tests (see
 * golden_support.h). */
#include "golden_support.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "json.h"
#include "test_support.h"

/* ---- reading the goldens -------------------------------------------------- */

static void get_ids(const json_doc *d, const char *key, int32_t **out, int32_t *n)
{
    pg_error err;
    int a = json_obj_get(d, 0, key);
    assert_true(a >= 0 && json_is_array(d, a));
    *n = json_size(d, a);
    *out = malloc(((size_t)*n + 1) * sizeof **out);
    assert_non_null(*out);
    int i = a + 1;
    for (int k = 0; k < *n; k++, i = json_skip(d, i)) {
        int64_t v;
        assert_int_equal(json_get_int(d, i, 0, INT32_MAX, &v, &err), 0);
        (*out)[k] = (int32_t)v;
    }
}

static int64_t get_int(const json_doc *d, const char *key)
{
    pg_error err;
    int64_t v;
    int i = json_obj_get(d, 0, key);
    assert_true(i >= 0);
    assert_int_equal(json_get_int(d, i, INT64_MIN, INT64_MAX, &v, &err), 0);
    return v;
}

static char *get_str(const json_doc *d, const char *key, size_t *len)
{
    pg_error err;
    char *s = NULL;
    int i = json_obj_get(d, 0, key);
    assert_true(i >= 0);
    assert_int_equal(json_get_string(d, i, &s, len, &err), 0);
    return s;
}

static void add_greedy(pg_golden_set *s, const json_doc *d)
{
    assert_true(s->n_g < PG_GOLDEN_MAX);
    pg_golden *g = &s->g[s->n_g++];
    g->prompt = get_str(d, "prompt", &g->prompt_len);
    get_ids(d, "prompt_token_ids", &g->prompt_ids, &g->n_prompt);
    get_ids(d, "completion_token_ids", &g->completion_ids, &g->n_completion);
    g->completion_text = get_str(d, "completion_text", &g->completion_text_len);
    g->max_new_tokens = (int32_t)get_int(d, "max_new_tokens");
    size_t fl;
    char *fr = get_str(d, "finish_reason", &fl);
    g->stop = strcmp(fr, "stop") == 0;
    assert_true(g->stop || strcmp(fr, "length") == 0);
    free(fr);
    int st = json_obj_get(d, 0, "stop_token_id");
    g->stop_token_id = json_is_null(d, st) ? -1 : (int32_t)get_int(d, "stop_token_id");
}

static void add_logits(pg_golden_set *s, const json_doc *d)
{
    assert_true(s->n_lg < PG_GOLDEN_MAX);
    pg_logits_golden *g = &s->lg[s->n_lg++];
    get_ids(d, "prompt_token_ids", &g->prompt_ids, &g->n_prompt);
    g->argmax = (int32_t)get_int(d, "argmax");
    int a = json_obj_get(d, 0, "logits");
    assert_true(a >= 0 && json_is_array(d, a));
    g->n_logits = json_size(d, a);
    g->logits = malloc((size_t)g->n_logits * sizeof(float));
    assert_non_null(g->logits);
    int i = a + 1;
    for (int k = 0; k < g->n_logits; k++, i = json_skip(d, i)) {
        double v;
        pg_error err;
        assert_int_equal(json_get_double(d, i, &v, &err), 0);
        g->logits[k] = (float)v;
    }
}

/* Calls fn(s, doc) for every non-empty line of a JSONL file under the shared
 * folder. */
static void for_each_line(pg_golden_set *s, const char *rel,
                          void (*fn)(pg_golden_set *, const json_doc *))
{
    size_t len;
    char *text = pg_test_read_file(pg_test_shared_path(rel), &len);
    assert_non_null(text);
    char *line = text;
    while (line < text + len) {
        char *nl = memchr(line, '\n', (size_t)(text + len - line));
        size_t ll = nl ? (size_t)(nl - line) : (size_t)(text + len - line);
        if (ll > 0) {
            json_doc d;
            pg_error err;
            assert_int_equal(json_parse(&d, line, ll, rel, &err), 0);
            fn(s, &d);
            json_doc_free(&d);
        }
        line += ll + 1;
    }
    free(text);
}

int pg_golden_set_load(pg_golden_set *s)
{
    memset(s, 0, sizeof *s);
    pg_error err;
    snprintf(s->model_dir, sizeof s->model_dir, "%s", pg_test_shared_path("models/stories260K"));
    if (llama_config_load(&s->cfg, s->model_dir, &err) || st_open(&s->st, s->model_dir, &err)) {
        fprintf(stderr, "loading %s: %s\n", s->model_dir, err.msg);
        return -1;
    }
    for_each_line(s, "goldens/stories260K-greedy.jsonl", add_greedy);
    for_each_line(s, "goldens/stories260K-logits.jsonl", add_logits);
    assert_true(s->n_g >= 8 && s->n_lg >= 4);
    return 0;
}

void pg_golden_set_free(pg_golden_set *s)
{
    for (int i = 0; i < s->n_g; i++) {
        free(s->g[i].prompt);
        free(s->g[i].prompt_ids);
        free(s->g[i].completion_ids);
        free(s->g[i].completion_text);
    }
    for (int i = 0; i < s->n_lg; i++) {
        free(s->lg[i].prompt_ids);
        free(s->lg[i].logits);
    }
    st_close(s->st);
    memset(s, 0, sizeof *s);
}

/* ---- driving a model ------------------------------------------------------ */

void pg_golden_run_prompt(model *m, const int32_t *ids, int32_t n, int32_t chunk, int32_t bs,
                          float *logits)
{
    int32_t *pos = malloc((size_t)n * sizeof *pos), *slots = malloc((size_t)n * sizeof *slots);
    int32_t *bt = malloc(((size_t)n / (size_t)bs + 1) * sizeof *bt);
    assert_true(pos && slots && bt);
    for (int32_t i = 0; i < n; i++)
        pos[i] = slots[i] = i;
    for (int32_t i = 0; i <= n / bs; i++)
        bt[i] = i;
    for (int32_t start = 0; start < n; start += chunk) {
        int32_t q = n - start < chunk ? n - start : chunk;
        int32_t qs[2] = {0, q}, len = start + q, row = q - 1;
        step_batch b = {.num_tokens = q, .num_seqs = 1, .block_size = bs,
                        .token_ids = ids + start, .positions = pos + start,
                        .slots = slots + start, .query_start = qs, .seq_lens = &len,
                        .block_tables = bt, .block_table_stride = n / bs + 1,
                        .max_seq_len = len, .max_query_len = q, .num_logits = 1,
                        .logits_rows = &row};
        pg_error err;
        int rc = model_forward(m, &b, logits, &err);
        if (rc)
            fail_msg("model_forward (tokens %d..%d of %d): %s", (int)start, (int)(start + q - 1),
                     (int)n, err.msg);
    }
    free(pos);
    free(slots);
    free(bt);
}

model_params pg_golden_model_params(const pg_golden_pool *p)
{
    model_params mp = {.num_kv_blocks = p->num_blocks, .block_size = p->block_size,
                       .max_num_batched_tokens = p->max_num_batched_tokens,
                       .max_num_seqs = p->max_num_seqs};
    return mp;
}

engine_params pg_golden_engine_params(const pg_golden_set *s, const pg_golden_pool *p)
{
    engine_params ep = engine_params_default();
    ep.block_size = p->block_size;
    ep.num_blocks = p->num_blocks;
    ep.max_num_seqs = p->max_num_seqs;
    ep.max_num_batched_tokens = p->max_num_batched_tokens;
    ep.max_model_len = s->cfg.max_position_embeddings;
    ep.prefix_caching = p->prefix_caching;
    ep.check_invariants = true;
    ep.eos_token_ids = s->cfg.eos_token_ids;
    ep.n_eos_token_ids = s->cfg.n_eos_token_ids;
    return ep;
}
