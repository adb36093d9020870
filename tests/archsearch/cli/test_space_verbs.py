"""archsearch spaces / validate (validate's error output is tested in tests/search_spaces)."""
from __future__ import annotations

from archsearch.cli import main


def run(capsys, *argv):
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_spaces_and_validate(capsys):
    rc, out, _ = run(capsys, "spaces")
    assert rc == 0 and all(n in out for n in ("mqar_tiny", "hybrid_lm_small", "zoology_mqar"))
    rc, out, _ = run(capsys, "validate", "mqar_tiny")
    assert rc == 0 and "distinct architectures" in out and '"layers"' in out
