"""Agreement harness: run the forms of one op family on the same seeded inputs and measure how far
``chunk`` and ``step`` (applied T times) are from ``recurrent``, forward and backward.

Shared by ``tests/blocks/test_ops.py`` (tolerances) and ``benchmarks/ops_agreement.py`` (the table
quoted in the issue), so both measure exactly the same thing. Errors are relative norms
``||a - b|| / ||b||`` with ``b`` the recurrent reference.
"""
from __future__ import annotations

import dataclasses
import importlib

import torch
import torch.nn.functional as F

from . import FAMILIES
from .utils import l2norm

LINEAR_FAMILIES = tuple(f for f in FAMILIES if f != "softmax")
FORMS = ("recurrent", "chunk", "step")


@dataclasses.dataclass(frozen=True)
class Case:
    """One comparison: a family, a shape and the knobs of its forms.

    ``kv_heads`` and ``window`` apply to ``softmax`` only (there ``state_len`` is the length of the
    initial KV cache); ``decay`` picks the gates: "random" (``logsigmoid`` of a normal),
    "none" (``g = 0``), "strong" (``g = -30``) or a float (that constant ``g``).
    """

    family: str
    T: int
    B: int = 2
    H: int = 2
    K: int = 8
    V: int = 8
    chunk_size: int = 16
    initial_state: bool = True
    seed: int = 0
    decay: str | float = "random"
    kv_heads: int | None = None
    window: int = 0
    state_len: int = 3
    dtype: torch.dtype = torch.float32


def make_inputs(case: Case, device: str | torch.device = "cpu") -> tuple[dict[str, torch.Tensor], object]:
    """Seeded leaf tensors (``requires_grad``) for ``case``: the positional op arguments by name
    (in call order) and the initial state (a tensor, a ``(k_cache, v_cache)`` pair, or None)."""
    gen = torch.Generator().manual_seed(case.seed)
    B, T, H, K, V = case.B, case.T, case.H, case.K, case.V

    def randn(*shape):
        return torch.randn(*shape, generator=gen)

    def decay(*shape):
        if case.decay == "none":
            return torch.zeros(*shape)
        if case.decay == "random":
            return F.logsigmoid(randn(*shape))
        value = -30.0 if case.decay == "strong" else float(case.decay)
        return torch.full(shape, value)

    fam = case.family
    if fam == "softmax":
        Hkv = case.kv_heads or H
        args = {"q": randn(B, T, H, K), "k": randn(B, T, Hkv, K), "v": randn(B, T, Hkv, V)}
        S = case.state_len
        state = (randn(B, S, Hkv, K), randn(B, S, Hkv, V)) if case.initial_state else None
    else:
        args = {"q": randn(B, T, H, K), "k": randn(B, T, H, K), "v": randn(B, T, H, V)}
        if fam in ("delta_rule", "gated_delta_rule"):
            args["k"] = l2norm(args["k"])
        if fam in ("simple_gla", "gated_delta_rule"):
            args["g"] = decay(B, T, H)
        if fam == "gla":
            args["gk"] = decay(B, T, H, K)
        if fam in ("delta_rule", "gated_delta_rule"):
            args["beta"] = torch.sigmoid(randn(B, T, H))
        state = randn(B, H, K, V) if case.initial_state else None

    def leaf(t, low_precision):
        t = t.to(device=device, dtype=case.dtype if low_precision else torch.float32)
        return t.requires_grad_()

    # Gates, beta and the recurrent state stay float32; activations (and the KV cache) take case.dtype.
    args = {name: leaf(t, name in ("q", "k", "v")) for name, t in args.items()}
    if isinstance(state, tuple):
        state = tuple(leaf(t, True) for t in state)
    elif state is not None:
        state = leaf(state, False)
    return args, state


def run_form(case: Case, form: str, args: dict[str, torch.Tensor], state) -> tuple[torch.Tensor, object]:
    """``(o, final_state)`` of ``blocks.ops.<family>.<form>`` on the inputs; ``step`` loops over T."""
    mod = importlib.import_module(f"blocks.ops.{case.family}")
    extra = {"window": case.window} if case.family == "softmax" else {}
    tensors = list(args.values())
    if form == "recurrent":
        return mod.recurrent(*tensors, initial_state=state, output_final_state=True, **extra)
    if form == "chunk":
        if case.family != "softmax":
            extra["chunk_size"] = case.chunk_size
        return mod.chunk(*tensors, initial_state=state, output_final_state=True, **extra)
    if form == "step":
        outs = []
        for t in range(case.T):
            o_t, state = mod.step(*(x[:, t] for x in tensors), state=state, **extra)
            outs.append(o_t)
        return torch.stack(outs, dim=1), state
    raise ValueError(f"form: must be one of {FORMS}, got {form!r}")


def _flat(state) -> list[torch.Tensor]:
    if state is None:
        return []
    return list(state) if isinstance(state, tuple) else [state]


def forward_backward(case: Case, form: str, device="cpu") -> dict[str, torch.Tensor]:
    """Outputs and gradients of one form: ``{"o", "state"[, "state.1"], "grad.<input>"...}``.

    The loss is a fixed random projection of ``o`` and the final state (seeded from the case), so
    every gradient path, including through the final state, is exercised.
    """
    args, state = make_inputs(case, device)
    o, final = run_form(case, form, args, state)
    finals = _flat(final)
    gen = torch.Generator().manual_seed(case.seed + 1)
    loss = (o.float() * torch.randn(o.shape, generator=gen).to(device)).sum()
    for s in finals:
        loss = loss + (s.float() * torch.randn(s.shape, generator=gen).to(device)).sum()
    leaves = dict(args)
    for i, s in enumerate(_flat(state)):
        leaves[f"initial_state.{i}" if isinstance(state, tuple) else "initial_state"] = s
    grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
    out = {"o": o.detach()}
    for i, s in enumerate(finals):
        out["state" if i == 0 else f"state.{i}"] = s.detach()
    for name, gr in zip(leaves, grads):
        out[f"grad.{name}"] = torch.zeros_like(leaves[name]) if gr is None else gr
    return out


def rel_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """``||a - b|| / ||b||`` in float64.

    When the reference ``b`` is exactly zero (e.g. the query gradient of softmax over a single
    key) the RMS of ``a`` is returned instead: an absolute error, since nothing is there to be
    relative to. Inputs here are O(1), so that is on the same scale.
    """
    a, b = a.double(), b.double()
    den = b.norm().item()
    if den == 0.0:
        return (a.norm() / max(a.numel(), 1) ** 0.5).item()
    return (a - b).norm().item() / den


def compare(case: Case, forms: tuple[str, ...] = ("chunk", "step"), device="cpu") -> dict[str, dict[str, float]]:
    """``{form: {tensor name: rel error vs recurrent}}`` for ``case``."""
    ref = forward_backward(case, "recurrent", device)
    result = {}
    for form in forms:
        got = forward_backward(case, form, device)
        if set(got) != set(ref):
            raise AssertionError(f"{case.family}.{form} returned {sorted(got)}, recurrent {sorted(ref)}")
        result[form] = {name: rel_error(got[name], ref[name]) for name in ref}
    return result
