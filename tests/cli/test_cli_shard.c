/* tests/cli/test_cli_shard: --shard auto over every scheduler's variables
 * (a table stands in for the environment), shard output names, the
 * canonical flags, markers written and read back, and the sort of a
 * resumed shard back into input order. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "options.h"
#include "shard.h"
#include "test_support.h"

/* NULL-terminated {name, value, name, value, ..., NULL} */
static const char *table_env(void *ctx, const char *name)
{
    const char *const *t = ctx;
    for (; t[0]; t += 2)
        if (strcmp(t[0], name) == 0)
            return t[1];
    return NULL;
}

/* K/N from env with auto/n_given; returns the status, err in *msg. */
static int resolve(const char *const *env, int32_t n_given, int32_t *k, int32_t *n, char *msg)
{
    char src[160];
    pg_error err = {{0}};
    *k = *n = -1;
    int rc = cli_shard_from_env(table_env, (void *)env, n_given, k, n, src, sizeof src, &err);
    strcpy(msg, err.msg);
    return rc;
}

static void test_slurm(void **state)
{
    (void)state;
    int32_t k, n;
    char msg[1024];
    /* --array=0-3, task 2 */
    const char *a[] = {"SLURM_ARRAY_TASK_ID", "2", "SLURM_ARRAY_TASK_MIN", "0", "SLURM_ARRAY_TASK_MAX", "3",
                       "SLURM_ARRAY_TASK_COUNT", "4", "SLURM_ARRAY_TASK_STEP", "1", NULL};
    assert_int_equal(resolve(a, 0, &k, &n, msg), PG_OK);
    assert_int_equal(k, 2);
    assert_int_equal(n, 4);
    assert_int_equal(resolve(a, 4, &k, &n, msg), PG_OK); /* auto/4 agrees */
    assert_int_equal(k, 2);
    assert_int_equal(resolve(a, 5, &k, &n, msg), PG_EINVAL); /* auto/5 does not */
    assert_non_null(strstr(msg, "SLURM_ARRAY_TASK_COUNT"));
    /* --array=1-4, task 1 is shard 0, task 4 shard 3 */
    const char *b[] = {"SLURM_ARRAY_TASK_ID", "1", "SLURM_ARRAY_TASK_MIN", "1", "SLURM_ARRAY_TASK_MAX", "4",
                       "SLURM_ARRAY_TASK_COUNT", "4", NULL};
    assert_int_equal(resolve(b, 0, &k, &n, msg), PG_OK);
    assert_int_equal(k, 0);
    assert_int_equal(n, 4);
    const char *b4[] = {"SLURM_ARRAY_TASK_ID", "4", "SLURM_ARRAY_TASK_MIN", "1", "SLURM_ARRAY_TASK_MAX", "4",
                        "SLURM_ARRAY_TASK_COUNT", "4", NULL};
    assert_int_equal(resolve(b4, 0, &k, &n, msg), PG_OK);
    assert_int_equal(k, 3);
    /* --array=1-7:2 (1, 3, 5, 7): task 5 is shard 2 of 4 */
    const char *c[] = {"SLURM_ARRAY_TASK_ID", "5", "SLURM_ARRAY_TASK_MIN", "1", "SLURM_ARRAY_TASK_MAX", "7",
                       "SLURM_ARRAY_TASK_STEP", "2", "SLURM_ARRAY_TASK_COUNT", "4", NULL};
    assert_int_equal(resolve(c, 0, &k, &n, msg), PG_OK);
    assert_int_equal(k, 2);
    assert_int_equal(n, 4);
    /* an index off the step */
    const char *d[] = {"SLURM_ARRAY_TASK_ID", "4", "SLURM_ARRAY_TASK_MIN", "1", "SLURM_ARRAY_TASK_MAX", "7",
                       "SLURM_ARRAY_TASK_STEP", "2", "SLURM_ARRAY_TASK_COUNT", "4", NULL};
    assert_int_equal(resolve(d, 0, &k, &n, msg), PG_EINVAL);
    assert_non_null(strstr(msg, "SLURM_ARRAY_TASK_STEP"));
    /* --array=1,3,7: SLURM 22.05.8 sets MIN 1, MAX 7, STEP 1, COUNT 3 (as the
     * other arrays here: observed on tests/slurm's cluster); 1 + 2 x 1 != 7 */
    const char *e[] = {"SLURM_ARRAY_TASK_ID", "3", "SLURM_ARRAY_TASK_MIN", "1", "SLURM_ARRAY_TASK_MAX", "7",
                       "SLURM_ARRAY_TASK_STEP", "1", "SLURM_ARRAY_TASK_COUNT", "3", NULL};
    assert_int_equal(resolve(e, 0, &k, &n, msg), PG_EINVAL);
    assert_non_null(strstr(msg, "evenly stepped"));
    /* no count: auto/N gives it; plain auto is refused, naming the variable */
    const char *f[] = {"SLURM_ARRAY_TASK_ID", "3", "SLURM_ARRAY_TASK_MIN", "0", NULL};
    assert_int_equal(resolve(f, 8, &k, &n, msg), PG_OK);
    assert_int_equal(k, 3);
    assert_int_equal(n, 8);
    assert_int_equal(resolve(f, 0, &k, &n, msg), PG_EINVAL);
    assert_non_null(strstr(msg, "SLURM_ARRAY_TASK_COUNT"));
    assert_int_equal(resolve(f, 3, &k, &n, msg), PG_EINVAL); /* shard 3 of 3 does not exist */
    /* ID without MIN, and a value that is not a number */
    const char *g[] = {"SLURM_ARRAY_TASK_ID", "3", "SLURM_ARRAY_TASK_COUNT", "4", NULL};
    assert_int_equal(resolve(g, 0, &k, &n, msg), PG_EINVAL);
    assert_non_null(strstr(msg, "SLURM_ARRAY_TASK_MIN"));
    const char *h[] = {"SLURM_ARRAY_TASK_ID", "3x", "SLURM_ARRAY_TASK_MIN", "0", NULL};
    assert_int_equal(resolve(h, 4, &k, &n, msg), PG_EINVAL);
    assert_non_null(strstr(msg, "SLURM_ARRAY_TASK_ID='3x'"));
    assert_int_equal(k, -1); /* nothing changed on error */
}

static void test_kubernetes(void **state)
{
    (void)state;
    int32_t k, n;
    char msg[1024];
    const char *a[] = {"JOB_COMPLETION_INDEX", "5", NULL};
    assert_int_equal(resolve(a, 8, &k, &n, msg), PG_OK);
    assert_int_equal(k, 5);
    assert_int_equal(n, 8);
    assert_int_equal(resolve(a, 0, &k, &n, msg), PG_EINVAL); /* no count in a pod */
    assert_non_null(strstr(msg, "auto/N"));
    assert_non_null(strstr(msg, "JOB_COMPLETION_INDEX"));
    assert_int_equal(resolve(a, 5, &k, &n, msg), PG_EINVAL); /* index 5 of 5 */
    const char *b[] = {"JOB_COMPLETION_INDEX", "-1", NULL};
    assert_int_equal(resolve(b, 5, &k, &n, msg), PG_EINVAL);
}

static void test_aws(void **state)
{
    (void)state;
    int32_t k, n;
    char msg[1024];
    const char *a[] = {"AWS_BATCH_JOB_ARRAY_INDEX", "0", "AWS_BATCH_JOB_ARRAY_SIZE", "10", NULL};
    assert_int_equal(resolve(a, 0, &k, &n, msg), PG_OK);
    assert_int_equal(k, 0);
    assert_int_equal(n, 10);
    assert_int_equal(resolve(a, 10, &k, &n, msg), PG_OK);
    assert_int_equal(resolve(a, 9, &k, &n, msg), PG_EINVAL);
    assert_non_null(strstr(msg, "AWS_BATCH_JOB_ARRAY_SIZE"));
    const char *b[] = {"AWS_BATCH_JOB_ARRAY_INDEX", "3", NULL};
    assert_int_equal(resolve(b, 0, &k, &n, msg), PG_EINVAL);
    assert_int_equal(resolve(b, 4, &k, &n, msg), PG_OK);
    assert_int_equal(k, 3);
    assert_int_equal(n, 4);
}

static void test_none_and_precedence(void **state)
{
    (void)state;
    int32_t k, n;
    char msg[1024];
    const char *none[] = {"SLURM_JOB_ID", "12", NULL};
    assert_int_equal(resolve(none, 0, &k, &n, msg), PG_EINVAL);
    assert_non_null(strstr(msg, "SLURM_ARRAY_TASK_ID"));
    assert_non_null(strstr(msg, "JOB_COMPLETION_INDEX"));
    assert_non_null(strstr(msg, "AWS_BATCH_JOB_ARRAY_INDEX"));
    /* SLURM first, then Kubernetes, then AWS */
    const char *all[] = {"AWS_BATCH_JOB_ARRAY_INDEX", "1", "AWS_BATCH_JOB_ARRAY_SIZE", "4", "JOB_COMPLETION_INDEX", "2",
                         "SLURM_ARRAY_TASK_ID", "3", "SLURM_ARRAY_TASK_MIN", "0", "SLURM_ARRAY_TASK_COUNT", "4", NULL};
    assert_int_equal(resolve(all, 4, &k, &n, msg), PG_OK);
    assert_int_equal(k, 3);
    const char *two[] = {"AWS_BATCH_JOB_ARRAY_INDEX", "1", "AWS_BATCH_JOB_ARRAY_SIZE", "4", "JOB_COMPLETION_INDEX", "2",
                         NULL};
    assert_int_equal(resolve(two, 4, &k, &n, msg), PG_OK);
    assert_int_equal(k, 2);
}

static void test_output_names(void **state)
{
    (void)state;
    char *p;
    pg_error err;
    assert_int_equal(cli_shard_output_path("out/part.{shard}.jsonl", false, "in.jsonl", 2, 4, &p, &err), PG_OK);
    assert_string_equal(p, "out/part.2-of-4.jsonl");
    free(p);
    assert_int_equal(cli_shard_output_path("a{shard}b{shard}", false, "-", 0, 1, &p, &err), PG_OK);
    assert_string_equal(p, "a0-of-1b0-of-1");
    free(p);
    assert_int_equal(cli_shard_output_path("results", true, "/data/prompts.v2.jsonl", 3, 8, &p, &err), PG_OK);
    assert_string_equal(p, "results/prompts.v2.3-of-8.jsonl");
    free(p);
    assert_int_equal(cli_shard_output_path("results/", true, "-", 0, 2, &p, &err), PG_OK);
    assert_string_equal(p, "results/stdin.0-of-2.jsonl");
    free(p);
    assert_int_equal(cli_shard_output_path("plain.jsonl", false, "in.jsonl", 1, 2, &p, &err), PG_OK);
    assert_null(p);
    int32_t k, n;
    assert_true(cli_shard_name_parse("results/prompts.v2.3-of-8.jsonl", &k, &n));
    assert_int_equal(k, 3);
    assert_int_equal(n, 8);
    assert_false(cli_shard_name_parse("results/prompts.8-of-8.jsonl", &k, &n)); /* K >= N */
    assert_false(cli_shard_name_parse("results.1-of-2.d/prompts.jsonl", &k, &n)); /* only the file name */
    assert_false(cli_shard_name_parse("p.1-of-2.1-of-2.jsonl", &k, &n));         /* ambiguous */
}

static void test_flags(void **state)
{
    (void)state;
    /* the same flags in another order agree; non-shaping flags are left out */
    const char *a[] = {"pagedgen", "-m", "/x/models/stories260K/", "--temperature", "0", "-o", "a",
                       "--threads", "3", "--stop", "x\ny", "--shard", "auto", "--max-tokens", "8", NULL};
    const char *b[] = {"pagedgen", "--max-tokens", "8", "--num-kv-blocks", "40", "--stop", "x\ny",
                       "-m", "stories260K", "--temperature", "0", "--shard", "1/4", "--resume", "-o", "b", NULL};
    cli_options oa, ob;
    pg_error err;
    assert_int_equal(cli_options_parse(&oa, 15, (char **)a, &err), PG_OK);
    assert_int_equal(cli_options_parse(&ob, 16, (char **)b, &err), PG_OK);
    assert_true(oa.shard_auto && oa.shard_given && oa.shard_auto_n == 0);
    assert_true(!ob.shard_auto && ob.shard_given && ob.shard_k == 1 && ob.shard_n == 4);
    char *ca, *cb;
    assert_int_equal(cli_shard_flags_canonical(oa.shaping, &ca), PG_OK);
    assert_int_equal(cli_shard_flags_canonical(ob.shaping, &cb), PG_OK);
    assert_string_equal(ca, cb);
    assert_string_equal(ca, "--max-tokens=8\n--model=stories260K\n--stop=x\\ny\n--temperature=0\n");
    free(ca);
    free(cb);
    const char *c[] = {"pagedgen", "-m", "m", "--shard", "auto/16", NULL};
    cli_options oc;
    assert_int_equal(cli_options_parse(&oc, 5, (char **)c, &err), PG_OK);
    assert_int_equal(oc.shard_auto_n, 16);
    const char *d[] = {"pagedgen", "-m", "m", "--shard", "auto/0", NULL};
    assert_int_equal(cli_options_parse(&oc, 5, (char **)d, &err), PG_EINVAL);
    const char *e[] = {"pagedgen", "-m", "m", "--shard", "autox", NULL};
    assert_int_equal(cli_options_parse(&oc, 5, (char **)e, &err), PG_EINVAL);
    const char *f[] = {"pagedgen", "merge", "-i", "in.jsonl", "-o", "all.jsonl", "a", "b", NULL};
    assert_int_equal(cli_options_parse(&oc, 8, (char **)f, &err), PG_OK);
    assert_int_equal(oc.cmd, CLI_CMD_MERGE);
    assert_int_equal(oc.n_merge_files, 2);
    assert_string_equal(oc.merge_files[1], "b");
    const char *g[] = {"pagedgen", "merge", "a", "b", NULL};
    assert_int_equal(cli_options_parse(&oc, 4, (char **)g, &err), PG_EINVAL); /* no -i */
}

static void write_file(const char *path, const char *s)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(s, f);
    fclose(f);
}

static char *read_all(const char *path)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    static char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static void test_marker_and_sort(void **state)
{
    (void)state;
    char dir[] = "/tmp/pg_shard_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char out[256], mpath[300];
    snprintf(out, sizeof out, "%s/o.1-of-3.jsonl", dir);
    snprintf(mpath, sizeof mpath, "%s.done", out);
    pg_error err;
    cli_shard_marker m = {.k = 1, .n = 3, .input_bytes = 123, .input_hash = 0xfedcba9876543210ULL,
                          .records = 4, .output_bytes = 77, .exit_code = 1};
    strcpy(m.format, "jsonl");
    m.flags = strdup("--max-tokens=8\n--stop=\"q\\n\"\n");
    cli_shard_marker r;
    assert_int_equal(cli_shard_marker_read(out, &r, &err), CLI_SHARD_NO_MARKER);
    assert_int_equal(cli_shard_marker_write(out, &m, &err), PG_OK);
    assert_int_equal(access(mpath, F_OK), 0);
    char tmp[320];
    snprintf(tmp, sizeof tmp, "%s.tmp", mpath);
    assert_int_not_equal(access(tmp, F_OK), 0); /* renamed, not left */
    assert_int_equal(cli_shard_marker_read(out, &r, &err), PG_OK);
    assert_int_equal(r.k, 1);
    assert_int_equal(r.n, 3);
    assert_int_equal(r.input_bytes, 123);
    assert_true(r.input_hash == 0xfedcba9876543210ULL);
    assert_string_equal(r.format, "jsonl");
    assert_string_equal(r.flags, m.flags);
    assert_int_equal(r.records, 4);
    assert_int_equal(r.output_bytes, 77);
    assert_int_equal(r.exit_code, 1);
    cli_shard_marker_free(&r);
    cli_shard_marker_free(&m);
    write_file(mpath, "{\"pagedgen_shard\":1,\"shard\":3,\"of\":3}\n"); /* K >= N, fields missing */
    assert_int_equal(cli_shard_marker_read(out, &r, &err), PG_EFORMAT);
    assert_non_null(strstr(err.msg, mpath));

    /* FNV-1a 64 of "a" is af63dc4c8601ec8c (the published test vector) */
    write_file(out, "a");
    int64_t bytes, lines;
    uint64_t h;
    assert_int_equal(cli_shard_hash_file(out, &bytes, &h, &lines, &err), PG_OK);
    assert_true(h == 0xaf63dc4c8601ec8cULL);
    assert_int_equal(bytes, 1);
    assert_int_equal(lines, 0);

    /* a resumed shard: kept records r3, r0 (two earlier runs), then this
     * run's r1, r4 in input order; the shard is r0 r1 r3 r4 */
    const char *kept = "{\"id\":\"r3\"}\n{\"id\":\"r0\"}\n";
    char whole[256];
    snprintf(whole, sizeof whole, "%s{\"id\":\"r1\"}\n{\"id\":\"r4\"}\n", kept);
    write_file(out, whole);
    int64_t order[4] = {12, -1, 0, -1};
    assert_int_equal(cli_shard_sort_output(out, (int64_t)strlen(kept), order, 4, &err), PG_OK);
    assert_string_equal(read_all(out), "{\"id\":\"r0\"}\n{\"id\":\"r1\"}\n{\"id\":\"r3\"}\n{\"id\":\"r4\"}\n");
    /* a record left over is an error, and the file stays as it was */
    write_file(out, whole);
    int64_t short_order[3] = {12, -1, 0};
    assert_int_equal(cli_shard_sort_output(out, (int64_t)strlen(kept), short_order, 3, &err), PG_EFORMAT);
    assert_string_equal(read_all(out), whole);
    unlink(out);
    unlink(mpath);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slurm),
        cmocka_unit_test(test_kubernetes),
        cmocka_unit_test(test_aws),
        cmocka_unit_test(test_none_and_precedence),
        cmocka_unit_test(test_output_names),
        cmocka_unit_test(test_flags),
        cmocka_unit_test(test_marker_and_sort),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
