"""Streams confined to disjoint sets of SMs (CUDA green contexts), for the chunk walks of ``overlap``.

A long sequence's state walk is a few programs, each a chain of dependent steps; beside it the
per-chunk kernels of other segments fill the GPU. Sharing an SM with those kernels slows the walk's
chain (its steps wait for issue slots and memory behind theirs), and the walk is the step's
critical path at 16k and 32k tokens. A green context owns a subset of the SMs: walks launched on
``pair(...).walk`` run only there and the per-chunk kernels on ``pair(...).rest`` only on the other
SMs, so neither shares an SM with the other.

Written against the CUDA driver through ``ctypes`` rather than ``torch.cuda.green_contexts``: that
API changed between the torch releases the project runs on (2.10 offers ``set_context`` /
``pop_context`` only, later ones ``Stream()``; newer ones need the ``cuda.bindings`` package), and
the five driver calls used here are stable since CUDA 12.4. Kernels of the primary context (every
Triton kernel) launch on a green context's streams: such a stream belongs to the device's primary
context too (``cuStreamGetCtx_v2``).
"""
from __future__ import annotations

import ctypes
import functools
from typing import NamedTuple

import torch

# CUdevResource is 144 bytes in CUDA 12.4's ABI and larger in later ones (a next-resource pointer,
# more fields in its union); every call here passes single resources, so an oversized zeroed buffer
# serves any driver. ``sm.smCount`` follows the type and 92 bytes of padding.
_RESOURCE_BYTES = 512
_SM_COUNT_OFFSET = 96
_CU_DEV_RESOURCE_TYPE_SM = 1
_CU_GREEN_CTX_DEFAULT_STREAM = 1
_CU_STREAM_NON_BLOCKING = 1
# why the last ``pair`` call returned None (benchmarks print it)
last_error: str | None = None


class StreamPair(NamedTuple):
    """Two streams on disjoint SMs: ``walk`` (``walk_sms`` SMs, high priority) and ``rest`` (the others)."""
    walk: torch.cuda.ExternalStream
    rest: torch.cuda.ExternalStream
    walk_sms: int
    rest_sms: int


def _driver():
    lib = ctypes.CDLL("libcuda.so.1")
    for name in ("cuDeviceGetDevResource", "cuDevSmResourceSplitByCount", "cuDevResourceGenerateDesc",
                 "cuGreenCtxCreate", "cuGreenCtxStreamCreate"):
        getattr(lib, name).restype = ctypes.c_int  # AttributeError on drivers before CUDA 12.4
    return lib


def _check(status: int, call: str) -> None:
    if status != 0:
        raise RuntimeError(f"{call} failed with CUDA driver error {status}")


def _sm_count(resource) -> int:
    return ctypes.c_uint.from_buffer(resource, _SM_COUNT_OFFSET).value


def _stream(lib, dev, resource, priority: int, device: torch.device) -> torch.cuda.ExternalStream:
    desc = ctypes.c_void_p()
    _check(lib.cuDevResourceGenerateDesc(ctypes.byref(desc), resource, ctypes.c_uint(1)), "cuDevResourceGenerateDesc")
    ctx = ctypes.c_void_p()
    _check(lib.cuGreenCtxCreate(ctypes.byref(ctx), desc, dev, ctypes.c_uint(_CU_GREEN_CTX_DEFAULT_STREAM)),
           "cuGreenCtxCreate")
    stream = ctypes.c_void_p()
    _check(lib.cuGreenCtxStreamCreate(ctypes.byref(stream), ctx, ctypes.c_uint(_CU_STREAM_NON_BLOCKING),
                                      ctypes.c_int(priority)), "cuGreenCtxStreamCreate")
    # the contexts and streams live as long as the process (cached below), as torch's own streams do
    return torch.cuda.ExternalStream(stream.value, device=device)


@functools.lru_cache(maxsize=None)
def pair(device: torch.device, walk_sms: int) -> StreamPair | None:
    """The device's ``walk`` / ``rest`` streams with ``walk_sms`` SMs (rounded up by the driver to its
    partition granularity, 8 on Hopper) for the walks; None where green contexts are unavailable (no
    CUDA device, a driver before CUDA 12.4, any driver error): callers then share the SMs as before."""
    if device.type != "cuda" or walk_sms <= 0 or torch.version.hip is not None:
        return None
    try:
        torch.cuda.init()
        lib = _driver()
        index = device.index if device.index is not None else torch.cuda.current_device()
        dev = ctypes.c_int()
        _check(lib.cuDeviceGet(ctypes.byref(dev), ctypes.c_int(index)), "cuDeviceGet")
        whole = ctypes.create_string_buffer(_RESOURCE_BYTES)
        _check(lib.cuDeviceGetDevResource(dev, whole, ctypes.c_int(_CU_DEV_RESOURCE_TYPE_SM)), "cuDeviceGetDevResource")
        if walk_sms >= _sm_count(whole):
            raise RuntimeError(f"{walk_sms} walk SMs leave none of the device's {_sm_count(whole)}")
        group = ctypes.create_string_buffer(_RESOURCE_BYTES)
        remaining = ctypes.create_string_buffer(_RESOURCE_BYTES)
        groups = ctypes.c_uint(1)
        _check(lib.cuDevSmResourceSplitByCount(group, ctypes.byref(groups), whole, remaining, ctypes.c_uint(0),
                                               ctypes.c_uint(walk_sms)), "cuDevSmResourceSplitByCount")
        if groups.value != 1 or _sm_count(remaining) == 0:
            raise RuntimeError(f"the split gave {groups.value} groups and {_sm_count(remaining)} SMs left")
        dev_t = torch.device("cuda", index)
        return StreamPair(_stream(lib, dev, group, -1, dev_t), _stream(lib, dev, remaining, 0, dev_t),
                          _sm_count(group), _sm_count(remaining))
    except (OSError, AttributeError, RuntimeError) as exc:
        global last_error
        last_error = f"{type(exc).__name__}: {exc}"
        return None
