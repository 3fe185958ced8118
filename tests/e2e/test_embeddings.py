#!/usr/bin/env python3
"""Embedding lines end to end (suite e2e): the pagedgen binary on stories260K
against a float64 numpy reference of the pooled final-norm hidden states
(Hugging Face LlamaModel + vLLM's pooler: last / mean / cls, [:dimensions],
F.normalize).

usage: test_embeddings.py PAGEDGEN CASE     (numpy: run with /usr/bin/python3)

Cases: reference (every pooling, mixed with generation lines, chunked and
not, prefix caching on and off: bit-identical records, max |diff| <= 1e-5),
st_files (a model folder with sentence-transformers files and Matryoshka
dimensions), headless (the checkpoint saved without "model." and
lm_head), errors (bad embedding lines: error records in place, exit 1).
Without $PAGEDGEN_SHARED or numpy the case is skipped (exit 77), or fails
when CI=true.
"""
import base64
import json
import os
import struct
import subprocess
import sys
import tempfile

SHARED = os.environ.get("PAGEDGEN_SHARED", "")
MODEL = os.path.join(SHARED, "models", "stories260K")


def skip(why):
    print("skip: " + why)
    sys.exit(1 if os.environ.get("CI") == "true" else 77)


try:
    import numpy as np
except ImportError:
    np = None


# ---- the float64 reference --------------------------------------------------

def load_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        raw = data[8 + n + a:8 + n + b]
        if t["dtype"] == "F32":
            arr = np.frombuffer(raw, dtype="<f4")
        elif t["dtype"] == "F16":
            arr = np.frombuffer(raw, dtype="<f2")
        elif t["dtype"] == "BF16":
            arr = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view("<f4")
        else:
            raise ValueError(t["dtype"])
        out[name] = arr.astype(np.float64).reshape(t["shape"])
    return out


class Reference:
    """transformers' LlamaModel forward in float64 (modeling_llama.py:
    LlamaRMSNorm, rotate_half RoPE, GQA, SiLU MLP), returning norm(h)."""

    def __init__(self, model_dir):
        self.c = json.load(open(os.path.join(model_dir, "config.json")))
        self.w = load_safetensors(os.path.join(model_dir, "model.safetensors"))

    def rms(self, x, w):
        eps = self.c["rms_norm_eps"]
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w

    def hidden(self, ids):
        c, w = self.c, self.w
        H, nh, nkv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
        hd = c.get("head_dim") or H // nh
        n = len(ids)
        x = w["model.embed_tokens.weight"][ids]
        pos = np.arange(n, dtype=np.float64)
        inv = c["rope_theta"] ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
        ang = np.concatenate([pos[:, None] * inv[None, :]] * 2, axis=1)  # [n][hd]
        cos, sin = np.cos(ang), np.sin(ang)

        def rope(t):  # [n][heads][hd]
            rot = np.concatenate([-t[..., hd // 2:], t[..., :hd // 2]], axis=-1)
            return t * cos[:, None, :] + rot * sin[:, None, :]

        mask = np.triu(np.full((n, n), -np.inf), 1)
        for l in range(c["num_hidden_layers"]):
            p = "model.layers.%d." % l
            h = self.rms(x, w[p + "input_layernorm.weight"])
            q = rope((h @ w[p + "self_attn.q_proj.weight"].T).reshape(n, nh, hd))
            k = rope((h @ w[p + "self_attn.k_proj.weight"].T).reshape(n, nkv, hd))
            v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(n, nkv, hd)
            g = nh // nkv
            o = np.zeros((n, nh, hd))
            for hh in range(nh):
                s = q[:, hh, :] @ k[:, hh // g, :].T / np.sqrt(hd) + mask
                s = np.exp(s - s.max(-1, keepdims=True))
                s /= s.sum(-1, keepdims=True)
                o[:, hh, :] = s @ v[:, hh // g, :]
            x = x + o.reshape(n, nh * hd) @ w[p + "self_attn.o_proj.weight"].T
            h = self.rms(x, w[p + "post_attention_layernorm.weight"])
            gg = h @ w[p + "mlp.gate_proj.weight"].T
            u = h @ w[p + "mlp.up_proj.weight"].T
            x = x + (gg / (1 + np.exp(-gg)) * u) @ w[p + "mlp.down_proj.weight"].T
        return self.rms(x, w["model.norm.weight"])

    def embed(self, ids, pooling, dims=None, normalize=True):
        h = self.hidden(ids)
        v = {"last": h[-1], "mean": h.mean(0), "cls": h[0]}[pooling]
        if dims:
            v = v[:dims]
        if normalize:
            v = v / max(np.linalg.norm(v), 1e-12)
        return v


# ---- running pagedgen -----------------------------------------------------------

def run(exe, lines, flags, model=MODEL, want_rc=0):
    with tempfile.TemporaryDirectory() as d:
        inp, out = os.path.join(d, "in.jsonl"), os.path.join(d, "out.jsonl")
        with open(inp, "w") as f:
            f.write("".join(json.dumps(x) + "\n" for x in lines))
        p = subprocess.run([exe, "-m", model, "-i", inp, "-o", out, "-q"] + flags,
                           capture_output=True, text=True, timeout=240)
        if p.returncode != want_rc:
            print(p.stderr)
            raise AssertionError("exit %d, expected %d" % (p.returncode, want_rc))
        text = open(out).read()
    recs = [json.loads(l) for l in text.splitlines()]
    assert len(recs) == len(lines), (len(recs), len(lines))
    return text, recs


def vectors(rec):
    body = rec["response"]["body"] if "response" in rec else rec
    out = []
    for k, d in enumerate(body["data"]):
        assert d["index"] == k
        e = d["embedding"]
        if isinstance(e, str):
            b = base64.b64decode(e)
            e = list(struct.unpack("<%df" % (len(b) // 4), b))
        out.append(np.array(e, dtype=np.float64))
    return out


IDS = [[1, 403, 407, 261, 378, 31, 9], [1, 22, 4], [7], [1, 300, 301, 302, 303, 304, 305, 306, 307, 308, 309, 310,
                                                        311, 312, 313, 314, 315, 316, 317, 318, 319]]


def gen_line(k):
    return {"id": "g%d" % k, "prompt_token_ids": [1, 50 + k, 60], "max_tokens": 4, "temperature": 0}


def case_reference(exe):
    ref = Reference(MODEL)
    lines = []
    for k in range(3):
        lines.append(gen_line(k))
        lines.append({"id": "e%d" % k, "input": IDS if k == 0 else IDS[k]})
    lines.append({"id": "b64", "input": IDS, "encoding_format": "base64"})
    lines.append({"id": "raw", "input": IDS[0], "normalize": False})
    worst = 0.0
    for pooling in ["last", "mean", "cls"]:
        texts = []
        for flags in [[], ["--max-num-batched-tokens", "5"], ["--no-prefix-caching", "--max-num-seqs", "2"]]:
            text, recs = run(exe, lines, ["--pooling", pooling] + flags)
            texts.append(text)
            for r in recs:
                if r["id"].startswith("g"):
                    assert len(r["outputs"][0]["token_ids"]) == 4
                    continue
                got = vectors(r)
                inputs = IDS if r["id"] in ("e0", "b64") else [IDS[int(r["id"][1])]] if r["id"] != "raw" else [IDS[0]]
                assert len(got) == len(inputs)
                assert r["usage"]["prompt_tokens"] == sum(len(x) for x in inputs)
                for g, ids in zip(got, inputs):
                    want = ref.embed(ids, pooling, normalize=r["id"] != "raw")
                    diff = float(np.abs(g - want).max())
                    worst = max(worst, diff)
                    assert diff <= 1e-5, (pooling, r["id"], diff)
            # base64 decodes to the same f32 values as the float list
            byid = {r["id"]: r for r in recs}
            for a, b in zip(vectors(byid["e0"]), vectors(byid["b64"])):
                assert np.array_equal(a.astype(np.float32), b.astype(np.float32))
        # chunked, batched differently, with and without the prefix cache: the same bytes
        assert texts[0] == texts[1] == texts[2], pooling
        print("%s pooling: records identical in 3 schedules" % pooling)
    print("max |diff| vs float64 reference: %.3g" % worst)
    # the openai form: vLLM's EmbeddingResponse body
    line = {"custom_id": "o1", "method": "POST", "url": "/v1/embeddings",
            "body": {"model": "stories260K", "input": [IDS[1], IDS[2]]}}
    _, recs = run(exe, [line, {"custom_id": "o2", "method": "POST", "url": "/v1/completions",
                               "body": {"model": "stories260K", "prompt": [1, 5], "max_tokens": 2}}], [])
    r = recs[0]
    assert r["custom_id"] == "o1" and r["error"] is None and r["response"]["status_code"] == 200
    body = r["response"]["body"]
    assert list(body) == ["id", "object", "created", "model", "data", "usage"], list(body)
    assert body["id"].startswith("embd-") and body["object"] == "list" and body["model"] == "stories260K"
    assert [list(d) for d in body["data"]] == [["index", "object", "embedding"]] * 2
    assert body["usage"] == {"prompt_tokens": 4, "total_tokens": 4, "completion_tokens": 0,
                             "prompt_tokens_details": None}
    for g, ids in zip(vectors(r), [IDS[1], IDS[2]]):
        assert np.abs(g - ref.embed(ids, "last")).max() <= 1e-5
    assert recs[1]["response"]["body"]["object"] == "text_completion"


def case_st_files(exe):
    """A folder with modules.json -> mean pooling without Normalize, and
    config.json matryoshka_dimensions [16, 32]."""
    ref = Reference(MODEL)
    with tempfile.TemporaryDirectory() as d:
        for f in ["model.safetensors", "tokenizer.json", "tokenizer_config.json"]:
            os.symlink(os.path.join(MODEL, f), os.path.join(d, f))
        cfg = json.load(open(os.path.join(MODEL, "config.json")))
        cfg["matryoshka_dimensions"] = [16, 32]
        json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
        json.dump([{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                   {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}],
                  open(os.path.join(d, "modules.json"), "w"))
        os.mkdir(os.path.join(d, "1_Pooling"))
        json.dump({"word_embedding_dimension": 64, "pooling_mode_cls_token": False,
                   "pooling_mode_mean_tokens": True, "pooling_mode_lasttoken": False},
                  open(os.path.join(d, "1_Pooling", "config.json"), "w"))
        lines = [{"id": "a", "input": IDS[0]},
                 {"id": "b", "input": IDS[0], "dimensions": 16},
                 {"id": "c", "input": IDS[0], "dimensions": 16, "normalize": True},
                 {"id": "d", "input": IDS[0], "dimensions": 8},
                 {"id": "t", "input": "Once upon a time"}]
        _, recs = run(exe, lines, [], model=d, want_rc=1)
        (a,), (b,), (c,) = vectors(recs[0]), vectors(recs[1]), vectors(recs[2])
        assert np.abs(a - ref.embed(IDS[0], "mean", normalize=False)).max() <= 1e-5
        assert len(b) == 16 and np.abs(b - ref.embed(IDS[0], "mean", 16, normalize=False)).max() <= 1e-5
        assert len(c) == 16 and np.abs(c - ref.embed(IDS[0], "mean", 16)).max() <= 1e-5
        assert "only supports [16, 32] matryoshka dimensions" in recs[3]["error"]["message"]
        assert len(vectors(recs[4])[0]) == 64  # a string input, tokenized with BOS
        # --pooling overrides the folder's mode
        _, recs = run(exe, lines[:1], ["--pooling", "cls"], model=d)
        assert np.abs(vectors(recs[0])[0] - ref.embed(IDS[0], "cls", normalize=False)).max() <= 1e-5


def write_headless(src, dst):
    """src's tensors without the "model." prefix (what sentence-transformers
    saves: Qwen3-Embedding-8B's index has "embed_tokens.weight", "layers.0..."
    and no lm_head), bytes unchanged."""
    with open(src, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    out = {k[6:] if k.startswith("model.") else k: v for k, v in header.items()}
    h = json.dumps(out).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(dst, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data[8 + n:])


def case_headless(exe):
    """stories260K saved headless and untied (no lm_head), named as the bare
    transformer (architectures ["LlamaModel"], as e5-mistral's MistralModel):
    embedding lines give the same records as from the original; generation
    lines are refused in place."""
    lines = [{"id": "e", "input": IDS}, gen_line(0), {"id": "t", "input": "Once upon a time"}]
    want, _ = run(exe, [lines[0], lines[2]], [])
    with tempfile.TemporaryDirectory() as d:
        for f in ["tokenizer.json", "tokenizer_config.json"]:
            os.symlink(os.path.join(MODEL, f), os.path.join(d, f))
        write_headless(os.path.join(MODEL, "model.safetensors"), os.path.join(d, "model.safetensors"))
        cfg = json.load(open(os.path.join(MODEL, "config.json")))
        cfg["tie_word_embeddings"] = False
        cfg["architectures"] = ["LlamaModel"]
        json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
        text, recs = run(exe, lines, [], model=d, want_rc=1)
        assert "no lm_head.weight" in recs[1]["error"]["message"], recs[1]
        got = text.splitlines()
        assert [got[0], got[2]] == want.splitlines()


def case_errors(exe):
    lines = [
        {"id": "ok", "input": [1, 2]},
        {"id": "int", "input": 5},
        {"id": "dims", "input": [1, 2], "dimensions": 4},
        {"id": "vocab", "input": [[1, 2], [1, 9999]]},
        gen_line(0),
        {"id": "fmt", "input": "x", "encoding_format": "int8"},
        {"id": "long", "input": [1] * 600},
        {"id": "ok2", "input": ["Lily", "Tim"]},
    ]
    _, recs = run(exe, lines, [], want_rc=1)
    assert [r["id"] for r in recs] == [x["id"] for x in lines]
    errs = {r["id"]: r["error"]["message"] for r in recs if "error" in r}
    assert sorted(errs) == ["dims", "fmt", "int", "long", "vocab"], errs
    assert "does not support matryoshka representation" in errs["dims"]
    assert "input[1]: token id 9999 is outside the vocabulary" in errs["vocab"]
    assert "too long: 600 tokens" in errs["long"]
    assert len(vectors(recs[7])) == 2
    # openai error records carry the status
    _, recs = run(exe, [{"custom_id": "x", "method": "POST", "url": "/v1/embeddings",
                         "body": {"model": "other", "input": "hi"}},
                        {"custom_id": "y", "method": "POST", "url": "/v1/embeddings", "body": {"input": []}}],
                  [], want_rc=1)
    assert recs[0]["response"]["status_code"] == 404 and recs[0]["error"]["type"] == "NotFoundError"
    assert recs[1]["response"]["status_code"] == 400 and "empty list" in recs[1]["error"]["message"]


def main():
    exe, case = sys.argv[1], sys.argv[2]
    if np is None:
        skip("numpy is not installed for %s" % sys.executable)
    if not os.path.isdir(MODEL):
        skip("no $PAGEDGEN_SHARED/models/stories260K")
    {"reference": case_reference, "st_files": case_st_files, "errors": case_errors,
     "headless": case_headless}[case](exe)
    print("ok")


if __name__ == "__main__":
    main()
