#!/usr/bin/python3
"""hf_to_gguf: writes a Hugging Face Llama or Qwen3-MoE checkpoint
(config.json + model.safetensors, F32 or BF16) as a GGUF v3 file for
llama.cpp, so that `scripts/bench --peers` compares llama.cpp and pagedgen on
the same weights.

Our own code (numpy only); the format is GGUF v3 as documented in ggml's
docs/gguf.md. What llama.cpp expects beyond the container:
  - tensor names token_embd / blk.N.attn_q ... / output_norm / output;
  - q and k rows in Meta's interleaved RoPE order (pairs (2i, 2i+1) of a head
    rotate together), while HF stores rotate-half order (i, i + d/2): the
    inverse of the permutation HF's conversion applies is undone here;
  - a vocabulary (tokenizer.ggml.*): the checkpoint's tokenizer.json, else
    llama2's, when its size matches the checkpoint's vocab_size, with
    scores from its BPE merge ranks (score_and_type: llama.cpp then
    tokenizes text as pagedgen does, which llama-perplexity needs); else a
    minimal one (<unk>, <s>, </s>, the 256 byte tokens, then placeholders,
    with a warning), enough to load and run llama-batched-bench, which feeds
    token ids, not text.

Qwen3-MoE (model_type qwen3_moe, issue 31), in llama.cpp's layout: general.architecture
"qwen3moe", its keys under "qwen3moe." plus expert_count (num_experts),
expert_used_count (num_experts_per_tok) and expert_feed_forward_length
(moe_intermediate_size); per layer blk.N.attn_q_norm / attn_k_norm
([head_dim]), blk.N.ffn_gate_inp ([E][H] router), and the experts stacked
into one tensor each: blk.N.ffn_gate_exps / ffn_up_exps [E][Ie][H] and
ffn_down_exps [E][H][Ie] (GGUF dims innermost first: {H, Ie, E}). q and k
rows stay in HF's rotate-half order: llama.cpp ropes qwen3moe as NEOX.
(llama.cpp's src/llama-arch.cpp and llama-model.cpp at b10257 / 22dc605c4,
src/models/qwen3moe.cpp at 069be0ae: the names, shapes and rope type; its
graph renormalizes the top-k weights, as Qwen3-30B-A3B's norm_topk_prob.)
Tensors are converted one at a time while the file is written, so a
checkpoint larger than memory converts.

Weight types: f32, bf16 (the float's top 16 bits, round to nearest even) or
q8_0 (blocks of 32 along a row: f16 scale max|x|/127 + 32 int8, llama.cpp's
reference quantizer). 1-D tensors (the norms) stay f32, as llama.cpp's own
converter writes them.

Usage: hf_to_gguf.py MODEL_DIR OUT.gguf --type f32|bf16|q8_0 [--tokenizer tokenizer.json]
(q8_0: a matrix whose rows are not whole blocks of 32 stays f32, as in llama.cpp's converter.)
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
ALIGNMENT = 32

# gguf metadata value types
T_UINT32, T_INT32, T_FLOAT32, T_BOOL, T_STRING, T_ARRAY = 4, 5, 6, 7, 8, 9
# ggml tensor types and the matching general.file_type (llama_ftype)
GGML_TYPE = {"f32": 0, "q8_0": 8, "bf16": 30}
FILE_TYPE = {"f32": 0, "q8_0": 7, "bf16": 32}
QK8_0 = 32
# tokenizer.ggml.token_type values (llama_token_type)
TOK_NORMAL, TOK_UNKNOWN, TOK_CONTROL, TOK_BYTE = 1, 2, 3, 6


class LazyTensors(dict):
    """name -> float32 array, each read from the memory-mapped file when asked;
    bf16_bits(name): a BF16 tensor's stored bits, else None."""

    def __getitem__(self, name):
        return dict.__getitem__(self, name)()

    def bf16_bits(self, name):
        return dict.__getitem__(self, name).bf16_bits()


def read_safetensors(path):
    """name -> float32 array (F32 and BF16 tensors), converted on access."""
    with open(path, "rb") as f:
        (hlen,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(hlen))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + hlen)
    out = LazyTensors()
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in ("F32", "BF16"):
            sys.exit(f"hf_to_gguf: {path}: tensor {name}: dtype {info['dtype']} not supported (F32, BF16)")

        def load(info=info):
            lo, hi = info["data_offsets"]
            raw = data[lo:hi]
            if info["dtype"] == "F32":
                a = raw.view("<f4")
            else:
                a = (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
            return np.asarray(a, dtype=np.float32).reshape(info["shape"])

        def bits(info=info):
            lo, hi = info["data_offsets"]
            return data[lo:hi].view("<u2") if info["dtype"] == "BF16" else None

        load.bf16_bits = bits
        dict.__setitem__(out, name, load)
    return out


def hf_to_meta_rope(w, n_heads):
    """Rows of one q/k projection from HF rotate-half order back to Meta's
    interleaved order: within each head, row r of half h (r < d/2) goes to
    2r + h."""
    rows, cols = w.shape
    d = rows // n_heads
    return w.reshape(n_heads, 2, d // 2, cols).swapaxes(1, 2).reshape(rows, cols)


def to_bf16_bits(a):
    u = np.ascontiguousarray(a, dtype="<f4").view(np.uint32)
    u = (u + (0x7FFF + ((u >> 16) & 1))) >> 16  # round to nearest even (finite x: no uint32 overflow)
    return u.astype("<u2")


def quantize_q8_0(a):
    """Rows of `a` (last dim a multiple of 32) as Q8_0 blocks: 2-byte f16
    scale d = max|x|/127, then 32 int8 round(x/d)."""
    if a.shape[-1] % QK8_0:
        raise ValueError(f"row length {a.shape[-1]} is not a multiple of {QK8_0}")
    x = np.ascontiguousarray(a, dtype=np.float32).reshape(-1, QK8_0)
    d = np.abs(x).max(axis=1) / 127.0
    inv = np.divide(1.0, d, out=np.zeros_like(d), where=d != 0)
    q = np.round(x * inv[:, None]).astype(np.int8)  # numpy rounds half to even, roundf away: ties are rare
    blocks = np.empty(x.shape[0], dtype=[("d", "<f2"), ("qs", "i1", (QK8_0,))])
    blocks["d"] = d.astype(np.float16)
    blocks["qs"] = q
    return blocks.tobytes()


def tensor_type(shape, wtype):
    """The ggml type a tensor of this shape is written as."""
    if len(shape) == 1 or wtype == "f32" or (wtype == "q8_0" and shape[-1] % QK8_0):
        return GGML_TYPE["f32"]
    return GGML_TYPE[wtype]


def type_nbytes(shape, gtype):
    n = int(np.prod(shape))
    return {GGML_TYPE["f32"]: 4 * n, GGML_TYPE["bf16"]: 2 * n, GGML_TYPE["q8_0"]: n // QK8_0 * 34}[gtype]


def tensor_bytes(a, wtype, name):
    if a.ndim == 1 or wtype == "f32":
        return 0, np.ascontiguousarray(a, dtype="<f4").tobytes()
    if wtype == "q8_0" and a.shape[-1] % QK8_0:
        # as llama.cpp's own converter does: such a tensor stays unquantized
        print(f"hf_to_gguf: {name}: rows of {a.shape[-1]} are not whole blocks of {QK8_0}: kept as f32",
              file=sys.stderr)
        return 0, np.ascontiguousarray(a, dtype="<f4").tobytes()
    if wtype == "bf16":
        return GGML_TYPE["bf16"], to_bf16_bits(a).tobytes()
    return GGML_TYPE["q8_0"], quantize_q8_0(a)


def load_vocab(tokenizer_path, vocab_size):
    """(tokens, scores, token_types): the tokenizer.json's vocabulary if it
    has exactly vocab_size entries, else a minimal one (said on stderr: text
    would tokenize to bytes, fine for llama-batched-bench, wrong for
    llama-perplexity)."""
    why = f"{tokenizer_path}: no such file"
    if tokenizer_path and os.path.exists(tokenizer_path):
        with open(tokenizer_path, encoding="utf-8") as f:
            model = json.load(f)["model"]
        vocab = model["vocab"]
        why = f"{tokenizer_path}: {len(vocab)} entries, the checkpoint's vocab_size is {vocab_size}"
        if len(vocab) == vocab_size:
            tokens = [None] * vocab_size
            for piece, i in vocab.items():
                tokens[i] = piece
            if None not in tokens:
                return tokens, *score_and_type(tokens, model.get("merges"))
            why = f"{tokenizer_path}: ids are not 0..{vocab_size - 1}"
    elif not tokenizer_path:
        why = "no tokenizer.json"
    print(f"hf_to_gguf: {why}: writing a minimal vocabulary (<unk>, <s>, </s>, bytes, placeholders)",
          file=sys.stderr)
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [f"tok{i}" for i in range(len(tokens), vocab_size)]
    return tokens[:vocab_size], *score_and_type(tokens[:vocab_size], None)


def merge_ranks(merges):
    """piece -> rank of the first merge in tokenizer.json's BPE merges list
    that makes it ("a b" strings or [a, b] pairs)."""
    ranks = {}
    for r, m in enumerate(merges or ()):
        a, b = (m.split(" ", 1) if isinstance(m, str) else m)
        ranks.setdefault(a + b, r)
    return ranks


def score_and_type(tokens, merges):
    """sentencepiece-style scores and token types.

    llama.cpp's llama tokenizer (llm_tokenizer_spm) merges, among adjacent
    pairs whose concatenation is a piece, the one whose piece scores highest
    (leftmost on ties); Hugging Face's BPE merges the pair ranked first in
    tokenizer.json's merges. For a tokenizer.json converted from a
    sentencepiece model (llama2's, stories260K's) the merges list holds
    every such pair, ordered by the merged piece's score, so score = -rank
    of the piece's first merge reproduces the tokenization exactly. The
    vocabulary id order is not the same thing: llama2's whitespace runs
    ("▁▁" is id 259) rank last among its merges (their sentencepiece scores
    are -1e9), and -id scores merge runs of spaces first ("    check"
    becomes "▁▁▁▁" "check", not "▁▁▁" "▁check"). Pieces that no merge makes
    (single characters) score below every merged piece; without a merges
    list, -id."""
    ranks = merge_ranks(merges)
    scores, types = [], []
    for i, t in enumerate(tokens):
        if t == "<unk>":
            types.append(TOK_UNKNOWN)
        elif t in ("<s>", "</s>"):
            types.append(TOK_CONTROL)
        elif len(t) == 6 and t.startswith("<0x") and t.endswith(">"):
            types.append(TOK_BYTE)
        else:
            types.append(TOK_NORMAL)
        if types[-1] != TOK_NORMAL:
            scores.append(0.0)
        elif not ranks:
            scores.append(-float(i))
        else:
            scores.append(-float(ranks.get(t, len(ranks) + i)))
    return scores, types


class GGUFWriter:
    """Collects metadata and tensors, then writes header, infos, data."""

    def __init__(self):
        self.kv = []  # encoded key/value pairs
        self.tensors = []  # (name, numpy shape, ggml type, bytes)

    @staticmethod
    def _str(s):
        b = s.encode("utf-8")
        return struct.pack("<Q", len(b)) + b

    def add(self, key, vtype, value):
        enc = self._str(key) + struct.pack("<I", vtype)
        if vtype == T_STRING:
            enc += self._str(value)
        elif vtype == T_UINT32:
            enc += struct.pack("<I", value)
        elif vtype == T_FLOAT32:
            enc += struct.pack("<f", value)
        elif vtype == T_BOOL:
            enc += struct.pack("<B", 1 if value else 0)
        else:
            raise ValueError(f"scalar type {vtype}")
        self.kv.append(enc)

    def add_array(self, key, etype, values):
        enc = self._str(key) + struct.pack("<IIQ", T_ARRAY, etype, len(values))
        if etype == T_STRING:
            enc += b"".join(self._str(v) for v in values)
        elif etype == T_FLOAT32:
            enc += np.asarray(values, dtype="<f4").tobytes()
        elif etype == T_INT32:
            enc += np.asarray(values, dtype="<i4").tobytes()
        else:
            raise ValueError(f"array type {etype}")
        self.kv.append(enc)

    def add_tensor(self, name, shape, ggml_type, data):
        """data: the bytes, or a function that makes them when the file is
        written (their length must then be type_nbytes(shape, ggml_type))."""
        self.tensors.append((name, tuple(shape), ggml_type, data))

    def write(self, path):
        with open(path, "wb") as f:
            f.write(GGUF_MAGIC + struct.pack("<IQQ", GGUF_VERSION, len(self.tensors), len(self.kv)))
            for enc in self.kv:
                f.write(enc)
            offset = 0
            for name, shape, gtype, data in self.tensors:
                # dims innermost first (ggml's ne[0] is the row length)
                f.write(self._str(name) + struct.pack("<I", len(shape)))
                f.write(struct.pack(f"<{len(shape)}Q", *reversed(shape)))
                f.write(struct.pack("<IQ", gtype, offset))
                n = len(data) if isinstance(data, bytes) else type_nbytes(shape, gtype)
                offset += (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT
            f.write(b"\0" * (-f.tell() % ALIGNMENT))
            for name, shape, gtype, data in self.tensors:
                if not isinstance(data, bytes):
                    data = data()
                    if len(data) != type_nbytes(shape, gtype):
                        raise ValueError(f"{name}: {len(data)} bytes, want {type_nbytes(shape, gtype)}")
                f.write(data)
                f.write(b"\0" * (-len(data) % ALIGNMENT))


ARCH = {"llama": "llama", "qwen3_moe": "qwen3moe"}  # model_type -> general.architecture


def convert(model_dir, out_path, wtype, tokenizer_path):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    mtype = cfg.get("model_type", "llama")
    if mtype not in ARCH:
        sys.exit(f"hf_to_gguf: {model_dir}/config.json: model_type {mtype!r}, only {', '.join(ARCH)}")
    arch = ARCH[mtype]
    w = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    n_layers, n_heads = cfg["num_hidden_layers"], cfg["num_attention_heads"]
    n_kv = cfg.get("num_key_value_heads", n_heads)
    dim, vocab_size = cfg["hidden_size"], cfg["vocab_size"]
    head_dim = cfg.get("head_dim", dim // n_heads)
    moe = arch == "qwen3moe"
    if moe and (cfg.get("mlp_only_layers") or cfg.get("decoder_sparse_step", 1) != 1):
        sys.exit(f"hf_to_gguf: {model_dir}/config.json: dense layers in a Qwen3-MoE (mlp_only_layers, "
                 "decoder_sparse_step) are not written")

    g = GGUFWriter()
    g.add("general.architecture", T_STRING, arch)
    g.add("general.name", T_STRING, os.path.basename(os.path.normpath(model_dir)))
    g.add("general.alignment", T_UINT32, ALIGNMENT)
    g.add("general.file_type", T_UINT32, FILE_TYPE[wtype])
    g.add(f"{arch}.context_length", T_UINT32, cfg["max_position_embeddings"])
    g.add(f"{arch}.embedding_length", T_UINT32, dim)
    g.add(f"{arch}.block_count", T_UINT32, n_layers)
    g.add(f"{arch}.feed_forward_length", T_UINT32, cfg["intermediate_size"])
    g.add(f"{arch}.attention.head_count", T_UINT32, n_heads)
    g.add(f"{arch}.attention.head_count_kv", T_UINT32, n_kv)
    g.add(f"{arch}.attention.key_length", T_UINT32, head_dim)
    g.add(f"{arch}.attention.value_length", T_UINT32, head_dim)
    g.add(f"{arch}.rope.dimension_count", T_UINT32, head_dim)
    g.add(f"{arch}.rope.freq_base", T_FLOAT32, float(cfg.get("rope_theta", 10000.0)))
    g.add(f"{arch}.attention.layer_norm_rms_epsilon", T_FLOAT32, float(cfg.get("rms_norm_eps", 1e-5)))
    g.add(f"{arch}.vocab_size", T_UINT32, vocab_size)
    if moe:
        g.add(f"{arch}.expert_count", T_UINT32, cfg["num_experts"])
        g.add(f"{arch}.expert_used_count", T_UINT32, cfg["num_experts_per_tok"])
        g.add(f"{arch}.expert_feed_forward_length", T_UINT32, cfg["moe_intermediate_size"])
    tokens, scores, types = load_vocab(tokenizer_path, vocab_size)
    g.add("tokenizer.ggml.model", T_STRING, "llama")
    g.add_array("tokenizer.ggml.tokens", T_STRING, tokens)
    g.add_array("tokenizer.ggml.scores", T_FLOAT32, scores)
    g.add_array("tokenizer.ggml.token_type", T_INT32, types)
    g.add("tokenizer.ggml.bos_token_id", T_UINT32, int(cfg.get("bos_token_id", 1)))
    g.add("tokenizer.ggml.eos_token_id", T_UINT32, int(cfg.get("eos_token_id", 2)))
    g.add("tokenizer.ggml.unknown_token_id", T_UINT32, 0)
    g.add("tokenizer.ggml.add_bos_token", T_BOOL, True)

    def need(hf_name):
        if hf_name not in w:
            sys.exit(f"hf_to_gguf: {model_dir}/model.safetensors: tensor {hf_name} missing")

    def matrix_bytes(hf_name):
        """One matrix as wtype: a BF16 tensor's bits as they are stored when
        written as bf16 (the same bits rounding its float32 value gives)."""
        bits = w.bf16_bits(hf_name) if wtype == "bf16" else None
        return bits.tobytes() if bits is not None else tensor_bytes(w[hf_name], wtype, hf_name)[1]

    def put(gguf_name, hf_name, rope_heads=None):
        need(hf_name)
        a = w[hf_name]
        if rope_heads is not None:
            a = hf_to_meta_rope(a, rope_heads)
        gtype, data = tensor_bytes(a, wtype, hf_name)
        g.add_tensor(gguf_name, a.shape, gtype, data)

    def put_experts(gguf_name, names, shape):
        """The experts' matrices stacked [E][...] into one tensor, made when
        written, one expert after the other (rows are whole blocks in each)."""
        for n in names:
            need(n)
        full = (len(names),) + tuple(shape)
        gtype = tensor_type(full, wtype)
        g.add_tensor(gguf_name, full, gtype, lambda: b"".join(matrix_bytes(n) for n in names))

    put("token_embd.weight", "model.embed_tokens.weight")
    for i in range(n_layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        put(b + "attn_norm.weight", p + "input_layernorm.weight")
        # llama rotates interleaved pairs (HF's rotate-half undone); qwen3moe is NEOX: as stored
        put(b + "attn_q.weight", p + "self_attn.q_proj.weight", None if moe else n_heads)
        put(b + "attn_k.weight", p + "self_attn.k_proj.weight", None if moe else n_kv)
        put(b + "attn_v.weight", p + "self_attn.v_proj.weight")
        put(b + "attn_output.weight", p + "self_attn.o_proj.weight")
        if moe:
            put(b + "attn_q_norm.weight", p + "self_attn.q_norm.weight")
            put(b + "attn_k_norm.weight", p + "self_attn.k_norm.weight")
        put(b + "ffn_norm.weight", p + "post_attention_layernorm.weight")
        if moe:
            E, Ie = cfg["num_experts"], cfg["moe_intermediate_size"]
            put(b + "ffn_gate_inp.weight", p + "mlp.gate.weight")
            ex = [f"{p}mlp.experts.{e}." for e in range(E)]
            put_experts(b + "ffn_gate_exps.weight", [x + "gate_proj.weight" for x in ex], (Ie, dim))
            put_experts(b + "ffn_up_exps.weight", [x + "up_proj.weight" for x in ex], (Ie, dim))
            put_experts(b + "ffn_down_exps.weight", [x + "down_proj.weight" for x in ex], (dim, Ie))
        else:
            put(b + "ffn_gate.weight", p + "mlp.gate_proj.weight")
            put(b + "ffn_up.weight", p + "mlp.up_proj.weight")
            put(b + "ffn_down.weight", p + "mlp.down_proj.weight")
    put("output_norm.weight", "model.norm.weight")
    if not cfg.get("tie_word_embeddings", False) and "lm_head.weight" in w:
        put("output.weight", "lm_head.weight")
    g.write(out_path)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    default_tok = os.path.join(os.environ.get("PAGEDGEN_SHARED", os.path.join(here, "..", "..", "shared")),
                               "tokenizers", "llama2", "tokenizer.json")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir")
    ap.add_argument("out")
    ap.add_argument("--type", choices=sorted(GGML_TYPE), default="f32", help="weight type (default f32)")
    ap.add_argument("--tokenizer", help="tokenizer.json whose vocabulary to embed (default: MODEL_DIR's, "
                    "else ../shared/tokenizers/llama2; a minimal vocabulary if its size differs)")
    a = ap.parse_args()
    tok = a.tokenizer
    if tok is not None and not os.path.isfile(tok):
        sys.exit(f"hf_to_gguf: --tokenizer {tok}: expected a tokenizer.json file, got no such file")
    if tok is None:  # the checkpoint's own, else the llama2 one (the synthetic models have none)
        own = os.path.join(a.model_dir, "tokenizer.json")
        tok = own if os.path.exists(own) else default_tok
    convert(a.model_dir, a.out, a.type, tok)


if __name__ == "__main__":
    main()
