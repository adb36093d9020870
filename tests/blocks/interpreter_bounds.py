"""Out-of-bounds detection for Triton kernels run by Triton's CPU interpreter (``TRITON_INTERPRET=1``).

On a GPU an unmasked load or store past a tensor either faults ("an illegal memory access") or,
worse, silently reads or writes a neighbouring allocation, depending on the allocator's layout. The
interpreter does neither reliably: it dereferences host addresses. Inside ``checked_memory()``,
every address a kernel loads from or stores to (lanes whose mask is set) must fall inside the
storage of one of that launch's tensor arguments, or the launch raises naming the operation, the
kernel and the first offending addresses. Triton's interpreter has no such check of its own (3.9).
"""
from __future__ import annotations

import contextlib

import numpy as np


@contextlib.contextmanager
def checked_memory():
    from triton.runtime import interpreter as interp

    ranges: list[tuple[int, int]] = []
    current = {"kernel": "?"}
    init_args = interp.GridExecutor._init_args_hst
    call = interp.GridExecutor.__call__
    masked_load = interp.InterpreterBuilder.create_masked_load
    masked_store = interp.InterpreterBuilder.create_masked_store

    def init_args_checked(self, args_dev, kwargs):
        args_hst, kwargs_hst = init_args(self, args_dev, kwargs)
        ranges.clear()
        for arg in list(args_hst) + list(kwargs_hst.values()):
            if hasattr(arg, "untyped_storage"):
                storage = arg.untyped_storage()
                ranges.append((storage.data_ptr(), storage.data_ptr() + storage.nbytes()))
        return args_hst, kwargs_hst

    def call_named(self, *args, **kwargs):
        current["kernel"] = getattr(self.fn, "__name__", "?")
        return call(self, *args, **kwargs)

    def check(ptrs, mask, what: str) -> None:
        itemsize = np.dtype(interp._get_np_dtype(ptrs.get_element_ty())).itemsize
        addrs = np.asarray(ptrs.data, dtype=np.uint64)
        on = np.broadcast_to(np.asarray(mask.data, dtype=bool), addrs.shape)
        addrs = addrs[on]
        inside = np.zeros(addrs.shape, dtype=bool)
        for lo, hi in ranges:
            inside |= (addrs >= lo) & (addrs + itemsize <= hi)
        if not inside.all():
            bad = addrs[~inside][:3]
            near = [min(ranges, key=lambda r: abs(int(a) - r[0])) for a in bad]
            raise AssertionError(f"{current['kernel']}: {what} of {int((~inside).sum())} lanes outside every "
                                 f"tensor argument, e.g. addresses {[int(a) for a in bad]} "
                                 f"(nearest tensors start at {[r[0] for r in near]}, end at {[r[1] for r in near]})")

    def load_checked(self, ptrs, mask, other, cache_policy, is_volatile):
        check(ptrs, mask, "load")
        return masked_load(self, ptrs, mask, other, cache_policy, is_volatile)

    def store_checked(self, ptrs, value, mask, cache_policy):
        check(ptrs, mask, "store")
        return masked_store(self, ptrs, value, mask, cache_policy)

    interp.GridExecutor._init_args_hst = init_args_checked
    interp.GridExecutor.__call__ = call_named
    interp.InterpreterBuilder.create_masked_load = load_checked
    interp.InterpreterBuilder.create_masked_store = store_checked
    try:
        yield
    finally:
        interp.GridExecutor._init_args_hst = init_args
        interp.GridExecutor.__call__ = call
        interp.InterpreterBuilder.create_masked_load = masked_load
        interp.InterpreterBuilder.create_masked_store = masked_store
