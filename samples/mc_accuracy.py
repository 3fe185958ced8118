#!/usr/bin/env python3
"""mc_accuracy: a multiple-choice evaluation as a CI job runs it, in the
shape of lm-evaluation-harness's loglikelihood tasks (stdlib only).

  mc_accuracy.py requests QUESTIONS.jsonl > REQUESTS.jsonl
      one OpenAI batch line per (question, choice): /v1/completions with
      prompt = context + choice, echo true, max_tokens 0, logprobs 1 (what
      lm-eval's local-completions model sends), custom_id "<id>/<choice>".
  mc_accuracy.py score QUESTIONS.jsonl OUTPUT.jsonl
      reads pagedgen's output: a choice's score is the sum of the logprobs of
      its own tokens (those whose text_offset is at or after where the choice's
      text begins: the prompt's tokens are echoed first); prints one JSON
      line {"questions", "acc", "acc_norm", "per_question": [...]}: acc picks
      the highest sum, acc_norm the highest sum per byte of the choice
      (lm-eval's acc_norm), ties to the first choice.

  mc_accuracy.py requests QUESTIONS.jsonl --models BASE,FT_A,... > REQUESTS.jsonl
  mc_accuracy.py score QUESTIONS.jsonl OUTPUT.jsonl --models BASE,FT_A,...
      several models in one run (LoRA adapters of one base model: pagedgen
      --lora FT_A=DIR ...): every request once per model, with the body's
      "model" naming it (the base model's served name, or an adapter's) and
      custom_id "<model>:<id>/<choice>"; score prints one line per model,
      {"model", "questions", "acc", "acc_norm", "per_question"}.

QUESTIONS.jsonl lines: {"id", "context", "choices": [...], "answer": index}.
A choice should start with a space so that the context's tokens end where it
begins (the tokenizer then does not merge across the boundary); a choice whose
start falls inside a token is an error.
"""
import json
import sys


def load(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def requests(questions, models=None):
    for m in models or [None]:
        for q in questions:
            for k, choice in enumerate(q["choices"]):
                body = {"prompt": q["context"] + choice, "echo": True, "max_tokens": 0,
                        "logprobs": 1, "temperature": 0}
                if m is not None:
                    body = {"model": m, **body}
                cid = f"{q['id']}/{k}" if m is None else f"{m}:{q['id']}/{k}"
                print(json.dumps({"custom_id": cid, "method": "POST", "url": "/v1/completions", "body": body}))


def choice_logprob(record, choice):
    lp = record["response"]["body"]["choices"][0]["logprobs"]
    toks, offs, lps = lp["tokens"], lp["text_offset"], lp["token_logprobs"]
    end = offs[-1] + len(toks[-1])          # offsets index the echoed tokens' text
    start = end - len(choice)
    if start not in offs:
        raise SystemExit(f"{record['custom_id']}: the choice {choice!r} does not start at a token boundary")
    i = offs.index(start)
    if i == 0:
        raise SystemExit(f"{record['custom_id']}: the choice covers the whole prompt")
    return sum(lps[i:])


def score(questions, out_path, model=None):
    recs = {r["custom_id"]: r for r in load(out_path)}
    pre = "" if model is None else f"{model}:"
    per_q, acc, acc_norm = [], 0, 0
    for q in questions:
        lps = [choice_logprob(recs[f"{pre}{q['id']}/{k}"], c) for k, c in enumerate(q["choices"])]
        norm = [lp / len(c.encode("utf-8")) for lp, c in zip(lps, q["choices"])]
        pick = max(range(len(lps)), key=lambda k: (lps[k], -k))
        pick_n = max(range(len(norm)), key=lambda k: (norm[k], -k))
        acc += pick == q["answer"]
        acc_norm += pick_n == q["answer"]
        per_q.append({"id": q["id"], "logprobs": [round(x, 6) for x in lps], "pick": pick, "answer": q["answer"]})
    n = len(questions)
    head = {} if model is None else {"model": model}
    print(json.dumps({**head, "questions": n, "acc": acc / n, "acc_norm": acc_norm / n, "per_question": per_q}))


def main():
    args, models = sys.argv[1:], None
    if len(args) >= 2 and args[-2] == "--models":
        models = [m for m in args[-1].split(",") if m]
        args = args[:-2]
    if len(args) == 2 and args[0] == "requests":
        requests(load(args[1]), models)
    elif len(args) == 3 and args[0] == "score":
        for m in models or [None]:
            score(load(args[1]), args[2], m)
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
