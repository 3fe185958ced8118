#!/usr/bin/python3
"""ppl_reference: llama-perplexity's estimate in numpy float64, the
independent reference of tests/e2e/test_perplexity.py.

usage: ppl_reference.py MODEL_DIR WINDOWS.json
WINDOWS.json: {"windows": [[id, ...], ...], "first": F} (each window already
starts with BOS where llama.cpp would put it). Prints one JSON line
{"ppl", "ppl_stderr", "nll", "count"}: every window's positions F+1 .. N-1
scored, as tools/perplexity/perplexity.cpp perplexity() does.

The forward is Hugging Face's LlamaForCausalLM (modeling_llama.py: RMSNorm,
rotate_half RoPE, grouped-query attention, SwiGLU MLP, tied or separate
lm_head) written from the config, in float64 over the f32 weights; nothing
of pagedgen is used but the token ids. Needs numpy (Debian's python3-numpy).
"""
import json
import math
import os
import struct
import sys

import numpy as np

DT = {"F32": np.float32, "F16": np.float16}


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        if t["dtype"] == "BF16":
            raw = np.frombuffer(data[t["data_offsets"][0]:t["data_offsets"][1]], dtype=np.uint16)
            a = (raw.astype(np.uint32) << 16).view(np.float32)
        else:
            a = np.frombuffer(data[t["data_offsets"][0]:t["data_offsets"][1]], dtype=DT[t["dtype"]])
        out[name] = a.reshape(t["shape"]).astype(np.float64)
    return out


def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rotate_half(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def forward(W, cfg, ids):
    """logits [T][V] of one sequence."""
    H, nh, nkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or H // nh
    eps, theta = cfg["rms_norm_eps"], cfg.get("rope_theta", 10000.0)
    T = len(ids)
    x = W["model.embed_tokens.weight"][ids]
    inv = 1.0 / theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd)
    ang = np.arange(T, dtype=np.float64)[:, None] * inv[None, :]
    cos = np.cos(np.concatenate([ang, ang], axis=-1))[:, None, :]
    sin = np.sin(np.concatenate([ang, ang], axis=-1))[:, None, :]
    mask = np.triu(np.full((T, T), -np.inf), k=1)
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        h = rmsnorm(x, W[p + "input_layernorm.weight"], eps)
        q = (h @ W[p + "self_attn.q_proj.weight"].T).reshape(T, nh, hd)
        k = (h @ W[p + "self_attn.k_proj.weight"].T).reshape(T, nkv, hd)
        v = (h @ W[p + "self_attn.v_proj.weight"].T).reshape(T, nkv, hd)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = nh // nkv
        k = np.repeat(k, rep, axis=1)
        v = np.repeat(v, rep, axis=1)
        s = np.einsum("thd,shd->hts", q, k) / math.sqrt(hd) + mask[None]
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        s /= s.sum(axis=-1, keepdims=True)
        a = np.einsum("hts,shd->thd", s, v).reshape(T, nh * hd)
        x = x + a @ W[p + "self_attn.o_proj.weight"].T
        h = rmsnorm(x, W[p + "post_attention_layernorm.weight"], eps)
        g = h @ W[p + "mlp.gate_proj.weight"].T
        u = h @ W[p + "mlp.up_proj.weight"].T
        x = x + (g / (1.0 + np.exp(-g)) * u) @ W[p + "mlp.down_proj.weight"].T
    x = rmsnorm(x, W["model.norm.weight"], eps)
    head = W.get("lm_head.weight", W["model.embed_tokens.weight"])
    return x @ head.T


def main():
    model_dir, windows_path = sys.argv[1], sys.argv[2]
    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    W = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    with open(windows_path, encoding="utf-8") as f:
        spec = json.load(f)
    first = spec["first"]
    nll = nll2 = 0.0
    count = 0
    for ids in spec["windows"]:
        logits = forward(W, cfg, np.array(ids))
        for j in range(first, len(ids) - 1):
            row = logits[j]
            m = row.max()
            lse = m + math.log(np.exp(row - m).sum())
            v = lse - row[ids[j + 1]]
            nll += v
            nll2 += v * v
            count += 1
    av = nll / count
    var = nll2 / count - av * av
    ppl = math.exp(av)
    print(json.dumps({"ppl": ppl, "ppl_stderr": math.sqrt(var / (count - 1)) * ppl, "nll": av,
                      "count": count}))


if __name__ == "__main__":
    main()
