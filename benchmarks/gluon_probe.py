"""What the GPU host's Triton offers for a hand-scheduled Hopper kernel (Gluon), before anyone
writes one: the next kernel form the remaining issue-6 targets point at (a walk whose tensor-core
dots run asynchronously, ``docs/benchmarks/history.md`` notes of 2026-12-02) needs
``triton.experimental.gluon`` with Hopper's ``warpgroup_mma`` / ``warpgroup_mma_wait``.

    python benchmarks/gluon_probe.py [--out DIR] [--compile-only ARCH]

Prints one line per check and writes ``gluon_probe.json``: the Triton version; which Gluon modules
and Hopper names import; whether a one-tile kernel (C = A B for A [64, K], B [K, N] in bf16, B
through shared memory, the product by ``warpgroup_mma`` issued asynchronously and waited on) compiles
for sm_90 and, on a GPU, matches ``torch``. ``--compile-only 90`` compiles without a GPU (the
project's CPU machine: Triton's bundled ptxas), which is what the CPU test runs. Exit status 1 when
the kernel does not compile or its result is wrong.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
import traceback
from pathlib import Path

import torch
import triton

import kernels_aot_regs as aot  # compiles and reads kernels without a GPU; needs Triton, as this probe does

M, K, N = 64, 64, 64  # one warpgroup-MMA tile: 4 warps x 16 rows


def _available() -> dict:
    """Which Gluon modules and Hopper names import (name -> True / the error's first line)."""
    found = {}
    for module, names in (("triton.experimental.gluon", ("jit",)),
                          ("triton.experimental.gluon.language", ("NVMMADistributedLayout", "NVMMASharedLayout",
                                                                  "BlockedLayout", "allocate_shared_memory",
                                                                  "warp_specialize")),
                          ("triton.experimental.gluon.language.nvidia.hopper",
                           ("warpgroup_mma", "warpgroup_mma_wait", "fence_async_shared", "tma", "mbarrier"))):
        try:
            mod = importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - the probe reports whatever stops the import
            found[module] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            continue
        found[module] = True
        for name in names:
            found[f"{module}.{name}"] = hasattr(mod, name)
    return found


def _kernel():
    """The one-tile kernel, defined only once Gluon imports."""
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

    @gluon.jit
    def tile_mma_kernel(a, b, c, M: gl.constexpr, K: gl.constexpr, N: gl.constexpr, num_warps: gl.constexpr):
        """``c[M, N] = a[M, K] @ b[K, N]`` (row-major bf16 in, float32 out), one program."""
        load_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
        mma_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                             instr_shape=[16, N, 16])
        rows_a = gl.arange(0, M, layout=gl.SliceLayout(1, load_layout))
        cols_a = gl.arange(0, K, layout=gl.SliceLayout(0, load_layout))
        rows_b = gl.arange(0, K, layout=gl.SliceLayout(1, load_layout))
        cols_b = gl.arange(0, N, layout=gl.SliceLayout(0, load_layout))
        a_tile = gl.load(a + rows_a[:, None] * K + cols_a[None, :])
        b_tile = gl.load(b + rows_b[:, None] * N + cols_b[None, :])
        a_smem = gl.allocate_shared_memory(gl.bfloat16, [M, K], gl.NVMMASharedLayout.get_default_for([M, K], gl.bfloat16),
                                           a_tile)
        b_smem = gl.allocate_shared_memory(gl.bfloat16, [K, N], gl.NVMMASharedLayout.get_default_for([K, N], gl.bfloat16),
                                           b_tile)
        fence_async_shared()
        acc = gl.zeros([M, N], dtype=gl.float32, layout=mma_layout)
        acc = warpgroup_mma(a_smem, b_smem, acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        out = gl.convert_layout(acc, load_layout)
        gl.store(c + rows_a[:, None] * N + cols_b[None, :], out)  # c's rows are a's, its columns b's

    return tile_mma_kernel


def compile_for(arch: int):
    """The kernel compiled for ``sm_<arch>`` without a GPU (``kernels_aot_regs.compile_one``, which
    takes Gluon kernels as well)."""
    return aot.compile_one(_kernel(), {"a": "*bf16", "b": "*bf16", "c": "*fp32"},
                           {"M": M, "K": K, "N": N, "num_warps": 4}, 4, 1, arch)


def run_on_gpu() -> float:
    """The kernel on the current GPU: max |C - A B| against torch (float32 product of the same bf16 inputs)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(M, K, device="cuda", generator=g).to(torch.bfloat16)
    b = torch.randn(K, N, device="cuda", generator=g).to(torch.bfloat16)
    c = torch.empty(M, N, device="cuda", dtype=torch.float32)
    _kernel()[(1,)](a, b, c, M, K, N, num_warps=4)
    torch.cuda.synchronize()
    return (c - a.float() @ b.float()).abs().max().item()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None, help="folder for gluon_probe.json")
    ap.add_argument("--compile-only", type=int, default=None, metavar="ARCH",
                    help="compile for sm_ARCH without running (e.g. 90 on a machine without a GPU)")
    a = ap.parse_args(argv)
    res = {"triton": triton.__version__, "available": _available()}
    for key, ok in res["available"].items():
        print(f"{key}: {ok}")
    ok = res["available"].get("triton.experimental.gluon.language.nvidia.hopper") is True
    if ok:
        arch = a.compile_only or (torch.cuda.get_device_capability()[0] * 10 if torch.cuda.is_available() else 90)
        try:
            k = compile_for(arch)
            ptx = k.asm["ptx"]
            res["compile"] = {"arch": arch, "wgmma": ptx.count("wgmma.mma_async"),
                              "wgmma_wait": ptx.count("wgmma.wait_group"), "registers": int(aot.resources(k)["REG"])}
            print(f"compile sm_{arch}: {res['compile']}")
        except Exception as exc:  # noqa: BLE001 - a failed compile is the probe's answer, with where it failed
            res["compile"] = {"arch": arch, "error": traceback.format_exception_only(type(exc), exc)[-1].strip()[:500]}
            print(f"compile sm_{arch}: {res['compile']['error']}")
            ok = False
        if ok and a.compile_only is None and torch.cuda.is_available():
            try:
                err = run_on_gpu()
                res["run"] = {"device": torch.cuda.get_device_name(), "max_abs_error": err}
                ok = err < 1e-2
            except Exception as exc:  # noqa: BLE001
                res["run"] = {"error": traceback.format_exception_only(type(exc), exc)[-1].strip()[:500]}
                ok = False
            print(f"run: {res['run']}")
    res["ok"] = ok
    print(f"gluon probe: {'ok' if ok else 'FAILED'} (Triton {triton.__version__})")
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "gluon_probe.json").write_text(json.dumps(res, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
