"""A float64 reference of PEFT's LoRA forward (issue 33) over the base
models of qwen_reference.py, and LlamaForCausalLM (stories260K: Qwen3's
math without q/k norms, no biases). numpy only; no torch, no PEFT.

PEFT (huggingface/peft 5d602fdb) src/peft/tuners/lora/layer.py:
  update_layer (l. 279-281): scaling = lora_alpha / math.sqrt(r) with
    use_rslora, else lora_alpha / r
  Linear.forward (l. 1062-1063): result = self.base_layer(x) (with the
    base layer's bias), then result = result + lora_B(lora_A(dropout(x))) * scaling
  get_delta_weight: B @ A * scaling (what merge_and_unload adds to W)
r and alpha per module: rank_pattern / alpha_pattern's first key K with
re.match(rf"(.*\\.)?({K})$", module) (peft utils/other.py get_pattern_key),
else r / lora_alpha; r is also lora_A's row count (checked).
"""
import json
import os
import re

import numpy as np

from qwen_reference import QwenReference, load_safetensors


def pattern_value(patterns, module, default):
    for key, v in (patterns or {}).items():
        if re.match(rf"(.*\.)?({key})$", module):
            return v
    return default


class LoraReference(QwenReference):
    ARCHS = QwenReference.ARCHS + ("LlamaForCausalLM",)

    def __init__(self, model_dir, adapter_dir=None):
        super().__init__(model_dir)
        if self.config["architectures"][0] == "LlamaForCausalLM":
            self.qkv_bias = self.config.get("attention_bias", False)
            self.qk_norm = False
            self.hd = self.config.get("head_dim") or self.H // self.nh
        self.delta = {}  # module -> (A [r][in], B [out][r], scaling)
        if adapter_dir:
            self.set_adapter(adapter_dir)

    def set_adapter(self, adapter_dir):
        """PEFT's adapter in adapter_dir (None: the base model)"""
        self.delta = {}
        if adapter_dir is None:
            return
        with open(os.path.join(adapter_dir, "adapter_config.json")) as f:
            c = json.load(f)
        t = load_safetensors(os.path.join(adapter_dir, "adapter_model.safetensors"))
        for name, A in t.items():
            m = re.fullmatch(r"base_model\.model\.(.*)\.lora_A(?:\.default)?\.weight", name)
            if not m:
                continue
            module = m.group(1)
            B = t[name.replace("lora_A", "lora_B")]
            r = pattern_value(c.get("rank_pattern"), module, c["r"])
            alpha = pattern_value(c.get("alpha_pattern"), module, c["lora_alpha"])
            assert A.shape[0] == r and B.shape[1] == r, (module, A.shape, B.shape, r)
            s = alpha / np.sqrt(r) if c.get("use_rslora") else alpha / r
            self.delta[module] = (A, B, s)

    def linear(self, module, x):
        y = super().linear(module, x)
        if module in self.delta:
            A, B, s = self.delta[module]
            y = y + ((x @ A.T) @ B.T) * s
        return y

    def merged_weights(self):
        """the base tensors with every adapted W replaced by W + s * B @ A
        (PEFT's merge_and_unload), float64"""
        w = dict(self.w)
        for module, (A, B, s) in self.delta.items():
            w[module + ".weight"] = w[module + ".weight"] + s * (B @ A)
        return w


def write_safetensors(path, tensors):
    """tensors {name: array} as F32"""
    import struct
    header, off, blobs = {}, 0, []
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name], dtype="<f4")
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
        blobs.append(a.tobytes())
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
