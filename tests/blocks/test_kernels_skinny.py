"""``blocks.kernels.skinny`` (decode GEMMs of <= 16 rows, residual add + RMSNorm) and
``archsearch.decode_layer`` (a whole decode layer as those kernels and the fused mixer).

Interpreter tests (``TRITON_INTERPRET=1``, float32, CPU tensors; ``make test-kernels``) check the
kernels and the layer step against PyTorch; GPU tests check them in bf16 at the benchmark's shapes
and the captured decode graph against the eager model; the CPU tests check where the layer applies.
"""
from __future__ import annotations

import contextlib
import copy

import pytest
import torch
import torch.nn.functional as F
from interpreter_bounds import checked_memory
from test_kernels_gpu import HAS_GPU, INTERPRET, _steps_match_eager, _tiny_model, gpu, rel

from archsearch import decode_layer

interpreter = pytest.mark.skipif(not INTERPRET, reason="needs TRITON_INTERPRET=1 and Triton")


def _layer(block: str, config: dict, d_model: int = 32, device="cpu"):
    """A ``HybridLayer`` of ``block`` with its parameters moved off their inits (norm weights 1...)."""
    from archsearch.model import HybridLayer
    from archsearch.spec import ArchSpec, LayerSpec

    torch.manual_seed(0)
    spec = ArchSpec(vocab_size=11, d_model=d_model, layers=(LayerSpec(block, config),))
    layer = HybridLayer(spec, 0).to(device)
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return layer.eval()


# --- the kernels in the interpreter --------------------------------------------------------------
@interpreter
@pytest.mark.parametrize("swap", [False, True], ids=["rows_m", "weights_m"])
@pytest.mark.parametrize("M, N, K", [(3, 70, 150), (16, 32, 64), (1, 5, 300)])
def test_skinny_gemms_in_interpreter(M, N, K, swap, monkeypatch):
    """``linear``, ``swiglu`` and ``partials`` + ``add_norm`` against float32 PyTorch, with M, N, K
    off the blocks and (``partials``) K in several splits, the last one short; the products with the
    activation rows or the weights as their M side (``SWAP_AB``)."""
    from blocks.kernels import skinny

    monkeypatch.setattr(skinny, "SWAP_AB", swap)

    # float32 halves the BK (16 here): K 150 -> 4 splits of 48, the last 6 wide; 64 -> 4; 300 -> 4
    monkeypatch.setitem(skinny.CONFIGS, "o_proj_partials", (32, 32, 4, 4, 4))
    torch.manual_seed(0)
    x, w = torch.randn(M, K), torch.randn(N, K) / K ** 0.5
    w13 = torch.randn(2 * N, K) / K ** 0.5
    res, gamma = torch.randn(M, N), 1 + 0.1 * torch.randn(N)
    with checked_memory():
        y = skinny.linear(x, w)
        a = skinny.swiglu(x, w13)
        part = skinny.partials(x, w)
        h, hn = skinny.add_norm(part, res, gamma, 1e-6)
        h2, none = skinny.add_norm(part, res)
    assert rel(y, x @ w.T) < 1e-6
    w1, w3 = w13.chunk(2)
    assert rel(a, F.silu(x @ w1.T) * (x @ w3.T)) < 1e-6
    assert part.shape[0] >= 2  # split K
    assert rel(part.sum(0), x @ w.T) < 1e-6
    assert rel(h, res + x @ w.T) < 1e-6 and torch.equal(h2, h) and none is None
    assert rel(hn, F.rms_norm(h, (N,), gamma, 1e-6)) < 1e-6


@interpreter
@pytest.mark.parametrize("swap", [False, True], ids=["rows_m", "weights_m"])
@pytest.mark.parametrize("M, N, K, split", [(3, 70, 150, 4), (16, 32, 64, 4), (1, 5, 300, 4), (5, 40, 64, 1)])
def test_residual_linear_and_normed_rows_in_interpreter(M, N, K, split, swap, monkeypatch):
    """``residual_linear`` (split K added up by each column tile's last split, the residual, the
    next norm as ``NormedRows``) and ``linear`` / ``swiglu`` reading those rows, against float32
    PyTorch; the split-K tickets are all back at 0 afterwards (the next call starts clean). The
    interpreter runs the programs one after another, so which split finishes a tile is exercised
    on the GPU (``test_skinny_gemms_at_decode_shapes_on_gpu``, three calls in a row)."""
    from blocks.kernels import skinny

    monkeypatch.setattr(skinny, "SWAP_AB", swap)
    monkeypatch.setitem(skinny.CONFIGS, "o_proj", (16, 32, split, 4, 4))  # float32: BK 16
    torch.manual_seed(1)
    x, w = torch.randn(M, K), torch.randn(N, K) / K ** 0.5
    res, gamma = torch.randn(M, N), 1 + 0.3 * torch.randn(N)
    w_next, w13 = torch.randn(24, N) / N ** 0.5, torch.randn(2 * 24, N) / N ** 0.5
    with checked_memory():
        h, rows = skinny.residual_linear(x, w, res, gamma, 1e-5)
        y = skinny.linear(rows, w_next)
        a = skinny.swiglu(rows, w13)
        h2, none = skinny.residual_linear(x, w, res)
    ref = res + x @ w.T
    hn = F.rms_norm(ref, (N,), gamma, 1e-5)
    assert rel(h, ref) < 1e-6 and torch.equal(h2, h) and none is None
    assert rows.sumsq.shape == (skinny.cdiv(N, 16), M) and rel(rows.scaled, ref * gamma) < 1e-6
    assert rel(rows.materialize(), hn) < 1e-6
    assert rel(y, hn @ w_next.T) < 1e-6
    w1, w3 = w13.chunk(2)
    assert rel(a, F.silu(hn @ w1.T) * (hn @ w3.T)) < 1e-6
    tickets = skinny._TICKETS.get(torch.device("cpu"))  # none allocated until a call has two splits
    assert (tickets is None and split == 1) or not tickets.any()


@interpreter
def test_residual_linear_tickets_choose_the_split_that_finishes_a_tile_in_interpreter(monkeypatch):
    """The split-K ticket decides which split finishes a column tile: with tile 1's ticket left at
    1 (as a call that died mid-way would leave it), the third of its four splits takes ticket 3 and
    finishes the tile before the fourth has stored its partial, which then leaves the ticket at 1;
    the other tiles are right and back at 0. (The interpreter runs the splits in order.)"""
    from blocks.kernels import skinny

    monkeypatch.setitem(skinny.CONFIGS, "o_proj", (16, 32, 4, 4, 4))  # float32: BK 16, K 64 -> 4 splits
    torch.manual_seed(2)
    x, w, res = torch.randn(4, 64), torch.randn(48, 64) / 8, torch.randn(4, 48)
    skinny.residual_linear(-x, w, res)  # allocates the tickets (other partials than below: a reused buffer differs)
    tickets = skinny._TICKETS[torch.device("cpu")]
    tickets[1] = 1
    try:
        h, _ = skinny.residual_linear(x, w, res)
        ref = res + x @ w.T
        assert rel(h[:, :16], ref[:, :16]) < 1e-6 and rel(h[:, 32:], ref[:, 32:]) < 1e-6
        # tile 1 was finished without the fourth split's partial: whatever its slot held (the first
        # call's partial, or fresh memory, NaN included, when the buffer was not reused) made it wrong
        tile = h[:, 16:32]
        assert not torch.isfinite(tile).all() or rel(tile, ref[:, 16:32]) > 1e-3
        assert tickets[:3].tolist() == [0, 1, 0]
    finally:
        tickets.zero_()


@interpreter
@pytest.mark.parametrize("one_tile", [False, True], ids=["two_tiles", "one_tile"])
@pytest.mark.parametrize("balanced", [False, True], ids=["blocks", "balanced"])
@pytest.mark.parametrize("N", [5, 70, 200])
def test_balanced_one_split_gemms_in_interpreter(N, balanced, one_tile, monkeypatch):
    """``linear`` and ``swiglu`` with ``BALANCED_LINEAR`` / ``BALANCED_SWIGLU``: the columns spread
    over whole waves of ``INTERPRET_SMS`` (3) programs, unevenly (N 70: 24 / 23 / 23 columns of
    block-32 programs; 200: 7 tiles -> 9 programs; 5: 3 programs), and SwiGLU's two weight tiles
    as one (``SWIGLU_ONE_TILE``), also on ``NormedRows``, against float32 PyTorch."""
    from blocks.kernels import skinny

    monkeypatch.setattr(skinny, "BALANCED_LINEAR", balanced)
    monkeypatch.setattr(skinny, "BALANCED_SWIGLU", balanced)
    monkeypatch.setattr(skinny, "SWIGLU_ONE_TILE", one_tile)
    monkeypatch.setitem(skinny.CONFIGS, "in_proj", (32, 64, 1, 4, 4))
    monkeypatch.setitem(skinny.CONFIGS, "swiglu", (32, 64, 1, 4, 4))
    torch.manual_seed(0)
    M, K = 3, 40
    x, w, w13 = torch.randn(M, K), torch.randn(N, K) / K ** 0.5, torch.randn(2 * N, K) / K ** 0.5
    rows = skinny.NormedRows(x, torch.rand(2, M) * K, 1e-6)
    xn = rows.materialize()
    with checked_memory():
        y, a = skinny.linear(x, w), skinny.swiglu(rows, w13)
    assert rel(y, x @ w.T) < 1e-6
    w1, w3 = w13.chunk(2)
    assert rel(a, F.silu(xn @ w1.T) * (xn @ w3.T)) < 1e-6


def test_balanced_programs_cover_whole_waves_and_refuse_split_k(monkeypatch):
    """``balanced_programs``: whole waves of SMs, each program at most a block of columns, at most a
    column each; the launch takes that grid only where its switch is on, and a balanced split-K or
    residual launch is refused."""
    pytest.importorskip("triton")
    from blocks.kernels import skinny

    cpu = torch.device("cpu")
    monkeypatch.setattr(skinny, "INTERPRET_SMS", 132)  # a CPU device: no SM count
    assert skinny.balanced_programs(5504, 86, cpu) == 132  # w1|w3 at block 64: 41-42 columns each
    assert skinny.balanced_programs(8224, 129, cpu) == 132
    assert skinny.balanced_programs(8448, 133, cpu) == 264
    assert skinny.balanced_programs(40, 1, cpu) == 40
    for N, tiles in ((5504, 86), (8448, 133), (100, 2)):
        P = skinny.balanced_programs(N, tiles, cpu)
        assert max((i + 1) * N // P - i * N // P for i in range(P)) <= skinny.cdiv(N, tiles)

    grids = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kw: grids.append((grid, kw["BALANCED"]))

    monkeypatch.setattr(skinny, "_skinny_kernel", Recorder())
    monkeypatch.setitem(skinny.CONFIGS, "swiglu", (32, 64, 1, 4, 4))
    x, w = torch.zeros(2, 8), torch.zeros(200, 8)
    monkeypatch.setattr(skinny, "BALANCED_SWIGLU", False)
    monkeypatch.setattr(skinny, "BALANCED_LINEAR", False)
    skinny.swiglu(x, w)  # 100 columns: 4 blocks of 32
    monkeypatch.setattr(skinny, "BALANCED_SWIGLU", True)
    skinny.swiglu(x, w)
    skinny.linear(x, w, "swiglu")  # BALANCED_LINEAR off
    assert grids == [((4, 1), False), ((100, 1), True), ((7, 1), False)]  # 132 SMs, 100 columns: one each
    with pytest.raises(ValueError, match="balanced columns serve one-split GEMMs"):
        skinny.kernel_constexprs("o_proj", torch.float32, 8, residual=True, splits=2, balanced=True)


@interpreter
def test_embed_norm_in_interpreter():
    """``skinny.embed_norm``: the rows of the tokens (repeated, first and last of the vocabulary)
    and their RMSNorm, against ``F.embedding`` + ``F.rms_norm``."""
    from blocks.kernels import skinny

    torch.manual_seed(0)
    weight, gamma = torch.randn(50, 70), 1 + 0.1 * torch.randn(70)
    tokens = torch.tensor([3, 0, 49, 3, 17])
    with checked_memory():
        x, hn = skinny.embed_norm(weight, tokens, gamma, 1e-5)
    assert torch.equal(x, F.embedding(tokens, weight))
    assert rel(hn, F.rms_norm(x, (70,), gamma, 1e-5)) < 1e-6
    with checked_memory():  # tokens outside the vocabulary: NaN rows, no read out of bounds
        x, hn = skinny.embed_norm(weight, torch.tensor([50, -1, 7]), gamma, 1e-5)
    assert x[:2].isnan().all() and hn[:2].isnan().all() and torch.equal(x[2], weight[7])


def test_skinny_gemms_refuse_shapes_they_do_not_serve_before_launch():
    pytest.importorskip("triton")
    from blocks.kernels import skinny

    x, w = torch.zeros(17, 8), torch.zeros(4, 8)
    with pytest.raises(ValueError, match="x \\[M <= 16, K\\]"):
        skinny.linear(x, w)
    with pytest.raises(ValueError, match="one dtype"):
        skinny.linear(torch.zeros(2, 8, dtype=torch.bfloat16), w)
    with pytest.raises(ValueError, match="stack W1 over W3"):
        skinny.swiglu(torch.zeros(2, 8), torch.zeros(5, 8))
    with pytest.raises(ValueError, match="residual \\[M, N\\] of x's dtype"):
        skinny.residual_linear(torch.zeros(2, 8), w, torch.zeros(2, 5))
    with pytest.raises(ValueError, match="gamma \\[N\\] contiguous"):
        skinny.residual_linear(torch.zeros(2, 8), w, torch.zeros(2, 4), torch.ones(5))
    with pytest.raises(ValueError, match="NormedRows.sumsq float32 \\[T, M\\]"):
        skinny.linear(skinny.NormedRows(torch.zeros(2, 8), torch.zeros(1, 3), 1e-6), w)
    with pytest.raises(ValueError, match="part float32"):
        skinny.add_norm(torch.zeros(1, 2, 4, dtype=torch.bfloat16), torch.zeros(2, 4))
    with pytest.raises(ValueError, match="tokens contiguous int64"):
        skinny.embed_norm(torch.zeros(9, 4), torch.zeros(3, dtype=torch.int32), torch.ones(4))
    with pytest.raises(ValueError, match="tokens contiguous int64"):  # a strided column of tokens
        skinny.embed_norm(torch.zeros(9, 4), torch.zeros(3, 2, dtype=torch.long)[:, 0], torch.ones(4))


def test_skinny_prefetch_depth_per_gemm_reaches_the_launch(monkeypatch):
    """Each GEMM prefetches ``PREFETCH_TILES[config]`` K tiles, else ``PDL_PREFETCH``; a depth that
    is not 0 or a power of two is a ValueError naming its entry, before any launch."""
    pytest.importorskip("triton")
    from blocks.kernels import skinny

    launched = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kw: launched.append(kw["PREFETCH"])

    monkeypatch.setattr(skinny, "_skinny_kernel", Recorder())
    monkeypatch.setattr(skinny, "PDL_PREFETCH", 2)
    monkeypatch.setattr(skinny, "PREFETCH_TILES", {"swiglu": 8, "o_proj": 0})
    x, w = torch.zeros(2, 8), torch.zeros(4, 8)
    skinny.linear(x, w)
    skinny.swiglu(x, w)
    skinny.residual_linear(x, w, torch.zeros(2, 4), config="o_proj")
    assert launched == [2, 8, 0]
    skinny.PREFETCH_TILES["swiglu"] = 3
    with pytest.raises(ValueError, match=r"PREFETCH_TILES\['swiglu'\]: 0 or a power of two"):
        skinny.swiglu(x, w)
    assert launched == [2, 8, 0]


def test_rope_cache_refuses_what_it_does_not_serve_before_launch():
    """``rope_into_cache``'s one-line errors, before any launch: caches of odd head dim or
    different shapes or dtypes, frequencies of the wrong length or dtype, a non-bool mask, a
    batched position, a projection column block of the wrong width or dtype."""
    pytest.importorskip("triton")
    from blocks.kernels import rope_cache

    B, cap, Hkv, D = 2, 5, 1, 8
    proj = torch.zeros(B, 1, 4 * D)
    q, k, v = proj[..., :2 * D], proj[..., 2 * D:3 * D], proj[..., 3 * D:]
    cache = torch.zeros(B, cap, Hkv, D)
    good = dict(inv_freq=torch.ones(D // 2), pos=torch.tensor(3), k_cache=cache, v_cache=cache.clone(),
                valid=torch.zeros(cap, dtype=torch.bool))
    for change, match in ((dict(k_cache=torch.zeros(B, cap, Hkv, 7)), "k_cache, v_cache"),
                          (dict(v_cache=torch.zeros(B, cap + 1, Hkv, D)), "k_cache, v_cache"),
                          (dict(inv_freq=torch.ones(D)), "inv_freq"),
                          (dict(inv_freq=torch.ones(D // 2, dtype=torch.float64)), "inv_freq"),
                          (dict(valid=torch.zeros(cap)), "valid"),
                          (dict(pos=torch.tensor([3])), "pos"),
                          (dict(pos=torch.tensor(3.0)), "pos"),
                          (dict(v_cache=cache.double()), "v_cache: must be torch.float32 as k_cache")):
        with pytest.raises(ValueError, match=match):
            rope_cache.rope_into_cache(q, k, v, **{**good, **change})
    with pytest.raises(ValueError, match="v: must be torch.float32 on cpu as the cache"):
        rope_cache.rope_into_cache(q, k, v.half(), **good)
    with pytest.raises(ValueError, match="k: must be"):
        rope_cache.rope_into_cache(q, proj[..., :D + 2], v, **good)


# --- the layer step in the interpreter -----------------------------------------------------------
LAYER_CONFIGS = [("gated_deltanet", {"num_heads": 2}), ("deltanet", {"num_heads": 2, "conv_size": 0}),
                 ("simple_gla", {"num_heads": 2, "output_gate": True})]


@interpreter
@pytest.mark.parametrize("block, config", LAYER_CONFIGS, ids=lambda c: str(c))
@pytest.mark.parametrize("given_norm", [False, True], ids=["norm1_here", "norm1_given"])
@pytest.mark.parametrize("epilogue", [False, True], ids=["add_norm", "residual_epilogue"])
def test_decode_layer_step_in_interpreter(block, config, given_norm, epilogue, monkeypatch):
    """``decode_layer.step`` against ``HybridLayer.forward`` for one token continuing a state: the
    new residual stream, the next norm of it (a tensor, or handed on as ``NormedRows``), the new
    state; with ``norm1(x)`` computed there or handed in (as the fused layer before hands it), and
    with o_proj / w2 as ``residual_linear`` or as ``partials`` + ``add_norm``."""
    from blocks import kernels
    from blocks.kernels import decode_mixer, skinny

    monkeypatch.setattr(skinny, "RESIDUAL_EPILOGUE", epilogue)

    layer = _layer(block, config)
    reference = copy.deepcopy(layer)  # the block's own path (no mixer kernel)
    mixer = layer.mixer
    # on CPU the block finds no kernel: hand its decode step to the mixer kernel directly
    monkeypatch.setattr(mixer, "fused_decode", lambda x, proj, state: decode_mixer.mixer_step(mixer, proj, state))
    next_norm = torch.nn.RMSNorm(32, eps=1e-6)
    with torch.no_grad():
        next_norm.weight.add_(0.1 * torch.randn(32))
        _, state = reference(torch.randn(3, 5, 32))
        x = torch.randn(3, 1, 32)
        ref_x, ref_state = reference(x, state)
        hn = layer.norm1(x) if given_norm else None
        with checked_memory():
            out, hn_next, new = decode_layer.step(layer, x, hn, state, next_norm)
            out3, rows, _ = decode_layer.step(layer, x, hn, state, next_norm, hand_on=True)
            mine = {n: t.clone() for n, t in state.items()}
            with kernels.inplace_decode_state():
                out2, none, new2 = decode_layer.step(layer, x, hn, mine, None)
    assert rel(out, ref_x) < 1e-5 and rel(hn_next, next_norm(ref_x)) < 1e-5
    assert isinstance(rows, skinny.NormedRows) == epilogue and rel(out3, out) < 1e-6  # w2 summed in another order
    assert rel(rows.materialize()[:, None] if epilogue else rows, next_norm(ref_x)) < 1e-5
    # the rows handed on, as the next fused layer takes them (they were next_norm's: make it norm1)
    layer.norm1.load_state_dict(next_norm.state_dict())
    reference.norm1.load_state_dict(next_norm.state_dict())
    with torch.no_grad():
        ref_out4, _ = reference(ref_x, state)
        out4, _, _ = decode_layer.step(layer, out3, rows, state, None)
    assert rel(out4, ref_out4) < 1e-5
    assert set(new) == set(ref_state) and all(rel(new[n], ref_state[n]) < 1e-5 for n in ref_state)
    assert torch.equal(out2, out3) and none is None and all(new2[n] is mine[n] for n in mine)


ATTENTION_CONFIGS = [{"num_heads": 2}, {"num_heads": 4, "num_kv_heads": 2, "window": 3, "output_gate": True}]


@interpreter
@pytest.mark.parametrize("config", ATTENTION_CONFIGS, ids=["mha", "gqa_window_gate"])
@pytest.mark.parametrize("given_norm", [False, True], ids=["norm1_here", "norm1_given"])
@pytest.mark.parametrize("epilogue", [False, True], ids=["add_norm", "residual_epilogue"])
@pytest.mark.parametrize("kernel", [None, "rope_cache", "attend_cache"], ids=["torch", "rope_kernel", "attend_kernel"])
def test_decode_attention_step_in_interpreter(config, given_norm, epilogue, kernel, monkeypatch):
    """``decode_layer.attention_step`` (a softmax layer's GEMMs as skinny kernels around the
    decoder's static-cache attention, ``_SoftmaxCache.attend``) against ``HybridLayer.forward`` for
    one token after a 5-token prompt: the residual stream, the next norm (a tensor, or handed on as
    ``NormedRows`` to a next layer's in_proj), the key and value the cache gained and the slot's
    flag; grouped-query heads with a 3-token window (the ring wraps) and the output gate, or plain
    heads; the attention step as PyTorch ops, with ``blocks.kernels.rope_cache``'s kernel for the
    rotary and cache writes, or as ``blocks.kernels.decode_attention``'s whole-step kernel (which
    ``attend`` takes on CUDA)."""
    import blocks.ops.utils
    from archsearch.decode_graph import _SoftmaxCache
    from blocks.kernels import decode_attention, rope_cache, skinny

    monkeypatch.setattr(skinny, "RESIDUAL_EPILOGUE", epilogue)
    calls = []
    offered = {"rope_cache": rope_cache.rope_into_cache, "attend_cache": decode_attention.attend_cache}
    if kernel:  # on CPU cuda_kernel offers nothing: hand attend the kernel as CUDA would
        real = blocks.ops.utils.cuda_kernel
        monkeypatch.setattr(blocks.ops.utils, "cuda_kernel", lambda family, form, x, *a: (
            calls.append(family) or offered[family]) if family == kernel else real(family, form, x, *a))
    layer = _layer("softmax", config)
    next_norm = torch.nn.RMSNorm(32, eps=1e-6)
    B, P = 3, 5
    with torch.no_grad():
        next_norm.weight.add_(0.1 * torch.randn(32))
        _, state = layer(torch.randn(B, P, 32))
        x = torch.randn(B, 1, 32)
        ref_x, ref_state = layer(x, state)
        hn = layer.norm1(x) if given_norm else None
        caches = []
        for _ in range(2):
            caches.append(_SoftmaxCache(layer.mixer, B, capacity=8, dtype=torch.float32, device="cpu"))
            caches[-1].load(state["k_cache"], state["v_cache"], P)
        slot = P % caches[0].cap
        caches[0].valid[slot] = False  # the ring's slot was the prompt's: the step must set it again
        before = [t.clone() for t in (caches[0].k, caches[0].v, caches[0].valid)]
        pos = torch.tensor(P)
        with checked_memory():
            out, hn_next = decode_layer.attention_step(layer, x, hn, caches[0].attend, pos, next_norm)
            out2, rows = decode_layer.attention_step(layer, x, hn, caches[1].attend, pos, next_norm, hand_on=True)
    assert rel(out, ref_x) < 1e-5 and rel(hn_next, next_norm(ref_x)) < 1e-5
    assert isinstance(rows, skinny.NormedRows) == epilogue and rel(out2, out) < 1e-6
    assert rel(rows.materialize()[:, None] if epilogue else rows, next_norm(ref_x)) < 1e-5
    for name, buf in (("k_cache", caches[0].k), ("v_cache", caches[0].v)):
        assert rel(buf[:, slot], ref_state[name][:, -1]) < 1e-5, name
    assert caches[0].valid.tolist() == [True] * min(P + 1, caches[0].cap) + [False] * (caches[0].cap - P - 1)
    others = torch.arange(caches[0].cap) != slot  # nothing else written
    assert all(torch.equal(now[:, others] if now.dim() > 1 else now[others], old[:, others] if old.dim() > 1 else old[others])
               for now, old in zip((caches[0].k, caches[0].v, caches[0].valid), before))
    assert calls == ([kernel] * 2 if kernel else [])
    # the rows handed on, as the next fused layer takes them (a linear layer whose norm1 they are)
    linear = _layer("simple_gla", {"num_heads": 2})
    linear.norm1.load_state_dict(next_norm.state_dict())
    mixer = linear.mixer
    from blocks.kernels import decode_mixer
    monkeypatch.setattr(mixer, "fused_decode", lambda x, proj, state: decode_mixer.mixer_step(mixer, proj, state))
    with torch.no_grad():
        _, lin_state = linear(torch.randn(B, P, 32))
        ref_out3, _ = linear(ref_x, lin_state)
        out3, _, _ = decode_layer.step(linear, out2, rows, lin_state, None)
    assert rel(out3, ref_out3) < 1e-5


@interpreter
def test_decode_layer_falls_back_to_the_layer_when_the_mixer_is_switched_off_after_the_plan_in_interpreter():
    """``step`` on a layer whose mixer takes its own path (``fused_decode`` returns None, as when
    ``decode_mixer.ENABLED`` goes off after a GraphDecoder planned the layer): the layer's result
    and the next norm of it, not an error. The GEMM run before the mixer is the only kernel (CPU:
    the interpreter)."""
    layer = _layer("gated_deltanet", {"num_heads": 2})
    next_norm = torch.nn.RMSNorm(32, eps=1e-6)
    with torch.no_grad():
        _, state = layer(torch.randn(2, 4, 32))
        x = torch.randn(2, 1, 32)
        ref, ref_state = layer(x, state)
        out, hn, new = decode_layer.step(layer, x, None, state, next_norm)
    assert torch.equal(out, ref) and torch.equal(hn, next_norm(ref)) and torch.equal(new["S"], ref_state["S"])


def test_decode_layer_refuses_layers_it_does_not_compute(monkeypatch):
    """``applies`` with the kernels stubbed in and a stand-in CUDA input: yes for an RMSNorm +
    SwiGLU gated_deltanet layer; no without an MLP, with LayerNorm, with a norm without weight.
    ``attention_applies`` likewise for softmax layers (and no for a linear one, or recurrent mode)."""
    import blocks.kernels
    from archsearch.model import HybridLayer
    from archsearch.spec import ArchSpec, LayerSpec

    class OnCuda:  # a stand-in for a [2, 1, 32] CUDA tensor
        is_cuda, shape, dtype, requires_grad = True, (2, 1, 32), torch.float32, False

        def dim(self):
            return 3

    mixer_step = lambda *a: None  # noqa: E731
    mixer_step.applies = lambda block, x: block.name == "gated_deltanet"
    monkeypatch.setattr(blocks.kernels, "get_kernel", lambda family, form: mixer_step)
    monkeypatch.setattr(decode_layer, "ENABLED", True)

    def layer(**spec):
        args = dict(vocab_size=11, d_model=32, layers=(LayerSpec("gated_deltanet", {"num_heads": 2}),))
        return HybridLayer(ArchSpec(**{**args, **spec}), 0)

    with torch.no_grad():
        assert decode_layer.applies(layer(), OnCuda())
        assert not decode_layer.applies(layer(mlp_expansion=0), OnCuda())
        assert not decode_layer.applies(layer(norm="layernorm"), OnCuda())
        plain = layer()
        plain.norm2 = torch.nn.RMSNorm(32, elementwise_affine=False)
        assert not decode_layer.applies(plain, OnCuda())
        simple = HybridLayer(ArchSpec(vocab_size=11, d_model=32, layers=(LayerSpec("gla", {"num_heads": 2}),)), 0)
        assert not decode_layer.applies(simple, OnCuda())
        # softmax layers: attention_step, not step; any heads, window or gate; chunk mode only
        attn = {"layers": (LayerSpec("softmax", {"num_heads": 4, "num_kv_heads": 2, "window": 3, "output_gate": True}),)}
        assert decode_layer.attention_applies(layer(**attn), OnCuda()) and not decode_layer.applies(layer(**attn), OnCuda())
        assert not decode_layer.attention_applies(layer(), OnCuda())
        assert not decode_layer.attention_applies(layer(**attn, mlp_expansion=0), OnCuda())
        assert not decode_layer.attention_applies(layer(**attn, norm="layernorm"), OnCuda())
        recurrent = {"layers": (LayerSpec("softmax", {"num_heads": 2, "mode": "recurrent"}),)}
        assert not decode_layer.attention_applies(layer(**recurrent), OnCuda())
    assert not decode_layer.applies(layer(), OnCuda())  # a gradient is recorded
    assert not decode_layer.attention_applies(layer(**attn), OnCuda())


# --- where the layer applies (CPU) ---------------------------------------------------------------
def test_decode_layer_applies_only_on_cuda_when_switched_on(monkeypatch):
    """Off when switched off, on CPU, while a gradient is recorded, above 16 rows or for a layer
    the fused mixer does not serve; a CPU GraphDecoder plans no fused layers (nor head). The head
    kernel (``head_applies``): a bias-free ``nn.Linear`` of the activations' dtype after an RMSNorm."""
    from archsearch.decode_graph import GraphDecoder
    from test_kernels_gpu import _cpu_model

    monkeypatch.setattr(decode_layer, "ENABLED", True)
    layer = _layer("gated_deltanet", {"num_heads": 2})
    with torch.no_grad():
        assert not decode_layer.applies(layer, torch.zeros(2, 1, 32))  # CPU
        assert not decode_layer.attention_applies(_layer("softmax", {"num_heads": 2}), torch.zeros(2, 1, 32))
    model = _cpu_model([("gated_deltanet", {"num_heads": 2}), ("softmax", {"num_heads": 2})])
    dec = GraphDecoder(model, 2, capacity=4, use_graph=False)
    assert dec.fused_layers == set() and not dec.fused_head
    head, final = torch.nn.Linear(32, 11, bias=False), torch.nn.RMSNorm(32)
    assert not decode_layer.head_applies(head, final, torch.zeros(2, 1, 32))  # CPU
    if not HAS_GPU:
        return
    cuda = layer.cuda()
    x = torch.zeros(2, 1, 32, device="cuda")
    with torch.no_grad():
        assert decode_layer.head_applies(head.cuda(), final.cuda(), x)
        assert not decode_layer.head_applies(torch.nn.Linear(32, 11).cuda(), final.cuda(), x)  # a bias
        assert not decode_layer.head_applies(head.cuda(), torch.nn.LayerNorm(32).cuda(), x)
        assert not decode_layer.head_applies(head.cuda().bfloat16(), final.cuda(), x)  # another dtype
        assert decode_layer.applies(cuda, x)
        assert not decode_layer.applies(cuda, torch.zeros(17, 1, 32, device="cuda"))
        assert not decode_layer.applies(_layer("gla", {"num_heads": 2}, device="cuda"), x)
        monkeypatch.setattr(decode_layer, "ENABLED", False)
        assert not decode_layer.applies(cuda, x)
    monkeypatch.setattr(decode_layer, "ENABLED", True)
    assert not decode_layer.applies(cuda, x)  # a gradient is recorded


# --- GPU -----------------------------------------------------------------------------------------
@contextlib.contextmanager
def _fused_paths_on():
    """The fused decode mixer and layers on inside the block, off after it (the tests switch both
    off for their eager reference)."""
    from blocks.kernels import decode_mixer

    decode_mixer.ENABLED = decode_layer.ENABLED = True
    try:
        yield
    finally:
        decode_mixer.ENABLED = decode_layer.ENABLED = False


@gpu
@pytest.mark.parametrize("swap, prefetch, balanced", [(False, None, False), (True, None, False), (True, 8, False),
                                                       (True, None, True)],
                         ids=["rows_m", "weights_m", "weights_m_prefetch8", "weights_m_balanced"])
@pytest.mark.parametrize("case", ["in_proj", "o_proj", "w13", "w2"])
def test_skinny_gemms_at_decode_shapes_on_gpu(case, swap, prefetch, balanced, monkeypatch):
    """bf16 at the benchmark model's shapes (batch 16, d_model 2048) against float32 PyTorch on the
    same bf16 values; the weights as the products' M side too (``SWAP_AB``: warpgroup MMA at block
    64 on sm_90, the configurations' blocks as they are), with 8 K tiles prefetched
    (``PREFETCH_TILES``; under PDL, which only the decode graph's kernels before it give time), and
    the one-split GEMMs' columns spread over the SMs (``BALANCED_LINEAR`` / ``BALANCED_SWIGLU``) with
    SwiGLU's two weight tiles as one (``SWIGLU_ONE_TILE``)."""
    from blocks.kernels import skinny

    monkeypatch.setattr(skinny, "SWAP_AB", swap)
    monkeypatch.setattr(skinny, "BALANCED_LINEAR", balanced)
    monkeypatch.setattr(skinny, "BALANCED_SWIGLU", balanced)
    monkeypatch.setattr(skinny, "SWIGLU_ONE_TILE", balanced)
    if prefetch is not None:
        monkeypatch.setattr(skinny, "PREFETCH_TILES", dict.fromkeys(skinny.CONFIGS, prefetch))

    N, K = {"in_proj": (8224, 2048), "o_proj": (2048, 2048), "w13": (11008, 2048), "w2": (2048, 5504)}[case]
    torch.manual_seed(0)
    x = torch.randn(16, K, device="cuda").bfloat16()
    w = (torch.randn(N, K, device="cuda") / K ** 0.5).bfloat16()
    ref = x.float() @ w.float().T
    if case == "in_proj":
        assert rel(skinny.linear(x, w), ref) < 1e-2
    elif case == "w13":
        a, b = ref.chunk(2, dim=-1)
        assert rel(skinny.swiglu(x, w), F.silu(a) * b) < 1e-2
    else:
        res, gamma = torch.randn(16, N, device="cuda").bfloat16(), torch.rand(N, device="cuda") + 0.5
        h, hn = skinny.add_norm(skinny.partials(x, w, case + "_partials"), res, gamma, 1e-6)
        assert rel(h, res.float() + ref) < 1e-2 and rel(hn, F.rms_norm(h.float(), (N,), gamma, 1e-6)) < 1e-2
        for _ in range(3):  # residual_linear, its split-K tickets reused call after call
            h2, rows = skinny.residual_linear(x, w, res, gamma.bfloat16(), 1e-6, case)
            assert rel(h2, res.float() + ref) < 1e-2
            assert rel(rows.materialize(), F.rms_norm(h2.float(), (N,), gamma, 1e-6)) < 1e-2
        assert not skinny._TICKETS[x.device].any()
        w_next = (torch.randn(4 * N, N, device="cuda") / N ** 0.5).bfloat16()
        hn2 = F.rms_norm(h2.float(), (N,), gamma.bfloat16().float(), 1e-6)
        assert rel(skinny.linear(rows, w_next), hn2 @ w_next.float().T) < 1e-2
        a, b = (hn2 @ w_next.float().T).chunk(2, dim=-1)
        assert rel(skinny.swiglu(rows, w_next), F.silu(a) * b) < 1e-2


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("compile_mode", [False, True], ids=["graph", "compiled"])
@pytest.mark.parametrize("pdl, head", [(False, False), (True, False), (True, True)], ids=["", "pdl", "pdl_head"])
def test_fused_decode_layers_in_the_decode_graph_match_eager(dtype, compile_mode, pdl, head, monkeypatch):
    """With ``decode_layer.ENABLED`` the layers of a captured decode graph (two linear in a row
    after the fused embedding + norm, a softmax layer handed its norm1 and handing on its next, a
    linear one after it, one last: the final norm fused) run as the skinny kernels and the fused
    mixer (the softmax layer: the skinny GEMMs around the cache's attention), step by step against
    the eager model with both off; with and without the skinny kernels' programmatic dependent
    launch (``skinny.PDL``); and with the head as a skinny GEMM on the last layer's handed-on final
    norm (``decode_graph.HEAD_KERNEL``)."""
    from archsearch import decode_graph
    from archsearch.decode_graph import GraphDecoder
    from blocks.kernels import decode_mixer, skinny, tiles

    monkeypatch.setattr(skinny, "PDL", pdl)
    monkeypatch.setattr(decode_graph, "HEAD_KERNEL", head)
    launches = []
    real_pdl = tiles.pdl_launch  # every launch's PDL arguments, recorded
    monkeypatch.setattr(skinny, "pdl_launch", lambda on, device: launches.append(real_pdl(on, device)) or launches[-1])

    model = _tiny_model([("gated_deltanet", {"num_heads": 2}), ("deltanet", {"num_heads": 2}),
                         ("softmax", {"num_heads": 2}), ("simple_gla", {"num_heads": 2}),
                         ("gated_deltanet", {"num_heads": 2})]).to(dtype)
    monkeypatch.setattr(decode_mixer, "ENABLED", False)
    monkeypatch.setattr(decode_layer, "ENABLED", False)

    B, P, steps = 3, 9, 5
    prompt = torch.randint(0, 97, (B, P), device="cuda")
    with _fused_paths_on():
        dec = GraphDecoder(model, B, capacity=P + steps, compile=compile_mode)
    assert dec.fused_layers == {0, 1, 2, 3, 4} and dec.next_norms[4] is model.final_norm and dec.fused_embed
    assert dec.next_norms[0] is model.layers[1].norm1 and dec.next_norms[1] is model.layers[2].norm1
    assert dec.fused_head == head
    _steps_match_eager(model, dec, prompt, steps, 1e-4 if dtype == torch.float32 else 5e-2, dec_context=_fused_paths_on)
    # the switch reached the launches: the GEMMs, add_norm and embed_norm
    assert len(launches) > 10 and all(("launch_pdl" in kw) == pdl for kw in launches)


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("chunks", [1, 2, 4])
@pytest.mark.parametrize("epilogue", [False, True], ids=["add_norm", "residual_epilogue"])
@pytest.mark.parametrize("first", ["gla", "softmax"])
@pytest.mark.parametrize("mixer_pdl", [("exit", False), ("stores", True)], ids=["mixer_plain", "mixer_pdl"])
def test_fused_decode_layers_after_an_unfused_first_layer_match_eager(dtype, chunks, epilogue, first, mixer_pdl,
                                                                       monkeypatch):
    """The fused layers with PDL in a model whose first layer is not fused (gla: no fused
    embedding; the first fused layer, softmax with grouped-query heads, a 4-token window whose ring
    wraps in the 12 steps and the output gate, computes its own norm1) and whose linear heads are
    small (64 value columns), the mixer's state in one, two or four slices (``decode_mixer.CHUNKS``,
    ``PLAIN_CHUNKS``; launched plainly, or with PDL waiting first and letting o_proj launch after
    its state stores: ``PDL_WAIT_FIRST``, ``LAUNCH_DEPENDENTS``), o_proj / w2 as
    ``residual_linear`` or ``partials`` + ``add_norm``
    (``skinny.RESIDUAL_EPILOGUE``), against the eager model with the fused paths off, 12 steps.
    With ``first`` = softmax instead, that layer is fused too and takes its norm1 from the fused
    embedding lookup."""
    from archsearch.decode_graph import GraphDecoder
    from blocks.kernels import decode_mixer, skinny

    model = _tiny_model([(first, {"num_heads": 2}),
                         ("softmax", {"num_heads": 2, "num_kv_heads": 1, "window": 4, "output_gate": True}),
                         ("gated_deltanet", {"num_heads": 1}), ("simple_gla", {"num_heads": 1}),
                         ("deltanet", {"num_heads": 1})]).to(dtype)
    monkeypatch.setattr(skinny, "PDL", True)
    monkeypatch.setattr(skinny, "RESIDUAL_EPILOGUE", epilogue)
    monkeypatch.setattr(decode_mixer, "CHUNKS", chunks)
    monkeypatch.setattr(decode_mixer, "PLAIN_CHUNKS", chunks)
    monkeypatch.setattr(decode_mixer, "LAUNCH_DEPENDENTS", mixer_pdl[0])
    monkeypatch.setattr(decode_mixer, "PDL_WAIT_FIRST", mixer_pdl[1])
    monkeypatch.setattr(decode_mixer, "ENABLED", False)
    monkeypatch.setattr(decode_layer, "ENABLED", False)

    B, P, steps = 4, 6, 12
    prompt = torch.randint(0, 97, (B, P), device="cuda")
    with _fused_paths_on():
        dec = GraphDecoder(model, B, capacity=P + steps)
    if first == "gla":
        assert dec.fused_layers == {1, 2, 3, 4} and not dec.fused_embed
    else:
        assert dec.fused_layers == {0, 1, 2, 3, 4} and dec.fused_embed
    _steps_match_eager(model, dec, prompt, steps, 1e-4 if dtype == torch.float32 else 5e-2, dec_context=_fused_paths_on)
