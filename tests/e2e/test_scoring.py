#!/usr/bin/env python3
"""Scoring end to end (suite e2e), stdlib only: `pagedgen perplexity` and
the worked multiple-choice evaluation of samples/.

usage: test_scoring.py PAGEDGEN CASE

Cases:
  perplexity        stories260K over samples/story.txt at --ctx 128 against
                    (1) the same windows sent as plain prompt_logprobs requests
                    through `pagedgen generate --prompt-logprobs-per-step` (the
                    one-row-a-step path: the same float logprobs, summed here in
                    Python), (2) a numpy float64 forward (tests/e2e/
                    ppl_reference.py, run by /usr/bin/python3 when it has numpy;
                    said so when not), and (3) itself over batch sizes and a tiny
                    KV pool (the same bytes of output).
  perplexity_llama  against llama.cpp's llama-perplexity given by
                    $PAGEDGEN_LLAMA_PERPLEXITY (stories260K written as F32 GGUF by
                    bench/hf_to_gguf.py): within 0.1%; skipped (exit 77, with the
                    reason) when the variable is not set.
  perplexity_errors a text shorter than two windows, a missing -f: usage errors.
  mc_sample         samples/mc_stories.jsonl is what samples/mc_accuracy.py makes
                    of samples/mc_stories.questions.jsonl; the command of
                    samples/README.md scores it; mc_accuracy.py's choice scores
                    equal sums of the records' prompt_logprobs past the context's
                    tokens (`pagedgen tokenize`), and its accuracy follows; the
                    output is byte-identical with --prompt-logprobs-per-step.

Test data: $PAGEDGEN_SHARED/models/stories260K (skipped without it, failed in CI).
"""
import json
import math
import os
import re
import subprocess
import sys
import tempfile

SHARED = os.environ.get("PAGEDGEN_SHARED", "")
SRC = os.environ.get("PAGEDGEN_SOURCE_ROOT",
                     os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
MODEL = os.path.join(SHARED, "models", "stories260K")
TEXT = os.path.join(SRC, "samples", "story.txt")
HERE = os.path.dirname(os.path.abspath(__file__))
CTX = 128
EXE = None


class Fail(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Fail(msg)


def run(args, stdin_bytes=None, timeout=300):
    p = subprocess.run([EXE] + args, input=stdin_bytes, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=timeout)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


def perplexity(flags=()):
    rc, out, err = run(["perplexity", "-m", MODEL, "-f", TEXT, "--ctx", str(CTX)] + list(flags))
    check(rc == 0, f"perplexity {flags}: exit {rc}: {err[-600:]}")
    lines = out.splitlines()
    check(len(lines) == 1, f"expected one JSON line on stdout, got {lines}")
    return json.loads(lines[0]), err


def windows():
    """llama.cpp's windows: the text tokenized once with BOS, cut into
    len // CTX windows of CTX, each window's first token replaced by BOS."""
    rc, out, err = run(["tokenize", "--tokenizer", MODEL, "--input-format", "jsonl"],
                       stdin_bytes=(json.dumps({"text": open(TEXT, encoding="utf-8").read()}) + "\n").encode())
    check(rc == 0, f"tokenize: {err}")
    ids = json.loads(out)["ids"]
    check(ids[0] == 1, "stories260K's tokenizer adds BOS (id 1)")
    n = len(ids) // CTX
    check(n >= 2, f"the text gives {len(ids)} tokens: fewer than 2 windows of {CTX}")
    return [[1] + ids[i * CTX + 1:(i + 1) * CTX] for i in range(n)]


def case_perplexity():
    got, err = perplexity()
    print(f"  pagedgen perplexity: {got}")
    wins = windows()
    first = CTX // 2
    check(got["windows"] == len(wins) and got["ctx"] == CTX, f"windows/ctx: {got}")
    check(got["tokens_scored"] == len(wins) * (CTX - first - 1), f"tokens_scored {got['tokens_scored']}")
    check("Final estimate: PPL = " in err and "windows" in err, f"stderr: {err[-400:]}")
    # (1) the engine's prompt logprobs of the same windows, one row a step
    reqs = "".join(json.dumps({"id": i, "prompt_token_ids": w, "max_tokens": 1, "temperature": 0,
                               "prompt_logprobs": 0}) + "\n" for i, w in enumerate(wins))
    rc, out, e2 = run(["-m", MODEL, "-q", "--prompt-logprobs-per-step"], stdin_bytes=reqs.encode())
    check(rc == 0, f"generate: exit {rc}: {e2[-400:]}")
    recs = sorted((json.loads(l) for l in out.splitlines()), key=lambda r: r["id"])
    nll = nll2 = 0.0
    count = 0
    for r, w in zip(recs, wins):
        s = s2 = 0.0
        for p in range(first + 1, CTX):
            entry = r["prompt_logprobs"][p]
            check(entry[0][0] == w[p], f"window {r['id']} position {p}: entry for {entry[0][0]}, token {w[p]}")
            v = -entry[0][1]
            s += v
            s2 += v * v
            count += 1
        nll += s
        nll2 += s2
    av = nll / count
    ppl = math.exp(av)
    se = math.sqrt((nll2 / count - av * av) / (count - 1)) * ppl
    print(f"  from generate's prompt_logprobs: ppl {ppl:.6f} +/- {se:.6f} over {count} tokens")
    check(count == got["tokens_scored"], "count")
    check(abs(got["ppl"] - ppl) <= 2e-6 * ppl, f"ppl {got['ppl']} vs {ppl} from prompt_logprobs")
    check(abs(got["ppl_stderr"] - se) <= 1e-5 * se, f"stderr {got['ppl_stderr']} vs {se}")
    # (2) numpy float64
    ref = None
    try:
        import_ok = subprocess.run(["/usr/bin/python3", "-c", "import numpy"], stderr=subprocess.DEVNULL).returncode == 0
    except OSError:
        import_ok = False
    if import_ok:
        with tempfile.TemporaryDirectory() as td:
            spec = os.path.join(td, "windows.json")
            with open(spec, "w") as f:
                json.dump({"windows": wins, "first": first}, f)
            p = subprocess.run(["/usr/bin/python3", os.path.join(HERE, "ppl_reference.py"), MODEL, spec],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=600)
            check(p.returncode == 0, f"ppl_reference.py: {p.stderr.decode()[-600:]}")
            ref = json.loads(p.stdout)
        print(f"  numpy float64 reference: {ref}")
        check(ref["count"] == count, "reference count")
        check(abs(got["ppl"] - ref["ppl"]) <= 1e-4 * ref["ppl"], f"ppl {got['ppl']} vs float64 {ref['ppl']}")
        check(abs(got["ppl_stderr"] - ref["ppl_stderr"]) <= 1e-3 * ref["ppl_stderr"],
              f"stderr {got['ppl_stderr']} vs float64 {ref['ppl_stderr']}")
    else:
        print("  numpy float64 reference: SKIPPED (/usr/bin/python3 has no numpy)")
    # (3) batch size, KV pool, threads and the old path change no byte of the value
    for flags in (["--batch-size", "128"], ["--batch-size", "300", "--threads", "1"],
                  ["--batch-size", "512", "--num-kv-blocks", "12", "--block-size", "16"],
                  ["--prompt-logprobs-per-step", "--batch-size", "256"]):
        o, _ = perplexity(flags)
        check((o["ppl"], o["ppl_stderr"], o["nll"], o["tokens_scored"]) ==
              (got["ppl"], got["ppl_stderr"], got["nll"], got["tokens_scored"]), f"{flags}: {o} vs {got}")


def case_perplexity_llama():
    binary = os.environ.get("PAGEDGEN_LLAMA_PERPLEXITY", "")
    if not binary:
        print("skip: PAGEDGEN_LLAMA_PERPLEXITY is not set (the path of llama.cpp's llama-perplexity)")
        sys.exit(77)
    check(os.access(binary, os.X_OK), f"PAGEDGEN_LLAMA_PERPLEXITY={binary}: not an executable")
    got, _ = perplexity(["--threads", "2"])
    with tempfile.TemporaryDirectory() as td:
        gguf = os.path.join(td, "stories260K-f32.gguf")
        p = subprocess.run(["/usr/bin/python3", os.path.join(SRC, "bench", "hf_to_gguf.py"), MODEL, gguf,
                            "--type", "f32"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
        check(p.returncode == 0, f"hf_to_gguf.py: {p.stderr.decode()[-600:]}")
        # llama.cpp's asynchronous log sometimes loses its last lines at exit
        # (bench/peers.py parse_llama_perplexity): run it again, up to 3 times
        sys.path.insert(0, os.path.join(SRC, "bench"))
        import peers
        for attempt in range(3):
            p = subprocess.run([binary, "-m", gguf, "-f", TEXT, "-c", str(CTX), "-b", str(CTX), "-t", "2"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=600)
            text = p.stdout.decode() + p.stderr.decode()
            check(p.returncode == 0, f"llama-perplexity: exit {p.returncode}: {text[-800:]}")
            try:
                fig = peers.parse_llama_perplexity(text)
                break
            except ValueError as e:
                check(attempt < 2, f"llama-perplexity's output, 3 runs: {e}: {text[-800:]}")
                print(f"  llama-perplexity's output lost its last lines ({e}): again")
    lp, lse = fig["ppl"], fig["ppl_stderr"]
    rel = abs(got["ppl"] - lp) / lp
    print(f"  pagedgen {got['ppl']:.4f} +/- {got['ppl_stderr']:.5f}, llama-perplexity {lp:.4f} +/- "
          f"{'(lost)' if lse is None else f'{lse:.5f}'}: {100 * rel:.4f}% apart")
    check(rel <= 1e-3, f"ppl {got['ppl']} vs llama-perplexity {lp}: over 0.1%")


def case_perplexity_errors():
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as f:
        f.write("Once upon a time.\n")
        f.flush()
        rc, out, err = run(["perplexity", "-m", MODEL, "-f", f.name, "--ctx", "128"])
        check(rc == 2 and out == "" and "expected at least 2 x --ctx = 256 tokens" in err, f"short text: {rc} {err}")
    rc, out, err = run(["perplexity", "-m", MODEL])
    check(rc == 2 and "-f TEXT" in err, f"no -f: {rc} {err}")
    rc, out, err = run(["perplexity", "-m", MODEL, "-f", TEXT, "--ctx", "1000"])
    check(rc == 2 and "max_position_embeddings" in err, f"--ctx over the model's: {rc} {err}")


def case_mc_sample():
    samples = os.path.join(SRC, "samples")
    questions = os.path.join(samples, "mc_stories.questions.jsonl")
    script = os.path.join(samples, "mc_accuracy.py")
    p = subprocess.run([sys.executable, script, "requests", questions], stdout=subprocess.PIPE, timeout=60)
    check(p.returncode == 0, "mc_accuracy.py requests")
    with open(os.path.join(samples, "mc_stories.jsonl"), "rb") as f:
        check(f.read() == p.stdout, "samples/mc_stories.jsonl is not what mc_accuracy.py requests writes: "
              "regenerate it (samples/README.md)")
    with tempfile.TemporaryDirectory() as td:
        outs = []
        for flags in ([], ["--prompt-logprobs-per-step", "--max-num-batched-tokens", "64"]):
            out = os.path.join(td, f"out{len(outs)}.jsonl")
            rc, _, err = run(["-m", MODEL, "-q", "-i", os.path.join(samples, "mc_stories.jsonl"), "-o", out] + flags)
            check(rc == 0, f"pagedgen {flags}: exit {rc}: {err[-400:]}")
            outs.append(out)
        with open(outs[0], "rb") as a, open(outs[1], "rb") as b:
            check(a.read() == b.read(), "the output differs with --prompt-logprobs-per-step")
        p = subprocess.run([sys.executable, script, "score", questions, outs[0]], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=60)
        check(p.returncode == 0, f"mc_accuracy.py score: {p.stderr.decode()[-400:]}")
        res = json.loads(p.stdout)
        recs = {}
        with open(outs[0], encoding="utf-8") as f:
            for line in f:
                r = json.loads(line)
                recs[r["custom_id"]] = r
    qs = [json.loads(l) for l in open(questions, encoding="utf-8")]
    check(res["questions"] == len(qs) == len(res["per_question"]), f"questions: {res['questions']}")
    # independent: the context's token count from `pagedgen tokenize`, the
    # continuation's logprobs from the vLLM-style prompt_logprobs field
    lines = "".join(json.dumps({"text": q["context"]}) + "\n" for q in qs)
    rc, out, err = run(["tokenize", "--tokenizer", MODEL, "--input-format", "jsonl"], stdin_bytes=lines.encode())
    check(rc == 0, f"tokenize: {err}")
    ctx_len = [json.loads(l)["count"] for l in out.splitlines()]
    correct = 0
    for q, pq, n_ctx in zip(qs, res["per_question"], ctx_len):
        mine = []
        for k in range(len(q["choices"])):
            plp = recs[f"{q['id']}/{k}"]["response"]["body"]["choices"][0]["prompt_logprobs"]
            total = 0.0
            for entry in plp[n_ctx:]:
                tok_id = next(iter(entry))  # the prompt token's own key comes first (cli/README)
                total += entry[tok_id]["logprob"]
            mine.append(total)
        for a, b in zip(mine, pq["logprobs"]):
            check(abs(a - b) <= 2e-5, f"{q['id']}: choice logprob {b} vs {a} from prompt_logprobs")
        correct += max(range(len(mine)), key=lambda k: (mine[k], -k)) == q["answer"]
    check(abs(res["acc"] - correct / len(qs)) < 1e-12, f"acc {res['acc']} vs {correct}/{len(qs)}")
    print(f"  stories260K: acc {res['acc']:.3f}, acc_norm {res['acc_norm']:.3f} over {len(qs)} questions")
    check(res["acc"] >= 0.75, f"acc {res['acc']}: the sample's questions are easy for stories260K (0.917)")


def main():
    global EXE
    EXE = os.path.abspath(sys.argv[1])
    case = sys.argv[2]
    if not os.path.isdir(MODEL):
        if os.environ.get("CI") == "true":
            print(f"no test data at {MODEL} in CI")
            return 1
        print(f"skip: no test data at {MODEL} (set PAGEDGEN_SHARED)")
        return 77
    try:
        globals()["case_" + case]()
    except Fail as e:
        print(f"FAIL [{case}]: {e}")
        return 1
    print(f"ok [{case}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
