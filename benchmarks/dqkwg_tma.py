"""The delta rules' ``bwd_dqkwg`` alone: the Triton kernel (``delta._bwd_dqkwg_kernel``) against its
hand-scheduled Hopper form (``delta_gluon``, ``delta.DQKWG_TMA``) at several tiles per program, on the
benchmark's problem (64k tokens, 16 heads of 128, bf16), timed round robin with the kernels queued
back to back. Prints a table (ms per call, the DRAM floor of the bytes each moves at the measured copy
bandwidth, the ratio to the Triton kernel) and writes ``dqkwg_tma.{md,json}``.

    python benchmarks/dqkwg_tma.py [--lengths 2048,32768] [--tiles 4,8,16,32] [--rounds 5] [--out DIR]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project root, for blocks

import torch  # noqa: E402

from gpu_common import TOKENS, copy_bandwidth, cuda_time, write_report  # noqa: E402

H, K, V = 16, 128, 128


def inputs(T: int, gated: bool) -> dict:
    """``bwd_dqkwg``'s inputs and outputs for ``TOKENS // T`` sequences of ``T`` (random, bf16; the gate's
    chunk-local cumsum of mild decays)."""
    B, NT = TOKENS // T, T // 64
    g = torch.Generator(device="cuda").manual_seed(T)
    rnd = lambda *s: (torch.randn(*s, device="cuda", generator=g) * 0.5).bfloat16()  # noqa: E731
    x = {n: rnd(B, T, H, K) for n in ("q", "k", "vn", "do", "dv2")}
    x["h"], x["dh"] = rnd(B, NT, H, K, V), rnd(B, NT, H, K, V)
    x["gc"] = None
    if gated:
        decay = torch.nn.functional.logsigmoid(torch.randn(B, NT, 64, H, device="cuda", generator=g) + 3) / 4
        x["gc"] = decay.cumsum(2).view(B, T, H).contiguous()
    x.update({n: torch.empty(B, T, H, K, device="cuda", dtype=torch.bfloat16) for n in ("dq", "dk", "dw")})
    x["dG"] = torch.empty(K // 64, B, T, H, device="cuda") if gated else None
    return x


def dram_bytes(T: int, gated: bool) -> int:
    """Bytes the kernel must move once: q, k, vn, do, dv2, h, dh read, dq, dk, dw written (+ gate)."""
    B, NT = TOKENS // T, T // 64
    act = B * T * H * K * 2
    return 8 * act + 2 * B * NT * H * K * V * 2 + (B * T * H * 4 * 3 if gated else 0)


def launch(x: dict, form: str, tiles: int):
    from blocks.kernels import delta, delta_gluon

    B, T = x["q"].shape[:2]
    NT, use_g = T // 64, x["gc"] is not None
    if form == "triton":
        return lambda: delta._bwd_dqkwg_kernel[(K // 64, NT, B * H)](
            x["q"], x["k"], x["vn"], x["gc"], x["h"], x["do"], x["dh"], x["dv2"], x["dq"], x["dk"], x["dw"], x["dG"],
            K ** -0.5, T, NT, B, 0, H=H, K=K, V=V, BT=64, BK=64, BV=delta.DQKWG_BV, USE_G=use_g,
            DOT_PREC=delta._prec(x["q"]), PAIR_FACTORED=True, DG_FROM_ROWS=True, **delta._dqkwg_launch(use_g, x["q"]))
    return lambda: delta_gluon.bwd_dqkwg(x["q"], x["k"], x["vn"], x["gc"], x["h"], x["do"], x["dh"], x["dv2"],
                                         x["dq"], x["dk"], x["dw"], x["dG"], K ** -0.5, 0, NT, tiles,
                                         float(delta.PAIR_SPAN_MAX.value))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="2048,32768")
    ap.add_argument("--tiles", default="4,8,16,32", help="tiles per program of the Hopper form")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("dqkwg_tma: needs a CUDA GPU", file=sys.stderr)
        return 2
    bw = copy_bandwidth()
    forms = [("triton", 0)] + [("tma", int(t)) for t in a.tiles.split(",")]
    rows = []
    for gated in (True, False):
        for T in (int(t) for t in a.lengths.split(",")):
            x = inputs(T, gated)
            fns = {f"{f}{'' if f == 'triton' else f' x{t}'}": launch(x, f, t) for f, t in forms}
            times = {n: [] for n in fns}
            for _ in range(a.rounds):
                for n, fn in fns.items():
                    times[n].append(cuda_time(fn, queued=True)[0])
            floor = dram_bytes(T, gated) / bw
            base = statistics.median(times["triton"])
            for n, ts in times.items():
                ms = statistics.median(ts)
                rows.append(dict(rule="gated_delta_rule" if gated else "delta_rule", T=T, form=n, ms=ms * 1e3,
                                 floor_ms=floor * 1e3, x_floor=ms / floor, vs_triton=ms / base))
    body = (f"Copy bandwidth {bw / 1e12:.2f} TB/s. Median of {a.rounds} round-robin passes, each the median of "
            "queued calls (`gpu_common.cuda_time(queued=True)`).\n\n"
            "| rule | T | form | ms | DRAM floor ms | x floor | vs Triton |\n|---|---|---|---|---|---|---|\n"
            + "".join(f"| {r['rule']} | {r['T']} | {r['form']} | {r['ms']:.3f} | {r['floor_ms']:.3f} | "
                      f"{r['x_floor']:.2f} | {r['vs_triton']:.3f} |\n" for r in rows))
    write_report("dqkwg_tma", "bwd_dqkwg: Triton against the Hopper (Gluon, TMA) form", body, rows, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
