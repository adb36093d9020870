"""Parameter domains: what one searchable setting of a space may take.

In YAML (and in the Python API) a setting is written as one of

    4                                  a fixed value            -> Fixed(4)
    [64, 128]                          a categorical choice     -> Choice([64, 128])
    {low: 2, high: 8, step: 2}         an integer range         -> IntRange(2, 8, step=2)
    {low: 0.5, high: 4.0, log: true}   a float range            -> FloatRange(0.5, 4.0, log=True)

A range is integer when ``low`` and ``high`` are both integers (and ``step`` is absent or an
integer), float otherwise; a float range without ``step`` is continuous. Each domain asks a
*chooser* for its value: an ``optuna.Trial`` during a study, or the enumerator that counts a space.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Protocol, Sequence


class Chooser(Protocol):
    """The subset of ``optuna.Trial`` a domain needs."""

    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any: ...

    def suggest_int(self, name: str, low: int, high: int, step: int = 1, log: bool = False) -> int: ...

    def suggest_float(
        self, name: str, low: float, high: float, step: float | None = None, log: bool = False
    ) -> float: ...


@dataclasses.dataclass(frozen=True)
class Fixed:
    value: Any

    def choose(self, chooser: Chooser, name: str) -> Any:
        return self.value  # not a search dimension: Optuna never sees it

    def size(self) -> float:
        return 1

    def values(self) -> list[Any]:
        return [self.value]

    def to_yaml(self) -> Any:
        return self.value


@dataclasses.dataclass(frozen=True)
class Choice:
    options: tuple

    def __init__(self, options: Sequence[Any]):
        object.__setattr__(self, "options", tuple(options))

    def choose(self, chooser: Chooser, name: str) -> Any:
        if len(self.options) == 1:
            return self.options[0]
        return chooser.suggest_categorical(name, list(self.options))

    def size(self) -> float:
        return len(self.options)

    def values(self) -> list[Any]:
        return list(self.options)

    def to_yaml(self) -> Any:
        return list(self.options)


@dataclasses.dataclass(frozen=True)
class IntRange:
    low: int
    high: int
    step: int = 1
    log: bool = False

    def choose(self, chooser: Chooser, name: str) -> int:
        if self.low == self.high:
            return self.low
        return chooser.suggest_int(name, self.low, self.high, step=self.step, log=self.log)

    def size(self) -> float:
        return (self.high - self.low) // self.step + 1

    def values(self) -> list[int]:
        return list(range(self.low, self.high + 1, self.step))

    def to_yaml(self) -> Any:
        d: dict[str, Any] = {"low": self.low, "high": self.high}
        if self.step != 1:
            d["step"] = self.step
        if self.log:
            d["log"] = True
        return d


@dataclasses.dataclass(frozen=True)
class FloatRange:
    low: float
    high: float
    step: float | None = None
    log: bool = False

    def choose(self, chooser: Chooser, name: str) -> float:
        if self.low == self.high:
            return self.low
        return chooser.suggest_float(name, self.low, self.high, step=self.step, log=self.log)

    def size(self) -> float:
        if self.step is None:
            return math.inf
        return int(round((self.high - self.low) / self.step)) + 1

    def values(self) -> list[float]:
        if self.step is None:
            raise ValueError("a continuous range has no finite list of values")
        return [self.low + i * self.step for i in range(int(self.size()))]

    def to_yaml(self) -> Any:
        d: dict[str, Any] = {"low": self.low, "high": self.high}
        if self.step is not None:
            d["step"] = self.step
        if self.log:
            d["log"] = True
        return d


Domain = Fixed | Choice | IntRange | FloatRange


def as_domain(value: Any) -> Domain:
    """Wrap a Python value the way the YAML loader would (no validation; see ``parse_domain``)."""
    if isinstance(value, (Fixed, Choice, IntRange, FloatRange)):
        return value
    if isinstance(value, (list, tuple)):
        return Choice(value)
    if isinstance(value, dict) and "low" in value and "high" in value:
        return _range(value)
    return Fixed(value)


def _range(d: dict) -> Domain:
    low, high, step = d["low"], d["high"], d.get("step")
    is_int = all(isinstance(x, int) and not isinstance(x, bool) for x in (low, high)) and (
        step is None or (isinstance(step, int) and not isinstance(step, bool))
    )
    if is_int:
        return IntRange(low, high, 1 if step is None else step, bool(d.get("log", False)))
    return FloatRange(float(low), float(high), None if step is None else float(step), bool(d.get("log", False)))


def parse_domain(value: Any, path: str, errors: list[str], check_value=None) -> Domain | None:
    """Parse a YAML value into a domain, appending ``"<path>: ..."`` messages to ``errors``.

    ``check_value(v) -> str | None`` validates each possible value (returns a reason like
    ``"must be >= 1"``); for ranges it is applied to both ends.
    """
    def check(v: Any, where: str) -> bool:
        if check_value is None:
            return True
        why = check_value(v)
        if why:
            errors.append(f"{where}: {why}, got {v!r}")
            return False
        return True

    if isinstance(value, dict):
        unknown = set(value) - {"low", "high", "step", "log"}
        if unknown or "low" not in value or "high" not in value:
            errors.append(
                f"{path}: a range needs keys low and high (optional step, log), got {value!r}"
            )
            return None
        bad = [k for k in ("low", "high", "step") if value.get(k) is not None
               and (isinstance(value[k], bool) or not isinstance(value[k], (int, float)))]
        if bad:
            for k in bad:
                errors.append(f"{path}.{k}: must be a number, got {value[k]!r}")
            return None
        inf = [k for k in ("low", "high", "step") if isinstance(value.get(k), float) and not math.isfinite(value[k])]
        if inf:
            for k in inf:
                errors.append(f"{path}.{k}: must be a finite number, got {value[k]!r}")
            return None
        if "log" in value and not isinstance(value["log"], bool):
            errors.append(f"{path}.log: must be true or false, got {value['log']!r}")
            return None
        dom = _range(value)
        ok = True
        if dom.low > dom.high:
            errors.append(f"{path}: low must be <= high, got low={dom.low!r} high={dom.high!r}")
            ok = False
        if dom.step is not None and dom.step <= 0:
            errors.append(f"{path}.step: must be > 0, got {dom.step!r}")
            ok = False
        if dom.log and dom.low <= 0:
            errors.append(f"{path}.low: must be > 0 for a log range, got {dom.low!r}")
            ok = False
        if dom.log and dom.step not in (None, 1):
            errors.append(f"{path}: a log range cannot have a step, got step={dom.step!r}")
            ok = False
        ok = check(dom.low, f"{path}.low") and ok
        ok = check(dom.high, f"{path}.high") and ok
        return dom if ok else None
    if isinstance(value, (list, tuple)):
        if not value:
            errors.append(f"{path}: a choice list must not be empty, got []")
            return None
        ok = True
        for i, v in enumerate(value):
            ok = check(v, f"{path}[{i}]") and ok
        if ok and len({repr(v) for v in value}) != len(value):
            errors.append(f"{path}: choices must be distinct, got {list(value)!r}")
            ok = False
        return Choice(value) if ok else None
    return Fixed(value) if check(value, path) else None


def to_yaml(dom: Domain | None) -> Any:
    return None if dom is None else dom.to_yaml()
