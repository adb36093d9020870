"""The benchmark scripts that compile Triton kernels call ``require_triton`` before importing it:
without Triton (a CPU machine's plain environment) they stop with one line on stderr and exit
status 2, as they do without a CUDA device, instead of an ImportError traceback."""
from __future__ import annotations

import importlib.util
import sys


def require_triton(prog: str) -> None:
    """Return if ``triton`` can be imported; else print why and how to get it, and exit with 2."""
    if importlib.util.find_spec("triton") is None:
        print(f"{prog}: needs Triton (it comes with torch on CUDA machines; on a CPU machine `make "
              ".triton-cpu/.installed`, then PYTHONPATH=.triton-cpu)", file=sys.stderr)
        raise SystemExit(2)
