#!/usr/bin/python3
"""Differential cases for the Jinja interpreter (chat/jinja_*).

Each case is a small template (and optional variables) rendered by jinja2
in transformers' environment (ImmutableSandboxedEnvironment, trim_blocks,
lstrip_blocks, loopcontrols, tojson = json.dumps(ensure_ascii=False),
raise_exception, strftime_now pinned to 2026-07-26 12:00 UTC).

  jinja_diff.py --write   regenerate tests/chat/jinja_cases.h (the table the
                          C test test_jinja_semantics checks; expectations
                          came from jinja2 3.1.2, Debian's python3-jinja2)
  jinja_diff.py           check the table is current (exit 77 without jinja2)
"""
import json, os, sys

CASES = [
    # --- printing (Python str/repr) ---
    ("{{ 1 }}|{{ 1.0 }}|{{ -0.5 }}|{{ 1e20 }}|{{ 1e16 }}|{{ 1e15 }}|{{ 0.0001 }}|{{ 0.00001 }}|{{ 1/3 }}", {}),
    ("{{ true }}|{{ false }}|{{ none }}|{{ None }}|{{ True }}", {}),
    ("{{ [1, 'a', 2.5, none, true] }}|{{ {'k': 'v', 'n': 1} }}|{{ ('a',) }}|{{ (1, 2) }}", {}),
    ("{{ [\"it's\", 'say \"hi\"', 'both \\' \"', 'nl\\n', 'tab\\t', 'bs\\\\'] }}", {}),
    ("{{ x }}|{{ x.y if x is defined }}|{{ d }}|{{ l }}", {"d": {"a": [1, {"b": None}]}, "l": [[], {}]}),
    ("{{ 3.0 * 2 }}|{{ 7 / 2 }}|{{ 6 / 3 }}|{{ 7 // 2 }}|{{ -7 // 2 }}|{{ 7 % 3 }}|{{ -7 % 3 }}|{{ 7.5 // 2 }}|{{ 2 ** 10 }}|{{ 2 ** -1 }}|{{ 2.0 ** 3 }}", {}),
    ("{{ 1 + true }}|{{ 0.1 + 0.2 }}|{{ 1e300 * 1e10 }}|{{ -(3) }}|{{ +4 }}", {}),
    ("{{ 'a' ~ 1 ~ none ~ 2.0 ~ true ~ [1] }}", {}),
    # --- whitespace control, trim_blocks, lstrip_blocks ---
    ("a\n{% if true %}\nb\n{% endif %}\nc\n", {}),
    ("a\n    {% if true %}\n    b\n    {% endif %}\nc", {}),
    ("  {{ 'x' }}  \n  {% if 1 %}y{% endif %}  \n", {}),
    ("a  {%- if true -%}  b  {%- endif -%}  c", {}),
    ("a {{- ' b ' -}} c", {}),
    ("a\n  {#- comment -#}\n  b\n  {# c2 #}\nd", {}),
    ("x {%+ if true %}y{% endif +%}\nz", {}),
    ("{% for i in [1,2] %}\n  {{ i }}\n{% endfor %}\n", {}),
    ("\t  {% set x = 1 %}\t\n{{ x }}", {}),
    ("{% raw %}{{ not evaluated }}{% endraw %}|{%- raw -%}  {% x %}  {%- endraw -%}|", {}),
    ("line1\r\n{% if true %}\r\nline2{% endif %}", {}),
    # --- scoping ---
    ("{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = i + 5 %}{{ x }}{% endfor %}{{ x }}", {}),
    ("{% if true %}{% set y = 2 %}{% endif %}{{ y }}", {}),
    ("{% set ns = namespace(n=0, items=[]) %}{% for i in range(3) %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}", {}),
    ("{% for a in [1] %}{% set inner = 5 %}{% endfor %}{{ inner is defined }}", {}),
    ("{% set a, b = [1, 2] %}{{ a }}{{ b }}{% set c = 1, 2 %}{{ c }}", {}),
    ("{% macro m(a, b='B') %}[{{ a }}{{ b }}{{ varargs }}{{ kwargs }}]{% endmacro %}{{ m(1) }}{{ m(1, 2, 3, z=4) }}{{ m(b=5, a=6) }}", {}),
    ("{% set g = 'G' %}{% macro m() %}{{ g }}{% set g = 'L' %}{{ g }}{% endmacro %}{{ m() }}{{ g }}", {}),
    ("{% macro wrap() %}<{{ caller() }}>{% endmacro %}{% call wrap() %}inside{% endcall %}", {}),
    ("{% macro rec(n) %}{% if n > 0 %}{{ n }}{{ rec(n - 1) }}{% endif %}{% endmacro %}{{ rec(4) }}", {}),
    ("{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}{{ a is defined }}", {}),
    ("{% set block %}in {{ 1 + 1 }}{% endset %}[{{ block }}]{% set up | upper %}shout{% endset %}{{ up }}", {}),
    ("{% filter upper %}abc {{ 'd' }}{% endfilter %}", {}),
    # --- loops ---
    ("{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ x }};{% endfor %}", {}),
    ("{% for x in [1, 2, 3] %}{{ loop.previtem }}-{{ loop.nextitem }}-{{ loop.cycle('a', 'b') }};{% endfor %}", {}),
    ("{% for x in [1, 2, 3, 4] if x is even %}{{ x }}{{ loop.index }}{{ loop.last }};{% endfor %}", {}),
    ("{% for x in [] %}no{% else %}empty{% endfor %}|{% for x in [1] %}one{% else %}no{% endfor %}", {}),
    ("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}{% for k in {'x': 1, 'y': 2} %}{{ k }}{% endfor %}", {}),
    ("{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}", {}),
    ("{% for a in [1, 2] %}{% for b in [3, 4] %}{{ loop.index }}{{ a }}{{ b }} {% endfor %}{{ loop.index }}|{% endfor %}", {}),
    ("{{ range(5) | list }}{{ range(1, 10, 3) | list }}{{ range(5, 0, -2) | list }}{{ range(0) | list }}", {}),
    ("{% for x in u %}never{% endfor %}ok", {}),
    # --- expressions ---
    ("{{ 1 < 2 < 3 }}{{ 1 < 3 < 2 }}{{ 2 == 2.0 }}{{ 'a' != 'b' }}{{ [1, 2] == [1, 2] }}{{ 'b' > 'a' }}", {}),
    ("{{ 'a' in 'cat' }}{{ 'z' not in 'cat' }}{{ 2 in [1, 2] }}{{ 'k' in {'k': 1} }}{{ 1 in u }}", {}),
    ("{{ 0 or 'x' }}|{{ 'a' and 'b' }}|{{ '' and 'b' }}|{{ none or [] }}|{{ not 0 }}|{{ not 'a' }}", {}),
    ("{{ 'yes' if 1 else 'no' }}|{{ 'yes' if 0 else 'no' }}|{{ 'yes' if 0 }}|{{ 'a' if false else 'b' if true else 'c' }}", {}),
    ("{{ 'hello'[1] }}{{ 'hello'[-1] }}{{ 'hello'[1:3] }}{{ 'hello'[::-1] }}{{ 'hello'[::2] }}{{ 'hello'[-3:] }}{{ 'hello'[:-1] }}{{ 'hello'[10:] }}", {}),
    ("{{ [1, 2, 3, 4, 5][1:4] }}{{ [1, 2, 3, 4, 5][::-2] }}{{ [1, 2, 3][5:] }}{{ [1, 2, 3][-2] }}{{ (1, 2, 3)[1:] }}", {}),
    ("{{ 'grüße'[1:4] }}|{{ 'grüße' | length }}|{{ '日本語'[-1] }}|{{ '🙂x'[0] }}", {}),
    ("{{ d.a }}{{ d['a'] }}{{ d.missing }}|{{ d.items is callable }}|{{ d['items'] }}|{{ l.0 }}", {"d": {"a": 1, "items": "I"}, "l": ["z"]}),
    ("{{ 'a' 'b' }}{{ \"x\\ny\" }}{{ '\\u00e9\\x41' }}", {}),
    ("{{ [1, 2] + [3] }}{{ 'ab' * 3 }}{{ [0] * 3 }}{{ 3 * 'x' }}", {}),
    ("{{ {'a': 1, 'b': 2} | length }}{{ ([1, 2], 3) | length }}", {}),
    ("{{ 1_000 + 0x10 if false else 1_000 }}", {}),
    # --- filters ---
    ("{{ '  a b  ' | trim }}|{{ 'xxaxx' | trim('x') }}|{{ none | trim }}|{{ 12 | string }}|{{ 'abc' | upper }}{{ 'ABC' | lower }}", {}),
    ("{{ 'hello world' | capitalize }}|{{ 'hello wORLD-foo (bar)' | title }}|{{ 'aaa' | replace('a', 'b', 2) }}", {}),
    ("{{ [3, 1, 2] | sort }}{{ [3, 1, 2] | sort(reverse=true) }}{{ ['b', 'A', 'c'] | sort }}{{ ['b', 'A', 'c'] | sort(case_sensitive=true) }}", {}),
    ("{{ users | sort(attribute='age') | map(attribute='name') | join(', ') }}", {"users": [{"name": "a", "age": 30}, {"name": "b", "age": 20}, {"name": "c", "age": 25}]}),
    ("{{ users | selectattr('age', 'gt', 21) | map(attribute='name') | list }}{{ users | rejectattr('age', 'equalto', 20) | map(attribute='name') | list }}", {"users": [{"name": "a", "age": 30}, {"name": "b", "age": 20}]}),
    ("{{ msgs | selectattr('role', 'equalto', 'user') | list | length }}{{ msgs | map(attribute='role') | unique | list }}{{ msgs | selectattr('tool') | list }}", {"msgs": [{"role": "user"}, {"role": "assistant"}, {"role": "user"}]}),
    ("{{ [1, 2, 3, 4] | select('odd') | list }}{{ [1, 2, 3, 4] | reject('odd') | list }}{{ [0, 1, '', 'a'] | select | list }}{{ ['a', 'b'] | map('upper') | list }}", {}),
    ("{{ [1, 2] | first }}{{ [1, 2] | last }}{{ [] | first }}{{ 'abc' | first }}{{ 'abc' | list }}{{ {'a': 1} | list }}", {}),
    ("{{ x | default('d') }}|{{ none | default('d') }}|{{ '' | default('d', true) }}|{{ 0 | d('z', boolean=true) }}|{{ 'v' | default('d') }}", {}),
    ("{{ {'b': 1, 'a': 2} | dictsort }}{{ {'b': 1, 'a': 2} | dictsort(by='value', reverse=true) }}{{ {'a': 1} | items | list }}", {}),
    ("{{ [1, 2, 2, 1] | unique | list }}{{ ['a', 'A'] | unique | list }}{{ [1, 2] | reverse | list }}{{ 'abc' | reverse }}", {}),
    ("{{ '42' | int }}{{ '4.7' | int }}{{ 'x' | int }}{{ 'x' | int(7) }}{{ 3.9 | int }}{{ '2.5' | float }}{{ 'x' | float }}{{ 2 | float }}{{ -3 | abs }}", {}),
    ("{{ 2.5 | round }}{{ 3.5 | round }}{{ 2.567 | round(2) }}{{ 2.1 | round(0, 'ceil') }}{{ 2.9 | round(method='floor') }}{{ 3 | round }}", {}),
    ("{{ 'a\\nb\\n\\nc' | indent }}|{{ 'a\\nb' | indent(2, true) }}|{{ 'a\\n\\nb' | indent(1, blank=true) }}", {}),
    ("{{ ['a', 'b'] | join }}{{ [1, 2] | join('-') }}{{ users | join(', ', attribute='n') }}", {"users": [{"n": "x"}, {"n": "y"}]}),
    ("{{ 'one two  three' | wordcount }}{{ 'ab' | center(6) }}|{{ '<a href=\"x\">&\\'' | e }}|{{ 'x' | safe }}", {}),
    ("{{ [1, 2, 3, 4, 5] | batch(2) | list }}{{ [1, 2, 3] | batch(2, 0) | list }}{{ [3, 1, 2] | max }}{{ [3, 1, 2] | min }}{{ [1, 2, 3] | sum }}", {}),
    ("{{ '%s is %d years' | format('Al', 30) }}|{{ '%s-%s' % ('a', 'b') }}|{{ '%05.1f' % 3.14159 }}", {}),
    # --- tojson (transformers: json.dumps(ensure_ascii=False)) ---
    ("{{ obj | tojson }}", {"obj": {"a": [1, 2.5, None, True, "é\"\\\n\t\u0001"], "b": {}, "c": []}}),
    ("{{ obj | tojson(indent=2) }}", {"obj": {"a": [1, {"x": []}], "b": {"c": "d"}, "e": {}}}),
    ("{{ obj | tojson(indent=4) }}|{{ [] | tojson(indent=2) }}|{{ 'x' | tojson }}|{{ 1.0 | tojson }}|{{ 1e20 | tojson }}", {"obj": [1, [2, [3]]]}),
    ("{{ obj | tojson(sort_keys=true) }}|{{ obj | tojson(separators=(',', ':')) }}", {"obj": {"b": 1, "a": [1, 2]}}),
    ("{{ {1: 'a', true: 'b', none: 'c'} | tojson }}", {}),
    # --- tests ---
    ("{{ x is defined }}{{ x is undefined }}{{ none is none }}{{ 'a' is string }}{{ {} is mapping }}{{ [] is mapping }}{{ [] is iterable }}{{ 'a' is iterable }}{{ 1 is iterable }}", {}),
    ("{{ 1 is number }}{{ 1.5 is number }}{{ true is number }}{{ 1 is integer }}{{ true is integer }}{{ 1.0 is float }}{{ true is boolean }}{{ true is true }}{{ 1 is true }}{{ false is false }}", {}),
    ("{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}{{ 9 is divisibleby(2) }}{{ 'a' is eq 'a' }}{{ 2 is gt 1 }}{{ 2 is le 1 }}{{ 1 is in [1] }}{{ 'ab' is lower }}{{ 'AB' is upper }}{{ 1 is ne 2 }}", {}),
    ("{{ x is not defined }}{{ not x is defined }}{{ [] is sequence }}{{ 'x' is sequence }}{{ none is sameas none }}{{ range is callable }}", {}),
    # --- str methods ---
    ("{{ '  x  '.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ '  x'.lstrip() }}|{{ 'x\\n\\n'.rstrip() }}|{{ '\\n\\nx'.lstrip('\\n') }}|{{ 'abcba'.rstrip('ab') }}", {}),
    ("{{ 'a,b,,c'.split(',') }}{{ '  a  b '.split() }}{{ 'a,b,c'.split(',', 1) }}{{ 'a b c'.split(none, 1) }}{{ 'a,b,c'.rsplit(',', 1) }}{{ ''.split() }}{{ ''.split(',') }}", {}),
    ("{{ 'hello'.startswith('he') }}{{ 'hello'.endswith('lo') }}{{ 'hello'.startswith(('x', 'h')) }}{{ 'hello'.endswith(('x', 'y')) }}{{ 'hello'.startswith('l', 2) }}", {}),
    ("{{ 'Hello World'.upper() }}{{ 'Hello World'.lower() }}{{ 'hello world'.title() }}{{ 'hELLO'.capitalize() }}{{ 'a-b'.replace('-', '+') }}", {}),
    ("{{ 'hello'.find('l') }}{{ 'hello'.find('z') }}{{ 'hello'.rfind('l') }}{{ 'hello'.count('l') }}{{ '-'.join(['a', 'b']) }}{{ 'grüße'.find('e') }}", {}),
    ("{{ 'a\\nb\\r\\nc'.splitlines() }}{{ 'x{}y{}'.format(1, 'z') }}{{ '{0}{0}'.format('r') }}{{ '{n}!'.format(n=3) }}", {}),
    ("{{ '123'.isdigit() }}{{ 'abc'.isalpha() }}{{ ' '.isspace() }}{{ 'ab'.islower() }}{{ 'AB'.isupper() }}", {}),
    # --- dict/list methods ---
    ("{{ d.get('a') }}{{ d.get('z') }}{{ d.get('z', 'dflt') }}{{ d.keys() | list }}{{ d.values() | list }}{{ d.items() | list }}", {"d": {"a": 1, "b": 2}}),
    ("{{ [1, 2, 3].index(2) }}{{ [1, 1, 2].count(1) }}", {}),
    # --- globals ---
    ("{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%Y-%m-%d %H:%M:%S') }}|{{ strftime_now('%A %B %-d %I %p %j %y') }}", {}),
    ("{% set d = dict(a=1, b='x') %}{{ d }}{% set ns = namespace(a=1) %}{% set ns.b = 2 %}{{ ns.a }}{{ ns.b }}", {}),
    ("{% set c = cycler('a', 'b') %}{{ c.next() }}{{ c.next() }}{{ c.next() }}{% set j = joiner('|') %}{{ j() }}1{{ j() }}2", {}),
    # --- errors (message must contain the text after ERR) ---
    ("{{ raise_exception('custom failure') }}", {}),
    ("{{ x.y }}", {}),
    ("{{ d.missing.deeper }}", {"d": {}}),
    ("{{ l[5].x }}", {"l": [1]}),
    ("{{ 'a' + 1 }}", {}),
    ("{{ 1 + 'a' }}", {}),
    ("{{ x + 1 }}", {}),
    ("{{ x() }}", {}),
    ("{{ 1 < 'a' }}", {}),
    ("{{ 1 / 0 }}", {}),
    ("{{ 5 // 0 }}", {}),
    ("{{ range(100001) | length }}", {}),
    ("{% set l = [] %}{{ l.append(1) }}", {}),
    ("{% for a, b in [[1, 2, 3]] %}{% endfor %}", {}),
    ("{% set x = 1 %}{% set x.y = 2 %}", {}),
    ("{{ none | tojson }}{{ x | tojson }}", {}),
    ("{{ 'abc'[::0] }}", {}),
    ("{% for x in 5 %}{% endfor %}", {}),
    ("{{ 1 in none }}", {}),
    ("{{ -'a' }}", {}),
]

PARSE_ERRORS = [
    "{% if true %}unclosed",
    "{% for x in y %}{% endif %}",
    "{% frobnicate %}",
    "{{ 1 + }}",
    "{{ x | nosuchfilter }}",
    "{{ x is nosuchtest }}",
    "{{ 'unterminated }}",
    "{% endfor %}",
    "{{ (1 }}",
    "{% break %}",
    "line1\nline2 {{ ) }}",
    "{# never closed",
]

NOW = 1785067200  # 2026-07-26 12:00:00 UTC


def make_env():
    from datetime import datetime, timezone
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        from jinja2.exceptions import TemplateError
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.fromtimestamp(NOW, tz=timezone.utc).strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render(env, src, variables):
    try:
        t = env.from_string(src)
    except Exception as e:  # parse error
        msg = str(e).split("\n")[0]
        # Python's compiler reports its own location for 'break' outside loop
        msg = msg.split(" (<template>")[0]
        return ("parse", msg)
    try:
        return ("text", t.render(messages=[], tools=None, documents=None, add_generation_prompt=False, **variables))
    except Exception as e:
        return ("error", str(e))


def c_str(s):
    out = []
    for b in s.encode("utf-8"):
        c = chr(b)
        if c == "\\":
            out.append("\\\\")
        elif c == '"':
            out.append('\\"')
        elif c == "\n":
            out.append("\\n")
        elif c == "\t":
            out.append("\\t")
        elif c == "\r":
            out.append("\\r")
        elif c == "?":
            out.append("\\?")
        elif 0x20 <= b < 0x7F:
            out.append(c)
        else:
            out.append("\\%03o" % b)
    return '"' + "".join(out) + '"'


def generate():
    env = make_env()
    lines = ["/* Generated by tests/chat/jinja_diff.py --write from jinja2 %s in transformers'" % __import__("jinja2").__version__,
             " * environment. Do not edit: change the cases there and regenerate. */",
             "typedef struct jinja_case { const char *tmpl, *vars, *kind, *want; } jinja_case;",
             "static const jinja_case JINJA_CASES[] = {"]
    for src, variables in CASES:
        kind, want = render(env, src, variables)
        if kind == "parse":
            raise SystemExit("case does not parse in jinja2: %r: %s" % (src, want))
        lines.append("    {%s,\n     %s,\n     \"%s\", %s}," % (c_str(src), c_str(json.dumps(variables, ensure_ascii=False)), kind, c_str(want)))
    lines.append("};")
    lines.append("static const jinja_case JINJA_PARSE_ERRORS[] = {")
    for src in PARSE_ERRORS:
        kind, want = render(env, src, {})
        if kind != "parse":
            raise SystemExit("expected a parse error from jinja2: %r" % src)
        lines.append("    {%s, \"{}\", \"parse\", %s}," % (c_str(src), c_str(want)))
    lines.append("};")
    return "\n".join(lines) + "\n"


def main():
    try:
        import jinja2  # noqa: F401
    except ImportError:
        print("SKIP: jinja2 not installed (apt-get install python3-jinja2)")
        return 77
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "jinja_cases.h")
    text = generate()
    if "--write" in sys.argv:
        with open(path, "w") as f:
            f.write(text)
        print("wrote", path)
        return 0
    with open(path) as f:
        # the first line names the jinja2 version that wrote the table
        if f.read().split("\n", 1)[1] != text.split("\n", 1)[1]:
            print("tests/chat/jinja_cases.h is stale or differs from jinja2: run jinja_diff.py --write")
            return 1
    print("jinja_cases.h matches jinja2 on %d cases" % (len(CASES) + len(PARSE_ERRORS)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
