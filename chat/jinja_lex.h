/* jinja_lex: template source -> tokens, as jinja2 3.1's lexer with
 * transformers' settings: trim_blocks (the first newline after a block or
 * comment tag is dropped), lstrip_blocks (spaces and tabs before a block
 * or comment tag on its own line are dropped), whitespace control with
 * '-' and '+' on either side of a tag, comments, {% raw %}.
 *
 * Whitespace control is applied here, to the text tokens, so the parser
 * never sees it. Tokens live in the rt's arena; a lexing error fails the
 * rt (jrt_fail) with rt->line/col set.
 */
#ifndef PG_JINJA_LEX_H
#define PG_JINJA_LEX_H

#include "jinja_value.h"

typedef enum jtok_type {
    JT_EOF = 0,
    JT_TEXT,         /* s, len: literal template text */
    JT_VAR_BEGIN,    /* {{ */
    JT_VAR_END,      /* }} */
    JT_BLOCK_BEGIN,  /* {% */
    JT_BLOCK_END,    /* %} */
    JT_NAME,         /* s, len */
    JT_STRING,       /* s, len: unescaped */
    JT_INT,          /* ival */
    JT_FLOAT,        /* fval */
    JT_OP,           /* op: a jop */
} jtok_type;

/* Operators: single characters are their ASCII code. */
enum jop {
    JOP_EQ = 256, /* == */
    JOP_NE,       /* != */
    JOP_LE,       /* <= */
    JOP_GE,       /* >= */
    JOP_FLOORDIV, /* // */
    JOP_POW,      /* ** */
};

typedef struct jtok {
    jtok_type type;
    int op;
    const char *s;
    size_t len;
    int64_t ival;
    double fval;
    size_t off;      /* byte offset in the source */
    int line, col;
} jtok;

/* Tokenizes src[0, n) into *toks (arena), *ntoks including the final EOF. */
void jinja_lex(jinja_rt *rt, const char *src, size_t n, jtok **toks, size_t *ntoks);

/* "end of print statement", "'x'", "name 'foo'": how jinja2 describes a token. */
const char *jinja_tok_describe(jinja_rt *rt, const jtok *t);

#endif /* PG_JINJA_LEX_H */
