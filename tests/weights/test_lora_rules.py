#!/usr/bin/env python3
"""lora_config's module rules against PEFT's, on random adapter configs.

PEFT's rules, transcribed here with Python's `re` (the same calls PEFT
makes): huggingface/peft 5d602fdb (v0.20.0-47), tuners/tuners_utils.py
check_target_module_exists (exclude_modules; a string target_modules is
re.fullmatch; a list matches equal names or "." suffixes, then
layers_to_transform / layers_pattern for suffix matches only) and
utils/other.py get_pattern_key (the first rank_pattern / alpha_pattern key
K with re.match(rf"(.*\\.)?({K})$", module)). For each of N seeded configs
(list and regex targets, exclusions, layer selections in every form, rank
and alpha patterns with plain and regex keys) and 87 module names, the
driver's targeted / r / alpha must equal these. Configs PEFT's
LoraConfig.__post_init__ refuses must be refused. Python 3 stdlib only.

Usage: test_lora_rules.py DRIVER [N]
"""
import json
import os
import random
import re
import subprocess
import sys
import tempfile


def peft_targets(cfg, key):
    ex = cfg.get("exclude_modules")
    if ex:
        if isinstance(ex, str):
            if re.fullmatch(ex, key):
                return False
        elif key in ex or any(key.endswith("." + e) for e in ex):
            return False
    tm = cfg["target_modules"]
    if isinstance(tm, str):
        return re.fullmatch(tm, key) is not None
    if key in tm:
        return True
    found = any(key.endswith("." + t) for t in tm)
    li, lp = cfg.get("layers_to_transform"), cfg.get("layers_pattern")
    using = li is not None and (len(li) != 0 if isinstance(li, list) else True)
    if using and found:
        if lp is None or len(lp) == 0:
            m = re.match(r".*?\.[^.]*\.(\d+)\.", key)
        else:
            m = None
            for p in [lp] if isinstance(lp, str) else lp:
                m = re.match(rf".*?\.{p}\.(\d+)\.", key)
                if m is not None:
                    break
        if m is None:
            return False
        i = int(m.group(1))
        return i == li if isinstance(li, int) else i in li
    return found


def pattern_value(pat, key, default):
    for k in pat:
        if re.match(rf"(.*\.)?({k})$", key):
            return pat[k]
    return default


def peft_refuses(cfg):
    s = isinstance(cfg["target_modules"], str)
    return (s and ("layers_to_transform" in cfg or "layers_pattern" in cfg)) or \
        (bool(cfg.get("layers_pattern")) and "layers_to_transform" not in cfg)


PROJ = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
        "mlp.up_proj", "mlp.down_proj"]
MODULES = [f"model.layers.{l}.{p}" for l in range(12) for p in PROJ] + \
    ["lm_head", "model.embed_tokens", "model.layers.1.experts.3.w1"]
NAMES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "self_attn.q_proj",
         "mlp.down_proj", "model.layers.3.self_attn.v_proj", "proj", "layers.1.mlp.up_proj", "experts.3.w1"]
REGEXES = [r".*\.(q|v)_proj", r"model\.layers\.[0-5]\.self_attn\..*", r".*mlp.*", r"(q|k)_proj",
           r".*\.1[01]?\..*_proj", r"model.layers.\d+.mlp.(gate|up)_proj", r".*(?<!o)_proj", r"lm_head|.*q_proj"]


def random_config(rng):
    cfg = {"r": rng.randint(1, 64), "lora_alpha": rng.choice([8, 16, 32.5])}
    cfg["target_modules"] = rng.choice(REGEXES) if rng.random() < 0.3 else rng.sample(NAMES, rng.randint(1, 4))
    if rng.random() < 0.5:
        cfg["layers_to_transform"] = rng.choice([rng.randint(0, 11), rng.sample(range(12), rng.randint(0, 5))])
        if rng.random() < 0.4:
            cfg["layers_pattern"] = rng.choice(["layers", ["h", "layers"], "lay.rs", "h", "", []])
    elif rng.random() < 0.1:
        cfg["layers_pattern"] = "layers"
    if rng.random() < 0.3:
        cfg["exclude_modules"] = rng.choice([rng.sample(NAMES, 2), r".*\.[24]\..*", r".*up_proj"])
    if rng.random() < 0.5:
        cfg["rank_pattern"] = {k: rng.randint(1, 64) for k in rng.sample(NAMES + REGEXES, rng.randint(1, 4))}
    if rng.random() < 0.5:
        cfg["alpha_pattern"] = {k: rng.choice([1, 2.5, 64]) for k in rng.sample(NAMES + REGEXES, rng.randint(1, 4))}
    return cfg


def main():
    driver = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 400
    rng = random.Random(33)
    checked = refused = 0
    with tempfile.TemporaryDirectory() as d:
        cfgs, paths = [], []
        for it in range(n):
            cfgs.append(random_config(rng))
            paths.append(os.path.join(d, f"adapter_config_{it}.json"))
            with open(paths[-1], "w") as f:
                json.dump(cfgs[-1], f)
        # one driver process for every config (each answer after a "== PATH" line)
        lines = subprocess.run([driver] + paths, input="\n".join(MODULES) + "\n", capture_output=True,
                               text=True, check=True).stdout.splitlines()
        answers, cur = {}, None
        for line in lines:
            if line.startswith("== "):
                cur = answers.setdefault(line[3:], [])
            else:
                cur.append(line)
        for it, (cfg, path) in enumerate(zip(cfgs, paths)):
            out = answers.get(path)
            if out is None:
                sys.exit(f"config {it}: no answer from the driver")
            if peft_refuses(cfg):
                if not out or not out[0].startswith("refused:"):
                    sys.exit(f"config {it}: PEFT refuses {cfg}, the driver accepted it")
                refused += 1
                continue
            if not out or out[0].startswith("refused:"):
                sys.exit(f"config {it}: {cfg} refused: {out[0] if out else '(no output)'}")
            assert len(out) == len(MODULES), (it, len(out))
            for m, line in zip(MODULES, out):
                t, r, a = line.split()
                want = (peft_targets(cfg, m), pattern_value(cfg.get("rank_pattern", {}), m, cfg["r"]),
                        float(pattern_value(cfg.get("alpha_pattern", {}), m, cfg["lora_alpha"])))
                got = (t == "1", int(r), float(a))
                if got != want:
                    sys.exit(f"config {it}: {cfg}\n  module {m}: lora_config {got}, PEFT's rules {want}")
                checked += 1
    print(f"lora rules: {n} configs ({refused} refused as PEFT refuses them), {checked} module checks equal")


if __name__ == "__main__":
    main()
