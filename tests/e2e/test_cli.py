#!/usr/bin/env python3
"""Process-level tests of the pagedgen binary (suite e2e), stdlib only.

usage: test_cli.py PAGEDGEN CASE          run one case (meson runs each as a test)
       test_cli.py PAGEDGEN --regen       rewrite samples/*.out.jsonl (then review the diff!)

Test data: $PAGEDGEN_SHARED (models/stories260K, goldens, tokenizers). Without
it the case is skipped (exit 77), or fails when CI=true.
"""
import json
import os
import re
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
    ("prompts.txt", "prompts.txt.out.jsonl", ["--max-tokens", "48", "--temperature", "0"], 0),
    ("prompts.jsonl", "prompts.jsonl.out.jsonl", [], 0),
    ("batch_openai.jsonl", "batch_openai.out.jsonl", [], 0),
    ("bad_lines.jsonl", "bad_lines.out.jsonl", ["--strict"], 1),
    ("batch_openai_vllm.jsonl", "batch_openai_vllm.out.jsonl", [], 1),
    ("chat_batch.jsonl", "chat_batch.out.jsonl", ["--chat-template", os.path.join(SAMPLES, "chatml.jinja")], 0),
    ("chat_messages.jsonl", "chat_messages.out.jsonl", ["--chat-template", os.path.join(SAMPLES, "chatml.jinja")],
     0),
    ("extract.jsonl", "extract.out.jsonl", [], 1),
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


def case_parallel_sampling():
    """n > 1 like vLLM v1: n > --max-num-seqs runs (the sequences fan out into
    independent child requests sharing the prompt through the prefix cache)
    and every record is byte-identical to the default run (the forked group),
    for --max-num-seqs 1..3, tiny pools (preemption), no prefix caching and
    the contiguous layout."""
    flag_sets = [["--max-num-seqs", "1"], ["--max-num-seqs", "2"], ["--max-num-seqs", "3"],
                 ["--max-num-seqs", "1", "--num-kv-blocks", "32", "--max-num-batched-tokens", "7"],
                 ["--max-num-seqs", "2", "--num-kv-blocks", "128", "--block-size", "4",
                  "--max-num-batched-tokens", "16"],
                 ["--max-num-seqs", "2", "--no-prefix-caching"],
                 ["--max-num-seqs", "1", "--kv-layout", "contiguous"]]
    for inp, exp, flags, code in SAMPLE_RUNS:
        data = open(os.path.join(SAMPLES, inp), "rb").read()
        if not any(f'"n": {k}'.encode() in data for k in range(2, 10)):
            continue  # (extract.jsonl: constrained n = 2 children keep their automaton state)
        want = open(os.path.join(SAMPLES, exp), "rb").read()
        for extra in flag_sets:
            rc, out, err = gen(["-i", os.path.join(SAMPLES, inp)] + flags + extra)
            check(rc == code, f"{inp} {extra}: exit {rc}: {err.decode()[-2000:]}")
            check(out == want, f"{inp} {extra}: differs from samples/{exp}")
    lines = [{"id": "a", "prompt": "Once upon a time", "n": 3, "temperature": 1.0, "seed": 7,
              "max_tokens": 40, "logprobs": 2},
             {"id": "b", "prompt": "The dog", "max_tokens": 10},
             {"id": "c", "prompt": "Lily and Tom", "n": 5, "temperature": 0.8, "top_p": 0.9,
              "max_tokens": 30}]
    data = "".join(json.dumps(l) + "\n" for l in lines).encode()
    rc, ref, err = gen([], stdin_bytes=data)
    check(rc == 0, f"default: exit {rc}: {err.decode()[-2000:]}")
    recs = [json.loads(l) for l in lines_of(ref)]
    check([r["id"] for r in recs] == ["a", "b", "c"], "records out of order")
    for r, n in zip(recs, (3, 1, 5)):
        check("outputs" in r, f"{r['id']}: {r}")
        check([o["index"] for o in r["outputs"]] == list(range(n)), f"{r['id']}: indices")
    texts = {o["text"] for o in recs[2]["outputs"]}
    check(len(texts) > 1, "the n = 5 samples are all equal")
    for extra in flag_sets:
        rc, out, err = gen(extra, stdin_bytes=data)
        check(rc == 0, f"{extra}: exit {rc}: {err.decode()[-2000:]}")
        check(out == ref, f"--max-num-seqs 1 with n 3 and 5: {extra} differs from the default run")


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
        # the goldens leave out the stopping BOS (their README); pagedgen keeps
        # it as the last token and counts it, as vLLM v1 does
        want = g["completion_token_ids"] + ([g["stop_token_id"]] if g["finish_reason"] == "stop" else [])
        check(o["token_ids"] == want, f"prompt {g['prompt']!r}: token ids differ")
        check(o["text"] == g["completion_text"], f"prompt {g['prompt']!r}: text differs")
        check(o["finish_reason"] == g["finish_reason"], f"prompt {g['prompt']!r}: finish_reason")
        check(r["prompt_token_ids"] == g["prompt_token_ids"], "prompt_token_ids echoed wrong")
        check(r["usage"]["completion_tokens"] == len(want), "usage")
    # the same prompts as text reach the same ids (the tokenizer path)
    req = "".join(json.dumps({"id": i, "prompt": g["prompt"], "max_tokens": 8, "temperature": 0}) + "\n"
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
    rc, out, err = gen(["--strict", "-i", os.path.join(SAMPLES, "bad_lines.jsonl")])
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
    # openai: chat lines without a chat template are refused per line, the rest runs
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
          and "model has no chat template: pass --chat-template FILE" in recs[1]["error"]["message"],
          "openai chat error")



def case_openai_vllm():
    """vLLM's behaviour on OpenAI batch lines: the error object {"message",
    "type", "param", "code"} with response.status_code 400/404, the served
    model name check, prompt + max_tokens beyond the context, max_tokens
    null, lenient fields (and --strict, --truncate-max-tokens,
    --served-model-name), every CompletionResponse key."""
    path = os.path.join(SAMPLES, "batch_openai_vllm.jsonl")
    rc, out, err = gen(["-i", path])
    check(rc == 1, f"exit {rc}, expected 1")
    recs = {r["custom_id"]: r for r in map(json.loads, lines_of(out))}
    for cid in ("lenient", "no-model", "rest-of-context"):
        r = recs[cid]
        check(r["error"] is None and r["response"]["status_code"] == 200, f"{cid}: {r}")
        body = r["response"]["body"]
        check(list(body) == ["id", "object", "created", "model", "choices", "service_tier",
                             "system_fingerprint", "usage", "kv_transfer_params"], f"body keys {list(body)}")
        check(list(body["choices"][0]) == ["index", "text", "logprobs", "finish_reason", "stop_reason",
                                           "prompt_logprobs"], f"choice keys {list(body['choices'][0])}")
        check(list(body["usage"]) == ["prompt_tokens", "total_tokens", "completion_tokens",
                                      "prompt_tokens_details"], f"usage keys {list(body['usage'])}")
    check(recs["lenient"]["response"]["body"]["usage"]["completion_tokens"] == 8, "8.0 read as 8")
    u = recs["rest-of-context"]["response"]["body"]["usage"]
    ch = recs["rest-of-context"]["response"]["body"]["choices"][0]
    check(u["completion_tokens"] > 256 or ch["finish_reason"] == "stop", f"max_tokens null: {u} {ch['finish_reason']}")
    for cid, status, typ, text in (
            ("unknown-model", 404, "NotFoundError", "The model `gpt-4o` does not exist."),
            ("too-many-tokens", 400, "BadRequestError",
             "'max_tokens' or 'max_completion_tokens' is too large: 600. This model's maximum context length "
             "is 512 tokens and your request has 5 input tokens (600 > 512 - 5)."),
            ("bad-value", 400, "BadRequestError", "top_p"),
            ("fractional-int", 400, "BadRequestError", "max_tokens"),
            ("unsupported-field", 400, "BadRequestError", "field 'logit_bias' is not supported by pagedgen")):
        r = recs[cid]
        e = r["error"]
        check(r["response"]["status_code"] == status and r["response"]["body"] is None, f"{cid}: {r}")
        check(list(e) == ["message", "type", "param", "code", "line"] and e["type"] == typ
              and e["param"] is None and e["code"] == status and text in e["message"], f"{cid}: {e}")
    # the summary counts the lenient line
    rc, out, err = run(["-m", MODEL, "-i", path])
    check(b"1 lines had unknown fields" in err, f"summary: {err.decode()[-600:]}")
    # --strict: the lenient line is an error
    rc, out, err = gen(["--strict", "-i", path])
    r = {r["custom_id"]: r for r in map(json.loads, lines_of(out))}["lenient"]
    check(r["response"]["status_code"] == 400 and "max_tokens" in r["error"]["message"], f"--strict: {r}")
    # --truncate-max-tokens: the old clamp (runs to the end of the context)
    rc, out, err = gen(["--truncate-max-tokens", "-i", path])
    r = {r["custom_id"]: r for r in map(json.loads, lines_of(out))}["too-many-tokens"]
    check(r["error"] is None and r["response"]["body"]["usage"]["total_tokens"] <= 512, f"--truncate: {r}")
    # --served-model-name: that name is checked and written
    rc, out, err = gen(["--served-model-name", "gpt-4o", "-i", path])
    recs = {r["custom_id"]: r for r in map(json.loads, lines_of(out))}
    check(recs["unknown-model"]["error"] is None
          and recs["unknown-model"]["response"]["body"]["model"] == "gpt-4o", "served name accepted")
    check(recs["lenient"]["response"]["status_code"] == 404, "the folder name is no longer served")
    check(recs["no-model"]["error"] is None, "no model: accepted (vLLM's _is_model_supported)")
    # -m as given is accepted without --served-model-name
    line = json.dumps({"custom_id": "x", "method": "POST", "url": "/v1/completions",
                       "body": {"model": MODEL, "prompt": "Hi", "max_tokens": 2}}) + "\n"
    rc, out, err = gen([], stdin_bytes=line.encode())
    check(rc == 0, f"-m path as model: {out[:300]}")


def case_logprobs():
    """vLLM's logprobs: the top list is the logprob dict, the sampled token
    first (k or k + 1 entries, 1 with logprobs 0), the completions API's
    top_logprobs holds the sampled token's text, text_offset counts
    characters, the chat API's top_logprobs is the dict's first k."""
    lines = [{"id": f"k{k}", "prompt": "The dog ran", "max_tokens": 12, "temperature": 2.0, "seed": 5 + k,
              "logprobs": k} for k in (0, 1, 3)]
    rc, out, err = gen([], stdin_bytes="".join(json.dumps(l) + "\n" for l in lines).encode())
    check(rc == 0, f"exit {rc}")
    outside = 0
    for r in map(json.loads, lines_of(out)):
        k = int(r["id"][1:])
        o = r["outputs"][0]
        check(len(o["logprobs"]) == len(o["token_ids"]), "one entry per token")
        for tok, lp in zip(o["token_ids"], o["logprobs"]):
            top = lp["top"]
            ids = [t[0] for t in top]
            check(ids[0] == tok and top[0][1] == lp["logprob"], f"sampled first: {lp}")
            check(len(set(ids)) == len(ids), f"no repeat: {lp}")
            check(len(top) in ((1,) if k == 0 else (k, k + 1)), f"k={k}: {len(top)} entries")
            if k > 0 and len(top) == k + 1:
                outside += 1
                check(all(t[1] >= lp["logprob"] for t in top[1:]), f"the top k are the most likely: {lp}")
    check(outside > 0, "temperature 2 should sample outside the top k at least once")
    # completions API
    body = {"model": "stories260K", "prompt": "héllo wörld 日本", "max_tokens": 12, "temperature": 2.0,
            "seed": 3, "logprobs": 1}
    line = json.dumps({"custom_id": "c", "method": "POST", "url": "/v1/completions", "body": body}) + "\n"
    rc, out, err = gen([], stdin_bytes=line.encode())
    lp = json.loads(lines_of(out)[0])["response"]["body"]["choices"][0]["logprobs"]
    for i, tok in enumerate(lp["tokens"]):
        check(tok in lp["top_logprobs"][i] and len(lp["top_logprobs"][i]) in (1, 2), f"top_logprobs {i}: {lp}")
        check(list(lp["top_logprobs"][i])[0] == tok, "the sampled token's key first")
        if i:
            check(lp["text_offset"][i] == lp["text_offset"][i - 1] + len(lp["tokens"][i - 1]),
                  f"text_offset in characters: {lp['text_offset']} {lp['tokens']}")
    # chat API: top_logprobs = the first k entries of the dict
    body = {"model": "stories260K", "messages": [{"role": "user", "content": "The dog ran"}], "max_tokens": 10,
            "temperature": 2.0, "seed": 9, "logprobs": True, "top_logprobs": 2}
    line = json.dumps({"custom_id": "c", "method": "POST", "url": "/v1/chat/completions", "body": body}) + "\n"
    rc, out, err = gen(["--chat-template", os.path.join(SAMPLES, "chatml.jinja")], stdin_bytes=line.encode())
    check(rc == 0, f"chat: exit {rc} {err.decode()[-300:]}")
    content = json.loads(lines_of(out)[0])["response"]["body"]["choices"][0]["logprobs"]["content"]
    for c in content:
        check(len(c["top_logprobs"]) == 2 and c["top_logprobs"][0]["token"] == c["token"]
              and c["top_logprobs"][0]["logprob"] == c["logprob"], f"chat top_logprobs: {c}")
    check(json.loads(lines_of(out)[0])["response"]["body"]["prompt_logprobs"] is None,
          "chat without prompt_logprobs: null")
    # chat API with prompt_logprobs (vLLM: on the response, serving_chat.py at
    # 99c5632f): the same numbers as the jsonl record of the same messages
    msgs = [{"role": "user", "content": "The dog ran"}]
    body = {"model": "stories260K", "messages": msgs, "max_tokens": 3, "prompt_logprobs": 2}
    line = json.dumps({"custom_id": "c", "method": "POST", "url": "/v1/chat/completions", "body": body}) + "\n"
    jl = json.dumps({"messages": msgs, "max_tokens": 3, "prompt_logprobs": 2}) + "\n"
    tmpl = ["--chat-template", os.path.join(SAMPLES, "chatml.jinja")]
    rc, out, err = gen(tmpl, stdin_bytes=line.encode())
    check(rc == 0, f"chat prompt_logprobs: exit {rc} {err.decode()[-300:]}")
    resp = json.loads(lines_of(out)[0])["response"]["body"]
    plp = resp["prompt_logprobs"]
    rc, out, err = gen(tmpl, stdin_bytes=jl.encode())
    check(rc == 0, f"chat jsonl prompt_logprobs: exit {rc} {err.decode()[-300:]}")
    ref = json.loads(lines_of(out)[0])["prompt_logprobs"]
    check(isinstance(plp, list) and len(plp) == resp["usage"]["prompt_tokens"] == len(ref) and plp[0] is None,
          f"chat prompt_logprobs: one entry per prompt token, the first null: {plp} / {ref}")
    for i in range(1, len(plp)):
        got = [(int(k), v["logprob"]) for k, v in plp[i].items()]
        want = [(e[0], e[1]) for e in ref[i]]
        check(got == want and 2 <= len(got) <= 3 and all(v["rank"] >= 1 for v in plp[i].values()),
              f"chat prompt_logprobs entry {i}: {plp[i]} vs {ref[i]}")



def case_generation_config():
    """generation_config.json as vLLM's --generation-config auto reads it:
    repetition_penalty, temperature, top_k, top_p, min_p and max_new_tokens
    (a default and a cap) apply, do_sample does not (vllm/config/model.py
    get_diff_sampling_param)."""
    def model_with(gen):
        tmp = tempfile.mkdtemp()
        for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
            os.symlink(os.path.join(MODEL, f), os.path.join(tmp, f))
        with open(os.path.join(tmp, "generation_config.json"), "w") as f:
            json.dump(dict({"bos_token_id": 1, "eos_token_id": [2, 1]}, **gen), f)
        return tmp

    def outputs(mdir, lines, flags=()):
        data = "".join(json.dumps(l) + "\n" for l in lines).encode()
        rc, out, err = run(["-m", mdir, "-q"] + list(flags), stdin_bytes=data)
        check(rc == 0, f"exit {rc}: {err.decode()[-400:]}")
        return [json.loads(l)["outputs"][0] for l in lines_of(out)]

    base = {"prompt": "Tom and his dog", "seed": 3, "ignore_eos": True}
    # do_sample false is ignored: no temperature = 1, the same as asking for 1
    m = model_with({"do_sample": False})
    a = outputs(m, [dict(base, max_tokens=24)])[0]
    b = outputs(m, [dict(base, max_tokens=24, temperature=1.0)])[0]
    g = outputs(m, [dict(base, max_tokens=24, temperature=0)])[0]
    check(a["token_ids"] == b["token_ids"] and a["token_ids"] != g["token_ids"], "do_sample false ignored")
    # every key applies as the request's own value would, and changes the output
    plain = model_with({})
    free = outputs(plain, [dict(base, max_tokens=24)])[0]
    for k, v in (("temperature", 1.5), ("top_p", 0.5), ("top_k", 3), ("min_p", 0.3),
                 ("repetition_penalty", 1.5)):
        got = outputs(model_with({k: v}), [dict(base, max_tokens=24)])[0]
        want = outputs(plain, [dict(base, max_tokens=24, **{k: v})])[0]
        check(got["token_ids"] == want["token_ids"], f"{k} from generation_config")
        check(got["token_ids"] != free["token_ids"], f"{k} had no effect")
        # the request's own value wins
        own = outputs(model_with({k: v}), [dict(base, max_tokens=24, **{k: {"top_k": -1, "min_p": 0.0}.get(k, 1.0)})])[0]
        check(own["token_ids"] == free["token_ids"], f"{k}: the request's value wins")
    # max_new_tokens: the default and a cap
    m = model_with({"max_new_tokens": 5, "temperature": 0})
    o = outputs(m, [{"prompt": "Once upon a time", "ignore_eos": True},
                    {"prompt": "Once upon a time", "ignore_eos": True, "max_tokens": 20}])
    check([len(x["token_ids"]) for x in o] == [5, 5], f"max_new_tokens: {[len(x['token_ids']) for x in o]}")


def case_loglikelihood():
    """lm-evaluation-harness loglikelihood (its local-completions model):
    /v1/completions with the context + continuation ids, echo true,
    max_tokens 1 (or 0), logprobs 1; score = sum of token_logprobs over the
    continuation ([ctxlen:-1] with max_tokens 1), is_greedy = each of them
    is its position's best. Checked against separate forwards of each prefix
    (a plain request: the logprobs of its first generated token)."""
    tok = lambda text: tokenize_ids(text)
    items = [("Once upon a time, there was a little", [" girl", " dog", " tree", " car"]),
             ("Tom and his dog went to the", [" park", " moon", " store", " school"]),
             ("She was very", [" happy", " sad", " big", " blue"])]
    reqs, meta = [], []
    for qi, (ctx, conts) in enumerate(items):
        ctx_ids = tok(ctx)
        for ci, cont in enumerate(conts):
            whole = tok(ctx + cont)
            check(whole[:len(ctx_ids)] == ctx_ids, "the context tokenizes the same inside the whole")
            for mt in (1, 0):
                reqs.append({"custom_id": f"q{qi}-c{ci}-m{mt}", "method": "POST", "url": "/v1/completions",
                             "body": {"model": "stories260K", "prompt": whole, "echo": True, "max_tokens": mt,
                                      "logprobs": 1, "temperature": 0}})
            meta.append((qi, ci, whole, len(ctx_ids)))
    rc, out, err = gen([], stdin_bytes="".join(json.dumps(r) + "\n" for r in reqs).encode())
    check(rc == 0, f"exit {rc}: {err.decode()[-400:]}")
    recs = {r["custom_id"]: r for r in map(json.loads, lines_of(out))}
    scores = {}
    for qi, ci, whole, ctxlen in meta:
        lp1 = recs[f"q{qi}-c{ci}-m1"]["response"]["body"]["choices"][0]["logprobs"]
        lp0 = recs[f"q{qi}-c{ci}-m0"]["response"]["body"]["choices"][0]["logprobs"]
        check(lp1["token_logprobs"][0] is None and lp1["top_logprobs"][0] is None, "first prompt token: null")
        check(len(lp1["tokens"]) == len(whole) + 1 and len(lp0["tokens"]) == len(whole), "echo lengths")
        check(lp0["token_logprobs"] == lp1["token_logprobs"][:-1], "max_tokens 0 = the prompt part of max_tokens 1")
        cont_lp = lp1["token_logprobs"][ctxlen:-1]
        tops = lp1["top_logprobs"][ctxlen:-1]
        is_greedy = all(t == max(top.values()) for t, top in zip(cont_lp, tops))
        scores[(qi, ci)] = (sum(cont_lp), is_greedy, cont_lp)
    # separate forwards: each continuation token's logprob from a plain
    # request on its prefix (its first generated token's top 20)
    sep = []
    for qi, ci, whole, ctxlen in meta:
        for j in range(ctxlen, len(whole)):
            sep.append({"id": f"{qi}-{ci}-{j}", "prompt_token_ids": whole[:j], "max_tokens": 1,
                        "temperature": 0, "logprobs": 20})
    rc, out, err = gen(["--no-prefix-caching"], stdin_bytes="".join(json.dumps(r) + "\n" for r in sep).encode())
    check(rc == 0, f"separate: exit {rc}")
    byid = {r["id"]: r["outputs"][0] for r in map(json.loads, lines_of(out))}
    compared = 0
    for qi, ci, whole, ctxlen in meta:
        greedy = True
        for j in range(ctxlen, len(whole)):
            o = byid[f"{qi}-{ci}-{j}"]
            top = {t[0]: t[1] for t in o["logprobs"][0]["top"]}
            greedy = greedy and o["token_ids"][0] == whole[j]
            if whole[j] in top:
                got = scores[(qi, ci)][2][j - ctxlen]
                check(abs(got - top[whole[j]]) <= 1e-5, f"q{qi} c{ci} token {j}: {got} vs {top[whole[j]]}")
                compared += 1
        check(greedy == scores[(qi, ci)][1], f"q{qi} c{ci}: is_greedy {scores[(qi, ci)][1]} vs {greedy}")
    check(compared >= len(meta), f"only {compared} continuation tokens compared")
    for qi, (ctx, conts) in enumerate(items):
        best = max(range(len(conts)), key=lambda ci: scores[(qi, ci)][0])
        print(f"  {ctx!r}: " + ", ".join(f"{c!r} {scores[(qi, ci)][0]:.3f}{' greedy' if scores[(qi, ci)][1] else ''}"
                                          for ci, c in enumerate(conts)) + f" -> {conts[best]!r}")


def tokenize_ids(text):
    rc, out, err = run(["tokenize", "--tokenizer", MODEL], stdin_bytes=(json.dumps({"text": text}) + "\n").encode())
    check(rc == 0, f"tokenize: {err.decode()}")
    return json.loads(lines_of(out)[0])["ids"]

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


def case_no_cuda_loaded():
    """CUDA only when used (issue 23): the binary links no CUDA library, and
    --help, tokenize and a run on the cpu map none (glibc's LD_DEBUG=libs
    lists every library the process loads, dlopen() included); --device auto
    may try the driver (libcuda.so.1) but loads neither the CUDA module nor
    cudart/cuBLAS when it picks the cpu."""
    cuda_libs = [b"libcudart", b"libcublas", b"libpagedgen-cuda"]
    env = dict(os.environ, LD_DEBUG="libs")
    env.pop("PAGEDGEN_CUDA_MODULE", None)

    def loaded(args, stdin_bytes=None):
        p = subprocess.run([EXE] + args, input=stdin_bytes, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           env=env, timeout=120)
        opened = [l for l in p.stderr.splitlines() if b"calling init:" in l]
        return p.returncode, opened, p.stderr

    for args, stdin_bytes in [(["--help"], None),
                              (["tokenize", "--tokenizer", MODEL], b'{"text":"hi"}\n'),
                              (["-m", MODEL, "-q", "--device", "cpu", "--max-tokens", "2"], b"hi\n")]:
        rc, opened, err = loaded(args, stdin_bytes)
        check(rc == 0, f"{args[:2]}: exit {rc}: {err[-500:]!r}")
        check(opened, f"{args[:2]}: LD_DEBUG=libs printed no 'calling init' line: {err[:300]!r}")
        bad = [l for l in opened if any(c in l for c in cuda_libs + [b"libcuda.so"])]
        check(not bad, f"{args[:2]}: loaded {bad[:3]!r}")
    rc, opened, err = loaded(["-m", MODEL, "--device", "auto", "--max-tokens", "2"], b"hi\n")
    check(rc == 0, f"--device auto: exit {rc}: {err[-500:]!r}")
    if b"device cpu" in err:
        bad = [l for l in opened if any(c in l for c in cuda_libs)]
        check(not bad, f"--device auto picked the cpu but loaded {bad[:3]!r}")


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
                 "--kv-cache-dtype", "--dtype", "--cuda-device", "--fast-gemm", "--enforce-eager",
                 "--chat-template", "--chat-template-date"]
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


SCHED_VARS = ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_MAX", "SLURM_ARRAY_TASK_STEP",
              "SLURM_ARRAY_TASK_COUNT", "JOB_COMPLETION_INDEX", "AWS_BATCH_JOB_ARRAY_INDEX",
              "AWS_BATCH_JOB_ARRAY_SIZE")


def run_env(args, env_vars, timeout=300):
    """Runs pagedgen with the scheduler variables replaced by env_vars."""
    env = {k: v for k, v in os.environ.items() if k not in SCHED_VARS}
    env.update(env_vars)
    p = subprocess.run([EXE] + args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def merge(inp, files, out=None):
    return run(["merge", "-i", inp] + (["-o", out] if out else []) + files)


def shard_ref(tmp):
    """The resume input and a single run's output bytes over it."""
    inp = os.path.join(tmp, "in.jsonl")
    resume_input(inp)
    ref = os.path.join(tmp, "ref.jsonl")
    rc, _, err = run(["-m", MODEL, "-q", "-i", inp, "-o", ref] + RESUME_FLAGS)
    check(rc == 1, f"single run: exit {rc}: {err.decode()[-500:]}")
    return inp, open(ref, "rb").read()


def case_shard_auto():
    """--shard auto from each scheduler's variables; outputs named by -o DIR/
    and {shard}; a finished shard's --resume exits at once; a shard killed
    and resumed is sorted back; merge gives a single run's bytes."""
    with tempfile.TemporaryDirectory() as tmp:
        inp, want = shard_ref(tmp)
        base = ["-m", MODEL, "-q", "-i", inp] + RESUME_FLAGS
        # SLURM --array=1-4 into a directory: in.K-of-4.jsonl, K = ID - MIN
        d = os.path.join(tmp, "slurm") + "/"  # created by the first task
        for tid in range(1, 5):
            env = {"SLURM_ARRAY_TASK_ID": str(tid), "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_MAX": "4",
                   "SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_STEP": "1"}
            rc, _, err = run_env(base + ["-o", d, "--shard", "auto"], env)
            check(rc in (0, 1), f"slurm task {tid}: exit {rc}: {err.decode()[-500:]}")
            f = os.path.join(d, f"in.{tid - 1}-of-4.jsonl")
            check(os.path.exists(f) and os.path.exists(f + ".done"), f"slurm task {tid}: no {f} and marker")
        files = [os.path.join(d, f"in.{k}-of-4.jsonl") for k in range(4)]
        rc, out, err = merge(inp, files[::-1])  # any order of arguments
        check(rc == 0, f"merge slurm: exit {rc}: {err.decode()[-800:]}")
        check(out == want, "merged SLURM shards differ from the single run")
        # a finished shard: --resume exits at once with the run's code and keeps the file
        before = open(files[2], "rb").read()
        t0 = time.time()
        # (no model at that path: the run must not load one; -m counts by its folder's name)
        rc, _, err = run_env(["-m", "/nonexistent/stories260K"] + base[2:] + ["-o", d, "--shard", "auto", "--resume"],
                             {"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_COUNT": "4"})
        marker = json.load(open(files[2] + ".done"))
        check(rc == marker["exit_code"], f"finished shard --resume: exit {rc}, marker says {marker['exit_code']}: "
              f"{err.decode()[-300:]}")
        check(open(files[2], "rb").read() == before and time.time() - t0 < 10, "finished shard ran again")
        # ... but not with other output-shaping flags
        rc, _, err = run_env(base + ["-o", d, "--shard", "auto", "--resume", "--seed", "9"],
                             {"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_COUNT": "4"})
        check(rc == 2 and b"output-shaping flags" in err, f"resume with other flags: exit {rc}: {err.decode()}")

        # Kubernetes Indexed Job (auto/N) with {shard}, one shard killed and resumed
        k8s = [os.path.join(tmp, f"k8s.{k}-of-3.jsonl") for k in range(3)]
        for k in range(3):
            args = base + ["-o", os.path.join(tmp, "k8s.{shard}.jsonl"), "--shard", "auto/3"]
            if k == 1:
                env = {n: v for n, v in os.environ.items() if n not in SCHED_VARS}
                env["JOB_COMPLETION_INDEX"] = "1"
                # 16 sequences at a time, of different lengths: many finish out of order
                wide = args + ["--max-num-seqs", "16", "--max-num-batched-tokens", "256"]
                p = subprocess.Popen([EXE] + wide, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                deadline = time.time() + 120
                while p.poll() is None and count_lines(k8s[1]) < 30 and time.time() < deadline:
                    time.sleep(0.002)
                alive = p.poll() is None
                if alive:
                    p.terminate()  # SIGTERM: finished records go out past the gaps (not in input order)
                p.communicate(timeout=60)
                check(alive, "the k8s shard finished before it could be stopped")
                check(p.returncode == 130, f"SIGTERM: exit {p.returncode}")
                check(not os.path.exists(k8s[1] + ".done"), "a stopped shard has a marker")
                ids = [int(json.loads(l).get("id", "r-1")[1:]) for l in lines_of(open(k8s[1], "rb").read())
                       if '"error"' not in l]
                prefix = [i for i in range(1, 240, 3) if i not in (37, 91)][:len(ids)]
                check(ids != prefix, f"SIGTERM left shard 1 without gaps ({len(ids)} records): the sort on "
                      "resume is not exercised")
                rc, _, err = merge(inp, k8s[:1])
                check(rc != 0, "merge accepted an unfinished set")
                args = args + ["--resume"]
            rc, _, err = run_env(args, {"JOB_COMPLETION_INDEX": str(k)})
            check(rc in (0, 1), f"k8s index {k}: exit {rc}: {err.decode()[-500:]}")
        rc, out, err = merge(inp, k8s)
        check(rc == 0, f"merge k8s: exit {rc}: {err.decode()[-800:]}")
        check(out == want, "killed + resumed shard: merged file differs from the single run")

        # one writer per shard: a second process on a shard that runs is refused, the first goes on
        lone = os.path.join(tmp, "lone.{shard}.jsonl")
        first = subprocess.Popen([EXE] + base + ["-o", lone, "--shard", "0/2"], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE)
        lone0 = lone.replace("{shard}", "0-of-2")
        deadline = time.time() + 120
        while first.poll() is None and count_lines(lone0) < 3 and time.time() < deadline:
            time.sleep(0.002)
        check(first.poll() is None, "the first writer finished before the second could start")
        rc, _, err = run(base + ["-o", lone, "--shard", "0/2", "--resume"])
        check(rc == 2 and b"another pagedgen is writing" in err, f"second writer: exit {rc}: {err.decode()}")
        _, err = first.communicate(timeout=120)
        check(first.returncode in (0, 1) and os.path.exists(lone0 + ".done"),
              f"the first writer: exit {first.returncode}: {err.decode()[-300:]}")

        # AWS Batch array job: index and size
        aws = []
        for k in range(2):
            rc, _, err = run_env(base + ["-o", os.path.join(tmp, "aws.{shard}.jsonl"), "--shard", "auto"],
                                 {"AWS_BATCH_JOB_ARRAY_INDEX": str(k), "AWS_BATCH_JOB_ARRAY_SIZE": "2"})
            check(rc in (0, 1), f"aws index {k}: exit {rc}: {err.decode()[-500:]}")
            aws.append(os.path.join(tmp, f"aws.{k}-of-2.jsonl"))
        merged = os.path.join(tmp, "aws.all.jsonl")
        rc, out, err = merge(inp, aws, merged)
        check(rc == 0 and out == b"" and open(merged, "rb").read() == want, f"merge aws: exit {rc}: {err.decode()}")

        # no scheduler, or one that disagrees with auto/N: exit 2 naming the variables
        rc, _, err = run_env(base + ["--shard", "auto"], {})
        check(rc == 2 and b"SLURM_ARRAY_TASK_ID" in err and b"JOB_COMPLETION_INDEX" in err
              and b"AWS_BATCH_JOB_ARRAY_INDEX" in err, f"no scheduler: exit {rc}: {err.decode()}")
        rc, _, err = run_env(base + ["--shard", "auto", "-o", os.path.join(tmp, "same.jsonl")],
                             {"AWS_BATCH_JOB_ARRAY_INDEX": "0", "AWS_BATCH_JOB_ARRAY_SIZE": "4"})
        check(rc == 2 and b"{shard}" in err and not os.path.exists(os.path.join(tmp, "same.jsonl")),
              f"auto with one -o FILE for every task: exit {rc}: {err.decode()}")
        rc, _, err = run_env(base + ["--shard", "auto/5"], {"AWS_BATCH_JOB_ARRAY_INDEX": "0",
                                                             "AWS_BATCH_JOB_ARRAY_SIZE": "4"})
        check(rc == 2 and b"AWS_BATCH_JOB_ARRAY_SIZE" in err, f"auto/5 vs size 4: exit {rc}: {err.decode()}")


def case_merge():
    """merge's refusals: a missing shard, a foreign shard, other flags, a
    shard given twice, a record answered twice, an unfinished shard."""
    with tempfile.TemporaryDirectory() as tmp:
        inp, want = shard_ref(tmp)
        base = ["-m", MODEL, "-q", "-i", inp] + RESUME_FLAGS
        pat = os.path.join(tmp, "p.{shard}.jsonl")
        files = [pat.replace("{shard}", f"{k}-of-3") for k in range(3)]
        for k in range(3):
            rc, _, err = run(base + ["-o", pat, "--shard", f"{k}/3"])
            check(rc in (0, 1), f"shard {k}: exit {rc}: {err.decode()[-500:]}")
        out = os.path.join(tmp, "all.jsonl")
        rc, _, err = merge(inp, files, out)
        check(rc == 0 and open(out, "rb").read() == want, f"merge: exit {rc}: {err.decode()}")
        os.unlink(out)

        # a missing shard: exit 1, its requests listed with ids and lines, nothing written
        rc, _, err = merge(inp, [files[0], files[2]], out)
        e = err.decode()
        check(rc == 1 and "shard 1 of 3 is missing" in e and "missing: id r1 (line 2)" in e
              and "missing: id r4 (line 5)" in e, f"missing shard: exit {rc}: {e}")
        check(not os.path.exists(out) and not os.path.exists(out + ".tmp"), "an incomplete merge wrote its output")

        # a shard made from another input
        other = os.path.join(tmp, "other.jsonl")
        lines = open(inp).read().split("\n")
        check("Once upon" in lines[5], "input line 6 changed")
        lines[5] = lines[5].replace("Once upon", "Twice upon")
        open(other, "w").write("\n".join(lines))
        foreign = os.path.join(tmp, "other.1-of-3.jsonl")
        rc, _, _ = run(["-m", MODEL, "-q", "-i", other, "-o", foreign, "--shard", "1/3"] + RESUME_FLAGS)
        check(rc in (0, 1), f"foreign shard: exit {rc}")
        rc, _, err = merge(inp, [files[0], foreign, files[2]], out)
        check(rc == 2 and b"another input" in err and not os.path.exists(out), f"foreign: exit {rc}: {err.decode()}")

        # a shard made with other output-shaping flags (while non-shaping ones do not matter)
        diff = os.path.join(tmp, "d.1-of-3.jsonl")
        rc, _, _ = run(base + ["-o", diff, "--shard", "1/3", "--max-tokens", "8"])
        check(rc in (0, 1), f"flags shard: exit {rc}")
        rc, _, err = merge(inp, [files[0], diff, files[2]], out)
        check(rc == 2 and b"output-shaping flags" in err and b"--max-tokens=8" in err, f"flags: exit {rc}: "
              f"{err.decode()}")
        same = os.path.join(tmp, "s.1-of-3.jsonl")
        rc, _, _ = run(["-m", MODEL, "-q", "-i", inp, "-o", same, "--shard", "1/3", "--max-num-seqs", "7",
                        "--num-kv-blocks", "40"])
        rc, merged, err = merge(inp, [files[0], same, files[2]])
        check(rc == 0 and merged == want, f"pool/batch flags refused or changed the bytes: exit {rc}: {err.decode()}")

        # one shard twice
        rc, _, err = merge(inp, [files[0], files[1], files[1], files[2]], out)
        check(rc == 2 and b"given twice" in err, f"shard twice: exit {rc}: {err.decode()}")
        # N that disagrees (a file known by its name only), a file that is no shard
        four = os.path.join(tmp, "x.1-of-4.jsonl")
        open(four, "w").close()
        rc, _, err = merge(inp, [files[0], four], out)
        check(rc == 2 and b"one of 3" in err, f"mixed N: exit {rc}: {err.decode()}")
        rc, _, err = merge(inp, [files[0], inp], out)
        check(rc == 2 and b"cannot tell which shard" in err, f"not a shard: exit {rc}: {err.decode()}")

        # a record written twice (the marker updated to the new size): exit 1, listed
        dup = open(files[2], "rb").read()
        first = dup.split(b"\n")[0] + b"\n"
        open(files[2], "wb").write(first + dup)
        m = json.load(open(files[2] + ".done"))
        m["output_bytes"] = len(first + dup)
        open(files[2] + ".done", "w").write(json.dumps(m) + "\n")
        rc, _, err = merge(inp, files, out)
        check(rc == 1 and b"answered again" in err and not os.path.exists(out), f"dup record: exit {rc}: "
              f"{err.decode()}")
        # ... and a file edited after its marker: refused
        open(files[2], "wb").write(dup)
        rc, _, err = merge(inp, files, out)
        check(rc == 2 and b"changed since" in err, f"edited shard: exit {rc}: {err.decode()}")

        # an unfinished shard (no marker): exit 1, said so
        open(files[2], "wb").write(dup)
        os.unlink(files[2] + ".done")
        rc, _, err = merge(inp, files, out)
        check(rc == 1 and b"has no marker" in err and not os.path.exists(out), f"unfinished: exit {rc}: "
              f"{err.decode()}")


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
    # the CPU time with its system share, the page faults and the peak
    # resident set (getrusage): the share agrees with the two times
    m = re.search(r"cpu time: ([0-9.]+) s user, ([0-9.]+) s system \(sys ([0-9.]+)%; (\d+) page faults, "
                  r"peak resident (\d+) MiB\)", text)
    check(m is not None, f"no cpu time line in {text[-800:]!r}")
    user, sys_s, share = float(m.group(1)), float(m.group(2)), float(m.group(3))
    if user + sys_s >= 0.5:  # (the printed times are rounded to 10 ms)
        check(abs(share - 100.0 * sys_s / (user + sys_s)) < 5.0, f"sys share {m.groups()}")
    check(int(m.group(4)) > 0 and int(m.group(5)) > 0, f"faults / resident {m.groups()}")
    recs = [json.loads(l) for l in lines_of(out)]
    m = recs[0]["metrics"]
    check(all(k in m for k in ("queue_ms", "first_token_ms", "total_ms", "preemptions")), "metrics keys")
    check(m["total_ms"] >= m["first_token_ms"] >= 0, "metrics values")
    three = b"".join(req.splitlines(keepends=True)[:3])
    rc, out, err = gen([], stdin_bytes=three)
    check(rc == 0 and len(lines_of(out)) == 3, f"--quiet run: exit {rc}")
    check(err == b"", f"--quiet printed {err[:200]!r}")


def case_profile_ops():
    """--profile-ops: the same records as without it, and a table on stderr
    (printed under --quiet too) with every op of the forward for the steps
    with prefill and the decode steps: times >= 0, shares summing to 100%,
    token counts that add up to every token the run computed."""
    names = ["embed", "input rmsnorm", "qkv matmul", "rope", "kv_write", "attention", "o matmul",
             "post rmsnorm", "gate_up matmul", "silu_mul", "down matmul", "head (norm, lm_head)"]
    inp, exp, flags, code = SAMPLE_RUNS[1]
    want = open(os.path.join(SAMPLES, exp), "rb").read()
    rc, out, err = gen(["-i", os.path.join(SAMPLES, inp), "--profile-ops"] + flags)
    check(rc == code, f"exit {rc}: {err.decode()[-1000:]}")
    check(out == want, "--profile-ops changed the records")
    text = err.decode()
    for kind in ("steps with prefill", "decode steps"):
        m = re.search(r"pagedgen: op profile, " + kind + r": (\d+) steps, (\d+) tokens, ([0-9.]+) ms", text)
        check(m is not None, f"no {kind!r} table in {text[:600]!r}")
        check(int(m.group(1)) > 0 and int(m.group(2)) >= int(m.group(1)), f"{kind}: counts {m.groups()}")
        block = text[m.end():].split("pagedgen: op profile", 1)[0]
        share = 0.0
        for name in names:
            row = re.search(r"pagedgen:   " + re.escape(name) + r" +([0-9.]+) ms +([0-9.]+) us/token +([0-9.]+)%", block)
            check(row is not None, f"{kind}: no row for {name!r}")
            share += float(row.group(3))
        check(abs(share - 100.0) < 0.5, f"{kind}: shares sum to {share}")
    check("tokens:" not in text, "the summary is printed under --quiet")
    # without --quiet: the profiled tokens are every token the forward ran,
    # the prompt tokens computed plus every generated token but each
    # output's last (it is sampled, never fed back)
    rc, out, err = run(["-m", MODEL, "-i", os.path.join(SAMPLES, inp), "--profile-ops"] + flags)
    text = err.decode()
    m = re.search(r"tokens: (\d+) prompt \(computed\), (\d+) generated", text)
    check(rc == code and m is not None, f"exit {rc}, no summary: {text[-600:]!r}")
    outputs = sum(len(r.get("outputs", [])) for r in map(json.loads, lines_of(out)))
    profiled = sum(int(x) for x in re.findall(r"op profile, [a-z ]+: \d+ steps, (\d+) tokens", text))
    want_tokens = int(m.group(1)) + int(m.group(2)) - outputs
    check(profiled == want_tokens, f"profiled {profiled} tokens, expected {want_tokens}")


def case_sliding_window_free():
    """stories260K as a MistralForCausalLM with sliding_window 24: freeing
    the KV blocks behind the window (default) and keeping them
    (--keep-out-of-window-blocks) give byte-identical outputs, through a
    tiny pool (preemption), chunked prefill and n > 1, with the pool checked
    after every step; and a request whose full length does not fit the pool
    runs only with freeing (its window's blocks fit)."""
    with tempfile.TemporaryDirectory() as d:
        cfg = json.load(open(os.path.join(MODEL, "config.json")))
        cfg.update({"architectures": ["MistralForCausalLM"], "model_type": "mistral",
                    "sliding_window": 24})
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f)
        for f in ("model.safetensors", "tokenizer.json", "tokenizer_config.json"):
            os.symlink(os.path.join(MODEL, f), os.path.join(d, f))
        reqs = [{"prompt": "Once upon a time", "max_tokens": 150, "temperature": 0.9, "seed": 3,
                 "n": 3, "ignore_eos": True},
                {"prompt": "The little dog " * 12, "max_tokens": 120, "ignore_eos": True,
                 "logprobs": 1},
                {"prompt": "Lily had a red ball.", "max_tokens": 200, "temperature": 0.7,
                 "seed": 9, "ignore_eos": True}]
        inp = "".join(json.dumps(r) + "\n" for r in reqs).encode()
        outs = []
        for extra in ([], ["--keep-out-of-window-blocks"]):
            rc, out, err = run(["-m", d, "-q", "--num-kv-blocks", "56", "--block-size", "4",
                                "--max-num-batched-tokens", "16", "--check-invariants"] + extra,
                               stdin_bytes=inp)
            check(rc == 0, f"exit {rc}: {err.decode()[-2000:]} {out.decode()[:2000]}")
            outs.append(out)
        check(outs[0] == outs[1], "outputs differ with and without freeing out-of-window blocks")
        one = (json.dumps({"prompt": "Once upon a time", "max_tokens": 200, "ignore_eos": True})
               + "\n").encode()
        small = ["-m", d, "-q", "--num-kv-blocks", "20", "--block-size", "4", "--max-num-batched-tokens", "16"]
        rc, out, err = run(small, stdin_bytes=one)
        check(rc == 0 and b'"error"' not in out, f"freeing on, 20 blocks: {out.decode()[:500]}")
        rc, out, err = run(small + ["--keep-out-of-window-blocks"], stdin_bytes=one)
        check(b"needs" in out and b"KV blocks" in out, f"freeing off, 20 blocks: {out.decode()[:500]}")


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
