#!/usr/bin/env python3
"""Differential tests of structured/grammar against independent references
(suite e2e), stdlib only.

usage: test_grammar_diff.py GRAMMAR_DRIVER CASE [SEED [COUNT]]

  regex   random regexes of the supported subset vs Python's re.fullmatch
          (re.ASCII: \\d \\w \\s are ASCII, as ECMA-262 / JSON Schema);
  schema  random schemas of the supported subset and random JSON values
          (mostly near-valid) vs the validator of test_structured.py: the
          automaton accepts the compact text iff the value validates.
"""
import json
import os
import random
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_structured as T  # noqa: E402  (its validator)

GRAMMAR_JSON_SCHEMA, GRAMMAR_REGEX = 1, 3


class Driver:
    def __init__(self, exe):
        self.p = subprocess.Popen([exe], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def run(self, kind, src, cands):
        self.p.stdin.write(f"{kind}\t{json.dumps(src)}" + "".join("\t" + json.dumps(c) for c in cands) + "\n")
        self.p.stdin.flush()
        return self.p.stdout.readline().rstrip("\n")


# ---- regex ---------------------------------------------------------------------
ALPH = "abc01 é-."


def re_atom(rng, d):
    r = rng.random()
    if d > 2 or r < 0.4:
        c = rng.choice(ALPH)
        return re.escape(c) if c in ".-" else c
    if r < 0.55:
        return rng.choice([r"\d", r"\w", r"\s", ".", r"\D", r"\W", r"\S"])
    if r < 0.7:
        items = []
        for _ in range(rng.randint(1, 3)):
            if rng.random() < 0.5:
                a, b = sorted(rng.sample("abc01", 2))
                items.append(f"{a}-{b}")
            else:
                items.append(rng.choice(["a", "b", "é", r"\d", "1"]))
        return "[" + ("^" if rng.random() < 0.3 else "") + "".join(items) + "]"
    return "(" + ("?:" if rng.random() < 0.3 else "") + re_alt(rng, d + 1) + ")"


def re_quant(rng, a):
    # star height 1: a group holding a quantifier only gets ? or {2}, which
    # keeps Python's backtracking polynomial on short strings
    nested = a.startswith("(") and any(q in a for q in "*+?{")
    r = rng.random()
    if r < 0.55:
        return a
    if nested:
        return a + rng.choice(["?", "{2}"])
    return a + rng.choice(["?", "*", "+", "{2}", "{1,3}", "{0,2}", "{2,}"])


def re_alt(rng, d):
    return "|".join("".join(re_quant(rng, re_atom(rng, d)) for _ in range(rng.randint(1, 3)))
                    for _ in range(rng.randint(1, 2 if d else 3)))


def case_regex(drv, seed, count):
    rng = random.Random(seed)
    checked = 0
    for _ in range(count):
        rx = re_alt(rng, 0)
        try:
            cre = re.compile(rx, re.ASCII)
        except re.error:
            continue
        cands = ["".join(rng.choice("abc01 é-.\n_x") for _ in range(rng.randint(0, 6))) for _ in range(30)]
        out = drv.run(GRAMMAR_REGEX, rx, cands)
        if out.startswith("E"):
            if "too large" in out or "too complex" in out:
                continue
            raise T.Fail(f"regex {rx!r}: {out}")
        for s, bit in zip(cands, out):
            checked += 1
            if (cre.fullmatch(s) is not None) != (bit == "1"):
                raise T.Fail(f"regex {rx!r} on {s!r}: re says {cre.fullmatch(s) is not None}, grammar {bit}")
    return checked


# ---- schema --------------------------------------------------------------------
CH = "ab é\"\\\n0"


def rstr(rng):
    return "".join(rng.choice(CH) for _ in range(rng.randint(0, 4)))


def gen_schema(rng, d):
    r = rng.random() * (0.5 if d > 2 else 1.0)
    if r < 0.1:
        s = {"type": "integer"}
        if rng.random() < .5:
            s["minimum"] = rng.randint(-20, 5)
        if rng.random() < .5:
            s["maximum"] = rng.randint(5, 200)
        return s
    if r < 0.15:
        return {"type": "number"}
    if r < 0.2:
        return {"type": rng.choice(["boolean", "null"])}
    if r < 0.3:
        s = {"type": "string"}
        if rng.random() < .5:
            s["maxLength"] = rng.randint(0, 4)
        if rng.random() < .3:
            s["minLength"] = min(rng.randint(0, 2), s.get("maxLength", 2))
        return s
    if r < 0.35:
        return {"type": "string", "pattern": rng.choice(["[ab]+", "a?b{1,2}", "\\d{2}", "(a|é)\"?"])}
    if r < 0.4:
        return {"enum": rng.sample(["x", 1, None, True, "é\"", [1, 2], {"k": "v"}], rng.randint(1, 3))}
    if r < 0.45:
        return {"const": rng.choice(["c", 7, False])}
    if r < 0.5:
        return {}
    if r < 0.65:
        s = {"type": "array", "items": gen_schema(rng, d + 1)}
        if rng.random() < .5:
            s["maxItems"] = rng.randint(0, 3)
        if rng.random() < .3:
            s["minItems"] = min(rng.randint(0, 2), s.get("maxItems", 2))
        return s
    if r < 0.75:
        props = {f"p{i}": gen_schema(rng, d + 1) for i in range(rng.randint(1, 3))}
        s = {"type": "object", "properties": props}
        req = [k for k in props if rng.random() < .5]
        if req:
            s["required"] = req
        return s
    if r < 0.8:
        return {"type": "object", "additionalProperties": gen_schema(rng, d + 1)}
    if r < 0.9:
        return {"anyOf": [gen_schema(rng, d + 1) for _ in range(rng.randint(1, 3))]}
    return {"type": ["string", "null"], "maxLength": 2}


# around the digit bounds (16 integral / fraction / exponent digits): json.dumps
# writes 1e-07 (a leading zero in the exponent: refused), 0.30000000000000004
# (17 fraction digits: refused), 1e+16 (accepted)
LONG_INTS = [9999999999999999, -9999999999999999, 10000000000000000, -12345678901234567]
LONG_NUMBERS = LONG_INTS + [0.1 + 0.2, 0.1234567890123456, 1e16, 1.5e-300, -2.5e+100]


def gen_value(rng, s, d=0):
    if rng.random() < 0.1 or d > 4:
        return rng.choice([1, -3, 2.5, "a", "", None, True, [], {}, [1], {"p0": 1}])
    if s == {}:
        return rng.choice([1, "s", None, [1, {"a": []}], {"z": 2}])
    if "enum" in s:
        return json.loads(json.dumps(rng.choice(s["enum"])))
    if "const" in s:
        return s["const"]
    if "anyOf" in s:
        return gen_value(rng, rng.choice(s["anyOf"]), d + 1)
    t = s["type"]
    if isinstance(t, list):
        t = rng.choice(t)
    if t == "integer":
        return rng.randint(-30, 250) if rng.random() < .8 else rng.choice(LONG_INTS)
    if t == "number":
        return rng.choice([0, -1, 3.25, 1e-7, 12] + LONG_NUMBERS)
    if t == "boolean":
        return rng.choice([True, False])
    if t == "null":
        return None
    if t == "string":
        return rng.choice(["a", "ab", "bb", "12", "é\"", "b", ""]) if "pattern" in s else rstr(rng)
    if t == "array":
        return [gen_value(rng, s["items"], d + 1) for _ in range(rng.randint(0, 4))]
    if "properties" in s:
        ks = [k for k in s["properties"] if rng.random() < .7]
        if rng.random() < .1:
            rng.shuffle(ks)
        return {k: gen_value(rng, s["properties"][k], d + 1) for k in ks}
    return {rstr(rng): gen_value(rng, s["additionalProperties"], d + 1) for _ in range(rng.randint(0, 2))}


def case_schema(drv, seed, count):
    rng = random.Random(seed)
    checked = 0
    for _ in range(count):
        sch = gen_schema(rng, 0)
        vals = [gen_value(rng, sch) for _ in range(25)]
        texts = [json.dumps(v, separators=(",", ":"), ensure_ascii=False) for v in vals]
        out = drv.run(GRAMMAR_JSON_SCHEMA, json.dumps(sch), texts)
        if out.startswith("E"):
            if "empty language" in out:
                continue
            raise T.Fail(f"schema {json.dumps(sch)}: {out}")
        for v, t, bit in zip(vals, texts, out):
            checked += 1
            want = T.valid(sch, v, sch) and T.numbers_bounded(t)
            if want != (bit == "1"):
                raise T.Fail(f"schema {json.dumps(sch)} on {t}: validator {want}, grammar {bit}")
    return checked


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    seed = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    count = int(sys.argv[4]) if len(sys.argv) > 4 else 2000
    drv = Driver(os.path.abspath(sys.argv[1]))
    try:
        n = {"regex": case_regex, "schema": case_schema}[sys.argv[2]](drv, seed, count)
    except T.Fail as e:
        print(f"FAIL {sys.argv[2]}: {e}")
        sys.exit(1)
    print(f"ok {sys.argv[2]}: {n} candidates agree")


if __name__ == "__main__":
    main()
