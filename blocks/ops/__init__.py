"""Functional math of every block family, in flash-linear-attention's layout and naming.

One module per family (``linear_attn``, ``simple_gla``, ``gla``, ``delta_rule``,
``gated_delta_rule``, ``softmax``), each with ``recurrent`` (the reference loop), ``chunk``
(training form) and ``step`` (one decode step), all returning ``(o, final_state)``. Tensors are
``[B, T, H, D]``, gates are log decays (``<= 0``), recurrent states ``[B, H, K, V]`` float32.
``blocks/README.md`` ("## Ops") writes out every signature and recurrence.
"""
from . import delta_rule, gated_delta_rule, gla, linear_attn, simple_gla, softmax
from .utils import l2norm

FAMILIES = ("linear_attn", "simple_gla", "gla", "delta_rule", "gated_delta_rule", "softmax")

__all__ = ["FAMILIES", "delta_rule", "gated_delta_rule", "gla", "l2norm", "linear_attn", "simple_gla", "softmax"]
