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


def requests(questions):
    for q in questions:
        for k, choice in enumerate(q["choices"]):
            body = {"prompt": q["context"] + choice, "echo": True, "max_tokens": 0,
                    "logprobs": 1, "temperature": 0}
            print(json.dumps({"custom_id": f"{q['id']}/{k}", "method": "POST", "url": "/v1/completions",
                              "body": body}))


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


def score(questions, out_path):
    recs = {r["custom_id"]: r for r in load(out_path)}
    per_q, acc, acc_norm = [], 0, 0
    for q in questions:
        lps = [choice_logprob(recs[f"{q['id']}/{k}"], c) for k, c in enumerate(q["choices"])]
        norm = [lp / len(c.encode("utf-8")) for lp, c in zip(lps, q["choices"])]
        pick = max(range(len(lps)), key=lambda k: (lps[k], -k))
        pick_n = max(range(len(norm)), key=lambda k: (norm[k], -k))
        acc += pick == q["answer"]
        acc_norm += pick_n == q["answer"]
        per_q.append({"id": q["id"], "logprobs": [round(x, 6) for x in lps], "pick": pick, "answer": q["answer"]})
    n = len(questions)
    print(json.dumps({"questions": n, "acc": acc / n, "acc_norm": acc_norm / n, "per_question": per_q}))


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "requests":
        requests(load(sys.argv[2]))
    elif len(sys.argv) == 4 and sys.argv[1] == "score":
        score(load(sys.argv[2]), sys.argv[3])
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
