#!/usr/bin/env python3
"""Structured outputs through the pagedgen binary (suite e2e), stdlib only.

usage: test_structured.py PAGEDGEN CASE            run one case (meson runs each)
       test_structured.py PAGEDGEN --batch N FILE  write the mixed batch of N requests
       test_structured.py PAGEDGEN --bench N [MODEL_DIR]
                                                   throughput with and without constraints

Every output is checked by a validator written here (json + re), not by the
automaton's code: it parses, matches its schema / regex / choice, and ends
with finish_reason "stop".
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time

EXE = None
SHARED = os.environ.get("PAGEDGEN_SHARED", "")
MODEL = os.path.join(SHARED, "models", "stories260K")


class Fail(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Fail(msg)


def gen(args, stdin_bytes=None, timeout=600):
    p = subprocess.run([EXE, "-m", MODEL, "-q"] + args, input=stdin_bytes, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


# ---- the validator (independent of structured/grammar) ------------------------------

FORMATS = {
    "date": r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])",
    "time": r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])",
    "uuid": r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
}
FORMATS["date-time"] = FORMATS["date"] + "T" + FORMATS["time"]


def resolve(root, ref):
    node = root
    for seg in ref[2:].split("/") if ref != "#" else []:
        seg = seg.replace("~1", "/").replace("~0", "~")
        node = node[int(seg)] if isinstance(node, list) else node[seg]
    return node


def same(a, b):
    return type(a) == type(b) and a == b if not isinstance(a, (int, float)) or isinstance(a, bool) \
        else (not isinstance(b, bool) and isinstance(b, (int, float)) and a == b)


def valid(s, v, root):
    """v (a parsed JSON value) against schema s; key order follows properties."""
    if s is True or s == {}:
        return True
    if "$ref" in s:
        return valid(resolve(root, s["$ref"]), v, root)
    if "enum" in s:
        return any(same(v, e) for e in s["enum"])
    if "const" in s:
        return same(v, s["const"])
    for k in ("anyOf", "oneOf"):
        if k in s:
            return any(valid(x, v, root) for x in s[k])
    types = s.get("type")
    if types is None:
        types = "object" if "properties" in s or "additionalProperties" in s else \
            "array" if "items" in s or "maxItems" in s else "string"
    if isinstance(types, str):
        types = [types]
    return any(valid_type(t, s, v, root) for t in types)


def valid_type(t, s, v, root):
    if t == "null":
        return v is None
    if t == "boolean":
        return isinstance(v, bool)
    if t == "integer":
        if not isinstance(v, int) or isinstance(v, bool):
            return False
        return (v >= s.get("minimum", v) and v <= s.get("maximum", v) and
                ("exclusiveMinimum" not in s or v > s["exclusiveMinimum"]) and
                ("exclusiveMaximum" not in s or v < s["exclusiveMaximum"]))
    if t == "number":
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if t == "string":
        if not isinstance(v, str):
            return False
        if "pattern" in s and not re.fullmatch(s["pattern"].lstrip("^").rstrip("$"), v):
            return False
        if "format" in s and not re.fullmatch(FORMATS[s["format"]], v):
            return False
        return s.get("minLength", 0) <= len(v) <= s.get("maxLength", 1 << 60)
    if t == "array":
        if not isinstance(v, list):
            return False
        if not s.get("minItems", 0) <= len(v) <= s.get("maxItems", 1 << 60):
            return False
        return all(valid(s.get("items", True), x, root) for x in v)
    if t == "object":
        if not isinstance(v, dict):
            return False
        props = s.get("properties")
        if not props:
            ap = s.get("additionalProperties", True)
            return ap is not False or v == {} if not isinstance(ap, dict) else \
                all(valid(ap, x, root) for x in v.values())
        names = list(props)
        keys = list(v)
        if any(k not in props for k in keys):
            return False
        if [names.index(k) for k in keys] != sorted(names.index(k) for k in keys):
            return False  # listed order
        if any(r not in v for r in s.get("required", [])):
            return False
        return all(valid(props[k], v[k], root) for k in keys)
    raise Fail(f"validator: unknown type {t}")


# The digit runs structured/grammar_schema.c allows (llama.cpp's
# json_schema_to_grammar integral-part / decimal-part): at most 16 integral
# digits, 16 fraction digits, a 16-digit exponent without leading zeros.
BOUNDED_NUMBER = re.compile(r"-?(0|[1-9][0-9]{0,15})(\.[0-9]{1,16})?([eE][+-]?(0|[1-9][0-9]{0,15}))?")


def numbers_bounded(text):
    """Every number literal in the JSON text has bounded digit runs."""
    def chk(lit):
        if not BOUNDED_NUMBER.fullmatch(lit):
            raise ValueError(lit)
        return float(lit)
    try:
        json.loads(text, parse_int=chk, parse_float=chk)
    except ValueError:
        return False
    return True


def check_compact(text):
    """No whitespace outside strings (compact mode)."""
    ins = esc = False
    for ch in text:
        if ins:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                ins = False
        elif ch == '"':
            ins = True
        elif ch in " \t\r\n":
            return False
    return True


def validate(req, out):
    """One output record against its request's constraint."""
    text = out["text"]
    if "guided_json" in req or "response_format" in req or "structured_outputs" in req:
        so = req.get("structured_outputs", {})
        if "regex" in so:
            return re.fullmatch(so["regex"], text) is not None
        if "choice" in so:
            return text in so["choice"]
        schema = req.get("guided_json", so.get("json"))
        rf = req.get("response_format")
        if rf is not None:
            schema = rf["json_schema"]["schema"] if rf["type"] == "json_schema" else {"type": "object"}
        if so.get("json_object"):
            schema = {"type": "object"}
        try:
            v = json.loads(text)
        except ValueError:
            return False
        return check_compact(text) and numbers_bounded(text) and valid(schema, v, schema)
    if "guided_regex" in req:
        return re.fullmatch(req["guided_regex"], text) is not None
    if "guided_choice" in req:
        return text in req["guided_choice"]
    raise Fail("request without a constraint")


# ---- the mixed batch ---------------------------------------------------------------

DEFS_SCHEMA = {"$defs": {"pet": {"enum": ["cat", "dog", "bird"]}}, "type": "object",
               "properties": {"pet": {"$ref": "#/$defs/pet"},
                              "tags": {"type": "array", "items": {"type": "string", "maxLength": 4},
                                       "maxItems": 2}},
               "required": ["pet"]}
CONSTRAINTS = [
    {"guided_json": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 8}, "happy": {"type": "boolean"},
        "color": {"enum": ["red", "green", "blue"]}}, "required": ["name", "happy", "color"]}},
    {"structured_outputs": {"json": {"type": "array", "items": {"type": "boolean"},
                                     "minItems": 1, "maxItems": 3}}},
    {"guided_choice": ["happy", "sad", "angry", "sleepy"]},
    {"structured_outputs": {"regex": "[A-Z][a-z]{1,8} (is|was) [a-z]{1,10}\\."}},
    {"guided_json": {"anyOf": [{"type": "null"}, {"const": "x"},
                               {"type": "string", "format": "date"}]}},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "pet", "schema": DEFS_SCHEMA,
                                                                "strict": True}}},
    {"guided_json": {"type": "string", "pattern": "^[0-9]{3}-[0-9]{4}$"}},
    {"structured_outputs": {"json": {"type": "string", "format": "uuid"}}},
    {"guided_regex": "(yes|no), because [a-z ]{0,20}"},
    {"structured_outputs": {"choice": ["A", "B", "C"]}},
    {"guided_json": {"type": "object", "properties": {
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "delta": {"type": "integer", "exclusiveMinimum": -10, "exclusiveMaximum": 10}},
        "required": ["age", "delta"]}},
    {"guided_json": {"type": "object", "properties": {
        "when": {"type": "string", "format": "date-time"}, "ok": {"type": ["boolean", "null"]},
        "n": {"enum": [1, 2, 3]}}, "required": ["when", "ok"], "additionalProperties": False}},
]
# Unbounded numbers and strings (issue 23): without digit bounds stories260K
# wrote "age":-5000000000000000... to max_tokens, and an unbounded string
# ran to max_tokens in about one request of five; the digit bounds
# (grammar_schema.c) and budgeted ends (grammar_budget.c) make every one of
# them end "stop" with valid JSON.
UNBOUNDED = [
    {"guided_json": {"type": "object", "properties": {
        "name": {"type": "string"}, "age": {"type": "integer"}, "score": {"type": "number"}},
        "required": ["name", "age", "score"]}},
    {"structured_outputs": {"json": {"type": "array", "items": {"type": "number"}, "maxItems": 4}}},
    {"guided_json": {"type": "object", "properties": {
        "n": {"type": "integer", "minimum": 0}, "m": {"type": "integer", "maximum": 0},
        "x": {"type": "number"}, "tag": {"type": "string"}}, "required": ["n", "m", "x", "tag"]}},
    {"guided_json": {"type": "string"}},
    {"response_format": {"type": "json_object"}},
]
CONSTRAINTS += UNBOUNDED
PROMPTS = ["Once upon a time", "Tom and Lily", "The little dog", "One day", "Sara saw a",
           "The sun was", "Ben wanted to", "Mom said"]


def batch_lines(n):
    lines = []
    for i in range(n):
        req = {"id": f"r{i}", "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": 256}
        if i % 3 == 0:
            req["temperature"] = 0
        else:
            req["temperature"] = 0.9
            req["seed"] = i
        req.update(CONSTRAINTS[i % len(CONSTRAINTS)])
        lines.append(json.dumps(req))
    return ("\n".join(lines) + "\n").encode()


def check_outputs(inp, out):
    reqs = [json.loads(l) for l in inp.decode().splitlines()]
    outs = [json.loads(l) for l in out.decode().splitlines()]
    check(len(outs) == len(reqs), f"{len(outs)} outputs for {len(reqs)} requests")
    for req, o in zip(reqs, outs):
        check("outputs" in o, f"{req['id']}: {o}")
        for seq in o["outputs"]:
            check(seq["finish_reason"] == "stop", f"{req['id']}: finish {seq['finish_reason']}: {seq['text']!r}")
            check(validate(req, seq), f"{req['id']}: does not validate: {seq['text']!r}")
    return outs


# ---- cases ---------------------------------------------------------------------------

def case_kinds():
    """Greedy on stories260K with one constraint of every supported kind."""
    inp = b"".join(json.dumps(dict({"id": k, "prompt": "Once upon a time", "temperature": 0,
                                    "max_tokens": 200}, **c)).encode() + b"\n"
                   for k, c in enumerate(CONSTRAINTS))
    rc, out, err = gen([], stdin_bytes=inp)
    check(rc == 0, f"exit {rc}: {err.decode()[-2000:]}")
    check_outputs(inp, out)


def case_batch():
    """The issue's done-when: 1,000 mixed requests (unbounded numbers and
    strings among them) all validate with finish "stop" at max_tokens 256;
    the first 250 of them (every constraint several times, greedy and
    sampled) give the same bytes with a tiny KV pool (constant preemption)
    and with a small batch on one thread — a request's output is a function
    of the request alone, so the shorter runs check the same property at a
    quarter of the CI time."""
    inp = batch_lines(1000)
    t0 = time.time()
    rc, out, err = gen(["--max-tokens", "256"], stdin_bytes=inp)
    t1 = time.time()
    check(rc == 0, f"exit {rc}: {err.decode()[-2000:]}")
    check_outputs(inp, out)
    n_sub = 250
    sub_in = b"".join(l + b"\n" for l in inp.splitlines()[:n_sub])
    sub_out = b"".join(l + b"\n" for l in out.splitlines()[:n_sub])
    rc, out2, err = gen(["--num-kv-blocks", "40"], stdin_bytes=sub_in)
    check(rc == 0 and out2 == sub_out, f"--num-kv-blocks 40 output differs (exit {rc})")
    rc, out3, err = gen(["--max-num-seqs", "7", "--threads", "1"], stdin_bytes=sub_in)
    check(rc == 0 and out3 == sub_out, f"--max-num-seqs 7 --threads 1 output differs (exit {rc})")
    print(f"1000 requests in {t1 - t0:.2f} s")


def case_fork():
    """n > 1: every sample validates; the same under preemption."""
    lines = []
    for i, c in enumerate(CONSTRAINTS):
        req = {"id": i, "prompt": "Lily", "n": 4, "temperature": 1.0, "seed": 7, "max_tokens": 150}
        req.update(c)
        lines.append(json.dumps(req))
    inp = ("\n".join(lines) + "\n").encode()
    rc, out, err = gen([], stdin_bytes=inp)
    check(rc == 0, f"exit {rc}: {err.decode()[-2000:]}")
    check_outputs(inp, out)
    rc, out2, err = gen(["--num-kv-blocks", "40"], stdin_bytes=inp)
    check(rc == 0 and out2 == out, "n = 4 output differs under preemption")


def case_budget():
    """Budgeted ends: unbounded schemas at a tight max_tokens (40) still end
    "stop" with valid JSON, one token short of the budget at most (room is
    kept for eos); with ignore_eos no budget applies (the text may be cut)."""
    lines = []
    for i in range(60):
        req = {"id": i, "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": 40,
               "temperature": 0 if i % 3 == 0 else 0.9, "seed": i}
        req.update(UNBOUNDED[i % len(UNBOUNDED)])
        lines.append(json.dumps(req))
    inp = ("\n".join(lines) + "\n").encode()
    rc, out, err = gen([], stdin_bytes=inp)
    check(rc == 0, f"exit {rc}: {err.decode()[-2000:]}")
    for o in check_outputs(inp, out):
        check(o["usage"]["completion_tokens"] < 40, f"{o['id']}: {o['usage']}")
    rc, out2, err = gen(["--num-kv-blocks", "40"], stdin_bytes=inp)
    check(rc == 0 and out2 == out, "budgeted output differs under preemption")
    req = dict({"id": "ie", "prompt": "Once upon a time", "max_tokens": 40, "temperature": 0,
                "ignore_eos": True}, **UNBOUNDED[3])
    rc, out, err = gen([], stdin_bytes=(json.dumps(req) + "\n").encode())
    o = json.loads(out)
    check(rc == 0 and o["outputs"][0]["finish_reason"] == "length", f"ignore_eos: {o}")


def case_errors():
    """Per-line errors name the keyword; the other lines still run."""
    bad = [
        ({"guided_json": {"type": "number", "multipleOf": 2}}, "unsupported keyword 'multipleOf'"),
        ({"guided_json": {"type": "object", "required": ["x"]}}, "empty language"),
        ({"guided_regex": "(a)\\1"}, "backreference"),
        ({"guided_regex": "(a|b)*a(a|b){24}"}, "too large"),
        ({"guided_choice": []}, "non-empty"),
        ({"guided_choice": ["a"], "guided_regex": "a"}, "only one"),
        ({"structured_outputs": {"grammar": "root ::= x"}}, "unsupported key 'grammar'"),
        ({"response_format": {"type": "xml"}}, "response_format"),
    ]
    lines = [json.dumps(dict({"id": i, "prompt": "Hi"}, **c)) for i, (c, _) in enumerate(bad)]
    lines.append(json.dumps({"id": "ok", "prompt": "Hi", "temperature": 0, "guided_choice": ["a", "b"]}))
    rc, out, err = gen([], stdin_bytes=("\n".join(lines) + "\n").encode())
    outs = [json.loads(l) for l in out.decode().splitlines()]
    check(len(outs) == len(lines), f"{len(outs)} records")
    for (c, needle), o in zip(bad, outs):
        check("error" in o and needle in o["error"]["message"], f"{c}: {o}")
    check(outs[-1]["outputs"][0]["text"] in ("a", "b"), f"ok line: {outs[-1]}")


CASES = {name[5:]: fn for name, fn in globals().items() if name.startswith("case_")}


def bench(n):
    """Throughput: the batch with constraints, then the same prompts without
    them forced to the same lengths (ignore_eos, max_tokens = the constrained
    completion length), so both generate the same number of tokens."""
    inp = batch_lines(n)
    t0 = time.time()
    rc, out, err = gen([], stdin_bytes=inp)
    t1 = time.time()
    check(rc == 0, err.decode()[-2000:])
    outs = [json.loads(l) for l in out.decode().splitlines()]
    plain = []
    for l, o in zip(inp.decode().splitlines(), outs):
        r = json.loads(l)
        for k in ("guided_json", "guided_regex", "guided_choice", "structured_outputs", "response_format"):
            r.pop(k, None)
        r["max_tokens"] = max(1, o["usage"]["completion_tokens"])
        r["ignore_eos"] = True
        plain.append(json.dumps(r))
    pinp = ("\n".join(plain) + "\n").encode()
    t2 = time.time()
    rc, pout, err = gen([], stdin_bytes=pinp)
    t3 = time.time()
    toks = sum(o["usage"]["completion_tokens"] for o in outs)
    ptoks = sum(json.loads(l)["usage"]["completion_tokens"] for l in pout.decode().splitlines())
    print(f"constrained:   {toks} tokens in {t1 - t0:.2f} s = {toks / (t1 - t0):.0f} tok/s")
    print(f"unconstrained: {ptoks} tokens in {t3 - t2:.2f} s = {ptoks / (t3 - t2):.0f} tok/s")
    print(f"ratio (constrained / unconstrained throughput): {(toks / (t1 - t0)) / (ptoks / (t3 - t2)):.2f}")


def main():
    global EXE, MODEL
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    EXE = os.path.abspath(sys.argv[1])
    if not os.path.isdir(MODEL):
        if os.environ.get("CI") == "true":
            sys.exit(f"test data missing: {MODEL} (set PAGEDGEN_SHARED)")
        print(f"skip: no test data at {MODEL} (set PAGEDGEN_SHARED)")
        sys.exit(77)
    try:
        if sys.argv[2] == "--batch":
            open(sys.argv[4], "wb").write(batch_lines(int(sys.argv[3])))
            return
        if sys.argv[2] == "--bench":
            if len(sys.argv) > 4:
                MODEL = sys.argv[4]
            bench(int(sys.argv[3]))
            return
        CASES[sys.argv[2]]()
    except Fail as e:
        print(f"FAIL {sys.argv[2]}: {e}")
        sys.exit(1)
    print(f"ok {sys.argv[2]}")


if __name__ == "__main__":
    main()
