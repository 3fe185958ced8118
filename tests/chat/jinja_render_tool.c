/* jinja_render_tool: a dev tool for differential testing against jinja2
 * (tests/chat/jinja_fuzz_diff.py). Reads JSON lines {"template": T,
 * "request": R} on stdin and writes one JSON line per input: {"text": ...}
 * or {"error": ...} (parse errors start with "parse: "). Not a test. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template.h"
#include "json.h"

int main(void)
{
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, stdin)) > 0) {
        json_doc d;
        pg_error err;
        json_buf out = {0};
        if (json_parse(&d, line, (size_t)n, "stdin", &err) != 0) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        char *tmpl = NULL;
        size_t tl = 0;
        int tv = json_obj_get(&d, 0, "template"), rv = json_obj_get(&d, 0, "request");
        if (json_get_string(&d, tv, &tmpl, &tl, &err) != 0 || !json_is_object(&d, rv)) {
            fprintf(stderr, "bad input line\n");
            return 1;
        }
        chat_template *t = NULL;
        if (chat_template_create(&t, tmpl, tl, "T", NULL, NULL, &err) != 0) {
            json_buf_puts(&out, "{\"error\": ");
            char msg[1100];
            snprintf(msg, sizeof msg, "parse: %s", err.msg);
            json_buf_string(&out, msg, strlen(msg));
        } else {
            chat_render_opts opts = {.now_unix = 1785067200, .default_add_generation_prompt = false};
            char *text = NULL;
            size_t len = 0;
            if (chat_template_render(t, &d, rv, &opts, &text, &len, &err) == 0) {
                json_buf_puts(&out, "{\"text\": ");
                json_buf_string(&out, text, len);
            } else {
                json_buf_puts(&out, "{\"error\": ");
                json_buf_string(&out, err.msg, strlen(err.msg));
            }
            free(text);
        }
        json_buf_puts(&out, "}\n");
        fwrite(out.data, 1, out.len, stdout);
        json_buf_free(&out);
        chat_template_destroy(t);
        free(tmpl);
        json_doc_free(&d);
    }
    free(line);
    return 0;
}
