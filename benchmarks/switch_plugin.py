"""A pytest plugin that runs the test suite with kernel switches set, so that a switch not yet on by
default is checked by every GPU test (not only the tests that flip switches):

    ARCHSEARCH_TEST_SET="CACHE_SHIFT_LAST=False" PYTHONPATH=benchmarks:. \
        python -m pytest -p switch_plugin tests/blocks/test_kernels_gpu_gla_delta.py

``ARCHSEARCH_TEST_SET`` takes ``gpu_kernels.py --set``'s syntax (``gpu_common.apply_sets``: names of
``SWITCHES`` entries of any kernel module, values as Python literals); a bad name or value stops the
run before any test. The values set are printed in the session header (and so in the saved log).
Tests that monkeypatch a switch restore it to the value set here.
"""
from __future__ import annotations

import os

ENV = "ARCHSEARCH_TEST_SET"
_applied: dict = {}


def pytest_configure(config) -> None:
    import pytest

    text = os.environ.get(ENV, "")
    if not text:
        return
    from gpu_common import apply_sets

    try:
        _applied.update(apply_sets(text))
    except ValueError as err:
        raise pytest.UsageError(f"{ENV}: {err}") from None


def pytest_report_header(config) -> str:
    return f"{ENV}: {_applied}" if _applied else f"{ENV}: not set"
