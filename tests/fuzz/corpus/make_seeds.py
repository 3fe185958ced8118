#!/usr/bin/env python3
"""Writes the small seed corpora for the fuzz targets (tests/fuzz/corpus/<name>/).
Deterministic; run from anywhere: python3 tests/fuzz/corpus/make_seeds.py
The files are committed; rerun only to change the seeds."""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
SIZES = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8, "I8": 1, "U8": 1, "I16": 2, "I32": 4, "I64": 8, "BOOL": 1}


def st_image(tensors, metadata=None, pad=0, hlen=None, extra_data=0):
    """tensors: [(name, dtype, shape)] laid out back to back."""
    header, off = {}, 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape in tensors:
        n = SIZES[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(header, separators=(",", ":")).encode() + b" " * pad
    data = bytes((i * 7 + 1) & 0xFF for i in range(off + extra_data))
    return struct.pack("<Q", len(h) if hlen is None else hlen) + h + data


def write(sub, name, data):
    d = os.path.join(HERE, sub)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def safetensors():
    llama = []
    for i in range(2):
        p = f"model.layers.{i}."
        llama += [(p + "input_layernorm.weight", "F32", [4]),
                  (p + "self_attn.q_proj.weight", "F32", [4, 4]),
                  (p + "self_attn.k_proj.weight", "F32", [2, 4]),
                  (p + "mlp.down_proj.weight", "BF16", [4, 6])]
    write("safetensors", "tiny_llama", st_image([("model.embed_tokens.weight", "F32", [8, 4])] + llama +
                                                [("model.norm.weight", "F32", [4])], {"format": "pt"}))
    write("safetensors", "all_dtypes", st_image([(d.lower(), d, [2]) for d in SIZES]))
    write("safetensors", "scalar_and_empty", st_image([("s", "I32", []), ("e", "F16", [0, 3]), ("v", "U8", [3])]))
    write("safetensors", "empty_header", st_image([]))
    write("safetensors", "padded_header", st_image([("w", "F16", [2, 2])], {"a": "b"}, pad=13))
    h = b'{"\\u00e9\\ud83d\\ude00":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}'
    write("safetensors", "escaped_name", struct.pack("<Q", len(h)) + h + b"xy")
    good = st_image([("a", "F32", [2, 3]), ("b", "BF16", [4])])
    write("safetensors", "truncated", good[:len(good) - 5])
    write("safetensors", "lying_length", st_image([("a", "F32", [2])], hlen=1 << 40))
    bad = b'{"x":{"dtype":"F32","shape":[2],"data_offsets":[4,12]},"y":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
    write("safetensors", "overlap", struct.pack("<Q", len(bad)) + bad + bytes(12))
    bad = b'{"x":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}}'
    write("safetensors", "overflow", struct.pack("<Q", len(bad)) + bad + bytes(8))


def config():
    base = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
            "intermediate_size": 172, "num_hidden_layers": 5, "num_attention_heads": 8,
            "num_key_value_heads": 4, "head_dim": 8, "vocab_size": 512, "max_position_embeddings": 512,
            "hidden_act": "silu", "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "rope_scaling": None,
            "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": True,
            "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32"}
    write("config", "small_llama.json", json.dumps(base, indent=2))
    l3 = dict(base, vocab_size=128256, bos_token_id=128000, eos_token_id=[128001, 128008, 128009],
              rope_theta=500000.0, rope_scaling={"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                 "original_max_position_embeddings": 8192, "rope_type": "llama3"})
    write("config", "llama31.json", json.dumps(l3))
    write("config", "linear_rope.json", json.dumps(dict(base, rope_scaling={"type": "linear", "factor": 2.0})))
    m = dict(base, architectures=["MistralForCausalLM"], model_type="mistral", sliding_window=None)
    del m["head_dim"], m["num_key_value_heads"]
    write("config", "mistral.json", json.dumps(m))
    write("config", "sliding_window.json", json.dumps(dict(m, sliding_window=4096)))
    write("config", "qwen.json", json.dumps(dict(base, architectures=["Qwen2ForCausalLM"])))
    q3 = dict(base, architectures=["Qwen3ForCausalLM"], model_type="qwen3", use_sliding_window=True,
              sliding_window=16, max_window_layers=2,
              layer_types=["full_attention", "sliding_attention", "full_attention", "sliding_attention",
                           "sliding_attention"])
    write("config", "qwen3_windows.json", json.dumps(q3))
    write("config", "qwen3_moe.json", json.dumps(dict(base, architectures=["Qwen3MoeForCausalLM"])))
    write("config", "yarn.json", json.dumps(dict(base, rope_scaling={"rope_type": "yarn", "factor": 4.0})))
    write("config", "generation.json", json.dumps({"bos_token_id": 1, "eos_token_id": [2, 1], "do_sample": True,
                                                   "temperature": 0.6, "top_p": 0.9, "top_k": 50}))


def json_seeds():
    write("json", "nested.json", '{"a":[1,-2.5e3,true,false,null,{"b":{}}],"c":[],"d":"x"}')
    write("json", "escapes.json", r'["\"\\\/\b\f\n\r\t","\u00e9\u4e2d\ud83d\ude00","\ud800 lone","\u0000nul"]')
    write("json", "numbers.json", "[0,-0,1e5,1E-5,-1.25,123456789012345678901234567890,9223372036854775807,"
                                  "-9223372036854775808,1e400]")
    write("json", "tokenizer_like.json", json.dumps({"model": {"type": "BPE", "vocab": {"\u2581a": 0, "b": 1, "<0x0A>": 2},
                                                               "merges": ["\u2581 a", "a b"]},
                                                     "added_tokens": [{"id": 0, "content": "<s>", "special": True}]},
                                                    ensure_ascii=False))
    write("json", "scalar.json", '  "just a string"  ')
    write("json", "deep.json", "[" * 200 + "]" * 200)
    write("json", "trailing_comma.json", '{"a":1,}')
    write("json", "missing_colon.json", '{"a" 1}')


if __name__ == "__main__":
    safetensors()
    config()
    json_seeds()
