"""A float64 reference of transformers' mixture-of-experts causal LMs:
MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM
(modeling_mixtral.py, modeling_qwen2_moe.py, modeling_qwen3_moe.py and
their configuration_*.py; transformers v5 main 008e5743, the same math as
v4.5x's per-expert loops), over a model folder with the hub's per-expert
tensors. numpy only; no torch, no transformers.

Attention is qwen_reference.py's (Qwen2-MoE: q/k/v biases when qkv_bias,
default true; Qwen3-MoE: q/k norms; Mixtral: neither, a window on every
layer when sliding_window is set). The sparse MLP block, per token row h:

  router_logits = h @ gate^T                              [E]
  p = softmax(router_logits)                              (F.softmax(..., dtype=torch.float))
  top-k of p, largest first; ties to the lower expert id  (torch.topk: unspecified)
  w = p[top] / sum(p[top])   Mixtral always; Qwen when norm_topk_prob
  out = sum_r w_r * expert_{top_r}(h)                     expert = down(silu(gate(h)) * up(h))
  Qwen2-MoE: out += sigmoid(h @ shared_expert_gate^T) * shared_expert(h)

Qwen layers are sparse iff l not in mlp_only_layers and num_experts > 0 and
(l + 1) % decoder_sparse_step == 0; other layers are a dense MLP of
intermediate_size. Everything here runs in float64, the softmax included
(the engine's f32 softmax differs from it by rounding only).
"""
import numpy as np

from qwen_reference import QwenReference


class MoeReference(QwenReference):
    ARCHS = ("MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM")

    def __init__(self, model_dir):
        super().__init__(model_dir)
        c = self.config
        arch = c["architectures"][0]
        self.mixtral = arch == "MixtralForCausalLM"
        self.qwen2 = arch == "Qwen2MoeForCausalLM"
        self.qkv_bias = self.qwen2 and c.get("qkv_bias", True)
        self.qk_norm = arch == "Qwen3MoeForCausalLM"
        kv = c.get("num_key_value_heads", 8 if self.mixtral else 16 if self.qwen2 else 4)
        self.nkv = self.nh if kv is None else kv
        self.hd = c.get("head_dim") or self.H // self.nh
        if self.mixtral:
            self.eps = c.get("rms_norm_eps", 1e-5)
            rp = c.get("rope_parameters") or {}
            self.theta = rp.get("rope_theta", c.get("rope_theta", 1000000.0))
            self.windows = [c.get("sliding_window")] * self.L
            self.E = c.get("num_local_experts", 8)
            self.k = c.get("num_experts_per_tok", 2)
            self.norm_topk = True
            self.sparse = [True] * self.L
        else:
            assert not c.get("use_sliding_window", False)
            self.windows = [None] * self.L
            self.E = c.get("num_experts", 60 if self.qwen2 else 128)
            self.k = c.get("num_experts_per_tok", 4 if self.qwen2 else 8)
            self.norm_topk = c.get("norm_topk_prob", False)
            step = c.get("decoder_sparse_step", 1)
            only = c.get("mlp_only_layers") or []
            self.sparse = [l not in only and self.E > 0 and (l + 1) % step == 0 for l in range(self.L)]
        self.routes = []  # (layer, top ids, sorted p) of the last forward: for the tests' own checks

    def route(self, z):
        """the top-k expert ids (rank order) and weights of router logits z [E]"""
        p = np.exp(z - z.max())
        p = p / p.sum()
        order = sorted(range(len(p)), key=lambda e: (-p[e], e))  # ties: the lower id first
        top = order[:self.k]
        w = p[top]
        if self.norm_topk:
            w = w / w.sum()
        return top, w, p

    def mlp(self, l, h):
        if not self.sparse[l]:
            return super().mlp(l, h)
        blk = f"model.layers.{l}.block_sparse_moe." if self.mixtral else f"model.layers.{l}.mlp."
        names = ("w1", "w3", "w2") if self.mixtral else ("gate_proj", "up_proj", "down_proj")
        z = h @ self.w[blk + "gate.weight"].T
        out = np.zeros_like(h)
        for t in range(h.shape[0]):
            top, w, p = self.route(z[t])
            self.routes.append((l, top, np.sort(p)[::-1]))
            for r, e in enumerate(top):
                out[t] += w[r] * self.dense_mlp(f"{blk}experts.{e}.", h[t:t + 1], names)[0]
        if self.qwen2 and blk + "shared_expert_gate.weight" in self.w:
            g = h @ self.w[blk + "shared_expert_gate.weight"].T
            out = out + 1.0 / (1.0 + np.exp(-g)) * self.dense_mlp(blk + "shared_expert.", h)
        return out
