"""The Block contract as executable checks, parametrised from the registry.

Every registered block is checked on each config its class declares in ``example_configs()``
(and on each bad config of ``bad_configs()``), so a newly registered block is tested without
editing any list. ``tests/blocks/test_contract.py`` runs these under pytest; a block author can
also run them directly::

    python -m blocks.contract [NAME ...] [--device cuda]

Checks (float32, ``d_model = D_MODEL``, CPU unless ``device=`` says otherwise, blocks in eval
mode so random features are not redrawn):

* ``check_pieces``        a sequence fed in random pieces (including T=1 steps) carrying the state
                          gives the output, final state and gradients (input and parameters) of one pass
* ``check_decode``        token-by-token decode from an empty state equals one pass
* ``check_recurrent``     mode "recurrent" (the ops' reference loops) equals mode "chunk", forward,
                          state and backward (blocks with a ``mode`` config field)
* ``check_state_bytes``   ``state_bytes(B, context, dtype)`` equals ``held_state_bytes`` of the state
                          actually returned, for several contexts, float32 and bfloat16
* ``check_state_immutable`` a forward leaves the state it was given unchanged
* ``check_batch_independent`` each batch row's output depends on that row only
* ``check_params_receive_grad`` every trainable parameter gets a non-zero gradient
* ``check_bad_config``    each declared bad config raises ``ConfigError`` whose message starts with
                          the expected field
* ``check_num_params``    ``num_params()`` equals the sum of parameter numels
* ``check_letter``        ``letter`` is one character, unique in the registry
"""
from __future__ import annotations

import dataclasses
import sys
import zlib
from typing import Any, Callable

import torch

from . import registry
from .base import Block, ConfigError, State

D_MODEL = 32
BATCH = 2
SEQ_LEN = 23
# Small chunks so the chunked forms cross several chunk boundaries in a 23-token sequence.
CHUNK_SIZE = 8
# Comparisons pass when max|a - b| <= TOL * (1 + max|b|) (float32 rounding, amplified a little by
# the deeper reductions of the chunked forms).
TOL = 2e-4
TOL_CUDA = 2e-3


@dataclasses.dataclass(frozen=True)
class Case:
    """One block config under test: ``build()`` makes the block."""

    name: str
    config_id: str
    config: dict[str, Any]

    @property
    def id(self) -> str:
        return f"{self.name}[{self.config_id}]"

    @property
    def cls(self) -> type[Block]:
        return registry.get(self.name)

    def build(self, device: str = "cpu", **overrides) -> Block:
        config = {**self.full_config(), **overrides}
        return registry.build(self.name, d_model=D_MODEL, **config).eval().to(device)

    def full_config(self) -> dict[str, Any]:
        """The declared config plus ``chunk_size=CHUNK_SIZE`` where the block has that field."""
        fields = {f.name for f in dataclasses.fields(self.cls.Config)}
        if "chunk_size" in fields and "chunk_size" not in self.config:
            return {**self.config, "chunk_size": CHUNK_SIZE}
        return dict(self.config)

    def seed(self, salt: str = "") -> int:
        return zlib.crc32(f"{self.id}/{salt}".encode())


def cases(names: list[str] | None = None) -> list[Case]:
    """Every (block, example config) pair from the registry (or from ``names``)."""
    out = []
    for name in names or registry.names():
        cls = registry.get(name)
        configs = getattr(cls, "example_configs", lambda: {"default": {}})()
        for cid, cfg in configs.items():
            out.append(Case(name, cid, dict(cfg)))
    return out


def bad_config_cases(names: list[str] | None = None) -> list[tuple[str, dict[str, Any], str]]:
    """``(block name, bad config, field the error must name)``; every block also gets an unknown field."""
    out = []
    for name in names or registry.names():
        cls = registry.get(name)
        declared = list(getattr(cls, "bad_configs", lambda: [])())
        for cfg, field in declared + [({"no_such_field": 1}, "no_such_field")]:
            out.append((name, dict(cfg), field))
    return out


# ----------------------------------------------------------------------------------------------
class ContractError(AssertionError):
    """A block broke the contract; the message says which check, config and tensor."""


def assert_close(what: str, a: torch.Tensor, b: torch.Tensor, tol: float = TOL) -> None:
    if a.shape != b.shape:
        raise ContractError(f"{what}: shape {tuple(a.shape)} != {tuple(b.shape)}")
    a, b = a.detach().double(), b.detach().double()
    if not torch.isfinite(a).all() or not torch.isfinite(b).all():
        raise ContractError(f"{what}: non-finite values")
    err, ref = (a - b).abs().max().item() if a.numel() else 0.0, b.abs().max().item() if b.numel() else 0.0
    if err > tol * (1.0 + ref):
        raise ContractError(f"{what}: max abs diff {err:.3g} > {tol:g} * (1 + max|ref| = {ref:.3g})")


def assert_states_close(what: str, a: State, b: State, tol: float = TOL) -> None:
    if set(a) != set(b):
        raise ContractError(f"{what}: state keys {sorted(a)} != {sorted(b)}")
    for key in a:
        assert_close(f"{what} state[{key!r}]", a[key].float() if a[key].is_floating_point() else a[key],
                     b[key].float() if b[key].is_floating_point() else b[key], tol)


def _input(case: Case, T: int = SEQ_LEN, salt: str = "x", device: str = "cpu") -> torch.Tensor:
    g = torch.Generator().manual_seed(case.seed(salt))
    return torch.randn(BATCH, T, D_MODEL, generator=g).to(device)


def _pieces(case: Case, T: int) -> list[int]:
    """Random piece lengths summing to T, with several single-token pieces."""
    g = torch.Generator().manual_seed(case.seed("pieces"))
    sizes, left = [], T
    while left:
        n = 1 if torch.rand((), generator=g) < 0.4 else int(torch.randint(2, 10, (), generator=g))
        n = min(n, left)
        sizes.append(n)
        left -= n
    return sizes


def _run(block: Block, x: torch.Tensor, sizes: list[int]) -> tuple[torch.Tensor, State]:
    ys, state, t = [], None, 0
    for n in sizes:
        y, state = block(x[:, t:t + n], state)
        ys.append(y)
        t += n
    return torch.cat(ys, dim=1), state


def _grads(block: Block, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> dict[str, torch.Tensor]:
    params = dict(block.named_parameters())
    gs = torch.autograd.grad((y * w).sum(), [x, *params.values()], allow_unused=True)
    out = {"input": gs[0]}
    for (n, p), gp in zip(params.items(), gs[1:]):
        out[f"param {n}"] = gp if gp is not None else torch.zeros_like(p)
    return out


def _tolerance(case: Case, device: str = "cpu") -> float:
    # CUDA: kernels and SDPA backends reduce in other orders (and may use TF32 inside matmuls).
    tol = TOL if torch.device(device).type == "cpu" else TOL_CUDA
    fn = getattr(case.cls, "contract_tolerance", None)
    return tol if fn is None else max(tol, fn(case.config, tol))


# ----------------------------------------------------------------------------------------------
def check_pieces(case: Case, device: str = "cpu") -> None:
    """Pieces (random sizes, T=1 steps included) carrying the state == one pass, fwd and bwd."""
    torch.manual_seed(case.seed("init"))
    block = case.build(device)
    tol = _tolerance(case, device)
    x = _input(case, device=device).requires_grad_(True)
    w = _input(case, salt="w", device=device)
    y_ref, s_ref = block(x)
    sizes = _pieces(case, SEQ_LEN)
    y, s = _run(block, x, sizes)
    _assert_runs_agree(f"{case.id} pieces {sizes}", tol, (y, s, _grads(block, x, y, w)),
                       (y_ref, s_ref, _grads(block, x, y_ref, w)))


def check_decode(case: Case, device: str = "cpu") -> None:
    """One token at a time from an empty state == one pass (outputs and final state)."""
    torch.manual_seed(case.seed("init"))
    block = case.build(device)
    x = _input(case, T=12, device=device)
    with torch.no_grad():
        y_ref, s_ref = block(x)
        y, s = _run(block, x, [1] * x.shape[1])
    assert_close(f"{case.id} decode output", y, y_ref, _tolerance(case, device))
    assert_states_close(f"{case.id} decode", s, s_ref, _tolerance(case, device))


def has_mode(case: Case) -> bool:
    return "mode" in {f.name for f in dataclasses.fields(case.cls.Config)}


def check_recurrent(case: Case, device: str = "cpu") -> None:
    """Mode "recurrent" (reference loops) == mode "chunk": output, state, gradients; also when
    continuing from a state (prefill then a piece then a step)."""
    if not has_mode(case):
        raise ContractError(f"{case.id}: no 'mode' config field, nothing to compare")
    torch.manual_seed(case.seed("init"))
    chunked = case.build(device, mode="chunk")
    ref = case.build(device, mode="recurrent")
    ref.load_state_dict(chunked.state_dict())
    tol = _tolerance(case, device)
    x = _input(case, device=device).requires_grad_(True)
    w = _input(case, salt="w", device=device)
    sizes = [SEQ_LEN - 6, 5, 1]
    y_c, s_c = _run(chunked, x, sizes)
    y_r, s_r = _run(ref, x, sizes)
    _assert_runs_agree(f"{case.id} recurrent vs chunk", tol, (y_c, s_c, _grads(chunked, x, y_c, w)),
                       (y_r, s_r, _grads(ref, x, y_r, w)))


def _assert_runs_agree(where: str, tol: float, run: tuple, ref: tuple) -> None:
    """``run`` and ``ref`` are ``(output, final state, grads)``: all three must agree within ``tol``."""
    (y, s, g), (y_ref, s_ref, g_ref) = run, ref
    assert_close(f"{where} output", y, y_ref, tol)
    assert_states_close(where, s, s_ref, tol)
    for key in g_ref:
        assert_close(f"{where} grad {key}", g[key], g_ref[key], tol)


def check_state_bytes(case: Case, device: str = "cpu") -> None:
    """``state_bytes`` == bytes of the state tensors held, after prefill and after decode steps,
    in float32 and bfloat16."""
    torch.manual_seed(case.seed("init"))
    for dtype in (torch.float32, torch.bfloat16):
        block = case.build(device).to(dtype)
        x = _input(case, T=9, device=device).to(dtype)
        with torch.no_grad():
            state, context = None, 0
            for n in (1, 3, 1, 4):  # contexts 1, 4, 5, 9: below, at and past small windows
                _, state = block(x[:, context:context + n], state)
                context += n
                held, declared = Block.held_state_bytes(state), block.state_bytes(BATCH, context, dtype)
                if held != declared:
                    raise ContractError(f"{case.id} {dtype} context {context}: state_bytes {declared} != held "
                                        f"{held} ({ {k: (tuple(t.shape), t.dtype) for k, t in state.items()} })")


def check_state_immutable(case: Case, device: str = "cpu") -> None:
    """A forward must not write into the state it was given (callers may reuse or branch it)."""
    torch.manual_seed(case.seed("init"))
    block = case.build(device)
    x = _input(case, T=7, device=device)
    with torch.no_grad():
        _, state = block(x[:, :5])
        before = {k: t.clone() for k, t in state.items()}
        block(x[:, 5:6], state)
        block(x[:, 5:7], state)
    for k, t in state.items():
        if not torch.equal(t, before[k]):
            raise ContractError(f"{case.id}: forward modified the input state[{k!r}] in place")


def check_batch_independent(case: Case, device: str = "cpu") -> None:
    """Each batch row depends on its own tokens only (catches reshapes that mix the batch)."""
    torch.manual_seed(case.seed("init"))
    block = case.build(device)
    x = _input(case, T=9, device=device)
    with torch.no_grad():
        y, s = block(x[:, :6])
        y2, _ = block(x[:, 6:], s)
        y_row, s_row = block(x[1:, :6])
        y2_row, _ = block(x[1:, 6:], s_row)
    tol = _tolerance(case, device)
    assert_close(f"{case.id} batch row 1 alone", y_row, y[1:], tol)
    assert_close(f"{case.id} batch row 1 alone, continued", y2_row, y2[1:], tol)


def check_params_receive_grad(case: Case, device: str = "cpu") -> None:
    """Every trainable parameter gets a non-zero gradient from one pass (none is left unused)."""
    torch.manual_seed(case.seed("init"))
    block = case.build(device)
    y, _ = block(_input(case, T=9, device=device))
    (y * _input(case, T=9, salt="w", device=device)).sum().backward()
    dead = [n for n, p in block.named_parameters() if p.requires_grad and (p.grad is None or not p.grad.any())]
    if dead:
        raise ContractError(f"{case.id}: parameters without gradient: {dead}")


def check_bad_config(name: str, config: dict[str, Any], field: str) -> None:
    """``build(name, **config)`` raises ConfigError whose message starts with ``field:``."""
    try:
        registry.build(name, d_model=D_MODEL, **config)
    except ConfigError as exc:
        if not str(exc).startswith(f"{field}:"):
            raise ContractError(f"{name} {config}: ConfigError should name {field!r} first, got: {exc}") from None
        return
    raise ContractError(f"{name} {config}: no ConfigError (expected one naming {field!r})")


def check_declares_bad_configs(name: str) -> None:
    """Every block declares at least one bad config of its own."""
    if not list(getattr(registry.get(name), "bad_configs", lambda: [])()):
        raise ContractError(f"{name}: declares no bad_configs()")


def check_num_params(case: Case, device: str = "cpu") -> None:
    block = case.build(device)
    expected = sum(p.numel() for p in block.parameters() if p.requires_grad)
    if block.num_params() != expected or expected == 0:
        raise ContractError(f"{case.id}: num_params() {block.num_params()} != sum of parameter numels {expected}")


def check_letter(name: str) -> None:
    letter = registry.get(name).letter
    if not (isinstance(letter, str) and len(letter) == 1 and letter != "?"):
        raise ContractError(f"{name}: letter must be one character, got {letter!r}")
    others = [n for n in registry.names() if n != name and registry.get(n).letter == letter]
    if others:
        raise ContractError(f"{name}: letter {letter!r} also used by {others}")


CASE_CHECKS: dict[str, Callable[..., None]] = {
    "pieces": check_pieces,
    "decode": check_decode,
    "recurrent": check_recurrent,
    "state_bytes": check_state_bytes,
    "state_immutable": check_state_immutable,
    "batch_independent": check_batch_independent,
    "params_receive_grad": check_params_receive_grad,
    "num_params": check_num_params,
}


def run(names: list[str] | None = None, out=sys.stdout, device: str = "cpu") -> int:
    """Run every check on ``names`` (default: all registered) on ``device``; print one line per
    failure and a summary; return the number of failures."""
    failures = 0

    def attempt(label: str, fn: Callable[[], None]) -> None:
        nonlocal failures
        try:
            fn()
        except Exception as exc:  # a crash is a failure too; report it and go on
            failures += 1
            kind = "" if isinstance(exc, ContractError) else f"{type(exc).__name__}: "
            print(f"FAIL {label}: {kind}{exc}", file=out)

    names = names or registry.names()
    for case in cases(names):
        for check_name, fn in CASE_CHECKS.items():
            if check_name == "recurrent" and not has_mode(case):
                continue
            attempt(f"{check_name} {case.id}", lambda fn=fn, case=case: fn(case, device))
    for name, cfg, field in bad_config_cases(names):
        attempt(f"bad_config {name} {cfg}", lambda n=name, c=cfg, f=field: check_bad_config(n, c, f))
    for name in names:
        attempt(f"letter {name}", lambda n=name: check_letter(n))
        attempt(f"declares_bad_configs {name}", lambda n=name: check_declares_bad_configs(n))
    print(f"{failures} failure(s) over {len(cases(names))} block configs of {', '.join(names)} on {device}",
          file=out)
    return failures


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m blocks.contract", description="Run the Block contract suite.")
    parser.add_argument("names", nargs="*", help="registered block names (default: all)")
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cuda (default: cpu)")
    args = parser.parse_args(argv)
    for name in args.names:
        if name not in registry.names():
            parser.error(f"unknown block {name!r}; registered blocks: {', '.join(registry.names())}")
    return 1 if run(args.names or None, device=args.device) else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
