"""ArchSpec: the frozen, JSON-serialisable description of one architecture.

A spec is the unit that travels from the study to a trial process and into exports::

    spec = ArchSpec(vocab_size=8192, d_model=128,
                    layers=(LayerSpec("gated_deltanet", {"num_heads": 4}),) * 3 + (LayerSpec("softmax"),))
    spec.validate()                 # UserError naming the field, before any training
    spec.hash                       # sha256 of the canonical JSON: same architecture, same hash
    spec.stack_string()             # "NNNS" (one letter per layer, Block.letter; N = gated_deltanet)
    ArchSpec.from_json(spec.to_json()) == spec

Nothing here builds a model; ``archsearch.model.HybridLM(spec)`` does.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from typing import Any, Iterator, Mapping

from archsearch.errors import UserError

MLP_KINDS = ("swiglu",)
NORM_KINDS = ("rmsnorm", "layernorm")
MIN_D_MODEL = 8


def _freeze(value: Any, path: str) -> Any:
    """JSON-like value -> hashable immutable value (dicts -> FrozenConfig, lists -> tuples)."""
    if isinstance(value, Mapping):
        return FrozenConfig(value, path)
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v, f"{path}[{i}]") for i, v in enumerate(value))
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise UserError(f"{path}: must be a finite number, got {value!r}")
        return value
    raise UserError(f"{path}: must be a JSON value (number, string, bool, null, list, object), got {type(value).__name__}")


def _thaw(value: Any) -> Any:
    """Inverse of ``_freeze``: plain dicts and lists, ready for ``json.dumps``."""
    if isinstance(value, FrozenConfig):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return value


class FrozenConfig(Mapping[str, Any]):
    """An immutable, hashable mapping of config fields (keys kept sorted).

    A dict is neither hashable nor frozen, and ``types.MappingProxyType`` is not hashable, so a
    frozen dataclass holding one could not be hashed; this small mapping is both.
    """

    __slots__ = ("_items", "_dict")

    def __init__(self, data: Mapping[str, Any] | None = None, path: str = "config") -> None:
        data = dict(data or {})
        for key in data:
            if not isinstance(key, str):
                raise UserError(f"{path}: keys must be strings, got {key!r}")
        items = tuple(sorted((k, _freeze(v, f"{path}.{k}")) for k, v in data.items()))
        object.__setattr__(self, "_items", items)
        object.__setattr__(self, "_dict", dict(items))

    def __getitem__(self, key: str) -> Any:
        return self._dict[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._dict)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(self._items)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FrozenConfig):
            return self._items == other._items
        if isinstance(other, Mapping):
            return self._dict == dict(other)
        return NotImplemented

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("FrozenConfig is immutable")

    def __repr__(self) -> str:
        return f"FrozenConfig({self._dict!r})"

    def __reduce__(self):  # pickle / deepcopy rebuild through __init__ (attribute setting is blocked)
        return (FrozenConfig, (self.to_dict(),))

    def to_dict(self) -> dict[str, Any]:
        return _thaw(self)


@dataclasses.dataclass(frozen=True)
class LayerSpec:
    """One layer: the registered block name and its config fields (``blocks.build(block, d_model, **config)``)."""

    block: str
    config: Mapping[str, Any] = dataclasses.field(default_factory=FrozenConfig)

    def __post_init__(self) -> None:
        if not isinstance(self.config, FrozenConfig):
            if not isinstance(self.config, Mapping):
                raise UserError(f"config: must be a mapping of block fields, got {type(self.config).__name__}")
            object.__setattr__(self, "config", FrozenConfig(self.config))

    def to_dict(self) -> dict[str, Any]:
        return {"block": self.block, "config": self.config.to_dict()}  # type: ignore[union-attr]


_FIELDS = ("vocab_size", "d_model", "layers", "mlp", "mlp_expansion", "norm", "tied_embeddings")


@dataclasses.dataclass(frozen=True)
class ArchSpec:
    """One architecture: embeddings, ``layers`` (mixer then MLP, pre-norm residual), final norm, head.

    ``mlp_expansion`` is the SwiGLU hidden width over ``d_model`` (hidden = round(expansion * d_model));
    0 means no MLP (mixer-only layers). ``tied_embeddings`` shares the embedding and LM-head matrix.
    """

    vocab_size: int
    d_model: int
    layers: tuple[LayerSpec, ...]
    mlp: str = "swiglu"
    mlp_expansion: float = 8 / 3
    norm: str = "rmsnorm"
    tied_embeddings: bool = True

    def __post_init__(self) -> None:
        layers = self.layers
        if isinstance(layers, (str, bytes)) or not isinstance(layers, (list, tuple)):
            raise UserError(f"layers: must be a list of {{block, config}} entries, got {type(layers).__name__}")
        object.__setattr__(self, "layers", tuple(_as_layer(item, i) for i, item in enumerate(layers)))

    # --- serialisation -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict; ``ArchSpec.from_dict(spec.to_dict()) == spec``."""
        return {
            "vocab_size": self.vocab_size,
            "d_model": self.d_model,
            "layers": [layer.to_dict() for layer in self.layers],
            "mlp": self.mlp,
            "mlp_expansion": self.mlp_expansion,
            "norm": self.norm,
            "tied_embeddings": self.tied_embeddings,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ArchSpec":
        """Build from a dict (e.g. parsed JSON or YAML). Unknown or missing fields raise UserError by name.

        A layer is ``{"block": name, "config": {...}}`` (``config`` optional) or just the block name.
        """
        if not isinstance(d, Mapping):
            raise UserError(f"spec: must be a mapping, got {type(d).__name__}")
        unknown = sorted(set(d) - set(_FIELDS))
        if unknown:
            raise UserError(f"{unknown[0]}: unknown spec field; known fields: {', '.join(_FIELDS)}")
        for required in ("vocab_size", "d_model", "layers"):
            if required not in d:
                raise UserError(f"{required}: required spec field is missing")
        return cls(**dict(d))

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=indent is not None)

    @classmethod
    def from_json(cls, s: str) -> "ArchSpec":
        try:
            d = json.loads(s)
        except json.JSONDecodeError as exc:
            raise UserError(f"spec JSON: {exc}") from None
        return cls.from_dict(d)

    # --- identity -------------------------------------------------------------------------------
    def canonical_dict(self) -> dict[str, Any]:
        """The dict the hash is taken of: every layer's config resolved by its block at this
        ``d_model`` (``Config.resolved``: defaults filled in and fields derived from ``d_model``
        replaced by their values, so ``{}``, ``{"conv_size": 0}`` and ``{"num_heads": 1}`` are the
        same gla at d_model 64) and integral floats written as ints (so ``3.0`` and ``3`` agree).
        A config that does not validate at ``d_model`` gets only its defaults filled in; one the
        block's ``Config`` rejects (unknown block or field) is hashed as written."""
        d = self.to_dict()
        d["layers"] = [_canonical_layer(layer, self.d_model) for layer in self.layers]
        return _canonical_numbers(d)

    @property
    def hash(self) -> str:
        """sha256 hex of the canonical JSON (sorted keys, compact separators): identical
        architectures hash the same whatever the key order or float spelling."""
        text = json.dumps(self.canonical_dict(), sort_keys=True, separators=(",", ":"), allow_nan=False)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    # --- display --------------------------------------------------------------------------------
    def letters(self) -> list[str]:
        """One letter per layer (``Block.letter``); '?' for a name that is not registered."""
        import blocks

        out = []
        for layer in self.layers:
            try:
                out.append(blocks.get(layer.block).letter)
            except KeyError:
                out.append("?")
        return out

    def stack_string(self) -> str:
        """One letter per layer, groups of 4 separated by spaces, e.g. ``"NNNS NNNS"``."""
        letters = "".join(self.letters())
        return " ".join(letters[i : i + 4] for i in range(0, len(letters), 4))

    def stack_legend(self) -> dict[str, str]:
        """Letters used in ``stack_string()`` -> block names (several names may share a letter:
        their names are joined with '|')."""
        return stack_legend(layer.block for layer in self.layers)

    # --- validation -----------------------------------------------------------------------------
    def validate(self) -> "ArchSpec":
        """Check every field, and each layer's config through its block's ``Config``, so a bad
        value is caught before any training. Raises UserError naming the field; returns self."""
        import blocks
        from blocks.base import ConfigError

        _check_int(self.vocab_size, "vocab_size", 2)
        _check_int(self.d_model, "d_model", MIN_D_MODEL)
        if len(self.layers) == 0:
            raise UserError("layers: must list at least one layer, got []")
        if self.mlp not in MLP_KINDS:
            raise UserError(f"mlp: must be one of {', '.join(MLP_KINDS)}, got {self.mlp!r}")
        exp = self.mlp_expansion
        if isinstance(exp, bool) or not isinstance(exp, (int, float)) or not math.isfinite(exp) or exp < 0:
            raise UserError(f"mlp_expansion: must be a number >= 0 (0 = no MLP), got {exp!r}")
        if exp > 0 and round(exp * self.d_model) < 1:
            raise UserError(f"mlp_expansion: gives an MLP width < 1 at d_model={self.d_model}, got {exp!r}")
        if self.norm not in NORM_KINDS:
            raise UserError(f"norm: must be one of {', '.join(NORM_KINDS)}, got {self.norm!r}")
        if not isinstance(self.tied_embeddings, bool):
            raise UserError(f"tied_embeddings: must be true or false, got {self.tied_embeddings!r}")
        for i, layer in enumerate(self.layers):
            where = f"layers[{i}]"
            if not isinstance(layer.block, str):
                raise UserError(f"{where}.block: must be a block name, got {layer.block!r}")
            try:
                cls = blocks.get(layer.block)
            except KeyError as exc:
                raise UserError(f"{where}.block: {exc}") from None
            prefix = f"{where}.config."
            try:
                cfg = cls.Config.from_kwargs(prefix=prefix, **dict(layer.config))
                cfg.validate(self.d_model)
            except ConfigError as exc:
                msg = str(exc)
                raise UserError(msg if msg.startswith(prefix) else prefix + msg) from None
            except TypeError as exc:  # e.g. a missing required field of the Config dataclass
                raise UserError(f"{where}.config: {exc}") from None
        return self


def _as_layer(item: Any, i: int) -> LayerSpec:
    if isinstance(item, LayerSpec):
        return item
    if isinstance(item, str):
        return LayerSpec(item)
    if isinstance(item, Mapping):
        unknown = sorted(set(item) - {"block", "config"})
        if unknown:
            raise UserError(f"layers[{i}].{unknown[0]}: unknown layer field; known fields: block, config")
        if "block" not in item:
            raise UserError(f"layers[{i}].block: required layer field is missing")
        config = item.get("config") or {}
        if not isinstance(config, Mapping):
            raise UserError(f"layers[{i}].config: must be a mapping of block fields, got {type(config).__name__}")
        return LayerSpec(item["block"], FrozenConfig(config, f"layers[{i}].config"))
    raise UserError(f"layers[{i}]: must be a block name or {{block, config}}, got {type(item).__name__}")


def _check_int(value: Any, field: str, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise UserError(f"{field}: must be an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise UserError(f"{field}: must be >= {minimum}, got {value!r}")


def _canonical_layer(layer: LayerSpec, d_model: Any) -> dict[str, Any]:
    raw = layer.to_dict()
    try:
        import blocks

        cfg = blocks.get(layer.block).Config.from_kwargs(**dict(layer.config))
    except Exception:  # unregistered block or a field the Config rejects: hash what was written
        return raw
    from blocks.base import ConfigError

    try:
        cfg.validate(d_model)
        config = cfg.resolved(d_model)
    except (ConfigError, TypeError, ValueError):  # not buildable at this d_model: nothing to derive
        config = cfg.to_dict()
    raw["config"] = _thaw(_freeze(config, "config"))
    return raw


def _canonical_numbers(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _canonical_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_canonical_numbers(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def stack_legend(block_names: Any = None) -> dict[str, str]:
    """Letter -> block name for ``block_names`` (default: every registered block), sorted by letter.
    Names that share a letter are joined with '|'."""
    import blocks

    names = sorted(set(blocks.names() if block_names is None else block_names))
    legend: dict[str, list[str]] = {}
    for name in names:
        try:
            letter = blocks.get(name).letter
        except KeyError:
            letter = "?"
        legend.setdefault(letter, []).append(name)
    return {letter: "|".join(legend[letter]) for letter in sorted(legend)}
