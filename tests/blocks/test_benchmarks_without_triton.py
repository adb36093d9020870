"""The benchmark scripts that compile Triton kernels, run where Triton is not importable (this
machine's plain environment): one line on stderr naming what is missing, exit status 2, no
traceback. CPU only; skipped where Triton is importable (the kernel tests' environment)."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is not None,
                                reason="Triton is importable here")


@pytest.mark.parametrize("script", ["gpu_kernels", "walk_forms", "decode_gemm", "kernels_aot_regs"])
def test_a_script_without_triton_says_so_in_one_line(script, tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / f"{script}.py"), "--out", str(tmp_path)],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [out.stderr.strip()]
    assert out.stderr.startswith(f"{script}: needs Triton") and "Traceback" not in out.stderr
