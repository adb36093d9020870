"""Test-only fault injection, loaded by Python at start-up when this folder is on PYTHONPATH.

With ``ARCHSEARCH_TEST_OOM_RANK=r`` in the environment, the process whose ``RANK`` is ``r`` gets
an ``AdamW.step`` that raises ``torch.OutOfMemoryError`` on its second call, as a GPU that runs out
of memory in the optimizer step would; every other process is untouched.
"""
import os

if os.environ.get("RANK") is not None and os.environ.get("RANK") == os.environ.get("ARCHSEARCH_TEST_OOM_RANK"):
    import torch

    _step = torch.optim.AdamW.step
    _calls = [0]

    def _step_that_runs_out(self, *args, **kwargs):
        _calls[0] += 1
        if _calls[0] == 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected by the test)")
        return _step(self, *args, **kwargs)

    torch.optim.AdamW.step = _step_that_runs_out
