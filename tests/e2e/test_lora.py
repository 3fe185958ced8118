"""LoRA adapters end to end against a float64 reference of PEFT (issue 33).

usage: test_lora.py PAGEDGEN CASE

Four synthetic PEFT adapters (scripts/make-synthetic-lora) over one base
model, one feature each:
  a1  all seven projections, r 4, alpha 8
  a2  use_rslora (alpha / sqrt(r)), r 8, rank_pattern q_proj=2
  a3  a target subset: q_proj and v_proj only
  a4  layers_to_transform [0, 2] (stories260K) / [1] (Qwen), alpha_pattern down_proj=4
and z, a1's shapes with B = 0. One JSONL mixes every adapter (a line's
"model") with base lines (no "model", or the served name), greedy with
logprobs, --max-loras 4; each line is checked against
tests/e2e/lora_reference.py under its adapter: the same greedy tokens and
every logprob within 1e-4.

Cases:
  stories  stories260K (../shared/models): the reference; z's lines are the
           base lines' bytes; a1 merged into the weights by the reference
           (W + s B A, a checkpoint in a temp dir) agrees within 1e-4;
           byte-identical across --max-num-seqs 1/64, --threads 1/2,
           --max-loras 1 and a preempting pool (checked in the summary);
           an unknown "model" is that line's 404 record, the run goes on;
           the prefix cache: a prompt computed under a1 gives no hit to the
           same prompt under the base model or a2, and hits under a1;
           --max-lora-rank below an adapter's rank refuses it by name
  qwen     synthetic Qwen3 (q/k norms) and Qwen2 (q/k/v biases: PEFT adds
           the delta after base_layer's bias) from scripts/make-synthetic-qwen:
           the reference; an adapter on a mixture-of-experts model's MLP
           refused by name

numpy comes from /usr/bin/python3 when needed (numpy_or_skip); without it
the case is skipped (exit 77), or fails when CI=true.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy_or_skip  # noqa: E402

numpy_or_skip.require("test_lora")
import numpy as np  # noqa: E402

from lora_reference import LoraReference, write_safetensors  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.environ.get("PAGEDGEN_SOURCE_ROOT", os.path.dirname(os.path.dirname(HERE)))
SHARED = os.environ.get("PAGEDGEN_SHARED", os.path.join(SRC, "..", "shared"))
LORA_GEN = os.path.join(SRC, "scripts", "make-synthetic-lora")
QWEN_GEN = os.path.join(SRC, "scripts", "make-synthetic-qwen")
EXE = None
MAX_TOKENS = 8
PROMPTS = [[1, 5, 9, 33, 70, 201, 14], [1, 200, 2, 44, 44, 120, 9, 8, 7, 6, 5, 4, 3]]
ADAPTERS = ("a1", "a2", "a3", "a4")


class Fail(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Fail(msg)


def gen(script, *args):
    p = subprocess.run([sys.executable, script] + [str(a) for a in args], capture_output=True)
    check(p.returncode == 0, f"{os.path.basename(script)} {args}: {p.stderr.decode()[-1000:]}")


def make_adapters(base, d, layers):
    gen(LORA_GEN, base, f"{d}/a1", "--r", 4, "--alpha", 8, "--seed", 1, "--std", 0.2)
    gen(LORA_GEN, base, f"{d}/a2", "--r", 8, "--alpha", 4, "--rslora", "--rank-pattern", "q_proj=2",
        "--seed", 2, "--std", 0.2)
    gen(LORA_GEN, base, f"{d}/a3", "--r", 4, "--alpha", 8, "--targets", "q_proj,v_proj", "--seed", 3,
        "--std", 0.3)
    gen(LORA_GEN, base, f"{d}/a4", "--r", 4, "--alpha", 8, "--layers", layers, "--alpha-pattern", "down_proj=4",
        "--seed", 4, "--std", 0.2)
    gen(LORA_GEN, base, f"{d}/z", "--r", 4, "--alpha", 8, "--zero-b")
    return [a for name in ADAPTERS + ("z",) for a in ("--lora", f"{name}={d}/{name}")]


def lines_for(variants, prompts=PROMPTS):
    """(id, model or None, prompt) for every variant x prompt, interleaved"""
    out = []
    for i, ids in enumerate(prompts):
        for v in variants:
            out.append((f"{v or 'base'}-{i}", v, ids))
    return out


def run(model, lines, flags=(), quiet=True, ok_codes=(0,)):
    text = ""
    for rid, m, ids in lines:
        d = {"id": rid, "prompt_token_ids": ids, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True,
             "logprobs": 1}
        if m is not None:
            d["model"] = m
        text += json.dumps(d) + "\n"
    cmd = [EXE, "-m", model, "--block-size", "4"] + (["-q"] if quiet else []) + list(flags)
    p = subprocess.run(cmd, input=text.encode(), capture_output=True, timeout=300)
    check(p.returncode in ok_codes, f"pagedgen {flags}: exit {p.returncode}: {p.stderr.decode()[-1500:]}")
    return p.stdout, p.stderr.decode()


def records(raw):
    return {r["id"]: r for r in map(json.loads, raw.decode().splitlines())}


def check_reference(model, adir, raw, lines, what, tol=1e-4):
    ref = LoraReference(model)
    recs, worst = records(raw), 0.0
    for rid, m, ids in lines:
        name = None if m in (None, os.path.basename(model)) else m
        ref.set_adapter(os.path.join(adir, name) if name else None)
        want = ref.greedy(ids, MAX_TOKENS)
        o = recs[rid]["outputs"][0]
        got = list(zip(o["token_ids"], [lp["logprob"] for lp in o["logprobs"]]))
        check(len(got) == MAX_TOKENS, f"{what} {rid}: {len(got)} tokens")
        for k, ((t, lp), (wt, wlp, margin)) in enumerate(zip(got, want)):
            check(t == wt, f"{what} {rid} token {k}: got {t}, the float64 reference {wt} (margin {margin:.3g})")
            worst = max(worst, abs(lp - wlp))
            check(abs(lp - wlp) <= tol, f"{what} {rid} token {k}: logprob {lp}, reference {wlp:.7f}")
    # the adapters must matter: each changes its lines' tokens or logprobs
    for a in ADAPTERS:
        for i in range(len(PROMPTS)):
            x, b = recs[f"{a}-{i}"]["outputs"][0], recs[f"base-{i}"]["outputs"][0]
            check(x["token_ids"] != b["token_ids"] or
                  max(abs(p["logprob"] - q["logprob"]) for p, q in zip(x["logprobs"], b["logprobs"])) > 1e-3,
                  f"{what}: adapter {a} left prompt {i} as the base model has it: a weak test")
    print(f"{what}: {len(lines)} lines (base + {', '.join(ADAPTERS)} mixed) equal the float64 PEFT reference, "
          f"max |dlogprob| {worst:.2g}")


def tok_text(rec):
    return rec["outputs"][0]["text"]


def strip_id(rec):
    rec = dict(rec)
    rec.pop("id")
    return json.dumps(rec, sort_keys=True)


def prefix_hits(err):
    m = re.search(r"prefix cache: [0-9.]+% hit rate \((\d+) of (\d+) full prompt blocks\)", err)
    check(m is not None, f"no prefix-cache line in the summary: {err[-500:]}")
    return int(m.group(1))


def case_stories():
    base = os.path.join(SHARED, "models", "stories260K")
    check(os.path.isfile(os.path.join(base, "model.safetensors")), f"{base} is missing")
    with tempfile.TemporaryDirectory() as d:
        flags = make_adapters(base, d, "0,2") + ["--max-loras", "4"]
        lines = lines_for([None, "stories260K"] + list(ADAPTERS) + ["z"])
        raw, _ = run(base, lines, flags)
        check_reference(base, d, raw, [l for l in lines if l[1] != "z"], "stories260K")
        recs = records(raw)
        for i in range(len(PROMPTS)):
            check(strip_id(recs[f"z-{i}"]) == strip_id(recs[f"base-{i}"]),
                  f"B = 0: prompt {i} differs from the base model's bytes")
            check(strip_id(recs[f"stories260K-{i}"]) == strip_id(recs[f"base-{i}"]),
                  f"the served name: prompt {i} is not the base model's")
        print("stories260K: B = 0 and the served name give the base model's bytes")

        # a1 merged into the weights by the reference
        ref = LoraReference(base, os.path.join(d, "a1"))
        mdir = os.path.join(d, "merged")
        os.makedirs(mdir)
        for f in os.listdir(base):
            if f != "model.safetensors":
                shutil.copy(os.path.join(base, f), mdir)
        write_safetensors(os.path.join(mdir, "model.safetensors"), ref.merged_weights())
        mraw, _ = run(mdir, [(f"m-{i}", None, ids) for i, ids in enumerate(PROMPTS)])
        mrecs, worst = records(mraw), 0.0
        for i in range(len(PROMPTS)):
            x, m = recs[f"a1-{i}"]["outputs"][0], mrecs[f"m-{i}"]["outputs"][0]
            check(x["token_ids"] == m["token_ids"], f"merged: prompt {i}: {m['token_ids']} vs {x['token_ids']}")
            for p, q in zip(x["logprobs"], m["logprobs"]):
                worst = max(worst, abs(p["logprob"] - q["logprob"]))
        check(worst <= 1e-4, f"merged: logprobs off by {worst}")
        print(f"stories260K: a1 merged into the weights agrees, max |dlogprob| {worst:.2g}")

        # byte identity across batch size, threads, --max-loras, preemption
        for extra in (["--max-num-seqs", "1"], ["--max-num-seqs", "64"], ["--threads", "1"], ["--threads", "2"],
                      ["--max-loras", "1"], ["--max-num-seqs", "3", "--max-num-batched-tokens", "7"]):
            r2, _ = run(base, lines, flags + extra)
            check(r2 == raw, f"{' '.join(extra)} changed the output")
        r2, err = run(base, lines, flags + ["--num-kv-blocks", "12", "--max-num-seqs", "8"], quiet=False)
        m = re.search(r"preemptions (\d+)", err)
        check(m is not None and int(m.group(1)) > 0, f"the small pool did not preempt: {err[-600:]}")
        check(r2 == raw, f"a preempting pool ({m.group(1)} preemptions) changed the output")
        print(f"stories260K: byte-identical across --max-num-seqs 1/64, --threads 1/2, --max-loras 1, "
              f"chunked prefill and {m.group(1)} preemptions")

        # an unknown adapter name: that line's 404 record, the others run
        r3, _ = run(base, [("u", "nope", PROMPTS[0]), ("a1-0", "a1", PROMPTS[0])], flags, ok_codes=(1,))
        rr = records(r3)
        check("does not exist" in rr["u"]["error"]["message"] and strip_id(rr["a1-0"]) == strip_id(recs["a1-0"]),
              f"unknown model: {r3.decode()}")

        # OpenAI batch bodies: "model" selects the adapter, and the response
        # names it (vLLM's OpenAIServing._get_model_name: the adapter's name)
        body = {"prompt": PROMPTS[0], "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}
        text = "".join(json.dumps({"custom_id": cid, "method": "POST", "url": "/v1/completions",
                                   "body": dict(body, model=m)}) + "\n"
                       for cid, m in (("oa", "a1"), ("ob", "stories260K")))
        p = subprocess.run([EXE, "-m", base, "--block-size", "4", "-q"] + flags, input=text.encode(),
                           capture_output=True, timeout=300)
        check(p.returncode == 0, f"openai bodies: exit {p.returncode}: {p.stderr.decode()[-800:]}")
        ob = {r["custom_id"]: r["response"]["body"] for r in map(json.loads, p.stdout.decode().splitlines())}
        check(ob["oa"]["model"] == "a1" and ob["ob"]["model"] == "stories260K",
              f"openai response model: {ob['oa']['model']!r}, {ob['ob']['model']!r}")
        for cid, rid in (("oa", "a1-0"), ("ob", "base-0")):
            want = tok_text(recs[rid])
            check(ob[cid]["choices"][0]["text"] == want, f"openai {cid}: {ob[cid]['choices'][0]['text']!r} vs {want!r}")
        print("stories260K: an OpenAI body's model selects the adapter, and its response names it")

        # the prefix cache is keyed by adapter: 12 tokens = 3 full blocks of 4
        long = [1, 17, 42, 99, 3, 250, 77, 8, 19, 64, 100, 5, 6]
        one = ["--max-num-seqs", "1"]
        _, err = run(base, [("x", "a1", long), ("y", None, long), ("w", "a2", long)], flags + one, quiet=False)
        check(prefix_hits(err) == 0, f"a prefix computed under a1 was reused under another adapter: {err[-300:]}")
        r4, err = run(base, [("x", "a1", long), ("y", "a1", long)], flags + one, quiet=False)
        check(prefix_hits(err) == 3, f"a prefix computed under a1 was not reused under a1: {err[-300:]}")
        r5, _ = run(base, [("y", "a1", long)], flags + ["--no-prefix-caching"])
        check(strip_id(records(r4)["y"]) == strip_id(records(r5)["y"]), "a1's prefix-cache hit changed the output")
        print("stories260K: unknown model -> 404 record; prefix cache keyed by adapter (0 hits across, 3 within)")

        # refusals: a rank above --max-lora-rank
        p = subprocess.run([EXE, "-m", base, "-q", "--lora", f"a2={d}/a2", "--max-lora-rank", "4"], input=b"",
                           capture_output=True)
        check(p.returncode == 3 and "a2" in p.stderr.decode() and "--max-lora-rank 4" in p.stderr.decode(),
              f"--max-lora-rank: exit {p.returncode}: {p.stderr.decode()}")
        print("stories260K: an adapter above --max-lora-rank refused by name")


def case_qwen():
    with tempfile.TemporaryDirectory() as d:
        for fam in ("qwen3", "qwen2"):
            base = os.path.join(d, fam)
            gen(QWEN_GEN, base, "--preset", f"tiny-{fam}", "--std", "0.25", "--seed", "31")
            ad = os.path.join(d, fam + "-lora")
            flags = make_adapters(base, ad, "1") + ["--max-loras", "4"]
            lines = lines_for([None] + list(ADAPTERS))
            raw, _ = run(base, lines, flags)
            check_reference(base, ad, raw, lines, fam)
        moe = os.path.join(d, "moe")
        gen(QWEN_GEN, moe, "--preset", "tiny-qwen3-moe", "--seed", "32")
        gen(LORA_GEN, moe, f"{d}/moe-lora", "--targets", "q_proj,gate_proj")
        p = subprocess.run([EXE, "-m", moe, "-q", "--lora", f"m={d}/moe-lora"], input=b"", capture_output=True)
        err = p.stderr.decode()
        check(p.returncode != 0 and "gate_proj" in err, f"an adapter on MoE MLPs: exit {p.returncode}: {err}")
        print(f"qwen3-moe: an adapter on the MoE MLP refused: {err.strip().splitlines()[-1][:200]}")


def main():
    global EXE
    EXE = sys.argv[1]
    case = sys.argv[2]
    try:
        {"stories": case_stories, "qwen": case_qwen}[case]()
    except Fail as e:
        print(f"FAIL {case}: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
