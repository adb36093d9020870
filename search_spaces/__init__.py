"""Search spaces: the YAML schema, its validator, the Python API and the built-in spaces.

    import search_spaces
    search_spaces.builtin_names()            # ['hybrid_lm_small', 'mqar_tiny', 'zoology_mqar']
    space = search_spaces.load("mqar_tiny")  # a built-in name or a path to a YAML file
    spec = search_spaces.suggest(space, optuna_trial)   # -> archsearch.spec.ArchSpec

Spaces built in code use the dataclasses in ``search_spaces.schema`` (re-exported here) and
``Space.validate()``; the schema reference is README.md, "Writing a space".
"""
from __future__ import annotations

from .domains import Choice, FloatRange, IntRange
from .loader import builtin_names, builtin_path, load, load_text
from .sampling import example, size, suggest
from .schema import (
    Budget,
    Constraints,
    DecodeMemoryLimit,
    Model,
    Objective,
    Pattern,
    PerLayer,
    Sampler,
    Space,
    StudySettings,
    Task,
)

__all__ = [
    "Budget", "Choice", "Constraints", "DecodeMemoryLimit", "FloatRange", "IntRange", "Model",
    "Objective", "Pattern", "PerLayer", "Sampler", "Space", "StudySettings", "Task",
    "builtin_names", "builtin_path", "example", "load", "load_text", "size", "suggest",
]
