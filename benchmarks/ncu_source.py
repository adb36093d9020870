"""Where one training kernel spends its issue slots, instruction by instruction (Nsight Compute's
source page).

    python benchmarks/ncu_source.py --out DIR [--case gated_delta_rule:2048] [--kernel _bwd_dqkwg_kernel] [--top 30]
    python benchmarks/ncu_source.py --out DIR --from-csv   # no GPU: the tables again from DIR's kept CSV

Profiles the kernel's first launch in the second fwd + bwd step of ``family:T`` (the child of
``ncu_kernels.py``: bf16, 16 heads of 128, 64k tokens) with ncu's source counters and reads the
report's SASS source page. Prints and writes ``ncu_source.md`` / ``.json`` (and ncu's CSV,
``ncu_source_sass.csv``): the instructions with the most warp-stall samples, in program order (where in
the kernel its warps wait), the kernel cut at its warpgroup MMA groups (each stretch's share of samples and
of executed instructions), and the opcode mix by executed instructions. (ncu 2025.3's per-line view of
the Python source gives the lines without counters, so the instructions are the unit here.) Why a
script: ``ncu_kernels.py`` reports a kernel's totals (bandwidth, occupancy, stall reasons); deciding
which part of a kernel to change needs where the stalls sit.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import re
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from ncu_kernels import find_ncu  # noqa: E402


def _number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def _rows(csv_text: str) -> list[dict]:
    """ncu's CSV source page -> dict rows (lines before the header, e.g. ``==PROF==`` notes, skipped)."""
    lines = csv_text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"') and "Source" in line), None)
    if start is None:
        return []
    return list(csv.DictReader(io.StringIO("\n".join(lines[start:]))))


def _column(rows: list[dict], *needles: str) -> str | None:
    """The first column whose name contains every needle (ncu's names vary between versions)."""
    for name in (rows[0] if rows else {}):
        if name is not None and all(n.lower() in name.lower() for n in needles):
            return name
    return None


def source_page(ncu: str, report: Path, keep: Path) -> tuple[list[dict], str]:
    """The report's SASS source page as rows, ncu's CSV also written to ``keep`` (its first 2 MB)."""
    proc = subprocess.run([ncu, "--import", str(report), "--page", "source", "--csv", "--print-source", "sass"],
                          capture_output=True, text=True, timeout=300)
    keep.write_text(proc.stdout[:2_000_000])
    return _rows(proc.stdout), (proc.stderr or proc.stdout)[-1500:]


def _counters(rows: list[dict]) -> tuple[list[str], list[float], list[float]]:
    """Per SASS row: ``(instruction text, warp-stall samples, instructions executed)``."""
    src = _column(rows, "source")
    samples = _column(rows, "stall sampling", "all") or _column(rows, "sampling")
    executed = _column(rows, "instructions executed")
    return ([(r.get(src) or "").strip() for r in rows],
            [_number(r.get(samples, "0")) if samples else 0.0 for r in rows],
            [_number(r.get(executed, "0")) if executed else 0.0 for r in rows])


def top_instructions(rows: list[dict], n: int) -> list[dict]:
    """The ``n`` SASS instructions with the most warp-stall samples, in program order: index (the
    instruction's place in the listing), text, share of samples and of executed instructions."""
    text, s, e = _counters(rows)
    tot_s, tot_e = (sum(s) or 1.0), (sum(e) or 1.0)
    top = sorted(sorted(range(len(rows)), key=lambda i: -s[i])[:n])
    return [dict(index=i, text=text[i][:100], samples_pct=100 * s[i] / tot_s,
                 executed_pct=100 * e[i] / tot_e) for i in top]


def stretches(rows: list[dict], gap: int = 64) -> list[dict]:
    """The kernel cut at its warpgroup MMA groups (``HGMMA`` instructions less than ``gap`` apart form one
    group): ``[first, last]`` instruction indices of each stretch before, at and between the groups, with
    its share of warp-stall samples and of executed instructions."""
    text, s, e = _counters(rows)
    mma = [i for i, t in enumerate(text) if "HGMMA" in t]
    groups: list[list[int]] = []
    for i in mma:
        if groups and i - groups[-1][1] < gap:
            groups[-1][1] = i
        else:
            groups.append([i, i])
    cuts, at = [], 0
    for a, b in groups:
        if a > at:
            cuts.append((at, a - 1, "between"))
        cuts.append((a, b, "mma"))
        at = b + 1
    if at < len(rows):
        cuts.append((at, len(rows) - 1, "between"))
    tot_s, tot_e = (sum(s) or 1.0), (sum(e) or 1.0)
    return [dict(first=a, last=b, kind=k, samples_pct=100 * sum(s[a:b + 1]) / tot_s,
                 executed_pct=100 * sum(e[a:b + 1]) / tot_e) for a, b, k in cuts]


def opcode_mix(rows: list[dict]) -> dict:
    """Executed instructions and stall samples per SASS opcode (its first word, predicates dropped)."""
    mix: dict = defaultdict(lambda: [0.0, 0.0])
    for line, s, e in zip(*_counters(rows)):
        words = [w for w in re.split(r"\s+", line) if w and not w.startswith("@")]
        if not words:
            continue
        op = words[0].split(".")[0]
        mix[op][0] += e
        mix[op][1] += s
    return {op: {"executed": e, "samples": s} for op, (e, s) in mix.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", default="gated_delta_rule:2048")
    ap.add_argument("--kernel", default="_bwd_dqkwg_kernel")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--out", type=Path, default=ROOT / "bench_out" / "ncu_source")
    ap.add_argument("--from-csv", action="store_true",
                    help="no GPU: rebuild ncu_source.md from the ncu_source_sass.csv / .json kept in --out")
    a = ap.parse_args(argv)
    if a.from_csv:
        res = json.loads((a.out / "ncu_source.json").read_text())
        report_md(res, a.out, None, None, a.top)
        return 0
    ncu = find_ncu()
    if ncu is None:
        print("ncu_source: Nsight Compute (ncu) not found", file=sys.stderr)
        return 2
    a.out.mkdir(parents=True, exist_ok=True)
    family, _, T = a.case.partition(":")
    report = a.out / "ncu_source"
    cmd = [ncu, "--clock-control", "none", "--target-processes", "all", "--profile-from-start", "off",
           "--kernel-name", f"regex:{a.kernel}", "--launch-count", "1", "--import-source", "yes",
           "--section", "SourceCounters", "--section", "WarpStateStats", "--section", "LaunchStats",
           "-f", "-o", str(report), sys.executable, str(ROOT / "benchmarks" / "ncu_kernels.py"), "--child", family, T]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    rep = report.with_suffix(".ncu-rep")
    res: dict = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "case": a.case, "kernel": a.kernel,
                 "command": "python benchmarks/ncu_source.py " + " ".join(argv or sys.argv[1:]),
                 "ncu_version": subprocess.run([ncu, "--version"], capture_output=True, text=True).stdout.strip()[-80:]}
    if proc.returncode != 0 or not rep.exists():
        res["error"] = (proc.stderr or proc.stdout)[-2000:]
        print(res["error"], file=sys.stderr)
        (a.out / "ncu_source.json").write_text(json.dumps(res, indent=1))
        return 1
    report_md(res, a.out, ncu, rep, a.top)
    return 0


def report_md(res: dict, out: Path, ncu: str | None, rep: Path | None, top: int) -> None:
    """``ncu_source.md`` / ``.json`` from the report's SASS source page (read with ``ncu``), or from the
    ``ncu_source_sass.csv`` kept in ``out`` when ``ncu`` is None (``--from-csv``)."""
    keep = out / "ncu_source_sass.csv"
    if ncu is not None:
        sass_rows, sass_err = source_page(ncu, rep, keep)
    else:
        sass_rows, sass_err = _rows(keep.read_text()), "no rows in " + str(keep)
    md = [f"# Nsight Compute source counters: `{res['kernel']}`, {res['case']} ({res['when']})", "",
          f"Command: `{res['command']}` ({res.get('ncu_version', '')})", ""]
    mix = opcode_mix(sass_rows)
    res["sass_mix"], res["top"] = mix, top_instructions(sass_rows, top)
    if not mix:
        md += ["No SASS view: " + sass_err.replace("\n", " ")[:600]]
        res["sass_error"] = sass_err
    else:
        md += [f"## The {top} SASS instructions with the most warp-stall samples ({len(sass_rows)} in the kernel), "
               "in program order", "", "| # | samples % | executed % | instruction |", "|---|---|---|---|"]
        md += [f"| {r['index']} | {r['samples_pct']:.2f} | {r['executed_pct']:.2f} | `{r['text']}` |" for r in res["top"]]
        res["stretches"] = stretches(sass_rows)
        md += ["", "## The kernel cut at its warpgroup MMA groups", "",
               "| instructions | what | samples % | executed % |", "|---|---|---|---|"]
        md += [f"| {r['first']}-{r['last']} | {'HGMMA group' if r['kind'] == 'mma' else 'between'} | "
               f"{r['samples_pct']:.1f} | {r['executed_pct']:.1f} |" for r in res["stretches"]]
        tot_e = sum(v["executed"] for v in mix.values()) or 1.0
        tot_s = sum(v["samples"] for v in mix.values()) or 1.0
        md += ["", "## SASS opcodes by executed instructions", "", "| opcode | executed % | samples % |", "|---|---|---|"]
        md += [f"| {op} | {100 * v['executed'] / tot_e:.1f} | {100 * v['samples'] / tot_s:.1f} |"
               for op, v in sorted(mix.items(), key=lambda kv: -kv[1]["executed"])[:top]]
    text = "\n".join(md) + "\n"
    print(text)
    (out / "ncu_source.md").write_text(text)
    (out / "ncu_source.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    sys.exit(main())
