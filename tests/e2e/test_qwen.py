"""Qwen2 / Qwen3 end to end against a float64 reference (issue 22 item 3).

usage: test_qwen.py PAGEDGEN CASE

Each case writes a small synthetic checkpoint into a temporary folder with
scripts/make-synthetic-qwen (numpy), runs the pagedgen binary over a batch
of token-id prompts (greedy, ignore_eos, logprobs) and checks every
request against tests/e2e/qwen_reference.py, a float64 numpy forward of
transformers' modeling_qwen2.py / modeling_qwen3.py: the same greedy tokens
and every sampled logprob within 1e-4.

Cases:
  qwen2         Qwen2-style: q/k/v biases, untied lm_head, f32, v4 config layout
  qwen3         Qwen3-style: q/k norms, head_dim 32 != hidden 64 / 4 heads,
                tied embeddings, bf16 weights, v5 layout (rope_parameters);
                also --dtype bfloat16 storage == float32 bit for bit, and
                --quantization int8 close
  qwen2_window  a window of 5 on layer 1 of 2 only (use_sliding_window,
                max_window_layers 1): per-layer windows
  qwen3_window  a window of 5 on every layer (max_window_layers 0): the
                engine frees blocks behind it

numpy comes from /usr/bin/python3 when the python3 running this lacks it;
without numpy anywhere the case is skipped (exit 77) with a message, or
fails when CI=true.
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy_or_skip  # noqa: E402

numpy_or_skip.require("test_qwen")

HERE = os.path.dirname(os.path.abspath(__file__))
from qwen_reference import QwenReference  # noqa: E402

SRC = os.environ.get("PAGEDGEN_SOURCE_ROOT", os.path.dirname(os.path.dirname(HERE)))
GENERATOR = os.path.join(SRC, "scripts", "make-synthetic-qwen")
EXE = None
MAX_TOKENS = 10
# ragged prompts: one token, a few, longer than the window and a block
PROMPTS = [[7], [5, 17, 99, 3, 200, 41], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19],
           [250, 33, 33, 33, 128, 64, 0, 12, 77, 91, 150]]


class Fail(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Fail(msg)


def make_model(dirname, *args):
    p = subprocess.run([sys.executable, GENERATOR, dirname] + list(args), capture_output=True)
    check(p.returncode == 0, f"make-synthetic-qwen {args}: {p.stderr.decode()[-1000:]}")


def run(model, flags=()):
    """the records of PROMPTS, in order"""
    lines = "".join(json.dumps({"id": f"p{i}", "prompt_token_ids": ids, "max_tokens": MAX_TOKENS,
                                "temperature": 0, "ignore_eos": True, "logprobs": 1}) + "\n"
                    for i, ids in enumerate(PROMPTS))
    p = subprocess.run([EXE, "-m", model, "-q", "--block-size", "4"] + list(flags), input=lines.encode(),
                       capture_output=True, timeout=300)
    check(p.returncode == 0, f"pagedgen {flags}: exit {p.returncode}: {p.stderr.decode()[-1500:]}")
    recs = {r["id"]: r for r in map(json.loads, p.stdout.decode().splitlines())}
    return [recs[f"p{i}"]["outputs"][0] for i in range(len(PROMPTS))]


def check_reference(model, outs, what, tol=1e-4):
    ref = QwenReference(model)
    worst = 0.0
    for i, (ids, o) in enumerate(zip(PROMPTS, outs)):
        want = ref.greedy(ids, MAX_TOKENS)
        got = list(zip(o["token_ids"], [lp["logprob"] for lp in o["logprobs"]]))
        check(len(got) == MAX_TOKENS, f"{what}: prompt {i}: {len(got)} tokens")
        for k, ((t, lp), (wt, wlp, margin)) in enumerate(zip(got, want)):
            check(t == wt, f"{what}: prompt {i} token {k}: got {t}, the float64 reference {wt} "
                           f"(its top-2 margin {margin:.3g})")
            worst = max(worst, abs(lp - wlp))
            check(abs(lp - wlp) <= tol, f"{what}: prompt {i} token {k}: logprob {lp}, reference {wlp:.7f}")
    print(f"{what}: {len(PROMPTS)} prompts x {MAX_TOKENS} greedy tokens equal, max |dlogprob| {worst:.2g}")


def case_qwen2():
    with tempfile.TemporaryDirectory() as d:
        make_model(d, "--preset", "tiny-qwen2", "--std", "0.25", "--seed", "3")
        check_reference(d, run(d), "qwen2")


def case_qwen3():
    with tempfile.TemporaryDirectory() as d:
        make_model(d, "--preset", "tiny-qwen3", "--std", "0.25", "--seed", "4", "--dtype", "bf16",
                   "--layout", "v5")
        f32 = run(d, ["--dtype", "float32", "--kv-cache-dtype", "f32"])
        check_reference(d, f32, "qwen3")
        # bf16 storage of a bf16 checkpoint is lossless (ARCHITECTURE.md): the same bits
        bf16 = run(d, ["--dtype", "bfloat16", "--kv-cache-dtype", "f32"])
        check(bf16 == f32, "qwen3: --dtype bfloat16 differs from float32 on a bf16 checkpoint")
        # int8 weights: the new ops on quantized projections; close, not equal
        q8 = run(d, ["--quantization", "int8", "--kv-cache-dtype", "f32"])
        gap = max(abs(a["logprob"] - b["logprob"]) for o8, o in zip(q8, f32)
                  for a, b in zip(o8["logprobs"][:1], o["logprobs"][:1]))
        print(f"qwen3 int8: first-token max |dlogprob| vs f32 {gap:.3g}")
        check(gap < 0.1, f"qwen3 int8: first-token logprob off by {gap}")


def case_qwen2_window():
    with tempfile.TemporaryDirectory() as d:
        make_model(d, "--preset", "tiny-qwen2", "--std", "0.25", "--seed", "5", "--window", "5",
                   "--max-window-layers", "1")
        outs = run(d)
        check_reference(d, outs, "qwen2 window on layer 1")
        # so that the case can fail: the window changes the reference
        ref = QwenReference(d)
        z_w = ref.logits(PROMPTS[2])[-1]
        ref.windows = [None] * ref.L
        z_f = ref.logits(PROMPTS[2])[-1]
        check(abs(z_w - z_f).max() > 1e-3, "the window does not change the logits: a weak test")


def case_qwen3_window():
    with tempfile.TemporaryDirectory() as d:
        make_model(d, "--preset", "tiny-qwen3", "--std", "0.25", "--seed", "6", "--window", "5",
                   "--max-window-layers", "0")
        check_reference(d, run(d), "qwen3 window on every layer")
        check_reference(d, run(d, ["--keep-out-of-window-blocks"]), "qwen3 window, blocks kept")


CASES = {"qwen2": case_qwen2, "qwen3": case_qwen3, "qwen2_window": case_qwen2_window,
         "qwen3_window": case_qwen3_window}


def main():
    global EXE
    if len(sys.argv) != 3 or sys.argv[2] not in CASES:
        sys.exit(__doc__)
    EXE = os.path.abspath(sys.argv[1])
    try:
        CASES[sys.argv[2]]()
    except Fail as e:
        print(f"FAIL {sys.argv[2]}: {e}")
        sys.exit(1)
    print(f"ok {sys.argv[2]}")


if __name__ == "__main__":
    main()
