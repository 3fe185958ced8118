"""The harness the stdlib e2e scripts share (first: test_matmul_modes.py):
one case per process, `script.py PAGEDGEN CASE`, meson's exit codes.

Fail, check(cond, msg): a case fails by raising Fail.
main(cases, model_dir): runs cases["case_" + argv[2]] with the binary
argv[1] (returned by exe()); exit 0 ok, 1 failed,
77 skipped when model_dir is missing (1 in CI, where the data must be).
"""
import os
import sys

_EXE = [None]


class Fail(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Fail(msg)


def exe():
    return _EXE[0]


def main(cases, model_dir):
    _EXE[0] = os.path.abspath(sys.argv[1])
    case = sys.argv[2]
    if not os.path.isdir(model_dir):
        if os.environ.get("CI") == "true":
            print(f"no test data at {model_dir} in CI")
            return 1
        print(f"skip: no test data at {model_dir} (set PAGEDGEN_SHARED)")
        return 77
    fn = cases.get("case_" + case)
    if fn is None:
        print(f"unknown case {case!r}")
        return 2
    try:
        fn()
    except Fail as e:
        print(f"FAIL [{case}]: {e}")
        return 1
    print(f"ok [{case}]")
    return 0
