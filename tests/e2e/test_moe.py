"""Mixtures of experts end to end against a float64 reference (issue 31).

usage: test_moe.py PAGEDGEN CASE

Each case writes a small synthetic checkpoint (8 experts, hidden 64, the
hub's per-expert tensors) with scripts/make-synthetic-qwen, runs the
pagedgen binary over a batch of token-id prompts (greedy, ignore_eos,
logprobs) and checks every request against tests/e2e/moe_reference.py, a
float64 numpy forward of transformers' modeling_mixtral.py /
modeling_qwen2_moe.py / modeling_qwen3_moe.py: the same greedy tokens and
every sampled logprob within 1e-4. Then the output must be byte-identical
with --max-num-seqs 1 and 64, --threads 1 and 2, and a KV pool so small
that requests are preempted (checked in the run's own summary): a row's
experts never depend on its neighbours.

Cases:
  qwen2_moe   Qwen2-MoE: top 4 of 8, no renormalization, a shared expert
              with its sigmoid gate, q/k/v biases; f32
  qwen3_moe   Qwen3-MoE: top 2 of 8, norm_topk_prob, q/k norms, a dense
              layer among the sparse ones (mlp_only_layers [1]); bf16
              checkpoint, v5 config layout; --dtype bfloat16 storage ==
              float32 bit for bit, --quantization int8 and the
              --matmul-precision modes close and batch-invariant
  mixtral     Mixtral: top 2 of 8, always renormalized, w1/w2/w3 keys, a
              sliding window of 5 on every layer
  batch       the three with real vocabularies and tokenizers from ../shared
              (Qwen3's for the Qwen MoEs, Mistral-7B's = Mixtral's): one
              JSONL of a text completion, a token-id completion and a chat
              line each (Mixtral's tokenizer has no template: samples/
              chatml.jinja), records in input order, completions equal to
              the reference on the ids `pagedgen tokenize` gives

numpy comes from /usr/bin/python3 when the python3 running this lacks it;
without numpy anywhere the case is skipped (exit 77) with a message, or
fails when CI=true.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy_or_skip  # noqa: E402

numpy_or_skip.require("test_moe")
import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
from moe_reference import MoeReference  # noqa: E402

SRC = os.environ.get("PAGEDGEN_SOURCE_ROOT", os.path.dirname(os.path.dirname(HERE)))
GENERATOR = os.path.join(SRC, "scripts", "make-synthetic-qwen")
EXE = None
MAX_TOKENS = 10
# ragged prompts: one token, a few, longer than the window and a block
PROMPTS = [[7], [5, 17, 99, 3, 200, 41], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19],
           [250, 33, 33, 33, 128, 64, 0, 12, 77, 91, 150], [42, 42, 42, 42], [9, 8, 7, 6, 5, 4, 3, 2, 1]]


class Fail(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Fail(msg)


def make_model(dirname, *args):
    p = subprocess.run([sys.executable, GENERATOR, dirname] + list(args), capture_output=True)
    check(p.returncode == 0, f"make-synthetic-qwen {args}: {p.stderr.decode()[-1000:]}")


def run_raw(model, flags=(), quiet=True):
    lines = "".join(json.dumps({"id": f"p{i}", "prompt_token_ids": ids, "max_tokens": MAX_TOKENS,
                                "temperature": 0, "ignore_eos": True, "logprobs": 1}) + "\n"
                    for i, ids in enumerate(PROMPTS))
    cmd = [EXE, "-m", model, "--block-size", "4"] + (["-q"] if quiet else []) + list(flags)
    p = subprocess.run(cmd, input=lines.encode(), capture_output=True, timeout=300)
    check(p.returncode == 0, f"pagedgen {flags}: exit {p.returncode}: {p.stderr.decode()[-1500:]}")
    return p.stdout, p.stderr.decode()


def outputs(raw):
    """the records of PROMPTS, in order"""
    recs = {r["id"]: r for r in map(json.loads, raw.decode().splitlines())}
    return [recs[f"p{i}"]["outputs"][0] for i in range(len(PROMPTS))]


def check_reference(model, raw, what, tol=1e-4):
    ref = MoeReference(model)
    worst, outs = 0.0, outputs(raw)
    for i, (ids, o) in enumerate(zip(PROMPTS, outs)):
        want = ref.greedy(ids, MAX_TOKENS)
        got = list(zip(o["token_ids"], [lp["logprob"] for lp in o["logprobs"]]))
        check(len(got) == MAX_TOKENS, f"{what}: prompt {i}: {len(got)} tokens")
        for k, ((t, lp), (wt, wlp, margin)) in enumerate(zip(got, want)):
            check(t == wt, f"{what}: prompt {i} token {k}: got {t}, the float64 reference {wt} "
                           f"(its top-2 margin {margin:.3g})")
            worst = max(worst, abs(lp - wlp))
            check(abs(lp - wlp) <= tol, f"{what}: prompt {i} token {k}: logprob {lp}, reference {wlp:.7f}")
    # the routing must be a real test: tokens pick different experts, and no
    # routed token sits so close to a tie between its k-th and (k+1)-th
    # expert (in router logits: log p) that float32 could legitimately pick
    # the other one
    tops = {tuple(top) for _, top, _ in ref.routes}
    gap = min(float(np.log(p[ref.k - 1]) - np.log(p[ref.k])) for _, _, p in ref.routes)
    check(len(tops) >= 4, f"{what}: only {len(tops)} distinct expert sets routed: a weak test")
    check(gap > 1e-3, f"{what}: a routed token's k-th / (k+1)-th router logits are {gap:.2g} apart")
    print(f"{what}: {len(PROMPTS)} prompts x {MAX_TOKENS} greedy tokens equal, max |dlogprob| {worst:.2g}, "
          f"{len(tops)} distinct expert sets, min top-k gap {gap:.2g}")
    return ref


def check_invariance(model, base, what, flags=(), pool_flags=()):
    """byte-identical across batch size, threads and a preempting pool"""
    flags = list(flags)
    for extra in (["--max-num-seqs", "1"], ["--max-num-seqs", "64"], ["--threads", "1"], ["--threads", "2"],
                  ["--max-num-seqs", "3", "--max-num-batched-tokens", "7"]):
        raw, _ = run_raw(model, flags + extra)
        check(raw == base, f"{what}: {' '.join(extra)} changed the output")
    # 8 blocks of 4 tokens for 6 requests of up to 29 tokens: preemption
    raw, err = run_raw(model, flags + list(pool_flags) + ["--num-kv-blocks", "10", "--max-num-seqs", "6"],
                       quiet=False)
    m = re.search(r"preemptions (\d+)", err)
    check(m is not None and int(m.group(1)) > 0, f"{what}: the small pool did not preempt: {err[-600:]}")
    check(raw == base, f"{what}: a preempting pool ({m.group(1)} preemptions) changed the output")
    print(f"{what}: byte-identical across --max-num-seqs 1/64, --threads 1/2, chunked prefill and "
          f"{m.group(1)} preemptions")


def case_qwen2_moe():
    with tempfile.TemporaryDirectory() as d:
        make_model(d, "--preset", "tiny-qwen2-moe", "--std", "0.25", "--seed", "21")
        base, _ = run_raw(d)
        ref = check_reference(d, base, "qwen2_moe")
        check(ref.qkv_bias and not ref.norm_topk and "model.layers.0.mlp.shared_expert_gate.weight" in ref.w,
              "qwen2_moe: the checkpoint lacks the features under test")
        check_invariance(d, base, "qwen2_moe")


def case_qwen3_moe():
    with tempfile.TemporaryDirectory() as d:
        make_model(d, "--preset", "tiny-qwen3-moe", "--std", "0.25", "--seed", "22", "--dtype", "bf16",
                   "--layout", "v5", "--mlp-only-layers", "1")
        f32 = ["--dtype", "float32", "--kv-cache-dtype", "f32"]
        base, _ = run_raw(d, f32)
        ref = check_reference(d, base, "qwen3_moe")
        check(ref.sparse == [True, False, True] and ref.norm_topk, "qwen3_moe: layers / norm_topk_prob")
        check_invariance(d, base, "qwen3_moe", f32)
        # bf16 storage of a bf16 checkpoint is lossless (ARCHITECTURE.md): the same bits
        bf16, _ = run_raw(d, ["--dtype", "bfloat16", "--kv-cache-dtype", "f32"])
        check(bf16 == base, "qwen3_moe: --dtype bfloat16 differs from float32 on a bf16 checkpoint")
        # int8 experts and the arithmetic modes: close to f32 (looser than
        # the dense qwen3 case's 0.1: rounding the router can move a token
        # to another expert), and each reproduces itself across batch sizes
        for what, flags in (("int8", ["--quantization", "int8", "--kv-cache-dtype", "f32"]),
                            ("matmul bf16", ["--dtype", "bfloat16", "--matmul-precision", "bf16",
                                             "--kv-cache-dtype", "f32"]),
                            ("matmul int8", ["--quantization", "int8", "--matmul-precision", "int8",
                                             "--kv-cache-dtype", "f32"])):
            raw, _ = run_raw(d, flags)
            gap = max(abs(a["logprobs"][0]["logprob"] - b["logprobs"][0]["logprob"])
                      for a, b in zip(outputs(raw), outputs(base)))
            print(f"qwen3_moe {what}: first-token max |dlogprob| vs f32 {gap:.3g}")
            check(gap < 0.3, f"qwen3_moe {what}: first-token logprob off by {gap}")
            one, _ = run_raw(d, flags + ["--max-num-seqs", "1", "--threads", "1"])
            check(one == raw, f"qwen3_moe {what}: --max-num-seqs 1 --threads 1 changed the output")


def case_mixtral():
    with tempfile.TemporaryDirectory() as d:
        make_model(d, "--preset", "tiny-mixtral", "--std", "0.25", "--seed", "23", "--window", "5")
        base, _ = run_raw(d)
        ref = check_reference(d, base, "mixtral")
        check(ref.windows == [5, 5] and ref.norm_topk, "mixtral: window / renormalization")
        # the window frees blocks behind it, so a pool that still admits
        # the longest request never runs dry: preempt with the blocks kept
        check_invariance(d, base, "mixtral", pool_flags=["--keep-out-of-window-blocks"])
        raw, _ = run_raw(d, ["--keep-out-of-window-blocks"])
        check(raw == base, "mixtral: --keep-out-of-window-blocks changed the output")


SHARED = os.environ.get("PAGEDGEN_SHARED", os.path.join(SRC, "..", "shared"))


def case_batch():
    import shutil
    for name, preset, tok, vocab, extra in (
            ("qwen2_moe", "tiny-qwen2-moe", "qwen3", 151936, []),
            ("qwen3_moe", "tiny-qwen3-moe", "qwen3", 151936, []),
            ("mixtral", "tiny-mixtral", "mistral-7b", 32000, ["--chat-template",
                                                             os.path.join(SRC, "samples", "chatml.jinja")])):
        tdir = os.path.join(SHARED, "tokenizers", tok)
        if not os.path.isfile(os.path.join(tdir, "tokenizer.json")):
            if os.environ.get("CI") == "true":
                raise Fail(f"{tdir} is missing")
            print(f"SKIP {name}: {tdir} is missing")
            continue
        with tempfile.TemporaryDirectory() as d:
            make_model(d, "--preset", preset, "--vocab", str(vocab), "--std", "0.25", "--seed", "24")
            for f in ("tokenizer.json", "tokenizer_config.json"):
                shutil.copy(os.path.join(tdir, f), d)
            text = "The café opened at 9."
            ids = [17, 400, 1234, 5, 99, 3000]
            lines = [{"id": "text", "prompt": text, "max_tokens": 6, "temperature": 0, "ignore_eos": True},
                     {"id": "ids", "prompt_token_ids": ids, "max_tokens": 6, "temperature": 0, "ignore_eos": True},
                     {"id": "chat", "messages": [{"role": "user", "content": "Give me one word."}],
                      "max_tokens": 6, "temperature": 0, "ignore_eos": True}]
            p = subprocess.run([EXE, "-m", d, "-q", "--block-size", "4"] + extra,
                               input="".join(json.dumps(x) + "\n" for x in lines).encode(),
                               capture_output=True, timeout=300)
            check(p.returncode == 0, f"{name}: exit {p.returncode}: {p.stderr.decode()[-1500:]}")
            recs = [json.loads(x) for x in p.stdout.decode().splitlines()]
            check([r.get("id") for r in recs] == ["text", "ids", "chat"], f"{name}: records {recs}")
            t = subprocess.run([EXE, "tokenize", "--tokenizer", d, "-i", "-"],
                               input=(json.dumps({"text": text}) + "\n").encode(), capture_output=True, timeout=60)
            check(t.returncode == 0, f"{name}: tokenize: {t.stderr.decode()[-500:]}")
            text_ids = json.loads(t.stdout)["ids"]
            ref = MoeReference(d)
            for rec, prompt in ((recs[0], text_ids), (recs[1], ids)):
                want = [tk for tk, _, _ in ref.greedy(prompt, 6)]
                got = rec["outputs"][0]["token_ids"]
                check(got == want, f"{name} {rec['id']}: {got}, the float64 reference {want}")
            chat = recs[2]["outputs"][0]
            check(len(chat["token_ids"]) == 6 and chat["finish_reason"] == "length", f"{name}: chat {chat}")
            print(f"{name}: text, ids and chat lines with the {tok} tokenizer; completions = reference")


CASES = {"qwen2_moe": case_qwen2_moe, "qwen3_moe": case_qwen3_moe, "mixtral": case_mixtral, "batch": case_batch}


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
