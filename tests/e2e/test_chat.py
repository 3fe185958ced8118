#!/usr/bin/env python3
"""Process-level tests of chat requests (suite e2e), stdlib only: the
`pagedgen chat-template` subcommand against ../shared/chat_templates/goldens.jsonl
and chat batches through `pagedgen generate` on stories260K.

usage: test_chat.py PAGEDGEN CASE     (meson runs each case as a test)

Test data: $PAGEDGEN_SHARED (chat_templates, tokenizers, models/stories260K).
Without it the case is skipped (exit 77), or fails when CI=true.
"""
import json
import os
import sys
import tempfile

import test_cli
from test_cli import Fail, check, lines_of

SHARED = test_cli.SHARED
MODEL = test_cli.MODEL
SAMPLES = test_cli.SAMPLES
CHATML = os.path.join(SAMPLES, "chatml.jinja")
TEMPLATES = os.path.join(SHARED, "chat_templates")
DATE = "2026-07-26"  # the day goldens.jsonl pins strftime_now to


def run(args, **kw):
    return test_cli.run(args, **kw)


def gen(args, **kw):
    return test_cli.gen(args, **kw)


def tokenizer_folder(tmp, name, template, bos, eos, llama3):
    """A tokenizer folder holding the template and bos/eos in its
    tokenizer_config.json beside a symlink to a shared tokenizer.json."""
    d = os.path.join(tmp, name)
    os.makedirs(d)
    src = os.path.join(SHARED, "tokenizers", "llama3" if llama3 else "llama2", "tokenizer.json")
    os.symlink(src, os.path.join(d, "tokenizer.json"))
    cfg = {"bos_token": bos, "eos_token": eos}
    if template is not None:
        cfg["chat_template"] = template
    with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False)
    return d


def write_lines(path, objs):
    with open(path, "w", encoding="utf-8") as f:
        for o in objs:
            f.write(json.dumps(o, ensure_ascii=False) + "\n")


# ---- cases -------------------------------------------------------------------

def case_chat_goldens():
    """`pagedgen chat-template` reproduces every line of goldens.jsonl byte
    for byte (the template from tokenizer_config.json, and again given by
    --chat-template FILE), errors included; token_ids are the text's
    tokenization without an added BOS, with special tokens as tokens."""
    gold = [json.loads(l) for l in open(os.path.join(TEMPLATES, "goldens.jsonl"), encoding="utf-8")]
    by_template = {}
    for g in gold:
        by_template.setdefault(g["template"], []).append(g)
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, cases in sorted(by_template.items()):
            path = os.path.join(TEMPLATES, "templates", name + ".jinja")
            template = open(path, encoding="utf-8").read()
            bos, eos = cases[0]["bos_token"], cases[0]["eos_token"]
            check(all(c["bos_token"] == bos and c["eos_token"] == eos for c in cases), f"{name}: bos/eos vary")
            llama3 = bos == "<|begin_of_text|>"
            inp = os.path.join(tmp, name + ".jsonl")
            write_lines(inp, cases)  # golden lines as they are: other fields are ignored
            for how in ("config", "flag"):
                tdir = tokenizer_folder(tmp, f"{name}-{how}", template if how == "config" else None,
                                        bos, eos, llama3)
                args = ["chat-template", "--tokenizer", tdir, "--chat-template-date", DATE, "-i", inp]
                if how == "flag":
                    args += ["--chat-template", path]
                rc, out, err = run(args, timeout=120)
                want_rc = 1 if any("error" in c for c in cases) else 0
                if rc != want_rc:
                    failures.append(f"{name} ({how}): exit {rc}, expected {want_rc}: {err.decode()[-500:]}")
                    continue
                recs = [json.loads(l) for l in lines_of(out)]
                check(len(recs) == len(cases), f"{name}: {len(recs)} records for {len(cases)} lines")
                for k, (c, r) in enumerate(zip(cases, recs)):
                    tag = f"{name}/{c['case']} ({how})"
                    if "error" in c:
                        if "error" not in r:
                            failures.append(f"{tag}: rendered, expected the error {c['error']!r}")
                        elif c["error"] not in r["error"]["message"] or r["error"]["line"] != k + 1:
                            failures.append(f"{tag}: error {r['error']!r} lacks {c['error']!r}")
                        continue
                    if "error" in r:
                        failures.append(f"{tag}: error {r['error']['message']!r}")
                    elif r["text"] != c["text"]:
                        failures.append(f"{tag}: text differs:\n got  {r['text']!r}\n want {c['text']!r}")
                    else:
                        ids = r["token_ids"]
                        bos_id = 128000 if llama3 else 1
                        n_bos = c["text"].count(bos) if bos in ("<s>", "<|begin_of_text|>") else 0
                        if ids.count(bos_id) != n_bos or (n_bos and ids[0] != bos_id):
                            failures.append(f"{tag}: {ids.count(bos_id)} BOS ids, the text has {n_bos} "
                                            f"(ids start {ids[:4]})")
                        if llama3 and "<|eot_id|>" in c["text"] and 128009 not in ids:
                            failures.append(f"{tag}: <|eot_id|> not tokenized as 128009")
        check(not failures, f"{len(failures)} golden failures:\n" + "\n".join(failures[:12]))


def case_chat_tokens():
    """The ids of a rendered prompt are the text's ids without an added BOS
    (the same as `tokenize --no-special`), special tokens split out."""
    with tempfile.TemporaryDirectory() as tmp:
        tmpl = open(os.path.join(TEMPLATES, "templates", "llama-3.1-instruct.jinja"), encoding="utf-8").read()
        tdir = tokenizer_folder(tmp, "l3", tmpl, "<|begin_of_text|>", "<|eot_id|>", True)
        inp = os.path.join(tmp, "in.jsonl")
        write_lines(inp, [{"messages": [{"role": "user", "content": "Hello <|eot_id|> there"}],
                           "add_generation_prompt": True}])
        rc, out, err = run(["chat-template", "--tokenizer", tdir, "--chat-template-date", DATE, "-i", inp])
        check(rc == 0, f"exit {rc}: {err.decode()[-500:]}")
        rec = json.loads(lines_of(out)[0])
        check(rec["token_ids"][0] == 128000 and rec["token_ids"].count(128000) == 1, "one BOS, first")
        check(rec["token_ids"][-4:] == [128006, 78191, 128007, 271], f"generation prompt ids {rec['token_ids'][-4:]}")
        # <|eot_id|>: the one in the content too (the 3.1 template writes 2 more)
        check(rec["token_ids"].count(128009) == rec["text"].count("<|eot_id|>") == 3,
              "a special token in the content is a token too")
        tin = os.path.join(tmp, "t.jsonl")
        write_lines(tin, [{"text": rec["text"]}])
        rc, out, _ = run(["tokenize", "--tokenizer", tdir, "--no-special", "-i", tin])
        check(rc == 0 and json.loads(lines_of(out)[0])["ids"] == rec["token_ids"],
              "token_ids differ from tokenize --no-special of the text")


def case_chat_batch():
    """The chat samples (openai /v1/chat/completions lines with a completions
    line among them, and jsonl messages lines) run end to end with
    --chat-template, byte-identical to their expected outputs with the
    default pool and with a 40-block pool (constant preemption)."""
    for inp, exp in (("chat_batch.jsonl", "chat_batch.out.jsonl"),
                     ("chat_messages.jsonl", "chat_messages.out.jsonl")):
        want = open(os.path.join(SAMPLES, exp), "rb").read()
        for flags in ([], ["--num-kv-blocks", "40", "--max-num-seqs", "8", "--max-num-batched-tokens", "64"]):
            rc, out, err = gen(["--chat-template", CHATML, "-i", os.path.join(SAMPLES, inp)] + flags)
            check(rc == 0, f"{inp} {flags}: exit {rc}: {err.decode()[-1000:]}")
            check(out == want, f"{inp} {flags}: output differs from samples/{exp}")
    # the shapes: vLLM's ChatCompletionResponse body
    recs = [json.loads(l) for l in lines_of(open(os.path.join(SAMPLES, "chat_batch.out.jsonl"), "rb").read())]
    body = recs[0]["response"]["body"]
    check(list(body) == ["id", "object", "created", "model", "choices", "service_tier", "system_fingerprint",
                         "usage", "prompt_logprobs", "kv_transfer_params"], f"body keys {list(body)}")
    check(body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-") and body["created"] == 0,
          "chat body head")
    msg = body["choices"][0]["message"]
    check(list(msg) == ["role", "content", "refusal", "annotations", "audio", "function_call", "tool_calls",
                        "reasoning_content"] and msg["role"] == "assistant" and msg["tool_calls"] == [],
          f"message keys {list(msg)}")
    check(list(body["usage"]) == ["prompt_tokens", "total_tokens", "completion_tokens", "prompt_tokens_details"],
          "usage keys")
    lp = [r for r in recs if r["custom_id"] == "chat-3"][0]["response"]["body"]["choices"][0]["logprobs"]
    first = lp["content"][0]
    check(list(first) == ["token", "logprob", "bytes", "top_logprobs"] and len(first["top_logprobs"]) == 2,
          f"logprobs entry {first}")
    check(bytes(first["bytes"]).decode() == first["token"], "bytes are the token's UTF-8")
    comp = [r for r in recs if r["custom_id"] == "completion-1"][0]["response"]["body"]
    check(comp["object"] == "text_completion", "a /v1/completions line in a chat batch")
    # no max_tokens: the rest of the context (vLLM's chat default), unless --max-tokens
    one = json.dumps({"messages": [{"role": "user", "content": "Once upon a time"}], "temperature": 0,
                      "ignore_eos": True}) + "\n"
    rc, out, err = gen(["--chat-template", CHATML], stdin_bytes=one.encode())
    r = json.loads(lines_of(out)[0])
    check(rc == 0 and r["usage"]["prompt_tokens"] + r["usage"]["completion_tokens"] == 512,
          f"default max_tokens: {r.get('usage')}")
    rc, out, err = gen(["--chat-template", CHATML, "--max-tokens", "5"], stdin_bytes=one.encode())
    check(json.loads(lines_of(out)[0])["usage"]["completion_tokens"] == 5, "--max-tokens applies to chat lines")
    # the model's eos list (config + generation_config.json, the place where
    # instruct models list their end-of-turn token, e.g. Llama 3's <|eot_id|>)
    # ends chat generations: a copy of stories260K whose generation_config
    # adds "\n" (id 13) stops there with finish_reason stop, stop_reason 13
    # (without it the same prompt writes id 13 as its 12th token)
    with tempfile.TemporaryDirectory() as tmp:
        mdir = os.path.join(tmp, "model")
        os.makedirs(mdir)
        for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
            os.symlink(os.path.join(MODEL, f), os.path.join(mdir, f))
        with open(os.path.join(mdir, "generation_config.json"), "w") as f:
            json.dump({"bos_token_id": 1, "eos_token_id": [2, 13], "do_sample": False}, f)
        greedy = json.dumps({"messages": [{"role": "user", "content": "Once upon a time"}],
                             "temperature": 0}) + "\n"
        rc, out, err = run(["-m", mdir, "-q", "--chat-template", CHATML, "--max-tokens", "64"],
                           stdin_bytes=greedy.encode())
        o = json.loads(lines_of(out)[0])["outputs"][0]
        # (the stopping eos is the last of token_ids, as in vLLM v1, and its
        # text is left out; a generation_config eos other than the
        # tokenizer's is one of vLLM's stop_token_ids, so stop_reason names it)
        check(rc == 0 and o["finish_reason"] == "stop" and o["stop_reason"] == 13
              and o["token_ids"][-1] == 13 and 13 not in o["token_ids"][:-1] and not o["text"].endswith("\n")
              and len(o["token_ids"]) < 64, f"end-of-turn from generation_config: {o}")
        # the same id as the tokenizer's own eos_token: stop_reason null
        os.unlink(os.path.join(mdir, "tokenizer_config.json"))
        tc = json.load(open(os.path.join(MODEL, "tokenizer_config.json")))
        tc["eos_token"] = "<0x0A>"
        with open(os.path.join(mdir, "tokenizer_config.json"), "w") as f:
            json.dump(tc, f)
        rc, out, err = run(["-m", mdir, "-q", "--chat-template", CHATML, "--max-tokens", "64"],
                           stdin_bytes=greedy.encode())
        o2 = json.loads(lines_of(out)[0])["outputs"][0]
        check(rc == 0 and o2["token_ids"] == o["token_ids"] and o2["stop_reason"] is None,
              f"the tokenizer's eos: {o2} {err.decode()[-300:]}")
    # --include-prompt: the rendered prompt
    rc, out, err = gen(["--chat-template", CHATML, "--max-tokens", "2", "--include-prompt"],
                       stdin_bytes=one.encode())
    r = json.loads(lines_of(out)[0])
    check(r["prompt"] == "<s><|im_start|>user\nOnce upon a time<|im_end|>\n<|im_start|>assistant\n"
          and r["prompt_token_ids"][0] == 1 and r["prompt_token_ids"].count(1) == 1,
          f"rendered prompt {r['prompt']!r} {r['prompt_token_ids'][:3]}")


def case_chat_errors():
    """A template that does not parse is refused at start-up (exit 3, its
    line and column); raise_exception and render errors are an error record
    for that line only and the run goes on; no template is a per-line error
    naming the fix."""
    with tempfile.TemporaryDirectory() as tmp:
        bad = os.path.join(tmp, "bad.jinja")
        with open(bad, "w") as f:
            f.write("{{ bos_token }}\n{% for m in messages %}{{ m.content }}\n{% endif %}\n")
        line = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}) + "\n"
        rc, out, err = gen(["--chat-template", bad], stdin_bytes=line.encode())
        text = err.decode()
        check(rc == 3 and out == b"", f"bad template: exit {rc}, expected 3")
        check("line 3" in text and "column" in text and bad in text, f"bad template message: {text[-400:]!r}")
        rc, out, err = run(["chat-template", "--tokenizer", MODEL, "--chat-template", bad], stdin_bytes=line.encode())
        check(rc == 3 and "line 3" in err.decode(), f"chat-template with a bad template: exit {rc}")
        rc, _, err = gen(["--chat-template", os.path.join(tmp, "missing.jinja")], stdin_bytes=line.encode())
        check(rc == 3 and b"missing.jinja" in err, f"missing template file: exit {rc}")

        # raise_exception (chatml.jinja refuses unknown roles) on one line of three
        lines = [{"id": "a", "messages": [{"role": "user", "content": "Once upon a time"}], "max_tokens": 4},
                 {"id": "b", "messages": [{"role": "tool", "content": "x"}], "max_tokens": 4},
                 {"id": "c", "messages": [{"role": "user", "content": "Tom"}], "max_tokens": 4},
                 {"id": "d", "messages": [{"content": "no role"}], "max_tokens": 4}]
        data = "".join(json.dumps(l) + "\n" for l in lines).encode()
        rc, out, err = gen(["--chat-template", CHATML], stdin_bytes=data)
        recs = [json.loads(l) for l in lines_of(out)]
        check(rc == 1 and len(recs) == 4, f"raise_exception run: exit {rc}, {len(recs)} records")
        check("outputs" in recs[0] and "outputs" in recs[2], "the other lines ran")
        check(recs[1]["error"]["message"].endswith("unknown role: tool") or
              "unknown role: tool" in recs[1]["error"]["message"], f"raise_exception message {recs[1]}")
        check(recs[1]["error"]["line"] == 2 and recs[1]["id"] == "b", "error record line/id")
        check("error" in recs[3] and "role" in recs[3]["error"]["message"], f"message without a role: {recs[3]}")
        # an undefined attribute is jinja2's UndefinedError, for that line only
        und = os.path.join(tmp, "undef.jinja")
        with open(und, "w") as f:
            f.write("{{ bos_token }}{% if messages[0]['content'] == 'boom' %}{{ messages[0]['content'].foo.bar }}"
                    "{% endif %}{{ messages[0]['content'] }}")
        two = [{"messages": [{"role": "user", "content": "boom"}], "max_tokens": 2},
               {"messages": [{"role": "user", "content": "Once"}], "max_tokens": 2}]
        rc, out, _ = gen(["--chat-template", und], stdin_bytes="".join(json.dumps(l) + "\n" for l in two).encode())
        recs2 = [json.loads(l) for l in lines_of(out)]
        check(rc == 1 and "'str object' has no attribute 'foo'" in recs2[0]["error"]["message"]
              and "outputs" in recs2[1], f"undefined attribute: {recs2}")
        # the same through the subcommand, and openai error records
        rc, out, _ = run(["chat-template", "--tokenizer", MODEL, "--chat-template", CHATML], stdin_bytes=data)
        recs = [json.loads(l) for l in lines_of(out)]
        check(rc == 1 and "unknown role: tool" in recs[1]["error"]["message"] and "text" in recs[0],
              "chat-template raise_exception")
        oa = {"custom_id": "x", "method": "POST", "url": "/v1/chat/completions",
              "body": {"messages": [{"role": "tool", "content": "x"}]}}
        rc, out, _ = gen(["--chat-template", CHATML], stdin_bytes=(json.dumps(oa) + "\n").encode())
        r = json.loads(lines_of(out)[0])
        check(rc == 1 and r["response"]["status_code"] == 400 and "unknown role: tool" in r["error"]["message"],
              f"openai raise_exception record {r}")

        # continue_final_message alone: add_generation_prompt defaults to true
        # here, and transformers refuses the pair (so does vLLM, through it)
        cfm = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "He"}],
               "continue_final_message": True, "max_tokens": 2}
        rc, out, _ = gen(["--chat-template", CHATML], stdin_bytes=(json.dumps(cfm) + "\n").encode())
        r = json.loads(lines_of(out)[0])
        check(rc == 1 and "not compatible" in r["error"]["message"], f"continue_final_message alone: {r}")
        cfm["add_generation_prompt"] = False
        rc, out, _ = gen(["--chat-template", CHATML, "--include-prompt"],
                         stdin_bytes=(json.dumps(cfm) + "\n").encode())
        r = json.loads(lines_of(out)[0])
        check(rc == 0 and r["prompt"].endswith("<|im_start|>assistant\nHe"), f"continue_final_message: {r}")
        # null chat fields = not set
        nul = {"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": None,
               "continue_final_message": None, "chat_template_kwargs": None, "tools": None, "documents": None,
               "max_tokens": None, "max_completion_tokens": None, "logprobs": None, "top_logprobs": None}
        rc, out, _ = gen(["--chat-template", CHATML, "--include-prompt", "--max-tokens", "2"],
                         stdin_bytes=(json.dumps(nul) + "\n").encode())
        r = json.loads(lines_of(out)[0])
        check(rc == 0 and r["prompt"].endswith("<|im_start|>assistant\n") and "logprobs" not in r["outputs"][0],
              f"null chat fields: {r}")
        # no template: stories260K ships none
        rc, out, err = gen([], stdin_bytes=data)
        recs = [json.loads(l) for l in lines_of(out)]
        check(rc == 1 and all(r["error"]["message"] == "model has no chat template: pass --chat-template FILE"
                              for r in recs), f"no template: {recs[:1]}")
        rc, out, err = run(["chat-template", "--tokenizer", MODEL], stdin_bytes=data)
        check(rc == 1 and b"no chat template" in err, f"chat-template without a template: exit {rc}")
        # date flag and SOURCE_DATE_EPOCH
        dt = os.path.join(tmp, "date.jinja")
        with open(dt, "w") as f:
            f.write("{{ strftime_now('%Y-%m-%d') }}")
        one = (json.dumps({"messages": [{"role": "user", "content": "x"}]}) + "\n").encode()
        rc, out, _ = run(["chat-template", "--tokenizer", MODEL, "--chat-template", dt, "--chat-template-date",
                          DATE], stdin_bytes=one)
        check(rc == 0 and json.loads(lines_of(out)[0])["text"] == DATE, f"--chat-template-date: {out[:200]!r}")
        env = dict(os.environ, SOURCE_DATE_EPOCH="0")
        p = test_cli.subprocess.run([test_cli.EXE, "chat-template", "--tokenizer", MODEL, "--chat-template", dt],
                                    input=one, stdout=test_cli.subprocess.PIPE, stderr=test_cli.subprocess.PIPE,
                                    env=env, timeout=60)
        check(p.returncode == 0 and json.loads(lines_of(p.stdout)[0])["text"] == "1970-01-01",
              f"SOURCE_DATE_EPOCH: {p.stdout[:200]!r}")
        env["SOURCE_DATE_EPOCH"] = "yesterday"
        p = test_cli.subprocess.run([test_cli.EXE, "chat-template", "--tokenizer", MODEL, "--chat-template", dt],
                                    input=one, stdout=test_cli.subprocess.PIPE, stderr=test_cli.subprocess.PIPE,
                                    env=env, timeout=60)
        check(p.returncode == 2 and b"SOURCE_DATE_EPOCH" in p.stderr, f"bad SOURCE_DATE_EPOCH: exit {p.returncode}")


def case_chat_help():
    """--help of generate and chat-template list the chat flags."""
    rc, out, _ = run(["generate", "--help"])
    for f in ("--chat-template FILE", "--chat-template-date", "SOURCE_DATE_EPOCH", "/v1/chat/completions"):
        check(f in out.decode(), f"generate help lacks {f}")
    rc, out, _ = run(["chat-template", "--help"])
    for f in ("--tokenizer", "--chat-template", "--chat-template-date", "--input", "--output", "token_ids"):
        check(rc == 0 and f in out.decode(), f"chat-template help lacks {f}")
    rc, out, _ = run(["--help"])
    check("chat-template" in out.decode(), "overview lacks chat-template")


CASES = {name[5:]: fn for name, fn in globals().items() if name.startswith("case_")}


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    test_cli.EXE = os.path.abspath(sys.argv[1])
    if not os.path.isdir(MODEL) or not os.path.isdir(TEMPLATES):
        if os.environ.get("CI") == "true":
            sys.exit(f"test data missing under {SHARED} (set PAGEDGEN_SHARED)")
        print(f"skip: no test data under {SHARED!r} (set PAGEDGEN_SHARED)")
        sys.exit(77)
    try:
        CASES[sys.argv[2]]()
    except Fail as e:
        print(f"FAIL {sys.argv[2]}: {e}")
        sys.exit(1)
    print(f"ok {sys.argv[2]}")


if __name__ == "__main__":
    main()
