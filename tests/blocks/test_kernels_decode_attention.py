"""``blocks.kernels.decode_attention``: a softmax layer's decode attention over the static KV cache
as one kernel, against the decoder's PyTorch path (``_SoftmaxCache.attend`` with the kernel off:
rotary, cache writes, SDPA with the cache's mask, the output gate).

Interpreter tests (``TRITON_INTERPRET=1``, float32, CPU) check the output, the cache slot and flag
written and that nothing else changed, over several slot blocks, with the cache split over
programs or not, before and after the ring wraps; the GPU test the same in bf16 at the decode
benchmark's shapes; the CPU test the one-line errors.
"""
from __future__ import annotations

import pytest
import torch
from test_kernels_gpu import INTERPRET, gpu, rel
from test_kernels_skinny import _layer

interpreter = pytest.mark.skipif(not INTERPRET, reason="needs TRITON_INTERPRET=1 and Triton")

# (layer config, d_model, capacity): plain heads; grouped-query heads with a window smaller than
# the capacity (cap = window) and the output gate; multi-query heads with the gate
CASES = {"mha": ({"num_heads": 2}, 32, 40),
         "gqa_window_gate": ({"num_heads": 4, "num_kv_heads": 2, "window": 37, "output_gate": True}, 32, 50),
         "mqa_gate": ({"num_heads": 4, "num_kv_heads": 1, "output_gate": True}, 64, 40)}


def _both_paths(layer, B: int, capacity: int, pos: int, splits: int | None, device, dtype):
    """The kernel and the PyTorch path from the same randomized cache (``pos`` tokens written,
    slots past them random too, as the decoder's ``randomize`` leaves them) and the same projection
    -> ``((o, k, v, valid) kernel, (o, k, v, valid) PyTorch, slot)``."""
    from archsearch import decode_graph
    from blocks.kernels import decode_attention

    caches = [decode_graph._SoftmaxCache(layer.mixer, B, capacity, dtype, device) for _ in range(2)]
    gen = torch.Generator(device=device).manual_seed(pos)
    for c in caches:
        c.k.copy_(torch.randn(c.k.shape, generator=gen, device=device))
        c.v.copy_(torch.randn(c.v.shape, generator=gen, device=device))
        c.fill(pos)
    caches[1].k.copy_(caches[0].k)
    caches[1].v.copy_(caches[0].v)
    in_proj = layer.mixer.in_proj
    proj_all = torch.randn(B, 1, sum(in_proj.widths), generator=gen, device=device).to(dtype)
    proj = dict(zip(in_proj.names, proj_all.split(in_proj.widths, dim=-1)))
    p = torch.tensor(pos, device=device)
    mine = decode_attention.attend_cache(proj["q"], proj["k"], proj["v"], proj.get("gate"), caches[0].inv_freq, p,
                                         caches[0].k, caches[0].v, caches[0].valid, splits=splits)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(decode_graph, "ATTEND_KERNEL", False)
        mp.setattr(decode_graph, "ROPE_CACHE_KERNEL", False)
        theirs = caches[1].attend(proj, p)
    return ((mine, caches[0].k, caches[0].v, caches[0].valid), (theirs, caches[1].k, caches[1].v, caches[1].valid),
            pos % caches[0].cap)


@interpreter
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("pos", [0, 21, 45, 130])
@pytest.mark.parametrize("mask", ["flags", "positions"])
def test_attend_cache_matches_the_pytorch_path_in_interpreter(case, splits, pos, mask, monkeypatch):
    """Output, cache and flags against the PyTorch path, float32: 16-slot blocks (so 40-50 slots
    are 3-4 blocks, the last short), one program or three per key/value head (split 2 empty at
    ``pos`` 21), the first token (only itself to attend to), a partly filled cache, and positions
    past the capacity (the ring has wrapped: the slot overwritten is the oldest); the written slots
    read from ``valid`` or from the position (``ATTEND_MASK``)."""
    from interpreter_bounds import checked_memory

    from blocks.kernels import decode_attention

    monkeypatch.setattr(decode_attention, "ATTEND_BLOCK_N", 16)
    monkeypatch.setattr(decode_attention, "ATTEND_MASK", mask)
    config, d_model, capacity = CASES[case]
    layer = _layer("softmax", config, d_model=d_model)
    with torch.no_grad(), checked_memory():
        (o, k, v, valid), (o_ref, k_ref, v_ref, valid_ref), slot = _both_paths(
            layer, 3, capacity, pos, splits, "cpu", torch.float32)
    assert rel(o, o_ref) < 1e-5
    assert rel(k[:, slot], k_ref[:, slot]) < 1e-6 and torch.equal(v, v_ref) and torch.equal(valid, valid_ref)
    others = torch.arange(k.shape[1]) != slot
    assert torch.equal(k[:, others], k_ref[:, others])


@gpu
@pytest.mark.parametrize("config", [{"num_heads": 16}, {"num_heads": 16, "num_kv_heads": 4, "window": 1000,
                                                         "output_gate": True}], ids=["mha", "gqa_window_gate"])
@pytest.mark.parametrize("splits", [None, 5])
@pytest.mark.parametrize("pos", [7, 1023, 3000])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_attend_cache_matches_the_pytorch_path_on_gpu(config, splits, pos, dtype):
    """At the decode benchmark's shapes (d_model 2048, 16 heads of 128, batch 16, capacity 1088 =
    1024 + 64 or the 1000-token window): the kernel's output within bf16 rounding of SDPA's path
    (float32: 1e-5, the dots in full precision), the new key within an ulp of it (the kernel's
    rotary fuses multiply-adds), every other slot, the value and the flags identical."""
    layer = _layer("softmax", config, d_model=2048, device="cuda").to(dtype)
    with torch.no_grad():
        (o, k, v, valid), (o_ref, k_ref, v_ref, valid_ref), slot = _both_paths(
            layer, 16, 1088, pos, splits, torch.device("cuda"), dtype)
    assert rel(o, o_ref) < (1e-2 if dtype == torch.bfloat16 else 1e-5)
    assert rel(k[:, slot], k_ref[:, slot]) < (1e-2 if dtype == torch.bfloat16 else 1e-6)
    others = torch.arange(k.shape[1], device=k.device) != slot
    assert torch.equal(k[:, others], k_ref[:, others])
    assert torch.equal(v, v_ref) and torch.equal(valid, valid_ref)


def test_attend_cache_refuses_what_it_does_not_serve_before_launch():
    """``attend_cache``'s one-line errors, before any launch: the cache arguments it shares with
    ``rope_into_cache`` (``rope_cache.check_cache_args``, whose every case the rope kernel's test
    covers; a non-bool mask here), a query not a whole number of key/value head groups, a gate or a
    key column block of the wrong width, columns of another dtype than the cache's (the PyTorch
    path's cache writes refuse them too), a split count below one."""
    pytest.importorskip("triton")
    from blocks.kernels import decode_attention

    B, cap, Hkv, D = 2, 5, 1, 8
    proj = torch.zeros(B, 1, 5 * D)
    q, k, v = proj[..., :2 * D], proj[..., 2 * D:3 * D], proj[..., 3 * D:4 * D]
    cache = torch.zeros(B, cap, Hkv, D)
    good = dict(gate=None, inv_freq=torch.ones(D // 2), pos=torch.tensor(3), k_cache=cache, v_cache=cache.clone(),
                valid=torch.zeros(cap, dtype=torch.bool))
    for args, change, match in (((q, k, v), dict(valid=torch.zeros(cap)), "valid: must be bool"),
                                ((q, k, v), dict(gate=proj[..., :D]), "gate: must be"),
                                ((q, k, v), dict(gate=proj[..., :2 * D].double()), "gate: must be torch.float32"),
                                ((q.half(), k, v), {}, "q: must be torch.float32 on cpu as the cache"),
                                ((q, k, v), dict(splits=0), "splits: a positive integer"),
                                ((q, proj[..., :D + 2], v), {}, "k: must be"),
                                ((proj[..., :D + 4], k, v), {}, "q: its width")):
        with pytest.raises(ValueError, match=match):
            decode_attention.attend_cache(*args, **{**good, **change})


@gpu
def test_float32_decode_attention_fits_a_64kb_gpu_at_a_smaller_slot_block():
    """With Triton's shared-memory limit patched to a T4's 64 KB (fresh process, before any kernel loads), the
    float32 attention kernel still matches the PyTorch path: at 64 cache slots per block it needs 72 KB at any
    stage count, and ``fitted`` launches it at 32 (40 KB; sm_75 compiles: ``kernels_aot_regs.py --arch 75
    --fit-shared 64 --dtype fp32 --kernels decode_attention``); float32 is what trials run on a T4."""
    from fresh_python import run_python

    out = run_python("""
import torch, triton.compiler.compiler as compiler
compiler.max_shared_mem = lambda device: 64 * 1024
from test_kernels_decode_attention import test_attend_cache_matches_the_pytorch_path_on_gpu as check
from blocks.kernels import decode_attention
for splits in (None, 5):
    check({"num_heads": 16}, splits, 1023, torch.float32)
print("fitted", *sorted({st.get("BN", 64) for st in decode_attention._attend_kernel.fitted_launches.values()}))
""", timeout=600)
    lines = [line.split()[1:] for line in out.splitlines() if line.startswith("fitted")]
    assert lines == [["32"]], out
