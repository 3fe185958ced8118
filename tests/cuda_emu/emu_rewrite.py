#!/usr/bin/env python3
"""emu_rewrite: turns one .cu file of gpu/ into host C++ for the CUDA
emulator (tests/cuda_emu), run by meson at build time, so the emulated
kernels are compiled from the same source as the real ones.

Three rewrites, nothing else (line numbers are kept, and a #line directive
points compiler messages and sanitizer reports at the original file):
  kernel<<<grid, block[, smem[, stream]]>>>(args)
      -> emu_launch(kernel, "kernel", BOUND, emu_make_cfg(grid, block, ...), args)
     where BOUND is the kernel's __launch_bounds__ max-threads expression
     (found in the same file) or 0;
  __shared__ T name[dims];         -> EMU_SHARED_ARRAY(T, name, [dims]);
  extern __shared__ T name[];      -> T *name = static_cast<T *>(emu_dynamic_shared());
Any `__shared__` or `<<<` left over is an error (an unknown form must be
taught here, not silently miscompiled).

Negative controls: --drop-syncthreads N removes the N-th (1-based)
`__syncthreads();` of the file, so a test can check that the emulator
catches the resulting race.

usage: emu_rewrite.py INPUT.cu OUTPUT.cc [--drop-syncthreads N]
"""
import re
import sys


def match_back_angle(s, i):
    """s[i] == '>': index of its matching '<'."""
    depth = 0
    while i >= 0:
        if s[i] == '>':
            depth += 1
        elif s[i] == '<':
            depth -= 1
            if depth == 0:
                return i
        i -= 1
    raise SystemExit('emu_rewrite: unbalanced template brackets before <<<')


def match_paren(s, i):
    """s[i] == '(': index of its matching ')'."""
    depth = 0
    while i < len(s):
        if s[i] == '(':
            depth += 1
        elif s[i] == ')':
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise SystemExit('emu_rewrite: unbalanced parentheses after >>>')


def launch_bounds(src):
    """kernel name -> max-threads expression of its __launch_bounds__."""
    out = {}
    for m in re.finditer(r'__launch_bounds__\s*\(([^,()]+)(?:,[^()]*)?\)\s*(\w+)\s*\(', src):
        out[m.group(2)] = m.group(1).strip()
    return out


def rewrite_launches(src, bounds):
    out = []
    pos = 0
    while True:
        i = src.find('<<<', pos)
        if i < 0:
            out.append(src[pos:])
            return ''.join(out)
        # the kernel expression: identifier, optionally with <template args>
        j = i - 1
        while j >= 0 and src[j].isspace():
            j -= 1
        if src[j] == '>':
            j = match_back_angle(src, j) - 1
        end_name = j + 1
        while j >= 0 and (src[j].isalnum() or src[j] in '_:'):
            j -= 1
        start = j + 1
        kernel = src[start:i].strip()
        name = re.match(r'[\w:]+', kernel).group(0)
        k = src.find('>>>', i)
        if k < 0:
            raise SystemExit('emu_rewrite: <<< without >>>')
        config = src[i + 3:k]
        p = k + 3
        while src[p].isspace():
            p += 1
        if src[p] != '(':
            raise SystemExit('emu_rewrite: expected ( after >>> of ' + name)
        q = match_paren(src, p)
        args = src[p + 1:q]
        bound = '(unsigned)(%s)' % bounds[name] if name in bounds else '0u'
        call = 'emu_launch(&%s, "%s", %s, emu_make_cfg(%s)%s%s)' % (
            kernel, name, bound, config, ', ' if args.strip() else '', args)
        out.append(src[pos:start])
        out.append(call)
        del end_name
        pos = q + 1


def rewrite_shared(src):
    src = re.sub(r'extern\s+__shared__\s+(?:__align__\s*\(\s*\d+\s*\)\s+)?([\w:]+(?:\s*\*)*)\s+(\w+)\s*\[\s*\]\s*;',
                 lambda m: '%s *%s = static_cast<%s *>(emu_dynamic_shared());' % (m.group(1), m.group(2), m.group(1)),
                 src)
    src = re.sub(r'__shared__\s+(?:__align__\s*\(\s*\d+\s*\)\s+)?([\w:]+(?:\s*\*)*)\s+(\w+)\s*((?:\[[^\]]+\]\s*)*);',
                 lambda m: 'EMU_SHARED_ARRAY(%s, %s, %s);' % (m.group(1), m.group(2), m.group(3).strip()),
                 src)
    return src


def main(argv):
    if len(argv) not in (3, 5):
        raise SystemExit(__doc__)
    src = open(argv[1], encoding='utf-8').read()
    if len(argv) == 5:
        if argv[3] != '--drop-syncthreads':
            raise SystemExit(__doc__)
        n = int(argv[4])
        hits = [m.start() for m in re.finditer(r'__syncthreads\(\);', src)]
        if not 1 <= n <= len(hits):
            raise SystemExit('emu_rewrite: %s has %d __syncthreads, cannot drop number %d'
                             % (argv[1], len(hits), n))
        h = hits[n - 1]
        src = src[:h] + '/* EMU NEGATIVE CONTROL: barrier removed */' + src[h + len('__syncthreads();'):]
    src = rewrite_launches(src, launch_bounds(src))
    src = rewrite_shared(src)
    code = re.sub(r'//[^\n]*|/\*.*?\*/', '', src, flags=re.S)
    for bad in ('<<<', '__shared__'):
        if bad in code:
            line = code[:code.index(bad)].count('\n') + 1
            raise SystemExit('emu_rewrite: %s:%d: `%s` form not understood' % (argv[1], line, bad))
    with open(argv[2], 'w', encoding='utf-8') as f:
        f.write('#line 1 "%s"\n' % argv[1])
        f.write(src)


if __name__ == '__main__':
    main(sys.argv)
