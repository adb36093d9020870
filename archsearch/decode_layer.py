"""A whole decode layer as five kernels: the GEMMs, the fused mixer and the residual + RMSNorms;
a softmax layer as the same GEMMs around the decoder's attention over its KV cache.

For a ``HybridLayer`` whose mixer has the fused decode kernel (``blocks.kernels.decode_mixer``:
deltanet, gated_deltanet, simple_gla), RMSNorm norms and a SwiGLU MLP, one decode step
(``x: [B <= 16, 1, d_model]``) runs as

    proj      = hn1 W_in^T                        skinny.linear           (hn1 = rmsnorm1(x))
    o, state  = mixer(proj, state)                decode_mixer            (conv, gates, state update, norms)
    h, hn2    = x + o W_o^T, rmsnorm2(h)          skinny.residual_linear  (split-K, summed by the last split)
    a         = silu(hn2 W1^T) * (hn2 W3^T)       skinny.swiglu
    x', hn1'  = h + a W2^T, rmsnorm1'(x')         skinny.residual_linear  (the next layer's norm1, or
                                                                           the model's final norm)

so the next fused layer starts from ``hn1'`` without a norm kernel of its own. A softmax layer
(``attention_step``) runs the same four GEMMs with the decoder's own attention step in the mixer's
place (on CUDA one Triton kernel for rotary, the KV-cache write, the attention and the output
gate, ``blocks.kernels.decode_attention``). A norm handed to a
GEMM is ``skinny.NormedRows`` (``h * gamma`` and the sums of ``h^2`` per column tile): the GEMM
multiplies its rows by ``1 / rms``. (``skinny.RESIDUAL_EPILOGUE`` off: o_proj and w2 as
``skinny.partials`` + ``skinny.add_norm``, two kernels each, the norms as tensors; the last layer's
w2 takes that path when the final norm feeds a head that is not a skinny GEMM.) Under
``torch.compile`` with the fused mixer the same layer was 10 kernels (H200, 2026-12-01 10:33:
cuBLAS's four GEMMs and split-K reduce, the mixer, two RMSNorms, a residual add, SiLU-mul).

The layer's results match ``HybridLayer.forward`` up to rounding: the residual adds and SiLU-mul
happen in float32 and are rounded once (the eager layer rounds each GEMM's output first).
``ENABLED`` switches it; ``archsearch.decode_graph.GraphDecoder`` asks ``applies`` (linear layers)
or ``attention_applies`` (softmax layers) per layer.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from blocks.ops.utils import cuda_kernel

# Timed (H200, 2026-12-01 10:41, ``benchmarks/gpu_kernels.py --decode-layers off,on``, both rows with
# the fused mixer and torch.compile): the 24-layer batch-16 decode step 1.688 -> 1.663 ms
# (gated_deltanet), 1.724 -> 1.619 ms (simple_gla), 3.159 -> 3.123 ms (3:1 hybrid with softmax);
# 244 -> 172 kernels; the four GEMMs 1103 -> 975 us of kernel time.
ENABLED = True


def is_rmsnorm(norm) -> bool:
    """An ``nn.RMSNorm`` with a weight (what ``skinny.add_norm`` computes)."""
    return isinstance(norm, nn.RMSNorm) and norm.weight is not None


def _eps(norm) -> float:
    """``nn.RMSNorm``'s epsilon. None there means float32's machine epsilon for every input dtype:
    PyTorch computes the norm of 16-bit inputs in float32 (``F.rms_norm(..., eps=None)``)."""
    return norm.eps if norm.eps is not None else torch.finfo(torch.float32).eps


def _frame_applies(layer, x: torch.Tensor) -> bool:
    """What both kinds of fused layer need: switched on, on CUDA with the skinny kernels available
    and no gradient recorded, ``x: [B <= 16, 1, d_model]``, RMSNorm norms, a SwiGLU MLP, the mixer's
    input projection one bias-free matmul and its ``o_proj`` bias-free."""
    from archsearch.model import SwiGLU

    if not (ENABLED and x.is_cuda and x.dim() == 3 and x.shape[1] == 1 and 1 <= x.shape[0] <= 16
            and not torch.is_grad_enabled() and is_rmsnorm(layer.norm1) and is_rmsnorm(layer.norm2)
            and isinstance(layer.mlp, SwiGLU)):
        return False
    in_proj = getattr(layer.mixer, "in_proj", None)
    return (cuda_kernel("skinny", "decode", x) is not None and in_proj is not None
            and getattr(in_proj, "linear", None) is not None and in_proj.linear.bias is None
            and getattr(layer.mixer, "o_proj", None) is not None and layer.mixer.o_proj.bias is None)


def applies(layer, x: torch.Tensor) -> bool:
    """Whether ``step`` runs ``layer``'s decode step for ``x: [B, 1, d_model]``: ``_frame_applies``
    and a mixer the fused decode kernel serves (``decode_mixer.applies``)."""
    if not _frame_applies(layer, x):
        return False
    mixer = cuda_kernel("mixer", "decode", x)
    return mixer is not None and mixer.applies(layer.mixer, x)


def attention_applies(layer, x: torch.Tensor) -> bool:
    """Whether ``attention_step`` runs ``layer``'s decode step: ``_frame_applies`` and a ``softmax``
    mixer in chunk mode (any heads, grouped-query, window or output gate: the attention between
    the projections stays the decoder's own)."""
    return (getattr(layer.mixer, "name", None) == "softmax" and layer.mixer.config.mode == "chunk"
            and _frame_applies(layer, x))


def embed_applies(embed, first_layer, x: torch.Tensor) -> bool:
    """Whether ``embed`` runs as ``skinny.embed_norm`` before a fused first layer (``applies`` or
    ``attention_applies`` said yes for it): exactly an ``nn.Embedding`` (a subclass may change ``forward``) without
    ``max_norm`` (which renormalises rows in place), its weight rows of unit stride."""
    return (ENABLED and type(embed) is nn.Embedding and embed.max_norm is None
            and embed.weight.stride(1) == 1 and (applies(first_layer, x) or attention_applies(first_layer, x)))


def head_applies(head, final_norm, x: torch.Tensor) -> bool:
    """Whether the model's ``head`` runs as ``head_step`` after a fused last layer (``applies`` or
    ``attention_applies`` said yes for it) whose step hands on ``final_norm`` as ``NormedRows``:
    switched on, ``skinny.RESIDUAL_EPILOGUE``, exactly a bias-free ``nn.Linear`` of ``x``'s dtype
    with unit-stride weight rows, and ``final_norm`` an RMSNorm with a weight."""
    if not (ENABLED and type(head) is nn.Linear and head.bias is None and head.weight.dtype == x.dtype
            and head.weight.stride(1) == 1 and is_rmsnorm(final_norm) and cuda_kernel("skinny", "decode", x) is not None):
        return False
    from blocks.kernels import skinny  # Triton is there: cuda_kernel found the kernels

    return skinny.RESIDUAL_EPILOGUE


def head_step(head, hn) -> torch.Tensor:
    """``head_applies`` said yes: ``hn`` the final norm as ``skinny.NormedRows`` (``[B, D]``) ->
    logits ``[B, vocab]`` in the activation dtype, one skinny GEMM (``CONFIGS["head"]``)."""
    from blocks.kernels import skinny

    return skinny.linear(hn, head.weight, "head")


def embed(embed, tokens: torch.Tensor, norm1) -> tuple[torch.Tensor, torch.Tensor]:
    """``embed_applies`` said yes: ``tokens: [B]`` int64 -> ``(x = embed(tokens) [B, 1, D],
    norm1(x) [B, 1, D])``, one kernel; ``step``'s ``x`` and ``hn`` for the first layer."""
    from blocks.kernels import skinny

    x, hn = skinny.embed_norm(embed.weight, tokens, norm1.weight, _eps(norm1))
    return x[:, None], hn[:, None]


def step(layer, x: torch.Tensor, hn, state: dict, next_norm=None, hand_on: bool = False):
    """One decode step of ``layer`` (``applies`` said yes): ``x: [B, 1, D]`` the residual stream,
    ``hn`` its ``norm1`` (``[B, 1, D]``, or ``skinny.NormedRows`` ``[B, D]``, from the previous fused
    layer) or None, ``state`` the mixer's decode state, ``next_norm`` an RMSNorm (``is_rmsnorm``)
    or None, ``hand_on`` whether the next norm goes to another fused layer's GEMM
    -> ``(x_out [B, 1, D], next_norm(x_out), new_state)``, the norm as ``skinny.NormedRows``
    (``[B, D]``) with ``hand_on`` and ``skinny.RESIDUAL_EPILOGUE``, else ``[B, 1, D]``, or None
    without ``next_norm``.

    Between two calls for the same ``state``, some kernel launched without PDL (any PyTorch op)
    must run: the fused mixer may read its state before the input projection has finished
    (``decode_mixer.mixer_step``'s ordering; ``GraphDecoder`` updates its position in between).

    With ``skinny.RESIDUAL_EPILOGUE`` o_proj and w2 are ``skinny.residual_linear`` (the residual
    add and the next norm in the GEMM), except a w2 whose norm is wanted as a tensor (the model's
    final norm, before the head): ``partials`` + ``add_norm`` there."""
    proj = _in_proj(layer, x, hn)
    fused = layer.mixer.fused_decode(x, proj, state)
    if fused is None:  # the mixer was switched off after the plan: the layer's own path, still correct
        out, new_state = layer(x, state)
        return out, None if next_norm is None else next_norm(out), new_state
    o, new_state = fused  # [B, 1, H*V]
    return *_after_mixer(layer, x, o, next_norm, hand_on), new_state


def attention_step(layer, x: torch.Tensor, hn, attend, pos: torch.Tensor, next_norm=None, hand_on: bool = False):
    """One decode step of a softmax ``layer`` (``attention_applies`` said yes) as ``step`` runs a
    linear one, the attention between the projections by ``attend(proj, pos) -> o [B, 1, H*D]``
    (the decoder's static KV cache: rotary, cache write, SDPA, output gate; ``proj`` the input
    projection's columns by name, ``[B, 1, width]`` views) -> ``(x_out [B, 1, D], next_norm(x_out))``
    as ``step`` returns them (the cache is the state, written by ``attend``)."""
    o = attend(_in_proj(layer, x, hn), pos)
    return _after_mixer(layer, x, o.reshape(x.shape[0], 1, -1), next_norm, hand_on)


def _in_proj(layer, x: torch.Tensor, hn) -> dict[str, torch.Tensor]:
    """``norm1(x)`` (``hn``, or computed here) through the mixer's input projection as one skinny GEMM
    -> its columns by name, ``[B, 1, width]`` views."""
    from blocks.kernels import skinny

    B, _, D = x.shape
    if hn is None:
        hn = F.rms_norm(x.view(B, D), (D,), layer.norm1.weight, _eps(layer.norm1))
    elif not isinstance(hn, skinny.NormedRows):
        hn = hn.view(B, D)
    in_proj = layer.mixer.in_proj
    proj_all = skinny.linear(hn, in_proj.weight, "in_proj")  # [B, sum(widths)]
    return dict(zip(in_proj.names, proj_all.view(B, 1, -1).split(in_proj.widths, dim=-1)))


def _after_mixer(layer, x: torch.Tensor, o: torch.Tensor, next_norm, hand_on: bool):
    """The layer after its mixer's output ``o: [B, 1, H*V]``: o_proj with the residual add and norm2,
    the SwiGLU MLP, w2 with the residual add and the next norm -> ``(x_out, next_norm(x_out))`` as
    ``step`` returns them."""
    from blocks.kernels import skinny

    B, _, D = x.shape
    x2 = x.view(B, D)
    mixer = layer.mixer
    gamma, eps = (None, 0.0) if next_norm is None else (next_norm.weight, _eps(next_norm))
    if skinny.RESIDUAL_EPILOGUE:
        h, hn2 = skinny.residual_linear(o.view(B, -1), mixer.o_proj.weight, x2, layer.norm2.weight,
                                        _eps(layer.norm2), "o_proj")
    else:
        h, hn2 = skinny.add_norm(skinny.partials(o.view(B, -1), mixer.o_proj.weight, "o_proj_partials"), x2,
                                 layer.norm2.weight, _eps(layer.norm2))
    a = skinny.swiglu(hn2, layer.mlp.w13.weight)  # [B, hidden]
    if skinny.RESIDUAL_EPILOGUE and (hand_on or next_norm is None):
        out, hn_next = skinny.residual_linear(a, layer.mlp.w2.weight, h, gamma, eps, "w2")
        return out.view(B, 1, D), hn_next
    out, hn_next = skinny.add_norm(skinny.partials(a, layer.mlp.w2.weight, "w2_partials"), h, gamma, eps)
    return out.view(B, 1, D), None if hn_next is None else hn_next.view(B, 1, D)
