"""Shared pieces of the GPU benchmarks: the problem shapes, random inputs per family, timing.

Timing follows the device notes: CUDA events, warm-up first (Triton compiles, library handles),
median of repeats, random data (never zeros). A call slower than ``SLOW_S`` is timed only a few
times: the PyTorch fallbacks take seconds at long sequences and the GPU lease is short.
"""
from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

TOKENS = 65536  # tokens per batch: B = TOKENS // T
HEADS = 16
HEAD_DIM = 128
LENGTHS = (512, 1024, 2048, 4096, 8192, 16384, 32768)
LINEAR_FAMILIES = ("linear_attn", "simple_gla", "gla", "delta_rule", "gated_delta_rule")
SLOW_S = 0.25


def comma_ints(text: str) -> list[int] | None:
    """``"4,8,16"`` -> ``[4, 8, 16]`` (empty items skipped); None if an item is not an integer.
    The scripts' options say in their own one-line error what they expected."""
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        return None


def keep_gpu_busy() -> None:
    """Queue ~25 ms of GPU time (a sleep kernel at the H200's clock), so that the host launching
    after it never waits for the GPU: what the host-time measurements time is the host alone."""
    torch.cuda._sleep(50_000_000)


def host_seconds(fn: Callable[[], object], reps: int, first_after_sync: bool = True) -> float:
    """Median host seconds of one ``fn()`` while the GPU is kept busy (``keep_gpu_busy``), so that
    the host never waits for it. ``first_after_sync``: each call is the first after a synchronize,
    as a step from an idle GPU starts (``train_ab.py``'s host column); else the calls run back to
    back behind one sleep kernel per third of them, as in a training loop's steady state
    (``triton_launch_cost.py``). The two differ: a delta_rule step took 1.7-2.2 ms the first way and
    1.1-1.2 ms the second on the H200 host (2026-12-01)."""
    batches, per_batch = (reps, 1) if first_after_sync else (3, reps // 3 + 1)
    out = []
    for _ in range(batches):
        torch.cuda.synchronize()
        keep_gpu_busy()
        for _ in range(per_batch):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return statistics.median(out)


def write_report(script: str, title: str, body: str, rows: list, out: str, argv: list[str] | None = None,
                 extra: str = "") -> str:
    """A benchmark script's report: ``# {title} ({GPU}, {UTC time}{extra})``, the command that made it
    (``python benchmarks/{script}.py`` with ``argv``, else the process's own arguments) and ``body``
    (markdown). Printed; with ``out``, also written there as ``{script}.md`` and ``{script}.json``
    (``{"device", "rows"}``). Returns the markdown."""
    device = torch.cuda.get_device_name()
    args = " ".join(sys.argv[1:] if argv is None else argv)
    md = (f"# {title} ({device}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}{extra})\n\n"
          f"Command: `python benchmarks/{script}.py {args}`\n\n{body}\n")
    print(md)
    if out:
        folder = Path(out)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{script}.json").write_text(json.dumps({"device": device, "rows": rows}, indent=1))
        (folder / f"{script}.md").write_text(md)
    return md


def checked_families(ap, text: str) -> list[str]:
    """The scripts' ``--families`` value (``linear_families``), at least one; else argparse's
    one-line error through ``ap.error`` (which exits)."""
    try:
        families = linear_families(text)
    except ValueError as exc:
        ap.error(str(exc))
    if not families:
        ap.error("--families: name at least one family")
    return families


def checked_lengths(ap, text: str, flag: str = "--lengths", whole_batches: bool = False) -> list[int]:
    """A comma list of sequence lengths (``flag``'s value); ``whole_batches``: each from 64 and a
    divisor of ``TOKENS`` (so that a batch holds exactly ``TOKENS`` tokens). Else argparse's one-line
    error through ``ap.error``."""
    lengths = comma_ints(text)
    if whole_batches and lengths and any(T < 64 or TOKENS % T for T in lengths):
        lengths = None
    if not lengths or any(T < 1 for T in lengths):
        what = f"lengths from 64 that divide {TOKENS}" if whole_batches else "positive integers"
        ap.error(f"{flag}: expected a comma list of {what}, got {text!r}")
    return lengths


def linear_families(text: str) -> list[str]:
    """``"gla,delta_rule"`` -> ``["gla", "delta_rule"]`` (empty items skipped); a family outside
    ``LINEAR_FAMILIES`` raises ValueError with the line the scripts' ``--families`` error shows."""
    families = [f.strip() for f in text.split(",") if f.strip()]
    bad = [f for f in families if f not in LINEAR_FAMILIES]
    if bad:
        raise ValueError(f"--families: unknown {bad}; choose from {', '.join(LINEAR_FAMILIES)}")
    return families


def cuda_time(fn: Callable[[], object], budget_s: float = 0.6, max_iters: int = 50,
              queued: bool = False) -> tuple[float, int]:
    """Median seconds of ``fn()`` over CUDA events, after one warm-up call; ``(seconds, iters)``.
    Each call starts on an idle GPU (the host's time to its first kernel counts), unless ``queued``:
    then the calls are launched back to back, as a training loop does, and the host may run ahead
    of the GPU (what counts is GPU time and any gap the host leaves between kernels)."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    iters = 2 if first > SLOW_S else max(3, min(max_iters, int(budget_s / max(first, 1e-6))))
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for start, end in pairs:
        start.record()
        fn()
        end.record()
        if not queued:
            end.synchronize()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) / 1e3 for start, end in pairs), iters


def copy_bandwidth() -> float:
    """Bytes per second of a device-to-device copy of 2 GiB each way (far beyond the 60 MB L2): the
    benchmarks' memory ceiling (the decode roofline, the training kernels' DRAM floor)."""
    x = torch.randn(1 << 30, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    t, _ = cuda_time(lambda: y.copy_(x))
    return 2 * x.numel() * x.element_size() / t


def gpu_state() -> dict:
    """The current GPU's SM clock (MHz), temperature (C) and power draw (W) from NVML
    (``nvidia-ml-py``, on the H200 host), ``{}`` where NVML or the package is missing: what a
    throughput that drifts within one run went with (compute-bound steps slow down as the clock
    falls under sustained load; memory-bound ones do not)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        index = int(visible.split(",")[torch.cuda.current_device()]) if visible[:1].isdigit() else torch.cuda.current_device()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        return {"sm_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
                "temp_c": pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU),
                "power_w": pynvml.nvmlDeviceGetPowerUsage(handle) / 1000}
    except Exception:  # noqa: BLE001 - no NVML (CPU machine, another vendor, no package): no readings
        return {}


def train_times(fn: Callable[[], object]) -> dict:
    """One training step's throughput timed both ways (``cuda_time``), side by side: ``s`` /
    ``mtok_s`` from an idle GPU each step (how every table before 2026-12-01 was measured) and
    ``queued_s`` / ``queued_mtok_s`` with the steps back to back."""
    sec, iters = cuda_time(fn)
    queued, _ = cuda_time(fn, queued=True)
    return {"s": sec, "mtok_s": TOKENS / sec / 1e6, "iters": iters,
            "queued_s": queued, "queued_mtok_s": TOKENS / queued / 1e6}


def graph_time(fn: Callable[[], object], steps: int = 20, reps: int = 10) -> float:
    """Seconds per call of ``fn`` with launch overhead removed: ``steps`` calls captured in one CUDA
    graph, replayed ``reps`` times; median replay time / steps."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(steps):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / steps)
    return statistics.median(times)


def train_inputs(family: str, B: int, T: int, H: int = HEADS, D: int = HEAD_DIM,
                 dtype: torch.dtype = torch.bfloat16, device: str = "cuda", seed: int = 0) -> dict:
    """Random op inputs for one family in fla layout (``[B, T, H, D]``), all requiring grad.

    Keys are l2-normalised for the delta rules (their contract), decays are ``logsigmoid`` of
    random logits (per head for the scalar families, per key channel, milder, for ``gla``).
    """
    gen = torch.Generator(device=device).manual_seed(seed)

    def rnd(*shape, dt=dtype):
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32).to(dt)

    q, k, v = rnd(B, T, H, D), rnd(B, T, H, D), rnd(B, T, H, D)
    args: dict = {}
    if family in ("delta_rule", "gated_delta_rule"):
        q, k = F.normalize(q.float(), dim=-1).to(dtype), F.normalize(k.float(), dim=-1).to(dtype)
    else:
        q, k = q * D ** -0.25, k * D ** -0.25
    args.update(q=q, k=k, v=v)
    if family in ("simple_gla", "gated_delta_rule"):
        args["g"] = F.logsigmoid(rnd(B, T, H, dt=torch.float32) + 3.0)
    if family == "gla":
        args["gk"] = F.logsigmoid(rnd(B, T, H, D, dt=torch.float32) + 3.0) / 4
    if family in ("delta_rule", "gated_delta_rule"):
        args["beta"] = torch.sigmoid(rnd(B, T, H, dt=torch.float32))
    for t in args.values():
        t.requires_grad_(True)
    return args


def op_module(family: str):
    """``blocks.ops.<family>``: the op whose ``chunk`` dispatches to the kernel on CUDA, or its PyTorch
    form (inside ``blocks.kernels.disabled()`` or without a kernel)."""
    import importlib

    return importlib.import_module(f"blocks.ops.{family}")


def positional(family: str, args: dict) -> list:
    """The op's positional arguments in its order: ``q, k, v`` then ``g``/``gk``/``beta``."""
    extra = {"linear_attn": (), "simple_gla": ("g",), "gla": ("gk",), "delta_rule": ("beta",),
             "gated_delta_rule": ("g", "beta")}[family]
    return [args["q"], args["k"], args["v"]] + [args[n] for n in extra]


def fwd_bwd(call: Callable[[], torch.Tensor], inputs: list[torch.Tensor]) -> Callable[[], None]:
    """A closure running ``call()`` and the backward of ``sum(o * do)`` into ``inputs`` (no .grad
    accumulation, so repeated calls cost the same)."""
    state: dict = {}

    def run() -> None:
        o = call()
        if "do" not in state:
            state["do"] = torch.randn_like(o)
        torch.autograd.grad(o, inputs, state["do"])

    return run


def step_inputs(family: str, B: int = 16, H: int = HEADS, D: int = HEAD_DIM, device: str = "cuda",
                dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> dict:
    """Random decode-step inputs: ``q, k: [B, H, D]``, ``v: [B, H, D]``, gates, state ``[B, H, D, D]`` fp32."""
    gen = torch.Generator(device=device).manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32)

    k = F.normalize(rnd(B, H, D), dim=-1)
    args = dict(q=rnd(B, H, D).to(dtype), k=k.to(dtype), v=rnd(B, H, D).to(dtype), state=0.1 * rnd(B, H, D, D))
    if family in ("simple_gla", "gated_delta_rule"):
        args["g"] = F.logsigmoid(rnd(B, H) + 3.0)
    if family == "gla":
        args["gk"] = F.logsigmoid(rnd(B, H, D) + 3.0)
    if family in ("delta_rule", "gated_delta_rule"):
        args["beta"] = torch.sigmoid(rnd(B, H))
    return args


# the module tables ``apply_sets`` edits entry by entry (``switched`` restores them)
TABLES = ("CONFIGS", "PREFETCH_TILES")


def switch_modules() -> list:
    """The modules with ``SWITCHES``: each family's chunk kernels, the decode mixer, the decode
    layers' skinny kernels, the softmax layers' decode attention kernel and the decode graph
    (``ROPE_CACHE_KERNEL``, ``ATTEND_KERNEL``)."""
    from archsearch import decode_graph
    from blocks.kernels import KERNEL_MODULES, decode_attention, decode_mixer, kernel_module, skinny

    mods = list(dict.fromkeys([kernel_module(f) for f in KERNEL_MODULES]
                              + [decode_mixer, skinny, decode_attention, decode_graph]))
    return [m for m in mods if getattr(m, "SWITCHES", None)]


@contextlib.contextmanager
def switched(text: str):
    """``apply_sets(text)`` inside the block (yields its result), every switch as before after it."""
    saved = [(m, name, getattr(m, name)) for m in switch_modules() for name in m.SWITCHES]
    tables = [(table, dict(table)) for m in switch_modules() for name in TABLES
              if isinstance(table := getattr(m, name, None), dict)]
    try:
        yield apply_sets(text)
    finally:
        for mod, name, value in saved:
            setattr(mod, name, value)
        for table, copy in tables:
            table.clear()
            table.update(copy)


def apply_sets(text: str) -> dict:
    """``--set "KEEP_H=False,BWD_SUB_BK=128"``: give module switches these values before anything
    is timed (the base all variants are compared with), in every kernel module that has the switch;
    e.g. to sweep the launch of a kernel that only runs with a switch on. Values are parsed as
    Python literals (``True``, ``128``), else kept as strings. ``CONFIGS.KEY=64/256/4/4/4``: an
    entry of a module's launch-configuration table (``skinny.CONFIGS``), its integers separated
    by ``/`` (commas separate the items); ``PREFETCH_TILES.KEY=8``: an entry of a table of
    integers per GEMM (``skinny.PREFETCH_TILES``; one not there yet is added). Returns ``{name: value}``."""
    import ast

    done: dict = {}
    for item in filter(None, text.split(",")):
        name, sep, raw = item.partition("=")
        if not sep:
            raise ValueError(f"--set: expected NAME=VALUE, got {item!r}")
        if name.startswith("CONFIGS."):
            done[name] = _set_config(name.partition(".")[2], raw)
            continue
        if name.startswith("PREFETCH_TILES."):
            done[name] = _set_prefetch(name.partition(".")[2], raw)
            continue
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            value = raw
        mods = [m for m in switch_modules() if name in m.SWITCHES]
        if not mods:
            raise ValueError(f"--set: {name} is not a switch of any kernel module")
        for mod in mods:
            if not any(type(value) is type(v) and value == v for v in mod.SWITCHES[name]):  # 1 is not True
                raise ValueError(f"--set: {name} takes {mod.SWITCHES[name]}, got {value!r}")
            setattr(mod, name, value)
        done[name] = value
    return done


def _set_config(key: str, raw: str) -> tuple[int, ...]:
    """``apply_sets``' ``CONFIGS.KEY=a/b/c``: that entry of every switch module's ``CONFIGS`` that has
    it, as a tuple of as many integers as it has now."""
    tables = [m.CONFIGS for m in switch_modules() if key in getattr(m, "CONFIGS", {})]
    if not tables:
        raise ValueError(f"--set: CONFIGS.{key} is not an entry of any kernel module's CONFIGS")
    try:
        value = tuple(int(v) for v in raw.split("/"))
    except ValueError:
        value = ()
    if any(len(value) != len(t[key]) or min(value) < 1 for t in tables):
        raise ValueError(f"--set: CONFIGS.{key} takes {len(tables[0][key])} positive integers separated by '/' "
                         f"(now {'/'.join(map(str, tables[0][key]))}), got {raw!r}")
    for table in tables:
        table[key] = value
    return value


def _set_prefetch(key: str, raw: str) -> int:
    """``apply_sets``' ``PREFETCH_TILES.KEY=N``: ``skinny.PREFETCH_TILES[KEY] = N`` for a key of
    ``skinny.CONFIGS`` (the GEMM whose prefetch depth it sets)."""
    from blocks.kernels import skinny

    if key not in skinny.CONFIGS:
        raise ValueError(f"--set: PREFETCH_TILES.{key}: {key!r} is not a GEMM of skinny.CONFIGS "
                         f"({', '.join(skinny.CONFIGS)})")
    if not (raw.lstrip("-").isdigit() and skinny.prefetch_depth_ok(int(raw))):
        raise ValueError(f"--set: PREFETCH_TILES.{key} takes 0 or a power of two (K tiles), got {raw!r}")
    skinny.PREFETCH_TILES[key] = int(raw)
    return int(raw)


def kernel_settings() -> dict:
    """``{module: {"switches": {NAME: value}, "launch": LAUNCH, "walk_min_per_sm": N}}`` of the
    chunk-kernel modules as they stand: what a benchmark or sweep ran with (the switches change
    which kernels run; ``walk_min_per_sm`` is the walks' V-block rule, ``tiles.walk_bv``), and
    ``decode_mixer``'s and ``decode_layer``'s ``{"switches": {"ENABLED": ...}}`` and
    ``decode_graph``'s ``ROPE_CACHE_KERNEL`` and ``ATTEND_KERNEL`` (which kernels a decode step
    runs) and ``decode_attention``'s launch switches."""
    import importlib

    from archsearch import decode_graph, decode_layer
    from blocks.kernels import KERNEL_MODULES, decode_attention, decode_mixer, skinny, tiles

    out = {}
    for name in dict.fromkeys(KERNEL_MODULES.values()):
        mod = importlib.import_module(f"blocks.kernels.{name}")
        out[name] = {"switches": {k: getattr(mod, k) for k in getattr(mod, "SWITCHES", {})},
                     "launch": {k: dict(v) for k, v in mod.LAUNCH.items()},
                     "walk_min_per_sm": getattr(mod, "WALK_MIN_PER_SM", tiles.WALK_MIN_PER_SM)}
    def switches(mod) -> dict:
        return {k: getattr(mod, k) for k in mod.SWITCHES}

    out["decode_mixer"] = {"switches": {"ENABLED": decode_mixer.ENABLED, **switches(decode_mixer)}}
    out["skinny"] = {"switches": switches(skinny), "configs": {k: list(v) for k, v in skinny.CONFIGS.items()},
                     "prefetch_tiles": dict(skinny.PREFETCH_TILES)}
    out["decode_layer"] = {"switches": {"ENABLED": decode_layer.ENABLED}}
    out["decode_graph"] = {"switches": switches(decode_graph)}
    out["decode_attention"] = {"switches": switches(decode_attention)}
    return out


def switches_line(settings: dict) -> str:
    """``scalar_decay: KEEP_H=False; gla: ...; delta: ...`` from ``kernel_settings()``."""
    def items(s: dict) -> list[str]:
        walk = [f"walk_min_per_sm={s['walk_min_per_sm']}"] if "walk_min_per_sm" in s else []
        return [f"{k}={v}" for k, v in s["switches"].items()] + walk

    return "; ".join(f"{m}: " + ", ".join(items(s)) for m, s in settings.items() if s["switches"])
