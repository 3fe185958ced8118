#!/usr/bin/python3
"""Tests of the peers section's Python: the llama-batched-bench table parser
(bench/peers.py, on a fixed sample of its output) and the GGUF writer
(bench/hf_to_gguf.py: a tiny checkpoint written as GGUF and read back by an
independent reader here). The GGUF tests need numpy: without it they skip,
and the whole file exits 77 (meson's skip) when nothing could run."""
import json
import os
import struct
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402

try:
    import numpy as np
    import hf_to_gguf
except ImportError:
    np = None

# llama-batched-bench's stdout (llama.cpp 2025-2026), log lines around it
SAMPLE = """\
llama_context: n_ctx_per_seq = 16400
main: n_kv_max = 16400, n_batch = 2048, n_ubatch = 512, flash_attn = 0, is_pp_shared = 0, n_gpu_layers = 0, n_threads = 2, n_threads_batch = 2

|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |
|-------|--------|------|--------|----------|----------|----------|----------|----------|----------|
|   128 |    128 |    1 |    256 |    0.164 |   780.49 |    1.244 |   102.89 |    1.408 |   181.82 |
|   128 |    128 |   64 |  16384 |    7.800 |  1050.26 |   13.770 |   594.92 |   21.570 |   759.57 |

llama_perf_context_print:        load time =     120.00 ms
"""


class ParserTest(unittest.TestCase):
    def test_sample(self):
        rows = peers.parse_batched_bench(SAMPLE)
        self.assertEqual(len(rows), 2)
        self.assertEqual((rows[0]["PP"], rows[0]["TG"], rows[0]["B"], rows[0]["N_KV"]), (128, 128, 1, 256))
        self.assertAlmostEqual(rows[1]["S_TG t/s"], 594.92)
        f = peers.peer_figures(rows[1])
        self.assertAlmostEqual(f["decode_tok_s"], 594.92)
        self.assertAlmostEqual(f["gen_tok_s"], 64 * 128 / 21.570)

    def test_columns_by_name(self):
        swapped = SAMPLE.replace("|    PP |     TG |", "|     TG |    PP |")
        self.assertEqual(peers.parse_batched_bench(swapped)[0]["TG"], 128)

    def test_errors(self):
        with self.assertRaisesRegex(ValueError, "no llama-batched-bench table"):
            peers.parse_batched_bench("error: failed to load model\n")
        with self.assertRaisesRegex(ValueError, "not numeric"):
            peers.parse_batched_bench(SAMPLE.replace("102.89", "n/a"))
        with self.assertRaisesRegex(ValueError, "cells"):
            peers.parse_batched_bench(SAMPLE.replace("|   102.89 |", "|"))


PPL_SAMPLE = """\
perplexity: tokenizing the input ..
perplexity: calculating perplexity over 9 chunks, n_ctx=128, batch_size=2048, n_seq=16
perplexity: 0.05 seconds per pass - ETA 0.00 minutes
[1]3.5513,[2]3.9016,[3]4.0110,[4]4.1107,
Final estimate: PPL = 4.1107 +/- 0.29815

llama_perf_context_print:        load time =      12.34 ms
llama_perf_context_print: prompt eval time =     480.00 ms /  1152 tokens (    0.42 ms per token,  2400.00 tokens per second)
llama_perf_context_print:        eval time =       0.00 ms /     1 runs   (    0.00 ms per token,      inf tokens per second)
"""


class PerplexityParser(unittest.TestCase):
    def test_sample(self):
        f = peers.parse_llama_perplexity(PPL_SAMPLE)
        self.assertEqual((f["ppl"], f["ppl_stderr"], f["tokens"]), (4.1107, 0.29815, 1152))
        self.assertAlmostEqual(f["tok_per_s"], 2400.0)

    def test_missing(self):
        with self.assertRaises(ValueError):
            peers.parse_llama_perplexity("perplexity: tokenizing the input ..\n")


# llama-perplexity of 2026 (0.5.0-dev, de3ff81): timestamped log lines on
# stderr, the running estimate on stdout; no llama_perf lines (lost at exit)
PPL_TS_ERR = """\
0.00.642.111 I perplexity: tokenizing the input ..
0.00.643.123 I perplexity: calculating perplexity over 10 chunks, n_ctx=512, batch_size=512, n_seq=1
0.02.552.980 I perplexity: 1.97 seconds per pass - ETA 0.30 minutes
0.20.643.123 I Final estimate: PPL = 37552.9844 +/- 416.01728
"""
PPL_TS_OUT = "[1]40036.3605,[2]38365.6603,[9]37722.1304,[10]37552.9844,\n"


class PerplexityTimestamps(unittest.TestCase):
    def test_log_timing(self):
        f = peers.parse_llama_perplexity(PPL_TS_OUT + PPL_TS_ERR, 30.0)
        self.assertEqual((f["ppl"], f["ppl_stderr"], f["tokens"], f["timing"]), (37552.9844, 416.01728, 5120, "log"))
        self.assertAlmostEqual(f["seconds"], 20.0)

    def test_lost_final_line(self):
        """the final estimate lost: the running [10] value, timed by wall
        time from the 'calculating' line"""
        text = PPL_TS_OUT + PPL_TS_ERR.split("0.20.643")[0]
        f = peers.parse_llama_perplexity(text, 30.643123)
        self.assertEqual((f["ppl"], f["ppl_stderr"], f["timing"]), (37552.9844, None, "wall"))
        self.assertAlmostEqual(f["seconds"], 30.0)
        self.assertIsNone(peers.parse_llama_perplexity(text)["tok_per_s"])
        with self.assertRaisesRegex(ValueError, r"running estimate \[10\]"):
            peers.parse_llama_perplexity(text.replace("[10]37552.9844,", ""), 30.0)


class PerplexitySectionTest(unittest.TestCase):
    """peers.py --llama-perplexity end to end with stand-ins: the first
    llama-perplexity call loses its last lines (run again), rounds
    interleave, each side keeps its fastest, the values' relative
    difference decides the exit status."""

    def run_section(self, d, pagedgen_ppl):
        lp = os.path.join(d, "llama-perplexity")
        with open(lp, "w") as f:
            f.write("#!/bin/sh\necho \"$@\" >> %s/lp_args\necho x >> %s/lp_calls\n"
                    "if [ $(wc -l < %s/lp_calls) -ge 2 ]; then printf '%%s' '%s'; printf '%%s' '%s' >&2;"
                    " else printf '%%s' '%s'; printf '%%s' '%s' >&2; fi\n"
                    % (d, d, d, PPL_TS_OUT, PPL_TS_ERR, PPL_TS_OUT.split("[10]")[0],
                       PPL_TS_ERR.split("0.02.552")[0]))
        pg = os.path.join(d, "pagedgen")
        with open(pg, "w") as f:  # slower in its second run: the first is kept
            f.write("#!/bin/sh\necho \"$@\" >> %s/pg_args\necho x >> %s/pg_calls\n"
                    "if [ $(wc -l < %s/pg_calls) -ge 2 ]; then t=40.0; else t=25.0; fi\n"
                    "echo '{\"ppl\":%s,\"ppl_stderr\":416.0278,\"tok_per_s\":'$t'}'\n" % (d, d, d, pagedgen_ppl))
        for b in (lp, pg):
            os.chmod(b, 0o755)
        gguf, text = os.path.join(d, "m.gguf"), os.path.join(d, "t.txt")
        for x in (gguf, text):
            open(x, "w").close()
        out = os.path.join(d, "ppl.json")
        import subprocess
        p = subprocess.run([sys.executable, os.path.join(os.path.dirname(peers.__file__), "peers.py"),
                            "--llama-perplexity", lp, "--pagedgen", pg, "--model-dir", d, "--text", text,
                            "--gguf", "f32=" + gguf, "--rounds", "2", "--out", out],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        return p, out

    def test_agree(self):
        with tempfile.TemporaryDirectory() as d:
            p, out = self.run_section(d, "37553.223846")
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            self.assertIn("lost its last lines", p.stdout)
            self.assertIn("within 0.1%", p.stdout)
            with open(os.path.join(d, "lp_args")) as f:
                calls = f.read().splitlines()
            self.assertEqual(len(calls), 3)  # round 1 twice (lost lines), round 2 once
            args = calls[0].split()
            for flag, val in (("-c", "512"), ("-b", "512"), ("-t", "2"), ("-tb", "2")):
                self.assertEqual(args[args.index(flag) + 1], val)
            with open(os.path.join(d, "pg_args")) as f:
                args = f.read().splitlines()[0].split()
            self.assertEqual(args[:1] + args[args.index("--ctx"):args.index("--ctx") + 2], ["perplexity", "--ctx", "512"])
            with open(out) as f:
                rep = json.load(f)
            self.assertEqual(rep["rounds"], 2)
            self.assertAlmostEqual(rep["llama_cpp"]["tok_per_s"], 5120 / 20.0)
            self.assertEqual(rep["pagedgen"]["tok_per_s"], 40.0)
            self.assertAlmostEqual(rep["ratio_tok_per_s"], 40.0 / 256.0)
            self.assertAlmostEqual(rep["ppl_rel_diff"], (37553.223846 - 37552.9844) / 37552.9844)

    def test_disagree(self):
        with tempfile.TemporaryDirectory() as d:
            p, out = self.run_section(d, "37600.0")
            self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
            self.assertIn("OVER 0.1%", p.stdout)


def run_peers(fake, results, gguf_spec, out):
    """peers.py as scripts/bench runs it, with a stand-in binary; gguf_spec:
    one TYPE=FILE or a list of them"""
    import subprocess
    specs = [gguf_spec] if isinstance(gguf_spec, str) else gguf_spec
    ggufs = [x for spec in specs for x in ("--gguf", spec)]
    return subprocess.run([sys.executable, os.path.join(os.path.dirname(peers.__file__), "peers.py"),
                           "--llama-batched-bench", fake, "--results", results, *ggufs,
                           "--out", out], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


class SectionTest(unittest.TestCase):
    """peers.py end to end against a stand-in llama-batched-bench that
    prints SAMPLE and records its arguments."""

    def test_ratios(self):
        with tempfile.TemporaryDirectory() as d:
            fake = os.path.join(d, "llama-batched-bench")
            with open(fake, "w") as f:
                f.write("#!/bin/sh\necho \"$@\" >> %s/args\ncat <<'EOF'\n%sEOF\n" % (d, SAMPLE))
            os.chmod(fake, 0o755)
            gguf = os.path.join(d, "m.gguf")
            open(gguf, "wb").close()
            rows = [{"weights": w, "kv": kv, "batches": [
                {"batch": 1, "decode_tok_s": 2 * 102.89, "gen_tok_s": 1.0},
                {"batch": 64, "decode_tok_s": 594.92, "gen_tok_s": 64 * 128 / 21.570 / 2}]}
                for w in ("f32", "bf16", "int8") for kv in ("f32", "bf16")]
            # issue 20: the bf16 arithmetic mode's row, compared with the same BF16 GGUF
            rows.append({"weights": "bf16", "kv": "bf16", "matmul": "bf16", "batches": [
                {"batch": 1, "decode_tok_s": 102.89, "gen_tok_s": 1.0, "prefill_tok_s": 1.0},
                {"batch": 64, "decode_tok_s": 2 * 594.92, "gen_tok_s": 1.0, "prefill_tok_s": 3 * 1050.26}]})
            res = os.path.join(d, "results.json")
            with open(res, "w") as f:
                json.dump({"storage": {"prompt_len": 128, "output_len": 128, "threads": 2, "rows": rows}}, f)
            out = os.path.join(d, "peers.json")
            p = run_peers(fake, res, "bf16=" + gguf, out)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn("no --gguf q8_0=FILE given: skipped", p.stdout)
            with open(os.path.join(d, "args")) as f:
                args = f.read().split()
            for flag, val in (("-npp", "128"), ("-ntg", "128"), ("-npl", "1,64"), ("-t", "2"), ("-m", gguf)):
                self.assertEqual(args[args.index(flag) + 1], val)
            with open(out) as f:
                rep = json.load(f)
            self.assertEqual([r["gguf_type"] for r in rep["rows"]], ["bf16"])
            r = rep["rows"][0]["pagedgen"]["bf16"]
            self.assertAlmostEqual(r["ratio_b1_decode"], 2.0)
            self.assertAlmostEqual(r["ratio_decode"], 1.0)
            self.assertAlmostEqual(r["ratio_gen"], 0.5)
            m = rep["rows"][0]["pagedgen"]["bf16/bf16"]
            self.assertAlmostEqual(m["ratio_b1_decode"], 1.0)
            self.assertAlmostEqual(m["ratio_decode"], 2.0)
            self.assertAlmostEqual(m["ratio_prefill"], 3.0)  # S_PP t/s of the batch-64 row
            self.assertIn("pagedgen bf16 (bf16 kv) bf16 math", p.stdout)

    def test_one_type_fails(self):
        """a llama.cpp run that dies (SIGILL, as an AMX build did for Q8_0
        on a VM that refuses AMX state) is reported; the other types still
        print their figures, and the exit status says something failed."""
        with tempfile.TemporaryDirectory() as d:
            fake = os.path.join(d, "llama-batched-bench")
            with open(fake, "w") as f:
                f.write("#!/bin/sh\ncase \"$*\" in *q8*) echo illegal >&2; kill -ILL $$;; esac\n"
                        "cat <<'EOF'\n%sEOF\n" % SAMPLE)
            os.chmod(fake, 0o755)
            specs = []
            for t in ("bf16", "q8_0"):
                g = os.path.join(d, f"m-{t}.gguf")
                open(g, "wb").close()
                specs.append(f"{t}={g}")
            rows = [{"weights": w, "kv": "bf16", "batches": [
                {"batch": 1, "decode_tok_s": 102.89, "gen_tok_s": 1.0},
                {"batch": 64, "decode_tok_s": 594.92, "gen_tok_s": 1.0}]} for w in ("bf16", "int8")]
            res = os.path.join(d, "results.json")
            with open(res, "w") as f:
                json.dump({"storage": {"prompt_len": 128, "output_len": 128, "threads": 2, "rows": rows}}, f)
            out = os.path.join(d, "peers.json")
            p = run_peers(fake, res, specs, out)
            self.assertEqual(p.returncode, 1, p.stderr)
            self.assertIn("pagedgen bf16 (bf16 kv)", p.stdout)
            self.assertIn("int8 vs q8_0: llama.cpp failed:", p.stdout)
            with open(out) as f:
                rep = json.load(f)
            self.assertEqual([r["gguf_type"] for r in rep["rows"]], ["bf16", "q8_0"])
            self.assertAlmostEqual(rep["rows"][0]["pagedgen"]["bf16"]["ratio_decode"], 1.0)
            self.assertIn("failed", rep["rows"][1])

    def test_rounds_keep_best(self):
        """rounds from results.json: llama.cpp runs that many times per type
        and each figure keeps its best round (as pagedgen's do)."""
        with tempfile.TemporaryDirectory() as d:
            fast = SAMPLE.replace("|   102.89 |", "|   205.78 |")
            self.assertNotEqual(fast, SAMPLE)
            fake = os.path.join(d, "llama-batched-bench")
            with open(fake, "w") as f:  # the second call prints the faster table
                f.write("#!/bin/sh\necho x >> %s/calls\nif [ $(wc -l < %s/calls) -ge 2 ]; then\n"
                        "cat <<'EOF'\n%sEOF\nelse\ncat <<'EOF'\n%sEOF\nfi\n" % (d, d, fast, SAMPLE))
            os.chmod(fake, 0o755)
            gguf = os.path.join(d, "m.gguf")
            open(gguf, "wb").close()
            rows = [{"weights": "bf16", "kv": "bf16", "batches": [
                {"batch": 1, "decode_tok_s": 205.78, "gen_tok_s": 1.0},
                {"batch": 64, "decode_tok_s": 594.92, "gen_tok_s": 64 * 128 / 21.570}]}]
            res = os.path.join(d, "results.json")
            with open(res, "w") as f:
                json.dump({"storage": {"prompt_len": 128, "output_len": 128, "threads": 2, "rounds": 2,
                                       "rows": rows}}, f)
            out = os.path.join(d, "peers.json")
            p = run_peers(fake, res, "bf16=" + gguf, out)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn("best of 2 interleaved rounds", p.stdout)
            with open(os.path.join(d, "calls")) as f:
                self.assertEqual(len(f.read().split()), 2)
            with open(out) as f:
                rep = json.load(f)
            self.assertEqual(rep["rounds"], 2)
            r = rep["rows"][0]["pagedgen"]["bf16"]
            self.assertAlmostEqual(r["ratio_b1_decode"], 1.0)  # the faster round's 205.78
            self.assertAlmostEqual(r["ratio_gen"], 1.0)


def read_gguf(path):
    """Independent minimal reader: (version, metadata dict, tensor infos,
    data offset)."""
    with open(path, "rb") as f:
        buf = f.read()
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from("<" + fmt, buf, pos)
        pos += struct.calcsize("<" + fmt)
        return v if len(v) > 1 else v[0]

    def string():
        nonlocal pos
        n = take("Q")
        s = buf[pos:pos + n].decode()
        pos += n
        return s

    scalar = {4: "I", 5: "i", 6: "f", 7: "B"}

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            et, n = take("I"), take("Q")
            return [value(et) for _ in range(n)]
        return take(scalar[t])

    assert buf[:4] == b"GGUF"
    pos = 4
    version, n_t, n_kv = take("I"), take("Q"), take("Q")
    meta = {}
    for _ in range(n_kv):
        k = string()
        meta[k] = value(take("I"))
    infos = {}
    for _ in range(n_t):
        name = string()
        nd = take("I")
        dims = [take("Q") for _ in range(nd)]
        infos[name] = (dims, take("I"), take("Q"))
    align = meta.get("general.alignment", 32)
    return version, meta, infos, buf, (pos + align - 1) // align * align


@unittest.skipIf(np is None, "numpy missing")
class GGUFTest(unittest.TestCase):
    DIM, HEADS, KV_HEADS, FF, VOCAB, LAYERS = 64, 4, 2, 96, 300, 2

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        d = self.tmp.name
        rng = np.random.default_rng(1)
        hd = self.DIM // self.HEADS
        shapes = {"model.embed_tokens.weight": (self.VOCAB, self.DIM), "model.norm.weight": (self.DIM,),
                  "lm_head.weight": (self.VOCAB, self.DIM)}
        for i in range(self.LAYERS):
            p = f"model.layers.{i}."
            shapes.update({p + "input_layernorm.weight": (self.DIM,),
                           p + "post_attention_layernorm.weight": (self.DIM,),
                           p + "self_attn.q_proj.weight": (self.DIM, self.DIM),
                           p + "self_attn.k_proj.weight": (self.KV_HEADS * hd, self.DIM),
                           p + "self_attn.v_proj.weight": (self.KV_HEADS * hd, self.DIM),
                           p + "self_attn.o_proj.weight": (self.DIM, self.DIM),
                           p + "mlp.gate_proj.weight": (self.FF, self.DIM),
                           p + "mlp.up_proj.weight": (self.FF, self.DIM),
                           p + "mlp.down_proj.weight": (self.DIM, self.FF)})
        self.w = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
        header, off = {}, 0
        for n, a in self.w.items():
            header[n] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
            off += a.nbytes
        h = json.dumps(header).encode()
        with open(os.path.join(d, "model.safetensors"), "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h)
            for a in self.w.values():
                f.write(a.tobytes())
        cfg = {"model_type": "llama", "hidden_size": self.DIM, "intermediate_size": self.FF,
               "num_hidden_layers": self.LAYERS, "num_attention_heads": self.HEADS,
               "num_key_value_heads": self.KV_HEADS, "vocab_size": self.VOCAB,
               "max_position_embeddings": 128, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
               "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2}
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f)

    def tearDown(self):
        self.tmp.cleanup()

    def convert(self, wtype):
        out = os.path.join(self.tmp.name, f"m-{wtype}.gguf")
        hf_to_gguf.convert(self.tmp.name, out, wtype, None)
        return read_gguf(out)

    def tensor(self, infos, buf, data_off, name, nbytes):
        dims, gtype, off = infos[name]
        return dims, gtype, buf[data_off + off:data_off + off + nbytes]

    def test_f32_header_and_rope_order(self):
        version, meta, infos, buf, data_off = self.convert("f32")
        self.assertEqual(version, 3)
        self.assertEqual(meta["general.architecture"], "llama")
        self.assertEqual(meta["llama.block_count"], self.LAYERS)
        self.assertEqual(meta["llama.attention.head_count_kv"], self.KV_HEADS)
        self.assertEqual(len(meta["tokenizer.ggml.tokens"]), self.VOCAB)
        self.assertEqual(meta["tokenizer.ggml.tokens"][3], "<0x00>")
        self.assertEqual(meta["tokenizer.ggml.token_type"][1], 3)
        self.assertEqual(len(infos), 3 + 9 * self.LAYERS)
        for _, _, off in infos.values():
            self.assertEqual(off % 32, 0)
        dims, gtype, raw = self.tensor(infos, buf, data_off, "token_embd.weight", self.VOCAB * self.DIM * 4)
        self.assertEqual((dims, gtype), ([self.DIM, self.VOCAB], 0))
        np.testing.assert_array_equal(np.frombuffer(raw, "<f4").reshape(self.VOCAB, self.DIM),
                                      self.w["model.embed_tokens.weight"])
        # k: Meta row 2j + h of a head is HF row h * hd/2 + j (rotate-half)
        hd = self.DIM // self.HEADS
        n = self.KV_HEADS * hd
        _, _, raw = self.tensor(infos, buf, data_off, "blk.1.attn_k.weight", n * self.DIM * 4)
        meta_k = np.frombuffer(raw, "<f4").reshape(n, self.DIM)
        hf_k = self.w["model.layers.1.self_attn.k_proj.weight"]
        for head in range(self.KV_HEADS):
            for j in range(hd // 2):
                for half in range(2):
                    np.testing.assert_array_equal(meta_k[head * hd + 2 * j + half],
                                                  hf_k[head * hd + half * (hd // 2) + j])
        _, gtype, _ = self.tensor(infos, buf, data_off, "blk.0.attn_norm.weight", 0)
        self.assertEqual(gtype, 0)

    def test_bf16_and_q8_0(self):
        _, meta, infos, buf, data_off = self.convert("bf16")
        self.assertEqual(meta["general.file_type"], 32)
        n = self.FF * self.DIM
        _, gtype, raw = self.tensor(infos, buf, data_off, "blk.0.ffn_up.weight", n * 2)
        self.assertEqual(gtype, 30)
        back = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32).reshape(self.FF, self.DIM)
        ref = self.w["model.layers.0.mlp.up_proj.weight"]
        np.testing.assert_allclose(back, ref, rtol=2 ** -8)

        _, meta, infos, buf, data_off = self.convert("q8_0")
        self.assertEqual(meta["general.file_type"], 7)
        n_blocks = n // 32
        _, gtype, raw = self.tensor(infos, buf, data_off, "blk.0.ffn_up.weight", n_blocks * 34)
        self.assertEqual(gtype, 8)
        blocks = np.frombuffer(raw, dtype=[("d", "<f2"), ("qs", "i1", (32,))])
        deq = (blocks["d"].astype(np.float32)[:, None] * blocks["qs"]).reshape(self.FF, self.DIM)
        amax = np.abs(ref.reshape(-1, 32)).max(axis=1).reshape(self.FF, self.DIM // 32)
        tol = np.repeat(amax / 127 * 0.51 + amax * 2 ** -10, 32, axis=1)
        self.assertTrue(np.all(np.abs(deq - ref) <= tol))
        self.assertEqual(int(np.abs(blocks["qs"]).max()), 127)


@unittest.skipIf(np is None, "numpy missing")
class GGUFQwen3MoeTest(unittest.TestCase):
    """A tiny Qwen3-MoE (scripts/make-synthetic-qwen --preset tiny-qwen3-moe)
    in llama.cpp's qwen3moe layout: the expert keys, the experts stacked
    [E][...] (GGUF dims {H, Ie, E}), q/k rows as stored (NEOX rope), the q/k
    norms and the router."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        here = os.path.dirname(os.path.abspath(__file__))
        gen = os.path.join(here, "..", "scripts", "make-synthetic-qwen")
        import subprocess
        subprocess.run([sys.executable, gen, "--preset", "tiny-qwen3-moe", "--untied", cls.tmp.name], check=True)
        with open(os.path.join(cls.tmp.name, "config.json")) as f:
            cls.cfg = json.load(f)
        cls.w = hf_to_gguf.read_safetensors(os.path.join(cls.tmp.name, "model.safetensors"))

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def convert(self, wtype):
        out = os.path.join(self.tmp.name, f"m-{wtype}.gguf")
        hf_to_gguf.convert(self.tmp.name, out, wtype, None)
        return read_gguf(out)

    def test_layout_f32(self):
        c = self.cfg
        H, E, Ie, L = c["hidden_size"], c["num_experts"], c["moe_intermediate_size"], c["num_hidden_layers"]
        _, meta, infos, buf, data_off = self.convert("f32")
        self.assertEqual(meta["general.architecture"], "qwen3moe")
        self.assertEqual(meta["qwen3moe.expert_count"], E)
        self.assertEqual(meta["qwen3moe.expert_used_count"], c["num_experts_per_tok"])
        self.assertEqual(meta["qwen3moe.expert_feed_forward_length"], Ie)
        self.assertEqual(meta["qwen3moe.block_count"], L)
        self.assertEqual(meta["qwen3moe.attention.key_length"], c["head_dim"])
        # embd, output_norm, output + per layer 5 attention, 2 norms, ffn_norm, router, 3 expert stacks
        self.assertEqual(len(infos), 3 + 12 * L)
        self.assertNotIn("blk.0.ffn_gate.weight", infos)

        def read(name, shape):
            dims, gtype, off = infos[name]
            self.assertEqual((dims, gtype), (list(reversed(shape)), 0))
            n = int(np.prod(shape))
            return np.frombuffer(buf[data_off + off:data_off + off + 4 * n], "<f4").reshape(shape)

        p = f"model.layers.{L - 1}."
        b = f"blk.{L - 1}."
        gate = read(b + "ffn_gate_exps.weight", (E, Ie, H))
        down = read(b + "ffn_down_exps.weight", (E, H, Ie))
        for e in (0, E - 1):
            np.testing.assert_array_equal(gate[e], self.w[f"{p}mlp.experts.{e}.gate_proj.weight"])
            np.testing.assert_array_equal(down[e], self.w[f"{p}mlp.experts.{e}.down_proj.weight"])
        up = read(b + "ffn_up_exps.weight", (E, Ie, H))
        np.testing.assert_array_equal(up[3], self.w[f"{p}mlp.experts.3.up_proj.weight"])
        np.testing.assert_array_equal(read(b + "ffn_gate_inp.weight", (E, H)), self.w[p + "mlp.gate.weight"])
        q = self.w[p + "self_attn.q_proj.weight"]
        np.testing.assert_array_equal(read(b + "attn_q.weight", q.shape), q)  # NEOX: not permuted
        np.testing.assert_array_equal(read(b + "attn_k_norm.weight", (c["head_dim"],)),
                                      self.w[p + "self_attn.k_norm.weight"])

    def test_bf16_checkpoint_bits_kept(self):
        """A bf16 checkpoint written as bf16: each expert's stored bits, unchanged."""
        import subprocess
        here = os.path.dirname(os.path.abspath(__file__))
        d = os.path.join(self.tmp.name, "bf16")
        subprocess.run([sys.executable, os.path.join(here, "..", "scripts", "make-synthetic-qwen"), "--preset",
                        "tiny-qwen3-moe", "--dtype", "bf16", d], check=True)
        out = os.path.join(self.tmp.name, "b.gguf")
        hf_to_gguf.convert(d, out, "bf16", None)
        _, meta, infos, buf, data_off = read_gguf(out)
        c = self.cfg
        H, E, Ie = c["hidden_size"], c["num_experts"], c["moe_intermediate_size"]
        dims, gtype, off = infos["blk.1.ffn_up_exps.weight"]
        self.assertEqual((dims, gtype), ([H, Ie, E], 30))
        got = np.frombuffer(buf[data_off + off:data_off + off + 2 * E * Ie * H], "<u2").reshape(E, Ie, H)
        src = hf_to_gguf.read_safetensors(os.path.join(d, "model.safetensors"))
        for e in (0, 6):
            np.testing.assert_array_equal(got[e], src.bf16_bits(f"model.layers.1.mlp.experts.{e}.up_proj.weight")
                                          .reshape(Ie, H))

    def test_q8_0_stacks(self):
        c = self.cfg
        H, E, Ie = c["hidden_size"], c["num_experts"], c["moe_intermediate_size"]
        _, meta, infos, buf, data_off = self.convert("q8_0")
        dims, gtype, off = infos["blk.0.ffn_down_exps.weight"]
        self.assertEqual((dims, gtype), ([Ie, H, E], 8))
        raw = buf[data_off + off:data_off + off + E * H * Ie // 32 * 34]
        blocks = np.frombuffer(raw, dtype=[("d", "<f2"), ("qs", "i1", (32,))])
        deq = (blocks["d"].astype(np.float32)[:, None] * blocks["qs"]).reshape(E, H, Ie)
        ref = self.w["model.layers.0.mlp.experts.5.down_proj.weight"]
        amax = np.abs(ref).max()
        self.assertLessEqual(float(np.abs(deq[5] - ref).max()), amax / 127 * 0.51 + amax * 2 ** -10)


def spm_tokenize(text, tokens, scores):
    """llama.cpp's llama tokenizer (llm_tokenizer_spm, src/llama-vocab.cpp)
    over a GGUF vocabulary: " " -> "▁" with one prepended, then among
    adjacent symbols whose concatenation is a piece, merge the highest
    scoring (leftmost on ties) until none; unknown characters as bytes."""
    ids = {t: i for i, t in enumerate(tokens)}
    sym = list("▁" + text.replace(" ", "▁"))
    while True:
        best = None
        for k in range(len(sym) - 1):
            i = ids.get(sym[k] + sym[k + 1])
            if i is not None and (best is None or scores[i] > scores[ids[sym[best] + sym[best + 1]]]):
                best = k
        if best is None:
            break
        sym[best:best + 2] = [sym[best] + sym[best + 1]]
    out = []
    for t in sym:
        out += [ids[t]] if t in ids else [ids[f"<0x{b:02X}>"] for b in t.encode()]
    return out


def bpe_tokenize(text, vocab, merges):
    """Hugging Face's BPE (what pagedgen's tokenizer does for these files):
    merge the adjacent pair ranked first in the merges list, leftmost on
    ties; byte fallback for characters not in the vocabulary."""
    rank = {tuple(m.split(" ", 1) if isinstance(m, str) else m): r for r, m in enumerate(merges)}
    sym = list("▁" + text.replace(" ", "▁"))
    while True:
        cand = [(rank[(sym[k], sym[k + 1])], k) for k in range(len(sym) - 1) if (sym[k], sym[k + 1]) in rank]
        if not cand:
            break
        _, k = min(cand)
        sym[k:k + 2] = [sym[k] + sym[k + 1]]
    out = []
    for t in sym:
        out += [vocab[t]] if t in vocab else [vocab[f"<0x{b:02X}>"] for b in t.encode()]
    return out


@unittest.skipIf(np is None, "numpy missing")
class VocabScoresTest(unittest.TestCase):
    """The GGUF's token scores make llama.cpp tokenize text as pagedgen does
    (llama-perplexity compares values on the same ids): scores follow the
    BPE merge ranks, not the vocabulary ids."""

    def write_tokenizer(self, d, vocab, merges):
        path = os.path.join(d, "tokenizer.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"model": {"type": "BPE", "vocab": vocab, "merges": merges}}, f)
        return path

    def test_rank_not_id(self):
        """"▁▁" has the lower id but its merge ranks last (as in llama2):
        " c" is "▁" "▁c", not "▁▁" "c"."""
        tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["▁▁", "▁c", "▁", "c"]
        vocab = {t: i for i, t in enumerate(tokens)}
        merges = ["▁ c", "▁ ▁"]
        with tempfile.TemporaryDirectory() as d:
            toks, scores, types = hf_to_gguf.load_vocab(self.write_tokenizer(d, vocab, merges), len(tokens))
        self.assertEqual(toks, tokens)
        self.assertEqual((types[0], types[1], types[3], types[259]), (2, 3, 6, 1))
        self.assertGreater(scores[vocab["▁c"]], scores[vocab["▁▁"]])
        self.assertGreater(scores[vocab["▁▁"]], scores[vocab["c"]])  # no merge makes "c"
        for text in (" c", "c", "  c c", "cc x"):
            self.assertEqual(spm_tokenize(text, toks, scores), bpe_tokenize(text, vocab, merges), text)
        self.assertEqual(spm_tokenize(" c", toks, scores), [vocab["▁"], vocab["▁c"]])

    def test_minimal_vocabulary_said(self):
        import contextlib
        import io
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            toks, _, _ = hf_to_gguf.load_vocab("/nonexistent/tokenizer.json", 300)
        self.assertEqual((len(toks), toks[3], toks[299]), (300, "<0x00>", "tok299"))
        self.assertIn("minimal vocabulary", err.getvalue())

    def test_shared_tokenizers(self):
        """llama2's (the 110m synthetic model's) and stories260K's
        tokenizer.json: text with runs of spaces, code, newlines."""
        shared = os.environ.get("PAGEDGEN_SHARED", "")
        files = [os.path.join(shared, "tokenizers", "llama2", "tokenizer.json"),
                 os.path.join(shared, "models", "stories260K", "tokenizer.json")]
        if not all(os.path.isfile(f) for f in files):
            self.skipTest("no tokenizers under $PAGEDGEN_SHARED")
        texts = ["Once upon a time, there was a little girl named Lily.",
                 "    if (check(x)) {\n        return  the_value;   }\n\tdone",
                 "a  b   c    d     e      f", "   leading and trailing   "]
        for f in files:
            with open(f, encoding="utf-8") as fh:
                model = json.load(fh)["model"]
            toks, scores, _ = hf_to_gguf.load_vocab(f, len(model["vocab"]))
            for text in texts:
                self.assertEqual(spm_tokenize(text, toks, scores), bpe_tokenize(text, model["vocab"], model["merges"]),
                                 f"{f}: {text!r}")


if __name__ == "__main__":
    result = unittest.main(exit=False, verbosity=1).result
    if not result.wasSuccessful():
        sys.exit(1)
    sys.exit(77 if np is None and result.testsRun == len(result.skipped) else 0)
