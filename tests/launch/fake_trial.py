"""A test-only trial program that misbehaves on purpose (the brief's fault-injection command).

Same command line as ``python -m archsearch.trial`` (``--spec --config --out``); the behaviour
comes from ``FAKE_TRIAL_MODE``:
  ok      join the gloo process group when WORLD_SIZE > 1, all-reduce the ranks, rank 0 writes an
          ``ok`` record holding what each rank saw (world size, sum of ranks, env);
  sleep   print a line, then sleep FAKE_TRIAL_SLEEP seconds (default 60) and write an ok record;
  oom     print a CUDA out-of-memory traceback as PyTorch does, exit 1, no record;
  crash   raise a ValueError, no record;
  record  write the record JSON given in FAKE_TRIAL_RECORD, exit FAKE_TRIAL_RC (default 0);
  real    run the real trial (``python -m archsearch.trial`` with the same arguments);
  sequence  the i-th start of this program (counted in the file FAKE_TRIAL_COUNTER) takes the i-th
          mode of FAKE_TRIAL_SEQUENCE (comma-separated; ``record:STATUS`` writes a record with that
          status); once the list is used up, every start is ``real``.
"""
import argparse
import json
import os
import sys
import time


def write(path, rec):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(rec, f)
    os.replace(tmp, path)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--spec")
    p.add_argument("--config")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    mode = os.environ.get("FAKE_TRIAL_MODE", "ok")
    if mode == "sequence":
        with open(os.environ["FAKE_TRIAL_COUNTER"], "a+") as f:
            f.seek(0)
            i = len(f.read().splitlines())
            f.write(f"{os.getpid()}\n")
        seq = os.environ["FAKE_TRIAL_SEQUENCE"].split(",")
        mode = seq[i] if i < len(seq) else "real"
        if mode.startswith("record:"):
            os.environ["FAKE_TRIAL_RECORD"] = json.dumps({"status": mode[7:], "reason": f"injected {mode[7:]}"})
            mode = "record"
    if mode == "real":
        import runpy

        sys.argv = ["archsearch.trial"] + sys.argv[1:]
        runpy.run_module("archsearch.trial", run_name="__main__", alter_sys=True)
        return
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    env = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                                          "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS")}
    print(f"fake trial rank {rank}/{world} mode {mode} pid {os.getpid()}", flush=True)
    if mode == "ok":
        total = rank
        if world > 1:
            import torch
            import torch.distributed as dist

            dist.init_process_group("gloo")
            t = torch.tensor([float(rank)])
            dist.all_reduce(t)
            total = int(t.item())
            dist.barrier()
            dist.destroy_process_group()
        if rank == 0:
            write(a.out, {"status": "ok", "reason": "", "world_size": world, "rank_sum": total, "env": env})
    elif mode == "sleep":
        time.sleep(float(os.environ.get("FAKE_TRIAL_SLEEP", "60")))
        if rank == 0:
            write(a.out, {"status": "ok", "reason": "", "env": env})
    elif mode == "oom":
        print("Traceback (most recent call last):\n  File \"train.py\", line 1, in <module>\n"
              "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0; 79.1 GiB total)",
              file=sys.stderr, flush=True)
        sys.exit(1)
    elif mode == "crash":
        raise ValueError("injected crash")
    elif mode == "record":
        if rank == 0:
            write(a.out, json.loads(os.environ["FAKE_TRIAL_RECORD"]))
        sys.exit(int(os.environ.get("FAKE_TRIAL_RC", "0")))
    else:
        sys.exit(f"unknown FAKE_TRIAL_MODE {mode}")


if __name__ == "__main__":
    main()
