"""A float64 reference of transformers' Qwen2ForCausalLM / Qwen3ForCausalLM
(modeling_qwen2.py, modeling_qwen3.py; transformers v5 main 008e5743, the
same math as v4.5x) over a model folder: config.json + model.safetensors.
numpy only (/usr/bin/python3); no torch, no transformers.

  Qwen2Attention: q/k/v = x @ W^T + b (o_proj without bias)
  Qwen3Attention: q = q_norm(q_proj(x).view(.., head_dim)), k likewise, before RoPE
  apply_rotary_pos_emb: rotate_half, inv_freq = theta ** (-arange(0, hd, 2) / hd)
  eager_attention_forward: softmax(q k^T * head_dim ** -0.5 + mask) v, GQA by repeat_kv;
    a "sliding_attention" layer masks keys j <= i - sliding_window
  Qwen2RMSNorm / Qwen3RMSNorm: x * rsqrt(mean(x^2) + eps) * w
  MLP: down(silu(gate(x)) * up(x)); final norm; lm_head (tied: embed_tokens)

Used by test_qwen.py: greedy tokens and logprobs (log_softmax of the raw
logits) of a prompt. moe_reference.py subclasses it for the mixtures of
experts (the attention is the same; its mlp() differs).
"""
import json
import os
import struct

import numpy as np


def load_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        lo, hi = t["data_offsets"]
        raw = data[base + lo:base + hi]
        if t["dtype"] == "F32":
            a = np.frombuffer(raw, dtype="<f4")
        elif t["dtype"] == "F16":
            a = np.frombuffer(raw, dtype="<f2")
        elif t["dtype"] == "BF16":
            a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise ValueError(f"{name}: dtype {t['dtype']}")
        out[name] = a.astype(np.float64).reshape(t["shape"])
    return out


class QwenReference:
    ARCHS = ("Qwen2ForCausalLM", "Qwen3ForCausalLM")

    def __init__(self, model_dir):
        with open(os.path.join(model_dir, "config.json")) as f:
            c = json.load(f)
        arch = c["architectures"][0]
        assert arch in self.ARCHS, arch
        self.config = c
        self.qwen3 = arch == "Qwen3ForCausalLM"
        self.qkv_bias = not self.qwen3  # Qwen2Attention: bias=True
        self.qk_norm = self.qwen3
        self.H = c["hidden_size"]
        self.L = c["num_hidden_layers"]
        self.nh = c["num_attention_heads"]
        kv = c.get("num_key_value_heads", 32)
        self.nkv = self.nh if kv is None else kv
        self.hd = c.get("head_dim", 128 if self.qwen3 else self.H // self.nh)
        self.eps = c.get("rms_norm_eps", 1e-6)
        rp = c.get("rope_parameters") or {}
        self.theta = rp.get("rope_theta", c.get("rope_theta", 10000.0))
        self.tie = c.get("tie_word_embeddings", False)
        window = c.get("sliding_window", 4096) if c.get("use_sliding_window", False) else None
        types = c.get("layer_types") or [
            "sliding_attention" if window is not None and i >= c.get("max_window_layers", 28) else "full_attention"
            for i in range(self.L)]
        self.windows = [window if t == "sliding_attention" else None for t in types]
        self.w = load_safetensors(os.path.join(model_dir, "model.safetensors"))

    def rmsnorm(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def rope(self, x, pos):
        """x [..., n, hd] at positions pos [n]"""
        hd = self.hd
        inv = self.theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
        ang = np.outer(pos.astype(np.float64), inv)
        emb = np.concatenate([ang, ang], axis=-1)
        rot = np.concatenate([-x[..., hd // 2:], x[..., :hd // 2]], axis=-1)
        return x * np.cos(emb) + rot * np.sin(emb)

    def linear(self, module, x):
        """x @ W^T of the module named (lora_reference.py adds its delta)"""
        return x @ self.w[module + ".weight"].T

    def logits(self, ids):
        """logits [n][V] of every position of ids"""
        head = self.w["model.embed_tokens.weight"] if self.tie else self.w["lm_head.weight"]
        return self.hidden(ids) @ head.T

    def hidden(self, ids):
        """the final-norm hidden states [n][hidden] of every position of ids
        (what an embedding model pools)"""
        w, n, hd = self.w, len(ids), self.hd
        x = w["model.embed_tokens.weight"][np.asarray(ids)]
        pos = np.arange(n)
        for l in range(self.L):
            p = f"model.layers.{l}."
            h = self.rmsnorm(x, w[p + "input_layernorm.weight"])
            q = self.linear(p + "self_attn.q_proj", h)
            k = self.linear(p + "self_attn.k_proj", h)
            v = self.linear(p + "self_attn.v_proj", h)
            if self.qkv_bias:
                q = q + w[p + "self_attn.q_proj.bias"]
                k = k + w[p + "self_attn.k_proj.bias"]
                v = v + w[p + "self_attn.v_proj.bias"]
            q = q.reshape(n, self.nh, hd).transpose(1, 0, 2)
            k = k.reshape(n, self.nkv, hd).transpose(1, 0, 2)
            v = v.reshape(n, self.nkv, hd).transpose(1, 0, 2)
            if self.qk_norm:
                q = self.rmsnorm(q, w[p + "self_attn.q_norm.weight"])
                k = self.rmsnorm(k, w[p + "self_attn.k_norm.weight"])
            q, k = self.rope(q, pos), self.rope(k, pos)
            g = self.nh // self.nkv
            k, v = np.repeat(k, g, axis=0), np.repeat(v, g, axis=0)
            s = q @ k.transpose(0, 2, 1) * hd ** -0.5
            i, j = np.meshgrid(pos, pos, indexing="ij")
            keep = j <= i
            if self.windows[l] is not None:
                keep &= j > i - self.windows[l]
            s = np.where(keep, s, -np.inf)
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            a = (s / s.sum(axis=-1, keepdims=True)) @ v
            x = x + self.linear(p + "self_attn.o_proj", a.transpose(1, 0, 2).reshape(n, self.nh * hd))
            h = self.rmsnorm(x, w[p + "post_attention_layernorm.weight"])
            x = x + self.mlp(l, h)
        return self.rmsnorm(x, w["model.norm.weight"])

    def dense_mlp(self, prefix, h, names=("gate_proj", "up_proj", "down_proj")):
        """down(silu(gate(h)) * up(h)) of the tensors prefix + names"""
        gt = self.linear(prefix + names[0], h)
        up = self.linear(prefix + names[1], h)
        return self.linear(prefix + names[2], gt / (1.0 + np.exp(-gt)) * up)

    def mlp(self, l, h):
        """layer l's MLP output for the normed rows h [n][hidden]"""
        return self.dense_mlp(f"model.layers.{l}.mlp.", h)

    def greedy(self, prompt, max_tokens):
        """[(token, logprob, margin)] of greedy decoding: margin is the gap
        between the best and second-best logit (a near-tie flags a token
        no float32 engine can be held to)."""
        ids, out = list(prompt), []
        for _ in range(max_tokens):
            z = self.logits(ids)[-1]
            lp = z - z.max() - np.log(np.exp(z - z.max()).sum())
            top2 = np.sort(z)[-2:]
            t = int(np.argmax(z))
            out.append((t, float(lp[t]), float(top2[1] - top2[0])))
            ids.append(t)
        return out
