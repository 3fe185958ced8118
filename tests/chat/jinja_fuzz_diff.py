#!/usr/bin/python3
"""Random templates rendered by jinja2 (transformers' environment, as in
jinja_diff.py) and by our interpreter (build/tests/chat/jinja_render_tool);
prints every case where the outputs differ, or where one side fails and the
other does not. A development tool, not a test:

  tests/chat/jinja_fuzz_diff.py BUILD_DIR [N] [SEED]
"""
import json, random, re, subprocess, sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from jinja_diff import make_env  # noqa: E402

ATOMS = ["m.role", "m['content']", "m.content | trim", "m.tool_calls", "m.content[:3]", "messages[loop_ix]",
         "ns.c ~ 'x'", "m.get('role')", "(m.content or '') + '!'", "i", "loop.index0", "loop.length",
         "1", "0", "-3", "2.5", "1e20", "0.1", "'a'", "''", "' x \\n'", "'h\u00e9llo W\u00f6rld'", "none", "true",
         "false", "[1, 2, 3]", "[]", "['b', 'a', 'A']", "{'k': 'v', 'n': 2}", "{}", "(1, 'x')", "msgs", "d", "s",
         "n", "f", "l", "u", "msgs[0]", "msgs[-1]", "d.k", "d['n']", "s[1:]", "l[::-1]", "msgs | length",
         "range(3)", "ns.c", "loop_ish"]
BINOPS = ["+", "-", "*", "/", "//", "%", "~", "==", "!=", "<", ">=", "in", "not in", "and", "or", "**"]
FILTERS = ["trim", "upper", "lower", "length", "first", "last", "join", "join(', ')", "tojson", "tojson(indent=2)",
           "string", "list", "sort", "reverse", "default('D')", "default('D', true)", "int", "float", "round",
           "abs", "unique", "map(attribute='role')", "selectattr('role', 'equalto', 'user')", "items", "dictsort",
           "capitalize", "title", "replace('a', 'b')", "count", "select", "reject('none')", "batch(2)", "sum",
           "map('string')", "indent(2)", "wordcount", "center(9)", "max", "min", "e", "format(1)"]
TESTS = ["defined", "undefined", "none", "string", "number", "integer", "float", "iterable", "mapping",
         "sequence", "odd", "even", "true", "false", "boolean", "in [1, 'a']", "eq 1", "gt 0", "divisibleby 2",
         "lower", "upper", "callable"]
METHODS = [".strip()", ".split()", ".split(',')", ".upper()", ".startswith('a')", ".endswith(('x', 'o'))",
           ".get('k')", ".get('z', 0)", ".items()", ".keys()", ".values()", ".lstrip('h')", ".rstrip()",
           ".replace('l', 'L')", ".title()", ".find('l')", ".count('l')", ".splitlines()", ".index(1)"]
TEXTS = ["a", " ", "\n", "  \n", "\t", "x\n  ", "\n\n", "  ", "b "]


def expr(r, depth=0):
    k = r.random()
    if depth > 3 or k < 0.3:
        return r.choice(ATOMS)
    if k < 0.5:
        return "(%s %s %s)" % (expr(r, depth + 1), r.choice(BINOPS), expr(r, depth + 1))
    if k < 0.65:
        return "%s | %s" % (expr(r, depth + 1), r.choice(FILTERS))
    if k < 0.75:
        return "(%s is %s%s)" % (expr(r, depth + 1), r.choice(["", "not "]), r.choice(TESTS))
    if k < 0.85:
        return "(%s)%s" % (expr(r, depth + 1), r.choice(METHODS))
    if k < 0.92:
        return "(%s if %s else %s)" % (expr(r, depth + 1), expr(r, depth + 1), expr(r, depth + 1))
    return "not %s" % expr(r, depth + 1)


def ws(r):
    return r.choice(["", "", "-", "+"])


def tag(r, body):
    return "{%" + ws(r).replace("+", "") + " " + body + " " + ws(r) + "%}"


def conv_loop(r, depth):
    """the shape of a real chat template: a loop over messages with role tests"""
    body = []
    for _ in range(r.randint(1, 3)):
        role = r.choice(["'user'", "'assistant'", "'system'"])
        body.append(tag(r, "if m.role == " + role) + block(r, depth) +
                    (tag(r, "elif " + expr(r)) + block(r, depth) if r.random() < 0.3 else "") + tag(r, "endif"))
    extra = r.choice(["", tag(r, "set ns.c = ns.c + 1"), tag(r, "if loop.last") + "L" + tag(r, "endif"),
                      tag(r, "if loop.index0 > 1") + tag(r, "break") + tag(r, "endif"),
                      tag(r, "if m.role == 'system'") + tag(r, "continue") + tag(r, "endif")])
    flt = " if m.role != 'tool'" if r.random() < 0.3 else ""
    return r.choice(TEXTS) + tag(r, "for m in msgs" + flt) + r.choice(TEXTS) + "".join(body) + extra + tag(r, "endfor") + r.choice(TEXTS)


def stmt(r, depth=0):
    k = r.random()
    if depth < 2 and k < 0.15:
        return conv_loop(r, depth)
    k = r.random()
    if depth > 2 or k < 0.3:
        return r.choice(TEXTS) + "{{" + ws(r).replace("+", "") + " " + expr(r) + " " + ws(r).replace("+", "") + "}}" + r.choice(TEXTS)
    if k < 0.45:
        return tag(r, "if " + expr(r)) + block(r, depth) + (tag(r, "else") + block(r, depth) if r.random() < 0.5 else "") + tag(r, "endif")
    if k < 0.6:
        target = r.choice(["x", "x", "k, v"])
        it = r.choice(["msgs", "l", "s", "d", "d.items()", "range(3)", expr(r)])
        flt = " if " + expr(r) if r.random() < 0.2 else ""
        inner = block(r, depth) + r.choice(["{{ loop.index }}", "{{ loop.last }}", "{{ x }}", "{{ loop.previtem }}", "", "{% if loop.first %}F{% endif %}"])
        return tag(r, "for %s in %s%s" % (target, it, flt)) + inner + (tag(r, "else") + "E" if r.random() < 0.3 else "") + tag(r, "endfor")
    if k < 0.75:
        return tag(r, "set %s = %s" % (r.choice(["n", "s", "y", "ns.c"]), expr(r)))
    if k < 0.85:
        return "{#" + ws(r).replace("+", "") + " c " + ws(r).replace("+", "") + "#}" + r.choice(TEXTS)
    return tag(r, "macro m(a, b=2)") + block(r, depth) + "{{ a }}" + tag(r, "endmacro") + "{{ m(%s) }}" % expr(r)


def block(r, depth):
    return "".join(stmt(r, depth + 1) for _ in range(r.randint(1, 3)))


VARS = {"msgs": [{"role": "system", "content": " Be brief. "}, {"role": "user", "content": "Hi \u00e9"},
                 {"role": "assistant", "content": "Hello"}],
        "d": {"k": "v", "n": 2, "l": [1, None]}, "s": " h\u00e9llo world ", "n": 7, "f": 1.5,
        "l": [3, "a", None, 2.0, [1]]}


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    seed = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    r = random.Random(seed)
    env = make_env()
    cases = []
    for _ in range(count):
        t = "{% set ns = namespace(c=0) %}{% set loop_ix = 1 %}{% set i = 2 %}" + "".join(stmt(r) for _ in range(r.randint(1, 4)))
        cases.append(t)
    req = {"messages": [], "chat_template_kwargs": VARS}
    inp = "".join(json.dumps({"template": t, "request": req}) + "\n" for t in cases)
    out = subprocess.run([build + "/tests/chat/jinja_render_tool"], input=inp.encode(), capture_output=True, check=True)
    ours = [json.loads(x) for x in out.stdout.decode().splitlines()]
    bad = 0
    for t, o in zip(cases, ours):
        try:
            tm = env.from_string(t)
        except Exception as e:
            want = {"error": "parse: " + str(e)}
        else:
            try:
                want = {"text": tm.render(messages=[], tools=None, documents=None, add_generation_prompt=False, **__import__('copy').deepcopy(VARS))}
            except Exception as e:
                want = {"error": "%s: %s" % (type(e).__name__, e)}
        if "text" in want and "text" in o:  # CPython prints addresses in reprs
            want["text"] = re.sub(r" at 0x[0-9a-f]+>", " at 0x7f0000000000>", want["text"])
        same = ("text" in want and o.get("text") == want["text"]) or ("error" in want and "error" in o and
                                                                       want["error"].startswith("parse") == o["error"].startswith("parse"))
        if not same:
            bad += 1
            if bad <= int(__import__("os").environ.get("SHOW", "15")):
                print("TEMPLATE:", repr(t)[:int(__import__("os").environ.get("TLEN", "100000"))])
                print("  jinja2:", repr(want)[:400])
                print("  ours:  ", repr(o)[:400])
    print("%d cases, %d differ" % (len(cases), bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
