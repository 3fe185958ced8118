#!/usr/bin/env python3
"""emu_expect_error: runs a negative control and passes only when it fails
the way it must — a non-zero exit AND the given text in its output — so a
negative control cannot "pass" by crashing for an unrelated reason.

usage: emu_expect_error.py TEXT COMMAND [ARGS...]
"""
import subprocess
import sys


def main(argv):
    if len(argv) < 3:
        raise SystemExit(__doc__)
    text, cmd = argv[1], argv[2:]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = p.stdout.decode('utf-8', 'replace')
    tail = '\n'.join(out.splitlines()[-15:])
    if p.returncode == 0:
        print('negative control PASSED but must fail (expected "%s"):\n%s' % (text, tail))
        return 1
    if text not in out:
        print('negative control failed (status %d) without "%s":\n%s' % (p.returncode, text, tail))
        return 1
    print('negative control failed as required (status %d): %s' % (
        p.returncode, next(l for l in out.splitlines() if text in l)))
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
