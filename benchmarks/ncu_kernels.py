"""Hardware counters of the training kernels (Nsight Compute), for deciding what limits each one.

    python benchmarks/ncu_kernels.py --out DIR [--cases gla:2048,delta_rule:32768] [--kernels REGEX]
    python benchmarks/ncu_kernels.py --out DIR --cases decode:w2,decode:o_proj --kernels "_skinny_kernel|_read_kernel"

For every ``family:T`` case, runs one forward + backward of the op at the benchmark's shape (bf16,
16 heads of dim 128, 64k tokens) in a child process under ``ncu`` (``--clock-control none``: the
device notes say to leave the clocks alone), profiling every launch of a matching kernel and
reporting each kernel's last one, and prints a markdown table per case: duration, DRAM / L2 / L1
throughput as % of peak, achieved occupancy, registers and the top warp-stall reasons (cycles per
issued instruction). Writes
``ncu_<family>_<T>.csv`` (ncu's raw rows) and ``ncu_kernels.json`` / ``ncu_kernels.md`` into DIR.

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
                  "_wy_bwd_kernel|_fwd_h_kernel|_bwd_dh_kernel|_solve_tril_kernel|_rev_cumsum_kernel"
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
        for s in sets:
            gemm(s)
            torch.cuda.synchronize()
        for s in sets:
            read_ceiling.read_sum(s["w"].view(-1), 8 * sms, 4096, 2, 4)  # 8/SM, block 4096, 2 stages, 4 warps
            torch.cuda.synchronize()
        return
    mod = importlib.import_module(f"blocks.ops.{family}")
    T = int(T)
    pos = positional(family, train_inputs(family, TOKENS // T, T))
    run = fwd_bwd(lambda: mod.chunk(*pos)[0], pos)
    run()
    torch.cuda.synchronize()
    run()
    torch.cuda.synchronize()


def parse(csv_text: str) -> dict:
    """ncu ``--csv --page raw`` output -> ``{kernel: {metric: value}}`` (the last launch of each)."""
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
        out[name] = vals  # the last launch: the child's second step
    return out


def table(case: str, kernels: dict) -> str:
    head = ["kernel", "us", "DRAM %", "L2 %", "L1 %", "SM %", "mma %", "occ %", "L2 hit %",
            "DRAM MB", "L2 rd MB", "regs", "cyc/issue", "top stalls (cycles per issue)"]
    lines = [f"### {case}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, m in sorted(kernels.items(), key=lambda kv: -kv[1].get("duration_us", 0)):
        stalls = sorted(((s, m[s]) for s in STALLS if s in m), key=lambda kv: -kv[1])[:3]
        cells = [name] + [f"{m[k]:.1f}" if k in m else "-" for k in
                          ("duration_us", "dram_pct", "l2_pct", "l1_pct", "sm_pct", "tensor_pct",
                           "occupancy_pct", "l2_hit_pct", "dram_read_mb", "l2_read_mb", "registers",
                           "cycles_per_issue")]
        cells.append(", ".join(f"{s} {v:.1f}" for s, v in stalls))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def rebuild(out: Path) -> int:
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
        results["cases"][case] = {"kernels": parse(f.read_text())}
        md.append(table(case, results["cases"][case]["kernels"]))
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
    ap.add_argument("--child", nargs=2, metavar=("FAMILY", "T"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child[0], args.child[1])
        return 0
    if args.from_csv:
        return rebuild(args.out)
    ncu = find_ncu()
    if ncu is None:
        print("ncu_kernels: Nsight Compute (ncu) not found on PATH, /opt/nvidia or /usr/local/cuda", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict = {"ncu": ncu, "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                     "command": "python benchmarks/ncu_kernels.py " + " ".join(argv or sys.argv[1:]), "cases": {}}
    md = []
    metrics_list = known_metrics(ncu, list(METRICS.values()) + list(STALL_METRICS.values()))
    results["metrics_dropped"] = sorted((set(METRICS.values()) | set(STALL_METRICS.values())) - set(metrics_list))
    metrics = ",".join(metrics_list)
    for case in [c for c in args.cases.split(",") if c]:
        family, _, T = case.partition(":")
        # every launch of a matching kernel is profiled (both steps); parse() keeps the last
        cmd = [ncu, "--clock-control", "none", "--target-processes", "all", "--csv", "--page", "raw",
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
        results["cases"][case] = {"rc": rc, "seconds": round(time.time() - t0, 1), "kernels": parsed_all}
        if rc != 0 or not parsed_all:
            results["cases"][case]["stderr_tail"] = err[-1500:]
            print(f"{case}: ncu exit {rc}; stderr tail:\n{err[-1500:]}", flush=True)
        md.append(table(case, parsed_all))
        print(md[-1] + "\n", flush=True)
    (args.out / "ncu_kernels.json").write_text(json.dumps(results, indent=1))
    (args.out / "ncu_kernels.md").write_text("\n\n".join(md) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
