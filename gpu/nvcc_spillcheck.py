#!/usr/bin/env python3
"""Runs one nvcc compile with -Xptxas -v, writes ptxas' resource usage as a
table (kernel, arch, registers, stack, spill stores/loads) and fails the
build when a kernel spills registers to local memory.

Why at build time: no cuobjdump ships with the toolkit on the build
machines, and ptxas already prints everything while compiling; a spill in a
hot kernel is a performance bug that should stop the build, like a warning
under -Werror. A kernel whose spill is accepted is listed in ALLOWED_SPILLS
with the reason (none today).

Usage: nvcc_spillcheck.py REPORT -- NVCC ARGS...
ptxas' raw lines are not echoed on success (the report holds them, sorted);
nvcc's other output (warnings, errors) is passed through.
"""
import os
import re
import subprocess
import sys

# mangled-name substring -> why a spill there is acceptable
ALLOWED_SPILLS = {}

ENTRY = re.compile(r"ptxas info\s*: Compiling entry function '([^']+)' for '(\w+)'")
PROPS = re.compile(r"ptxas info\s*: Function properties for (\S+)")
SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
REGS = re.compile(r"ptxas info\s*: Used (\d+) registers")


def demangle(names):
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True,
                             text=True, check=True).stdout.splitlines()
        if len(out) == len(names):
            return dict(zip(names, out))
    except (OSError, subprocess.CalledProcessError):
        pass
    return {n: n for n in names}


def main(argv):
    if len(argv) < 4 or argv[2] != "--":
        sys.stderr.write("usage: nvcc_spillcheck.py REPORT -- NVCC ARGS...\n")
        return 2
    report_path, cmd = argv[1], argv[3:]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    text = proc.stdout + proc.stderr
    other = []
    rows = {}  # (kernel, arch) -> [regs, stack, st, ld]
    cur = None
    props_for = None
    for line in text.splitlines():
        m = ENTRY.search(line)
        if m:
            cur = (m.group(1), m.group(2))
            rows.setdefault(cur, [0, 0, 0, 0])
            continue
        m = PROPS.search(line)
        if m:
            props_for = m.group(1)
            continue
        m = SPILL.search(line)
        if m:
            if cur and props_for == cur[0]:
                rows[cur][1:4] = [int(m.group(1)), int(m.group(2)), int(m.group(3))]
            continue
        m = REGS.search(line)
        if m:
            if cur:
                rows[cur][0] = int(m.group(1))
            continue
        if line.startswith("ptxas info") or not line.strip():
            continue
        other.append(line)
    if other:
        sys.stderr.write("\n".join(other) + "\n")
    if proc.returncode != 0:
        return proc.returncode
    names = demangle(sorted({k for k, _ in rows}))
    bad = []
    lines = ["# kernel | arch | registers | stack bytes | spill stores | spill loads"]
    for (k, arch), (regs, stack, st, ld) in sorted(rows.items(), key=lambda kv: (names[kv[0][0]], kv[0][1])):
        lines.append(f"{names[k]} | {arch} | {regs} | {stack} | {st} | {ld}")
        if (st or ld) and not any(a in k for a in ALLOWED_SPILLS):
            bad.append(f"{names[k]} ({arch}): {st} bytes spill stores, {ld} bytes spill loads")
    with open(report_path, "w") as f:
        f.write("\n".join(lines) + "\n")
    if bad:
        # remove the object so that the next build runs (and fails) again
        if "-o" in cmd and cmd.index("-o") + 1 < len(cmd):
            try:
                os.remove(cmd[cmd.index("-o") + 1])
            except OSError:
                pass
        sys.stderr.write("nvcc_spillcheck: register spills (see gpu/nvcc_spillcheck.py):\n  "
                         + "\n  ".join(bad) + "\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
