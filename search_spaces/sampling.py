"""From a space to architectures: sample one (``suggest``), count them (``size``), show one (``example``).

Every searched setting is asked from a *chooser* in a fixed order, under a stable Optuna parameter
name (``depth``, ``d_model``, ``layer_3``, ``pattern.every``, ``linear_attn.feature_map``, ...). The
set of names depends only on ``depth`` (``layer_i`` exists for ``i < depth``); block parameters are
asked for every candidate block even when a stack does not use it, which keeps the space static for
Optuna's multivariate samplers. Unused draws do not change the spec, so two trials may share a
spec: the study trains each spec hash once.
"""
from __future__ import annotations

import json
import math
from typing import Any, Callable

from .domains import Chooser, Domain, Fixed, FloatRange, IntRange
from .schema import Pattern, PerLayer, Space

ENUMERATE_LIMIT = 20_000  # above this many parameter combinations `size` does not enumerate


def softmax_blocks(space: Space) -> set[str]:
    names = {"softmax"}
    if isinstance(space.model.stack, Pattern):
        names.add(space.model.stack.softmax)
    return names


def softmax_positions(depth: int, every: int | None, share: float | None, placement: str) -> list[int]:
    """Layer indices (0-based) that are softmax for a pattern stack of ``depth`` layers."""
    if every is not None:
        return [i for i in range(depth) if (i + 1) % every == 0]
    n = int(math.floor(share * depth + 0.5))
    if n <= 0:
        return []
    if placement == "first":
        return list(range(n))
    if placement == "last":
        return list(range(depth - n, depth))
    if placement == "middle":
        start = (depth - n) // 2
        return list(range(start, start + n))
    # even: the last layer of each of n equal groups, e.g. depth 8, n 2 -> 3, 7 (LLLS LLLS)
    return sorted({(j + 1) * depth // n - 1 for j in range(n)})


def candidate_blocks(space: Space) -> list[str]:
    st = space.model.stack
    if isinstance(st, PerLayer):
        return list(st.blocks)
    mixers = st.mixer.values() if hasattr(st.mixer, "values") else [st.mixer]
    return list(dict.fromkeys([*mixers, st.softmax]))


def _ask(dom: Domain | None, chooser: Chooser, name: str) -> Any:
    return None if dom is None else dom.choose(chooser, name)


def spec_dict(space: Space, chooser: Chooser) -> dict[str, Any]:
    """Ask ``chooser`` for every searched setting and return the ArchSpec dict it describes."""
    m = space.model
    depth = _ask(m.depth, chooser, "depth")
    d_model = _ask(m.d_model, chooser, "d_model")
    num_heads = _ask(m.num_heads, chooser, "num_heads")
    shared = {
        "head_dim_k": _ask(m.head_dim_k, chooser, "head_dim_k"),
        "head_dim_v": _ask(m.head_dim_v, chooser, "head_dim_v"),
        "state_expansion": _ask(m.state_expansion, chooser, "state_expansion"),
        "feature_map": _ask(m.feature_map, chooser, "feature_map"),
        "short_conv": _ask(m.short_conv, chooser, "short_conv"),
    }
    mlp_expansion = _ask(m.mlp_expansion, chooser, "mlp_expansion")
    st = m.stack
    if isinstance(st, PerLayer):
        names = [st.blocks[0] if len(st.blocks) == 1
                 else chooser.suggest_categorical(f"layer_{i}", list(st.blocks)) for i in range(depth)]
    else:
        mixer = _ask(st.mixer, chooser, "pattern.mixer")
        every = _ask(st.every, chooser, "pattern.every")
        share = _ask(st.share, chooser, "pattern.share")
        placement = _ask(st.placement, chooser, "pattern.placement") if share is not None else None
        soft = set(softmax_positions(depth, every, share, placement))
        names = [st.softmax if i in soft else mixer for i in range(depth)]
    per_block = {}
    for b in candidate_blocks(space):
        per_block[b] = {f: dom.choose(chooser, f"{b}.{f}") for f, dom in m.blocks.get(b, {}).items()}
    layers = [{"block": b, "config": block_config(b, d_model, num_heads, shared, m.conv_size, per_block[b])}
              for b in names]
    return {
        "vocab_size": vocab_size(space),
        "d_model": d_model,
        "layers": layers,
        "mlp": m.mlp,
        "mlp_expansion": float(mlp_expansion),
        "norm": m.norm,
    }


def block_config(block: str, d_model: int, num_heads: int, shared: dict[str, Any], conv_size: int,
                 own: dict[str, Any]) -> dict[str, Any]:
    """Model-level settings mapped onto the fields ``block``'s Config has, then its own draws on top."""
    import dataclasses

    import blocks

    fields = {f.name for f in dataclasses.fields(blocks.get(block).Config)}
    cfg: dict[str, Any] = {}
    if "num_heads" in fields:
        cfg["num_heads"] = num_heads
    if shared["head_dim_k"] is not None:
        for f in ("head_dim_k", "head_dim"):
            if f in fields:
                cfg[f] = shared["head_dim_k"]
    if shared["head_dim_v"] is not None and "head_dim_v" in fields:
        cfg["head_dim_v"] = shared["head_dim_v"]
    if shared["state_expansion"] is not None:
        if "expand_v" in fields:  # linear families: state value dim = head_dim_v * expand_v
            cfg["expand_v"] = shared["state_expansion"]
        elif "head_dim_v" in fields:
            base = shared["head_dim_v"] or max(1, d_model // num_heads)
            cfg["head_dim_v"] = max(1, int(round(shared["state_expansion"] * base)))
    if shared["feature_map"] is not None and "feature_map" in fields:
        cfg["feature_map"] = shared["feature_map"]
    if shared["short_conv"] is not None and "conv_size" in fields:
        cfg["conv_size"] = conv_size if shared["short_conv"] else 0
    cfg.update(own)
    return cfg


def vocab_size(space: Space) -> int:
    """The model vocabulary: ``model.vocab_size`` or the largest vocabulary of the tasks it trains on."""
    if space.model.vocab_size is not None:
        return space.model.vocab_size
    return task_vocab_size(space)


def task_vocab_size(space: Space) -> int:
    """The largest vocabulary among the tasks a candidate trains on (the space's and quality objectives')."""
    from archsearch import tasks

    sizes = [tasks.build(space.task.name, **space.task.params).vocab_size]
    for o in space.objectives:
        if o.kind == "quality" and o.task is not None:
            sizes.append(tasks.build(o.task, **(o.task_params or {})).vocab_size)
    return max(sizes)


def suggest(space: Space, chooser: Chooser):
    """An ``ArchSpec`` for one Optuna trial (or any chooser)."""
    from archsearch.spec import ArchSpec

    return ArchSpec.from_dict(spec_dict(space, chooser))


# ---- enumeration ---------------------------------------------------------------------------
class _Replay:
    """A chooser that follows a path of option indices and records how many options each step had."""

    def __init__(self, path: list[int]):
        self.path, self.used, self.sizes = path, [], []
        self.continuous = False

    def _pick(self, n: int, option: Callable[[int], Any]) -> Any:
        # options by index, never as a list: a range may have 10**11 values
        i = self.path[len(self.used)] if len(self.used) < len(self.path) else 0
        self.used.append(i)
        self.sizes.append(n)
        return option(i)

    def suggest_categorical(self, name, choices):
        choices = list(choices)
        return self._pick(len(choices), choices.__getitem__)

    def suggest_int(self, name, low, high, step=1, log=False):
        values = range(low, high + 1, step)
        return self._pick(len(values), values.__getitem__)

    def suggest_float(self, name, low, high, step=None, log=False):
        if step is None:
            self.continuous = True
            return self._pick(1, lambda i: low)
        return self._pick(int(round((high - low) / step)) + 1, lambda i: low + i * step)


def _domains(space: Space) -> list[Domain]:
    m = space.model
    doms = [m.depth, m.d_model, m.num_heads, m.head_dim_k, m.head_dim_v, m.state_expansion,
            m.feature_map, m.short_conv, m.mlp_expansion]
    if isinstance(m.stack, Pattern):
        doms += [m.stack.mixer, m.stack.every, m.stack.share, m.stack.placement]
    for b in candidate_blocks(space):
        doms += list(m.blocks.get(b, {}).values())
    return [d for d in doms if d is not None]


def finite(space: Space) -> bool:
    return all(math.isfinite(d.size()) for d in _domains(space))


def combinations(space: Space) -> int | float:
    """Number of parameter combinations (an upper bound on distinct architectures); inf if continuous."""
    m = space.model
    rest = 1
    for d in _domains(space):
        if d is not m.depth:
            rest *= d.size()
    if isinstance(rest, float) and math.isinf(rest):
        return math.inf
    if isinstance(m.stack, PerLayer):
        return rest * _sum_of_powers(len(m.stack.blocks), m.depth)
    return rest * m.depth.size()


def _sum_of_powers(k: int, depth: Domain) -> int:
    """sum of k**d over the depths: a geometric series for a range (summing a range of 10**5 big
    powers one by one took half a minute)."""
    if isinstance(depth, IntRange) and k > 1:
        n = depth.size()
        return k ** depth.low * (k ** (depth.step * n) - 1) // (k ** depth.step - 1)
    return sum(k ** d for d in depth.values())


def _count(n: int) -> str:
    """A count for people: exact up to 18 digits, then its order of magnitude (str() of an int
    over 4300 digits raises ValueError)."""
    return f"{n:,}" if n < 10**18 else f"about 10^{int(math.log10(n))}"


def size(space: Space, limit: int = ENUMERATE_LIMIT) -> tuple[str, int | None]:
    """``(text, count)``: the number of distinct architectures (by spec hash), or why it is not counted."""
    total = combinations(space)
    if isinstance(total, float) and math.isinf(total):  # not math.isfinite: total may exceed any float
        return "continuous (a float range has no step)", None
    if total > limit:
        return f"up to {_count(int(total))} parameter combinations (more than {limit:,}: distinct architectures not enumerated)", None
    seen = set()
    path: list[int] = []
    while True:
        ch = _Replay(path)
        seen.add(json.dumps(spec_dict(space, ch), sort_keys=True))
        i = len(ch.used) - 1
        while i >= 0 and ch.used[i] + 1 >= ch.sizes[i]:
            i -= 1
        if i < 0:
            break
        path = ch.used[:i] + [ch.used[i] + 1]
    n = len(seen)
    return f"{n:,} distinct architectures ({int(total):,} parameter combinations)", n


def example(space: Space):
    """The architecture of the first option of every setting (what ``archsearch validate`` prints)."""
    from archsearch.spec import ArchSpec

    return ArchSpec.from_dict(spec_dict(space, _Replay([])))


def block_field_errors(space: Space) -> list[str]:
    """Validate each candidate block's config (``Config.validate``) with every value of its own searched fields.

    Catches values the block rejects (``model.blocks.gla.head_dim_k[1]: ...``) at validation time
    instead of as failed trials. Continuous ranges are checked at both ends.
    """
    import blocks
    from blocks.base import ConfigError

    errors: list[str] = []
    try:
        base = spec_dict(space, _Replay([]))
    except (ConfigError, ValueError, KeyError) as exc:
        return [f"model: {exc}"]
    d_model = base["d_model"]
    by_block = {layer["block"]: layer["config"] for layer in base["layers"]}
    m = space.model
    for b in candidate_blocks(space):
        cfg0 = by_block.get(b)
        if cfg0 is None:
            shared = {"head_dim_k": None, "head_dim_v": None, "state_expansion": None,
                      "feature_map": None, "short_conv": None}
            cfg0 = block_config(b, d_model, _first(m.num_heads), shared, m.conv_size,
                                {f: _first(dom) for f, dom in m.blocks.get(b, {}).items()})
        trials = [(f"model.blocks.{b}", dict(cfg0))]
        for f, dom in m.blocks.get(b, {}).items():
            # ends only for continuous or very long ranges (listing 10**11 values does not end)
            vals = dom.values() if dom.size() <= ENUMERATE_LIMIT else [dom.low, dom.high]
            for i, v in enumerate(vals):
                where = f"model.blocks.{b}.{f}" + (f"[{i}]" if len(vals) > 1 else "")
                trials.append((where, {**cfg0, f: v}))
        for where, cfg in trials:
            try:
                blocks.get(b).Config.from_kwargs(**cfg).validate(d_model)
            except (ConfigError, TypeError, ValueError) as exc:
                msg = str(exc)
                errors.append(f"{where}: {msg}" if not msg.startswith(where) else msg)
    return list(dict.fromkeys(errors))


def _first(dom: Domain | None) -> Any:
    if dom is None:
        return None
    return dom.low if isinstance(dom, (IntRange, FloatRange)) else dom.values()[0]
