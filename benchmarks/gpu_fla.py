"""flash-linear-attention side by side: its kernels on the same shapes as ``gpu_kernels.py``.

Run by ``gpu_kernels.py`` in a subprocess with a time limit: fla autotunes for minutes on first
calls, and some of its kernels refuse Hopper with Triton 3.6, so whatever finishes in time is
kept. Results are written to ``--out`` (JSON) after every measurement.

    python benchmarks/gpu_fla.py --out fla.json [--lengths 512,2048]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import traceback

import torch

from gpu_common import (LENGTHS, TOKENS, cuda_time, fwd_bwd, graph_time, positional, step_inputs, train_inputs,
                        train_times)


def _fla_train_call(family: str, args: dict):
    import fla.ops as fo

    q, k, v = args["q"], args["k"], args["v"]
    if family == "linear_attn":
        return lambda: fo.chunk_linear_attn(q, k, v, normalize=False)[0]
    if family == "simple_gla":
        return lambda: fo.chunk_simple_gla(q, k, v, g=args["g"])[0]
    if family == "gla":
        return lambda: fo.chunk_gla(q, k, v, g=args["gk"])[0]
    if family == "delta_rule":
        return lambda: fo.chunk_delta_rule(q, k, v, beta=args["beta"])[0]
    return lambda: fo.chunk_gated_delta_rule(q, k, v, g=args["g"], beta=args["beta"])[0]


def _fla_step_call(family: str, args: dict):
    """fla's fused recurrent kernel for one decode step (T = 1), state in/out."""
    import fla.ops as fo

    q, k, v = (args[n][:, None] for n in ("q", "k", "v"))  # [B, 1, H, D]
    S = args["state"]
    if family == "gated_delta_rule":
        g, beta = args["g"][:, None], args["beta"][:, None]
        return lambda: fo.fused_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, initial_state=S,
                                                           output_final_state=True)
    return lambda: fo.fused_recurrent_simple_gla(q, k, v, g=args["g"][:, None], initial_state=S,
                                                 output_final_state=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
    ap.add_argument("--families", default="linear_attn,simple_gla,gla,delta_rule,gated_delta_rule")
    a = ap.parse_args(argv)
    res: dict = {"train": {}, "step": {}, "errors": {}, "version": None}

    def save():
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)

    try:
        import fla

        res["version"] = getattr(fla, "__version__", "?")
    except Exception as exc:  # fla missing or broken: record why, the caller reports it
        res["errors"]["import"] = f"{type(exc).__name__}: {exc}"
        save()
        return 0
    save()
    for family in ("gated_delta_rule", "simple_gla"):
        try:
            call = _fla_step_call(family, step_inputs(family))
            res["step"][family] = {"launch_s": cuda_time(call)[0], "graph_s": graph_time(call)}
        except Exception as exc:
            res["errors"][f"step/{family}"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
        save()
    for family in a.families.split(","):
        res["train"][family] = {}
        for T in map(int, a.lengths.split(",")):
            t0 = time.time()
            try:
                args = train_inputs(family, TOKENS // T, T)
                res["train"][family][str(T)] = dict(train_times(fwd_bwd(_fla_train_call(family, args),
                                                                        positional(family, args))),
                                                    wall_s=time.time() - t0)
            except Exception as exc:
                msg = str(exc).splitlines()[0][:300] if str(exc) else ""
                res["errors"][f"train/{family}"] = f"{type(exc).__name__}: {msg}"
                traceback.print_exc(limit=2, file=sys.stderr)
                save()
                break
            finally:
                torch.cuda.empty_cache()
            save()
            print(f"fla {family} T={T}: {res['train'][family][str(T)]['mtok_s']:.2f} Mtok/s "
                  f"({time.time() - t0:.1f}s wall)", flush=True)
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
