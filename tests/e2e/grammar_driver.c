/* grammar_driver: structured/grammar as a line filter, for test_grammar_diff.py.
 * Each input line: KIND \t SRC \t S1 \t S2 ... where KIND is a
 * grammar_kind number and SRC, Si are JSON string literals (the constraint
 * text, the candidate outputs). Each output line: 'E' + the compile error,
 * or one '1'/'0' per candidate: a complete match or not. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar.h"
#include "json.h"

/* The JSON string literal s[0, n) unescaped (malloc'd), or NULL. */
static char *unquote(const char *s, size_t n, size_t *out)
{
    char *w = malloc(n + 3), *r = NULL;
    if (!w)
        return NULL;
    w[0] = '[';
    memcpy(w + 1, s, n);
    w[n + 1] = ']';
    w[n + 2] = 0;
    json_doc d;
    if (json_parse(&d, w, n + 2, "line", NULL) == PG_OK) {
        if (json_get_string(&d, 1, &r, out, NULL) != PG_OK)
            r = NULL;
        json_doc_free(&d);
    }
    free(w);
    return r;
}

int main(void)
{
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    while ((len = getline(&line, &cap, stdin)) > 0) {
        if (line[len - 1] == '\n')
            line[--len] = 0;
        char *field[4096];
        int nf = 0;
        char *p = line;
        field[nf++] = p;
        while (nf < 4096 && (p = strchr(p, '\t'))) {
            *p++ = 0;
            field[nf++] = p;
        }
        size_t sl = 0;
        char *src = unquote(field[1], strlen(field[1]), &sl);
        grammar *g = NULL;
        pg_error err = {{0}};
        if (!src || grammar_compile(&g, (grammar_kind)atoi(field[0]), src, sl, &err) != PG_OK) {
            printf("E%s\n", src ? err.msg : "bad input line");
            fflush(stdout);
            free(src);
            continue;
        }
        for (int i = 2; i < nf; i++) {
            size_t n = 0;
            char *s = unquote(field[i], strlen(field[i]), &n);
            grammar_state st;
            grammar_state_init(g, &st);
            int ok = s && grammar_advance(g, &st, (const uint8_t *)s, n) && grammar_can_end(g, &st);
            putchar(ok ? '1' : '0');
            free(s);
        }
        putchar('\n');
        fflush(stdout);
        grammar_destroy(g);
        free(src);
    }
    free(line);
    return 0;
}
