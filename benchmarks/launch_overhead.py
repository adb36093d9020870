"""Per-trial launch overhead on CPU: DeepSpeed's launcher vs a direct ``python -m archsearch.trial``.

Runs the same tiny real trial (2 layers, d_model 16, 4 steps of MQAR) through ``launch.process``
on a single-process CPU slot, alternating direct start and ``use_launcher=True``, and prints the
wall time of each and the median difference. This is the measurement behind starting
single-process CPU slots directly (docs/distributed.md).

    OMP_NUM_THREADS=1 python benchmarks/launch_overhead.py --repeats 3 [--json OUT.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from archsearch.spec import ArchSpec, LayerSpec
from launch.process import start_trial
from launch.slots import plan_slots


def tiny_trial(d: Path) -> tuple[Path, Path]:
    spec = ArchSpec(vocab_size=64, d_model=16, mlp_expansion=0,
                    layers=(LayerSpec("linear_attn", {"num_heads": 2}), LayerSpec("softmax", {"num_heads": 2})))
    (d / "spec.json").write_text(spec.to_json())
    cfg = {"task": "mqar", "task_params": {"vocab_size": 64, "seq_len": 32, "num_kv_pairs": 4,
                                           "num_train_examples": 256, "num_test_examples": 32},
           "train": {"tokens": 2048, "max_seconds": 60, "batch_size": 16, "precision": "fp32"},
           "measure": {"context": 128, "batch": 1, "prefill_len": 16, "repeats": 1, "decode_steps": 2,
                       "throughput": False},
           "seed": 0, "device": "cpu", "out_dir": str(d / "run"), "ds_config": None}
    (d / "cfg.json").write_text(json.dumps(cfg))
    return d / "spec.json", d / "cfg.json"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    (slot,) = plan_slots([], 1, 1)
    walls: dict[str, list[float]] = {"direct": [], "launcher": []}
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        spec, cfg = tiny_trial(d)
        for i in range(args.repeats):
            for name in ("direct", "launcher"):
                t = time.perf_counter()
                p = start_trial(spec, cfg, d / "r.json", slot, d / f"{name}{i}.log", use_launcher=name == "launcher")
                rc = p.wait(600)
                walls[name].append(time.perf_counter() - t)
                status = p.outcome()[0]
                print(f"{name:<9} run {i}: {walls[name][-1]:6.1f} s  rc={rc} {status}", flush=True)
    med = {k: statistics.median(v) for k, v in walls.items()}
    print(f"median direct {med['direct']:.1f} s, launcher {med['launcher']:.1f} s, "
          f"launcher overhead {med['launcher'] - med['direct']:.1f} s per trial")
    if args.json:
        Path(args.json).write_text(json.dumps({"walls": walls, "median": med}, indent=2))


if __name__ == "__main__":
    main()
