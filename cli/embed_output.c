/* embed_output: embedding records (see embed_output.h). */
#include "embed_output.h"

#include <stdint.h>
#include <string.h>

void cli_put_base64_f32(json_buf *b, const float *v, int32_t n)
{
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    uint8_t q[3];
    int nq = 0;
    char out[4];
    for (int32_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &v[i], 4);
        for (int k = 0; k < 4; k++) { /* little-endian bytes whatever the host */
            q[nq++] = (uint8_t)(u >> (8 * k));
            if (nq == 3) {
                out[0] = tab[q[0] >> 2];
                out[1] = tab[((q[0] & 3) << 4) | (q[1] >> 4)];
                out[2] = tab[((q[1] & 15) << 2) | (q[2] >> 6)];
                out[3] = tab[q[2] & 63];
                json_buf_put(b, out, 4);
                nq = 0;
            }
        }
    }
    if (nq > 0) {
        if (nq == 1) q[1] = 0;
        out[0] = tab[q[0] >> 2];
        out[1] = tab[((q[0] & 3) << 4) | (q[1] >> 4)];
        out[2] = nq == 2 ? tab[(q[1] & 15) << 2] : '=';
        out[3] = '=';
        json_buf_put(b, out, 4);
    }
}

static void put_vector(json_buf *b, const cli_pending *g, const float *v)
{
    if (g->emb_base64) {
        json_buf_puts(b, "\"");
        cli_put_base64_f32(b, v, g->emb_dim);
        json_buf_puts(b, "\"");
        return;
    }
    json_buf_puts(b, "[");
    for (int32_t j = 0; j < g->emb_dim; j++)
        json_buf_printf(b, j ? ",%.9g" : "%.9g", (double)v[j]);
    json_buf_puts(b, "]");
}

void cli_output_embedding(json_buf *b, const cli_output_ctx *c, const cli_pending *g)
{
    bool openai = c->fmt == CLI_FORMAT_OPENAI;
    if (openai) {
        cli_output_openai_open(b, c, g->id_json, g->line, "embd-", "list");
        json_buf_puts(b, ",\"data\":[");
    } else {
        json_buf_printf(b, "{\"id\":%s,\"data\":[", g->id_json ? g->id_json : "null");
    }
    for (int32_t k = 0; k < g->n_embed; k++) {
        json_buf_printf(b, "%s{\"index\":%d,", k ? "," : "", (int)k);
        if (openai)
            json_buf_puts(b, "\"object\":\"embedding\",");
        json_buf_puts(b, "\"embedding\":");
        put_vector(b, g, g->emb[k]);
        json_buf_puts(b, "}");
    }
    long long pt = (long long)g->emb_prompt_tokens;
    if (openai) {
        json_buf_printf(b, "],\"usage\":{\"prompt_tokens\":%lld,\"total_tokens\":%lld,\"completion_tokens\":0,"
                        "\"prompt_tokens_details\":null}", pt, pt);
        cli_output_openai_close(b);
    } else {
        json_buf_printf(b, "],\"usage\":{\"prompt_tokens\":%lld,\"completion_tokens\":0}}\n", pt);
    }
}
