"""Qwen model folders end to end with the real Qwen3 tokenizer (issue 22,
"Done when"): one JSONL of completion, chat and embedding lines runs
through the pagedgen binary on three synthetic checkpoints.

usage: test_qwen_batch.py PAGEDGEN

  qwen2.5   Qwen2ForCausalLM (q/k/v biases, tied), Qwen3's tokenizer files
            (Qwen2.5 and Qwen3 share the byte-level BPE vocabulary)
  qwen3     Qwen3ForCausalLM (q/k norms, head_dim != hidden / heads)
  qwen3-emb Qwen3-Embedding's layout: Qwen3ForCausalLM + sentence-transformers
            modules.json (Pooling with pooling_mode_lasttoken, Normalize)

Every checkpoint has the tiny shapes of scripts/make-synthetic-qwen's
tiny presets with Qwen3's 151,936-entry vocabulary, so the tokenizer's ids
are real. For each: the completion's greedy tokens and the embedding
vectors equal tests/e2e/qwen_reference.py's float64 forward (tokens equal;
vectors within 1e-5), the chat line renders the model's own template with
enable_thinking false and ends "length" after its max_tokens, and the
records come back in input order.

numpy comes from /usr/bin/python3 when the python3 running this lacks it;
without numpy the test is skipped (exit 77), or fails when CI=true.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy_or_skip  # noqa: E402

numpy_or_skip.require("test_qwen_batch")
import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
from qwen_reference import QwenReference  # noqa: E402

SRC = os.environ.get("PAGEDGEN_SOURCE_ROOT", os.path.dirname(os.path.dirname(HERE)))
SHARED = os.environ.get("PAGEDGEN_SHARED", os.path.join(SRC, "..", "shared"))
GENERATOR = os.path.join(SRC, "scripts", "make-synthetic-qwen")
TOKENIZER = os.path.join(SHARED, "tokenizers", "qwen3")
MAX_TOKENS = 6
# token ids of the Qwen3 vocabulary (a completion prompt and an embedding input)
PROMPT_IDS = [9707, 11, 1879, 0, 15846, 374, 279]
EMBED_IDS = [785, 3974, 13876, 38835, 34208, 916, 279, 15678, 5562, 13]


class Fail(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Fail(msg)


def make_model(d, family, embedding=False):
    preset = "tiny-qwen2" if family == "qwen2" else "tiny-qwen3"
    args = [sys.executable, GENERATOR, d, "--preset", preset, "--vocab", "151936", "--std", "0.25",
            "--seed", "11" if family == "qwen2" else "12", "--tie"]
    p = subprocess.run(args, capture_output=True)
    check(p.returncode == 0, f"make-synthetic-qwen: {p.stderr.decode()[-800:]}")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(TOKENIZER, f), d)
    if embedding:
        # Qwen3-Embedding's sentence-transformers files (last token, normalized)
        with open(os.path.join(d, "modules.json"), "w") as f:
            json.dump([{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                       {"idx": 1, "name": "1", "path": "1_Pooling",
                        "type": "sentence_transformers.models.Pooling"},
                       {"idx": 2, "name": "2", "path": "2_Normalize",
                        "type": "sentence_transformers.models.Normalize"}], f)
        os.makedirs(os.path.join(d, "1_Pooling"))
        with open(os.path.join(d, "1_Pooling", "config.json"), "w") as f:
            json.dump({"word_embedding_dimension": 64, "pooling_mode_cls_token": False,
                       "pooling_mode_mean_tokens": False, "pooling_mode_lasttoken": True,
                       "include_prompt": True}, f)


def run_batch(exe, model):
    lines = [
        {"id": "completion", "prompt_token_ids": PROMPT_IDS, "max_tokens": MAX_TOKENS, "temperature": 0,
         "ignore_eos": True},
        {"id": "chat", "messages": [{"role": "user", "content": "Give me one word."}],
         "chat_template_kwargs": {"enable_thinking": False}, "max_tokens": MAX_TOKENS, "temperature": 0,
         "ignore_eos": True},
        {"id": "embedding", "input": EMBED_IDS},
        {"id": "embedding-text", "input": "The café opened at 9."},
    ]
    text = "".join(json.dumps(x) + "\n" for x in lines)
    p = subprocess.run([exe, "-m", model, "-q", "--block-size", "4"], input=text.encode(),
                       capture_output=True, timeout=300)
    check(p.returncode == 0, f"pagedgen: exit {p.returncode}: {p.stderr.decode()[-1500:]}")
    recs = [json.loads(x) for x in p.stdout.decode().splitlines()]
    check([r.get("id") for r in recs] == ["completion", "chat", "embedding", "embedding-text"],
          f"records out of order or missing: {[r.get('id') for r in recs]}")
    return recs


def check_model(exe, name, family, embedding=False):
    with tempfile.TemporaryDirectory() as d:
        make_model(d, family, embedding)
        recs = run_batch(exe, d)
        ref = QwenReference(d)
        want = [t for t, _, _ in ref.greedy(PROMPT_IDS, MAX_TOKENS)]
        got = recs[0]["outputs"][0]["token_ids"]
        check(got == want, f"{name}: completion {got}, the float64 reference {want}")
        chat = recs[1]["outputs"][0]
        check(len(chat["token_ids"]) == MAX_TOKENS and chat["finish_reason"] == "length",
              f"{name}: chat record {chat}")
        data = recs[2]["data"] + recs[3]["data"]
        check(len(data) == 2 and all(len(e["embedding"]) == 64 for e in data), f"{name}: embedding shapes")
        h = ref.hidden(EMBED_IDS)[-1]
        ref_vec = h / np.linalg.norm(h)
        err = float(np.max(np.abs(np.asarray(data[0]["embedding"]) - ref_vec)))
        check(err <= 1e-5, f"{name}: embedding of the id input differs from the reference by {err:.3g}")
        norm = float(np.linalg.norm(np.asarray(data[1]["embedding"])))
        check(abs(norm - 1.0) <= 1e-5, f"{name}: the text input's embedding has norm {norm}")
        check(recs[2]["usage"]["prompt_tokens"] == len(EMBED_IDS), f"{name}: usage {recs[2]['usage']}")
        print(f"{name}: completion {MAX_TOKENS} tokens = reference, chat ok, "
              f"embedding max |diff| {err:.2g} vs float64")


def main():
    exe = sys.argv[1]
    if not os.path.isfile(os.path.join(TOKENIZER, "tokenizer.json")):
        msg = f"test_qwen_batch: {TOKENIZER} is missing"
        if os.environ.get("CI") == "true":
            sys.exit(msg)
        print("SKIP " + msg)
        return 77
    try:
        check_model(exe, "qwen2.5", "qwen2")
        check_model(exe, "qwen3", "qwen3")
        check_model(exe, "qwen3-emb", "qwen3", embedding=True)
    except Fail as e:
        print(f"FAIL {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
