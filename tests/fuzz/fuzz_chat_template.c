/* fuzz_chat_template: chat_template_create + chat_template_render over
 * arbitrary bytes. The input is a template, optionally followed by a NUL
 * byte and a chat request (JSON); without one (a plain .jinja seed) a fixed
 * small conversation is rendered. Any outcome but a crash, a hang or a leak
 * is fine: errors must come back as PG_EFORMAT / PG_EINVAL. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template.h"
#include "json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char DEFAULT_REQUEST[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
    " {\"role\": \"user\", \"content\": \"Hi \\u00e9\"},"
    " {\"role\": \"assistant\", \"content\": \"Hello\", \"tool_calls\": [{\"id\": \"abcdefghi\","
    " \"function\": {\"name\": \"f\", \"arguments\": {\"x\": 1}}}]},"
    " {\"role\": \"tool\", \"content\": \"42\", \"tool_call_id\": \"abcdefghi\"},"
    " {\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"a\"}, {\"type\": \"text\", \"text\": \"b\"}]}],"
    " \"add_generation_prompt\": true,"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"description\": \"d\","
    " \"parameters\": {\"type\": \"object\", \"properties\": {\"x\": {\"type\": \"integer\"}}}}}],"
    " \"chat_template_kwargs\": {\"enable_thinking\": false}}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *src = (const char *)data;
    const uint8_t *nul = memchr(data, 0, size);
    size_t tlen = nul ? (size_t)(nul - data) : size;
    const char *req = nul ? (const char *)nul + 1 : DEFAULT_REQUEST;
    size_t rlen = nul ? size - tlen - 1 : strlen(DEFAULT_REQUEST);

    chat_template *t = NULL;
    pg_error err;
    if (chat_template_create(&t, src, tlen, "fuzz", "<s>", "</s>", &err) != 0) {
        if (t)
            abort(); /* failure leaves *out NULL */
        return 0;
    }
    json_doc d;
    if (json_parse(&d, req, rlen, "request", &err) == 0) {
        chat_render_opts opts = {.now_unix = 1785067200, .default_add_generation_prompt = true};
        char *out = NULL;
        size_t n = 0;
        int rc = chat_template_render(t, &d, 0, &opts, &out, &n, &err);
        if (rc == 0 && (!out || strlen(out) > n))
            abort();
        if (rc != 0 && (out || (rc != PG_EFORMAT && rc != PG_EINVAL && rc != PG_ENOMEM)))
            abort();
        free(out);
        json_doc_free(&d);
    }
    chat_template_destroy(t);
    return 0;
}
