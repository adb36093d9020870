"""How fast a decode step's reads can go on this GPU, at the sizes a decode step reads them.

The decode target's roofline (``gpu_kernels.py``'s model section) divides the bytes a step moves by
the copy bandwidth of one 2 GiB copy. A 24-layer, d_model 2048 step reads its weights as 96
separate GEMMs of 8-45 MB and its linear states as 24 reads + writes of 16.8 MB, and no kernel of
that size runs at the big copy's rate: it ramps up, drains, and each kernel waits for the one
before. This script measures what each size can reach, with nothing but the read (or copy)
itself, so that the decode graphs' distance from the roofline splits into what the sizes cost and
what the kernels cost. Per size, 24 distinct buffers (one per layer: far beyond the 50 MB L2) in one
CUDA graph, us per call and bytes per second:

* ``copy``: a Triton streaming copy of float32 (the mixer reads its state and writes it back), the
  fastest of the same grid, 2 x bytes moved;
* ``read``: a Triton streaming reduction, the fastest of a small grid of programs per SM, block and
  pipelining stages (each program sums its own contiguous share, one float per program out): the
  most a read of that size reaches here;
* ``skinny``: the decode layer's own kernel on a weight of that shape (``blocks.kernels.skinny``:
  ``linear`` for in_proj, ``swiglu`` for w1|w3, ``residual_linear`` for o_proj and w2, batch 16,
  the launch settings the model runs with, programmatic dependent launch included).

    python benchmarks/read_ceiling.py [--out DIR] [--quick]

Prints a table and writes ``read_ceiling.{json,md}``. Needs a CUDA GPU.
"""
from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project root, for blocks

from triton_check import require_triton  # noqa: E402

require_triton("read_ceiling")

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from decode_gemm import LAYERS, decode_shapes, time_layers  # noqa: E402
from gpu_common import write_report  # noqa: E402

BATCH = 16
# the GEMMs of a layer, smallest first (``decode_gemm.CASES``' names; shapes from ``decode_shapes``,
# the skinny call for each as ``skinny_configs.role_inputs`` makes it for its role)
WEIGHTS = ("o_proj", "w2", "in_proj", "w13")
STATE_BYTES = BATCH * 16 * 128 * 128 * 4  # one layer's float32 linear states (16 heads of 128 x 128)
BIG = 1 << 30  # bytes of the reference read / copy (the roofline's copy moves 2 GiB each way)
READ_GRID = {"full": dict(per_sm=(1, 2, 4, 8), block=(4096, 8192, 16384), stages=(2, 4), warps=(4, 8)),
             "quick": dict(per_sm=(2, 4), block=(8192,), stages=(3,), warps=(4, 8))}


@triton.jit
def _read_kernel(x, out, n, per_program, BLOCK: tl.constexpr, STAGES: tl.constexpr):
    """Sum ``x[i * per_program : (i + 1) * per_program]`` (float32) into ``out[i]``, program ``i``:
    a streaming read, each program's share contiguous (``per_program`` a multiple of ``BLOCK``)."""
    i = tl.program_id(0)
    start = i.to(tl.int64) * per_program
    end = tl.minimum(start + per_program, n)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for k in tl.range(start, end, BLOCK, num_stages=STAGES):
        o = k + tl.arange(0, BLOCK)
        acc += tl.load(x + o, mask=o < end, other=0.).to(tl.float32)
    tl.store(out + i, tl.sum(acc, 0))


@triton.jit
def _copy_kernel(x, y, n, per_program, BLOCK: tl.constexpr, STAGES: tl.constexpr):
    """``y[i * per_program : (i + 1) * per_program] = x[...]``, program ``i``: a streaming copy
    (what the decode mixer does to its state: read it and write it back), shares contiguous."""
    start = tl.program_id(0).to(tl.int64) * per_program
    end = tl.minimum(start + per_program, n)
    for k in tl.range(start, end, BLOCK, num_stages=STAGES):
        o = k + tl.arange(0, BLOCK)
        tl.store(y + o, tl.load(x + o, mask=o < end), mask=o < end)


def per_layer(make, nbytes: int) -> list:
    """One buffer per layer from ``make()`` (two for reads far beyond L2: the 1 GiB reference)."""
    return [make() for _ in range(LAYERS if nbytes < (256 << 20) else 2)]


def read_sum(x: torch.Tensor, programs: int, block: int, stages: int, warps: int,
             out: torch.Tensor | None = None) -> torch.Tensor:
    """``_read_kernel`` over flat ``x`` in about ``programs`` contiguous shares: their float32
    sums ``[programs']`` (``out`` reused when given: its size is ``read_programs``)."""
    n = x.numel()
    per_program, count = read_programs(n, programs, block)
    out = torch.empty(count, device=x.device, dtype=torch.float32) if out is None else out
    _read_kernel[(count,)](x, out, n, per_program, BLOCK=block, STAGES=stages, num_warps=warps)
    return out


def read_programs(n: int, programs: int, block: int) -> tuple[int, int]:
    """``(elements per program, programs)``: ``n`` cut into whole blocks over about ``programs``."""
    per_program = triton.cdiv(triton.cdiv(n, programs), block) * block
    return per_program, triton.cdiv(n, per_program)


def copy_into(x: torch.Tensor, y: torch.Tensor, programs: int, block: int, stages: int, warps: int) -> None:
    """``_copy_kernel`` of flat ``x`` into ``y`` over about ``programs`` contiguous shares."""
    per_program, count = read_programs(x.numel(), programs, block)
    _copy_kernel[(count,)](x, y, x.numel(), per_program, BLOCK=block, STAGES=stages, num_warps=warps)


def fastest(nbytes: int, grid: dict, sms: int, copy: bool) -> dict:
    """The fastest streaming read (``copy``: copy) of ``nbytes`` over ``grid``'s configurations,
    ``{"s": seconds per call, "config": ...}``; each configuration checked once first."""
    dtype = torch.float32 if copy else torch.bfloat16  # the state is float32, the weights bf16
    n = nbytes // dtype.itemsize
    bufs = per_layer(lambda: torch.randn(n, device="cuda", dtype=dtype), nbytes)
    dst = torch.empty_like(bufs[0]) if copy else None
    best = None
    for per_sm, block, stages, warps in itertools.product(grid["per_sm"], grid["block"], grid["stages"], grid["warps"]):
        cfg = dict(programs=per_sm * sms, block=block, stages=stages, warps=warps)
        if copy:
            dst.zero_()
            copy_into(bufs[0], dst, **cfg)
            ok = torch.equal(dst, bufs[0])
            call = lambda x: copy_into(x, dst, **cfg)  # noqa: E731
        else:
            out = torch.empty(read_programs(n, cfg["programs"], block)[1], device="cuda", dtype=torch.float32)
            ok = torch.allclose(read_sum(bufs[0], **cfg, out=out).sum(), bufs[0].float().sum(), rtol=1e-3, atol=1.0)
            call = lambda x: read_sum(x, **cfg, out=out)  # noqa: E731
        if not ok:
            raise SystemExit(f"read_ceiling: the {'copy' if copy else 'read'} kernel is wrong at {per_sm}/SM, block {block}")
        t = time_layers(call, bufs)
        if best is None or t < best["s"]:
            best = {"s": t, "config": f"{per_sm}/SM, block {block}, {stages} stages, {warps} warps"}
    return best


def skinny_case(name: str, layers: int = LAYERS) -> tuple[list[dict], callable]:
    """``(sets, call)``: ``layers`` input sets of GEMM ``name`` (``WEIGHTS``; each with its bf16
    weight ``"w"``) and the decode layer's skinny kernel on one of them at batch 16, as the layer
    calls it (``call(set)``; ``skinny_configs.role_inputs``: in_proj and the SwiGLU pair read
    ``NormedRows``, o_proj and w2 add the residual)."""
    from skinny_configs import ROLES, role_inputs

    role = {case: r for r, case in ROLES.items()}.get(name)
    if name not in WEIGHTS or role is None:
        raise SystemExit(f"read_ceiling: no GEMM {name!r}; one of {', '.join(WEIGHTS)}")
    sets, call, _ = role_inputs(role, BATCH, layers)
    return sets, call


def time_skinny(name: str) -> float:
    sets, fn = skinny_case(name)
    fn(sets[0])  # its split-K tickets are allocated outside the graph
    torch.cuda.synchronize()
    return time_layers(fn, sets)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="", help="folder for read_ceiling.{json,md}")
    ap.add_argument("--quick", action="store_true", help="a 4-configuration read grid instead of 48")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("read_ceiling: needs a CUDA GPU")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    grid = READ_GRID["quick" if args.quick else "full"]
    from gpu_kernels import ceilings

    # the roofline's own figure: a 2 GiB copy_ outside a graph (captured, a device-to-device copy is a
    # memcpy node, which ran at 2.7 TB/s on the H200 against 4.2 as a kernel)
    copy_bw = ceilings()["copy_bytes_per_s"]
    rows = []
    shapes = decode_shapes()
    sizes = [(name, shapes[name][0] * shapes[name][1] * 2) for name in WEIGHTS] + [("state", STATE_BYTES), ("1 GiB", BIG)]
    for name, nbytes in sizes:
        row = {"size": name, "MB": nbytes / 1e6}
        read = fastest(nbytes, grid, sms, copy=False)
        row.update(read_us=read["s"] * 1e6, read_TBps=nbytes / read["s"] / 1e12, read_config=read["config"])
        copy = fastest(nbytes, grid, sms, copy=True)
        row.update(copy_us=copy["s"] * 1e6, copy_TBps=2 * nbytes / copy["s"] / 1e12, copy_config=copy["config"])
        if name in WEIGHTS:
            t = time_skinny(name)
            row.update(skinny_us=t * 1e6, skinny_TBps=nbytes / t / 1e12)
        row["roofline_us"] = nbytes / copy_bw * 1e6 * (2 if name == "state" else 1)
        rows.append(row)
        print(row, flush=True)
    body = [f"Copy bandwidth of one 2 GiB copy, timed as the decode roofline's: {copy_bw / 1e12:.2f} TB/s. "
            f"Per size: {LAYERS} distinct buffers in one CUDA graph (2 for 1 GiB), us per call (TB/s); "
            f"`read`: the fastest streaming read of bf16 over the grid ({'quick' if args.quick else 'full'}), "
            "`copy`: the fastest streaming copy of float32 (2 x bytes; the state's traffic), `skinny`: the "
            "decode layer's kernel on a weight of that shape at batch 16; `roofline`: the bytes the decode "
            "roofline counts for it (state: read + write) over the 2 GiB copy's bandwidth.", "",
            "| size | MB | read us (TB/s) | copy us (TB/s) | skinny us (TB/s) | roofline us | fastest read; copy |",
            "|---|---|---|---|---|---|---|"]
    for r in rows:
        sk = f"{r['skinny_us']:.2f} ({r['skinny_TBps']:.2f})" if "skinny_us" in r else "-"
        body.append(f"| {r['size']} | {r['MB']:.1f} | {r['read_us']:.2f} ({r['read_TBps']:.2f}) | "
                    f"{r['copy_us']:.2f} ({r['copy_TBps']:.2f}) | {sk} | {r['roofline_us']:.2f} | {r['read_config']}; "
                    f"{r['copy_config']} |")
    layer = {k: sum(r[k] for r in rows if r["size"] in WEIGHTS) for k in ("read_us", "skinny_us", "roofline_us")}
    state = next(r for r in rows if r["size"] == "state")
    body += ["", f"One layer's four weights: read alone {layer['read_us']:.1f} us, the skinny kernels "
             f"{layer['skinny_us']:.1f} us, roofline {layer['roofline_us']:.1f} us; its state (read + write) "
             f"copied {state['copy_us']:.1f} us against {state['roofline_us']:.1f} roofline. x {LAYERS} layers: "
             f"{LAYERS * (layer['read_us'] + state['copy_us']) / 1e3:.3f} ms at the sizes' own ceilings against "
             f"{LAYERS * (layer['roofline_us'] + state['roofline_us']) / 1e3:.3f} ms of roofline "
             f"({(layer['read_us'] + state['copy_us']) / (layer['roofline_us'] + state['roofline_us']):.2f}x)."]
    write_report("read_ceiling", "Read ceilings at decode sizes", "\n".join(body),
                 [{"copy_bytes_per_s": copy_bw}] + rows, args.out, argv)


if __name__ == "__main__":
    main()
