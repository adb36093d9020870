"""Write the benchmark space the GPU scripts share: ``hybrid_lm_small`` with a short training
budget and a random sampler with one seed, so every layout is offered the same candidates in the
same order. ``--smoke`` shrinks it for CPU plumbing checks (gloo slots standing in for GPUs).

    python benchmarks/bench_space.py OUT NAME TOKENS TRIALS [--smoke]    # writes OUT/space.yaml
"""
import argparse

import yaml

import search_spaces


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("name")
    ap.add_argument("tokens", type=int)
    ap.add_argument("trials", type=int)
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    d = search_spaces.load("hybrid_lm_small").to_dict()
    d["name"] = a.name
    d["budget"].update(tokens=a.tokens, max_seconds=45, measure_repeats=2)
    if a.smoke:
        d["model"].update(depth=[2, 4], d_model=[32], num_heads=[2], mlp_expansion=[2.0])
        d["budget"].update(device="cpu", batch_size=16)
        d["task"]["params"] = {"seq_len": 64}
        for o in d["objectives"]:
            if "context" in o:
                o["context"] = 256
            if o.get("task") == "mqar":
                o["task_params"] = {"vocab_size": 256, "seq_len": 64, "num_kv_pairs": 4}
        d["constraints"]["max_decode_memory"]["context"] = 256
    d["sampler"] = {"name": "random", "options": {}}
    d["study"].update(trials=a.trials, seed=0)
    path = f"{a.out}/space.yaml"
    with open(path, "w") as f:
        yaml.safe_dump(d, f, sort_keys=False)
    search_spaces.load(path)  # validates


if __name__ == "__main__":
    main()
