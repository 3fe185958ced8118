"""numpy for the float64 reference tests (test_qwen.py, test_qwen_batch.py).

require(name): returns when numpy imports; else re-executes the calling
script under Debian's /usr/bin/python3 when that one has numpy (a pyenv or
venv python3 on PATH usually has none), else skips (exit 77) with a message,
or fails when CI=true (CI installs python3-numpy: scripts/setup).
"""
import os
import subprocess
import sys


def require(name):
    try:
        import numpy  # noqa: F401
        return
    except ImportError:
        pass
    if sys.executable != "/usr/bin/python3" and os.path.exists("/usr/bin/python3"):
        probe = subprocess.run(["/usr/bin/python3", "-c", "import numpy"], capture_output=True)
        if probe.returncode == 0:
            os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)
    msg = f"{name}: numpy is missing (apt-get install python3-numpy)"
    if os.environ.get("CI") == "true":
        sys.exit(msg)
    print("SKIP " + msg)
    sys.exit(77)
