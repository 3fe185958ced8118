#!/usr/bin/env python3
"""Hugging Face transformers' generate() on the same requests as a pagedgen
run: the peer a GPU user has at hand when vLLM is not installed.

Reads the prompts of each pagedgen input file (prompt_token_ids lines, as
scripts/device-check writes them: every line the same prompt length and
max_tokens, ignore_eos), runs them as one padded batch through
model.generate(do_sample=False, min_new_tokens = max_new_tokens = max_tokens)
in bfloat16 on cuda:0 (attn_implementation sdpa, the default), and prints
one line per file: batch, prompt and generated tokens, seconds, generated tok/s
(prefill included, as pagedgen's summary counts it). One warm-up generate of
4 tokens first, outside the timing (CUDA context, cuBLAS handles, kernels).

Usage: peer_transformers.py MODEL_DIR INPUT.jsonl... [--dtype bfloat16|float32]
Needs torch with CUDA and transformers (the device machine's image has
them); never run in CI.
"""
import argparse
import json
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir")
    ap.add_argument("inputs", nargs="+", metavar="input")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    a = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, a.dtype)
    model = AutoModelForCausalLM.from_pretrained(a.model_dir, dtype=dtype).to("cuda").eval()
    for path in a.inputs:
        lines = [json.loads(l) for l in open(path) if l.strip()]
        ids = [l["prompt_token_ids"] for l in lines]
        gen = {l["max_tokens"] for l in lines}
        if len({len(p) for p in ids}) != 1 or len(gen) != 1:
            sys.exit(f"{path}: expected one prompt length and one max_tokens for every line")
        gen = gen.pop()
        x = torch.tensor(ids, dtype=torch.long, device="cuda")
        kw = dict(attention_mask=torch.ones_like(x), do_sample=False, pad_token_id=0)
        with torch.inference_mode():
            model.generate(x, max_new_tokens=4, min_new_tokens=4, **kw)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = model.generate(x, max_new_tokens=gen, min_new_tokens=gen, **kw)
            torch.cuda.synchronize()
            dt = time.perf_counter() - t0
        n_gen = (out.shape[1] - x.shape[1]) * x.shape[0]
        print(f"transformers {a.dtype} {path}: batch {x.shape[0]}, prompt {x.shape[1]}, "
              f"generated {n_gen} in {dt:.2f} s | {n_gen / dt:.1f} gen tok/s", flush=True)


if __name__ == "__main__":
    main()
