#!/usr/bin/env python3
"""Process-level tests of the pagedgen binary (suite e2e), stdlib only.

usage: test_cli.py PAGEDGEN CASE          run one case (meson runs each as a test)
       test_cli.py PAGEDGEN --regen       rewrite samples/*.out.jsonl (then review the diff!)

Test data: $PAGEDGEN_SHARED (models/stories260K, goldens, tokenizers). Without
it the case is skipped (exit 77), or fails when CI=true.
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

EXE = None
SHARED = os.environ.get("PAGEDGEN_SHARED", "")
SRC = os.environ.get("PAGEDGEN_SOURCE_ROOT",
                     os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
MODEL = os.path.join(SHARED, "models", "stories260K")
SAMPLES = os.path.join(SRC, "samples")

# Each sample: input, expected output, extra flags, expected exit code.
# (samples/README.md lists the same commands.)
SAMPLE_RUNS = [
    ("prompts.txt", "prompts.txt.out.jsonl", ["--max-tokens", "48"], 0),
    ("prompts.jsonl", "prompts.jsonl.out.jsonl", [], 0),
    ("batch_openai.jsonl", "batch_openai.out.jsonl", [], 0),
    ("bad_lines.jsonl", "bad_lines.out.jsonl", [], 1),
]


class Fail(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Fail(msg)


def run(args, stdin_bytes=None, timeout=300):
    p = subprocess.run([EXE] + args, input=stdin_bytes, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def gen(args, **kw):
    return run(["-m", MODEL, "-q"] + args, **kw)


def lines_of(data):
    check(data == b"" or data.endswith(b"\n"), "output does not end with a newline")
    out = data.decode("utf-8").split("\n")[:-1] if data else []
    for l in out:
        json.loads(l)  # every line is one whole JSON value
    return out


# ---- cases -------------------------------------------------------------------

def case_samples():
    """Every sample reproduces its expected output byte for byte."""
    for inp, exp, flags, code in SAMPLE_RUNS:
        rc, out, err = gen(["-i", os.path.join(SAMPLES, inp)] + flags)
        check(rc == code, f"{inp}: exit {rc}, expected {code}: {err.decode()[-2000:]}")
        want = open(os.path.join(SAMPLES, exp), "rb").read()
        if out != want:
            a, b = out.decode().split("\n"), want.decode().split("\n")
            for k, (x, y) in enumerate(zip(a, b)):
                if x != y:
                    raise Fail(f"{inp}: line {k + 1} differs:\n got  {x[:400]}\n want {y[:400]}")
            raise Fail(f"{inp}: {len(a)} lines, expected {len(b)}")


def case_stdin():
    """`cat samples/prompts.jsonl | pagedgen -m stories260K` works as a filter,
    and the output does not depend on the pool size (constant preemption) or
    on --unordered (same records)."""
    data = open(os.path.join(SAMPLES, "prompts.jsonl"), "rb").read()
    want = open(os.path.join(SAMPLES, "prompts.jsonl.out.jsonl"), "rb").read()
    rc, out, err = gen([], stdin_bytes=data)
    check(rc == 0, f"exit {rc}: {err.decode()[-2000:]}")
    check(out == want, "stdin output differs from samples/prompts.jsonl.out.jsonl")
    rc, out, err = gen(["--num-kv-blocks", "40", "--max-num-seqs", "8", "--block-size", "16",
                        "--max-num-batched-tokens", "64"], stdin_bytes=data)
    check(rc == 0, f"small pool: exit {rc}: {err.decode()[-2000:]}")
    check(out == want, "output with a tiny KV pool (preemption) differs")
    rc, out, err = gen(["--unordered", "--max-num-seqs", "3"], stdin_bytes=data)
    check(rc == 0, f"unordered: exit {rc}")
    check(sorted(lines_of(out)) == sorted(lines_of(want)), "--unordered records differ")


def case_goldens():
    """Greedy completions through the CLI equal llama2.c's (goldens)."""
    gold = [json.loads(l) for l in open(os.path.join(SHARED, "goldens", "stories260K-greedy.jsonl"))]
    req = "".join(json.dumps({"id": i, "prompt_token_ids": g["prompt_token_ids"],
                              "max_tokens": g["max_new_tokens"], "temperature": 0}) + "\n"
                  for i, g in enumerate(gold))
    rc, out, err = gen(["--include-prompt"], stdin_bytes=req.encode())
    check(rc == 0, f"exit {rc}: {err.decode()[-2000:]}")
    recs = [json.loads(l) for l in lines_of(out)]
    check(len(recs) == len(gold), f"{len(recs)} records for {len(gold)} prompts")
    for g, r in zip(gold, recs):
        o = r["outputs"][0]
        check(o["token_ids"] == g["completion_token_ids"], f"prompt {g['prompt']!r}: token ids differ")
        check(o["text"] == g["completion_text"], f"prompt {g['prompt']!r}: text differs")
        check(o["finish_reason"] == g["finish_reason"], f"prompt {g['prompt']!r}: finish_reason")
        check(r["prompt_token_ids"] == g["prompt_token_ids"], "prompt_token_ids echoed wrong")
        check(r["usage"]["completion_tokens"] == len(g["completion_token_ids"]), "usage")
    # the same prompts as text reach the same ids (the tokenizer path)
    req = "".join(json.dumps({"id": i, "prompt": g["prompt"], "max_tokens": 8}) + "\n"
                  for i, g in enumerate(gold) if g["prompt"])
    rc, out, err = gen(["--include-prompt"], stdin_bytes=req.encode())
    check(rc == 0, f"text prompts: exit {rc}: {err.decode()[-2000:]}")
    byid = {json.loads(l)["id"]: json.loads(l) for l in lines_of(out)}
    for i, g in enumerate(gold):
        if g["prompt"]:
            check(byid[i]["prompt_token_ids"] == g["prompt_token_ids"], f"tokenization of {g['prompt']!r}")
            check(byid[i]["outputs"][0]["token_ids"] == g["completion_token_ids"][:8], "text prompt output")


def case_bad_lines():
    """A malformed-line file gives one error record per bad line, keeps going,
    exits 1; openai error records have the OpenAI shape."""
    rc, out, err = gen(["-i", os.path.join(SAMPLES, "bad_lines.jsonl")])
    check(rc == 1, f"exit {rc}, expected 1")
    recs = [json.loads(l) for l in lines_of(out)]
    src = [l for l in open(os.path.join(SAMPLES, "bad_lines.jsonl"), encoding="utf-8") if l.strip()]
    check(len(recs) == len(src), f"{len(recs)} records for {len(src)} lines")
    n_err = sum(1 for r in recs if "error" in r)
    n_ok = sum(1 for r in recs if "outputs" in r)
    check(n_ok == 2 and n_err == len(src) - 2, f"{n_ok} ok, {n_err} errors")
    for r in recs:
        if "error" in r:
            check(isinstance(r["error"]["message"], str) and r["error"]["line"] >= 1, "error shape")
    # openai: chat lines are refused per line, the rest runs
    lines = [
        {"custom_id": "a", "method": "POST", "url": "/v1/completions",
         "body": {"model": "stories260K", "prompt": "Once upon a time", "max_tokens": 5}},
        {"custom_id": "b", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "stories260K", "messages": [{"role": "user", "content": "hi"}]}},
    ]
    data = "".join(json.dumps(l) + "\n" for l in lines).encode()
    rc, out, err = gen([], stdin_bytes=data)
    check(rc == 1, f"openai: exit {rc}, expected 1")
    recs = [json.loads(l) for l in lines_of(out)]
    check(recs[0]["custom_id"] == "a" and recs[0]["error"] is None
          and recs[0]["response"]["status_code"] == 200, "openai ok record")
    body = recs[0]["response"]["body"]
    check(body["object"] == "text_completion" and body["created"] == 0 and body["model"] == "stories260K",
          "openai body")
    check(recs[1]["custom_id"] == "b" and recs[1]["response"]["status_code"] == 400
          and "chat templates are not supported yet" in recs[1]["error"]["message"], "openai chat error")


def case_exit_codes():
    rc, _, err = run(["--bogus"])
    check(rc == 2 and b"unknown option" in err, f"usage error: exit {rc}")
    rc, _, err = run(["-m", "/nonexistent/model", "-q"], stdin_bytes=b"hi\n")
    check(rc == 3, f"missing model: exit {rc}")
    rc, _, err = run(["-m", MODEL, "-q", "-i", "/nonexistent/prompts.txt"])
    check(rc == 4, f"missing input: exit {rc}")
    rc, _, err = run(["-m", MODEL, "-q", "-o", "/nonexistent/dir/out.jsonl"], stdin_bytes=b"hi\n")
    check(rc == 4, f"unwritable output: exit {rc}")
    rc, out, _ = run(["--version"])
    check(rc == 0 and out.startswith(b"pagedgen "), "--version")
    rc, out, _ = gen([], stdin_bytes=b"")
    check(rc == 0 and out == b"", "empty input")


def case_no_stdin():
    """No arguments and no usable stdin (CI): a usage error at once, never a
    wait on stdin — with stdin at EOF, and with fd 0 closed."""
    for how in ("devnull", "closed"):
        kw = {"stdin": subprocess.DEVNULL} if how == "devnull" else {"preexec_fn": lambda: os.close(0)}
        p = subprocess.run([EXE], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=20, **kw)
        check(p.returncode == 2, f"no arguments, stdin {how}: exit {p.returncode}, expected 2")
        check(b"-m MODEL_DIR is required" in p.stderr, f"stdin {how}: {p.stderr[:300]!r}")
        check(p.stdout == b"", f"stdin {how}: wrote {p.stdout[:200]!r}")


def case_device_flags():
    """The CUDA-facing flags: usage errors (exit 2) for values no device
    takes and for cpu-only combinations; the cpu path with the explicit cpu
    dtypes gives the same bytes as the sample's expected output."""
    bad = [
        (["--gpu-memory-utilization", "0"], b"--gpu-memory-utilization"),
        (["--gpu-memory-utilization", "1.5"], b"--gpu-memory-utilization"),
        (["--kv-cache-dtype", "int8"], b"--kv-cache-dtype"),
        (["--dtype", "float16"], b"--dtype"),
        (["--cuda-device", "-1"], b"--cuda-device"),
        (["--quantization", "int4"], b"--quantization: expected int8 or none"),
        (["--quantization", "int8", "--dtype", "bfloat16"], b"expected --dtype auto"),
        (["--device", "cuda", "--quantization", "int8"], b"only the cpu executor quantizes"),
        (["--device", "cuda", "--dtype", "float32", "--kv-cache-dtype", "fp16"], b"on cuda with --dtype float32"),
    ]
    for flags, msg in bad:
        rc, out, err = gen(flags, stdin_bytes=b"hi\n", timeout=60)
        check(rc == 2 and msg in err and out == b"", f"{flags}: exit {rc}, stderr {err[:300]!r}")
    # an fp16 cache runs on either device (the cpu stores it since issue 13)
    rc, out, err = gen(["--kv-cache-dtype", "fp16", "--max-tokens", "4"], stdin_bytes=b"hi\n", timeout=120)
    check(rc == 0, f"auto fp16: exit {rc}: {err[:300]!r}")
    inp, exp, flags, code = SAMPLE_RUNS[0]
    want = open(os.path.join(SAMPLES, exp), "rb").read()
    rc, out, err = gen(["-i", os.path.join(SAMPLES, inp), "--device", "cpu", "--dtype", "float32",
                        "--kv-cache-dtype", "f32", "--gpu-memory-utilization", "0.5", "--cuda-device", "1"]
                       + flags)
    check(rc == code, f"cpu with explicit dtypes: exit {rc}: {err.decode()[-1000:]}")
    check(out == want, "cpu with explicit dtypes: output differs from the sample")


def case_help():
    """--help lists every flag of the issue, with defaults."""
    gen_flags = ["--model", "--tokenizer", "--input", "--output", "--input-format", "--device",
                 "--threads", "--block-size", "--kv-cache-memory", "--num-kv-blocks",
                 "--max-num-seqs", "--max-num-batched-tokens", "--max-model-len",
                 "--no-prefix-caching", "--seed", "--kv-layout", "--max-tokens", "--temperature",
                 "--top-p", "--top-k", "--min-p", "--n", "--stop", "--ignore-eos", "--min-tokens",
                 "--presence-penalty", "--frequency-penalty", "--repetition-penalty", "--logprobs",
                 "--include-prompt", "--unordered", "--resume", "--metrics", "--quiet",
                 "--log-interval", "--shard", "--help", "--version", "--gpu-memory-utilization",
                 "--kv-cache-dtype", "--dtype", "--cuda-device", "--fast-gemm"]
    for args in (["--help"], ["generate", "--help"], ["help"]):
        rc, out, _ = run(args)
        check(rc == 0, f"{args}: exit {rc}")
        text = out.decode()
        for f in gen_flags:
            check(f in text, f"{args}: help does not list {f}")
        check("[default: 256]" in text, "max-tokens default not stated")
        check("[default: 0.9; cuda only]" in text, "gpu-memory-utilization default not stated")
    rc, out, _ = run(["tokenize", "--help"])
    for f in ["--tokenizer", "--input", "--output", "--no-special", "--input-format"]:
        check(f in out.decode(), f"tokenize help does not list {f}")


def case_tokenize():
    """tokenize equals the Hugging Face reference ids (llama2 tokenizer)."""
    golden = os.path.join(SHARED, "goldens", "tokenize-llama2.jsonl")
    tok = os.path.join(SHARED, "tokenizers", "llama2")
    gold = [json.loads(l) for l in open(golden, encoding="utf-8")]
    for flags, key in (([], "ids"), (["--no-special"], "ids_no_special")):
        rc, out, err = run(["tokenize", "--tokenizer", tok, "-i", golden] + flags)
        check(rc == 0, f"exit {rc}: {err.decode()[-1000:]}")
        recs = [json.loads(l) for l in lines_of(out)]
        check(len(recs) == len(gold), f"{len(recs)} lines for {len(gold)}")
        bad = [k for k, (g, r) in enumerate(zip(gold, recs)) if r.get("ids") != g[key]]
        check(not bad, f"{key}: {len(bad)} lines differ, first line {bad[:1]}: {gold[bad[0]]['text']!r}"
              if bad else "")
        check(all(r["count"] == len(r["ids"]) for r in recs), "count")
    # plain text lines, from stdin, in order
    rc, out, _ = run(["tokenize", "--tokenizer", tok], stdin_bytes=b"Hello world\n\nfoo\n")
    recs = [json.loads(l) for l in lines_of(out)]
    check(rc == 0 and len(recs) == 2, "text lines")
    check(recs[0]["ids"] == [1, 15043, 3186], f"'Hello world' -> {recs[0]['ids']}")


def resume_input(path):
    """240 requests: mixed lengths, greedy and sampled, two bad lines."""
    prompts = ["Once upon a time", "Tom and his dog", "She said", "The little bird", "Lily went to"]
    with open(path, "w") as f:
        for i in range(240):
            if i == 37:
                f.write('{"id": "bad-json", "prompt": \n')
                continue
            if i == 91:
                f.write(json.dumps({"id": f"r{i}", "prompt": "x", "top_p": 0}) + "\n")
                continue
            r = {"id": f"r{i}", "prompt": prompts[i % 5] + " " * (i % 3), "max_tokens": 16 + (i * 7) % 48,
                 "ignore_eos": True}
            if i % 4 == 1:
                r["temperature"] = 0.9
            f.write(json.dumps(r) + "\n")


RESUME_FLAGS = ["--max-num-seqs", "2", "--max-num-batched-tokens", "64"]


def count_lines(path):
    try:
        with open(path, "rb") as f:
            return f.read().count(b"\n")
    except FileNotFoundError:
        return 0


def start_and_kill(inp, out, at_lines, sig, extra):
    """Starts a run, sends `sig` once `out` holds at least at_lines lines.
    Returns (exit code, whether the process was still running when signalled)."""
    p = subprocess.Popen([EXE, "-m", MODEL, "-q", "-i", inp, "-o", out] + RESUME_FLAGS + extra,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while p.poll() is None and count_lines(out) < at_lines and time.time() < deadline:
        time.sleep(0.002)
    alive = p.poll() is None
    if alive:
        p.send_signal(sig)
    _, err = p.communicate(timeout=120)
    return p.returncode, alive, err


def case_resume():
    """SIGKILL at several points, a torn last line, SIGINT; --resume finishes
    the file, which then holds every request exactly once, equal to an
    uninterrupted run's records."""
    with tempfile.TemporaryDirectory() as tmp:
        inp = os.path.join(tmp, "in.jsonl")
        resume_input(inp)
        ref = os.path.join(tmp, "ref.jsonl")
        rc, _, err = run(["-m", MODEL, "-q", "-i", inp, "-o", ref] + RESUME_FLAGS)
        check(rc == 1, f"reference run: exit {rc}: {err.decode()[-1000:]}")
        want = sorted(lines_of(open(ref, "rb").read()))
        check(len(want) == 240, f"reference has {len(want)} records")

        out = os.path.join(tmp, "out.jsonl")
        killed = 0
        for k, at in enumerate([5, 50, 110, 180]):
            rc, alive, err = start_and_kill(inp, out, at, signal.SIGKILL, ["--resume"] if k else [])
            killed += alive
            if k == 1:
                # a torn write, as a kill in the middle of write() would leave
                with open(out, "ab") as f:
                    f.write(b'{"id":"r200","outputs":[{"index":0,"te')
        check(killed >= 3, f"only {killed} of 4 runs were still going when killed (too fast?)")
        rc, _, err = run(["-m", MODEL, "-i", inp, "-o", out, "--resume"] + RESUME_FLAGS)
        check(rc == 1, f"final resume: exit {rc}: {err.decode()[-1000:]}")
        got = sorted(lines_of(open(out, "rb").read()))
        check(got == want, f"resumed file differs: {len(got)} records vs {len(want)}; "
              f"extra {sorted(set(got) - set(want))[:1]}, missing {sorted(set(want) - set(got))[:1]}")
        # resuming a complete file adds nothing
        rc, _, _ = run(["-m", MODEL, "-q", "-i", inp, "-o", out, "--resume"] + RESUME_FLAGS)
        check(sorted(lines_of(open(out, "rb").read())) == want, "second resume changed the file")

        # SIGINT: exit 130, only whole lines, then resume completes it
        out2 = os.path.join(tmp, "out2.jsonl")
        rc, alive, err = start_and_kill(inp, out2, 20, signal.SIGINT, [])
        check(alive, "the SIGINT run finished before it could be interrupted")
        check(rc == 130, f"SIGINT: exit {rc}, expected 130: {err.decode()[-500:]}")
        data = open(out2, "rb").read()
        check(data.endswith(b"\n"), "SIGINT left a partial line")
        lines_of(data)
        rc, _, _ = run(["-m", MODEL, "-q", "-i", inp, "-o", out2, "--resume"] + RESUME_FLAGS)
        check(sorted(lines_of(open(out2, "rb").read())) == want, "SIGINT + resume differs")


def case_shard():
    """The union of --shard 0/3, 1/3, 2/3 equals one run."""
    with tempfile.TemporaryDirectory() as tmp:
        inp = os.path.join(tmp, "in.jsonl")
        resume_input(inp)
        rc, out, _ = gen(["-i", inp])
        check(rc == 1, f"single run: exit {rc}")
        want = sorted(lines_of(out))
        got = []
        for k in range(3):
            rc, out, _ = gen(["-i", inp, "--shard", f"{k}/3"])
            check(rc in (0, 1), f"shard {k}: exit {rc}")
            got += lines_of(out)
        check(sorted(got) == want, f"shard union: {len(got)} records vs {len(want)}")


def case_progress():
    """stderr: the KV/concurrency banner, periodic log lines off a TTY, the
    summary; nothing with --quiet. --metrics adds per-request timings."""
    req = "".join(json.dumps({"prompt": "Once upon a time", "max_tokens": 48, "ignore_eos": True}) + "\n"
                  for _ in range(200)).encode()
    rc, out, err = run(["-m", MODEL, "--log-interval", "0.05", "--max-num-seqs", "4", "--metrics"],
                       stdin_bytes=req)
    text = err.decode()
    check(rc == 0, f"exit {rc}")
    check("Maximum concurrency for 512 tokens per request:" in text, "no concurrency line")
    check("KV cache:" in text and "blocks of 16 tokens" in text, "no KV line")
    check(text.count("/? requests") >= 2, "no periodic progress lines on a non-TTY stderr")
    for w in ("200 requests ok", "prefix cache:", "preemptions", "gen tok/s", "utilization"):
        check(w in text, f"summary lacks {w!r}")
    recs = [json.loads(l) for l in lines_of(out)]
    m = recs[0]["metrics"]
    check(all(k in m for k in ("queue_ms", "first_token_ms", "total_ms", "preemptions")), "metrics keys")
    check(m["total_ms"] >= m["first_token_ms"] >= 0, "metrics values")
    three = b"".join(req.splitlines(keepends=True)[:3])
    rc, out, err = gen([], stdin_bytes=three)
    check(rc == 0 and len(lines_of(out)) == 3, f"--quiet run: exit {rc}")
    check(err == b"", f"--quiet printed {err[:200]!r}")


CASES = {name[5:]: fn for name, fn in globals().items() if name.startswith("case_")}


def regen():
    for inp, exp, flags, code in SAMPLE_RUNS:
        rc, out, err = gen(["-i", os.path.join(SAMPLES, inp)] + flags)
        if rc != code:
            sys.exit(f"{inp}: exit {rc}, expected {code}: {err.decode()}")
        open(os.path.join(SAMPLES, exp), "wb").write(out)
        n = out.count(b"\n")
        print(f"wrote samples/{exp} ({n} lines)")


def main():
    global EXE
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    EXE = os.path.abspath(sys.argv[1])
    if not os.path.isdir(MODEL):
        if os.environ.get("CI") == "true":
            sys.exit(f"test data missing: {MODEL} (set PAGEDGEN_SHARED)")
        print(f"skip: no test data at {MODEL} (set PAGEDGEN_SHARED)")
        sys.exit(77)
    if sys.argv[2] == "--regen":
        regen()
        return
    try:
        CASES[sys.argv[2]]()
    except Fail as e:
        print(f"FAIL {sys.argv[2]}: {e}")
        sys.exit(1)
    print(f"ok {sys.argv[2]}")


if __name__ == "__main__":
    main()
