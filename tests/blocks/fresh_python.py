"""Run code in a fresh Python interpreter from the project root, for kernel tests that need a
process of their own (settings read at import, a Triton limit patched before any kernel loads)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_python(code: str, env: dict[str, str | None] | None = None, timeout: int = 300) -> str:
    """``code`` run from the project root with this process's import path plus the root and
    ``benchmarks/``, and ``env`` applied (None removes a variable); its stdout. Fails the test on a
    non-zero exit, with the end of its stderr."""
    path = [str(ROOT), str(ROOT / "benchmarks"), *(p for p in sys.path if p)]
    full = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    for name, value in (env or {}).items():
        if value is None:
            full.pop(name, None)
        else:
            full[name] = value
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, cwd=ROOT,
                         timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout
