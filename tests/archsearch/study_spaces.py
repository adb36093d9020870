"""Tiny spaces for the study tests: real trial processes, a few optimizer steps each."""
from __future__ import annotations

import copy

TINY = {
    "name": "tiny",
    "task": {"name": "mqar", "params": {"vocab_size": 32, "seq_len": 16, "num_kv_pairs": 2,
                                        "num_train_examples": 256, "num_test_examples": 32}},
    "model": {"depth": 1, "d_model": 16, "num_heads": 2, "mlp_expansion": 0,
              "per_layer": {"blocks": ["linear_attn", "softmax", "gated_deltanet"]}},
    # share 1.0 for a one-layer softmax stack: infeasible, never trained
    "constraints": {"max_softmax_share": 0.5},
    "objectives": [{"name": "quality", "metric": "accuracy"}, {"name": "decode_memory", "context": 256}],
    "budget": {"tokens": 16 * 8 * 3, "batch_size": 8, "max_seconds": 20, "device": "cpu",
               "precision": "fp32", "measure_repeats": 1},
    # grid: the 3 one-layer stacks, each once
    "sampler": {"name": "grid"},
    "study": {"trials": 3, "seed": 0},
}


_finished: dict = {}


def finished_study():
    """The tiny study run to the end once per test session (its two trainings are the slow part):
    3 trials (linear and Gated DeltaNet trained, softmax infeasible), then a 4th trial that repeats
    the linear stack (enqueued) and reuses its result. Returns ``(space, root, summaries)``."""
    if not _finished:
        import atexit
        import shutil
        import tempfile
        from pathlib import Path

        import search_spaces
        from archsearch import study as st
        from launch.slots import plan_slots

        root = Path(tempfile.mkdtemp(prefix="archsearch-study-"))
        atexit.register(shutil.rmtree, root, True)
        space = search_spaces.Space.from_dict(tiny())
        first = st.run_study(space, root=root, slots=plan_slots([], 1, 1), progress=False)
        st.load_study("tiny", None, root).enqueue_trial({"layer_0": "linear_attn"})
        again = st.run_study(space, root=root, n_trials=4, slots=plan_slots([], 1, 1), progress=False)
        _finished.update(space=space, root=root, summaries=(first, again))
    return _finished["space"], _finished["root"], _finished["summaries"]


def tiny(**changes) -> dict:
    d = copy.deepcopy(TINY)
    for path, value in changes.items():
        keys = path.split("__")
        cur = d
        for k in keys[:-1]:
            cur = cur[k]
        cur[keys[-1]] = value
    return d
