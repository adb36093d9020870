"""Every Triton kernel compiles for sm_90 with the GPU host's Triton, ahead of time and without a GPU.

The interpreter tests run the newest Triton; the project's H200 host runs an older one (3.6), and the two
do not accept the same source: on 2026-12-02 a jit helper called without its defaulted constexpr
argument compiled with 3.9 and failed every kernel that used it on the host, found only by a GPU call.
``make test-kernels`` installs the host's version into ``.triton-host/`` and sets
``ARCHSEARCH_HOST_TRITON`` to that folder; without it this test skips.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HOST_TRITON = os.environ.get("ARCHSEARCH_HOST_TRITON")
MIN_TRITON = os.environ.get("ARCHSEARCH_MIN_TRITON")


def _host_triton_env(folder: str | None = None) -> dict:
    """This environment with the host's Triton (or the one in ``folder``) first on the path, compiled
    rather than interpreted."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(Path(folder or HOST_TRITON).resolve())
    return env


def _every_kernel_compiles(folder: str) -> str:
    """``benchmarks/kernels_aot_regs.py`` (every chunk, walk, decode and skinny kernel as the host code
    launches it, bf16 and float32, sm_90) under the Triton in ``folder``: no kernel fails to compile, and the
    Triton it ran is that one (not another on the path); returns its version."""
    env = _host_triton_env(folder)
    where = subprocess.run([sys.executable, "-c", "import triton; print(triton.__file__, triton.__version__)"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert where.returncode == 0 and where.stdout.startswith(str(Path(folder).resolve())), where.stdout + where.stderr
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "kernels_aot_regs.py"), "--dtype", "both"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    failed = [line for line in run.stdout.splitlines() if "FAILED" in line]
    compiled = [line for line in run.stdout.splitlines() if line.startswith("| ") and " | bf16 | " in line]
    assert run.returncode == 0 and not failed and compiled, (
        f"Triton {where.stdout.split()[-1]}:\n" + "\n".join(failed) + run.stderr[-3000:])
    return where.stdout.split()[-1]


@pytest.mark.skipif(not HOST_TRITON, reason="ARCHSEARCH_HOST_TRITON unset: a folder holding the GPU host's Triton "
                                            "(make test-kernels installs it into .triton-host/)")
def test_every_kernel_compiles_with_the_gpu_hosts_triton():
    """Every kernel under the GPU host's Triton (3.6): the decode kernels with their grid dependency control."""
    _every_kernel_compiles(HOST_TRITON)


@pytest.mark.skipif(not MIN_TRITON, reason="ARCHSEARCH_MIN_TRITON unset: a folder holding the oldest Triton the "
                                           "kernels are offered with (make test-kernels installs it into .triton-min/)")
def test_every_kernel_compiles_with_the_oldest_triton_offered():
    """Every kernel under ``blocks.kernels.MIN_TRITON``'s Triton (3.3.1, torch 2.7's), which has no grid
    dependency control: the decode kernels compile with ``tiles``' stand-ins and PDL off, as they launch there
    (before the stand-ins, Triton 3.3 stopped at the missing ``tl.extra.cuda.gdc_launch_dependents`` and 3.4.0 at
    its own ``gdc_wait``: every decode layer's first step on a GPU raised)."""
    from blocks.kernels import MIN_TRITON as oldest

    version = _every_kernel_compiles(MIN_TRITON)
    assert tuple(int(p) for p in version.split(".")[:2]) == oldest, version


@pytest.mark.skipif(not HOST_TRITON, reason="ARCHSEARCH_HOST_TRITON unset (see above)")
def test_one_more_program_compiles_each_kernel_at_the_cap_that_fits_another():
    """``kernels_aot_regs.py --one-more-program`` on the delta rules' forward kernels: one row per kernel its
    registers limit, each at a cap (a multiple of 8, below its registers) that fits one more program per SM,
    or a one-line ptxas reason where it cannot compile at that cap (no traceback). Which cap: the launch
    tests' ``cap_for_programs`` test (this process has no Triton to import the tool with)."""
    env = _host_triton_env()
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "kernels_aot_regs.py"), "--dtype", "bf16",
                          "--kernels", "delta.kkt,delta.fwd_o,delta.wu", "--one-more-program"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr[-3000:]
    rows = [[c.strip() for c in line.strip("| ").split("|")] for line in run.stdout.splitlines()
            if line.startswith("| ") and " | bf16 | " in line]
    assert rows, run.stdout
    for name, _, _, _, regs_programs, cap, at_cap, programs_at_cap, _ in rows:
        regs, programs = map(int, regs_programs.split(" / "))
        assert int(cap) % 8 == 0 and int(cap) < regs, name
        if at_cap.startswith("does not compile"):
            assert "ptxas" in at_cap, name
        else:
            assert int(programs_at_cap) == programs + 1 and int(at_cap.split(" / ")[0]) <= int(cap), name


_PROBE = '''
import sys
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

@triton.jit
def add_one(x, y, n, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y + o, tl.load(x + o, mask=o < n) + 1, mask=o < n)

src = ASTSource(add_one, {"x": "*fp32", "y": "*fp32", "n": "i32", "BLOCK": "constexpr"}, constexprs={(3,): 128})
print(len(triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm["cubin"]))
'''


@pytest.mark.skipif(not HOST_TRITON, reason="ARCHSEARCH_HOST_TRITON unset (see above)")
def test_triton_cache_carries_compiled_kernels_to_a_fresh_folder(tmp_path):
    """``benchmarks/triton_cache.py``: a kernel compiled (sm_90, the host's Triton) into one cache folder, packed
    (binaries and metadata only: no PTX or IR in the archive) and unpacked into another folder, is found there:
    compiling it again writes nothing new, where an empty folder gets the PTX and IRs of a real compile."""
    env = _host_triton_env()
    probe = tmp_path / "probe.py"
    probe.write_text(_PROBE)
    tool = [sys.executable, str(ROOT / "benchmarks" / "triton_cache.py")]

    def compile_into(cache: Path) -> str:
        run = subprocess.run([sys.executable, str(probe)], cwd=tmp_path, capture_output=True, text=True,
                             timeout=300, env={**env, "TRITON_CACHE_DIR": str(cache)})
        assert run.returncode == 0, run.stderr[-3000:]
        return run.stdout

    def files(cache: Path) -> set[str]:
        return {str(p.relative_to(cache)) for p in cache.rglob("*") if p.is_file()}

    made, carried, empty = tmp_path / "made", tmp_path / "carried", tmp_path / "empty"
    cubin_bytes = compile_into(made)
    archive = tmp_path / "out" / "triton_cache.tgz"
    run = subprocess.run([*tool, "pack", str(archive), "--cache", str(made)], capture_output=True, text=True, env=env)
    assert run.returncode == 0 and "1 kernels" in run.stdout, run.stdout + run.stderr
    run = subprocess.run([*tool, "unpack", str(archive), "--cache", str(carried)], capture_output=True, text=True, env=env)
    assert run.returncode == 0 and "1 kernels" in run.stdout, run.stdout + run.stderr
    before = files(carried)
    assert any(f.endswith(".cubin") for f in before) and not any(f.endswith((".ptx", ".ttir", ".llir")) for f in before)
    assert compile_into(carried) == cubin_bytes and files(carried) == before
    compile_into(empty)
    assert any(f.endswith(".ptx") for f in files(empty))
    run = subprocess.run([*tool, "unpack", str(tmp_path / "missing.tgz"), "--cache", str(carried)],
                         capture_output=True, text=True, env=env)
    assert run.returncode == 1 and run.stderr.strip() == f"triton_cache: no archive {tmp_path / 'missing.tgz'}"
