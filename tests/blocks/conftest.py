"""Collection check for the kernel tests. ``make test-kernels`` (and CI) selects the tests that
need Triton's interpreter by name (``-k "interpreter or launch"``), and every other run skips them,
so such a test named otherwise would silently never run: refuse it when collecting."""
from __future__ import annotations

import pytest


def _needs_interpreter(item) -> bool:
    """Marked to skip unless ``TRITON_INTERPRET=1`` (each kernel test file's interpreter mark)."""
    return any(m.name == "skipif" and "TRITON_INTERPRET=1" in str(m.kwargs.get("reason", ""))
               for m in item.iter_markers())


def pytest_collection_modifyitems(config, items):
    hidden = [item.nodeid for item in items
              if _needs_interpreter(item) and "interpreter" not in item.name and "launch" not in item.nodeid]
    if hidden:
        raise pytest.UsageError("tests that need TRITON_INTERPRET=1 must have 'interpreter' in their name "
                                f"(make test-kernels selects them with -k): {', '.join(hidden)}")
