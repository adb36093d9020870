"""archsearch.measure: analytic vs held decode state, throughput, conditions recorded, gap notes."""
from __future__ import annotations

import pytest
import torch

from archsearch.errors import UserError
from archsearch.measure import (
    MeasureConfig,
    _gap_note,
    analytic,
    decode_memory,
    device_name,
    measure,
    prefill_chunked,
    state_tensor_bytes,
    throughput,
)
from archsearch.model import HybridLM
from archsearch.spec import ArchSpec

# Every family, with conv caches, a sliding window and GQA, so every kind of state is held.
MIXED = ArchSpec.from_dict({
    "vocab_size": 64, "d_model": 32,
    "layers": [
        {"block": "linear_attn", "config": {"num_heads": 2, "feature_map": "elu1", "conv_size": 3}},
        {"block": "retnet", "config": {"num_heads": 2}},
        {"block": "simple_gla", "config": {"num_heads": 2, "conv_size": 4}},
        {"block": "gla", "config": {"num_heads": 2}},
        {"block": "deltanet", "config": {"num_heads": 2}},
        {"block": "gated_deltanet", "config": {"num_heads": 2, "conv_size": 2}},
        {"block": "softmax", "config": {"num_heads": 4, "num_kv_heads": 2}},
        {"block": "softmax", "config": {"num_heads": 2, "window": 8}},
    ],
})


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return HybridLM(MIXED).eval()


@pytest.mark.parametrize("context", [1, 5, 12, 20])
def test_analytic_state_bytes_equal_the_state_held_after_prefill(model, context):
    cfg = MeasureConfig(batch=3, prefill_len=context, repeats=1, warmup=0, decode_steps=2)
    out = throughput(model, cfg, "cpu")
    check = out["held_check"]
    assert check["match"], check
    # and directly: decode_memory's analytic number at that context is what a prefill holds
    with torch.no_grad():
        _, states = model.prefill(torch.randint(0, 64, (3, context)))
    held = state_tensor_bytes(states)
    assert held == check["held_bytes"]
    assert decode_memory(model, MeasureConfig(context=context, batch=3), "cpu")["analytic_bytes"] == held


def test_chunked_prefill_holds_the_same_state_as_one_pass(model):
    prompt = torch.randint(0, 64, (2, 21))
    with torch.no_grad():
        ref_logits, ref_states = model.prefill(prompt)
    logits, states = prefill_chunked(model, prompt, chunk=8)  # 8 + 8 + 5 tokens
    torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-4)
    assert state_tensor_bytes(states) == state_tensor_bytes(ref_states) == model.state_bytes(2, 21, torch.float32)


def test_huge_context_is_analytic_only_on_cpu(model):
    # 2**30 tokens x 64 sequences of KV cache would be terabytes: the number must come without allocating.
    cfg = MeasureConfig(context=2**30, batch=64)
    mem = decode_memory(model, cfg, "cpu")
    assert mem["analytic_bytes"] == model.state_bytes(64, 2**30, torch.float32)
    assert mem["analytic_bytes"] > 2**40
    assert mem["measured_peak_bytes"] is None
    assert "not measured" in mem["gap_note"]
    assert (mem["context"], mem["batch"], mem["dtype"]) == (2**30, 64, "float32")


def test_throughput_reports_its_conditions(model):
    cfg = MeasureConfig(batch=2, prefill_len=8, decode_steps=3, repeats=2, warmup=1)
    out = throughput(model, cfg, "cpu")
    assert out["decode_tokens_per_s"] > 0 and out["prefill_tokens_per_s"] > 0
    assert (out["batch"], out["context"], out["decode_steps"], out["repeats"]) == (2, 8, 3, 2)
    assert out["decode_mode"] == "eager" and out["device_type"] == "cpu"
    assert out["device"] == device_name("cpu") and out["device"].endswith("(CPU)")
    assert out["decode_tokens_per_s"] == pytest.approx(2 * 3 / (out["decode_step_ms"] * 3 / 1e3))
    assert not model.training


def test_measure_bundles_params_flops_memory_and_throughput(model):
    cfg = MeasureConfig(context=4096, batch=2, prefill_len=4, decode_steps=2, repeats=1, warmup=0)
    m = measure(model, cfg, "cpu")
    assert m["params"] == model.num_params()
    assert m["flops_per_token"] == model.flops_per_token(4096)
    assert m["decode_memory"]["analytic_bytes"] == model.state_bytes(2, 4096, torch.float32)
    assert m["throughput"]["decode_tokens_per_s"] > 0
    off = measure(model, MeasureConfig(context=4096, batch=2, throughput=False), "cpu")
    assert off["throughput"]["decode_tokens_per_s"] is None and off["throughput"]["device"]


def test_analytic_on_meta_device_matches_the_real_model(model):
    with torch.device("meta"):
        meta = HybridLM(MIXED)
    cfg = MeasureConfig(context=1000, batch=4)
    a = analytic(meta, cfg, "trial status diverged", torch.bfloat16)
    assert a["params"] == model.num_params()
    assert a["flops_per_token"] == model.flops_per_token(1000)
    assert a["decode_memory"]["analytic_bytes"] == model.state_bytes(4, 1000, torch.bfloat16)
    assert a["decode_memory"]["dtype"] == "bfloat16"
    assert a["decode_memory"]["gap_note"] == "not measured: trial status diverged"


def test_state_tensor_bytes_walks_nesting_and_counts_shared_tensors_once():
    a = torch.zeros(4, 8)  # 128 bytes
    b = torch.zeros(3, dtype=torch.bfloat16)  # 6 bytes
    assert state_tensor_bytes([{"s": a, "c": [b, (a,)]}, None, {}]) == 134
    assert state_tensor_bytes([{"s": a[:2]}, {"t": a[2:]}]) == 128  # two views, two regions


def test_gap_note_explains_a_gap_over_ten_percent():
    base = {"analytic_bytes": 1000, "measured_held_bytes": 1040}
    assert _gap_note({**base, "measured_peak_bytes": 1090, "measured_prefill_peak_bytes": 1090,
                      "measured_decode_peak_bytes": 1050}) is None
    note = _gap_note({**base, "measured_peak_bytes": 5000, "measured_prefill_peak_bytes": 5000,
                      "measured_decode_peak_bytes": 1100})
    assert "prefill" in note and "activations" in note
    note = _gap_note({**base, "measured_peak_bytes": 3000, "measured_prefill_peak_bytes": 1100,
                      "measured_decode_peak_bytes": 3000})
    assert "decode" in note


@pytest.mark.parametrize("field, value", [("context", 0), ("batch", -2), ("repeats", 1.5), ("warmup", -1),
                                          ("throughput", "yes"), ("prefill_len", True),
                                          ("decode_compile", 1)])
def test_measure_config_names_the_bad_field(field, value):
    with pytest.raises(UserError, match=f"measure.{field}: must"):
        MeasureConfig(**{field: value})
    with pytest.raises(UserError, match="measure.ctx: unknown field"):
        MeasureConfig.from_dict({"ctx": 3})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_measures_peak_decode_memory_next_to_the_analytic_bytes():
    torch.manual_seed(0)
    m = HybridLM(MIXED).cuda().to(torch.bfloat16)
    cfg = MeasureConfig(context=2048, batch=4, prefill_len=128, decode_steps=4, repeats=2, prefill_chunk=512)
    mem = decode_memory(m, cfg, "cuda")
    assert mem["dtype"] == "bfloat16" and mem["measured_peak_bytes"] > 0
    assert mem["measured_state_tensor_bytes"] == m.state_bytes(4, 2048, torch.bfloat16)  # prefill 2044 + 4 steps
    if abs(mem["measured_peak_bytes"] - mem["analytic_bytes"]) > 0.1 * mem["analytic_bytes"]:
        assert mem["gap_note"]
    tp = throughput(m, cfg, "cuda")
    assert tp["device"] == torch.cuda.get_device_name() and tp["decode_tokens_per_s"] > 0
    assert tp["decode_mode"] == "cuda_graph", tp["decode_graph_error"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_decode_throughput_with_compile_replays_the_compiled_graph():
    torch.manual_seed(0)
    m = HybridLM(MIXED).cuda().to(torch.bfloat16)
    cfg = MeasureConfig(context=256, batch=4, prefill_len=64, decode_steps=4, repeats=2, decode_compile=True)
    tp = throughput(m, cfg, "cuda")
    assert tp["decode_mode"] == "cuda_graph_compiled", tp["decode_graph_error"]
    assert tp["decode_graph_error"] is None and tp["decode_tokens_per_s"] > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_failed_compile_falls_back_to_the_plain_graph_and_says_why(monkeypatch):
    import archsearch.measure as measure

    real = measure._decode_graph_stepper

    def stepper(*args, compile=False):
        if compile:
            raise RuntimeError("inductor says no\nsecond line")
        return real(*args)

    monkeypatch.setattr(measure, "_decode_graph_stepper", stepper)
    m = HybridLM(MIXED).cuda().to(torch.bfloat16)
    cfg = MeasureConfig(context=256, batch=2, prefill_len=32, decode_steps=2, repeats=2, decode_compile=True)
    tp = throughput(m, cfg, "cuda")
    assert tp["decode_mode"] == "cuda_graph"
    assert tp["decode_graph_error"] == "compile: RuntimeError: inductor says no"


def test_decode_compile_is_ignored_on_cpu(model):
    cfg = MeasureConfig(batch=1, prefill_len=4, decode_steps=2, repeats=1, warmup=0, decode_compile=True)
    out = throughput(model, cfg, "cpu")
    assert out["decode_mode"] == "eager" and out["decode_graph_error"] is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_graph_lost_after_a_repetition_reports_eager_times_only(monkeypatch):
    from archsearch import decode_graph

    real, calls = decode_graph.GraphDecoder.load, []

    def load(self, *args, **kwargs):
        calls.append(1)
        if len(calls) > 2:  # capture's load, repetition 1's load; repetition 2 fails
            raise RuntimeError("lost the graph")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(decode_graph.GraphDecoder, "load", load)
    m = HybridLM(MIXED).cuda().to(torch.bfloat16)
    cfg = MeasureConfig(context=256, batch=2, prefill_len=32, decode_steps=2, repeats=3, warmup=1)
    tp = throughput(m, cfg, "cuda")
    assert tp["decode_mode"] == "eager" and tp["decode_graph_error"] == "RuntimeError: lost the graph"
