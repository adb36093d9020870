"""``ARCHSEARCH_LOW_MEMORY_KERNELS``: parsed by ``blocks.kernels.low_memory_from_env`` (the delta,
gla and scalar-decay kernel modules read it at import), checked by the CLI before any verb runs. CPU only."""
from __future__ import annotations

import pytest

from archsearch.cli import main
from blocks.base import ConfigError
from blocks.kernels import LOW_MEMORY_ENV, low_memory_from_env


@pytest.mark.parametrize("value, low", [(None, False), ("", False), ("0", False), ("1", True), (" 1 ", True)])
def test_low_memory_values(monkeypatch, value, low):
    if value is None:
        monkeypatch.delenv(LOW_MEMORY_ENV, raising=False)
    else:
        monkeypatch.setenv(LOW_MEMORY_ENV, value)
    assert low_memory_from_env() is low


def test_a_bad_value_is_a_one_line_error_in_the_cli(monkeypatch, capsys):
    monkeypatch.setenv(LOW_MEMORY_ENV, "yes")
    with pytest.raises(ConfigError, match="ARCHSEARCH_LOW_MEMORY_KERNELS: must be 0 or 1"):
        low_memory_from_env()
    assert main(["validate", "mqar_tiny"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "archsearch validate: error: ARCHSEARCH_LOW_MEMORY_KERNELS: must be 0 or 1 (or unset), got 'yes'"
