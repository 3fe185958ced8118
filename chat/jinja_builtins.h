/* jinja_builtins: Python's str/list/dict methods that templates call
 * (.strip(), .split(), .startswith(), .items(), .get() ...), the globals
 * (range, namespace, dict, raise_exception, strftime_now, cycler, joiner)
 * and the string helpers the filters share. jinja_method and jinja_global
 * are declared in jinja_eval.h.
 *
 * Case mapping covers ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic
 * (Python maps all of Unicode); whitespace is Python's str.isspace set.
 */
#ifndef PG_JINJA_BUILTINS_H
#define PG_JINJA_BUILTINS_H

#include "jinja_eval.h"

/* str.strip/lstrip/rstrip(chars): which = 'b', 'l' or 'r'; chars
 * JV_ABSENT or None = whitespace. */
jv jinja_str_strip(jinja_vm *vm, jv s, jv chars, char which);
/* case: 'u' upper, 'l' lower, 'c' capitalize, 't' str.title */
jv jinja_str_case(jinja_vm *vm, jv s, char how);
/* str.replace(old, new, count); count < 0 = all */
jv jinja_str_replace(jinja_vm *vm, jv s, jv old, jv rep, int64_t count);
/* the code point at s[*i] (advances *i) */
uint32_t jinja_utf8_next(const char *s, size_t n, size_t *i);
bool jinja_is_space(uint32_t cp);
uint32_t jinja_upper(uint32_t cp);
uint32_t jinja_lower(uint32_t cp);
/* strftime with Python's (C locale) directives, UTC */
jv jinja_strftime(jinja_vm *vm, const char *fmt, int64_t unix_s);

#endif /* PG_JINJA_BUILTINS_H */
