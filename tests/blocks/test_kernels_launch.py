"""The chunk-kernel modules' launch tables (``LAUNCH``) and ``tiles.launch``, which applies them;
and the sweep that measures them (``benchmarks/kernel_launch_sweep.py``) leaving them as it found
them. CPU only; needs triton importable (the modules compile nothing at import)."""
from __future__ import annotations

import ast
import inspect
import json
import pickle
import sys
import types
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from blocks.kernels import delta, gla, scalar_decay, tiles  # noqa: E402
from fresh_python import run_python  # noqa: E402

MODULES = [delta, gla, scalar_decay]


@pytest.mark.parametrize("mod", MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_switches_name_module_flags_with_their_current_value_among_the_choices(mod):
    source = inspect.getsource(mod)
    for name, values in getattr(mod, "SWITCHES", {}).items():
        assert getattr(mod, name) in values and len(values) > 1, name
        # defined, listed in SWITCHES, and read at least once
        assert source.count(name) >= 3, f"{mod.__name__}.{name} is never read"


@pytest.mark.parametrize("mod", MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_every_launch_entry_is_valid_and_used(mod):
    source = inspect.getsource(mod)
    for name, cfg in mod.LAUNCH.items():
        assert set(cfg) - {"maxnreg", "num_warps_fp32"} == {"num_warps", "num_stages"}, name
        assert cfg["num_warps"] in (1, 2, 4, 8, 16) and cfg.get("num_warps_fp32", 4) in (1, 2, 4, 8, 16), name
        # ptxas' register cap: a multiple of 8 between 24 and 255 registers per thread
        assert cfg.get("maxnreg") is None or (24 <= cfg["maxnreg"] <= 255 and cfg["maxnreg"] % 8 == 0), name
        assert cfg["num_stages"] is None or 1 <= cfg["num_stages"] <= 4, name
        # an entry no launch reads would be swept and "tuned" to no effect
        assert f'_launch(LAUNCH, "{name}"' in source, f"{mod.__name__}.LAUNCH[{name!r}] is never used"


def test_launch_takes_bf16_settings_runs_float32_at_one_stage_and_copies():
    table = {"k": dict(num_warps=8, num_stages=3), "auto": dict(num_warps=4, num_stages=None),
             "capped": dict(num_warps=4, num_stages=2, maxnreg=128), "fp32": dict(num_warps=4, num_stages=2, num_warps_fp32=16)}
    bf16, fp32 = torch.empty(1, dtype=torch.bfloat16), torch.empty(1)
    got = {(n, str(x.dtype)): tiles.launch(table, n, x) for n in table for x in (bf16, fp32)}
    if tiles.INTERPRET:
        assert all(c == dict(num_warps=1, num_stages=1) for c in got.values())
    else:
        assert got[("k", "torch.bfloat16")] == dict(num_warps=8, num_stages=3)
        assert got[("k", "torch.float32")] == dict(num_warps=8, num_stages=1)
        assert got[("auto", "torch.bfloat16")] == dict(num_warps=4, num_stages=tiles.stages(bf16))
        # the register cap is for bf16 tiles (where this Triton takes it); float32 ones run uncapped,
        # and float16 too, which the caps were not measured with
        cap = dict(maxnreg=128) if tiles.supports_maxnreg() else {}
        assert got[("capped", "torch.bfloat16")] == dict(num_warps=4, num_stages=2, **cap)
        assert got[("capped", "torch.float32")] == dict(num_warps=4, num_stages=1)
        assert tiles.launch(table, "capped", torch.empty(1, dtype=torch.float16)) == dict(num_warps=4, num_stages=2)
        # an entry's float32 warp count: float32 inputs only, and never handed to the launch as a keyword
        assert got[("fp32", "torch.float32")] == dict(num_warps=16, num_stages=1)
        assert got[("fp32", "torch.bfloat16")] == dict(num_warps=4, num_stages=2)
    got[("k", "torch.bfloat16")]["num_warps"] = 1
    assert table["k"] == dict(num_warps=8, num_stages=3)  # callers get copies


def _fitted_probe(x, BLOCK):  # a kernel body never compiled: JITFunction.run is stubbed where it is used
    pass


def test_fitted_kernels_step_their_stages_down_to_the_gpus_shared_memory(monkeypatch):
    """``fitted.StageFittedJITFunction``: a launch refused for shared memory (``OutOfResources``)
    is retried with one stage fewer until it fits, and the count that fit is remembered for that
    configuration (later calls launch at it directly; another configuration starts from its own);
    at one stage the error names the kernel, its need and the remedy (``KernelDoesNotFit``, raised at
    once for that configuration from then on); for
    another resource or without ``num_stages`` Triton's error stands. Triton's launch is stubbed:
    shared memory = stages x BLOCK KB against a 100 KB GPU."""
    from triton.runtime.errors import OutOfResources
    from triton.runtime.jit import JITFunction

    from blocks.kernels import fitted

    kernel = JITFunction(_fitted_probe)
    kernel.__class__ = fitted.StageFittedJITFunction
    tried = []

    def launch(self, *args, grid, warmup, **kwargs):
        tried.append(kwargs.get("num_stages"))
        need = (kwargs.get("num_stages") or 3) * kwargs["BLOCK"] * 1024
        if need > 100 * 1024:
            raise OutOfResources(need, 100 * 1024, kwargs.get("resource", "shared memory"))
        return "launched"

    monkeypatch.setattr(JITFunction, "run", launch)
    assert kernel[(1,)](None, BLOCK=48, num_warps=4, num_stages=3) == "launched" and tried == [3, 2]
    tried.clear()
    assert kernel[(1,)](None, BLOCK=48, num_warps=4, num_stages=3) == "launched" and tried == [2]
    tried.clear()
    assert kernel[(1,)](None, BLOCK=32, num_warps=4, num_stages=3) == "launched" and tried == [3]
    tried.clear()
    with pytest.raises(fitted.KernelDoesNotFit) as caught:
        kernel[(1,)](None, BLOCK=128, num_warps=4, num_stages=2)
    assert tried == [2, 1] and isinstance(caught.value, OutOfResources)
    msg = str(caught.value)
    assert "\n" not in msg and "_fitted_probe needs 131072 B" in msg and "gives 102400 B" in msg and "bf16" in msg
    tried.clear()  # a configuration that fit at no setting is refused again without trying them
    with pytest.raises(fitted.KernelDoesNotFit, match="needs 131072 B"):
        kernel[(1,)](None, BLOCK=128, num_warps=4, num_stages=2)
    assert tried == []
    for kwargs in (dict(num_stages=3, resource="threads"), dict()):
        tried.clear()
        with pytest.raises(OutOfResources):
            kernel[(1,)](None, BLOCK=48, num_warps=4, **kwargs)
        assert len(tried) == 1


def test_fitted_kernels_halve_their_loop_blocks_when_one_stage_does_not_fit(monkeypatch):
    """A kernel declared with ``loop_blocks`` (``fitted.jit(loop_blocks=("BLOCK",))``, as the scalar-decay
    ``_bwd_dqkv_kernel``'s V block) that does not fit at one stage is launched with that block halved, from
    the asked stage count down again (``fitted.launch_attempts``), down to ``MIN_LOOP_BLOCK``; the settings
    that fit are remembered for that configuration, and a kernel that fits at none raises
    ``KernelDoesNotFit`` with the need of the last (smallest) try. Triton's launch is stubbed: shared memory
    = stages x BLOCK KB against a 100 KB GPU."""
    from triton.runtime.errors import OutOfResources
    from triton.runtime.jit import JITFunction

    from blocks.kernels import fitted

    kernel = JITFunction(_fitted_probe)
    kernel.__class__ = fitted.StageFittedJITFunction
    kernel.loop_blocks = ("BLOCK",)
    tried = []
    limit_kb = [100]

    def launch(self, *args, grid, warmup, **kwargs):
        tried.append((kwargs["num_stages"], kwargs["BLOCK"]))
        need = kwargs["num_stages"] * kwargs["BLOCK"] * 1024
        if need > limit_kb[0] * 1024:
            raise OutOfResources(need, limit_kb[0] * 1024, "shared memory")
        return "launched"

    monkeypatch.setattr(JITFunction, "run", launch)
    assert kernel[(1,)](None, BLOCK=128, num_warps=4, num_stages=2) == "launched"
    assert tried == [(2, 128), (1, 128), (2, 64), (1, 64)]
    assert kernel.fitted_launches == {next(iter(kernel.fitted_launches)): dict(num_stages=1, BLOCK=64)}
    tried.clear()
    assert kernel[(1,)](None, BLOCK=128, num_warps=4, num_stages=2) == "launched" and tried == [(1, 64)]
    tried.clear()
    assert kernel[(1,)](None, BLOCK=64, num_warps=4, num_stages=1) == "launched" and tried == [(1, 64)]
    assert len(kernel.fitted_launches) == 1  # it fit as asked: nothing to remember
    limit_kb[0] = 12
    tried.clear()
    with pytest.raises(fitted.KernelDoesNotFit) as caught:
        kernel[(1,)](None, BLOCK=32, num_warps=4, num_stages=1)
    assert tried == [(1, 32), (1, 16)]
    assert "needs 16384 B of shared memory per program even at one pipelining stage, BLOCK 16 and" in str(caught.value)
    assert pickle.loads(pickle.dumps(caught.value)).blocks == {"BLOCK": 16}
    assert list(fitted.launch_attempts(2, {})) == [dict(num_stages=2), dict(num_stages=1)]
    assert list(fitted.launch_attempts(1, dict(BV=64, BK=32))) == [
        dict(num_stages=1, BV=64, BK=32), dict(num_stages=1, BV=32, BK=32), dict(num_stages=1, BV=16, BK=32),
        dict(num_stages=1, BV=16, BK=16)]


def test_fitted_jit_wraps_compiled_kernels_and_leaves_the_interpreters_alone(monkeypatch):
    """``fitted.jit`` passes its arguments to ``triton.jit``; a ``JITFunction`` comes back fitted, the
    interpreter's function as it is. The chunk modules launch every kernel through it."""
    from triton.runtime.jit import JITFunction

    from blocks.kernels import fitted

    seen = []

    def fake_jit(fn, **kwargs):
        seen.append(kwargs)
        return JITFunction(fn) if kwargs.get("compiled") else ("interpreted", fn)

    monkeypatch.setattr(fitted.triton, "jit", fake_jit)
    assert type(fitted.jit(compiled=True)(_fitted_probe)) is fitted.StageFittedJITFunction
    assert fitted.jit(_fitted_probe) == ("interpreted", _fitted_probe) and seen == [dict(compiled=True), {}]
    for mod in (gla, delta, scalar_decay):
        assert "@triton.jit(do_not_specialize" not in inspect.getsource(mod), mod.__name__
        if not tiles.INTERPRET:
            assert isinstance(mod._fwd_h_kernel, fitted.StageFittedJITFunction)


def test_gla_walks_take_the_settings_of_their_v_block(monkeypatch):
    """gla's state walks launch with ``LAUNCH["walk_bv128"]`` over all of V (``WALK_FULL_V``, V block
    128), ``LAUNCH["walk"]`` at block 64 and ``LAUNCH["walk_bv32"]`` at 32 and below: each was timed
    apart (8 warps won at 128, 3 stages at 32 and lost at 64)."""
    monkeypatch.setattr(tiles, "INTERPRET", False)  # the interpreter would launch all at 1 warp, 1 stage
    monkeypatch.setitem(gla.LAUNCH, "walk_bv128", dict(num_warps=16, num_stages=1))
    monkeypatch.setitem(gla.LAUNCH, "walk", dict(num_warps=4, num_stages=2))
    monkeypatch.setitem(gla.LAUNCH, "walk_bv32", dict(num_warps=8, num_stages=3))
    bf16 = torch.empty(1, dtype=torch.bfloat16)
    assert gla._walk_launch(bf16, 128) == dict(num_warps=16, num_stages=1)
    assert gla._walk_launch(bf16, 64) == dict(num_warps=4, num_stages=2)
    assert gla._walk_launch(bf16, 32) == gla._walk_launch(bf16, 16) == dict(num_warps=8, num_stages=3)


def test_gla_walks_cover_all_of_v_up_to_128_unless_switched_off(monkeypatch):
    """``gla.walk_bv``: with ``WALK_FULL_V`` one program per key slice covers V (up to 128: heads of
    dim 64 take 64, 256 two blocks of 128) whatever the number of chains; off, ``tiles.walk_bv``'s
    rule (64, or 32 below one program per SM: off CUDA it never drops)."""
    cpu = torch.empty(1)
    assert gla.WALK_FULL_V
    assert gla.walk_bv(cpu, 1, 128) == gla.walk_bv(cpu, 10**6, 256) == 128 and gla.walk_bv(cpu, 1, 40) == 64
    assert gla._walk_blocks(cpu, 2, 16, 128, 128) == (64, 128)
    monkeypatch.setattr(gla, "WALK_FULL_V", False)
    assert gla.walk_bv(cpu, 1, 128) == tiles.walk_bv(cpu, 1, 128) == 64


def test_launch_leaves_register_caps_out_where_triton_cannot_take_them():
    """``tiles.supports_maxnreg``: on ROCm, or with a Triton whose CUDA backend has no ``maxnreg``
    option, the kernels run uncapped instead of failing at their first launch."""
    import dataclasses
    import unittest.mock

    from triton.backends.nvidia import compiler as nv

    table = {"capped": dict(num_warps=4, num_stages=2, maxnreg=128)}
    bf16 = torch.empty(1, dtype=torch.bfloat16)

    @dataclasses.dataclass
    class OldOptions:  # a CUDA backend from before the option
        num_warps: int = 4

    tiles.supports_maxnreg.cache_clear()
    try:
        has = tiles.supports_maxnreg()
        assert has == ("maxnreg" in nv.CUDAOptions.__dataclass_fields__ and torch.version.hip is None)
        for patch in (unittest.mock.patch.object(torch.version, "hip", "6.0"),
                      unittest.mock.patch.object(nv, "CUDAOptions", OldOptions)):
            tiles.supports_maxnreg.cache_clear()
            with patch:
                assert not tiles.supports_maxnreg()
                if not tiles.INTERPRET:
                    assert tiles.launch(table, "capped", bf16) == dict(num_warps=4, num_stages=2)
    finally:
        tiles.supports_maxnreg.cache_clear()


ROOT = Path(__file__).resolve().parents[2]


def _benchmark(name: str):
    """Import ``benchmarks/<name>.py`` (a script folder, not a package)."""
    import importlib

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.pop(0)


@pytest.fixture
def sweep():
    return _benchmark("kernel_launch_sweep")


def test_sweep_variants_restore_the_module_after_each_run(sweep):
    before = {k: dict(v) for k, v in gla.LAUNCH.items()}
    walk = gla.walk_bv
    variants = sweep.variants("gla")
    assert ("bwd_sub", "num_warps", 8) in variants and ("walk_bv", "BV", 16) in variants
    assert not any(v == (e, s, gla.LAUNCH[e][s]) for v in variants for e, s, _ in [v] if e in gla.LAUNCH)
    with sweep.Applied("gla", ("bwd_sub", "num_warps", 8)):
        assert gla.LAUNCH["bwd_sub"]["num_warps"] == 8
    # an entry with a register cap is also timed without it
    capped = [e for e, cfg in gla.LAUNCH.items() if cfg.get("maxnreg")]
    assert capped and all((e, "maxnreg", None) in variants for e in capped)
    with sweep.Applied("gla", (capped[0], "maxnreg", None)):
        assert gla.LAUNCH[capped[0]]["maxnreg"] is None
    with sweep.Applied("gla", ("walk_bv", "BV", 16)):
        assert gla.walk_bv(None, 1, 128) == 16 and gla.walk_bv(None, 1, 8) == 16
    keep = gla.KEEP_H
    assert ("switch", "KEEP_H", not keep) in variants
    with sweep.Applied("gla", ("switch", "KEEP_H", not keep)):
        assert gla.KEEP_H is (not keep)
    assert gla.LAUNCH == before and gla.walk_bv is walk and gla.KEEP_H is keep


def test_sweep_goes_on_after_a_variant_poisons_or_kills_its_child(sweep, monkeypatch):
    """A variant that raises a context-poisoning CUDA error (the child reports it, then exits) or
    kills the child outright is recorded once; a fresh child times the variants after it."""
    names = [("a", "num_warps", 8), ("b", "num_warps", 8), ("c", "num_stages", 1), ("d", "num_stages", 3)]
    monkeypatch.setattr(sweep, "variants", lambda family: names)
    base = {"entry": "(current)", "setting": "", "value": 0, "ms": 10.0}

    def row(i, **kw):
        return dict(index=i, entry=names[i][0], setting=names[i][1], value=names[i][2], **kw)

    script = {  # start index -> (rows the child printed, its error line)
        0: ([base, row(0, started=True), row(0, ms=9.0), row(1, started=True),
             row(1, error="AcceleratorError: CUDA error: an illegal memory access was encountered")],
            "exit 3: "),
        2: ([base, row(2, started=True)], "exit -11: "),
        3: ([base, row(3, started=True), row(3, ms=11.0), dict(base, entry="(current again)")], ""),
    }
    starts = []

    def child(family, T, start, timeout):
        starts.append(start)
        return script[start]

    monkeypatch.setattr(sweep, "_child", child)
    got = sweep.sweep(["gla"], [2048], log=lambda msg: None)["gla"]["2048"]
    assert starts == [0, 2, 3]
    by_entry = {v["entry"]: v for v in got["variants"]}
    assert list(by_entry) == ["a", "b", "c", "d"] and len(got["variants"]) == 4
    assert by_entry["a"]["ratio"] == pytest.approx(0.9) and by_entry["d"]["ratio"] == pytest.approx(1.1)
    assert "illegal memory access" in by_entry["b"]["error"]
    assert by_entry["c"]["error"].startswith("crashed the process (exit -11")
    assert len(got["errors"]) == 2 and got["base_again_ms"] == 10.0


def test_sweep_only_restricts_the_variants_to_the_named_entries(sweep, monkeypatch):
    monkeypatch.setattr(sweep, "ONLY", {"switch", "wy_bwd"})
    got = sweep.variants("delta_rule")
    assert got and {v[0] for v in got} == {"switch", "wy_bwd"}
    assert ("switch", "KEEP_H", not delta.KEEP_H) in got
    monkeypatch.setattr(sweep, "ONLY", set())
    assert len(sweep.variants("delta_rule")) > len(got)
    monkeypatch.setattr(sweep, "ONLY", {"switch:DQKWG_BK"})  # one switch alone
    assert sweep.variants("gated_delta_rule") == [("switch", "DQKWG_BK", 128 if delta.DQKWG_BK != 128 else 64)]


@pytest.mark.parametrize("env, kept", [("1", False), ("", True)])
def test_low_memory_environment_turns_every_keep_off(env, kept):
    code = ("from blocks.kernels import delta, gla, scalar_decay; "
            "print(delta.KEEP_WU, delta.KEEP_H, delta.KEEP_P, gla.KEEP_H, gla.KEEP_A, scalar_decay.KEEP_H, "
            "delta.WALK_SEGMENTS > 1, gla.WALK_SEGMENTS > 1)")
    out = run_python(code, {"ARCHSEARCH_LOW_MEMORY_KERNELS": env})
    assert out.split() == [str(kept)] * 8  # segmented walks hold more transient memory


def test_benchmarks_record_the_switches_they_ran_with():
    import json

    gpu_common, gpu_kernels = _benchmark("gpu_common"), _benchmark("gpu_kernels")

    settings = gpu_common.kernel_settings()
    assert settings["delta"]["switches"] == {k: getattr(delta, k) for k in delta.SWITCHES}
    assert settings["gla"]["launch"] == gla.LAUNCH and settings["scalar_decay"]["launch"] == scalar_decay.LAUNCH
    line = gpu_common.switches_line(settings)
    assert f"delta: KEEP_WU={delta.KEEP_WU}" in line and "gla: KEEP_H=" in line
    from blocks.kernels import decode_mixer
    assert f"decode_mixer: ENABLED={decode_mixer.ENABLED}" in line
    from archsearch import decode_layer
    assert f"decode_layer: ENABLED={decode_layer.ENABLED}" in line
    res = json.loads((ROOT / "docs/benchmarks/gpu_results.json").read_text())
    res["kernel_settings"] = settings
    assert f"Kernel switches: {line}" in gpu_kernels.markdown(res)


def test_benchmark_plots_only_what_the_run_measured(tmp_path):
    """A run with ``--skip train`` (e.g. only the compiled-decode section) has no training plot
    or table and must not fail making the others or lose the report's header; one family still
    gets its training plot."""
    import json

    pytest.importorskip("matplotlib")
    gpu_kernels = _benchmark("gpu_kernels")
    res = json.loads((ROOT / "docs/benchmarks/gpu_results.json").read_text())
    no_train = {k: v for k, v in res.items() if k != "train"}
    assert gpu_kernels.plots(no_train, tmp_path) == ["gpu_decode.png"]
    text = gpu_kernels.markdown(no_train)  # the header (date, environment, switches) stays
    assert text.startswith(f"# GPU benchmark: {res['env']['device']}\n\n{res['env']['when']} ")
    assert "Kernel switches:" in text and "not available" not in text and "## Training" not in text
    one = dict(res, families=["gla"])
    assert gpu_kernels.plots(one, tmp_path) == ["gpu_train.png", "gpu_decode.png"]
    assert (tmp_path / "gpu_train.png").stat().st_size > 0
    # the plot's points: steps launched back to back (the targets' figure), a row without them (fla's) as it has
    table = {"2048": {"mtok_s": 14.0, "queued_mtok_s": 15.5}, "512": {"mtok_s": 12.0}, "1024": {"error": "oom"}}
    assert gpu_kernels._plot_points(table, "queued_mtok_s") == [(512, 12.0), (2048, 15.5)]
    assert gpu_kernels._plot_points(table, "mtok_s") == [(512, 12.0), (2048, 14.0)]


def test_benchmark_correctness_stops_starting_cases_at_the_deadline():
    """``gpu_kernels.correctness(stop_at)``: past ``stop_at`` every case is recorded as skipped (no
    kernel runs, so this needs no GPU) and the report says so; the compiled decode graphs run before
    the check, so a capped call that runs out of time inside the check keeps them."""
    gpu_kernels = _benchmark("gpu_kernels")
    out = gpu_kernels.correctness(stop_at=1.0)  # 1970: long past
    assert set(out) == {f"{f}/{d}" for f in gpu_kernels.LINEAR_FAMILIES for d in ("bfloat16", "float32")}
    assert all(r == {"error": "skipped: past the run's --deadline"} for r in out.values())
    md = "\n".join(gpu_kernels._md_check({"correctness": out}))
    assert md.count("skipped: past the run's --deadline") == len(out)
    order = gpu_kernels.SECTIONS
    assert order.index("model_compiled") < order.index("correctness") and order[0] == "ceilings"


def test_carried_sections_fill_what_a_run_skipped_and_say_so(tmp_path):
    """``benchmarks/carry_sections.py``: a run that skipped the step and decode sections (past its
    deadline) gets them from an earlier results file, named with that run's date in the report's
    header; what the new run measured (a failed section too) stays; carrying twice keeps the first
    date; bad files and section names are one-line errors."""
    import json

    pytest.importorskip("matplotlib")
    carry_sections, gpu_kernels = _benchmark("carry_sections"), _benchmark("gpu_kernels")
    old = json.loads((ROOT / "docs/benchmarks/gpu_results.json").read_text())
    old.pop("carried", None)
    new = {k: v for k, v in old.items() if k not in ("step", "softmax_decode")}
    new = dict(new, env=dict(old["env"], when="2030-01-01 00:00 UTC"), train={"error": "RuntimeError: boom"})
    merged = carry_sections.carry(new, old)
    assert merged["step"] == old["step"] and merged["softmax_decode"] == old["softmax_decode"]
    assert merged["train"] == {"error": "RuntimeError: boom"}  # measured (and failed) here: not replaced
    assert merged["carried"] == {"step": old["env"]["when"], "softmax_decode": old["env"]["when"]}
    header = gpu_kernels.markdown(merged).split("## ")[0]
    assert f"step ({old['env']['when']}), softmax_decode ({old['env']['when']})" in header
    assert "Carried" not in gpu_kernels.markdown(old).split("## ")[0]
    again = carry_sections.carry({k: v for k, v in new.items()}, dict(merged, env=dict(old["env"], when="LATER")))
    assert again["carried"]["step"] == old["env"]["when"]
    # the script: merged files and plots written; bad input named in one line
    (tmp_path / "new.json").write_text(json.dumps(dict(new, train=old["train"])))
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert carry_sections.main([str(tmp_path / "new.json"), "--carry-from", str(tmp_path / "old.json"),
                                "--out", str(tmp_path / "out")]) == 0
    written = json.loads((tmp_path / "out/gpu_results.json").read_text())
    assert set(written["carried"]) == {"step", "softmax_decode"} and written["plots"] == ["gpu_train.png", "gpu_decode.png"]
    assert "Carried from other runs" in (tmp_path / "out/gpu_results.md").read_text()
    with pytest.raises(SystemExit, match="--carry-from: no such file"):
        carry_sections.main([str(tmp_path / "new.json"), "--carry-from", str(tmp_path / "nope.json"), "--out", "x"])
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(SystemExit, match="new: .*bad.json is not JSON"):
        carry_sections.main([str(tmp_path / "bad.json"), "--carry-from", str(tmp_path / "old.json"), "--out", "x"])
    with pytest.raises(SystemExit):
        carry_sections.main([str(tmp_path / "new.json"), "--carry-from", str(tmp_path / "old.json"), "--out", "x",
                             "--sections", "step,nonsense"])


def test_benchmark_reports_queued_training_beside_idle_start():
    """Training steps are timed from an idle GPU and back to back (``gpu_common.train_times``);
    the report has a table for each, and results without the queued timing keep one table."""
    import json

    gpu_kernels = _benchmark("gpu_kernels")
    res = json.loads((ROOT / "docs/benchmarks/gpu_results.json").read_text())
    for table in res["train"].values():  # as a run before the queued timing wrote it
        for rec in table.values():
            rec.pop("queued_s", None), rec.pop("queued_mtok_s", None)
    text = gpu_kernels.markdown(res)
    assert "each step from an idle GPU" in text and "launched back to back" not in text
    for table in res["train"].values():
        for rec in table.values():
            if "mtok_s" in rec:
                rec["queued_mtok_s"] = rec["mtok_s"] * 1.5
    text = gpu_kernels.markdown(res)
    head, tail = text.split("## Training, steps launched back to back")
    rec = res["train"]["delta_rule"]["2048"]
    assert gpu_kernels.fmt(rec["mtok_s"]) in head.split("## Training")[1]
    first_row = next(line for line in tail.splitlines() if line.startswith("| ours delta_rule"))
    assert gpu_kernels.fmt(rec["queued_mtok_s"]) in first_row


def test_benchmark_training_cells_are_medians_of_round_robin_passes():
    """``gpu_kernels.train_bench`` times every cell in several passes: ``_add_pass`` keeps each
    pass and makes the cell's figures the medians so far; the report says how many passes and the
    widest spread of a method's queued passes, and says nothing of passes for runs without them."""
    import json

    gpu_kernels = _benchmark("gpu_kernels")
    table: dict = {}
    for s, q in ((4.0e-3, 3.9e-3), (4.4e-3, 4.2e-3), (4.2e-3, 4.0e-3)):
        row = gpu_kernels._add_pass(table, 2048, {"s": s, "queued_s": q, "iters": 50}, impl="triton")
    assert row is table["2048"] and row["impl"] == "triton"
    assert row["passes_s"] == [4.0e-3, 4.4e-3, 4.2e-3] and row["s"] == 4.2e-3 and row["queued_s"] == 4.0e-3
    assert row["queued_mtok_s"] == pytest.approx(gpu_kernels.TOKENS / 4.0e-3 / 1e6)
    gpu_kernels._add_error(table, 2048, RuntimeError("CUDA out of memory"))  # a later pass fails: nothing lost
    assert table["2048"]["s"] == 4.2e-3 and table["2048"]["errors"] == ["RuntimeError: CUDA out of memory"]
    gpu_kernels._add_error(table, 4096, RuntimeError("boom"))  # a cell's first pass fails
    assert table["4096"] == {"error": "RuntimeError: boom"}
    del table["2048"]["errors"], table["4096"]
    res = json.loads((ROOT / "docs/benchmarks/gpu_results.json").read_text())
    for t in res["train"].values():  # a run from before the passes and the NVML readings
        for rec in t.values():
            for key in ("passes_s", "queued_passes_s", "passes_sm_mhz", "passes_temp_c", "passes_power_w"):
                rec.pop(key, None)
    assert "Each cell: the median of" not in gpu_kernels.markdown(res)
    res["train"]["gated_delta_rule"]["2048"] = row
    line = next(x for x in gpu_kernels.markdown(res).splitlines() if x.startswith("Each cell: the median of"))
    assert "median of 3 round-robin passes" in line and "gated_delta_rule 7.7%" in line  # 4.2 / 3.9 - 1
    assert "GPU after each cell" not in gpu_kernels.markdown(res)  # no NVML readings
    row.update(passes_sm_mhz=[1980, 1830, 1755], passes_temp_c=[41, 55, 60], passes_power_w=[420.0, 610.0, 640.0])
    text = gpu_kernels.markdown(res)
    assert "pass 1 1980 MHz / 41 C / 420 W; pass 2 1830 MHz / 55 C / 610 W; pass 3 1755 MHz" in text


def test_benchmark_training_passes_keep_what_a_failed_pass_timed(monkeypatch):
    """``gpu_kernels.train_bench`` with its GPU parts stood in for: every cell timed once per pass,
    round robin; a pass that fails after one succeeded keeps the cell's figures (its error listed); a
    cell whose first pass fails is skipped by the later passes; a PyTorch form is timed in the first
    pass only, and one slower than 2 s a step is not timed at longer lengths."""
    gpu_kernels = _benchmark("gpu_kernels")
    calls: list = []
    times = iter(range(1, 1000))

    def timed(label):
        def run():
            calls.append(label)
            if label == ("delta_rule", 2048) and calls.count(label) == 2:
                raise RuntimeError("CUDA out of memory")
            if label[0] == "sdpa_flash" and label[1] == 4096:
                raise RuntimeError("no kernel")
            s = 3.0 if label[0] == "simple_gla" else next(times) * 1e-3
            return {"s": s, "queued_s": s, "iters": 5}
        return run

    monkeypatch.setattr(gpu_kernels, "train_inputs", lambda family, B, T: (family, T))
    monkeypatch.setattr(gpu_kernels, "positional", lambda family, args: args)
    monkeypatch.setattr(gpu_kernels, "op_module", lambda family: None)
    monkeypatch.setattr(gpu_kernels, "sdpa_call", lambda backend, B, T: (backend, T))
    names = {gpu_kernels.SDPBackend.CUDNN_ATTENTION: "sdpa_cudnn", gpu_kernels.SDPBackend.FLASH_ATTENTION: "sdpa_flash"}

    def fwd_bwd(call, inputs):
        if callable(call):  # ours: the closure over mod.chunk; its label is in the inputs
            return timed(tuple(inputs))
        return timed((names[call], inputs))

    monkeypatch.setattr(gpu_kernels, "fwd_bwd", fwd_bwd)
    monkeypatch.setattr(gpu_kernels, "train_times", lambda run: run())
    monkeypatch.setattr(gpu_kernels, "gpu_state", lambda: {})
    monkeypatch.setattr(gpu_kernels.kernels, "has_kernel", lambda family, op: family != "simple_gla")
    monkeypatch.setattr(gpu_kernels.torch.cuda, "empty_cache", lambda: None)
    out = gpu_kernels.train_bench([2048, 4096], ["delta_rule", "simple_gla"], rounds=3)
    assert out["delta_rule"]["2048"]["errors"] == ["RuntimeError: CUDA out of memory"]
    assert len(out["delta_rule"]["2048"]["passes_s"]) == 2 and len(out["delta_rule"]["4096"]["passes_s"]) == 3
    assert out["simple_gla"]["2048"]["impl"] == "pytorch" and "4096" not in out["simple_gla"]
    assert calls.count(("simple_gla", 2048)) == 1
    assert out["sdpa_flash"]["4096"] == {"error": "RuntimeError: no kernel"}
    assert calls.count(("sdpa_flash", 4096)) == 1 and len(out["sdpa_cudnn"]["4096"]["passes_s"]) == 3
    assert calls[:4] == [("delta_rule", 2048), ("simple_gla", 2048), ("sdpa_cudnn", 2048), ("sdpa_flash", 2048)]


def test_benchmark_reports_the_decode_attention_kernel_beside_sdpa():
    """The per-layer decode table has a column for the decode graph's own attention kernel, which
    counts for the best softmax figure; a run without it (before 2026-12-01 15:50, or one whose
    kernel failed) shows '-' there and its ratio from SDPA alone."""
    import json

    gpu_kernels = _benchmark("gpu_kernels")
    res = json.loads((ROOT / "docs/benchmarks/gpu_results.json").read_text())
    lin = res["step"]["gated_delta_rule"]["triton_inplace_graph_s"]
    row = res["softmax_decode"]["1024"]
    row.pop("ours_graph_s", None)
    cudnn = row["cudnn_graph_s"]

    def table_row():
        return next(line for line in gpu_kernels.markdown(res).splitlines() if line.startswith("| 1024 |"))

    assert "ours (Triton, whole step)" in gpu_kernels.markdown(res)
    best = min(row[k] for k in ("cudnn_graph_s", "flash_graph_s", "efficient_graph_s"))
    assert table_row().endswith(f"| - | {lin * 1e6:.1f} | {best / lin:.1f}x |")
    row["ours_graph_s"] = cudnn / 2  # faster than every SDPA backend: the ratio follows it
    assert table_row().endswith(f"| {cudnn / 2 * 1e6:.1f} | {lin * 1e6:.1f} | {cudnn / 2 / lin:.1f}x |")


def test_plain_decode_rows_are_built_then_timed_round_robin(monkeypatch):
    """``model_decode_bench`` builds every plain-graph row (each model at each of its contexts, the
    eager step timed at the first context only, no compile mode), then times them all in one
    round-robin pass set, as the compiled rows are; a row that fails to build is left out of the
    timing."""
    gpu_kernels = _benchmark("gpu_kernels")
    built, timed = [], []

    def fake_row(out, copy_bw, batch, name, block, every, ctx, mode, label, steps=40, eager=False, models=None):
        built.append((name, ctx, mode, label, eager, steps))
        if ctx == 16384:
            out[f"{name} @ {ctx}"] = {"error": "OutOfMemoryError"}
            return None
        return f"{name} @ {ctx}", object()

    monkeypatch.setattr(gpu_kernels, "_model_decode_row", fake_row)
    monkeypatch.setattr(gpu_kernels, "_time_round_robin",
                        lambda out, items, rounds, iters: timed.append(([k for k, _ in items], rounds, iters)))
    out = gpu_kernels.model_decode_bench(4e12, rounds=2, iters=5)
    assert [(n, c, e) for n, c, _, _, e, _ in built] == [
        ("gated_deltanet x24", 4096, True), ("simple_gla x24", 4096, True), ("gated_deltanet 3:1 softmax", 1024, True),
        ("gated_deltanet 3:1 softmax", 4096, False), ("gated_deltanet 3:1 softmax", 16384, False)]
    assert all(mode is False and label == "" and steps == 2 * (5 + 2) for _, _, mode, label, _, steps in built)
    assert timed == [(["gated_deltanet x24 @ 4096", "simple_gla x24 @ 4096", "gated_deltanet 3:1 softmax @ 1024",
                       "gated_deltanet 3:1 softmax @ 4096"], 2, 5)]
    assert out == {"gated_deltanet 3:1 softmax @ 16384": {"error": "OutOfMemoryError"}}


def test_cuda_time_waits_for_each_step_only_when_not_queued(monkeypatch):
    """``cuda_time`` without ``queued`` waits for each call's end event before launching the next
    (every call starts on an idle GPU); with it, the calls go out back to back and one
    synchronisation follows. CUDA's events are replaced by a recorder (no GPU needed)."""
    gpu_common = _benchmark("gpu_common")
    log = []

    class Event:
        def __init__(self, enable_timing):
            self.t = None

        def record(self):
            log.append("record")
            self.t = len(log)

        def synchronize(self):
            log.append("wait")

        def elapsed_time(self, end):
            return float(end.t - self.t)  # ms

    monkeypatch.setattr(gpu_common.torch.cuda, "Event", Event)
    monkeypatch.setattr(gpu_common.torch.cuda, "synchronize", lambda: log.append("sync"))
    for queued in (False, True):
        log.clear()
        sec, iters = gpu_common.cuda_time(lambda: log.append("call"), max_iters=4, queued=queued)
        timed = log[log.index("call", log.index("sync", log.index("sync") + 1)) - 1:]  # after warm-up
        assert iters == 4 and timed.count("call") == 4
        if queued:
            assert "wait" not in timed and timed[-1] == "sync"
        else:
            assert timed.count("wait") == 4 and timed[:4] == ["record", "call", "record", "wait"]
        assert sec == pytest.approx(2e-3)  # start, call, end: two log entries apart


def test_aot_tool_reports_whether_a_loop_was_pipelined():
    """``benchmarks/kernels_aot_regs.py`` compiles for sm_90 without a GPU (Triton's bundled
    ptxas) and reads the TTGIR: the gated ``bwd_dh`` walk is software-pipelined (async copies of
    its gate rows, loads carried across iterations). If a Triton upgrade stops pipelining the
    walks, this says so before a GPU run does. In a
    subprocess without ``TRITON_INTERPRET`` (interpreted kernels cannot be compiled)."""
    code = """
import kernels_aot_regs as aot
from blocks.kernels import delta
cx = dict(H=16, K=128, V=128, BT=64, BK=128, BV=32, USE_G=True, USE_DHT=False, STORE_DH0=False, DOT_PREC="tf32")
k = aot.compile_one(delta._bwd_dh_kernel, aot.arg_types("bf16"), cx, 4, 3, 90)
print(*aot.pipelining(k), aot.resources(k)["REG"])
"""
    out = run_python(code, {"TRITON_INTERPRET": None})
    copies, carried, regs = out.split()
    assert int(copies) > 0 and int(carried) > 1 and int(regs) > 0, out


def test_aot_tool_fills_constexprs_left_at_their_defaults(tmp_path):
    """``kernels_aot_regs.compile_one`` takes a defaulted constexpr's default when the job does not
    list it (a switch added as ``NAME: tl.constexpr = False`` once broke every job of its kernel), and
    a listed value still wins. In a subprocess without ``TRITON_INTERPRET``."""
    (tmp_path / "defaulted_kernel.py").write_text(
        "import triton\nimport triton.language as tl\n\n\n@triton.jit\n"
        "def scale_kernel(x, BLOCK: tl.constexpr, TRIPLE: tl.constexpr = False):\n"
        "    o = tl.arange(0, BLOCK)\n"
        "    v = tl.load(x + o)\n"
        "    tl.store(x + o, v * 3.0 if TRIPLE else v + 1.0)\n")
    code = f"""
import sys
import types
sys.path.insert(0, {str(tmp_path)!r})
import kernels_aot_regs as aot
from defaulted_kernel import scale_kernel
types = {{"x": "*fp32"}}
plain = aot.compile_one(scale_kernel, types, dict(BLOCK=128), 4, 1, 90)
tripled = aot.compile_one(scale_kernel, types, dict(BLOCK=128, TRIPLE=True), 4, 1, 90)
print("mul.f32" in tripled.asm["ptx"], "add.f32" in plain.asm["ptx"] and "mul.f32" not in plain.asm["ptx"])
"""
    out = run_python(code, {"TRITON_INTERPRET": None})
    assert out.split() == ["True", "True"], out


def test_aot_tool_loops_leave_out_the_retry_paths_of_barrier_waits():
    """``kernels_aot_regs.sass_loops`` (``--loops``): a loop's body once, and a barrier wait's
    out-of-line retry path (after the kernel's body, branching back into the loop: as ptxas lays
    out TMA and ``wgmma`` waits) is no loop of its own, while the wait's spin loop is."""
    aot = _benchmark("kernels_aot_regs")
    lines = [(0x0000, "MOV R1, c[0x0][0x28]"), (0x0100, "LDS R2, [R3]"), (0x0110, "@!P0 BRA 0x0500"),
             (0x0200, "FFMA R4, R2, R2, R4"), (0x0300, "@P1 BRA 0x0100"), (0x0400, "EXIT"),
             (0x0410, "BRA 0x0410"), (0x0500, "SYNCS.PHASECHK.TRANS64 P0, [UR4], R5"),
             (0x0510, "@!P0 BRA 0x0500"), (0x0520, "BRA 0x0200")]
    sass = "\n".join(f"        /*{a:04x}*/                   {op} ;" for a, op in lines)
    loops = aot.sass_loops(sass)
    assert [n for n, _ in loops] == [4, 2], loops  # 0x100-0x300 (LDS, BRA, FFMA, BRA); the spin loop
    assert loops[0][1]["FFMA"] == 1 and loops[1][1]["SYNCS"] == 1


def test_aot_tool_counts_sass_instructions_shuffles_and_barriers():
    """``kernels_aot_regs.sass_counts``: static SASS instruction / shuffle / barrier counts. The
    gated ``bwd_dqkwg`` (five dots, the gate gradient's row and column sums across warps) has more
    of each than the gated ``kkt`` (one dot, no cross-warp sum)."""
    code = """
import kernels_aot_regs as aot
jobs = {j[0]: j for j in aot.jobs("bf16")}
for name in ("gated_delta.kkt", "gated_delta.bwd_dqkwg"):
    _, fn, cx, warps, stages, _ = jobs[name]
    k = aot.compile_one(fn, aot.arg_types("bf16"), cx, warps, stages, 90)
    print(*aot.sass_counts(k))
"""
    out = run_python(code, {"TRITON_INTERPRET": None})
    small, big = (tuple(map(int, line.split())) for line in out.strip().splitlines()[-2:])
    assert all(b > s for b, s in zip(big, small)) and big[0] > 500 and big[1] > 0, out


def test_aot_tool_compiles_at_the_launch_tables_register_caps():
    """A launch entry's ``maxnreg`` reaches the compile (bf16 only, as ``tiles.launch`` applies it):
    gla's ``intra_a`` capped at its entry's 128 registers uses no more, uncapped it uses more (the
    occupancy the cap buys is the point of it)."""
    code = """
import kernels_aot_regs as aot
from blocks.kernels import gla
cap = gla.LAUNCH["intra_a"]["maxnreg"]
name, fn, cx, warps, stages, job_cap = next(j for j in aot.jobs("bf16") if j[0] == "gla.intra_a")
fp32_cap = next(j for j in aot.jobs("fp32") if j[0] == "gla.intra_a")[5]
regs = [int(aot.resources(aot.compile_one(fn, aot.arg_types("bf16"), cx, warps, stages, 90, c))["REG"])
        for c in (job_cap, None)]
print(cap, job_cap, fp32_cap, *regs)
"""
    out = run_python(code, {"TRITON_INTERPRET": None})
    cap, job_cap, fp32_cap, capped, free = out.split()[-5:]
    assert job_cap == cap and fp32_cap == "None", out
    assert int(capped) <= int(cap) < int(free), out


def test_aot_tool_attributes_sass_to_source_lines():
    """``kernels_aot_regs.py --lines``: every SASS instruction of the gated ``bwd_dqkwg`` falls on a
    source line (``nvdisasm`` line info), and the pair decay's exponential line carries its
    ``MUFU`` (ex2) instructions: the figures ``delta.PAIR_DECAY_FACTORED`` cites. (The kernel's exact
    pair decay is ``_pair_decay_all``'s with ``DQKWG_DS_UNMASKED``, ``_pair_decay_exact``'s without.)"""
    code = """
import inspect, kernels_aot_regs as aot
from blocks.kernels import delta
name, fn, cx, warps, stages, _ = next(j for j in aot.jobs("bf16") if j[0] == "gated_delta.bwd_dqkwg")
k = aot.compile_one(fn, aot.arg_types("bf16"), cx, warps, stages, 90)
exact, text = ((delta._pair_decay_all, "tl.exp(b_g[:, None] - b_g[None, :])") if delta.DQKWG_DS_UNMASKED
               else (delta._pair_decay_exact, "b_g[:, None] - b_gj[None, :]"))
src, first = inspect.getsourcelines(exact.fn)
line = first + next(i for i, t in enumerate(src) if text in t)
by_line = aot.sass_by_line(k)
print(sum(sum(c.values()) for c in by_line.values()), aot.sass_counts(k)[0], by_line[("delta.py", line)]["MUFU"])
"""
    out = run_python(code, {"TRITON_INTERPRET": None})
    attributed, total, mufu = map(int, out.split()[-3:])
    assert attributed == total > 500 and mufu >= 16, out


def test_gla_kept_scores_compile_for_sm90():
    """gla's ``KEEP_A`` gives the kernels that read ``A`` a pointer in the activations' dtype; a
    branch that loads it must cast to the float32 of its other branch (Triton refuses a runtime
    ``if`` whose branches give a variable two types: the interpreter does not check this, the GPU's
    compile does: ``CompilationError`` at ``_fwd_o_kernel``'s ``if steep``, H200 2026-12-01 23:42).
    Every whole-chunk kernel compiles for sm_90 with the switch on, with dv in ``_bwd_chunk_kernel``
    or in ``_bwd_dv_kernel``, for bf16 and float32."""
    code = """
import sys, kernels_aot_regs as aot
for sets in ("KEEP_A=True,BWD_DV_SEPARATE=False", "KEEP_A=True,BWD_DV_SEPARATE=True"):
    sys.argv = ["kernels_aot_regs.py", "--kernels", "gla.fwd_o,gla.bwd_chunk,gla.bwd_dv", "--dtype", "both",
                "--set", sets]
    print("RC", aot.main())
"""
    out = run_python(code, {"TRITON_INTERPRET": None})
    assert out.count("RC 0") == 2 and "FAILED" not in out, out
    rows = [line for line in out.splitlines() if line.startswith("| gla.")]
    assert len(rows) == 2 * 2 + 2 * 3, out  # fwd_o, bwd_chunk (+ bwd_dv when separate) x bf16, fp32


def _aot_run_then_usage_error(argv: list[str], report: str, bad_argv: list[str]) -> str:
    """The output of ``kernels_aot_regs.main()`` run with ``argv`` (its return code as ``rc``, then the
    Python line ``report``), then with ``bad_argv``, which must end in a usage error (``EXIT <code>``)."""
    code = f"""
import sys, kernels_aot_regs as aot
sys.argv = ["kernels_aot_regs.py", *{argv!r}]
rc = aot.main()
{report}
sys.argv = ["kernels_aot_regs.py", *{bad_argv!r}]
try:
    aot.main()
except SystemExit as exc:
    print("EXIT", exc.code)
"""
    return run_python(code, {"TRITON_INTERPRET": None})


def test_aot_tool_set_gives_switches_other_values_first():
    """``kernels_aot_regs.py --set``: compile the kernels a switch's other value runs (the launch
    sweep's ``apply_sets``); an unknown switch is a usage error."""
    out = _aot_run_then_usage_error(["--kernels", "delta.bwd_dh", "--set", "UNGATED_DH_ZERO_GATE=False"],
                                    'from blocks.kernels import delta; print("RC", rc, delta.UNGATED_DH_ZERO_GATE)',
                                    ["--set", "NO_SUCH_SWITCH=1"])
    assert "| delta.bwd_dh | bf16 |" in out and "RC 0 False" in out and "EXIT 2" in out, out


def test_aot_tool_stages_compiles_each_kernel_at_each_stage_count():
    """``kernels_aot_regs.py --stages``: one row per stage count (its own column), the shared memory
    growing with the stages (the pipeline's buffers); a count below 1 is a usage error."""
    out = _aot_run_then_usage_error(["--kernels", "gated_delta.bwd_dh_bv64", "--stages", "1,2"], 'print("RC", rc)',
                                    ["--stages", "0"])
    rows = [line.split("|") for line in out.splitlines() if line.startswith("| gated_delta.bwd_dh_bv64 |")]
    assert "RC 0" in out and "EXIT 2" in out and [r[4].strip() for r in rows] == ["1", "2"], out
    assert int(rows[0][7]) < int(rows[1][7]), out


def test_sweep_warps_option_adds_warp_counts_and_rejects_bad_ones(sweep, monkeypatch, capsys):
    from blocks.kernels import delta

    entry = next(name for name, cfg in delta.LAUNCH.items() if cfg["num_warps"] != 2)
    monkeypatch.setattr(sweep, "WARPS", [4, 8, 16])
    assert (entry, "num_warps", 2) not in sweep.variants("delta_rule")
    monkeypatch.setattr(sweep, "WARPS", [2, 4, 8, 16])
    assert (entry, "num_warps", 2) in sweep.variants("delta_rule")
    with pytest.raises(SystemExit):
        sweep.main(["--warps", "3,4"])
    assert "--warps: a comma list of powers of two, got '3,4'" in capsys.readouterr().err
    seen = []  # the child processes time the same warp counts as the parent lists
    monkeypatch.setattr(sweep.subprocess, "run", lambda cmd, **kw: seen.append(cmd) or
                        type("P", (), {"stdout": "", "stderr": "", "returncode": 0})())
    sweep._child("delta_rule", 2048, 0, 10)
    assert seen[0][seen[0].index("--warps") + 1] == "2,4,8,16"


def test_sweep_caps_option_adds_register_caps_and_rejects_bad_ones(sweep, monkeypatch, capsys):
    """``--caps 128,104``: every launch entry is also timed at those register caps (not at the cap it
    has), the children time the same ones, and a cap ptxas would not take is a one-line error."""
    monkeypatch.setattr(sweep, "CAPS", [])
    assert not any(s == "maxnreg" and v is not None for _, s, v in sweep.variants("delta_rule"))
    monkeypatch.setattr(sweep, "CAPS", [128, 104])
    got = sweep.variants("gla")
    for entry, cfg in gla.LAUNCH.items():
        want = {c for c in (128, 104) if c != cfg.get("maxnreg")}
        assert {v for e, s, v in got if e == entry and s == "maxnreg" and v is not None} == want, entry
    for bad in ("100", "300", "x"):
        with pytest.raises(SystemExit):
            sweep.main(["--caps", bad])
        assert "--caps: a comma list of multiples of 8" in capsys.readouterr().err
    # the report names the current setting of an entry that has no cap as None (not a KeyError)
    uncapped = next(e for e, cfg in gla.LAUNCH.items() if not cfg.get("maxnreg"))
    res = {"gla": {2048: {"base_ms": 7.0, "base_again_ms": 7.1, "variants": [
        {"entry": uncapped, "setting": "maxnreg", "value": 128, "ms": 7.2, "ratio": 1.03}]}}}
    assert f"| gla | 2048 | {uncapped} | maxnreg | None | 128 | 7.200 | 1.030 |" in sweep.markdown(res, {"gla": gla.LAUNCH})
    seen = []
    monkeypatch.setattr(sweep.subprocess, "run", lambda cmd, **kw: seen.append(cmd) or
                        type("P", (), {"stdout": "", "stderr": "", "returncode": 0})())
    sweep._child("gla", 2048, 0, 10)
    assert seen[0][seen[0].index("--caps") + 1] == "128,104"


def test_sweep_set_option_moves_the_base_and_reaches_the_children(sweep, monkeypatch, capsys):
    """``--set KEEP_WU=False``: the switch has that value in the base the variants are timed against
    (so a kernel behind a switch can have its launch swept), in the parent and in every child; a
    name that is no switch, or a value it does not take, is a one-line usage error."""
    from blocks.kernels import delta

    monkeypatch.setattr(delta, "KEEP_WU", delta.KEEP_WU)  # restored after the test
    other = not delta.KEEP_WU
    assert sweep.apply_sets(f"KEEP_WU={other}") == {"KEEP_WU": other}
    assert delta.KEEP_WU is other
    assert ("switch", "KEEP_WU", not other) in sweep.variants("delta_rule")
    for bad, msg in (("NOPE=1", "NOPE is not a switch"), ("KEEP_WU=3", "KEEP_WU takes (False, True)"),
                     ("KEEP_WU=1", "KEEP_WU takes (False, True), got 1"),
                     ("KEEP_WU", "expected NAME=VALUE")):
        with pytest.raises(SystemExit):
            sweep.main(["--set", bad])
        assert msg in capsys.readouterr().err
    seen = []
    monkeypatch.setenv(sweep.SET_ENV, f"KEEP_WU={other}")
    monkeypatch.setattr(sweep.subprocess, "run", lambda cmd, **kw: seen.append(cmd) or
                        type("P", (), {"stdout": "", "stderr": "", "returncode": 0})())
    sweep._child("delta_rule", 2048, 0, 10)
    assert seen[0][seen[0].index("--set") + 1] == f"KEEP_WU={other}"


def test_ncu_report_parses_raw_csv_and_keeps_each_kernels_last_launch():
    ncu = _benchmark("ncu_kernels")
    text = "\n".join([
        "==PROF== Connected to process 1",
        '"ID","Kernel Name","gpu__time_duration.sum","dram__bytes_read.sum",'
        '"smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio"',
        '"","","ms","byte",""',
        '"0","_bwd_sub_kernel(int, float)","9.5","1500000000","7.0"',
        '"1","_bwd_sub_kernel(int, float)","3.25","500000000","2.5"',
        '"2","_intra_a_kernel","1,020.0","250000000","n/a"',
    ])
    got = ncu.parse(text)
    assert got["_bwd_sub_kernel"] == {"duration_us": 3250.0, "dram_read_mb": 500.0, "long_scoreboard": 2.5,
                                      "launches": 2, "step_us": 12750.0, "step_dram_mb": 2000.0}
    assert got["_intra_a_kernel"] == {"duration_us": 1020000.0, "dram_read_mb": 250.0, "launches": 1,
                                      "step_us": 1020000.0, "step_dram_mb": 250.0}
    table = ncu.table("gla:2048", got)
    assert table.index("_intra_a_kernel") < table.index("_bwd_sub_kernel")  # slowest first
    assert "long_scoreboard 2.5" in table and ncu.parse("no csv here") == {}
    ns = text.replace('"ms","byte"', '"ns","byte"')  # the unit ncu 2025 prints
    assert ncu.parse(ns)["_bwd_sub_kernel"]["duration_us"] == pytest.approx(3.25e-3)


def test_ncu_dram_floor_sums_read_and_written_bytes_against_the_copy_bandwidth():
    ncu = _benchmark("ncu_kernels")
    # "a": two launches summed by parse (step_*); "b": counters of one launch only
    kernels = {"a": {"duration_us": 150.0, "dram_read_mb": 300.0, "dram_write_mb": 100.0, "launches": 2,
                     "step_us": 300.0, "step_dram_mb": 800.0},
               "b": {"duration_us": 100.0, "dram_read_mb": 200.0}}
    floor = ncu.dram_floor(kernels, 4e12)  # 1000 MB at 4 TB/s: 250 us
    assert floor["us"] == 400.0 and floor["dram_mb"] == 1000.0 and floor["launches"] == 3
    assert floor["floor_us"] == pytest.approx(250.0) and floor["x_floor"] == pytest.approx(1.6)
    line = ncu.floor_line(floor)
    assert "400.0 us, 1000 MB" in line and "250.0 us" in line and "1.60x" in line
    assert "floor_us" not in ncu.dram_floor(kernels, None) and "TB/s" not in ncu.floor_line(ncu.dram_floor(kernels, None))
    assert ncu.table("x:1", kernels, floor).endswith(line)


def test_ncu_rebuild_reads_decode_cases_by_gemm_name(tmp_path, capsys):
    """``ncu_kernels.py --cases decode:o_proj`` writes ``ncu_decode_o_proj.csv``; ``--from-csv``
    reads it back as ``decode:o_proj`` (not ``decode_o:proj``), the training cases by length; and a
    decode case naming no GEMM of the layer stops with the names it takes."""
    ncu = _benchmark("ncu_kernels")
    csv_text = '"ID","Kernel Name","gpu__time_duration.sum"\n"","","us"\n"0","_skinny_kernel","6.5"\n'
    (tmp_path / "ncu_decode_o_proj.csv").write_text(csv_text)
    (tmp_path / "ncu_delta_rule_2048.csv").write_text(csv_text)
    assert ncu.main(["--out", str(tmp_path), "--from-csv", "--copy-tbs", "4"]) == 0
    cases = json.loads((tmp_path / "ncu_kernels.json").read_text())["cases"]
    assert set(cases) == {"decode:o_proj", "delta_rule:2048"}
    assert cases["delta_rule:2048"]["dram_floor"]["copy_tb_per_s"] == 4.0
    assert cases["decode:o_proj"]["kernels"]["_skinny_kernel"]["duration_us"] == 6.5
    with pytest.raises(SystemExit, match="no GEMM 'w4'; one of o_proj, w2, in_proj, w13"):
        ncu.child("decode", "w4")


def test_ncu_source_rebuilds_its_tables_from_the_kept_sass_csv(tmp_path):
    """``ncu_source.py --from-csv``: ncu's SASS source page (notes and the kernel line before the
    header, an extra unnamed column, thousands separators) back to the instructions with the most
    warp-stall samples, in program order, and the opcode mix with predicates and suffixes dropped."""
    src = _benchmark("ncu_source")
    (tmp_path / "ncu_source_sass.csv").write_text("\n".join([
        '"Kernel Name","_bwd_dqkwg_kernel",',
        '"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed"',
        '"0x0","      LDG.E.128 R4, desc[UR4][R2.64]","10","1,000","x"',
        '"0x10","      BAR.SYNC.DEFER_BLOCKING 0x0","70","500"',
        '"0x20","@P0   FFMA R1, R2, R3, R4","15","2,000"',
        '"0x30","      FFMA.FTZ R5, R6, R7, R8","5","1,500"']) + "\n")
    (tmp_path / "ncu_source.json").write_text(json.dumps({"kernel": "_bwd_dqkwg_kernel", "case": "delta_rule:2048",
                                                          "when": "now", "command": "c"}))
    assert src.main(["--out", str(tmp_path), "--from-csv", "--top", "2"]) == 0
    res = json.loads((tmp_path / "ncu_source.json").read_text())
    assert [r["index"] for r in res["top"]] == [1, 2]  # the two most sampled, in program order
    assert res["top"][0]["samples_pct"] == pytest.approx(70.0) and "BAR.SYNC" in res["top"][0]["text"]
    assert res["sass_mix"]["FFMA"] == {"executed": 3500.0, "samples": 20.0}
    assert "| 1 | 70.00 |" in (tmp_path / "ncu_source.md").read_text()


def test_ncu_source_cuts_the_kernel_at_its_mma_groups():
    """``ncu_source.stretches``: HGMMA instructions less than ``gap`` apart are one group; the stretches
    before, at and between the groups cover every instruction once, with their shares of samples and
    executed instructions (the "between the value loop and the ds dots" figures of the delta records)."""
    src = _benchmark("ncu_source")
    text = ["LDG"] * 3 + ["HGMMA"] * 2 + ["FMUL"] * 10 + ["HGMMA"] + ["STG"] * 4
    rows = [{"Source": t, "Warp Stall Sampling (All Samples)": "1", "Instructions Executed": str(i + 1)}
            for i, t in enumerate(text)]
    cut = src.stretches(rows, gap=8)
    assert [(r["first"], r["last"], r["kind"]) for r in cut] == [
        (0, 2, "between"), (3, 4, "mma"), (5, 14, "between"), (15, 15, "mma"), (16, 19, "between")]
    assert sum(r["samples_pct"] for r in cut) == pytest.approx(100.0)
    assert cut[2]["samples_pct"] == pytest.approx(50.0)  # 10 of 20 samples
    assert cut[2]["executed_pct"] == pytest.approx(100 * sum(range(6, 16)) / sum(range(1, 21)))
    assert [(r["first"], r["last"]) for r in src.stretches(rows, gap=20)][1] == (3, 15)  # one group


def test_solve_tril_merges_in_tf32_only_for_a_bfloat16_inverse(monkeypatch):
    # float32 inputs must match the PyTorch forms (no TF32 there); float16 stores the inverse with
    # TF32's own 10-bit mantissa; only a bf16-stored inverse is coarser than TF32 merges round
    assert delta._solve_tril_prec(torch.float32) == delta._solve_tril_prec(torch.float16) == "ieee"
    assert delta._solve_tril_prec(torch.bfloat16) == "tf32"
    monkeypatch.setattr(delta, "SOLVE_TRIL_TF32_MERGES", False)
    assert delta._solve_tril_prec(torch.bfloat16) == "ieee"
    monkeypatch.setattr(delta, "SOLVE_TRIL_TF32_MERGES", True)
    monkeypatch.setattr(delta, "WY_INPUT_DTYPE_DOTS", False)  # float32 inverse
    assert delta._solve_tril_prec(torch.bfloat16) == "ieee"


def test_host_grid_helpers_agree_with_triton():
    """``tiles.cdiv`` / ``tiles.pow2`` replace ``triton.cdiv`` / ``triton.next_power_of_2`` in the
    host code (plain Python: no per-call ``constexpr_function`` overhead) and must give the same
    grids and blocks."""
    import triton

    from blocks.kernels import tiles

    for n in range(1, 600):
        assert tiles.pow2(n, 1) == triton.next_power_of_2(n)
        assert tiles.pow2(n) == max(16, triton.next_power_of_2(n))
        for b in (1, 7, 16, 64, 128):
            assert tiles.cdiv(n, b) == triton.cdiv(n, b)


def test_solve_tril_emulation_shows_why_only_the_merges_take_tf32():
    """``benchmarks/solve_tril_precision.py``: with correlated keys (cosine 0.9, beta 1) TF32 in
    the diagonal blocks' repeated squaring is far off, TF32 merges stay at bf16 storage error, and
    the diagonal blocks by forward substitution are more accurate than by exact squaring."""
    errs = _benchmark("solve_tril_precision").errors(0.9, 1.0, draws=1)
    assert errs["exact"] < 1e-4
    assert errs["tf32 everywhere"] > 3e-2
    assert errs["exact diagonal, tf32 merges"] < 2 * errs["bf16 storage of the exact inverse"]
    # split TF32 (three tensor-core products) in the diagonal blocks is as good as exact there
    assert errs["tf32x3 diagonal, tf32 merges"] < 2 * errs["bf16 storage of the exact inverse"]
    assert errs["tf32x3 diagonal, tf32 merges"] < 1.1 * errs["exact diagonal, tf32 merges"]
    # forward substitution (delta.SOLVE_TRIL_DIAG_SUBST) in float32: far below squaring's rounding,
    # and with the TF32 merges of bf16 inputs at the storage error like the exact dots
    assert errs["substitution diagonal, exact merges"] < min(1e-6, errs["exact"] / 100)
    assert errs["substitution diagonal, tf32 merges"] < 1.1 * errs["exact diagonal, tf32 merges"]



def test_dg_pair_emulation_shows_why_the_gate_pair_term_stays_float32():
    """``benchmarks/dg_pair_precision.py``: the gated ``bwd_dqkwg``'s gate pair term formed through
    dots with ``ds`` rounded to bf16 is ~1e-3 of its scale off; split in two bf16 parts it is ~1e-5,
    and the kernel's float32 row and column sums ~1e-6."""
    import torch

    errs = _benchmark("dg_pair_precision").worst_errors(1.0, 3, torch.Generator().manual_seed(0))
    assert errs["float32 sums"] < 3e-6
    assert 3e-6 < errs["split bf16 ds dots"] < 5e-5
    assert errs["bf16 ds dots"] > 1e-3


def test_decode_profile_lists_every_kernel_with_its_launches():
    """``gpu_kernels.kernel_summary``: launches and time per kernel name, heaviest first; the report
    lists them per decode model with the time between kernels (graph minus busy)."""
    gpu_kernels = _benchmark("gpu_kernels")
    events = [("gemm", 10.0), ("step", 3.0), ("copy", 1.0), ("gemm", 12.0), ("copy", 1.5)]
    p = gpu_kernels.kernel_summary(events)
    assert p["kernels"] == 5 and p["busy_us"] == 27.5
    assert p["by_kernel"] == [["gemm", 2, 22.0], ["step", 1, 3.0], ["copy", 2, 2.5]]
    lines = gpu_kernels._md_kernel_lists([("m x2 @ 8", {"graph_s": 40e-6, "profile": p})], rows=2)
    text = "\n".join(lines)
    assert "5 launches, 28 us busy, 12 us between kernels (graph 40 us)" in text
    assert "| `gemm` | 2 | 22.0 | 11.00 |" in text and "| 1 more kernel names | 2 | 2.5 | |" in text
    # the step's path: two layers of (gemm, step, gemm), the second gemm of each launched (PDL) before
    # the step ends; a 1 us idle gap before the second layer
    path = gpu_kernels.step_path([("gemm", 0.0, 10.0), ("step", 9.0, 12.0), ("gemm", 11.0, 20.0),
                                  ("gemm", 21.0, 30.0), ("step", 29.0, 33.0), ("gemm", 30.0, 40.0)], layers=2)
    assert path["step_us"] == 40.0 and path["idle_us"] == 1.0
    assert path["by_role"] == [["gemm#0", 2, 19.0, 19.0], ["step", 2, 5.0, 7.0], ["gemm#1", 2, 15.0, 19.0]]
    assert sum(r[2] for r in path["by_role"]) + path["idle_us"] == path["step_us"]
    # a gemm after the last layer (the model's head): its own role
    head = gpu_kernels.step_path([("gemm", 0.0, 10.0), ("gemm", 10.0, 20.0), ("gemm", 20.0, 30.0),
                                  ("gemm", 30.0, 40.0), ("gemm", 40.0, 45.0)], layers=2)
    assert head["by_role"] == [["gemm#0", 2, 20.0, 20.0], ["gemm#1", 2, 20.0, 20.0], ["gemm#+0", 1, 5.0, 5.0]]
    p["path"] = path
    text = "\n".join(gpu_kernels._md_kernel_lists([("m x2 @ 8", {"graph_s": 40e-6, "profile": p})], rows=3))
    assert "40 us under the profiler, 1.0 us idle" in text and "| `gemm#1` | 2 | 15.0 | 7.50 | 9.50 |" in text
    # a profile as runs before 2026-12-01 wrote it (no by_kernel) adds no list
    assert gpu_kernels._md_kernel_lists([("old", {"profile": {"kernels": 1, "busy_us": 1.0, "top_us": []}})]) == []


@pytest.mark.skipif(not tiles.INTERPRET, reason="runs the kernel in Triton's interpreter (TRITON_INTERPRET=1)")
@pytest.mark.parametrize("case", ["gemm", "in_proj", "o_proj", "w2"])
@pytest.mark.parametrize("M,N,K,split_k", [(3, 100, 200, 1), (16, 100, 200, 3), (1, 64, 256, 4)])
def test_decode_gemm_skinny_kernel_matches_the_torch_case(case, M, N, K, split_k):
    """``benchmarks/decode_gemm.py``'s split-K kernel, plain and with each case's fused prologue
    (RMSNorm, silu-mul) and residual epilogue, against the case in torch: N and K off its blocks,
    the reduction split (float32 partials summed by a second kernel, which adds the residual)."""
    from interpreter_bounds import checked_memory

    dg = _benchmark("decode_gemm")
    gen = torch.Generator().manual_seed(M + N + K)
    _, prologue, residual = dg.CASES.get(case, (None, dg.NO_PROLOGUE, False))
    x = torch.randn(M, 2 * K if prologue == dg.SILU_MUL else K, generator=gen)
    w, gamma, r = torch.randn(N, K, generator=gen), 1 + 0.1 * torch.randn(K, generator=gen), torch.randn(M, N, generator=gen)
    with checked_memory():
        y = dg.skinny_mm(x, w, BN=32, BK=64, split_k=split_k, num_warps=1, num_stages=1, prologue=prologue,
                         gamma=gamma if prologue == dg.RMSNORM else None, residual=r if residual else None)
    want = x @ w.t() if case == "gemm" else dg.reference(case, x, w, gamma, r)
    assert y.shape == (M, N) and torch.allclose(y, want, rtol=1e-4, atol=1e-4)
    if residual:  # a strided residual and output, and partials sized for a larger batch, give the same
        r_wide, out_wide = torch.zeros(M, N + 5), torch.zeros(M, N + 7)
        r_wide[:, :N] = r
        with checked_memory():
            y2 = dg.skinny_mm(x, w, BN=32, BK=64, split_k=split_k, num_warps=1, num_stages=1, prologue=prologue,
                              gamma=gamma if prologue == dg.RMSNORM else None, residual=r_wide[:, :N],
                              out=out_wide[:, :N], partials=torch.zeros(split_k, 16, N))
        assert y2.data_ptr() == out_wide.data_ptr() and torch.allclose(y2, want, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not tiles.INTERPRET, reason="runs the kernel in Triton's interpreter (TRITON_INTERPRET=1)")
@pytest.mark.parametrize("n,programs,block", [(1000, 3, 64), (4096, 4, 256), (100, 8, 64)])
def test_read_ceiling_sums_each_programs_contiguous_share(n, programs, block):
    """``benchmarks/read_ceiling.py``'s streaming read and copy: every element counted (copied) once,
    shares in whole blocks (the last one short, programs with nothing left dropped)."""
    from interpreter_bounds import checked_memory

    rc = _benchmark("read_ceiling")
    x = torch.randn(n, generator=torch.Generator().manual_seed(n)).to(torch.bfloat16)
    per, count = rc.read_programs(n, programs, block)
    assert per % block == 0 and count * per >= n > (count - 1) * per
    with checked_memory():
        sums = rc.read_sum(x, programs, block, 1, 1)
    want = [x[i * per:(i + 1) * per].float().sum() for i in range(count)]
    assert sums.shape == (count,) and torch.allclose(sums, torch.stack(want), atol=1e-3)
    y = torch.zeros(n + 5)  # the copy stops at n
    with checked_memory():
        rc.copy_into(x.float(), y, programs, block, 1, 1)
    assert torch.equal(y[:n], x.float()) and not y[n:].any()


def test_read_ceiling_says_it_needs_a_gpu(monkeypatch):
    rc = _benchmark("read_ceiling")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        rc.main([])


def test_decode_gemm_refuses_what_it_cannot_run():
    dg = _benchmark("decode_gemm")
    w = torch.randn(8, 32)
    with pytest.raises(ValueError, match="M<=16"):
        dg.skinny_mm(torch.randn(17, 32), w)
    with pytest.raises(ValueError, match="64"):  # silu-mul takes [a | b]: 2K columns
        dg.skinny_mm(torch.randn(2, 32), w, prologue=dg.SILU_MUL)
    with pytest.raises(ValueError, match="gamma"):
        dg.skinny_mm(torch.randn(2, 32), w, prologue=dg.RMSNORM)


def test_decode_gemm_cases_are_the_benchmark_models_gemms():
    """One layer's GEMMs of the 24-layer, d_model 2048 benchmark model (meta device: no memory):
    the fused input projection, the output projection and the MLP's two."""
    shapes = _benchmark("decode_gemm").decode_shapes()
    assert shapes == {"in_proj": (8224, 2048), "o_proj": (2048, 2048), "w13": (11008, 2048), "w2": (2048, 5504)}


def test_decode_gemm_report_names_the_best_configuration_or_the_failure():
    dg = _benchmark("decode_gemm")
    rows = [{"kernel": "cuBLAS GEMM alone (torch.mm)", "us": 5.7, "tb_s": 1.46},
            {"kernel": "torch.compile (cuBLAS + Inductor)", "us": 9.0, "tb_s": 0.9},
            {"kernel": "skinny BN=32 BK=128 split=4 w=4 s=4", "us": 4.0, "tb_s": 2.1, "fused": False},
            {"kernel": "skinny fused BN=32 BK=128 split=4 w=4 s=4", "us": 4.5, "tb_s": 1.9, "fused": True},
            {"kernel": "skinny fused BN=128 BK=256 split=8 w=8 s=5", "error": "OutOfResources", "fused": True}]
    res = {"device": "GPU", "when": "now", "batch": 16, "grid": "small", "cases": {
        "o_proj": {"N": 2048, "K": 2048, "bytes": 8.5e6, "rows": rows},
        "w2": {"N": 2048, "K": 5504, "bytes": 2.2e7, "rows": rows[:2] + [dict(rows[4])]}}}
    text = dg.markdown(res)
    assert ("| o_proj (2048 x 2048) | 8.5 | 5.70 (1.46 TB/s) | 9.00 (0.90 TB/s) | 4.00 (2.10 TB/s) | "
            "4.50 (1.90 TB/s) | 2.00 | BN=32 BK=128 split=4 w=4 s=4 |") in text
    assert "| w2 (2048 x 5504) | 22.0 | 5.70 (1.46 TB/s) | 9.00 (0.90 TB/s) | - | - | - | every configuration failed |" in text


def test_decode_mixer_applies_only_where_it_was_checked(monkeypatch):
    """``decode_mixer.applies``: off when switched off; on, deltanet, gated_deltanet and
    simple_gla (not gla, whose decay is per key channel, nor retnet, which runs the simple_gla op
    with a fixed decay) in chunk mode with head dims up to 128 (its one program holds a head's
    whole state) and a known dtype. (While a gradient is needed ``cuda_kernel`` does not offer it:
    ``tests/blocks/test_ops.py``.)"""
    import blocks
    from blocks.kernels import decode_mixer

    x = torch.zeros(2, 1, 32)
    block = blocks.build("gated_deltanet", d_model=32, num_heads=2)
    monkeypatch.setattr(decode_mixer, "ENABLED", False)
    with torch.no_grad():
        assert not decode_mixer.applies(block, x)
    monkeypatch.setattr(decode_mixer, "ENABLED", True)
    with torch.no_grad():
        assert decode_mixer.applies(block, x) and decode_mixer.applies(blocks.build("deltanet", d_model=32, num_heads=2), x)
        assert decode_mixer.applies(blocks.build("simple_gla", d_model=32, num_heads=2), x)
        for name in ("gla", "linear_attn", "retnet"):
            assert not decode_mixer.applies(blocks.build(name, d_model=32, num_heads=2), x), name
        assert not decode_mixer.applies(blocks.build("gated_deltanet", d_model=32, num_heads=2, mode="recurrent"), x)
        assert not decode_mixer.applies(blocks.build("gated_deltanet", d_model=320, num_heads=2), torch.zeros(2, 1, 320))
        assert not decode_mixer.applies(block, x.double())


def test_aot_tool_hints_what_the_jit_would_specialise():
    """``kernels_aot_regs.divisibility_hints``: pointers always; integers unless the kernel keeps
    them unspecialised (the chunk kernels' lengths), never floats or constexprs. In a subprocess
    without ``TRITON_INTERPRET`` (interpreted kernels do not keep ``do_not_specialize``)."""
    code = """
import kernels_aot_regs as aot
from blocks.kernels import delta, step
types = aot.arg_types("bf16")
cx = ("H", "K", "V", "BT", "BK", "BV", "USE_G", "USE_H0", "STORE_HT", "DOT_PREC", "GATE", "DELTA", "HAS_STATE")
for fn in (delta._fwd_h_kernel, step._step_kernel):
    sig = {n: ("constexpr" if n in cx and not (fn is step._step_kernel and n == "H") else types[n]) for n in fn.arg_names}
    print(" ".join(sorted(aot.divisibility_hints(fn, sig))))
"""
    walk, step_ = (set(line.split()) for line in run_python(code, {"TRITON_INTERPRET": None}).strip().splitlines()[-2:])
    assert {"k", "w", "h0"} <= walk and not {"T", "NT", "H"} & walk
    assert {"q", "H", "sq_b", "sv_h"} <= step_ and "scale" not in step_


def test_skinny_configs_report_compares_the_current_configuration_with_the_fastest():
    """``benchmarks/skinny_configs.py``: the grid tries splits only where the layer sums partials,
    and the report names the current and the fastest configuration and counts the failures."""
    sc = _benchmark("skinny_configs")
    assert {c[2] for c in sc.grid("w2")} == {1, 2, 4, 8} and {c[2] for c in sc.grid("swiglu")} == {1}
    res = {"device": "GPU", "when": "now", "batch": 16, "roles": {"w2": {"shape": (2048, 5504), "rows": [
        {"config": [32, 128, 4, 4, 4], "current": True, "us": 10.0},
        {"config": [64, 256, 8, 4, 4], "current": False, "us": 8.0},
        {"config": [128, 256, 8, 4, 4], "current": False, "error": "OutOfResources"}]}}}
    assert "| w2 (2048 x 5504) | (32, 128, 4, 4, 4) | 10.00 | (64, 256, 8, 4, 4) | 8.00 | 1.250 | 1 |" in sc.markdown(res)
    assert "skinny_configs.py --set PDL=False`" in sc.markdown(dict(res, set={"PDL": False}))
    assert "residual add and norm" in sc.markdown(res)
    assert "with their add_norm" in sc.markdown(dict(res, residual_epilogue=False))
    with pytest.raises(SystemExit):
        sc.main(["--roles", "w4"])
    with pytest.raises(SystemExit):
        sc.main(["--set", "PDL=maybe"])


def test_gpu_benchmark_sets_the_decode_mixer_switches(monkeypatch, capsys, tmp_path):
    """``gpu_kernels.py --set CHUNKS=2`` reaches ``decode_mixer`` (recorded in the report's switch
    line); a value a switch does not take is a one-line usage error, also inside
    ``--compiled-sets`` (whose entries may start with ``-``, the set of no change)."""
    from blocks.kernels import decode_mixer

    gpu_common, gpu_kernels = _benchmark("gpu_common"), _benchmark("gpu_kernels")
    monkeypatch.setattr(decode_mixer, "CHUNKS", decode_mixer.CHUNKS)
    assert gpu_common.apply_sets("CHUNKS=2") == {"CHUNKS": 2} and decode_mixer.CHUNKS == 2
    assert "decode_mixer: ENABLED=True, CHUNKS=2, PLAIN_CHUNKS=" in gpu_common.switches_line(gpu_common.kernel_settings())
    capsys.readouterr()
    with pytest.raises(SystemExit):
        gpu_kernels.main(["--out", str(tmp_path), "--set", "CHUNKS=3"])
    assert "CHUNKS takes (1, 2, 4), got 3" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        gpu_kernels.main(["--out", str(tmp_path), "--compiled-sets=-;PDL=maybe"])
    assert "PDL takes (False, True), got 'maybe'" in capsys.readouterr().err
    # the mixer's launch switches: a string value from --set, checked again at the launch
    monkeypatch.setattr(decode_mixer, "LAUNCH_DEPENDENTS", decode_mixer.LAUNCH_DEPENDENTS)
    assert gpu_common.apply_sets("LAUNCH_DEPENDENTS=exit") == {"LAUNCH_DEPENDENTS": "exit"}
    with pytest.raises(SystemExit):
        gpu_kernels.main(["--out", str(tmp_path), "--set", "LAUNCH_DEPENDENTS=early"])
    assert "LAUNCH_DEPENDENTS takes ('exit', 'start', 'loads', 'stores'), got 'early'" in capsys.readouterr().err
    decode_mixer.LAUNCH_DEPENDENTS = "early"
    with pytest.raises(ValueError, match="LAUNCH_DEPENDENTS: one of exit, start, loads, stores"):
        decode_mixer._trigger(torch.device("cpu"))
    decode_mixer.LAUNCH_DEPENDENTS = "stores"
    assert decode_mixer._trigger(torch.device("cpu")) == 0  # no grid dependency control off the GPU
    with pytest.raises(SystemExit):
        gpu_kernels.main(["--out", str(tmp_path), "--compiled-contexts", "1024,4k"])
    assert "--compiled-contexts: a comma list of positive integers, got '1024,4k'" in capsys.readouterr().err


def test_switched_restores_every_switch():
    """``gpu_common.switched``: the switches of a ``--set`` string inside the block (the skinny
    kernels' ``PDL`` among them), all as before after it, also when the block raises."""
    from blocks.kernels import decode_mixer, skinny

    gpu_common = _benchmark("gpu_common")
    before = (skinny.PDL, decode_mixer.CHUNKS)
    other = 4 if before[1] != 4 else 2
    with pytest.raises(RuntimeError):
        with gpu_common.switched(f"PDL={not before[0]},CHUNKS={other}") as done:
            assert done == {"PDL": not before[0], "CHUNKS": other}
            assert (skinny.PDL, decode_mixer.CHUNKS) == (not before[0], other)
            raise RuntimeError
    assert (skinny.PDL, decode_mixer.CHUNKS) == before
    assert "skinny: PDL=" in gpu_common.switches_line(gpu_common.kernel_settings())
    # the decode graph's own switch (softmax layers' rotary + cache-write kernel) too
    from archsearch import decode_graph

    with gpu_common.switched(f"ROPE_CACHE_KERNEL={not decode_graph.ROPE_CACHE_KERNEL}"):
        assert decode_graph.ROPE_CACHE_KERNEL is not True
        assert gpu_common.kernel_settings()["decode_graph"]["switches"]["ROPE_CACHE_KERNEL"] is False
    assert decode_graph.ROPE_CACHE_KERNEL is True
    assert "decode_graph: ROPE_CACHE_KERNEL=True" in gpu_common.switches_line(gpu_common.kernel_settings())
    # and the softmax layers' whole-step attention kernel and its launch switches
    from blocks.kernels import decode_attention

    with gpu_common.switched("ATTEND_KERNEL=False,ATTEND_BLOCK_N=128,ATTEND_PROGRAMS_PER_SM=2"):
        assert (decode_graph.ATTEND_KERNEL, decode_attention.ATTEND_BLOCK_N) == (False, 128)
        settings = gpu_common.kernel_settings()
        assert settings["decode_attention"]["switches"]["ATTEND_PROGRAMS_PER_SM"] == 2
        assert settings["decode_graph"]["switches"]["ATTEND_KERNEL"] is False
    assert (decode_graph.ATTEND_KERNEL, decode_attention.ATTEND_BLOCK_N, decode_attention.ATTEND_PROGRAMS_PER_SM) == (
        True, 64, 1)


def test_sets_give_skinny_launch_configurations_and_restore_them():
    """``--set CONFIGS.o_proj=64/128/4/4/4``: that entry of ``skinny.CONFIGS`` inside
    ``switched``, the table as before after it; a wrong count, a non-integer or an unknown entry
    is a one-line ValueError naming the entry."""
    from blocks.kernels import skinny

    gpu_common = _benchmark("gpu_common")
    before = dict(skinny.CONFIGS)
    with gpu_common.switched("CONFIGS.o_proj=16/64/2/8/3,PDL=False") as done:
        assert done["CONFIGS.o_proj"] == (16, 64, 2, 8, 3) and skinny.CONFIGS["o_proj"] == (16, 64, 2, 8, 3)
        assert gpu_common.kernel_settings()["skinny"]["configs"]["o_proj"] == [16, 64, 2, 8, 3]
    assert skinny.CONFIGS == before
    for bad, match in (("CONFIGS.o_proj=16/64", "CONFIGS.o_proj takes 5 positive integers"),
                       ("CONFIGS.o_proj=a/b/c/d/e", "CONFIGS.o_proj takes 5"),
                       ("CONFIGS.nope=1/2/3/4/5", "CONFIGS.nope is not an entry")):
        with pytest.raises(ValueError, match=match):
            with gpu_common.switched(bad):
                pass
        assert skinny.CONFIGS == before


def test_sets_give_skinny_prefetch_depths_and_restore_them():
    """``--set PREFETCH_TILES.swiglu=8``: that GEMM's prefetch depth inside ``switched`` (recorded in
    ``kernel_settings``), the table as before after it; a depth that is not 0 or a power of two, or a
    GEMM ``skinny.CONFIGS`` does not have, is a one-line ValueError naming the entry."""
    from blocks.kernels import skinny

    gpu_common = _benchmark("gpu_common")
    before = dict(skinny.PREFETCH_TILES)
    with gpu_common.switched("PREFETCH_TILES.swiglu=8,PREFETCH_TILES.o_proj=0") as done:
        assert done == {"PREFETCH_TILES.swiglu": 8, "PREFETCH_TILES.o_proj": 0}
        assert skinny._prefetch_tiles("swiglu") == 8 and skinny._prefetch_tiles("o_proj") == 0
        assert skinny._prefetch_tiles("w2") == skinny.PDL_PREFETCH
        assert gpu_common.kernel_settings()["skinny"]["prefetch_tiles"] == {"swiglu": 8, "o_proj": 0}
    assert skinny.PREFETCH_TILES == before
    for bad, match in (("PREFETCH_TILES.swiglu=3", "PREFETCH_TILES.swiglu takes 0 or a power of two"),
                       ("PREFETCH_TILES.swiglu=-2", "PREFETCH_TILES.swiglu takes 0 or a power of two"),
                       ("PREFETCH_TILES.nope=2", "'nope' is not a GEMM of skinny.CONFIGS")):
        with pytest.raises(ValueError, match=match):
            with gpu_common.switched(bad):
                pass
        assert skinny.PREFETCH_TILES == before


def test_skinny_pdl_waits_before_reading_the_kernel_befores_output():
    """sm_90 compile of ``skinny``'s GEMM (plain, SwiGLU on ``NormedRows``, ``residual_linear``'s
    split-K) and ``add_norm`` (and its embedding form) with ``PDL``: the grid-dependency wait comes
    before every global load, async copy and atomic except the weight prefetches, which come before
    it (``evict_last``, ``WEIGHT_EVICT_FIRST``); the launch-dependents hint is there; the split-K ticket
    is an acq_rel GPU-scope atomic."""
    import re

    code = """
import kernels_aot_regs as aot
import torch
from blocks.kernels import skinny as sk
ints = {n: "i32" for n in ("M", "N", "K", "R", "HALF", "sxm", "swn", "so_s", "so_m", "srm", "shm", "snm", "T_in",
                           "N_in", "sxg")}
ptrs = dict(x="*bf16", w="*bf16", out="*bf16", ss_in="*fp32", eps_in="fp32", res="*bf16", part="*fp32", xg="*bf16",
            gamma="*bf16", ss_out="*fp32", tickets="*i32")
# plain, SwiGLU reading NormedRows, and residual_linear's split-K with the next norm, as skinny launches them
for role, swiglu, rows, splits in (("in_proj", False, False, 1), ("swiglu", True, True, 1), ("o_proj", False, False, 4)):
    cx, launch = sk.kernel_constexprs(role, torch.bfloat16, 512, swiglu=swiglu, tiles_in=64 if rows else 0,
                                      residual=splits > 1, splits=splits, gamma=splits > 1)
    k = aot.compile_one(sk._skinny_kernel, dict(ints, **ptrs), dict(cx, PDL=True), launch["num_warps"],
                        launch["num_stages"], 90)
    print(k.asm["ptx"].replace(chr(10), " ;; "))
for gather in (False, True):
    k = aot.compile_one(sk._add_norm_kernel, dict(ints, part="*fp32", res="*bf16", rows="*i64", gamma="*fp32",
                        h="*bf16", hn="*bf16", eps="fp32"),
                        dict(S=0 if gather else 4, BLOCK=2048, NORM=True, GATHER=gather, PDL=True), 8, 1, 90)
    print(k.asm["ptx"].replace(chr(10), " ;; "))
"""
    out = run_python(code, {"TRITON_INTERPRET": None})
    ptxs = [line for line in out.splitlines() if "griddepcontrol" in line]
    assert len(ptxs) == 5, out[-2000:]
    for n, ptx in enumerate(ptxs):
        lines = [t.strip() for t in ptx.split(" ;; ")]
        wait = next(i for i, t in enumerate(lines) if t.startswith("griddepcontrol.wait"))
        assert any(t.startswith("griddepcontrol.launch_dependents") for t in lines[:wait])
        reads = [i for i, t in enumerate(lines) if re.match(r"(@%p\d+ )?(ld\.global|cp\.async|atom\.)", t)]
        assert reads and min(reads) > wait
        # residual_linear's ticket: an acquire-release atomic at GPU scope (the partials before it
        # visible to the last split), after a CTA barrier
        tickets = [i for i, t in enumerate(lines) if re.match(r"(@%p\d+ )?atom\.", t)]
        assert bool(tickets) == (n == 2)
        for i in tickets:  # a CTA barrier between the last partial store and the ticket
            last_store = max(j for j, t in enumerate(lines[:i]) if re.match(r"(@%p\d+ )?st\.global", t))
            assert ".gpu." in lines[i] and ".acq_rel." in lines[i]
            assert any(t.startswith("bar.sync") for t in lines[last_store:i])
        prefetches = [i for i, t in enumerate(lines) if "prefetch.global.L2" in t]
        assert all(i < wait for i in prefetches)
        # WEIGHT_EVICT_FIRST: the GEMMs' prefetched tiles are kept in L2 (evict_last)
        assert n > 2 or (prefetches and all("::evict_last" in lines[i] for i in prefetches))


def test_decode_mixer_reads_only_its_state_before_the_wait():
    """sm_90 compile of the decode mixer launched with PDL (``PDL_WAIT_FIRST``): without
    ``STATE_BEFORE_WAIT`` no global load comes before the grid-dependency wait; with it exactly the
    state's first slice does (``[128, 64]`` float32 over 128 threads: 16 loads of 128 bits), and
    everything the kernel before writes (the projection's rows, the gates) is read after it."""
    import re

    code = """
import kernels_aot_regs as aot
from blocks.kernels import decode_mixer as dm
for early in (False, True):
    dm.STATE_BEFORE_WAIT = early
    for name, fn, cx, warps, stages, cap in aot.jobs("bf16"):
        if name == "decode_mixer_chunks2.gated_deltanet":
            assert cx["PDL"] and cx["EARLY"] == early, cx
            k = aot.compile_one(fn, aot.arg_types("bf16", fn), cx, warps, stages, 90)
            print(k.asm["ptx"].replace(chr(10), " ;; "))
"""
    out = run_python(code, {"TRITON_INTERPRET": None})
    ptxs = [line for line in out.splitlines() if "griddepcontrol" in line]
    assert len(ptxs) == 2, out[-2000:]
    for early, ptx in zip((False, True), ptxs):
        lines = [t.strip() for t in ptx.split(" ;; ")]
        wait = next(i for i, t in enumerate(lines) if t.startswith("griddepcontrol.wait"))
        before = [t for t in lines[:wait] if re.match(r"(@%p\d+ )?ld\.global", t)]
        after = [t for t in lines[wait:] if re.match(r"(@%p\d+ )?ld\.global", t)]
        assert after
        if early:
            assert len(before) == 16 and all(".v4." in t for t in before), before
        else:
            assert not before


def test_compiled_decode_rows_are_timed_round_robin(capsys, tmp_path):
    """``gpu_kernels._time_round_robin``: every row timed once per pass, the passes interleaved
    across rows (drift over the call falls on all alike), each row's time the median of its passes;
    a row whose timing fails gets an error and the others are still completed; the report lists
    the passes. ``--rounds 0`` is a usage error."""
    gpu_kernels = _benchmark("gpu_kernels")
    order = []

    class FakeDecoder:
        def __init__(self, name, times):
            self.name, self.times = name, list(times)

        def time_step(self, iters, warmup):
            order.append(self.name)
            if not self.times:
                raise RuntimeError("graph replay failed")
            return self.times.pop(0)

    out = {key: {"params": 1e9, "bytes_per_step": 4e9, "batch": 16, "roofline_s": 1e-3,
                 "max_abs_logit_diff_vs_eager": 0.1} for key in ("a", "b", "c")}
    built = [("a", FakeDecoder("a", [3e-3, 1e-3, 2e-3])), ("b", FakeDecoder("b", [5e-3, 4e-3, 6e-3])),
             ("c", FakeDecoder("c", [1e-3]))]
    gpu_kernels._time_round_robin(out, built, rounds=3, iters=10)
    assert order == ["a", "b", "c", "a", "b", "c", "a", "b"]  # c failed in the second pass, then skipped
    assert out["a"]["graph_s"] == 2e-3 and out["a"]["graph_s_rounds"] == [3e-3, 1e-3, 2e-3]
    assert out["a"]["x_roofline"] == 2.0 and out["a"]["tokens_per_s"] == 16 / 2e-3
    assert out["b"]["graph_s"] == 5e-3 and "graph replay failed" in out["c"]["error"] and not built
    md = "\n".join(gpu_kernels._md_model({"model_compiled": out}))
    assert "| a | 1.00 B | 4000 | 2.000 |" in md and "a: 3.000, 1.000, 2.000" in md and "| c | error: timing" in md
    capsys.readouterr()
    with pytest.raises(SystemExit):
        gpu_kernels.main(["--out", str(tmp_path), "--rounds", "0"])
    assert "--rounds: must be >= 1" in capsys.readouterr().err


def test_overlap_plan_cuts_walks_with_few_programs_per_sm(monkeypatch):
    """``overlap.plan``: nearly equal chunk ranges, at most one per chunk; on CUDA only below the
    programs-per-SM threshold (a stand-in device of 132 SMs); off CUDA whenever asked."""
    from blocks.kernels import overlap

    class FakeCuda:
        is_cuda = True
        device = "cuda:0"

    monkeypatch.setattr(overlap, "sm_count", lambda device: 132)
    assert overlap.plan(512, 64, FakeCuda(), 4, 2.0) == [(0, 128), (128, 256), (256, 384), (384, 512)]
    assert overlap.plan(31, 64, FakeCuda(), 4, 2.0) == [(0, 7), (7, 15), (15, 23), (23, 31)]
    assert overlap.plan(9, 64, FakeCuda(), 8, 2.0) == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 6), (6, 7), (7, 9)]
    assert overlap.plan(512, 264, FakeCuda(), 4, 2.0) == [(0, 512)]  # 2 programs per SM: not cut
    assert overlap.plan(512, 263, FakeCuda(), 4, 2.0) != [(0, 512)]
    assert overlap.plan(512, 64, FakeCuda(), 1, 2.0) == [(0, 512)]
    assert overlap.plan(3, 64, FakeCuda(), 8, 2.0) == [(0, 1), (1, 2), (2, 3)]
    assert overlap.plan(1, 64, FakeCuda(), 8, 2.0) == [(0, 1)]
    assert overlap.plan(5, 10 ** 6, torch.empty(0), 2, 2.0) == [(0, 2), (2, 5)]


def test_overlap_run_orders_the_streams_by_events(monkeypatch):
    """``overlap.run`` on a stand-in CUDA device: the host launches every ``before`` first; each walk
    on the side stream waits for the event after its segment's ``before`` launches, each ``after``
    for the event after its walk, and every ``after`` comes after every walk is launched; the
    current stream waits for every walk before returning."""
    import contextlib

    from blocks.kernels import overlap

    log = []

    class Stream:
        def __init__(self, name):
            self.name, self.n = name, 0

        def record_event(self):
            self.n += 1
            log.append(f"{self.name}:record{self.n}")
            return f"{self.name}{self.n}"

        def wait_event(self, ev):
            log.append(f"{self.name}:wait({ev})")

    main, side = Stream("main"), Stream("side")
    current = [main]

    @contextlib.contextmanager
    def on(stream):
        current.append(stream)
        yield
        current.pop()

    class FakeCuda:
        is_cuda = True
        device = "cuda:0"

    monkeypatch.setattr(overlap.torch.cuda, "current_stream", lambda device=None: main)
    monkeypatch.setattr(overlap.torch.cuda, "stream", on)
    monkeypatch.setattr(overlap, "walk_stream", lambda device: side)
    overlap.run([(0, 2), (2, 4), (4, 5)], lambda c0, c1: log.append(f"{current[-1].name}:before{c0}"),
                lambda c0, c1, i: log.append(f"{current[-1].name}:walk{c0}#{i}"),
                lambda c0, c1: log.append(f"{current[-1].name}:after{c0}"), FakeCuda())
    befores = [e for i, c0 in enumerate((0, 2, 4)) for e in (f"main:before{c0}", f"main:record{i + 1}")]
    walks = [e for i, c0 in enumerate((0, 2, 4)) for e in (f"side:wait(main{i + 1})", f"side:walk{c0}#{i}",
                                                         f"side:record{i + 1}")]
    afters = [e for i, c0 in enumerate((0, 2, 4)) for e in (f"main:wait(side{i + 1})", f"main:after{c0}")]
    assert log == befores + walks + afters + ["main:wait(side1)", "main:wait(side2)", "main:wait(side3)"]


def test_gla_cuts_its_walks_into_about_two_over_programs_per_sm_segments(monkeypatch):
    """``gla._segments`` on a stand-in CUDA device of 132 SMs: the walks over all of V of the
    64k-token benchmark (64 chains per 32k sequence ... 1024 at 2k) get 4 / 2 / 1 / 1 segments at
    32k / 16k / 8k / 2k (``WALK_SEGMENT_SPREAD`` 2 over 0.5 / 1 / 1.9 / 7.8 programs per SM), never
    more than ``WALK_SEGMENTS``; off CUDA ``WALK_SEGMENTS`` of them."""
    from blocks.kernels import overlap

    class FakeCuda:
        is_cuda = True
        device = "cuda:0"

    monkeypatch.setattr(overlap, "sm_count", lambda device: 132)
    monkeypatch.setattr(gla, "_sm_count", lambda device: 132)
    monkeypatch.setattr(gla, "WALK_SEGMENTS", 4)
    counts = {T: len(gla._segments(T // 64, 65536 // T * 16 * 2, FakeCuda())) for T in (32768, 16384, 8192, 2048)}
    assert counts == {32768: 4, 16384: 2, 8192: 1, 2048: 1}
    monkeypatch.setattr(gla, "WALK_SEGMENTS", 2)
    assert len(gla._segments(512, 64, FakeCuda())) == 2
    assert len(gla._segments(512, 64, torch.empty(0))) == 2


def test_overlap_run_orders_each_segment_after_what_it_needs_off_cuda():
    """Off CUDA the callbacks run in an order that is valid for any walk: every ``before``, the
    walks in the given order with their place, then every ``after``."""
    from blocks.kernels import overlap

    calls = []
    overlap.run([(4, 6), (0, 4)], lambda c0, c1: calls.append(("before", c0)),
                lambda c0, c1, i: calls.append(("walk", c0, i)), lambda c0, c1: calls.append(("after", c0)),
                torch.empty(0))
    assert calls == [("before", 4), ("before", 0), ("walk", 4, 0), ("walk", 0, 1), ("after", 4), ("after", 0)]


def test_train_ab_variants_apply_and_restore_every_kind_of_setting():
    """``benchmarks/train_ab.py``'s variants: a switch, a non-switch setting, the walks' V block and
    a launch entry, all on the family's module inside the block and as before after it (also when
    the block raises); an unknown launch entry or setting is a one-line error."""
    ab = _benchmark("train_ab")
    before = ({k: dict(v) for k, v in delta.LAUNCH.items()}, delta.walk_bv, delta.WALK_SEGMENTS,
              delta.WALK_OVERLAP_BELOW_PER_SM)
    with pytest.raises(RuntimeError):
        with ab.applied("gated_delta_rule", "WALK_SEGMENTS=8,WALK_OVERLAP_BELOW_PER_SM=1000.0,walk_bv=16,"
                                            "LAUNCH.bwd_dh.num_stages=1,LAUNCH.fwd_o.maxnreg=80"):
            assert delta.WALK_SEGMENTS == 8 and delta.WALK_OVERLAP_BELOW_PER_SM == 1000.0
            assert delta.walk_bv(None, 1, 128) == 16 and delta.LAUNCH["bwd_dh"]["num_stages"] == 1
            assert delta.LAUNCH["fwd_o"]["maxnreg"] == 80
            raise RuntimeError("a variant that fails")
    assert ({k: dict(v) for k, v in delta.LAUNCH.items()}, delta.walk_bv, delta.WALK_SEGMENTS,
            delta.WALK_OVERLAP_BELOW_PER_SM) == before
    with pytest.raises(ValueError, match="LAUNCH has no nope.num_warps"):
        with ab.applied("delta_rule", "LAUNCH.nope.num_warps=4"):
            pass
    # None lifts a cap (gla's intra_a has one); a launch value that is no integer is a one-line error
    assert ab.parsed("gla", "LAUNCH.intra_a.maxnreg=None") == ("intra_a", "maxnreg", None)
    with pytest.raises(ValueError, match="expected an integer$"):
        ab.parsed("gla", "LAUNCH.intra_a.num_warps=None")
    with pytest.raises(ValueError, match="expected an integer or None"):
        ab.parsed("gla", "LAUNCH.intra_a.maxnreg=lots")
    # a float32 warp count (None: the bf16 entry's warps for float32 too)
    assert ab.parsed("delta_rule", "LAUNCH.bwd_dqkwg.num_warps_fp32=16") == ("bwd_dqkwg", "num_warps_fp32", 16)
    assert ab.parsed("delta_rule", "LAUNCH.bwd_dqkwg.num_warps_fp32=None") == ("bwd_dqkwg", "num_warps_fp32", None)
    with ab.applied("delta_rule", "LAUNCH.bwd_dqkwg.num_warps_fp32=16"):
        assert tiles.launch(delta.LAUNCH, "bwd_dqkwg", torch.empty(1))["num_warps"] == (1 if tiles.INTERPRET else 16)
    assert "num_warps_fp32" not in delta.LAUNCH["bwd_dqkwg"]
    assert ab.items("-") == [] and ab.items("torch") == [] and ab.items("A=1,B=2") == ["A=1", "B=2"]
    for bad, allowed in (("maxnreg=300", "a multiple of 8"), ("maxnreg=100", "a multiple of 8"),
                         ("num_stages=0", "1 to 4"), ("num_warps=3", "1, 2, 4, 8 or 16"),
                         ("num_warps_fp32=12", "1, 2, 4, 8 or 16")):
        with pytest.raises(ValueError, match=f"out of range \\({allowed}"):
            ab.parsed("gla", f"LAUNCH.intra_a.{bad}")
    with pytest.raises(ValueError, match="has no setting WALK_SEGMENT$"):
        with ab.applied("delta_rule", "WALK_SEGMENTS=2,WALK_SEGMENT=2"):
            pass
    assert delta.WALK_SEGMENTS == before[2]  # the item before the bad one undone too
    with pytest.raises(SystemExit):  # argparse's one-line error, before any GPU is needed
        ab.main(["--lengths", "2k"])


def test_host_orchestration_stubs_the_kernels_and_puts_them_back():
    """``benchmarks/host_orchestration.py`` times a step with every kernel of the family's module
    replaced by a no-op (so nothing is computed: the outputs stay as allocated) and restores the
    kernels and ``WALK_SEGMENTS`` after, also for a bad argument."""
    ho = _benchmark("host_orchestration")
    kernels = {n: getattr(delta, n) for n in vars(delta) if n.startswith("_") and n.endswith("_kernel")}
    segments = delta.WALK_SEGMENTS
    assert ho.host_ms("gated_delta_rule", 130, reps=2, segments=2) > 0
    assert {n: getattr(delta, n) for n in kernels} == kernels and delta.WALK_SEGMENTS == segments
    # the first launch comes after the call and before the forward returns
    assert 0 < ho.first_launch_us("delta_rule", 130, reps=3) < ho.host_ms("delta_rule", 130, reps=3) * 1e3
    assert {n: getattr(delta, n) for n in kernels} == kernels
    with pytest.raises(SystemExit):
        ho.main(["--families", "nope"])


def test_train_ab_checks_its_variants_before_asking_for_a_gpu(capsys, monkeypatch):
    """``train_ab.py`` parses every variant on every family before anything else, also without a GPU (this
    process has Triton), so that a GPU session's planned variants are checked on a CPU machine: a launch
    entry or setting a family lacks is a one-line ``--variants`` error; a good plan returns 2 saying its
    variants are understood and timing them needs a GPU."""
    ab = _benchmark("train_ab")
    args = ["--families", "gated_delta_rule,delta_rule", "--lengths", "2048,32768"]
    for bad, named in (("LAUNCH.bwd_dh_b32.num_stages=4", "bwd_dh_b32"), ("KEEP_P=False,NO_SUCH=1", "NO_SUCH"),
                       ("LAUNCH.bwd_dh.num_stages=5", "1 to 4")):
        with pytest.raises(SystemExit):
            ab.main(args + [f"--variants=-;{bad}"])
        err = capsys.readouterr().err
        assert "--variants" in err and named in err, err
    with pytest.raises(SystemExit):
        ab.main(args + ["--dtype", "fp16"])
    assert "--dtype" in capsys.readouterr().err
    if not torch.cuda.is_available():
        good = "-;KEEP_P=False,LAUNCH.bwd_dh.num_stages=2;BWD_WALK_SEGMENTS=2;LAUNCH.fwd_o.maxnreg=None"
        assert ab.main(args + [f"--variants={good}"]) == 2
        assert "the variants are understood; timing them needs a CUDA GPU" in capsys.readouterr().err
        assert ab.main(args + ["--dtype", "fp32", "--variants=-;torch;LAUNCH.bwd_dqkwg.num_warps_fp32=16"]) == 2
        assert "the variants are understood" in capsys.readouterr().err
        # where Triton does not import, nothing is parsed: the same exit without the claim
        monkeypatch.setattr(ab.importlib.util, "find_spec", lambda name: None)
        assert ab.main(args + ["--variants=-;NO_SUCH=1"]) == 2
        assert capsys.readouterr().err.strip() == "train_ab: timing them needs a CUDA GPU"


def test_train_ab_launch_wildcard_sets_every_entry_of_the_familys_launch(monkeypatch):
    """``LAUNCH.*.key=N`` in a variant is one ``LAUNCH.entry.key=N`` per entry of that family's ``LAUNCH`` (the
    families' entries differ, so one variant covers several families), applied inside ``applied`` and undone after;
    an out-of-range value is still a ``--variants`` error."""
    from blocks.kernels import kernel_module

    ab = _benchmark("train_ab")
    for family in ("gated_delta_rule", "gla", "linear_attn"):
        launch = kernel_module(family).LAUNCH
        assert ab.expanded(family, "LAUNCH.*.num_warps_fp32=16") == [
            f"LAUNCH.{e}.num_warps_fp32=16" for e in launch]
        assert ab.expanded(family, "LAUNCH.fwd_o.maxnreg=168") == ["LAUNCH.fwd_o.maxnreg=168"]
        before = {e: dict(v) for e, v in launch.items()}
        with ab.applied(family, "LAUNCH.*.num_warps_fp32=16"):
            assert all(v.get("num_warps_fp32") == 16 for v in launch.values())
        assert {e: dict(v) for e, v in launch.items()} == before
    with pytest.raises(ValueError, match="1, 2, 4, 8 or 16"):
        for one in ab.expanded("gla", "LAUNCH.*.num_warps_fp32=3"):
            ab.parsed("gla", one)


def test_train_ab_torch_variant_runs_the_ops_pytorch_form_forward_and_backward(monkeypatch):
    """``train_ab.py``'s ``torch`` variant (``kernel_launch_sweep.step(..., pytorch_form=True)``): each call one
    fwd+bwd of ``blocks.ops.<family>.chunk`` inside ``blocks.kernels.disabled()`` (so that on CUDA the op runs
    its PyTorch form), here on CPU at a ragged length in float32."""
    import contextlib

    import blocks.kernels as kernels

    sweep = _benchmark("kernel_launch_sweep")
    depth, seen = [0], []

    @contextlib.contextmanager
    def disabled():
        depth[0] += 1
        try:
            yield
        finally:
            depth[0] -= 1

    monkeypatch.setattr(kernels, "disabled", disabled)
    for family in ("gated_delta_rule", "gla"):
        mod = sweep.op_module(family)
        chunk = mod.chunk
        monkeypatch.setattr(mod, "chunk", lambda *a, _chunk=chunk, **kw: (seen.append(depth[0]), _chunk(*a, **kw))[1])
        run = sweep.step(family, 70, B=1, dtype=torch.float32, pytorch_form=True, device="cpu")
        run()
        run()
    assert seen == [1, 1, 1, 1] and depth == [0]


def test_train_ab_table_labels_float32_rows_and_compares_within_a_dtype():
    """``train_ab.table``: rows timed with ``--dtype fp32`` name their dtype beside the family and take their
    ratios against the first variant of the same family, length and dtype."""
    ab = _benchmark("train_ab")
    row = dict(family="gla", T=2048, host_ms=1.0, mtok_s=1.0, queued_mtok_s=1.0, sm_mhz=None)
    rows = [dict(row, variant="-", dtype="bf16", ms=4.0, queued_ms=4.0),
            dict(row, variant="-", dtype="fp32", ms=20.0, queued_ms=20.0),
            dict(row, variant="torch", dtype="fp32", ms=40.0, queued_ms=40.0)]
    lines = ab.table(rows).splitlines()[2:]
    assert lines[0].startswith("| gla | 2048 | `-` |") and lines[0].endswith("| 1.000 | 1.000 |")
    assert lines[1].startswith("| gla (fp32) | 2048 | `-` |") and lines[1].endswith("| 1.000 | 1.000 |")
    assert lines[2].startswith("| gla (fp32) | 2048 | `torch` |") and lines[2].endswith("| 2.000 | 2.000 |")


def test_train_ab_passes_start_one_variant_later_each_time():
    """``train_ab.round_order``: pass ``r`` runs the variants rotated by ``r`` (so that over ``n`` passes each
    of ``n`` variants runs first once), every variant once per pass, the first pass in the given order."""
    ab = _benchmark("train_ab")
    variants = ["-", "A=1", "B=2"]
    orders = [ab.round_order(variants, r) for r in range(4)]
    assert orders[0] == variants
    assert [o[0] for o in orders] == ["-", "A=1", "B=2", "-"]
    assert all(sorted(o) == sorted(variants) for o in orders)
    assert ab.round_order(["-"], 5) == ["-"]


def test_train_ab_table_gives_synced_and_queued_ratios_and_the_clock():
    """``train_ab.table``: each variant against the first of its family and length, synced and
    queued in their own columns (a queued ratio was once read off the synced column), the SM clock
    where NVML gave one, and a failed variant's error in its row."""
    ab = _benchmark("train_ab")
    rows = [{"family": "gla", "T": 2048, "variant": v, "ms": ms, "queued_ms": q, "mtok_s": 1.0, "queued_mtok_s": 1.0,
             "host_ms": 2.0, "sm_mhz": clock} for v, ms, q, clock in (("-", 4.0, 3.8, 1965.0), ("A=1", 4.2, 3.61, None))]
    rows.append({"family": "gla", "T": 2048, "variant": "B=2", "error": "CompilationError: boom"})
    lines = ab.table(rows).splitlines()
    assert lines[0].endswith("| SM MHz | vs first (synced) | vs first (queued) |")
    assert lines[2].endswith("| 1965 | 1.000 | 1.000 |")
    assert lines[3].endswith("| - | 1.050 | 0.950 |")
    assert "CompilationError: boom" in lines[4] and lines[4].count("|") == lines[0].count("|")


def test_train_ab_table_adds_the_graph_columns_only_when_a_row_has_them():
    """``train_ab.table`` with ``--graph`` rows: ``ms graph`` and queued over graph per row, a failed
    capture's error in its cell; tables without graph timings keep their columns."""
    ab = _benchmark("train_ab")
    base = {"family": "gated_delta_rule", "T": 32768, "ms": 4.8, "queued_ms": 4.5, "mtok_s": 1.0,
            "queued_mtok_s": 1.0, "host_ms": 2.0, "sm_mhz": 1980.0}
    rows = [dict(base, variant="-", graph_ms=4.2), dict(base, variant="A=1", graph_error="RuntimeError: capture")]
    rows.append({"family": "gated_delta_rule", "T": 32768, "variant": "B=2", "error": "CompilationError: boom"})
    lines = ab.table(rows).splitlines()
    assert lines[0].endswith("| vs first (queued) | ms graph | queued / graph |")
    assert lines[2].endswith("| 1.000 | 1.000 | 4.200 | 1.071 |")
    assert lines[3].endswith("| RuntimeError: capture | - |")
    assert all(line.count("|") == lines[0].count("|") for line in lines[2:])
    assert "graph" not in ab.table([dict(base, variant="-")])


def test_train_ab_host_profile_names_where_the_host_time_goes():
    """``train_ab.host_profile``: a cProfile of repeated launches, sorted by own time; here of a
    function that spends its time in a named helper. ``--host-profile`` needs ``--out``."""
    ab = _benchmark("train_ab")
    calls = []

    def slow_helper_for_the_profile():
        sum(i * i for i in range(20000))

    def step():
        slow_helper_for_the_profile()

    text = ab.host_profile(step, steps=3, top=5, busy=lambda: calls.append(1))
    assert "tottime" in text and "slow_helper_for_the_profile" in text and calls == [1, 1, 1]
    with pytest.raises(SystemExit):
        ab.main(["--host-profile"])


def test_triton_launch_cost_rejects_bad_options_and_needs_a_gpu(capsys):
    """``benchmarks/triton_launch_cost.py`` (Triton's per-launch host cost, kernel by kernel): an
    unknown family or a bad length list is argparse's one-line error; without CUDA it says so and
    returns 2 instead of failing inside Triton."""
    cost = _benchmark("triton_launch_cost")
    with pytest.raises(SystemExit):
        cost.main(["--families", "nope"])
    assert "--families" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cost.main(["--T", "2k"])
    assert "--T" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert cost.main(["--families", "gla", "--T", "256"]) == 2
        assert "needs a CUDA GPU" in capsys.readouterr().err


def test_benchmark_scripts_share_one_families_check(capsys):
    """``gpu_common.linear_families``: the ``--families`` value of every GPU benchmark script, split
    and checked in one place; the scripts turn its error into argparse's one-line message."""
    common = _benchmark("gpu_common")
    assert common.linear_families("gla,,delta_rule") == ["gla", "delta_rule"]
    with pytest.raises(ValueError, match=r"--families: unknown \['glaa'\]; choose from linear_attn"):
        common.linear_families("gla,glaa")
    for script, more in (("train_ab", []), ("triton_launch_cost", []), ("kernel_launch_sweep", []), ("step_gaps", []),
                         ("host_orchestration", []), ("gpu_kernels", ["--out", "unused"])):
        with pytest.raises(SystemExit):
            _benchmark(script).main(["--families", "glaa", *more])
        assert "--families: unknown ['glaa']" in capsys.readouterr().err, script


def test_aot_tool_counts_programs_per_sm_and_names_the_limit():
    """``kernels_aot_regs.programs_per_sm``: how many programs of a kernel an sm_90 SM holds, from
    its registers (given out per warp in blocks of 256), shared memory (plus 1 KB each), warps and
    the 32-program limit; and which of them binds. gla's ``bwd_dv`` capped at 128 registers fits two
    programs of 8 warps where 132 fit one (the cap's point); the walk's 104 against 119 fits none more."""
    aot = _benchmark("kernels_aot_regs")
    assert aot.programs_per_sm(132, 8, 0) == (1, "regs") and aot.programs_per_sm(128, 8, 0) == (2, "regs")
    assert aot.programs_per_sm(119, 4, 0)[0] == aot.programs_per_sm(104, 4, 0)[0] == 4
    assert aot.programs_per_sm(64, 4, 119304) == (1, "smem")
    assert aot.programs_per_sm(24, 16, 0) == (4, "warps")
    assert aot.programs_per_sm(24, 1, 0) == (32, "programs")


def test_aot_tool_finds_the_register_cap_that_fits_one_more_program():
    """``kernels_aot_regs.cap_for_programs`` (``--one-more-program``): the largest cap (a multiple of 8)
    at which that many programs fit by registers, consistent with ``programs_per_sm``: 3 programs of
    4 warps at 168 (the gated ``fwd_o``'s 190 fit 2), 2 of 8 warps at 128."""
    aot = _benchmark("kernels_aot_regs")
    assert aot.cap_for_programs(3, 4) == 168 and aot.cap_for_programs(2, 8) == 128 and aot.cap_for_programs(4, 4) == 128
    assert aot.programs_per_sm(190, 4, 0)[0] == 2
    for programs, warps in ((2, 4), (3, 4), (5, 4), (2, 8), (3, 2), (6, 2), (1, 16)):
        cap = aot.cap_for_programs(programs, warps)
        assert cap % 8 == 0 and aot.programs_per_sm(cap, warps, 0)[0] >= programs
        assert aot.programs_per_sm(cap + 8, warps, 0)[0] < programs or cap + 8 > 255


def test_aot_tool_one_more_program_reports_a_kernel_that_does_not_compile(monkeypatch, capsys):
    """``--one-more-program`` (``kernels_aot_regs.one_more_program``) with the compiler stubbed: a kernel
    whose launch does not compile is a ``FAILED`` row with ptxas's one line and counts as a failure (the
    script exits 1, as the resources table does); one that does not compile only at the cap is a row
    saying so, not a failure; the rest of the kernels are still reported."""
    aot = _benchmark("kernels_aot_regs")

    class Kernel:
        metadata = types.SimpleNamespace(shared=16384)

        def __init__(self, regs):
            self.regs = regs

    def compile_one(fn, types_, cx, warps, stages, arch, cap=None):
        if fn == "broken" or (fn == "tight" and cap):
            raise RuntimeError("PTXAS error: Internal Triton PTX codegen error\nptxas fatal   : Unresolved extern function")
        return Kernel(cap or 190)

    monkeypatch.setattr(aot, "compile_one", compile_one)
    monkeypatch.setattr(aot, "arg_types", lambda act, fn: {})
    monkeypatch.setattr(aot, "resources", lambda k: {"REG": str(k.regs), "STACK": "0"})
    monkeypatch.setattr(aot, "sass_counts", lambda k: (1000, 0, 0))
    runs = [("bf16", (name, name, {}, 4, 2, None)) for name in ("broken", "tight", "fits")]
    assert aot.one_more_program(runs, 90) == 1
    rows = {line.split("|")[1].strip(): line for line in capsys.readouterr().out.splitlines()
            if line.startswith("| ") and " | bf16 | " in line}
    assert "FAILED: ptxas fatal   : Unresolved extern function" in rows["broken"]
    assert "does not compile: ptxas fatal" in rows["tight"] and "FAILED" not in rows["tight"]
    assert "| 190 / 2 | 168 | 168 / 0 | 3 |" in rows["fits"]
    assert aot.failure_reason(ValueError("")) == "ValueError"


def test_aot_tool_takes_each_entrys_settings_as_the_launch_does():
    """``kernels_aot_regs.table``: a launch entry's warps, stages and cap for bf16 (stages ``None``: the
    dtype's), and for float32 one stage, no cap and the entry's ``num_warps_fp32`` where it has one, as
    ``tiles.launch`` launches it."""
    aot = _benchmark("kernels_aot_regs")
    launch = {"plain": dict(num_warps=4, num_stages=None), "tuned": dict(num_warps=4, num_stages=3, maxnreg=168,
                                                                          num_warps_fp32=16)}
    assert aot.table(launch, "plain", 2) == (4, 2, None) and aot.table(launch, "plain", 1) == (4, 1, None)
    assert aot.table(launch, "tuned", 2) == (4, 3, 168) and aot.table(launch, "tuned", 1) == (16, 1, None)


def test_aot_tool_lists_the_settings_fitted_tries():
    """``kernels_aot_regs.attempts_to_fit`` (``--fit-shared``): the shared memory at each setting
    ``blocks.kernels.fitted`` tries, from the launch's down to the first that fits the limit, or to the
    last when none does; a kernel's loop blocks halved after one stage."""
    aot = _benchmark("kernels_aot_regs")
    bf16 = {3: 188416, 2: 139264, 1: 81920}  # linear_attn's _bwd_dqkv_kernel in bf16
    need = lambda st: bf16[st["num_stages"]]  # noqa: E731
    assert [(st["num_stages"], b) for st, b in aot.attempts_to_fit(need, 3, {}, 99 * 1024)] == [
        (3, 188416), (2, 139264), (1, 81920)]
    assert [b for _, b in aot.attempts_to_fit(need, 3, {}, 163 * 1024)] == [188416, 139264]
    assert aot.attempts_to_fit(need, 2, {}, 227 * 1024) == [(dict(num_stages=2), 139264)]
    fp32 = lambda st: 180224 * st["BV"] // 64  # noqa: E731 - its float32 tiles, a need that halves with BV
    assert aot.attempts_to_fit(fp32, 1, {"BV": 64}, 99 * 1024) == [
        (dict(num_stages=1, BV=64), 180224), (dict(num_stages=1, BV=32), 90112)]
    assert aot.attempts_to_fit(lambda st: 180224, 1, {}, 99 * 1024) == [(dict(num_stages=1), 180224)]  # never
    assert aot.settings_label(dict(num_stages=1, BV=32)) == "1, BV 32"
    # before sm_90 (--arch 80) the jobs compile as the host code launches them there: no grid dependency control
    assert aot.without_gdc(dict(PDL=True, TRIGGER=3, BV=32)) == dict(PDL=False, TRIGGER=0, BV=32)
    assert aot.without_gdc(dict(BV=32)) == dict(BV=32)
    assert tiles.arch_has_gdc(9) and not tiles.arch_has_gdc(8)  # --arch 90 keeps PDL, --arch 80 / 86 not
    assert aot.fits_label(dict(num_stages=1, BV=32)) == "1 stage, BV 32" and aot.fits_label(dict(num_stages=2)) == "2 stages"


def test_host_seconds_times_each_call_after_a_sync_or_back_to_back(monkeypatch):
    """``gpu_common.host_seconds``, the host-time measure of ``train_ab.py`` and
    ``triton_launch_cost.py``: the first way queues a sleep kernel before every call (each the first
    after a synchronize), the second before each third of the calls, which then run back to back;
    the GPU is synchronised at the end either way (CUDA stubbed out here)."""
    common = _benchmark("gpu_common")
    events = []
    monkeypatch.setattr(common.torch.cuda, "synchronize", lambda: events.append("sync"))
    monkeypatch.setattr(common, "keep_gpu_busy", lambda: events.append("busy"))
    fn = lambda: events.append("call")  # noqa: E731
    assert common.host_seconds(fn, reps=4) >= 0
    assert events == ["sync", "busy", "call"] * 4 + ["sync"]
    events.clear()
    common.host_seconds(fn, reps=6, first_after_sync=False)
    assert events == (["sync", "busy"] + ["call"] * 3) * 3 + ["sync"]


def _rejects_bad_flags_and_needs_a_gpu(main, bad_args, good_args, capsys):
    """``main`` (a benchmark script's) exits on each of ``bad_args`` with a one-line error naming its
    flag, and without CUDA returns 2 on ``good_args`` saying it needs a CUDA GPU."""
    for bad in bad_args:
        with pytest.raises(SystemExit):
            main(bad)
        assert bad[0] in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert main(good_args) == 2
        assert "needs a CUDA GPU" in capsys.readouterr().err


def test_step_gaps_splits_idle_time_into_waits_for_the_host_and_the_rest(capsys):
    """``benchmarks/step_gaps.py`` on a hand-made kineto trace of two synced steps: the windows
    between synchronizes, the host's time to its first launch, idle time before the first kernel,
    a gap whose launch returned after the GPU went idle (a wait for the host) and one whose launch
    was queued in time (the rest), overlapping kernels of two streams counted once as busy; a
    window with no kernel is an error, not an empty row. Bad options are one-line errors."""
    gaps = _benchmark("step_gaps")

    def call(name, ts, dur, corr=None):
        return {"cat": "cuda_runtime", "name": name, "ts": ts, "dur": dur,
                **({"args": {"correlation": corr}} if corr is not None else {})}

    def kernel(name, ts, dur, corr):
        return {"cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": {"correlation": corr}}

    events = [call("cudaDeviceSynchronize", 0, 10),
              # step 1: window 10 .. 1000
              call("cuLaunchKernelEx", 40, 5, 1), kernel("_a_kernel", 60, 100, 1),     # host 30, idle 50
              call("cuLaunchKernelEx", 50, 5, 2), kernel("_b_kernel", 170, 100, 2),    # queued: device gap 10
              call("cuLaunchKernelEx", 300, 20, 3), kernel("_c_kernel", 330, 50, 3),   # launched late: host 60
              call("cuLaunchKernelEx", 310, 5, 4), kernel("_d_kernel", 340, 100, 4),   # other stream, overlaps c
              call("cudaDeviceSynchronize", 1000, 20),
              # step 2: window 1020 .. 2000, nothing launched
              call("cudaDeviceSynchronize", 2000, 5)]
    # the window after the second synchronize holds no launch (the profiler's own synchronize)
    assert gaps.step_windows(events) == [(10, 1000)]
    windows = [(10, 1000), (1020, 2000)]
    row = gaps.step_gaps(events, windows[0], min_gap_us=5)
    assert row["kernels"] == 4 and row["host_to_first_launch_us"] == 30 and row["idle_before_first_us"] == 50
    assert row["busy_us"] == 100 + 100 + 110 and row["wall_us"] == 440 - 10
    assert row["host_wait_us"] == 60 and row["other_gap_us"] == 10
    assert row["gaps"] == [[60.0, "_c_kernel", "host"], [10.0, "_b_kernel", "device"]]
    assert gaps.step_gaps(events, windows[0], min_gap_us=20)["gaps"] == [[60.0, "_c_kernel", "host"]]
    with pytest.raises(ValueError, match="no kernel launched inside the step's window"):
        gaps.step_gaps(events, windows[1])
    summary = gaps.summarize([row, dict(row, wall_us=1.0, gaps=[]), dict(row, wall_us=999.0, gaps=[], host_wait_us=5.0)])
    assert summary["wall_us"] == 430 and summary["gaps_of_median_step"] == row["gaps"]
    assert summary["median_step"] == {"wall_us": 430, "host_wait_us": 60} and summary["host_wait_us"] == 60
    assert "| delta_rule | 2048 |" in gaps.table([dict(summary, family="delta_rule", T=2048, synced_ms=1.0,
                                                        queued_ms=1.0)])
    # a step that synchronizes a stream or an event inside stays one window
    inner = events[:3] + [call("cudaStreamSynchronize", 100, 5)] + events[3:]
    assert gaps.step_windows(inner) == [(10, 1000)]
    _rejects_bad_flags_and_needs_a_gpu(
        gaps.main, (["--families", "nope"], ["--families", ","], ["--lengths", "1000"], ["--steps", "0"],
                    ["--min-gap-us", "-1"], ["--traces"], ["--from-traces", str(ROOT / "docs")]),
        ["--families", "gla", "--lengths", "2048"], capsys)


def test_host_launch_marks_checks_its_arguments_and_needs_a_gpu(capsys, monkeypatch):
    """``benchmarks/host_launch_marks.py``: a bad family, length or step count is a one-line error
    naming the flag; without CUDA it says so and returns 2; its medians and table row from a step
    of two stub launches on a stub clock; a step without a Triton launch is an error."""
    marks = _benchmark("host_launch_marks")
    _rejects_bad_flags_and_needs_a_gpu(marks.main, (["--families", "nope"], ["--lengths", "1000"], ["--steps", "0"]),
                                       ["--families", "gla", "--lengths", "2048"], capsys)
    # the marks of a step with two launches, 1 ms apart on the host clock, as a table row
    clock = iter(range(100))

    def step():
        for name in ("_first_kernel", "_second_kernel"):
            t0 = next(clock) * 1e-3
            marks.MARKS.append((name, t0, t0 + 0.5e-3))

    monkeypatch.setattr(marks.time, "perf_counter", lambda: next(clock) * 1e-3)
    row = marks.marks_of(step, synced=True, steps=3, sync=lambda: None)
    monkeypatch.undo()
    # per step: start at t, launches at t+1 (to t+1.5) and t+2 (to t+2.5), end at t+3
    assert row["launches"] == 2 and row["to_first_launch_us"] == pytest.approx(1000)
    assert row["host_step_us"] == pytest.approx(3000) and row["launches_us"] == pytest.approx(1000)
    assert row["gap_before_us"] == [["second_kernel", pytest.approx(500)]]
    assert "| gla | 2048 | synced | 3000 | 1000 | 2 (1000) | second_kernel>500.0 |" in marks.table(
        [{"family": "gla", "T": 2048, "mode": "synced", **row}])
    with pytest.raises(RuntimeError, match="no Triton launch"):
        marks.marks_of(lambda: None, synced=False, steps=1, sync=lambda: None)


def test_host_launch_marks_traces_the_calls_before_the_first_launch(monkeypatch):
    """``host_launch_marks.first_launch_trace``: the time to a step's first Triton launch and its
    largest gaps named by the call that ran in them; what runs after the launch is not counted; a
    step without a launch is an error."""
    import time

    import triton.runtime.jit as jit

    marks = _benchmark("host_launch_marks")

    def noted(self, *args, **kwargs):  # the name wrap_triton_launches gives JITFunction.run
        return None

    monkeypatch.setattr(jit.JITFunction, "run", noted)

    def step():
        torch.empty(4)
        time.sleep(0.02)
        jit.JITFunction.run(None)
        time.sleep(0.05)

    text = marks.first_launch_trace(step, steps=3, top=2, sync=lambda: None)
    head, first, second = text.splitlines()
    to_launch = float(head.split("to the first launch ")[1].split(" us")[0])
    assert 20_000 <= to_launch < 45_000, text
    assert "after c_call:sleep" in first and "(next: c_return:sleep)" in first, text
    assert float(first.split(" us")[0]) >= 20_000 > float(second.split(" us")[0]) * 10, text
    with pytest.raises(RuntimeError, match="no Triton launch"):
        marks.first_launch_trace(lambda: torch.empty(4), steps=1, sync=lambda: None)


def test_walk_forms_needs_the_interpreter_for_its_check_and_a_gpu_for_its_timing(capsys):
    """``benchmarks/walk_forms.py`` (the delta walk's transition form, screened): ``--check`` outside
    Triton's interpreter and a bad length list are one-line errors; without CUDA the timing says so
    and returns 2. (Its check itself runs in the interpreter tests.)"""
    forms = _benchmark("walk_forms")
    if not forms.INTERPRET:
        with pytest.raises(SystemExit):
            forms.main(["--check"])
        assert "TRITON_INTERPRET=1" in capsys.readouterr().err
    _rejects_bad_flags_and_needs_a_gpu(forms.main, (["--lengths", "2k"], ["--lengths", "1000"], ["--lengths", "0"],
                                                    ["--reps", "0"]), ["--lengths", "2048"], capsys)


def test_write_report_prints_and_writes_the_command_and_table(tmp_path, monkeypatch, capsys):
    """``gpu_common.write_report``, the report of ``train_ab.py``, ``step_gaps.py`` and
    ``walk_forms.py``: a title with the GPU and the time, the command with the script's arguments,
    the body; ``{script}.md`` and ``{script}.json`` in ``out`` (created), nothing written without it."""
    common = _benchmark("gpu_common")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Test GPU")
    md = common.write_report("step_gaps", "Idle time", "| a |\n|---|", [{"a": 1}], str(tmp_path / "new"),
                             ["--lengths", "2048"], extra=", 3 s")
    assert md.startswith("# Idle time (Test GPU, ") and ", 3 s)\n" in md
    assert "Command: `python benchmarks/step_gaps.py --lengths 2048`" in md and md.endswith("| a |\n|---|\n")
    assert (tmp_path / "new" / "step_gaps.md").read_text() == md
    assert json.loads((tmp_path / "new" / "step_gaps.json").read_text()) == {"device": "Test GPU", "rows": [{"a": 1}]}
    assert md in capsys.readouterr().out
    common.write_report("walk_forms", "t", "b", [], "", [])
    assert not (tmp_path / "walk_forms.md").exists()


def test_step_gaps_reads_a_real_h200_trace():
    """``step_gaps`` on a trace the H200 host wrote (``--traces``, 2026-12-01 19:28: five synced steps
    of gated_delta_rule at 32k, walks in four segments, before ``KKT_CUMSUM``; kineto's format with
    its own synchronizes and the driver's ``cuLaunchKernelEx``): one window per step, 36-37 kernels
    each, and the figures of ``docs/benchmarks/step_gaps.md``: 255 us idle before the first kernel,
    274 us of waits for the host, the largest after the cumsum kernel, before ``_kkt_kernel``."""
    import gzip

    gaps = _benchmark("step_gaps")
    folder = ROOT / "tests" / "blocks" / "data" / "step_gaps"
    with gzip.open(folder / "trace_gated_delta_rule_32768.json.gz", "rt") as f:
        events = json.load(f)["traceEvents"]
    windows = gaps.step_windows(events)
    assert len(windows) == 5
    summary = gaps.summarize([gaps.step_gaps(events, w) for w in windows])
    assert summary["kernels"] in (36, 37)
    assert round(summary["idle_before_first_us"]) == 255 and round(summary["host_wait_us"]) == 274
    idle, kernel, cause = summary["gaps_of_median_step"][0]
    assert kernel == "_kkt_kernel" and cause == "host" and 200 < idle < 300
    # the host's pace: its first launch call alone 27 us, launch calls a median 68 us apart
    assert round(summary["first_launch_call_us"]) == 27 and round(summary["launch_spacing_us"]) == 68
    # --from-traces: the same table again from the folder, no GPU
    assert gaps.from_traces(folder, 2.0) == [dict(summary, family="gated_delta_rule", T=32768)]
    assert gaps.main(["--from-traces", str(folder)]) == 0


def test_step_gaps_timeline_shows_what_ran_beside_the_walks(capsys):
    """``step_gaps --timeline`` on a trace the H200 host wrote (2026-12-04 19:17, ``--traces``: five synced
    steps of gated_delta_rule at 32k, the forward walk in two segments on its own stream, the reverse walk
    in one): the median-wall step's 12 kernels in start order, each walk segment beside the per-chunk
    kernels of the other segment, and the reverse walk alone on the main stream, ~0.8 ms."""
    import gzip

    gaps = _benchmark("step_gaps")
    folder = ROOT / "tests" / "blocks" / "data" / "step_gaps_1204"
    with gzip.open(folder / "trace_gated_delta_rule_32768.json.gz", "rt") as f:
        events = json.load(f)["traceEvents"]
    rows = gaps.timeline(events)
    names = [r["kernel"].strip("_") for r in rows]
    assert names == ["kkt_solve_kernel", "wu_kernel", "kkt_solve_kernel", "fwd_h_kernel", "wu_kernel",
                     "fwd_o_kernel", "fwd_h_kernel", "fwd_o_kernel", "bwd_dv_local_kernel", "bwd_dh_kernel",
                     "bwd_dqkwg_kernel", "wy_bwd_kernel"]
    assert rows[0]["start_us"] == 0.0 and all(a["start_us"] <= b["start_us"] for a, b in zip(rows, rows[1:]))
    walk_stream = rows[3]["stream"]
    assert rows[6]["stream"] == walk_stream and all(r["stream"] != walk_stream for i, r in enumerate(rows)
                                                    if i not in (3, 6))
    first_walk, second_kkt_solve, second_wu = rows[3], rows[2], rows[4]
    assert second_kkt_solve["end_us"] > first_walk["start_us"] and second_wu["start_us"] < first_walk["end_us"]
    reverse = rows[9]
    assert 750 < reverse["end_us"] - reverse["start_us"] < 850
    assert rows[8]["end_us"] <= reverse["start_us"] <= rows[10]["start_us"]  # alone: nothing beside it
    assert round(rows[-1]["end_us"]) == 4528
    assert gaps.main(["--from-traces", str(folder), "--timeline"]) == 0
    out = capsys.readouterr().out
    assert "### gated_delta_rule, T = 32768: the median-wall step's kernels" in out and "| bwd_dh_kernel | 7 |" in out
    assert "### " not in gaps.report_body(gaps.from_traces(folder, 2.0))  # no section without --timeline


def test_checked_families_and_lengths_are_the_scripts_one_line_errors(capsys):
    """``gpu_common.checked_families`` / ``checked_lengths``, the ``--families`` and length options of
    ``train_ab.py``, ``step_gaps.py``, ``walk_forms.py``, ``triton_launch_cost.py``,
    ``host_orchestration.py`` and ``gpu_kernels.py``: values through, bad ones argparse's error
    naming the option (whole batches: lengths from 64 that divide the 64k tokens)."""
    import argparse

    common = _benchmark("gpu_common")
    ap = argparse.ArgumentParser()
    assert common.checked_families(ap, "gla, delta_rule") == ["gla", "delta_rule"]
    assert common.checked_lengths(ap, "100,2048") == [100, 2048]
    assert common.checked_lengths(ap, "2048,32768", whole_batches=True) == [2048, 32768]
    for call, needle in ((lambda: common.checked_families(ap, ","), "--families: name at least one"),
                         (lambda: common.checked_families(ap, "glaa"), "--families: unknown"),
                         (lambda: common.checked_lengths(ap, "2k", flag="--T"), "--T: expected a comma list of positive"),
                         (lambda: common.checked_lengths(ap, "0"), "--lengths: expected"),
                         (lambda: common.checked_lengths(ap, "1000", whole_batches=True), "that divide 65536")):
        with pytest.raises(SystemExit):
            call()
        assert needle in capsys.readouterr().err


def test_kernel_parts_edits_follow_gla_and_bad_arguments_are_one_line_errors(capsys):
    """``benchmarks/kernel_parts.py`` (gla's and the delta rules' kernels timed with parts taken
    out): every edit applies to today's ``gla.py`` / ``delta.py`` (``--check``) and parses, changes its module
    unless it is a base, leaves the module's registrations out, and builds as a module whose kernels
    are its own; an edit whose lines are gone says so; bad arguments are one-line errors; without
    CUDA the timing says so and returns 2."""
    parts = _benchmark("kernel_parts")
    assert parts.main(["--check"]) == 0
    assert f"{len(parts.EDITS)} of {len(parts.EDITS)} edits apply to gla.py, delta.py" in capsys.readouterr().out
    assert {parts.module_of(n) for n in parts.EDITS} == {"gla", "delta"}
    for name in parts.EDITS:
        spec = parts.MODULES[parts.module_of(name)]
        src = spec.path.read_text()
        edited = parts.edited_source(name)
        ast.parse(edited)  # an edit that cuts mid-block leaves a module that does not even parse
        assert not any(d in edited for d in spec.decorators()), name
        unregistered = src
        for d in spec.decorators():
            assert d in src
            unregistered = unregistered.replace(d, "")
        assert (edited == unregistered) == name.endswith("base") or name == "base_old_dv", name
    mod = parts.build("test_no_dv", parts.edited_source("no_dv"))
    assert mod._bwd_chunk_kernel is not gla._bwd_chunk_kernel  # a kernel of its own, from the edited file
    assert "if False:\n        _dv_blocks(" in Path(mod.__file__).read_text()
    assert set(parts.kernel_names(gla)) >= {"_bwd_chunk_kernel", "_fwd_o_kernel"}
    from blocks.kernels import delta

    mod = parts.build("test_solve_no_diag", parts.edited_source("solve_no_diag"))
    assert parts.kernel_names(mod) == parts.kernel_names(delta)  # every kernel swapped, none else
    assert "register_kernel" not in parts.kernel_names(delta)
    assert mod._solve_tril_kernel is not delta._solve_tril_kernel
    assert "static_range(1, 2)" in Path(mod.__file__).read_text()  # one substitution step left
    squaring = parts.edited_source("solve_no_squaring")
    assert "n8 = " not in squaring and "def _inv_diag_blocks(" in squaring
    assert parts.module_of("old_delta") == "delta" and parts.module_of("old") == "gla"
    ab = _benchmark("train_ab")
    for name in parts.EDITS:  # each variant's own items parse as train_ab.py's; the dv edits' say the old layout
        for item in filter(None, parts.own_items(name).split(",")):
            ab.parsed(parts.MODULES[parts.module_of(name)].families[0], item)
    assert parts.own_items("solve_no_squaring") == "SOLVE_TRIL_DIAG_SUBST=False"
    assert parts.own_items("no_dv") == parts.own_items("dv_only") == "BWD_DV_SEPARATE=False,KEEP_A=False"
    assert parts.own_items("base") == "" and parts.own_items("old") == ""
    assert parts.own_items("base_old_dv") == parts.own_items("no_dv")  # the dv edits' reference
    with pytest.raises(SystemExit):  # a --set item the variant sets itself
        parts.main(["--variants", "no_dv", "--set", "KEEP_A=True"])
    assert "--set: KEEP_A is set by variant no_dv" in capsys.readouterr().err
    with pytest.raises(ValueError, match="no longer applies"):
        parts.edited_source("no_cumsum", src.replace("tl.cumsum(b_dG, axis=0)", "tl.cumsum(b_dG, 0)"))
    for bad, flag in ((["--variants", "no_such"], "--variants"), (["--variants", "old"], "--old"),
                      (["--variants", "old_delta"], "--old"), (["--lengths", "2k"], "--lengths"),
                      (["--set", "NO_SUCH=1"], "--set"),
                      (["--variants", "delta_base", "--families", "gla"], "--families"),
                      (["--variants", "delta_base", "--families", "glaa"], "--families")):
        with pytest.raises(SystemExit):
            parts.main(bad)
        assert flag in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert parts.main(["--variants", "base"]) == 2
        assert "needs a CUDA GPU" in capsys.readouterr().err


def test_gla_exponentials_are_flushed_to_zero_unless_turned_off_and_loop_bodies_show_it():
    """``tiles.fast_exp`` (gla's kernels): the sm_90 compile of gla's forward walk takes its
    exponentials as ``ex2.approx.ftz.f32``, one ``MUFU.EX2`` each without ptxas' subnormal fix-up
    (a compare with -126 before it); ``ARCHSEARCH_FAST_EXP=0`` gives ``tl.exp``'s ``ex2.approx.f32``
    and its fix-ups back. The interpreter runs ``tl.exp`` either way.

    And ``kernels_aot_regs.loop_bodies`` (``--loops``): the walk has one loop (its chunk steps) whose
    body holds the step's tensor-core dot and its exponentials, fewer instructions than the whole
    kernel (prologue, epilogue); with the fix-ups the body is longer by about 3 instructions per
    exponential (444 against 391 in sm_90 compiles with Triton 3.9). One compile per setting."""
    code = """
import re, kernels_aot_regs as aot
name, fn, cx, warps, stages, cap = next(j for j in aot.jobs("bf16") if j[0] == "gla.fwd_h")
k = aot.compile_one(fn, aot.arg_types("bf16", fn), cx, warps, stages, 90, cap)
sass = aot._cuobjdump(k, "-sass")
(n, ops), = aot.loop_bodies(k)
print(k.asm["ptx"].count("ex2.approx.ftz.f32"), k.asm["ptx"].count("ex2.approx.f32"), sass.count("MUFU.EX2"),
      len(re.findall(r"FSETP\\.GEU\\.AND P\\d, PT, R\\d+, -126", sass)),
      n, ops["MUFU"], ops["HGMMA"], aot.sass_counts(k)[0])
"""
    runs = {}
    for env in (None, "0"):
        out = run_python(code, {"TRITON_INTERPRET": None, "ARCHSEARCH_FAST_EXP": env})
        runs[env] = dict(zip(("ftz", "plain", "mufu", "fixups", "body", "body_mufu", "hgmma", "total"),
                             map(int, out.split()[-8:])))
    fast, plain = runs[None], runs["0"]
    assert fast["ftz"] >= 16 and fast["plain"] == 0 and fast["fixups"] == 0, runs
    assert plain["ftz"] == 0 and plain["plain"] >= 16 and plain["fixups"] >= 16, runs
    for r in (fast, plain):
        assert r["mufu"] >= 16 and 100 < r["body"] < r["total"] and r["body_mufu"] >= 16 and r["hgmma"] >= 1, runs
    assert plain["body"] - fast["body"] >= 2 * fast["body_mufu"], runs


def test_gluon_probe_compiles_an_asynchronous_warpgroup_mma_for_sm90(tmp_path):
    """``benchmarks/gluon_probe.py --compile-only 90``: the Gluon names a hand-scheduled Hopper walk
    would need import, and its one-tile kernel compiles for sm_90 without a GPU with its product as
    asynchronous ``wgmma.mma_async`` instructions (K = 64: four of 16) and one ``wgmma.wait_group``;
    the probe writes what it found to ``gluon_probe.json`` and exits 0. If a Triton upgrade drops or
    renames one of these, this says so before a GPU run does."""
    code = f"""
import sys, gluon_probe
sys.exit(gluon_probe.main(["--compile-only", "90", "--out", {str(tmp_path)!r}]))
"""
    run_python(code, {"TRITON_INTERPRET": None})
    res = json.loads((tmp_path / "gluon_probe.json").read_text())
    assert res["ok"] is True and all(v is True for v in res["available"].values()), res
    assert res["compile"]["arch"] == 90 and res["compile"]["wgmma"] == 4 and res["compile"]["wgmma_wait"] == 1, res
    assert res["compile"]["registers"] and res["compile"]["registers"] > 0, res


@pytest.mark.skipif(not tiles.INTERPRET, reason="runs the kernel in Triton's interpreter (TRITON_INTERPRET=1)")
@pytest.mark.parametrize("split", [True, False], ids=["w1_w3_rows", "one_region"])
@pytest.mark.parametrize("programs, bn", [(3, 32), (5, 16), (2, 64)])
def test_tile_reads_sum_each_programs_rows_once(programs, bn, split):
    """``benchmarks/tile_reads.py``'s GEMM-shaped read: over its programs, every row of the weight
    summed once (a product with ones), whether each program's rows lie in W1's and W3's halves or in
    one region; K and the halves off the blocks."""
    from interpreter_bounds import checked_memory

    tr = _benchmark("tile_reads")
    w = torch.randn(2 * 70, 300, generator=torch.Generator().manual_seed(programs))
    out = torch.empty(programs)
    with checked_memory():
        tr.tile_read(w, out, bn, 64, 2, 4, split)
    assert torch.allclose(out.sum(), w.sum(), rtol=1e-5, atol=1e-3)
    # each program's own share: rows [lo, hi) and HALF + [lo, hi), or [2 lo, 2 hi)
    half = 70
    for i in range(programs):
        lo, hi = i * half // programs, (i + 1) * half // programs
        rows = torch.cat([w[lo:hi], w[half + lo:half + hi]]) if split else w[2 * lo:2 * hi]
        assert torch.allclose(out[i], rows.sum(), rtol=1e-5, atol=1e-3)


def test_switch_plugin_runs_a_test_session_with_switches_set(tmp_path):
    """``benchmarks/switch_plugin.py`` (``pytest -p switch_plugin``): every test of the session sees
    ``ARCHSEARCH_TEST_SET``'s values; a bad value stops the session with a usage error naming it."""
    probe = tmp_path / "test_probe.py"
    probe.write_text("from blocks.kernels import delta\n\n"
                     "def test_probe():\n    assert delta.DQKWG_DS_UNMASKED is (not DEFAULT)\n"
                     f"\nDEFAULT = {delta.DQKWG_DS_UNMASKED!r}\n")
    code = f"""
import pytest
rc = pytest.main(["-q", "-p", "no:cacheprovider", "-p", "switch_plugin", {str(probe)!r}])
print("RC", int(rc))
"""
    out = run_python(code, {"ARCHSEARCH_TEST_SET": f"DQKWG_DS_UNMASKED={not delta.DQKWG_DS_UNMASKED}"})
    assert "RC 0" in out and "1 passed" in out, out
    out = run_python(code, {"ARCHSEARCH_TEST_SET": "DQKWG_DS_UNMASKED=3"})
    assert "RC 4" in out, out  # pytest's usage-error exit code



def test_kernels_are_offered_from_the_oldest_triton_they_compile_with(monkeypatch):
    """``blocks.kernels``: Triton's version read from ``triton.__version__`` (local and git suffixes too); a
    Triton older than ``MIN_TRITON`` (torch 2.5 / 2.6's 3.1 / 3.2) registers no kernel and says so in one
    warning, so the ops keep their PyTorch forms on a GPU; grid dependency control (``tiles.arch_has_gdc``,
    which ``pdl_launch`` asks) needs a Triton that has it, sm_90 or not."""
    import warnings

    import triton

    import blocks.kernels as kernels

    for text, version in (("3.6.0", (3, 6)), ("3.5.1+git1a2b3c", (3, 5)), ("3.10.0rc1", (3, 10)), ("4", (4, 0))):
        monkeypatch.setattr(triton, "__version__", text)
        assert kernels.triton_version() == version
    monkeypatch.setattr(triton, "__version__", "3.2.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(kernels, "_loaded", False)
    monkeypatch.setattr(kernels, "_KERNELS", {})
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert kernels.get_kernel("gla", "chunk") is None and not kernels.has_kernel("delta_rule", "chunk")
    assert [str(w.message) for w in seen] == [
        "blocks.kernels: Triton 3.2.0 is older than 3.3, the oldest the kernels are compiled with (make "
        "test-kernels); the ops run their PyTorch forms"]
    monkeypatch.setattr(tiles, "TRITON_HAS_GDC", False)  # Triton 3.3 / 3.4: stand-ins, PDL off everywhere
    assert not tiles.arch_has_gdc(9) and not tiles.arch_has_gdc(10)
    monkeypatch.setattr(tiles, "TRITON_HAS_GDC", True)
    assert tiles.arch_has_gdc(9) and not tiles.arch_has_gdc(8)
