"""GPU benchmark of the linear-attention kernels and the captured decode, in ONE invocation.

    python benchmarks/gpu_kernels.py --out DIR [--fla-timeout 150] [--quick]

Measures on the current CUDA device (bf16, 16 heads of dim 128, 64k tokens per batch):
  1. ceilings: device-to-device copy bandwidth and bf16 matmul rate;
  2. training throughput (forward + backward) per sequence length, for every linear family through
     ``blocks.ops.<family>.chunk`` as it dispatches now (Triton kernel or PyTorch form, recorded),
     next to cuDNN and FlashAttention SDPA (causal) and flash-linear-attention (subprocess, with a
     time limit; whatever it finishes is kept);
  3. decode: one linear-state update at batch 16 (fused Triton step vs eager PyTorch vs fla's fused
     recurrent step), per-layer softmax decode over a KV cache vs context (SDPA) against the
     linear step, and a 24-layer d_model 2048 model's whole decode step captured as one CUDA graph
     (``archsearch.decode_graph``) against its memory roofline.
Writes ``gpu_results.json``, ``gpu_results.md`` and ``gpu_train.png`` / ``gpu_decode.png`` into DIR
and prints the markdown table last.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project root, for blocks/archsearch

from gpu_common import (  # noqa: E402
    HEAD_DIM, HEADS, LENGTHS, LINEAR_FAMILIES, TOKENS, apply_sets, checked_families, checked_lengths, copy_bandwidth,
    cuda_time, fwd_bwd, gpu_state, graph_time, kernel_settings, op_module, positional, step_inputs, switched,
    switches_line, train_inputs, train_times,
)

from triton_check import require_triton  # noqa: E402

import blocks.kernels as kernels  # noqa: E402

TARGET_MTOK = 15.0
CONTEXTS = (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --- 0. correctness ----------------------------------------------------------------------------
def correctness(stop_at: float = 0.0) -> dict:
    """Each family's kernel (through the op) against the op's PyTorch chunk form in float32 on the
    same values, forward and every gradient, at a length that is not a multiple of the chunk.
    ``stop_at`` (a ``time.time()``; 0: none): the cases not started by then are recorded as skipped,
    so that a capped run ends the section instead of being killed inside it (each case compiles its
    kernels: up to ~55 s, the float32 delta rules)."""
    out = {}
    B, T, H = 2, 1000, 4
    for family in LINEAR_FAMILIES:
        for dtype in (torch.bfloat16, torch.float32):
            if stop_at and time.time() > stop_at:
                out[f"{family}/{str(dtype)[6:]}"] = {"error": "skipped: past the run's --deadline"}
                log(f"check {family} {dtype}: skipped, past the deadline")
                continue
            try:
                args = train_inputs(family, B, T, H=H, dtype=dtype, seed=11)
                mod = op_module(family)
                pos = positional(family, args)
                ref_pos = [t.detach().float().requires_grad_(True) for t in pos]
                h0 = torch.randn(B, H, HEAD_DIM, HEAD_DIM, device="cuda")
                o, ht = mod.chunk(*pos, initial_state=h0, output_final_state=True)
                with kernels.disabled():
                    ro, rht = mod.chunk(*ref_pos, initial_state=h0, output_final_state=True)
                do = torch.randn_like(ro)
                grads = torch.autograd.grad((o.float() * do).sum() + ht.sum(), pos)
                rgrads = torch.autograd.grad((ro * do).sum() + rht.sum(), ref_pos)

                def rel(a, b):
                    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-6)).item()

                row = {"o": rel(o, ro), "final_state": rel(ht, rht)}
                row.update({f"d{n}": rel(a, b) for n, a, b in zip(("q", "k", "v", "g1", "g2"), grads, rgrads)})
                out[f"{family}/{str(dtype)[6:]}"] = row
                log(f"check {family:17s} {str(dtype)[6:]:9s} " + " ".join(f"{k}={v:.1e}" for k, v in row.items()))
            except Exception as exc:
                out[f"{family}/{str(dtype)[6:]}"] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
                log(f"check {family} {dtype} FAILED {exc!r}"[:300])
    return out


# --- 1. ceilings ------------------------------------------------------------------------------
def ceilings() -> dict:
    copy_bw = copy_bandwidth()
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    t, _ = cuda_time(lambda: a @ b)
    return {"copy_bytes_per_s": copy_bw, "bf16_matmul_flops": 2 * 8192 ** 3 / t}


# --- 2. training throughput ---------------------------------------------------------------------
def sdpa_call(backend: SDPBackend, B: int, T: int):
    q, k, v = (torch.randn(B, HEADS, T, HEAD_DIM, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))

    def call():
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    return call, [q, k, v]


def train_bench(lengths, families, rounds: int = 3) -> dict:
    """Training throughput per (method, length): ``rounds`` round-robin passes over every length
    and method, each cell's figures the medians of its passes (``gpu_common.train_times`` per
    pass; the passes in ``passes_s`` / ``queued_passes_s``; the PyTorch forms, seconds per step,
    in the first pass only). One pass per cell (before 2026-12-04) read the board wherever its
    clock was: the compute-bound rows slow as it reaches its power limit (H200 03:33: cuDNN at 512
    -4.4%, delta_rule at 32k -4.8% from the first pass to the later ones; memory-bound rows
    within 0.5%). Passes do not remove the spread between hosts (delta_rule at 2k 15.8 / 16.8 /
    17.1 on three H200s the same hour, docs/benchmarks/history.md). A pass that fails after
    others succeeded keeps their figures and adds its error to the cell's ``errors``."""
    out: dict = {f: {} for f in families}
    out["sdpa_cudnn"], out["sdpa_flash"] = {}, {}
    slow: set = set()
    for i_pass in range(rounds):
        for T in lengths:
            B = TOKENS // T
            for family in families:
                if family in slow or "error" in out[family].get(str(T), {}):
                    continue
                impl = "triton" if kernels.has_kernel(family, "chunk") else "pytorch"
                if i_pass and impl == "pytorch":
                    continue

                def ours(family=family, B=B, T=T):
                    mod, pos = op_module(family), positional(family, train_inputs(family, B, T))
                    return train_times(fwd_bwd(lambda: mod.chunk(*pos)[0], pos))

                row = _timed_cell(out[family], T, f"ours {family}", ours, f"{impl}; pass {i_pass + 1}", impl=impl)
                if row and row["s"] > 2.0:
                    slow.add(family)  # the PyTorch form at longer T would take minutes
            for name, backend in (("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa_flash", SDPBackend.FLASH_ATTENTION)):
                if "error" in out[name].get(str(T), {}):
                    continue
                _timed_cell(out[name], T, name, lambda backend=backend, B=B, T=T: train_times(fwd_bwd(*sdpa_call(backend, B, T))),
                            f"pass {i_pass + 1}")
    return out


def _timed_cell(table: dict, T: int, label: str, measure, note: str, **extra) -> dict | None:
    """One pass of one training cell: ``measure()`` (``train_times``' dict) folded into ``table``
    (``_add_pass``) and logged; a failure (out of memory, a compile error) recorded in the cell
    (``_add_error``) and logged, the run going on. The cell's row, or None when the pass failed."""
    try:
        row = _add_pass(table, T, measure(), **extra)
        log(f"{label:22s} T={T:6d} {row['mtok_s']:8.2f} Mtok/s, queued {row['queued_mtok_s']:6.2f} ({note}, medians)")
        return row
    except Exception as exc:
        _add_error(table, T, exc)
        log(f"{label} T={T} FAILED {exc!r}"[:300])
        return None
    finally:
        torch.cuda.empty_cache()


def _add_error(table: dict, T: int, exc: Exception) -> None:
    """A failed pass: the cell becomes ``{"error": ...}`` (skipped by later passes) unless earlier
    passes timed it, whose figures stay, the error added to its ``errors``."""
    message = f"{type(exc).__name__}: {str(exc)[:200]}"
    row = table.get(str(T))
    if row and row.get("passes_s"):
        row.setdefault("errors", []).append(message)
    else:
        table[str(T)] = {"error": message}


def _add_pass(table: dict, T: int, timed: dict, **extra) -> dict:
    """Fold one pass's ``train_times`` into ``table[str(T)]`` (created on the first pass): the
    pass lists grow and ``s`` / ``queued_s`` and their Mtok/s become the medians so far."""
    row = table.setdefault(str(T), {"passes_s": [], "queued_passes_s": [], **extra})
    row["passes_s"].append(timed["s"])
    row["queued_passes_s"].append(timed["queued_s"])
    row["iters"] = timed["iters"]
    for key, value in gpu_state().items():  # right after the pass: the clock it ended on
        row.setdefault(f"passes_{key}", []).append(value)
    for key, passes in (("s", row["passes_s"]), ("queued_s", row["queued_passes_s"])):
        row[key] = statistics.median(passes)
    row["mtok_s"], row["queued_mtok_s"] = TOKENS / row["s"] / 1e6, TOKENS / row["queued_s"] / 1e6
    return row


def fla_bench(timeout: float, lengths, families: str) -> dict:
    path = Path(os.environ.get("TMPDIR", "/tmp")) / "fla_bench.json"
    path.unlink(missing_ok=True)
    cmd = [sys.executable, str(Path(__file__).with_name("gpu_fla.py")), "--out", str(path),
           "--lengths", ",".join(map(str, lengths)), "--families", families]
    t0 = time.time()
    try:
        subprocess.run(cmd, timeout=timeout, check=False)
        note = "finished"
    except subprocess.TimeoutExpired:
        note = f"stopped at the {timeout:.0f} s limit"
    res = json.loads(path.read_text()) if path.exists() else {"train": {}, "step": {}, "errors": {}}
    res["note"] = f"{note} after {time.time() - t0:.0f} s"
    return res


# --- 3. decode ----------------------------------------------------------------------------------
def step_bench() -> dict:
    """One linear-state update at batch 16, 16 heads, 128x128 fp32 state (16.8 MB)."""
    out = {}
    for family in ("gated_delta_rule", "simple_gla", "linear_attn", "gla", "delta_rule"):
        a = step_inputs(family)
        mod = op_module(family)
        extra = [a[n] for n in ("g", "gk", "beta") if n in a]
        S = a["state"]
        call = lambda: mod.step(a["q"], a["k"], a["v"], *extra, state=S)  # noqa: E731
        state_bytes = S.numel() * 4
        row = {"state_bytes": state_bytes}
        row["triton_launch_s"] = cuda_time(call)[0]
        row["triton_graph_s"] = graph_time(call)
        with kernels.inplace_decode_state():
            row["triton_inplace_graph_s"] = graph_time(call)
        with kernels.disabled():
            row["eager_launch_s"] = cuda_time(call)[0]
            row["eager_graph_s"] = graph_time(call)
        row["inplace_bw"] = 2 * state_bytes / row["triton_inplace_graph_s"]
        out[family] = row
        log(f"step {family:17s} triton {row['triton_launch_s'] * 1e6:6.1f} us launched, "
            f"{row['triton_inplace_graph_s'] * 1e6:6.1f} us in a graph (in place); eager {row['eager_launch_s'] * 1e6:6.1f} us")
    return out


def _attend_kernel_times(B: int, S: int) -> dict:
    """The decode graph's softmax step as its kernel runs it (``blocks.kernels.decode_attention``:
    rotary of the new query and key, their cache writes and attention over ``S`` keys, the new one
    among them): cache ``[B, S, HEADS, HEAD_DIM]`` at position ``S - 1``, launched and in a graph."""
    from blocks.common import rotary_frequencies
    from blocks.kernels import decode_attention

    width = HEADS * HEAD_DIM
    proj = torch.randn(B, 1, 3 * width, device="cuda", dtype=torch.bfloat16)
    k_cache = torch.randn(B, S, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    valid = torch.ones(S, dtype=torch.bool, device="cuda")
    inv_freq = rotary_frequencies(HEAD_DIM, 10000.0, torch.device("cuda"))
    pos = torch.tensor(S - 1, device="cuda")

    def call():
        return decode_attention.attend_cache(proj[..., :width], proj[..., width:2 * width], proj[..., 2 * width:],
                                             None, inv_freq, pos, k_cache, v_cache, valid)

    return {"ours_launch_s": cuda_time(call)[0], "ours_graph_s": graph_time(call, steps=5, reps=5)}


def softmax_decode_bench(contexts) -> dict:
    """Per-layer softmax decode at batch 16: q [16, 16, 1, 128] over a KV cache [16, 16, S, 128]
    through SDPA's backends, and the decode graph's own kernel for the step (``_attend_kernel_times``)."""
    out = {}
    B = 16
    for S in contexts:
        row = {}
        try:
            q = torch.randn(B, HEADS, 1, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(B, HEADS, S, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
            v = torch.randn(B, HEADS, S, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
            for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION),
                                  ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
                def call(backend=backend):
                    with sdpa_kernel([backend]):
                        return F.scaled_dot_product_attention(q, k, v)
                try:
                    row[f"{name}_launch_s"] = cuda_time(call)[0]
                    row[f"{name}_graph_s"] = graph_time(call, steps=5, reps=5)
                except Exception as exc:
                    row[f"{name}_error"] = f"{type(exc).__name__}: {str(exc)[:120]}"
            row["kv_bytes"] = 2 * k.numel() * 2
            del q, k, v
            try:
                row.update(_attend_kernel_times(B, S))
            except Exception as exc:  # noqa: BLE001 - SDPA's figures of this context still count
                row["ours_error"] = f"{type(exc).__name__}: {str(exc)[:120]}"
        except torch.OutOfMemoryError as exc:
            row["error"] = str(exc)[:120]
        torch.cuda.empty_cache()
        out[str(S)] = row
        log(f"softmax decode S={S:7d} " + " ".join(f"{k}={v * 1e6:.1f}us" for k, v in row.items()
                                                    if k.endswith("_s")))
    return out


MLP_EXPANSION = 8 / 3  # ArchSpec's default; see --mlp-expansion


def model_spec(block: str, layers: int = 24, d_model: int = 2048, softmax_every: int = 0):
    from archsearch.spec import ArchSpec, LayerSpec

    cfg = {"num_heads": 16}
    lay = []
    for i in range(layers):
        if softmax_every and (i + 1) % softmax_every == 0:
            lay.append(LayerSpec("softmax", {"num_heads": 16}))
        else:
            lay.append(LayerSpec(block, cfg))
    return ArchSpec(vocab_size=32000, d_model=d_model, layers=tuple(lay), mlp_expansion=MLP_EXPANSION)


def _bf16_model(block: str, softmax_every: int):
    """The decode benchmark's model (``model_spec``), built on the GPU, in bf16 and eval mode."""
    from archsearch.model import HybridLM

    with torch.device("cuda"):
        model = HybridLM(model_spec(block, softmax_every=softmax_every))
    return model.to(torch.bfloat16).eval()


def model_decode_bench(copy_bw: float, batch: int = 16, rounds: int = 3, iters: int = 10) -> dict:
    """Whole-model decode as the captured graph (no torch.compile): the two 24-linear-layer models at
    4k context and the 3:1 hybrid at 1k / 4k / 16k, each row checked against the eager model and
    profiled (``_model_decode_row``; the eager step timed at each model's first context), then all
    timed round robin (``_time_round_robin``) as the compiled rows are."""
    out: dict = {}
    built = []
    models: dict = {}  # one model per (block, softmax_every), shared by its contexts' decoders
    cases = [("gated_deltanet x24", "gated_deltanet", 0, (4096,)),
             ("simple_gla x24", "simple_gla", 0, (4096,)),
             ("gated_deltanet 3:1 softmax", "gated_deltanet", 4, (1024, 4096, 16384))]
    for name, block, every, contexts in cases:
        for ctx in contexts:
            item = _model_decode_row(out, copy_bw, batch, name, block, every, ctx, False, "",
                                     steps=rounds * (iters + 2), eager=ctx == contexts[0], models=models)
            if item is not None:
                built.append(item)
    _time_round_robin(out, built, rounds, iters)
    return out


def model_compiled_bench(copy_bw: float, batch: int = 16, cases: str = "", modes: str = "default",
                         mixers: str = "on", layers: str = "off", sets: str = "", rounds: int = 3,
                         iters: int = 10, contexts: str = "4096") -> dict:
    """The same models with their linear layers through torch.compile inside the captured graph,
    once per compile mode in ``modes`` (``archsearch.decode_graph.COMPILE_MODES``), per setting
    of ``blocks.kernels.decode_mixer.ENABLED`` in ``mixers`` (``off``, ``on``: the deltanet,
    gated_deltanet and simple_gla layers' decode step between their projections as one kernel)
    and of ``archsearch.decode_layer.ENABLED`` in ``layers`` (``on``: those layers' whole decode
    step as the skinny GEMMs, the mixer and the residual + RMSNorm kernels, not compiled), and per
    entry of ``sets`` (``;``-separated ``--set`` strings, ``-`` for none: kernel switches for the row).
    The hybrid model (with softmax layers, whose KV cache grows with the context) runs at each of
    ``contexts`` (comma list), the linear models at 4096 (their state does not depend on it).

    Every row is built and captured first (its switches apply while it compiles and captures; a
    captured graph keeps them), then all are timed in ``rounds`` round-robin passes of ``iters``
    replays each, and each row's time is the median of its passes: the graph time of one
    configuration drifted by ~6% between calls on the H200 (2026-12-01), so rows timed one after
    another would carry that drift into their comparison."""
    from archsearch import decode_layer
    from blocks.kernels import decode_mixer

    out = {}
    runs = [(name, block, every, ctx, mode, mixer, fused, switch) for switch in (sets.split(";") if sets else ["-"])
            for mode in filter(None, modes.split(","))
            for mixer in filter(None, mixers.split(",")) for fused in filter(None, layers.split(","))
            for name, block, every in (("gated_deltanet x24", "gated_deltanet", 0),
                                       ("gated_deltanet 3:1 softmax", "gated_deltanet", 4),
                                       ("simple_gla x24", "simple_gla", 0))
            for ctx in ([int(c) for c in contexts.split(",")] if every else [4096])
            if not cases or name in cases.split(",")]
    enabled = decode_mixer.ENABLED, decode_layer.ENABLED
    built = []
    for name, block, every, ctx, mode, mixer, fused, switch in runs:
        label = (("compiled" if mode == "default" else f"compiled, {mode}") + (", fused mixer" if mixer == "on" else "")
                 + (", fused layers" if fused == "on" else "") + ("" if switch.strip() in ("", "-") else f", {switch}"))
        decode_mixer.ENABLED, decode_layer.ENABLED = mixer == "on", fused == "on"
        with switched("" if switch.strip() == "-" else switch):
            item = _model_decode_row(out, copy_bw, batch, name, block, every, ctx, mode, label,
                                     steps=rounds * (iters + 2))
        if item is not None:
            built.append(item)
    decode_mixer.ENABLED, decode_layer.ENABLED = enabled
    _time_round_robin(out, built, rounds, iters)
    return out


def _time_round_robin(out: dict, built: list, rounds: int, iters: int) -> None:
    """Time every ``(key, decoder)`` of ``built`` in ``rounds`` passes over all of them (``iters``
    replays each, after 2 warm-up replays), and complete their rows in ``out``: ``graph_s`` (the
    median of the passes' medians), ``graph_s_rounds`` and the roofline ratio."""
    samples: dict[str, list[float]] = {key: [] for key, _ in built}
    for _ in range(rounds):
        for key, dec in built:
            if "error" in out[key]:
                continue
            try:
                samples[key].append(dec.time_step(iters=iters, warmup=2))
            except Exception as exc:  # noqa: BLE001 - this row fails; the others are still timed
                out[key]["error"] = f"timing: {type(exc).__name__}: {str(exc)[:300]}"
                traceback.print_exc()
    for key, dec in built:
        row = out[key]
        if "error" in row:
            continue
        times = sorted(samples[key])
        row["graph_s"] = times[len(times) // 2]
        row["graph_s_rounds"] = samples[key]
        row["x_roofline"] = row["graph_s"] / row["roofline_s"]
        row["tokens_per_s"] = row["batch"] / row["graph_s"]
        log(f"{key}: graph {row['graph_s'] * 1e3:.3f} ms ({row['x_roofline']:.2f}x roofline; "
            f"passes {', '.join(f'{t * 1e3:.3f}' for t in samples[key])})")
    built.clear()
    torch.cuda.empty_cache()


def _model_decode_row(out: dict, copy_bw: float, batch: int, name: str, block: str, every: int, ctx: int,
                      mode: str | bool, label: str, steps: int = 40, eager: bool = False,
                      models: dict | None = None):
    """Build, check against the eager model, capture and profile one whole-model decode row into
    ``out`` under ``"{name} @ {ctx}"`` (`` ({label})`` appended when given; an error row if it
    fails): ``mode`` False for the plain graph, else a ``GraphDecoder`` compile mode; ``eager``
    also times the eager ``decode_step``; ``models`` caches the model per ``(block, every)`` (the
    plain rows share it: a decoder only reads the weights; compiled rows build their own). Returns
    ``(key, decoder)`` with room for ``steps`` more positions, for ``_time_round_robin``, or None."""
    from archsearch import decode_graph

    key = f"{name} @ {ctx}" + (f" ({label})" if label else "")
    try:
        if models is None:
            model = _bf16_model(block, every)
        else:
            if (block, every) not in models:
                models[(block, every)] = _bf16_model(block, every)
            model = models[(block, every)]
        dec = decode_graph.GraphDecoder(model, batch, capacity=ctx + 8 + steps, compile=mode)
        dec.randomize(ctx - 1, torch.Generator(device="cuda").manual_seed(0))
        t0 = time.time()
        check = _graph_vs_eager(model, dec, batch)  # first step: compiles and captures
        compile_s = time.time() - t0
        nbytes = decode_graph.decode_bytes(model, batch, ctx)
        out[key] = {
            "params": model.num_params(), "mlp_hidden": _mlp_hidden(model), "bytes_per_step": nbytes,
            "batch": batch, "roofline_s": nbytes / copy_bw, "max_abs_logit_diff_vs_eager": check,
            "compile_and_capture_s": compile_s, "profile": _profile_step(dec)}
        if eager:
            out[key]["eager_s"] = _eager_step_time(model, dec, batch)
        dec.randomize(ctx - 1, torch.Generator(device="cuda").manual_seed(1))  # fresh states for the timing
        log(f"{label or 'graph'} {name} ctx={ctx}: compile+capture {compile_s:.0f} s, logit diff {check:.3g}"
            + (f", eager {out[key]['eager_s'] * 1e3:.2f} ms" if eager else ""))
        return key, dec
    except Exception as exc:
        out[key] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        traceback.print_exc()
        torch.cuda.empty_cache()
        return None


def _profile_step(dec) -> dict:
    """Kernels in one replay of the captured step: count, summed device time, and every kernel
    name with its launches and time (``by_kernel``, heaviest first; ``top_us`` its first eight, as
    runs before 2026-12-01 wrote it). Busy time close to the step time means the kernels themselves
    are slow; far below it means the step is bound by the per-kernel gaps (too many small
    kernels); the launches per name say which small kernels each layer adds."""
    from torch.profiler import ProfilerActivity, profile

    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            dec.graph.replay()
            torch.cuda.synchronize()
        dec.position += 1
        evs = [e for e in prof.events() if e.device_type.name == "CUDA"]
        summary = kernel_summary([(e.name, e.device_time_total) for e in evs])
        summary["path"] = step_path([(e.name, e.time_range.start, e.time_range.end) for e in evs],
                                    layers=len(dec.model.layers))
        return summary
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}


def step_path(events: list[tuple[str, float, float]], layers: int) -> dict:
    """Which kernels the step's wall time goes to, from one replay's ``(name, start, end)`` (us).
    With programmatic dependent launch a kernel starts before the one it waits for ends, so its
    own span (``device_time_total``) overlaps its neighbours'; here each kernel is credited only
    with how far it moves the step's end: in start order, ``max(0, end - the latest end before
    it)`` (``path_us``; the credits and ``idle_us``, the time no kernel ran, sum to the step).
    Kernels launched at least twice per layer are split into roles by their launch's index within
    the layer (``_skinny_kernel#0..3``: in_proj, o_proj, the SwiGLU pair, w2 in a fused layer), the
    launches after the last layer's as ``#+0``, ``#+1``... (the head, ``decode_graph.HEAD_KERNEL``).
    Returns ``{"step_us", "idle_us", "by_role": [[role, launches, path_us, span_us], ...] in
    first-launch order}``."""
    events = sorted(events, key=lambda e: e[1])
    counts: dict[str, int] = {}
    for name, _, _ in events:
        counts[name] = counts.get(name, 0) + 1
    seen: dict[str, int] = {}
    roles: dict[str, list] = {}
    latest = events[0][1] if events else 0.0
    idle = 0.0
    for name, start, end in events:
        k = seen.get(name, 0)
        seen[name] = k + 1
        per_layer = counts[name] // layers if counts[name] >= 2 * layers else 1
        index = f"{k % per_layer}" if k < per_layer * layers else f"+{k - per_layer * layers}"
        role = f"{name[:90]}#{index}" if per_layer > 1 else name[:90]
        rec = roles.setdefault(role, [role, 0, 0.0, 0.0])
        rec[1] += 1
        idle += max(0.0, start - latest)
        rec[2] += max(0.0, end - max(latest, start))
        rec[3] += end - start
        latest = max(latest, end)
    step = latest - events[0][1] if events else 0.0
    return {"step_us": round(step, 1), "idle_us": round(idle, 1),
            "by_role": [[r, c, round(p, 1), round(sp, 1)] for r, c, p, sp in roles.values()]}


def kernel_summary(events: list[tuple[str, float]]) -> dict:
    """``{"kernels", "busy_us", "by_kernel": [[name, launches, us], ...] heaviest first, "top_us"}``
    of ``(kernel name, device us)`` events (names cut to 120 characters)."""
    total: dict[str, list] = {}
    for name, us in events:
        rec = total.setdefault(name, [0, 0.0])
        rec[0] += 1
        rec[1] += us
    ranked = sorted(total.items(), key=lambda kv: -kv[1][1])
    return {"kernels": len(events), "busy_us": sum(us for _, us in events),
            "by_kernel": [[n[:120], c, round(t, 1)] for n, (c, t) in ranked],
            "top_us": [[n[:80], round(t, 1)] for n, (_, t) in ranked[:8]]}


def kernel_breakdown(families=LINEAR_FAMILIES, lengths=(2048, 32768)) -> dict:
    """Where a training step's time goes: every family's forward + backward at each of ``lengths``
    under ``torch.profiler``, device time summed per kernel name (ms per step, heaviest first)."""
    from torch.profiler import ProfilerActivity, profile

    out: dict = {}
    for family in families:
        out[family] = {}
        for T in lengths:
            try:
                args = train_inputs(family, TOKENS // T, T)
                pos = positional(family, args)
                mod = op_module(family)
                run = fwd_bwd(lambda: mod.chunk(*pos)[0], pos)
                run()
                torch.cuda.synchronize()
                reps = 3
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(reps):
                        run()
                    torch.cuda.synchronize()
                total: dict = {}
                for e in prof.events():
                    if e.device_type.name == "CUDA":
                        total[e.name] = total.get(e.name, 0.0) + e.device_time_total / 1e3 / reps
                top = sorted(total.items(), key=lambda kv: -kv[1])
                out[family][str(T)] = {"busy_ms": sum(total.values()),
                                       "kernels_ms": {n[:60]: round(t, 4) for n, t in top[:10]}}
                log(f"{family} T={T}: busy {sum(total.values()):.3f} ms/step: "
                    + ", ".join(f"{n[:40]} {t:.3f}" for n, t in top[:6]))
                del args, pos, run
            except Exception as exc:
                out[family][str(T)] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
            torch.cuda.empty_cache()
    return out


def _mlp_hidden(model) -> int:
    mlp = model.layers[0].mlp
    return 0 if mlp is None else mlp.hidden


@torch.no_grad()
def _eager_states(dec) -> list:
    """The decoder's static buffers as eager-model states (KV caches cut to the valid length)."""
    states = []
    pos = dec.position
    for i, st in enumerate(dec.states):
        if i in dec.caches:
            c = dec.caches[i]
            n = min(pos, c.cap)
            slots = torch.arange(pos - n, pos, device=c.k.device) % c.cap
            states.append({"k_cache": c.k[:, slots].clone(), "v_cache": c.v[:, slots].clone(),
                           "pos": torch.tensor(pos, device=c.k.device)})
        else:
            states.append({k: v.clone() for k, v in st.items()})
    return states


@torch.no_grad()
def _graph_vs_eager(model, dec, batch: int) -> float:
    token = torch.randint(0, model.spec.vocab_size, (batch,), device="cuda")
    states = _eager_states(dec)
    ref, _ = model.decode_step(token, states)
    got = dec.step(token).clone()
    return (got.float() - ref.float()).abs().max().item()


@torch.no_grad()
def _eager_step_time(model, dec, batch: int) -> float:
    token = torch.randint(0, model.spec.vocab_size, (batch,), device="cuda")
    states = _eager_states(dec)
    return cuda_time(lambda: model.decode_step(token, states), budget_s=0.5, max_iters=10)[0]


# --- report --------------------------------------------------------------------------------------
def fmt(x, scale=1.0, digits=2):
    return "-" if x is None else f"{x * scale:.{digits}f}"


def markdown(res: dict) -> str:
    """The results as markdown; a section that failed shows its error instead of a table."""
    lines: list[str] = []
    for part in (_md_header, _md_train, _md_check, _md_step, _md_softmax, _md_model):
        try:
            lines += part(res)
        except Exception as exc:  # a missing/failed section must not hide the others
            lines += ["", f"({part.__name__[4:]}: not available: {type(exc).__name__}: {exc})"]
    return "\n".join(lines) + "\n"


def _fla(res: dict) -> dict:
    """The fla section's results, or ``{}`` when it was skipped or failed as a whole."""
    fla = res.get("fla", {})
    return fla if isinstance(fla, dict) and "error" not in fla else {}


def _md_header(res: dict) -> list[str]:
    """Title, environment, ceilings (when measured) and the kernel switches: every run has them."""
    env, fla = res["env"], _fla(res)
    ceil = res.get("ceilings", {})
    parts = [env["when"], f"torch {env['torch']}", f"triton {env['triton']}",
             f"fla {fla.get('version')} ({fla.get('note', '')})"]
    if "copy_bytes_per_s" in ceil:
        parts += [f"copy {ceil['copy_bytes_per_s'] / 1e12:.2f} TB/s",
                  f"bf16 matmul {ceil['bf16_matmul_flops'] / 1e12:.0f} TFLOP/s"]
    carried = res.get("carried", {})  # benchmarks/carry_sections.py: sections this run did not reach
    return [f"# GPU benchmark: {env['device']}", "", " · ".join(parts), "",
            *([f"Kernel switches: {switches_line(res['kernel_settings'])}", ""] if "kernel_settings" in res else []),
            *([f"Carried from other runs of the same code (not measured in this one; the date is the run that measured it): "
               f"{', '.join(f'{name} ({when})' for name, when in carried.items())}", ""] if carried else [])]


def _md_train(res: dict) -> list[str]:
    if "train" not in res:  # skipped (--skip train): no table, no complaint
        return []
    lines = _md_train_table(res, "mtok_s", f"## Training, forward + backward (Mtok/s; bf16, H={HEADS}, "
                            f"D={HEAD_DIM}, {TOKENS} tokens per batch; target >= {TARGET_MTOK:g} and > cuDNN "
                            "from 2k; each step from an idle GPU)")
    if any("queued_mtok_s" in r for t in res["train"].values() for r in t.values()):
        lines += [""] + _md_train_table(res, "queued_mtok_s", "## Training, steps launched back to back (Mtok/s; "
                                        "as above, but the host may run ahead of the GPU, as in a training loop)")
    lines += _md_train_passes(res["train"])
    fla = _fla(res)
    if fla.get("errors"):
        lines += ["", "fla errors: " + "; ".join(f"{k}: {v[:140]}" for k, v in fla["errors"].items())]
    return lines


def _md_train_passes(train: dict) -> list[str]:
    """How the cells were timed, for runs with pass lists (``train_bench``'s rounds): the number of
    passes and, per method, the widest spread of one cell's queued passes (max / min - 1)."""
    spreads, counts = {}, set()
    for method, table in train.items():
        passes = [r["queued_passes_s"] for r in table.values() if len(r.get("queued_passes_s", ())) > 1]
        if passes:
            counts.update(len(p) for p in passes)
            spreads[method] = max(max(p) / min(p) - 1 for p in passes)
    if not spreads:
        return []
    n = "/".join(str(c) for c in sorted(counts))
    lines = ["", f"Each cell: the median of {n} round-robin passes over every cell of both tables; the widest "
             "spread of one cell's queued passes (max / min - 1): "
             + ", ".join(f"{m} {100 * v:.1f}%" for m, v in spreads.items()) + "."]
    by_pass: dict = {}  # pass index -> (SM MHz, C, W) readings after each cell of that pass
    for table in train.values():
        for r in table.values():
            for i, reading in enumerate(zip(r.get("passes_sm_mhz", ()), r.get("passes_temp_c", ()),
                                            r.get("passes_power_w", ()))):
                by_pass.setdefault(i, []).append(reading)
    if by_pass:
        lines.append("GPU after each cell, median per pass (SM clock / temperature / power): " + "; ".join(
            f"pass {i + 1} " + " / ".join(f"{statistics.median(x[j] for x in v):.0f} {u}"
                                          for j, u in enumerate(("MHz", "C", "W")))
            for i, v in sorted(by_pass.items())) + ".")
    return lines


def _md_train_table(res: dict, key: str, title: str) -> list[str]:
    """One training table: a row per method, the value ``key`` of each length's record."""
    tr, fla = res["train"], _fla(res)
    lines = [title, "", "| method | " + " | ".join(str(T) for T in res["lengths"]) + " |",
             "|---|" + "---|" * len(res["lengths"])]

    def row(label, table):
        cells = []
        for T in res["lengths"]:
            r = table.get(str(T), {})
            cells.append(fmt(r.get(key)) if key in r else ("err" if "error" in r else "-"))
        return f"| {label} | " + " | ".join(cells) + " |"

    for family in res["families"]:
        impl = {r.get("impl") for r in tr[family].values() if "impl" in r}
        lines.append(row(f"ours {family} ({'/'.join(sorted(impl)) or '?'})", tr[family]))
        if family in fla.get("train", {}) and fla["train"][family]:
            lines.append(row(f"fla {family}", fla["train"][family]))
    lines.append(row("cuDNN SDPA (causal)", tr["sdpa_cudnn"]))
    lines.append(row("FlashAttention SDPA (causal)", tr["sdpa_flash"]))
    return lines


def _md_check(res: dict) -> list[str]:
    ck = res.get("correctness")
    if not isinstance(ck, dict) or not ck:
        return []
    lines = ["", "## Kernels vs the PyTorch chunk form (float32 on the same values; B=2, T=1000, H=4, D=128; relative L2 error)", "",
             "| family/dtype | o | final state | dq | dk | dv | d(gate 1) | d(gate 2) |", "|---|---|---|---|---|---|---|---|"]
    for name, r in ck.items():
        if "error" in r:
            lines.append(f"| {name} | error: {r['error'][:100]} |||||||")
            continue
        cells = [r.get(k) for k in ("o", "final_state", "dq", "dk", "dv", "dg1", "dg2")]
        lines.append(f"| {name} | " + " | ".join("-" if c is None else f"{c:.1e}" for c in cells) + " |")
    return lines


def _md_step(res: dict) -> list[str]:
    lines: list[str] = []
    fla = _fla(res)
    st = res.get("step", {})
    if st:
        lines += ["", "## One decode-state update (batch 16, 16 heads, 128x128 fp32 state = 16.8 MB; us)", "",
                  "| family | Triton, launched | Triton, in a graph | Triton in place, in a graph (TB/s) | eager PyTorch, launched | eager, in a graph | fla fused recurrent, launched / graph |",
                  "|---|---|---|---|---|---|---|"]
        for fam, r in st.items():
            f = fla.get("step", {}).get(fam)
            fcell = f"{f['launch_s'] * 1e6:.1f} / {f['graph_s'] * 1e6:.1f}" if f else "-"
            lines.append(f"| {fam} | {fmt(r['triton_launch_s'], 1e6, 1)} | {fmt(r['triton_graph_s'], 1e6, 1)} | "
                         f"{fmt(r['triton_inplace_graph_s'], 1e6, 1)} ({r['inplace_bw'] / 1e12:.2f}) | "
                         f"{fmt(r['eager_launch_s'], 1e6, 1)} | {fmt(r['eager_graph_s'], 1e6, 1)} | {fcell} |")
    return lines


def _md_softmax(res: dict) -> list[str]:
    lines: list[str] = []
    st = res.get("step", {})
    sd = res.get("softmax_decode", {})
    if sd and st:
        lin = st["gated_delta_rule"]["triton_inplace_graph_s"]
        lines += ["", "## Decode per layer vs context (batch 16; us, in a graph): softmax SDPA over the KV cache, the "
                  "decode graph's attention kernel (rotary, cache write, attention) vs one linear-state update", "",
                  "| context | cuDNN | flash | efficient | ours (Triton, whole step) | linear (gated delta, Triton) "
                  "| best softmax / linear |",
                  "|---|---|---|---|---|---|---|"]
        for S, r in sd.items():
            best = min((r[k] for k in ("cudnn_graph_s", "flash_graph_s", "efficient_graph_s", "ours_graph_s")
                        if k in r), default=None)
            lines.append(f"| {S} | {fmt(r.get('cudnn_graph_s'), 1e6, 1)} | {fmt(r.get('flash_graph_s'), 1e6, 1)} | "
                         f"{fmt(r.get('efficient_graph_s'), 1e6, 1)} | {fmt(r.get('ours_graph_s'), 1e6, 1)} | "
                         f"{lin * 1e6:.1f} | {fmt(best / lin if best else None, 1, 1)}x |")
    return lines


def _md_model(res: dict) -> list[str]:
    lines: list[str] = []
    md = dict(res.get("model_decode", {}))
    if isinstance(res.get("model_compiled"), dict):
        md.update({k: v for k, v in res["model_compiled"].items() if k != "error"})
    if md:
        lines += ["", "## Whole-model decode step, one CUDA graph (24 layers, d_model 2048, batch 16, bf16)", "",
                  "| model @ context | params | MB moved / step | graph ms | roofline ms | x roofline | eager ms | tokens/s | max logit diff vs eager |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for name, r in md.items():
            if "error" in r:
                lines.append(f"| {name} | error: {r['error'][:120]} |||||||")
                continue
            lines.append(f"| {name} | {r['params'] / 1e9:.2f} B | {r['bytes_per_step'] / 1e6:.0f} | {r['graph_s'] * 1e3:.3f} | "
                         f"{r['roofline_s'] * 1e3:.3f} | {r['x_roofline']:.2f} | {fmt(r.get('eager_s'), 1e3, 2)} | "
                         f"{r['tokens_per_s']:.0f} | {r['max_abs_logit_diff_vs_eager']:.2g} |")
    passes = [(n, r["graph_s_rounds"]) for n, r in md.items() if "graph_s_rounds" in r and "error" not in r]
    if passes:
        lines += ["", "Graph times: the median of round-robin passes over the rows of their section (plain graphs; "
                  "compiled ones), ms per step in each pass: "
                  + "; ".join(f"{n}: {', '.join(f'{t * 1e3:.3f}' for t in ts)}" for n, ts in passes)]
    prof = [(n, r) for n, r in md.items() if isinstance(r.get("profile"), dict) and "kernels" in r["profile"]]
    if prof:
        lines += ["", "Kernels in one replayed step (count, summed kernel time): "
                  + "; ".join(f"{n}: {r['profile']['kernels']} kernels, {r['profile']['busy_us'] / 1e3:.2f} ms busy"
                              for n, r in prof)]
        lines += _md_kernel_lists(prof)
    kb = res.get("kernel_breakdown")
    if isinstance(kb, dict) and "error" not in kb:
        lines += ["", "## Where a training step goes (fwd + bwd, device ms per step, heaviest kernels)", ""]
        for fam, rows in kb.items():
            for T, r in rows.items():
                if "kernels_ms" in r:
                    lines.append(f"- {fam} T={T}: {r['busy_ms']:.2f} ms busy; "
                                 + ", ".join(f"{n} {t:.2f}" for n, t in list(r["kernels_ms"].items())[:6]))
    return lines


def _md_kernel_lists(prof: list[tuple[str, dict]], rows: int = 16) -> list[str]:
    """Per profiled decode model: its heaviest kernels with launches and time, and the time between
    kernels (graph time minus busy time)."""
    lines: list[str] = []
    for name, r in prof:
        p = r["profile"]
        if "by_kernel" not in p:  # runs before 2026-12-01 kept only the top eight's times
            continue
        gaps = r["graph_s"] * 1e6 - p["busy_us"] if "graph_s" in r else None
        lines += ["", f"### Kernels of one decode step: {name}", "",
                  f"{p['kernels']} launches, {p['busy_us']:.0f} us busy"
                  + (f", {gaps:.0f} us between kernels (graph {r['graph_s'] * 1e6:.0f} us)" if gaps is not None else ""),
                  "", "| kernel | launches | us | us / launch |", "|---|---|---|---|"]
        for kname, count, us in p["by_kernel"][:rows]:
            lines.append(f"| `{kname[:90]}` | {count} | {us:.1f} | {us / count:.2f} |")
        rest = p["by_kernel"][rows:]
        if rest:
            lines.append(f"| {len(rest)} more kernel names | {sum(c for _, c, _ in rest)} | "
                         f"{sum(t for _, _, t in rest):.1f} | |")
        path = p.get("path")
        if path and path.get("by_role"):
            lines += ["", f"On the step's path (each kernel credited with how far it moves the step's end; "
                          f"`#k`: the k-th launch of that kernel within a layer): {path['step_us']:.0f} us "
                          f"under the profiler, {path['idle_us']:.1f} us idle", "",
                      "| kernel (role) | launches | us on the path | per launch | own span per launch |",
                      "|---|---|---|---|---|"]
            for role, count, on_path, span in path["by_role"][:rows]:
                lines.append(f"| `{role}` | {count} | {on_path:.1f} | {on_path / count:.2f} | {span / count:.2f} |")
    return lines


def _plot_points(table: dict, key: str) -> list[tuple[int, float]]:
    """``(T, Mtok/s)`` of a training table's rows, from ``key`` (``queued_mtok_s``: steps launched back to
    back, the figure the targets are read on), or ``mtok_s`` where a row has no queued figure (fla's)."""
    return sorted((int(T), r.get(key, r["mtok_s"])) for T, r in table.items() if "mtok_s" in r)


def _train_plot(res: dict, train: dict, out: Path, plt) -> str:
    """``gpu_train.png``: Mtok/s vs sequence length per family, steps launched back to back (the figure the
    targets are read on), ours next to fla and SDPA; ours from an idle GPU too, faint."""
    fams = res["families"]
    fig, axes = plt.subplots(1, len(fams), figsize=(4 * len(fams), 3.6), sharey=True, squeeze=False)
    axes = axes[0]
    for ax, family in zip(axes, fams):
        for label, table, key, style, extra in (
                ("ours", train[family], "queued_mtok_s", "o-", dict(color="C0")),
                ("ours, each step from an idle GPU", train[family], "mtok_s", "o-",
                 dict(color="C0", alpha=0.35, lw=0.8, ms=3)),
                ("fla", _fla(res).get("train", {}).get(family, {}), "queued_mtok_s", "s--", dict(color="C3")),
                ("cuDNN SDPA", train["sdpa_cudnn"], "queued_mtok_s", "^:", dict(color="C1")),
                ("Flash SDPA", train["sdpa_flash"], "queued_mtok_s", "v:", dict(color="C2"))):
            pts = _plot_points(table, key)
            if pts:
                ax.plot(*zip(*pts), style, label=label, **extra)
        ax.axhline(TARGET_MTOK, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(family)
        ax.set_xlabel("sequence length")
    axes[0].set_ylabel("Mtok/s, fwd+bwd, steps back to back\n(64k tokens/batch)")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "gpu_train.png", dpi=110)
    plt.close(fig)
    return "gpu_train.png"


def plots(res: dict, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    train = res.get("train")
    if isinstance(train, dict) and "error" not in train:  # a run with --skip train has no such plot
        files.append(_train_plot(res, train, out, plt))
    sd, st = res.get("softmax_decode", {}), res.get("step", {})
    if sd and st:
        fig, ax = plt.subplots(figsize=(6, 4))
        for key, label in (("cudnn_graph_s", "softmax cuDNN SDPA"), ("flash_graph_s", "softmax flash SDPA"),
                           ("ours_graph_s", "softmax, ours (Triton step)")):
            pts = [(int(S), r[key] * 1e6) for S, r in sd.items() if key in r]
            if pts:
                ax.plot(*zip(*sorted(pts)), "o-", label=label)
        ctxs = sorted(int(S) for S in sd)
        for fam in ("gated_delta_rule",):
            ax.plot(ctxs, [st[fam]["triton_inplace_graph_s"] * 1e6] * len(ctxs), "s--", label=f"linear {fam} (Triton step)")
            ax.plot(ctxs, [st[fam]["eager_launch_s"] * 1e6] * len(ctxs), ":", label=f"linear {fam} (eager)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel("us per layer per step (batch 16)")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "gpu_decode.png", dpi=110)
        files.append("gpu_decode.png")
        plt.close(fig)
    return files


# The order the sections run in: the measurements first, the correctness check after them (it
# compiles every family's kernels for its own shape in two dtypes, 2-3 min on the H200 host, while
# step, softmax decode, breakdown and model decode take ~20 s together once training has compiled
# its kernels; ahead of them it pushed those past a run's --deadline, 2026-12-01 23:59). The compiled
# decode graphs (~15 s) before it too: a capped call was killed inside the check on 2026-12-04 16:52
# and lost them; the check itself stops starting cases at the deadline.
SECTIONS = ("ceilings", "train", "step", "softmax_decode", "kernel_breakdown", "model_decode", "model_compiled",
            "correctness", "fla")


def write_results(res: dict, out: Path, quiet: bool = False) -> str:
    """``gpu_results.md``, the plots (their names in ``res["plots"]``) and ``gpu_results.json`` in
    ``out``; returns the markdown. A plot that fails is left out (its traceback printed unless
    ``quiet``): the tables matter more."""
    text = markdown(res)
    (out / "gpu_results.md").write_text(text)
    try:
        res["plots"] = plots(res, out)
    except Exception:
        if not quiet:
            traceback.print_exc()
    (out / "gpu_results.json").write_text(json.dumps(res, indent=1))
    return text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for gpu_results.json/.md and the plots")
    ap.add_argument("--fla-timeout", type=float, default=150.0)
    ap.add_argument("--quick", action="store_true", help="three lengths, fewer contexts")
    ap.add_argument("--skip", default="", help="comma list of sections to skip: train,fla,step,softmax,model,"
                    "kernel_breakdown,model_compiled")
    ap.add_argument("--families", default=",".join(LINEAR_FAMILIES),
                    help="linear families of the training and kernel-breakdown sections")
    ap.add_argument("--fla-families", default="linear_attn,delta_rule,simple_gla,gla,gated_delta_rule")
    ap.add_argument("--fla-lengths", default="", help="comma list (default: the benchmark's lengths)")
    ap.add_argument("--mlp-expansion", type=float, default=8 / 3,
                    help="decode models' SwiGLU width / d_model; 8/3 gives 5461 at d_model 2048, an odd "
                    "width that sends its GEMMs to cuBLAS's unaligned path (2 of ~5 ms in the 2nd run); "
                    "2.75 gives 5632")
    ap.add_argument("--compiled-cases", default="gated_deltanet x24,gated_deltanet 3:1 softmax,simple_gla x24")
    ap.add_argument("--compiled-contexts", default="4096", help="comma list: the contexts of the compiled "
                    "decode rows of the hybrid model (its softmax layers' KV caches)")
    ap.add_argument("--compile-modes", default="default",
                    help="comma list for the compiled decode rows: default, max-autotune (Inductor times "
                    "Triton GEMM templates against cuBLAS; minutes of compiling per model)")
    ap.add_argument("--decode-mixers", default=None, help="comma list for the compiled decode rows: off, on "
                    "(blocks.kernels.decode_mixer: each deltanet, gated_deltanet and simple_gla layer's decode "
                    "step between its projections as one kernel); default: as the module is switched")
    ap.add_argument("--decode-layers", default=None, help="comma list for the compiled decode rows: off, on "
                    "(archsearch.decode_layer: those layers' whole decode step as skinny GEMMs, the mixer and "
                    "residual + RMSNorm kernels); default: as the module is switched")
    ap.add_argument("--compiled-sets", default="", help="';'-separated --set strings, one run of the compiled "
                    "decode rows each ('-': none); give it as --compiled-sets=VALUE when VALUE starts with '-', "
                    "e.g. --compiled-sets=\"-;PDL=False;CHUNKS=4\"")
    ap.add_argument("--set", default="", help="kernel module switches to run with, as the launch sweep's --set "
                    "(e.g. CHUNKS=4: the decode mixer's state in four slices; recorded in kernel_settings)")
    ap.add_argument("--rounds", type=int, default=3, help="round-robin timing passes over the whole-model decode "
                    "rows, plain and compiled (each row's time: the median of its passes)")
    ap.add_argument("--train-rounds", type=int, default=3, help="round-robin timing passes over the training "
                    "table's cells (each cell: the median of its passes)")
    ap.add_argument("--breakdown-lengths", default="2048,32768", help="comma list: the kernel breakdown's "
                    "sequence lengths")
    ap.add_argument("--deadline", type=float, default=0.0, help="skip sections that would start after this many s (and the correctness check's cases)")
    a = ap.parse_args(argv)
    families = tuple(checked_families(ap, a.families))
    breakdown_lengths = tuple(checked_lengths(ap, a.breakdown_lengths, "--breakdown-lengths", whole_batches=True))
    require_triton("gpu_kernels")  # the argument checks below read the kernel modules
    from archsearch.decode_graph import COMPILE_MODES

    from archsearch import decode_layer
    from blocks.kernels import decode_mixer

    # the compiled decode rows default to the switches as the modules have them
    if a.decode_mixers is None:
        a.decode_mixers = "on" if decode_mixer.ENABLED else "off"
    if a.decode_layers is None:
        a.decode_layers = "on" if decode_layer.ENABLED else "off"
    try:
        apply_sets(a.set)
        for entry in filter(None, a.compiled_sets.split(";")):
            with switched("" if entry.strip() == "-" else entry):
                pass  # each entry checked here, before anything runs
    except ValueError as exc:
        ap.error(str(exc))
    if a.rounds < 1:
        ap.error(f"--rounds: must be >= 1, got {a.rounds}")
    if a.train_rounds < 1:
        ap.error(f"--train-rounds: must be >= 1, got {a.train_rounds}")
    if not all(c.strip().isdigit() and int(c) > 0 for c in a.compiled_contexts.split(",")):
        ap.error(f"--compiled-contexts: a comma list of positive integers, got {a.compiled_contexts!r}")
    for flag, value in (("--decode-mixers", a.decode_mixers), ("--decode-layers", a.decode_layers)):
        if set(filter(None, value.split(","))) - {"off", "on"}:
            ap.error(f"{flag}: a comma list of off, on; got {value!r}")
    bad_modes = set(filter(None, a.compile_modes.split(","))) - set(COMPILE_MODES)
    if bad_modes:
        ap.error(f"--compile-modes: unknown {sorted(bad_modes)}; known: {', '.join(COMPILE_MODES)}")
    if not torch.cuda.is_available():
        print("gpu_kernels: no CUDA device; nothing to measure", file=sys.stderr)
        return 2
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    global MLP_EXPANSION
    MLP_EXPANSION = a.mlp_expansion
    skip = set(filter(None, a.skip.split(",")))
    lengths = (512, 2048, 8192) if a.quick else LENGTHS
    contexts = (1024, 8192, 131072) if a.quick else CONTEXTS
    import triton

    res: dict = {"env": {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                         "triton": triton.__version__, "cudnn": torch.backends.cudnn.version(),
                         "python": platform.python_version(), "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())},
                 "lengths": list(lengths), "families": list(families),
                 "kernels": {f: kernels.has_kernel(f, "chunk") for f in LINEAR_FAMILIES},
                 "kernel_settings": kernel_settings()}

    sections = {"ceilings": lambda: ceilings(),
                "train": lambda: train_bench(lengths, families, a.train_rounds),
                "step": step_bench,
                "softmax_decode": lambda: softmax_decode_bench(contexts),
                "kernel_breakdown": lambda: kernel_breakdown(families, breakdown_lengths),
                "model_decode": lambda: model_decode_bench(res["ceilings"]["copy_bytes_per_s"], rounds=a.rounds),
                "correctness": lambda: correctness(started + a.deadline if a.deadline else 0.0),
                "fla": lambda: fla_bench(a.fla_timeout, [int(x) for x in a.fla_lengths.split(",")] if a.fla_lengths
                                         else lengths, a.fla_families),
                "model_compiled": lambda: model_compiled_bench(res["ceilings"]["copy_bytes_per_s"],
                                                               cases=a.compiled_cases, modes=a.compile_modes,
                                                               mixers=a.decode_mixers, layers=a.decode_layers,
                                                               sets=a.compiled_sets, rounds=a.rounds,
                                                               contexts=a.compiled_contexts)}
    for name in SECTIONS:
        fn = sections[name]
        if name in skip or (name == "softmax_decode" and "softmax" in skip) or (name == "model_decode" and "model" in skip):
            continue
        if a.deadline and time.time() - started > a.deadline:
            log(f"== {name}: skipped, past the {a.deadline:.0f} s deadline")
            continue
        t0 = time.time()
        log(f"== {name}")
        try:
            res[name] = fn()
        except Exception as exc:
            res[name] = {"error": f"{type(exc).__name__}: {exc}"}
            traceback.print_exc()
        res.setdefault("seconds", {})[name] = time.time() - t0
        write_results(res, out, quiet=True)  # partial tables survive a time limit
    print(write_results(res, out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
