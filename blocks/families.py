"""Imports every built-in family module so their ``@register`` decorators run.

``blocks.registry`` imports this module the first time the registry is read; a new built-in
family is one module under ``blocks/`` plus one import line here.
"""
from . import decay_attention, delta, linear_attention, softmax_attention  # noqa: F401
