"""Hardware counters of the training kernels (Nsight Compute), for deciding what limits each one.

    python benchmarks/ncu_kernels.py --out DIR [--cases gla:2048,delta_rule:32768] [--kernels REGEX]
    python benchmarks/ncu_kernels.py --out DIR --cases decode:w2,decode:o_proj --kernels "_skinny_kernel|_read_kernel"

For every ``family:T`` case, runs one forward + backward of the op at the benchmark's shape (bf16,
16 heads of dim 128, 64k tokens) in a child process under ``ncu`` (``--clock-control none``: the
device notes say to leave the clocks alone), profiling every launch of a matching kernel in its
second step (the first compiles) and reporting each kernel's last one, and prints a markdown table per case: duration, DRAM / L2 / L1
throughput as % of peak, achieved occupancy, registers and the top warp-stall reasons (cycles per
issued instruction), and under it the kernels' summed time against their DRAM floor (the bytes
they read and wrote at the copy bandwidth; ``--kernels ".*"`` for a whole step). Writes
``ncu_<family>_<T>.csv`` (ncu's raw rows) and ``ncu_kernels.json`` / ``ncu_kernels.md`` into DIR.

    python benchmarks/ncu_kernels.py --out DIR --cases gated_delta_rule:2048 --kernels ".*"   # a whole step

Why a script and not ``torch.profiler``: the profiler gives times only; which of memory, latency
or issue bounds a kernel needs the counters (``kernel_breakdown`` in gpu_kernels.py has the times).
"""
from __future__ import annotations

import argparse
import csv
import glob
import io
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CASES = "gla:2048,delta_rule:2048,delta_rule:32768,gated_delta_rule:2048"
DEFAULT_KERNELS = "_bwd_chunk_kernel|_bwd_sub_kernel|_intra_a_kernel|_fwd_o_kernel|_bwd_dqkwg_kernel|" \
                  "_wy_bwd_kernel|_fwd_h_kernel|_bwd_dh_kernel|_solve_tril_kernel|_kkt_solve_kernel|_rev_cumsum_kernel"
STALLS = ("long_scoreboard", "short_scoreboard", "barrier", "mio_throttle", "lg_throttle",
          "math_pipe_throttle", "wait", "not_selected", "dispatch_stall", "no_instruction", "membar",
          "tex_throttle", "drain", "branch_resolving")
METRICS = {
    "duration_us": "gpu__time_duration.sum",
    "dram_pct": "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    "l2_pct": "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    "l1_pct": "l1tex__throughput.avg.pct_of_peak_sustained_active",
    "sm_pct": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "tensor_pct": "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",  # mma.sync
    "occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "l2_hit_pct": "lts__t_sector_hit_rate.pct",
    "dram_read_mb": "dram__bytes_read.sum",
    "dram_write_mb": "dram__bytes_write.sum",
    "l2_read_mb": "lts__t_sectors_srcunit_tex_op_read.sum",
    "registers": "launch__registers_per_thread",
    "cycles_per_issue": "smsp__average_warp_latency_per_inst_issued.ratio",
}
STALL_METRICS = {s: f"smsp__average_warps_issue_stalled_{s}_per_issue_active.ratio" for s in STALLS}


def find_ncu() -> str | None:
    """``ncu`` on PATH, else the newest Nsight Compute under /opt/nvidia or /usr/local/cuda."""
    found = shutil.which("ncu")
    if found:
        return found
    hits = sorted(glob.glob("/opt/nvidia/nsight-compute/*/ncu") + glob.glob("/usr/local/cuda*/bin/ncu"))
    return hits[-1] if hits else None


def known_metrics(ncu: str, wanted: list[str]) -> list[str]:
    """The metrics of ``wanted`` whose base name this ncu knows for the current GPU (one unknown
    name makes ncu refuse the whole list)."""
    try:
        text = subprocess.run([ncu, "--query-metrics"], check=False, capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return wanted
    bases = {line.split()[0] for line in text.splitlines() if line.strip()}
    kept = [m for m in wanted if m.rsplit(".", 1)[0] in bases or m.split(".")[0] in bases]
    return kept or wanted


def child(family: str, T: str) -> None:
    """A warm-up forward + backward (compiles) and a second one; ncu profiles both, ``parse`` keeps
    the second's launches. ``decode:GEMM`` (``read_ceiling.WEIGHTS``: o_proj, w2, in_proj, w13):
    the decode layer's skinny kernel on that weight at batch 16, then the streaming read of as
    many bytes that ran fastest in ``read_ceiling.md`` (``_read_kernel``), each twice on fresh
    weights: what keeps the GEMM from its size's read ceiling."""
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import importlib

    import torch
    from gpu_common import TOKENS, fwd_bwd, positional, train_inputs

    if family == "decode":
        import read_ceiling

        sets, gemm = read_ceiling.skinny_case(T, layers=2)
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        torch.cuda.profiler.start()  # ncu runs with --profile-from-start off
        for s in sets:
            gemm(s)
            torch.cuda.synchronize()
        for s in sets:
            read_ceiling.read_sum(s["w"].view(-1), 8 * sms, 4096, 2, 4)  # 8/SM, block 4096, 2 stages, 4 warps
            torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        return
    mod = importlib.import_module(f"blocks.ops.{family}")
    T = int(T)
    pos = positional(family, train_inputs(family, TOKENS // T, T))
    run = fwd_bwd(lambda: mod.chunk(*pos)[0], pos)
    run()  # compiles; not profiled
    torch.cuda.synchronize()
    torch.cuda.profiler.start()  # ncu runs with --profile-from-start off: this one step only
    run()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def parse(csv_text: str) -> dict:
    """ncu ``--csv --page raw`` output -> ``{kernel: {metric: value}}``: the last launch of each,
    with ``launches`` and, summed over every launch in the CSV, ``step_us`` and ``step_dram_mb``
    (read + written; the profiled range is one training step since ``--profile-from-start off``;
    CSVs from before it hold the warm-up step too)."""
    lines = [ln for ln in csv_text.splitlines() if ln.startswith('"')]
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    if len(rows) < 3:
        return {}
    header, body = rows[0], rows[2:]  # rows[1]: units
    units = dict(zip(header, rows[1]))
    out: dict = {}
    for row in body:
        rec = dict(zip(header, row))
        name = rec.get("Kernel Name", "?").split("(")[0]
        vals: dict = {}
        for key, metric in {**METRICS, **STALL_METRICS}.items():
            raw = rec.get(metric, "").replace(",", "")
            try:
                val = float(raw)
            except ValueError:
                continue
            unit = units.get(metric, "")
            if key == "duration_us":
                val *= {"ns": 1e-3, "nsecond": 1e-3, "ms": 1e3, "msecond": 1e3, "s": 1e6, "second": 1e6}.get(unit, 1.0)
            if key.endswith("_mb"):
                scale = {"byte": 1e-6, "Kbyte": 1e-3, "Mbyte": 1.0, "Gbyte": 1e3, "sector": 32e-6}.get(unit, 1.0)
                val *= scale
            vals[key] = val
        prev = out.get(name, {})
        vals["launches"] = prev.get("launches", 0) + 1
        vals["step_us"] = prev.get("step_us", 0.0) + vals.get("duration_us", 0.0)
        vals["step_dram_mb"] = (prev.get("step_dram_mb", 0.0) + vals.get("dram_read_mb", 0.0)
                                + vals.get("dram_write_mb", 0.0))
        out[name] = vals  # the last launch's counters
    return out


def dram_floor(kernels: dict, copy_bytes_per_s: float | None) -> dict:
    """Every profiled launch's summed time and DRAM bytes (read + written; ``parse``'s ``step_``
    sums, else each kernel's last launch), and with ``copy_bytes_per_s`` the time those bytes take
    at that bandwidth: how far the step's kernels run from their memory floor. Kernels that overlap
    (the walks in segments at 16k / 32k) add up to more than the step's wall time."""
    us = sum(m.get("step_us", m.get("duration_us", 0.0)) for m in kernels.values())
    mb = sum(m.get("step_dram_mb", m.get("dram_read_mb", 0.0) + m.get("dram_write_mb", 0.0))
             for m in kernels.values())
    out = {"kernels": len(kernels), "launches": sum(m.get("launches", 1) for m in kernels.values()),
           "us": us, "dram_mb": mb}
    if copy_bytes_per_s:
        out["copy_tb_per_s"] = copy_bytes_per_s / 1e12
        if mb > 0:  # (no DRAM counters in the CSV: no floor)
            out["floor_us"] = mb * 1e6 / copy_bytes_per_s * 1e6  # MB -> bytes; s -> us
            out["x_floor"] = us / out["floor_us"]
    return out


def floor_line(floor: dict) -> str:
    line = (f"All {floor['launches']} launches of the {floor['kernels']} kernels above: {floor['us']:.1f} us, "
            f"{floor['dram_mb']:.0f} MB of DRAM traffic (read + written)")
    if "floor_us" in floor:
        line += (f"; at the copy bandwidth ({floor['copy_tb_per_s']:.2f} TB/s) those bytes take "
                 f"{floor['floor_us']:.1f} us: the kernels run at {floor['x_floor']:.2f}x their DRAM floor")
    return line + "."


def table(case: str, kernels: dict, floor: dict | None = None) -> str:
    head = ["kernel", "us", "DRAM %", "L2 %", "L1 %", "SM %", "mma %", "occ %", "L2 hit %",
            "DRAM MB", "DRAM wr MB", "L2 rd MB", "regs", "cyc/issue", "top stalls (cycles per issue)"]
    lines = [f"### {case}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, m in sorted(kernels.items(), key=lambda kv: -kv[1].get("duration_us", 0)):
        stalls = sorted(((s, m[s]) for s in STALLS if s in m), key=lambda kv: -kv[1])[:3]
        cells = [name] + [f"{m[k]:.1f}" if k in m else "-" for k in
                          ("duration_us", "dram_pct", "l2_pct", "l1_pct", "sm_pct", "tensor_pct",
                           "occupancy_pct", "l2_hit_pct", "dram_read_mb", "dram_write_mb", "l2_read_mb",
                           "registers", "cycles_per_issue")]
        cells.append(", ".join(f"{s} {v:.1f}" for s, v in stalls))
        lines.append("| " + " | ".join(cells) + " |")
    if floor is not None:
        lines += ["", floor_line(floor)]
    return "\n".join(lines)


def measured_copy_bandwidth() -> float | None:
    """``gpu_common.copy_bandwidth()`` when a GPU is here (bytes / s), else None."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import torch

    if not torch.cuda.is_available():
        return None
    from gpu_common import copy_bandwidth

    bw = copy_bandwidth()
    torch.cuda.empty_cache()  # the profiled child gets the memory
    return bw


def rebuild(out: Path, copy_bytes_per_s: float | None = None) -> int:
    """``--from-csv``: the report from the CSVs an earlier run left in ``out`` (e.g. when only those
    came back from the GPU host)."""
    files = sorted(out.glob("ncu_*_*.csv"))
    if not files:
        print(f"ncu_kernels: no ncu_<family>_<T>.csv in {out}", file=sys.stderr)
        return 2
    results: dict = {"rebuilt_from": [f.name for f in files], "cases": {}}
    md = []
    for f in files:
        stem = f.stem[len("ncu_"):]
        # decode cases name a GEMM (o_proj: an underscore of its own); the others end in a length
        family, T = ("decode", stem[len("decode_"):]) if stem.startswith("decode_") else stem.rsplit("_", 1)
        case = f"{family}:{T}"
        kernels = parse(f.read_text())
        floor = dram_floor(kernels, copy_bytes_per_s)
        results["cases"][case] = {"kernels": kernels, "dram_floor": floor}
        md.append(table(case, kernels, floor))
        print(md[-1] + "\n")
    (out / "ncu_kernels.json").write_text(json.dumps(results, indent=1))
    (out / "ncu_kernels.md").write_text("\n\n".join(md) + "\n")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "bench_out" / "ncu")
    ap.add_argument("--cases", default=DEFAULT_CASES, help="comma list of family:T")
    ap.add_argument("--kernels", default=DEFAULT_KERNELS, help="regex of kernel names to profile")
    ap.add_argument("--timeout", type=float, default=150.0, help="seconds per case")
    ap.add_argument("--from-csv", action="store_true",
                    help="no profiling: rebuild the tables, ncu_kernels.json/.md from the ncu_*.csv in --out")
    ap.add_argument("--copy-tbs", type=float, default=None,
                    help="copy bandwidth in TB/s for each case's DRAM floor line; default: measured here "
                         "(gpu_common.copy_bandwidth) when a GPU is present, else no floor")
    ap.add_argument("--child", nargs=2, metavar=("FAMILY", "T"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child[0], args.child[1])
        return 0
    copy_bw = args.copy_tbs * 1e12 if args.copy_tbs else None
    if args.from_csv:
        return rebuild(args.out, copy_bw)
    ncu = find_ncu()
    if ncu is None:
        print("ncu_kernels: Nsight Compute (ncu) not found on PATH, /opt/nvidia or /usr/local/cuda", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    if copy_bw is None:
        copy_bw = measured_copy_bandwidth()
    results: dict = {"ncu": ncu, "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                     "command": "python benchmarks/ncu_kernels.py " + " ".join(argv or sys.argv[1:]), "cases": {}}
    md = []
    metrics_list = known_metrics(ncu, list(METRICS.values()) + list(STALL_METRICS.values()))
    results["metrics_dropped"] = sorted((set(METRICS.values()) | set(STALL_METRICS.values())) - set(metrics_list))
    metrics = ",".join(metrics_list)
    for case in [c for c in args.cases.split(",") if c]:
        family, _, T = case.partition(":")
        # every launch of a matching kernel in the child's profiled range (its second step)
        cmd = [ncu, "--clock-control", "none", "--target-processes", "all", "--profile-from-start", "off",
               "--csv", "--page", "raw",
               "--kernel-name", f"regex:{args.kernels}", "--metrics", metrics,
               sys.executable, __file__, "--child", family, T]
        t0 = time.time()
        try:
            proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=args.timeout, env=os.environ)
            text, err, rc = proc.stdout, proc.stderr, proc.returncode
        except subprocess.TimeoutExpired as exc:
            text = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            err, rc = "timeout", 124
        (args.out / f"ncu_{family}_{T}.csv").write_text(text)
        parsed_all = parse(text)
        results["cases"][case] = {"rc": rc, "seconds": round(time.time() - t0, 1), "kernels": parsed_all,
                                  "dram_floor": dram_floor(parsed_all, copy_bw)}
        if rc != 0 or not parsed_all:
            results["cases"][case]["stderr_tail"] = err[-1500:]
            print(f"{case}: ncu exit {rc}; stderr tail:\n{err[-1500:]}", flush=True)
        md.append(table(case, parsed_all, results["cases"][case]["dram_floor"]))
        print(md[-1] + "\n", flush=True)
    (args.out / "ncu_kernels.json").write_text(json.dumps(results, indent=1))
    (args.out / "ncu_kernels.md").write_text("\n\n".join(md) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
