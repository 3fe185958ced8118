/* tokenizer_bench: load time and encode/decode speed of the five reference
 * tokenizers (../shared/tokenizers/{llama2,codellama-7b,mistral-7b,llama3,
 * qwen3}; qwen3 is llama3's shape — Split regex + ByteLevel — plus an NFC
 * normalizer run by utf8proc on every piece).
 *
 * Corpus: the 363 texts of goldens/tokenize-llama2.jsonl (prose, code,
 * numbers, whitespace runs, many scripts, emoji, special-token spellings)
 * repeated to about 4 MB. Two encode shapes:
 *   - "doc": the corpus as one text (one call; for the SentencePiece
 *     flavour, which has no pre-tokenizer, long stretches are single BPE
 *     words, so this also exercises the heap merge on long words),
 *   - "prompts": every text its own call (prompt-like sizes).
 * The ceiling printed beside is memcpy bandwidth on the same buffer. All
 * times are process CPU time (one thread). The last row, qwen3-no-NFC, is
 * qwen3 with its normalizer removed: the difference is NFC's cost.
 *
 *   build/bench/tokenizer_bench [shared_dir]   (meson: `meson test --benchmark tokenizer`)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "json.h"
#include "tokenizer.h"

/* CPU time of this (single-threaded) process: steadier than wall time on a
 * shared machine. */
static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (!b || fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        fclose(f);
        return NULL;
    }
    fclose(f);
    b[n] = '\0';
    *len = (size_t)n;
    return b;
}

typedef struct corpus {
    char *all;       /* every text, repeated, joined with "\n" */
    size_t all_len;
    size_t *off, *len; /* the single texts inside `all` (one repetition) */
    size_t n;
} corpus;

static int build_corpus(const char *shared, corpus *c)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/goldens/tokenize-llama2.jsonl", shared);
    size_t flen;
    char *buf = read_all(path, &flen);
    if (!buf) {
        fprintf(stderr, "tokenizer_bench: cannot read %s\n", path);
        return -1;
    }
    size_t cap = 1 << 16, used = 0;
    char *one = malloc(cap);
    c->off = malloc(1024 * sizeof *c->off);
    c->len = malloc(1024 * sizeof *c->len);
    c->n = 0;
    for (char *line = buf; line < buf + flen && c->n < 1024;) {
        char *nl = memchr(line, '\n', (size_t)(buf + flen - line));
        size_t ll = nl ? (size_t)(nl - line) : (size_t)(buf + flen - line);
        json_doc d;
        if (ll && json_parse(&d, line, ll, "golden", NULL) == 0) {
            char *s;
            size_t sl;
            if (json_get_string(&d, json_obj_get(&d, 0, "text"), &s, &sl, NULL) == 0 && sl > 0) {
                while (used + sl + 1 > cap)
                    one = realloc(one, cap *= 2);
                c->off[c->n] = used;
                c->len[c->n++] = sl;
                memcpy(one + used, s, sl);
                used += sl;
                one[used++] = '\n';
                free(s);
            }
            json_doc_free(&d);
        }
        line += ll + 1;
    }
    free(buf);
    size_t reps = (4u << 20) / used + 1;
    c->all = malloc(reps * used + 1);
    for (size_t r = 0; r < reps; r++)
        memcpy(c->all + r * used, one, used);
    c->all_len = reps * used;
    free(one);
    return 0;
}

/* Encodes the corpus as one document and as prompts, decodes it, prints
 * one row. */
static int run_row(const char *name, tokenizer *t, double load_ms, const corpus *c)
{
    int32_t *ids;
    size_t n_ids;
    pg_error err;
    /* warm-up, then the document */
    tok_encode(t, c->all, c->all_len / 16, false, &ids, &n_ids, &err);
    free(ids);
    double t0 = now_s();
    if (tok_encode(t, c->all, c->all_len, false, &ids, &n_ids, &err)) {
        fprintf(stderr, "tokenizer_bench: %s: %s\n", name, err.msg);
        return 1;
    }
    double doc_s = now_s() - t0;
    /* decode the document's ids */
    char *text;
    size_t tl;
    t0 = now_s();
    tok_decode(t, ids, n_ids, false, &text, &tl, &err);
    double dec_s = now_s() - t0;
    free(text);
    free(ids);
    /* prompts: each text on its own, the whole set several times */
    size_t bytes = 0;
    t0 = now_s();
    for (int r = 0; r < 8; r++)
        for (size_t i = 0; i < c->n; i++) {
            tok_encode(t, c->all + c->off[i], c->len[i], true, &ids, &n_ids, &err);
            free(ids);
            bytes += c->len[i];
        }
    double pr_s = now_s() - t0;
    tok_encode(t, c->all, c->all_len, false, &ids, &n_ids, &err);
    printf("%-14s %9.1f %10.2f %12.3f %14.2f %12.1f\n", name, load_ms,
           (double)c->all_len / doc_s / 1e6, (double)n_ids / (double)c->all_len,
           (double)bytes / pr_s / 1e6, (double)tl / dec_s / 1e6);
    free(ids);
    return 0;
}

/* qwen3's tokenizer.json with its normalizer object replaced by null: the
 * same tokenizer without NFC, to show what the normalizer costs. */
static tokenizer *load_without_normalizer(const char *dir, double *load_ms)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    size_t len;
    char *json = read_all(path, &len);
    char *key = json ? strstr(json, "\"normalizer\":") : NULL;
    char *open = key ? strchr(key, '{') : NULL;
    char *close = open ? strchr(open, '}') : NULL; /* {"type": "NFC"}: nothing nested */
    if (!close) {
        free(json);
        return NULL;
    }
    memcpy(open, "null", 4);
    memmove(open + 4, close + 1, len - (size_t)(close + 1 - json) + 1);
    len -= (size_t)(close + 1 - open) - 4;
    tokenizer *t = NULL;
    pg_error err;
    double t0 = now_s();
    if (tok_load_from_memory(&t, json, len, NULL, 0, path, &err))
        fprintf(stderr, "tokenizer_bench: %s\n", err.msg);
    *load_ms = (now_s() - t0) * 1e3;
    free(json);
    return t;
}

int main(int argc, char **argv)
{
    const char *shared = argc > 1 ? argv[1] : getenv("PAGEDGEN_SHARED");
    if (!shared)
        shared = "../shared";
    corpus c;
    if (build_corpus(shared, &c))
        return 1;
    char *copy = malloc(c.all_len);
    memcpy(copy, c.all, c.all_len); /* fault the pages in first */
    double t0 = now_s();
    for (int r = 0; r < 10; r++)
        memcpy(copy, c.all, c.all_len);
    double memcpy_gbs = 10.0 * (double)c.all_len / (now_s() - t0) / 1e9;
    printf("corpus: %zu texts, %.2f MB as one document; memcpy %.1f GB/s (ceiling)\n", c.n,
           (double)c.all_len / 1e6, memcpy_gbs);
    printf("%-14s %9s %10s %12s %14s %12s\n", "tokenizer", "load_ms", "doc_MB/s", "tokens/byte",
           "prompts_MB/s", "decode_MB/s");
    static const char *const names[] = {"llama2", "codellama-7b", "mistral-7b", "llama3", "qwen3"};
    int rc = 0;
    char dir[4096];
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        snprintf(dir, sizeof dir, "%s/tokenizers/%s", shared, names[k]);
        tokenizer *t;
        pg_error err;
        t0 = now_s();
        if (tok_load(&t, dir, &err)) {
            fprintf(stderr, "tokenizer_bench: %s\n", err.msg);
            rc = 1;
            continue;
        }
        rc |= run_row(names[k], t, (now_s() - t0) * 1e3, &c);
        tok_free(t);
    }
    double load_ms;
    tokenizer *t = load_without_normalizer(dir, &load_ms); /* dir: qwen3's */
    if (t)
        rc |= run_row("qwen3-no-NFC", t, load_ms, &c);
    else
        rc = 1;
    tok_free(t);
    free(copy);
    free(c.all);
    free(c.off);
    free(c.len);
    return rc;
}
