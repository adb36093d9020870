"""Causal softmax attention, optionally sliding-window, with GQA and a KV cache as its state.

    o_i = sum_{j in W(i)} softmax_j(scale * q_i . k_j) v_j,    W(i) = {j : p_i - window < p_j <= p_i}

where positions ``p`` count the cached tokens first (the cache holds the tokens just before ``q``'s)
and ``window = 0`` means no lower bound (full causal attention). Shapes: ``q: [B, T, H, K]``,
``k: [B, T, Hkv, K]``, ``v: [B, T, Hkv, V]`` with ``H % Hkv == 0`` (query head ``h`` reads kv head
``h // (H // Hkv)``, SDPA's ``enable_gqa`` grouping). The state is the KV cache
``(k_cache [B, S, Hkv, K], v_cache [B, S, Hkv, V])`` in the dtype of ``k``/``v``; with a window the
returned cache keeps only the last ``window`` positions. Every form returns ``(o: [B, T, H, V] in
q.dtype, final_state)``; ``final_state`` is None unless ``output_final_state`` (``step`` always
returns it).

``chunk`` and ``step`` run ``torch.nn.functional.scaled_dot_product_attention``; on CUDA they try
the fastest backend first (cuDNN, the ``flash_attn`` package when installed, FlashAttention,
memory-efficient, math) and fall through on "not supported". The backend that ran is in the
module-level ``last_backend`` (also ``backend_used()``): ``"cudnn"``, ``"flash_attn"``,
``"flash"``, ``"efficient"``, ``"math"``, or ``"kernel"`` when a ``blocks.kernels`` kernel ran.
"""
from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from .utils import cuda_kernel, default_scale

KVCache = tuple[torch.Tensor, torch.Tensor]

last_backend: str | None = None
"""Name of the attention backend the latest ``chunk``/``step`` call ran (None before any call)."""

_NAMES = {
    SDPBackend.CUDNN_ATTENTION: "cudnn",
    SDPBackend.FLASH_ATTENTION: "flash",
    SDPBackend.EFFICIENT_ATTENTION: "efficient",
    SDPBackend.MATH: "math",
}
_CUDA_ORDER = ("cudnn", "flash_attn", "flash", "efficient", "math")
_BY_NAME = {name: backend for backend, name in _NAMES.items()}
# First backend that worked per call signature, so the fall-through is paid once per shape class.
_chosen: dict[tuple, str] = {}

try:  # the FlashAttention-2/3 package: native sliding window and GQA, [B, T, H, D] layout.
    from flash_attn import flash_attn_func as _flash_attn_func
except (ImportError, OSError, RuntimeError):  # pragma: no cover - absent, or built for another torch
    _flash_attn_func = None


def backend_used() -> str | None:
    """The attention backend of the latest ``chunk``/``step`` call (see the module docstring)."""
    return last_backend


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ndim: int) -> None:
    layout = "[B, T, H, D]" if ndim == 4 else "[B, H, D]"
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != ndim:
            raise ValueError(f"{name}: must be {layout}, got shape {tuple(t.shape)}")
    if k.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"v: must match k in all but the last dim {tuple(k.shape[:-1])}, got {tuple(v.shape)}")
    if q.shape[0] != k.shape[0] or q.shape[-1] != k.shape[-1] or (ndim == 4 and q.shape[1] != k.shape[1]):
        raise ValueError(f"k: must match q {tuple(q.shape)} in batch, length and head dim, got {tuple(k.shape)}")
    if ndim == 4 and q.shape[1] < 1:
        raise ValueError(f"q: must have at least one position (T >= 1), got shape {tuple(q.shape)}")
    H, Hkv = q.shape[-2], k.shape[-2]
    if H % Hkv:
        raise ValueError(f"k: query heads {H} must be a multiple of kv heads, got {Hkv}")


def _check_window(window: int) -> None:
    if not isinstance(window, int) or window < 0:
        raise ValueError(f"window: must be an integer >= 0 (0 = full attention), got {window!r}")


def _with_cache(k, v, initial_state: KVCache | None):
    """Prepend the cache: ``k, v: [B, T, Hkv, D]`` -> ``[B, S + T, Hkv, D]``, and ``S``."""
    if initial_state is None:
        return k, v, 0
    k_cache, v_cache = initial_state
    if k_cache.shape[0] != k.shape[0] or k_cache.shape[2:] != k.shape[2:] or v_cache.shape[:-1] != k_cache.shape[:-1]:
        raise ValueError(
            f"initial_state: must be (k_cache [B, S, Hkv, K], v_cache [B, S, Hkv, V]) matching k {tuple(k.shape)}, "
            f"got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    return torch.cat([k_cache.to(k.dtype), k], 1), torch.cat([v_cache.to(v.dtype), v], 1), k_cache.shape[1]


def _trim(k_all, v_all, window: int) -> KVCache:
    if window and k_all.shape[1] > window:
        return k_all[:, -window:], v_all[:, -window:]
    return k_all, v_all


def recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float | None = None,
    window: int = 0,
    initial_state: KVCache | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, KVCache | None]:
    """Reference: an explicit loop of each query over its causal (windowed) keys, in float32."""
    _check(q, k, v, 4)
    _check_window(window)
    B, T, H, K = q.shape
    k_all, v_all, S = _with_cache(k, v, initial_state)
    group = H // k.shape[2]
    scale = default_scale(scale, K)
    kf = k_all.float().repeat_interleave(group, dim=2)  # [B, S + T, H, K]
    vf = v_all.float().repeat_interleave(group, dim=2)
    qf = q.float() * scale
    outs = []
    for i in range(T):
        end = S + i + 1  # keys up to and including this query's position
        start = max(0, end - window) if window else 0
        scores = torch.einsum("bhk,bjhk->bhj", qf[:, i], kf[:, start:end])
        outs.append(torch.einsum("bhj,bjhv->bhv", scores.softmax(-1), vf[:, start:end]))
    o = torch.stack(outs, dim=1).to(q.dtype)
    return o, (_trim(k_all, v_all, window) if output_final_state else None)


def chunk(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float | None = None,
    window: int = 0,
    initial_state: KVCache | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, KVCache | None]:
    """The whole sequence through SDPA (causal; the window and any cache offset as a boolean mask).

    On CUDA inputs a ``blocks.kernels`` kernel runs instead when one is registered.
    """
    global last_backend
    kernel = cuda_kernel("softmax", "chunk", q)
    if kernel is not None:
        last_backend = "kernel"
        return kernel(q, k, v, scale=scale, window=window, initial_state=initial_state,
                      output_final_state=output_final_state)
    _check(q, k, v, 4)
    _check_window(window)
    T = q.shape[1]
    k_all, v_all, S = _with_cache(k, v, initial_state)
    mask = None
    if S or (window and window < T):
        # mask[i, j]: query i (position S + i) may read key j (position j)
        pos_q = torch.arange(S, S + T, device=q.device)[:, None]
        pos_k = torch.arange(S + T, device=q.device)[None, :]
        mask = pos_k <= pos_q
        if window:
            mask &= pos_k > pos_q - window
    o = _attend(q, k_all, v_all, scale, mask, causal=mask is None, window=window)
    return o, (_trim(k_all, v_all, window) if output_final_state else None)


def step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    state: KVCache | None = None,
    scale: float | None = None,
    window: int = 0,
) -> tuple[torch.Tensor, KVCache]:
    """One decode step: ``q: [B, H, K]``, ``k: [B, Hkv, K]``, ``v: [B, Hkv, V]``, ``state`` the KV
    cache (None = empty) -> ``(o: [B, H, V] in q.dtype, new_cache)``. The new token is appended and
    the cache trimmed to ``window`` first, so the query reads the whole (trimmed) cache, unmasked."""
    global last_backend
    kernel = cuda_kernel("softmax", "step", q)
    if kernel is not None:
        last_backend = "kernel"
        return kernel(q, k, v, state=state, scale=scale, window=window)
    _check(q, k, v, 3)
    _check_window(window)
    k_all, v_all, _ = _with_cache(k[:, None], v[:, None], state)
    k_all, v_all = _trim(k_all, v_all, window)
    o = _attend(q[:, None], k_all, v_all, scale, None, causal=False, window=0)
    return o[:, 0], (k_all, v_all)


def _attend(q, k, v, scale, mask, causal: bool, window: int) -> torch.Tensor:
    """SDPA on ``q: [B, T, H, K]``, ``k, v: [B, S, Hkv, D]`` -> ``[B, T, H, V]``; sets ``last_backend``."""
    global last_backend
    gqa = q.shape[2] != k.shape[2]
    args = dict(attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=gqa)
    if q.device.type == "cuda":
        return _attend_fastest(q, k, v, args, window, _CUDA_ORDER)
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))  # [B, heads, T|S, D]
    last_backend = _cpu_choice(qt, kt, vt, args)
    return F.scaled_dot_product_attention(qt, kt, vt, **args).transpose(1, 2)


def _attend_fastest(q, k, v, args: dict, window: int, preference: tuple[str, ...]) -> torch.Tensor:
    """Run the first backend in ``preference`` that accepts the inputs (the one that worked last
    time for this kind of input first); sets ``last_backend``. Shapes as ``_attend``."""
    global last_backend
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))  # [B, heads, T|S, D]
    mask, causal, scale = args["attn_mask"], args["is_causal"], args["scale"]
    key = (q.device, q.dtype, q.shape[-1], v.shape[-1], mask is not None, causal, args["enable_gqa"],
           torch.is_grad_enabled(), preference)
    order = preference if key not in _chosen else (_chosen[key],) + preference
    declined: Exception | None = None
    for name in order:
        try:
            if name == "flash_attn":
                if _flash_attn_func is None or q.dtype not in (torch.float16, torch.bfloat16):
                    continue
                # flash_attn aligns causal masks bottom-right, which is exactly the cache offset.
                o = _flash_attn_func(q, k, v, softmax_scale=scale, causal=causal or mask is not None,
                                     window_size=(window - 1, 0) if window else (-1, -1))
            else:
                # A backend that cannot take these inputs warns why, then raises; the raise is the
                # answer we act on, so the warnings are noise.
                with sdpa_kernel([_BY_NAME[name]]), warnings.catch_warnings():
                    warnings.simplefilter("ignore", UserWarning)
                    o = F.scaled_dot_product_attention(qt, kt, vt, **args).transpose(1, 2)
        except torch.OutOfMemoryError:
            raise
        except (RuntimeError, ValueError, NotImplementedError) as exc:
            declined = exc  # this backend does not support these inputs; try the next one
            continue
        _chosen[key] = name
        last_backend = name
        return o
    raise RuntimeError(  # pragma: no cover - math takes everything valid; the cause is chained
        f"no attention backend ran for q {tuple(q.shape)}, k {tuple(k.shape)}, {q.dtype}"
    ) from declined


def _cpu_choice(qt, kt, vt, args) -> str:
    """The backend SDPA picks on CPU, asked through ``torch._fused_sdp_choice`` (private, so any
    failure to ask reads as "math")."""
    try:
        choice = torch._fused_sdp_choice(qt, kt, vt, args["attn_mask"], 0.0, args["is_causal"],
                                         scale=args["scale"], enable_gqa=args["enable_gqa"])
        return _NAMES.get(SDPBackend(choice), "math")
    except (AttributeError, RuntimeError, TypeError, ValueError):
        return "math"
