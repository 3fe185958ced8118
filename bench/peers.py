#!/usr/bin/python3
"""peers: the "peers" section of scripts/bench (issue 13) — llama.cpp's
llama-batched-bench on the shapes pagedgen_bench's storage section just ran
(same synthetic 110m weights as GGUF, same threads, prompt / output length
and batch sizes, read from its results.json), and pagedgen ÷ llama.cpp per
storage type:

    pagedgen f32 weights  vs llama.cpp F32 GGUF
    pagedgen bf16 weights vs llama.cpp BF16 GGUF
    pagedgen int8 weights vs llama.cpp Q8_0 GGUF

pagedgen's rows are those with a bf16 KV cache (llama.cpp's default cache is
f16: both 16 bits) and, beside them, f32 KV. Columns: batch-1 decode tok/s,
batch-B decode tok/s (llama.cpp's S_TG t/s) and batch-B generated tok/s
including prefill (B * TG / T s, what pagedgen_bench calls gen t/s).

--section moe (issue 31): the same on the moe section's Qwen3-MoE (its
"moe" rows of results.json, the MoE model's, not the dense twin's), bf16 vs
BF16 and int8 vs Q8_0 only; the GGUFs are that model's (hf_to_gguf.py
writes Qwen3-MoE in llama.cpp's qwen3moe layout).

llama.cpp runs as many rounds as pagedgen's storage section did (its
results.json "rounds", or --rounds), the types interleaved within a round,
and each figure keeps its best round: the rule pagedgen's own figures
follow, so neither side gets more tries than the other.

stdlib only. Nothing is downloaded: the binary and the GGUF files are paths
the user gives (bench/hf_to_gguf.py writes the GGUFs from our checkpoint).

Usage: peers.py --llama-batched-bench PATH --results results.json [--section storage|moe]
                [--gguf f32=F] [--gguf bf16=F] [--gguf q8_0=F] [--rounds N] [--out peers.json]

Perplexity (issue 21): with --llama-perplexity PATH --pagedgen PATH
--model-dir DIR --text FILE --gguf f32=F [--tokenizer DIR] [--ctx N] [--threads N]
[--rounds N (default 3)],
llama.cpp's llama-perplexity (-c N -b N) and `pagedgen perplexity` (--ctx N,
its default --batch-size) run on the same weights, text, window and
threads: both estimates, their relative difference (issue 21 wants < 0.1%
in f32; exit 1 over it) and evaluated tok/s (windows x N tokens over the
passes, without loading or tokenizing: llama.cpp's "prompt eval" time, or
its log timestamps when that line is lost, see parse_llama_perplexity;
pagedgen's tok_per_s), each side its best of the interleaved rounds.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

# pagedgen weight storage type -> the GGUF type it is compared with
PAIRS = (("f32", "f32"), ("bf16", "bf16"), ("int8", "q8_0"))
# the --matmul-precision mode that computes on a storage type (issue 20)
MODE_OF = {"bf16": "bf16", "int8": "int8"}


def parse_batched_bench(text):
    """Rows of llama-batched-bench's markdown table as dicts keyed by its
    column names (PP, TG, B, N_KV, T_PP s, S_PP t/s, T_TG s, S_TG t/s, T s,
    S t/s), numbers as floats. Columns are found by name, so a reordering or
    an added column does not break it; lines that are not table rows are
    ignored."""
    header, rows = None, []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if header is None:
            if "PP" in cells and "TG" in cells and "B" in cells:
                header = cells
            continue
        if all(set(c) <= set("-: ") for c in cells):
            continue  # the |---|---| separator
        if len(cells) != len(header):
            raise ValueError(f"llama-batched-bench row has {len(cells)} cells, header {len(header)}: {line}")
        try:
            rows.append({h: float(c) for h, c in zip(header, cells)})
        except ValueError as e:
            raise ValueError(f"llama-batched-bench row not numeric: {line}") from e
    if header is None:
        raise ValueError("no llama-batched-bench table (a line '| PP | TG | B | ...') in its output")
    for need in ("PP", "TG", "B", "T_TG s", "S_TG t/s", "T s"):
        if need not in header:
            raise ValueError(f"llama-batched-bench table has no column '{need}': {header}")
    return rows


def peer_figures(row):
    """decode tok/s, generated tok/s incl. prefill and prefill tok/s from one table row."""
    b, tg = row["B"], row["TG"]
    return {"decode_tok_s": row["S_TG t/s"], "gen_tok_s": b * tg / row["T s"] if row["T s"] > 0 else 0.0,
            "prefill_tok_s": row.get("S_PP t/s", 0.0)}


def run_batched_bench(binary, gguf, prompt, gen, batches, threads):
    # context: every sequence its P + G cells plus slack (llama.cpp may split it per sequence)
    cmd = [binary, "-m", gguf, "-c", str(max(batches) * (prompt + gen + 16)), "-b", "2048", "-ub", "512",
           "-npp", str(prompt), "-ntg", str(gen), "-npl", ",".join(str(b) for b in batches),
           "-t", str(threads), "-tb", str(threads), "-ngl", "0"]
    print("  $ " + " ".join(cmd), flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        tail = "\n".join((p.stderr or p.stdout).splitlines()[-15:])
        raise RuntimeError(f"{binary} exited with {p.returncode}:\n{tail}")
    return cmd, parse_batched_bench(p.stdout + "\n" + p.stderr)


def pagedgen_rows(results, section="storage"):
    """rows of results.json's section: (weights, kv, matmul) -> {batch: figures}
    (matmul: the --matmul-precision; "exact" for rows written before issue 20).
    The moe section's rows of its dense twin ("model": "dense") are left out."""
    st = results.get(section)
    if not st:
        raise ValueError(f"results.json has no {section} section (run pagedgen_bench with it)")
    out = {}
    for r in st["rows"]:
        if r.get("model", "moe") != "moe":
            continue
        out[(r["weights"], r["kv"], r.get("matmul", "exact"))] = {b["batch"]: b for b in r["batches"]}
    if not out:
        raise ValueError(f"results.json's {section} section has no rows")
    return st, out


def log_seconds(stamp):
    """llama.cpp's log timestamp "M.SS.mmm.uuu" (minutes, seconds, ms, us
    since the logger started) in seconds."""
    m, sec, ms, us = (int(x) for x in stamp.split("."))
    return m * 60 + sec + ms / 1e3 + us / 1e6


def parse_llama_perplexity(text, wall_s=None):
    """{"ppl", "ppl_stderr", "tokens", "seconds", "tok_per_s", "timing"}
    from llama-perplexity's output.

    ppl: "Final estimate: PPL = X +/- Y", else the last running "[i]X" when
    i is the chunk count of "calculating perplexity over N chunks, n_ctx=C"
    (ppl_stderr None then). Recent llama.cpp logs through an asynchronous
    logger that it never flushes at exit (common/log.cpp, common_log_main),
    so the last lines of a run (the final estimate, llama_perf's "prompt
    eval time") are sometimes, under load mostly, lost.
    seconds, in order of preference ("timing"):
      perf       llama_perf_context_print's "prompt eval time = T ms / N tokens";
      log        the log timestamps from "calculating perplexity" to "Final
                 estimate" (the passes and the scoring, as perf covers);
      wall       wall_s (the process's wall time, given by the caller) minus
                 the "calculating perplexity" timestamp: the passes plus
                 teardown, a few ms more than llama.cpp's own figure;
      None       none of these (seconds, tokens and tok_per_s None).
    tokens: perf's N, else chunks x n_ctx (what every pass evaluates).
    ValueError when the value itself is lost."""
    calc = re.search(r"(?:^|\n)(\d+\.\d+\.\d+\.\d+) \w perplexity: calculating perplexity over (\d+) chunks, "
                     r"n_ctx=(\d+)", text)
    calc_plain = re.search(r"calculating perplexity over (\d+) chunks, n_ctx=(\d+)", text)
    final = re.search(r"(?:(\d+\.\d+\.\d+\.\d+) \w )?Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", text)
    perf = re.search(r"prompt eval time =\s*([0-9.]+) ms /\s*([0-9]+) tokens", text)
    if final:
        ppl, ppl_se = float(final.group(2)), float(final.group(3))
    else:
        if not calc_plain:
            raise ValueError("no 'Final estimate: PPL = ...' and no 'calculating perplexity over N chunks' in "
                             "llama-perplexity's output")
        n_chunks = int(calc_plain.group(1))
        last = re.search(r"\[%d\]([0-9.]+)," % n_chunks, text)
        if not last:
            raise ValueError(f"no 'Final estimate: PPL = ...' and no running estimate [{n_chunks}] in "
                             "llama-perplexity's output")
        ppl, ppl_se = float(last.group(1)), None
    if perf:
        secs, tokens, how = float(perf.group(1)) / 1e3, int(perf.group(2)), "perf"
    elif calc and final and final.group(1):
        secs, how = log_seconds(final.group(1)) - log_seconds(calc.group(1)), "log"
        tokens = int(calc.group(2)) * int(calc.group(3))
    elif calc and wall_s is not None and wall_s > log_seconds(calc.group(1)):
        secs, how = wall_s - log_seconds(calc.group(1)), "wall"
        tokens = int(calc.group(2)) * int(calc.group(3))
    else:  # no figure to time from: the value alone
        return {"ppl": ppl, "ppl_stderr": ppl_se, "tokens": None, "seconds": None, "tok_per_s": None,
                "timing": None}
    return {"ppl": ppl, "ppl_stderr": ppl_se, "tokens": tokens, "seconds": secs,
            "tok_per_s": tokens / secs if secs > 0 else 0.0, "timing": how}


def run_llama_perplexity(cmd, tries=3):
    """One llama-perplexity run, parsed; run again (up to `tries` in all)
    when its log lost the lines that give the value (see
    parse_llama_perplexity), saying so."""
    for k in range(tries):
        print("  $ " + " ".join(cmd), flush=True)
        t0 = time.monotonic()
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wall = time.monotonic() - t0
        if p.returncode != 0:
            tail = "\n".join((p.stderr or p.stdout).splitlines()[-15:])
            raise RuntimeError(f"{cmd[0]} exited with {p.returncode}:\n{tail}")
        try:
            fig = parse_llama_perplexity(p.stdout + "\n" + p.stderr, wall)
            if fig["tok_per_s"] is None:
                raise ValueError("no 'prompt eval time' line and no timestamped 'calculating perplexity' line "
                                 "to time it from")
            return fig
        except ValueError as e:
            if k + 1 == tries:
                raise
            print(f"    (llama-perplexity's output lost its last lines: {e}; running it again)", flush=True)


def run_perplexity_pair(a, gguf):
    """Both perplexity runs, a.rounds interleaved rounds (llama.cpp, then
    pagedgen), each side's fastest kept; returns the report dict.

    Both run the commands issue 21 compares: llama-perplexity -c N -b N
    (one window a decode: its fastest setting on CPU; -b 4N batches four
    windows into one unified KV cache whose attention spans all four) and
    pagedgen perplexity --ctx N with its default --batch-size 2048."""
    best = {}
    for _ in range(a.rounds or 1):
        cmd_l = [a.llama_perplexity, "-m", gguf, "-f", a.text, "-c", str(a.ctx), "-b", str(a.ctx),
                 "-t", str(a.threads), "-tb", str(a.threads), "-ngl", "0", "--log-timestamps", "--log-prefix"]
        cmd_p = [a.pagedgen, "perplexity", "-m", a.model_dir, "-f", a.text, "--ctx", str(a.ctx),
                 "--threads", str(a.threads), "--dtype", "float32", "-q"]
        if a.tokenizer:
            cmd_p += ["--tokenizer", a.tokenizer]
        for side, cmd in (("llama.cpp", cmd_l), ("pagedgen", cmd_p)):
            if side == "llama.cpp":
                fig = run_llama_perplexity(cmd)
            else:
                print("  $ " + " ".join(cmd), flush=True)
                p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                if p.returncode != 0:
                    tail = "\n".join((p.stderr or p.stdout).splitlines()[-15:])
                    raise RuntimeError(f"{cmd[0]} exited with {p.returncode}:\n{tail}")
                fig = json.loads(p.stdout.strip().splitlines()[-1])
                fig["timing"] = "own"
            print(f"    ppl {fig['ppl']:.4f}  {fig['tok_per_s']:.1f} tok/s ({fig['timing']})", flush=True)
            if side not in best or fig["tok_per_s"] > best[side]["tok_per_s"]:
                keep_se = best.get(side, {}).get("ppl_stderr")
                best[side] = dict(fig, command=cmd)
                if best[side]["ppl_stderr"] is None:  # a lost final line: another round's
                    best[side]["ppl_stderr"] = keep_se
            elif best[side]["ppl_stderr"] is None:
                best[side]["ppl_stderr"] = fig["ppl_stderr"]
    lc, pg = best["llama.cpp"], best["pagedgen"]
    rel = abs(pg["ppl"] - lc["ppl"]) / lc["ppl"]
    se = lambda f: f"{f['ppl_stderr']:.5f}" if f["ppl_stderr"] is not None else "(lost)"
    print(f"  llama-perplexity  ppl {lc['ppl']:.4f} +/- {se(lc)}  {lc['tok_per_s']:9.1f} tok/s")
    print(f"  pagedgen          ppl {pg['ppl']:.4f} +/- {se(pg)}  {pg['tok_per_s']:9.1f} tok/s"
          f"  ({ratio(pg['tok_per_s'], lc['tok_per_s']):.2f}x; ppl differs by {100 * rel:.4f}%, "
          f"{'within' if rel <= 1e-3 else 'OVER'} 0.1%)")
    print(f"  (tok/s: every token evaluated, windows x {a.ctx}; each side its best of {a.rounds or 1} "
          f"interleaved round{'s' if (a.rounds or 1) != 1 else ''}; scored tok/s is the same ratio)")
    return {"ctx": a.ctx, "threads": a.threads, "text": os.path.abspath(a.text), "rounds": a.rounds or 1,
            "llama_cpp": lc, "pagedgen": pg, "ppl_rel_diff": rel,
            "ratio_tok_per_s": ratio(pg["tok_per_s"], lc["tok_per_s"])}


def ratio(a, b):
    return a / b if a and b else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-batched-bench", metavar="PATH")
    ap.add_argument("--llama-perplexity", metavar="PATH", help="perplexity mode (see above)")
    ap.add_argument("--pagedgen", metavar="PATH", help="perplexity mode: the pagedgen binary")
    ap.add_argument("--model-dir", help="perplexity mode: the HF model folder the GGUF was written from")
    ap.add_argument("--text", help="perplexity mode: the text file")
    ap.add_argument("--tokenizer", help="perplexity mode: pagedgen's tokenizer folder when the model "
                    "folder has none (the synthetic models: ../shared/tokenizers/llama2)")
    ap.add_argument("--ctx", type=int, default=512, help="perplexity mode: window [default: 512]")
    ap.add_argument("--threads", type=int, default=2, help="perplexity mode [default: 2]")
    ap.add_argument("--gguf", action="append", default=[], metavar="TYPE=FILE",
                    help="a GGUF of the same model: f32=, bf16= or q8_0= (repeat)")
    ap.add_argument("--results", help="pagedgen_bench's results.json of this run")
    ap.add_argument("--section", choices=("storage", "moe"), default="storage",
                    help="which section's rows and shapes (default storage)")
    ap.add_argument("--rounds", type=int, help="llama.cpp runs per type, best kept "
                    "[default: the storage section's rounds; perplexity mode: 3]")
    ap.add_argument("--out", help="write the figures and ratios here as JSON")
    a = ap.parse_args()
    if a.llama_perplexity:
        gg = dict(spec.partition("=")[::2] for spec in a.gguf)
        if "f32" not in gg or not (a.pagedgen and a.model_dir and a.text):
            sys.exit("peers: --llama-perplexity needs --pagedgen, --model-dir, --text and --gguf f32=FILE")
        if a.rounds is None:
            a.rounds = 3
        if a.rounds < 1:
            sys.exit(f"peers: --rounds {a.rounds}: want at least 1")
        print(f"\n== peers: perplexity (issue 21): llama-perplexity vs pagedgen perplexity, f32, --ctx {a.ctx}, "
              f"{a.threads} threads, {os.path.basename(a.text)}")
        try:
            rep = run_perplexity_pair(a, gg["f32"])
        except (RuntimeError, ValueError, OSError) as e:
            print(f"peers: perplexity: {e}", file=sys.stderr)
            return 1
        if a.out:
            with open(a.out, "w") as f:
                json.dump(rep, f, indent=2)
                f.write("\n")
        return 0 if rep["ppl_rel_diff"] <= 1e-3 else 1
    if not a.llama_batched_bench or not a.results:
        sys.exit("peers: --llama-batched-bench PATH and --results FILE are required (or --llama-perplexity)")

    ggufs = {}
    for spec in a.gguf:
        t, _, path = spec.partition("=")
        if t not in dict((g, p) for p, g in PAIRS).keys() or not path:
            sys.exit(f"peers: --gguf {spec}: want f32=FILE, bf16=FILE or q8_0=FILE")
        if not os.path.isfile(path):
            sys.exit(f"peers: --gguf {spec}: no such file")
        ggufs[t] = path
    if not os.access(a.llama_batched_bench, os.X_OK):
        sys.exit(f"peers: {a.llama_batched_bench}: not an executable")
    with open(a.results) as f:
        results = json.load(f)
    try:
        st, pg = pagedgen_rows(results, a.section)
    except (ValueError, KeyError) as e:
        sys.exit(f"peers: {a.results}: {e}")
    P, G, threads = st["prompt_len"], st["output_len"], st["threads"]
    rounds = a.rounds if a.rounds is not None else int(st.get("rounds", 1))
    if rounds < 1:
        sys.exit(f"peers: --rounds {rounds}: want at least 1")
    batches = sorted(next(iter(pg.values())).keys())
    bmax = batches[-1]

    pairs = PAIRS if a.section == "storage" else tuple(p for p in PAIRS if p[0] != "f32")
    what = "issue 13" if a.section == "storage" else "issue 31, Qwen3-MoE"
    print(f"\n== peers ({what}): llama.cpp llama-batched-bench on the {a.section} section's shapes: "
          f"prompt {P} / output {G}, batch {' and '.join(map(str, batches))}, {threads} threads, "
          f"best of {rounds} interleaved round{'s' if rounds != 1 else ''}")
    report = {"section": a.section, "prompt_len": P, "output_len": G, "threads": threads, "batches": batches, "rounds": rounds,
              "llama_batched_bench": os.path.abspath(a.llama_batched_bench), "rows": []}
    hdr = ("  %-30s | %11s %12s %12s %13s | %8s %8s %8s %8s" %
           ("pagedgen vs llama.cpp", "b1 decode/s", f"b{bmax} decode/s", f"b{bmax} gen t/s", f"b{bmax} prefill/s",
            "b1 dec", f"b{bmax} dec", f"b{bmax} gen", f"b{bmax} pre"))
    # llama.cpp: every type once per round, each figure's best round kept
    # a type whose run fails is reported and left out; the others still print
    # (a llama.cpp build can die on one type alone: AMX kernels for Q8_0 on a
    # machine whose kernel refuses AMX state, SIGILL)
    best, cmds, failed = {}, {}, {}
    for _ in range(rounds):
        for pg_type, gg_type in pairs:
            if gg_type not in ggufs or gg_type in failed:
                continue
            try:
                cmd, rows = run_batched_bench(a.llama_batched_bench, ggufs[gg_type], P, G, batches, threads)
            except (RuntimeError, ValueError, OSError) as e:
                print(f"peers: {gg_type}: {e}", file=sys.stderr)
                failed[gg_type] = str(e).splitlines()[0]
                continue
            peer = {}
            for r in rows:
                if int(r["PP"]) == P and int(r["TG"]) == G:
                    peer[int(r["B"])] = peer_figures(r)
            if any(b not in peer for b in batches):
                print(f"peers: {gg_type}: llama-batched-bench printed no row for every batch {batches}",
                      file=sys.stderr)
                failed[gg_type] = "no row for every batch"
                continue
            cmds[gg_type] = cmd
            kept = best.setdefault(gg_type, {b: dict(peer[b]) for b in batches})
            for b in batches:
                for k, v in peer[b].items():
                    kept[b][k] = max(kept[b][k], v)
    lines = []
    for pg_type, gg_type in pairs:
        if gg_type not in ggufs:
            lines.append(f"  ({pg_type} vs {gg_type}: no --gguf {gg_type}=FILE given: skipped)")
            continue
        if gg_type in failed:
            lines.append(f"  ({pg_type} vs {gg_type}: llama.cpp failed: {failed[gg_type]})")
            report["rows"].append({"gguf_type": gg_type, "failed": failed[gg_type]})
            continue
        peer, cmd = best[gg_type], cmds[gg_type]
        fig = lambda d: (d[batches[0]]["decode_tok_s"], d[bmax]["decode_tok_s"], d[bmax]["gen_tok_s"],
                         d[bmax].get("prefill_tok_s", 0.0))
        lc = fig(peer)
        lines.append("  %-30s | %11.1f %12.1f %12.1f %13.1f |" % (f"llama.cpp {gg_type} (f16 kv)", *lc))
        entry = {"gguf_type": gg_type, "gguf": os.path.abspath(ggufs[gg_type]), "command": cmd,
                 "llama_cpp": {str(b): peer[b] for b in batches}, "pagedgen": {}}
        # the storage type's exact rows, then its arithmetic mode (issue 20: bf16 vs BF16, int8 vs Q8_0)
        for kv, matmul in (("bf16", "exact"), ("f32", "exact"), ("bf16", MODE_OF.get(pg_type, ""))):
            if (pg_type, kv, matmul) not in pg:
                continue
            p = fig(pg[(pg_type, kv, matmul)])
            r = tuple(ratio(x, y) for x, y in zip(p, lc))
            label = f"pagedgen {pg_type} ({kv} kv)" + (f" {matmul} math" if matmul != "exact" else "")
            lines.append("  %-30s | %11.1f %12.1f %12.1f %13.1f | %7.2fx %7.2fx %7.2fx %7.2fx" % (label, *p, *r))
            key = kv if matmul == "exact" else f"{kv}/{matmul}"
            entry["pagedgen"][key] = {"b1_decode_tok_s": p[0], "decode_tok_s": p[1], "gen_tok_s": p[2],
                                      "prefill_tok_s": p[3], "ratio_b1_decode": r[0], "ratio_decode": r[1],
                                      "ratio_gen": r[2], "ratio_prefill": r[3]}
        report["rows"].append(entry)
    print(hdr)
    for ln in lines:
        print(ln)
    print(f"  (ratios: pagedgen / llama.cpp on the same weights and shapes, this run, each side its best "
          f"of {rounds} round{'s' if rounds != 1 else ''}; gen t/s: B x {G} generated tokens / wall time "
          f"incl. prefill)")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(report, f, indent=2)
            f.write("\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
