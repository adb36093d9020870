"""Load a space from a built-in name or a YAML file (errors: one ``UserError``, one line each)."""
from __future__ import annotations

from pathlib import Path

import yaml

from archsearch.errors import UserError

from .schema import Space

BUILTIN_DIR = Path(__file__).parent / "builtin"


def builtin_names() -> list[str]:
    return sorted(p.stem for p in BUILTIN_DIR.glob("*.yaml"))


def builtin_path(name: str) -> Path:
    return BUILTIN_DIR / f"{name}.yaml"


def load(ref: str | Path) -> Space:
    """``ref`` is a built-in space name (``mqar_tiny``) or a path to a YAML file."""
    path = Path(ref)
    if not path.exists():
        if str(ref) in builtin_names():
            path = builtin_path(str(ref))
        else:
            raise UserError(f"{ref}: no such file and not a built-in space; built-in spaces: "
                            f"{', '.join(builtin_names())}")
    if path.is_dir():
        raise UserError(f"{path}: is a directory, expected a space YAML file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text: {exc.reason} at byte {exc.start}") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return load_text(text, source=str(path))


def load_text(text: str, source: str = "<string>") -> Space:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise UserError(f"{source}: not valid YAML: {where}{getattr(exc, 'problem', None) or exc}") from None
    if not isinstance(data, dict):
        raise UserError(f"{source}: a space must be a YAML mapping, got {type(data).__name__}")
    return Space.from_dict(data)
