/* chat_template_bench: renders/s of chat_template_render on the Llama 3.1
 * Instruct template (the longest of ../shared/chat_templates) with a
 * 4-message conversation, and parses/s of the template.
 * Usage: chat_template_bench SHARED_DIR [SECONDS] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chat_template.h"
#include "file_io.h"
#include "json.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const char REQUEST[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"You are a helpful assistant.\"},"
    " {\"role\": \"user\", \"content\": \"What is the capital of France?\"},"
    " {\"role\": \"assistant\", \"content\": \"The capital of France is Paris.\"},"
    " {\"role\": \"user\", \"content\": \"And of Italy?\"}], \"add_generation_prompt\": true}";

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s SHARED_DIR [SECONDS]\n", argv[0]);
        return 2;
    }
    double secs = argc > 2 ? strtod(argv[2], NULL) : 2.0;
    char path[4096];
    snprintf(path, sizeof path, "%s/chat_templates/templates/llama-3.1-instruct.jinja", argv[1]);
    char *src = NULL;
    size_t len = 0;
    pg_error err;
    if (pg_read_file(path, 1 << 20, &src, &len, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    chat_template *t = NULL;
    if (chat_template_create(&t, src, len, path, "<|begin_of_text|>", "<|eot_id|>", &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    json_doc d;
    if (json_parse(&d, REQUEST, strlen(REQUEST), "request", &err))
        return 1;
    chat_render_opts opts = {.now_unix = 1785067200, .default_add_generation_prompt = true};
    size_t out_bytes = 0;
    long n = 0;
    double t0 = now_s(), t1;
    do {
        for (int k = 0; k < 100; k++) {
            char *out = NULL;
            size_t ol = 0;
            if (chat_template_render(t, &d, 0, &opts, &out, &ol, &err)) {
                fprintf(stderr, "%s\n", err.msg);
                return 1;
            }
            out_bytes = ol;
            free(out);
            n++;
        }
        t1 = now_s();
    } while (t1 - t0 < secs);
    printf("render llama-3.1-instruct, 4 messages (%zu bytes out): %.0f renders/s (%.1f us each)\n",
           out_bytes, (double)n / (t1 - t0), (t1 - t0) / (double)n * 1e6);
    long p = 0;
    t0 = now_s();
    do {
        for (int k = 0; k < 20; k++) {
            chat_template *u = NULL;
            if (chat_template_create(&u, src, len, path, NULL, NULL, &err))
                return 1;
            chat_template_destroy(u);
            p++;
        }
        t1 = now_s();
    } while (t1 - t0 < secs / 2);
    printf("parse llama-3.1-instruct (%zu bytes): %.0f parses/s\n", len, (double)p / (t1 - t0));
    json_doc_free(&d);
    chat_template_destroy(t);
    pg_file_free(src);
    return 0;
}
