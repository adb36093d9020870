"""Measure a trained model: decode memory, decode/prefill throughput, parameters and FLOPs.

Every number is recorded with the conditions it was taken under (batch, context, dtype, device),
so two records compare only when those agree::

    m = measure(model, MeasureConfig(context=32768, batch=16, prefill_len=2048), device)
    m["decode_memory"]["analytic_bytes"]      # exact KV-cache + recurrent + conv state bytes
    m["throughput"]["decode_tokens_per_s"]    # median over repeats, after warm-up

Decode memory is analytic (``model.state_bytes``: no allocation, so a 32k context costs nothing)
and, on CUDA, also measured: ``torch.cuda.max_memory_allocated`` around a real prefill + decode at
that context, minus what was allocated before (the weights). Where the two differ by more than
10% the record says why in ``gap_note``. The CPU allocator keeps no peak counter, so on CPU the
measured value is null and ``held_check`` instead compares the analytic bytes with the state
tensors actually held after a real prefill at ``prefill_len``.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import statistics
import time
from typing import Any, Mapping

import torch

from archsearch.errors import UserError
from archsearch.train import check_int, config_from_dict

GAP_TOLERANCE = 0.10


@dataclasses.dataclass
class MeasureConfig:
    """What to measure and at which conditions.

    context: decode-memory context (tokens already in the cache), may be huge (analytic).
    batch: sequences decoded together (memory and throughput).
    prefill_len: prompt length L for throughput: prefill L tokens, then decode ``decode_steps``.
    repeats: timed repetitions (median reported) after ``warmup`` untimed ones.
    throughput: measure throughput at all (off: only analytic numbers, no forward passes).
    measure_memory: on CUDA, also run a real decode at ``context`` for the measured peak.
    prefill_chunk: tokens per prefill pass of that real decode (0 = the whole context at once).
    decode_compile: on CUDA, build the captured decode graph with each linear layer through
        ``torch.compile`` (``GraphDecoder(compile=True)``: fewer, fused kernels; ~10-30 s to compile).
    """

    context: int = 2048
    batch: int = 1
    prefill_len: int = 64
    repeats: int = 3
    throughput: bool = True
    decode_steps: int = 16
    warmup: int = 1
    measure_memory: bool = True
    prefill_chunk: int = 2048
    decode_compile: bool = False

    def __post_init__(self) -> None:
        for name in ("context", "batch", "prefill_len", "repeats", "decode_steps"):
            check_int(getattr(self, name), f"measure.{name}", 1)
        for name in ("warmup", "prefill_chunk"):
            check_int(getattr(self, name), f"measure.{name}", 0)
        for name in ("throughput", "measure_memory", "decode_compile"):
            if not isinstance(getattr(self, name), bool):
                raise UserError(f"measure.{name}: must be true or false, got {getattr(self, name)!r}")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> "MeasureConfig":
        return config_from_dict(cls, d, "measure")


# --- conditions --------------------------------------------------------------------------------------
def device_name(device: torch.device | str) -> str:
    """``torch.cuda.get_device_name`` on CUDA, else the CPU model from /proc/cpuinfo."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip() + " (CPU)"
    except OSError:
        pass
    import platform

    return (platform.processor() or platform.machine() or "unknown") + " (CPU)"


def model_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype activations run in: that of the first floating-point parameter."""
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def state_tensor_bytes(states: Any) -> int:
    """Bytes of every tensor held in a (nested) decode state: dicts, lists, tuples of tensors.

    A tensor reachable twice (same storage and offset) counts once.
    """
    seen: set[tuple[int, int, tuple[int, ...]]] = set()
    total = 0

    def visit(x: Any) -> None:
        nonlocal total
        if isinstance(x, torch.Tensor):
            key = (x.untyped_storage().data_ptr(), x.storage_offset(), tuple(x.shape))
            if key not in seen:
                seen.add(key)
                total += x.numel() * x.element_size()
        elif isinstance(x, Mapping):
            for v in x.values():
                visit(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                visit(v)

    visit(states)
    return total


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _prompt(model: torch.nn.Module, batch: int, length: int, device: torch.device, seed: int = 0) -> torch.Tensor:
    """Random token ids ``[batch, length]`` (content does not change state sizes or timings)."""
    g = torch.Generator().manual_seed(seed)
    vocab = model.spec.vocab_size
    return torch.randint(0, vocab, (batch, length), generator=g).to(device)


# --- decode memory -------------------------------------------------------------------------------------
def decode_memory(model: torch.nn.Module, cfg: MeasureConfig, device: torch.device | str) -> dict[str, Any]:
    """Analytic decode-state bytes at ``cfg.context`` x ``cfg.batch``; measured peak on CUDA.

    Returns the record's ``decode_memory`` section: ``context``, ``batch``, ``dtype``,
    ``analytic_bytes``, ``measured_peak_bytes`` (null on CPU), ``gap_note`` (why measured and
    analytic differ by > 10%, or why there is no measurement), plus on CUDA the parts of the
    measurement: ``measured_held_bytes`` (allocated after prefill, states + last logits) and
    ``measured_decode_peak_bytes`` (peak during the decode steps alone).
    """
    device = torch.device(device)
    out = _analytic_memory(model, cfg, model_dtype(model), None)
    if device.type != "cuda":
        out["gap_note"] = "not measured: CPU has no allocator peak counter (analytic only; see held_check)"
        return out
    if not cfg.measure_memory:
        out["gap_note"] = "not measured: measure.measure_memory is off"
        return out
    measured = _measured_cuda_memory(model, cfg, device)
    error = measured.pop("measured_error", None)
    out.update(measured)
    out["gap_note"] = error or _gap_note(out)
    return out


def _analytic_memory(model: torch.nn.Module, cfg: MeasureConfig, dtype: torch.dtype,
                     note: str | None) -> dict[str, Any]:
    """The ``decode_memory`` section before any measurement: analytic bytes at ``dtype``."""
    return {"context": cfg.context, "batch": cfg.batch, "dtype": dtype_name(dtype),
            "analytic_bytes": int(model.state_bytes(cfg.batch, cfg.context, dtype)),
            "measured_peak_bytes": None, "gap_note": note}


@torch.no_grad()
def prefill_chunked(model: torch.nn.Module, prompt: torch.Tensor, chunk: int) -> tuple[torch.Tensor, Any]:
    """``model.prefill`` in passes of ``chunk`` tokens carrying the states: ``prompt [B, T]`` ->
    (last logits ``[B, V]``, states). Same result as one pass; activations of one chunk only."""
    states = None
    for start in range(0, prompt.shape[1], chunk):
        logits, states = model(prompt[:, start:start + chunk], states)
    return logits[:, -1].clone(), states  # clone: drop the chunk's [B, chunk, V] logits


@torch.no_grad()
def _measured_cuda_memory(model: torch.nn.Module, cfg: MeasureConfig, device: torch.device) -> dict[str, Any]:
    """Real prefill + decode reaching exactly ``cfg.context`` tokens, with the allocator's peak.

    The prompt is prefilled in chunks of ``cfg.prefill_chunk`` tokens (carrying the states), as a
    serving stack would: one 32k-token pass would hold [B, 32k, vocab] logits, which measures the
    prefill's activations rather than the decode state.
    """
    was_training = model.training
    model.eval()
    steps = min(cfg.decode_steps, cfg.context - 1)
    try:
        prompt = _prompt(model, cfg.batch, cfg.context - steps, device)
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated(device)  # weights + the prompt ids
        torch.cuda.reset_peak_memory_stats(device)
        chunk = cfg.prefill_chunk or prompt.shape[1]
        logits, states = prefill_chunked(model, prompt, chunk)
        torch.cuda.synchronize(device)
        prefill_peak = torch.cuda.max_memory_allocated(device) - base
        held = torch.cuda.memory_allocated(device) - base
        torch.cuda.reset_peak_memory_stats(device)
        token = logits.argmax(-1)
        for _ in range(steps):
            logits, states = model.decode_step(token, states)
            token = logits.argmax(-1)
        torch.cuda.synchronize(device)
        decode_peak = torch.cuda.max_memory_allocated(device) - base
        state_held = state_tensor_bytes(states)
        del logits, states, token, prompt
    except torch.OutOfMemoryError as exc:
        return {"measured_error": f"out of memory during the measured decode: {str(exc).splitlines()[0][:200]}"}
    finally:
        model.train(was_training)
        torch.cuda.empty_cache()
    return {
        "measured_peak_bytes": int(max(prefill_peak, decode_peak)),
        "measured_prefill_peak_bytes": int(prefill_peak),
        "measured_decode_peak_bytes": int(decode_peak),
        "measured_held_bytes": int(held),
        "measured_state_tensor_bytes": int(state_held),
        "measured_prefill_chunk": int(chunk),
        "measured_decode_steps": int(steps),
    }


def _gap_note(m: Mapping[str, Any]) -> str | None:
    """Explain a >10% gap between measured peak and analytic bytes from the parts of the measurement."""
    analytic, peak = m["analytic_bytes"], m["measured_peak_bytes"]
    if analytic and abs(peak - analytic) <= GAP_TOLERANCE * analytic:
        return None
    mib = 1 / 2**20
    parts = [f"measured peak {peak * mib:.1f} MiB vs analytic {analytic * mib:.1f} MiB"]
    prefill_extra = m["measured_prefill_peak_bytes"] - m["measured_held_bytes"]
    if m["measured_prefill_peak_bytes"] >= m["measured_decode_peak_bytes"] and prefill_extra > 0:
        parts.append(f"the peak is in prefill: {prefill_extra * mib:.1f} MiB of transient activations "
                     "(projections, chunked-scan intermediates, SDPA workspace, full-sequence logits)")
    else:
        extra = m["measured_decode_peak_bytes"] - m["measured_held_bytes"]
        parts.append(f"the peak is in decode: {extra * mib:.1f} MiB above the held states "
                     "(per-step workspace; KV caches grown by concatenation hold old and new copy)")
    held_gap = m["measured_held_bytes"] - analytic
    parts.append(f"held after prefill {m['measured_held_bytes'] * mib:.1f} MiB "
                 f"({held_gap * mib:+.1f} MiB vs analytic: last-position logits, allocator 512-byte rounding)")
    return "; ".join(parts)


def held_check(model: torch.nn.Module, states: Any, batch: int, context: int) -> dict[str, Any]:
    """Compare ``model.state_bytes`` with the state tensors actually held after a prefill of ``context``."""
    analytic = int(model.state_bytes(batch, context, model_dtype(model)))
    held = state_tensor_bytes(states)
    return {"batch": batch, "context": context, "analytic_bytes": analytic, "held_bytes": held,
            "match": analytic == held}


# --- throughput ----------------------------------------------------------------------------------------
def _decode_graph_stepper(model: torch.nn.Module, states: Any, token: torch.Tensor, capacity: int,
                          compile: bool = False):
    """``archsearch.decode_graph.capture``: the whole decode step as one CUDA graph, as a greedy
    stepper ``token [B] -> next token [B]`` starting from ``states``; None where the module is absent."""
    if importlib.util.find_spec("archsearch.decode_graph") is None:
        return None
    from archsearch import decode_graph

    return decode_graph.capture(model, states, token, capacity=capacity, compile=compile)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:200] if text else ''}"


@torch.no_grad()
def throughput(model: torch.nn.Module, cfg: MeasureConfig, device: torch.device | str) -> dict[str, Any]:
    """Prefill and decode tokens/s at ``cfg.batch`` x ``cfg.prefill_len`` on ``device``.

    Each repetition prefills a fresh prompt ``[B, L]`` (timed: prefill tokens/s = B*L / t) and then
    runs ``decode_steps`` greedy decode steps from that state (timed: decode tokens/s = B*N / t).
    On CUDA the decode steps replay ``archsearch.decode_graph``'s captured graph (capture not
    timed), with ``cfg.decode_compile`` its compiled form; ``decode_mode`` says which ran
    (``cuda_graph_compiled``, ``cuda_graph`` or ``eager``), ``decode_graph_error`` why the one
    asked for did not (a failed compile falls back to the plain graph). ``warmup`` untimed
    repetitions first (allocator, kernel autotune, graph capture); the median of ``repeats`` is
    reported. Also returns ``held_check`` from the first prefill.
    """
    device = torch.device(device)
    was_training = model.training
    model.eval()
    prefill_s: list[float] = []
    decode_s: list[float] = []
    mode = "eager"
    graph_error = None
    step = None
    tried = compiled = False
    check = None
    try:
        for rep in range(cfg.warmup + cfg.repeats):
            prompt = _prompt(model, cfg.batch, cfg.prefill_len, device, seed=rep)
            _sync(device)
            t0 = time.perf_counter()
            logits, states = model.prefill(prompt)
            _sync(device)
            t_prefill = time.perf_counter() - t0
            if check is None:
                check = held_check(model, states, cfg.batch, cfg.prefill_len)
            token = logits.argmax(-1)
            if device.type == "cuda" and (step is not None or not tried):
                tried = True
                try:
                    if step is None:  # capture once; later repetitions load their states into it
                        # KV capacity exactly what the steps need: SDPA's path reads every slot
                        # (the attention kernel only those written so far).
                        capacity = cfg.prefill_len + cfg.decode_steps
                        if cfg.decode_compile:
                            try:
                                step = _decode_graph_stepper(model, states, token, capacity, compile=True)
                                compiled = step is not None
                            except Exception as exc:  # Inductor cannot compile a block: plain graph
                                graph_error = "compile: " + _one_line(exc)
                        if step is None:
                            step = _decode_graph_stepper(model, states, token, capacity)
                    else:
                        step.decoder.load(states, cfg.prefill_len)
                except Exception as exc:  # a block the graph cannot capture: measure eagerly, say why
                    graph_error = "; ".join(filter(None, [graph_error, _one_line(exc)]))
                    step = None
            _sync(device)
            t1 = time.perf_counter()
            if step is not None:
                mode = "cuda_graph_compiled" if compiled else "cuda_graph"
                for _ in range(cfg.decode_steps):
                    token = step(token)
            else:
                if mode != "eager":  # the graph failed after timed repetitions: keep one mode's times
                    prefill_s.clear()
                    decode_s.clear()
                    mode = "eager"
                for _ in range(cfg.decode_steps):
                    logits, states = model.decode_step(token, states)
                    token = logits.argmax(-1)
            _sync(device)
            t_decode = time.perf_counter() - t1
            if rep >= cfg.warmup:
                prefill_s.append(t_prefill)
                decode_s.append(t_decode)
    finally:
        model.train(was_training)
    pre, dec = statistics.median(prefill_s), statistics.median(decode_s)
    return {
        "device": device_name(device),
        "device_type": device.type,
        "dtype": dtype_name(model_dtype(model)),
        "decode_tokens_per_s": cfg.batch * cfg.decode_steps / dec,
        "prefill_tokens_per_s": cfg.batch * cfg.prefill_len / pre,
        "batch": cfg.batch,
        "context": cfg.prefill_len,
        "decode_steps": cfg.decode_steps,
        "repeats": cfg.repeats,
        "warmup": cfg.warmup,
        "decode_mode": mode,
        "decode_graph_error": graph_error,
        "decode_step_ms": 1e3 * dec / cfg.decode_steps,
        "prefill_ms": 1e3 * pre,
        "threads": torch.get_num_threads() if device.type == "cpu" else None,
        "held_check": check,
    }


def analytic(model: torch.nn.Module, cfg: MeasureConfig, why: str,
             dtype: torch.dtype | None = None) -> dict[str, Any]:
    """The numbers that need no forward pass (params, FLOPs, analytic state bytes at ``dtype``,
    default the model's); ``model`` may live on the meta device. ``why`` says why nothing was
    measured (e.g. the trial diverged)."""
    mem = _analytic_memory(model, cfg, dtype or model_dtype(model), f"not measured: {why}")
    from archsearch.record import empty_throughput

    return {"params": int(model.num_params()), "flops_per_token": int(model.flops_per_token(cfg.context)),
            "decode_memory": mem, "throughput": empty_throughput(cfg.batch, cfg.prefill_len)}


# --- all of it -------------------------------------------------------------------------------------------
def measure(model: torch.nn.Module, cfg: MeasureConfig, device: torch.device | str) -> dict[str, Any]:
    """Every measurement of the record: ``params``, ``flops_per_token``, ``decode_memory``, ``throughput``."""
    out: dict[str, Any] = {
        "params": int(model.num_params()),
        "flops_per_token": int(model.flops_per_token(cfg.context)),
        "decode_memory": decode_memory(model, cfg, device),
    }
    if cfg.throughput:
        out["throughput"] = throughput(model, cfg, device)
    else:
        from archsearch.record import empty_throughput

        out["throughput"] = empty_throughput(cfg.batch, cfg.prefill_len)
        out["throughput"]["device"] = device_name(device)
    return out

