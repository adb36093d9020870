"""Fill the sections a benchmark run did not reach from another run's results, marked as carried.

``gpu_kernels.py --deadline`` skips the sections that would start too late in a capped device call
(the step, decode and breakdown sections come after training). When the code behind a skipped
section did not change since an earlier run, its figures still hold: this writes the new run's
``gpu_results.json`` / ``.md`` and plots with those sections taken from the earlier file, and the
markdown header names each carried section and the run it came from (``carried`` in the JSON), so a
reader never takes them for this run's.

    python benchmarks/carry_sections.py NEW/gpu_results.json --carry-from docs/benchmarks/gpu_results.json \\
        --out docs/benchmarks [--sections step,softmax_decode]

Only sections the new run lacks are taken (a section it measured, even one that failed, stays as
it is); a section carried in the earlier file keeps its original date.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_kernels import SECTIONS, write_results  # noqa: E402 - the measured sections; env/settings are the run's own


def carry(new: dict, old: dict, sections=SECTIONS) -> dict:
    """``new`` with each of ``sections`` it lacks and ``old`` has (without an error) copied from
    ``old``; ``new["carried"]`` maps each carried section to the date of the run that measured it."""
    res = dict(new)
    carried = dict(res.get("carried", {}))
    for name in sections:
        if name in res or name not in old:
            continue
        if isinstance(old[name], dict) and "error" in old[name]:
            continue
        res[name] = old[name]
        carried[name] = old.get("carried", {}).get(name, old["env"]["when"])
    if carried:
        res["carried"] = carried
    return res


def _load(path: str, flag: str) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise SystemExit(f"carry_sections: {flag}: no such file {path}") from None
    except json.JSONDecodeError as exc:
        raise SystemExit(f"carry_sections: {flag}: {path} is not JSON ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(data, dict) or "env" not in data:
        raise SystemExit(f"carry_sections: {flag}: {path} is not a gpu_kernels.py results file (no 'env')")
    return data


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("new", help="the new run's gpu_results.json")
    ap.add_argument("--carry-from", required=True, help="an earlier run's gpu_results.json")
    ap.add_argument("--out", required=True, help="folder for the merged gpu_results.json/.md and plots")
    ap.add_argument("--sections", default=",".join(SECTIONS), help="comma list of sections that may be carried")
    a = ap.parse_args(argv)
    sections = [s for s in a.sections.split(",") if s]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        ap.error(f"--sections: unknown {unknown}; known: {', '.join(SECTIONS)}")
    res = carry(_load(a.new, "new"), _load(a.carry_from, "--carry-from"), sections)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    write_results(res, out)
    print(f"carried: {res.get('carried', {}) or 'nothing'}; wrote {out / 'gpu_results.md'}, "
          f"{', '.join(res.get('plots', []))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
