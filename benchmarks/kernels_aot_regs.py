"""Compile the chunk kernels (linear_attn / simple_gla, gla, the delta rules) and the decode kernels
(the fused state step, the decode mixer, the decode layer's GEMMs, the softmax layers' attention) for
a GPU architecture WITHOUT a GPU and print each
kernel's registers, spill stack, shared memory, how many of its programs an sm_90 SM holds and
what limits them, whether its loops were software-pipelined and its static SASS instruction,
shuffle and barrier counts.

    python benchmarks/kernels_aot_regs.py [--arch 90] [--dtype bf16|fp32|both] [--kernels wy,walk] [--warps 4,8] [--stages 1,2,3]
                                          [--set NAME=VALUE,...] [--lines N] [--loops] [--fit-shared KB]
                                          [--one-more-program]

Triton lowers to PTX and Triton's bundled ptxas assembles it for ``sm_<arch>``; ``cuobjdump
-res-usage`` (also bundled) reads the resources. A compile error here is one the GPU would hit,
and a large STACK (bytes of local memory per thread: register spills) is the first thing to fix
when a kernel is slow; both are checkable on a laptop. The launch configurations below mirror the
host code of ``blocks/kernels/delta.py`` and ``gla.py`` for the benchmark's problem
(16 heads of dim 128, long sequences: walks at BV=32). Exits 1 if any kernel fails to compile.
``PYTHONPATH=.triton-host`` compiles with the GPU host's Triton (``make .triton-host/.installed``;
``tests/blocks/test_kernels_host_triton.py``).
"""
from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project root, for blocks
sys.path.insert(0, str(Path(__file__).resolve().parent))

from triton_check import require_triton  # noqa: E402

require_triton("kernels_aot_regs")

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from blocks.kernels import decode_attention as da  # noqa: E402
from blocks.kernels import decode_mixer as dm  # noqa: E402
from blocks.kernels import delta as d  # noqa: E402
from blocks.kernels import fitted  # noqa: E402
from blocks.kernels import gla as g  # noqa: E402
from blocks.kernels import scalar_decay as sd  # noqa: E402
from blocks.kernels import skinny as sk  # noqa: E402
from blocks.kernels import tiles  # noqa: E402
from blocks.kernels import step as st  # noqa: E402
from gpu_common import apply_sets, comma_ints  # noqa: E402 - benchmarks/ is this script's own folder

# the delta backward's inter-kernel gradients (dv2, dw, dk_in, du) are in the activations' dtype,
# and so is the WY inverse Ai with delta.WY_INPUT_DTYPE_DOTS
ACTIVATIONS = ("q", "k", "v", "w", "u", "vn", "o", "do", "h", "dh", "dq", "dk", "dv", "dv2", "dw", "dk_in", "du",
               "p",  # delta's kept chunk scores (KEEP_P)
               # the decode mixer's projection columns, conv cache and weights, block parameters
               "proj", "cache", "new_cache", "conv_w", "a", "bl", "gate", "norm_w", "A_log", "dt_bias",
               # the softmax layers' KV caches (decode_attention)
               "k_cache", "v_cache")


def arg_types(act: str, fn=None) -> dict[str, str]:
    """Triton signature types by argument name for kernel ``fn``: activations and chunk states in
    ``act``, everything else float32 (gla's scores ``A`` in ``act`` when kept, as the host
    allocates them), sizes int32."""
    types = {n: f"*{act}" for n in ACTIVATIONS}
    for n in ("beta", "gc", "span", "g", "gk", "Ai", "A", "dA", "h0", "ht", "dht", "dh0", "dG", "dG_in", "x", "P",
              "dbeta", "dg"):
        types[n] = "*fp32"
    if d.WY_INPUT_DTYPE_DOTS:
        types["Ai"] = f"*{act}"
    if g.KEEP_A and g.WHOLE_CHUNK and fn is not None and getattr(fn, "fn", fn).__module__ == g.__name__:
        types["A"] = f"*{act}"
    types["tickets"] = "*i32"  # split-K and per-chunk tickets
    types.update(inv_freq="*fp32", pos_ptr="*i64", valid="*u8", part="*fp32", part_ml="*fp32", cap="i32",
                 scale_log2="fp32")
    types.update(T="i32", NT="i32", B="i32", C0="i32", C1="i32", scale="fp32", s_in="*fp32", s_out="*fp32", eps="fp32",
                 **{n: "i32" for n in ("sp_b", "sa_b", "sb_b", "sg_b", "sg_h", "H", "C")},
                 **{f"s{n}_{d}": "i32" for n in ("q", "k", "v", "beta") for d in ("b", "h")})
    if fn is sk._skinny_kernel:  # the decode GEMMs: rows of activations, the norm weight in their dtype
        types.update({n: f"*{act}" for n in ("x", "w", "out", "res", "xg", "gamma")},
                     ss_in="*fp32", ss_out="*fp32", eps_in="fp32",
                     **{n: "i32" for n in ("M", "N", "K", "HALF", "sxm", "swn", "so_s", "so_m", "T_in", "N_in", "srm",
                                           "sxg")})
    return types


def table(launch: dict, name: str, default_stages: int) -> tuple[int, int, int | None]:
    """``(num_warps, num_stages, maxnreg)`` from a kernel module's launch table (``tiles.launch``
    rules: ``default_stages`` is 1 for float32, and then for every kernel, the entry's
    ``num_warps_fp32`` where it has one, and no register cap; ``maxnreg`` None: no cap)."""
    cfg = launch[name]
    if default_stages == 1:
        return cfg.get("num_warps_fp32", cfg["num_warps"]), 1, None
    return cfg["num_warps"], cfg["num_stages"] or default_stages, cfg.get("maxnreg")


def jobs(act: str, K: int = 128, V: int = 128, H: int = 16):
    """(name, kernel, constexprs, num_warps, num_stages, maxnreg) as the host code launches them;
    ``maxnreg`` is the launch entry's register cap (None: none; bf16 only, as ``tiles.launch``
    applies it; the decode kernels have none)."""
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[act]
    prec = "tf32" if act == "bf16" else "ieee"
    p2 = lambda n: max(16, triton.next_power_of_2(n))  # noqa: E731
    BK, BV = p2(K), p2(V)
    C = dict(H=H, K=K, V=V, BT=64)
    s = 2 if act == "bf16" else 1
    for use_g in (True, False):
        tag = "gated_delta" if use_g else "delta"
        yield (f"{tag}.kkt", d._kkt_kernel, dict(H=H, K=K, BT=64, BK=min(64, BK), USE_G=use_g, DOT_PREC=prec, PAIR_FACTORED=d.PAIR_DECAY_FACTORED,
                                                 CUMSUM=use_g and d.KKT_CUMSUM, SKIP_UPPER=d.SKIP_UPPER_BLOCKS,
                                                 HEADS_FASTEST=d.HEADS_FASTEST), *table(d.LAUNCH, "kkt", s))
        if use_g:  # no gate argument: one compile serves both rules
            yield ("delta.solve_tril", d._solve_tril_kernel,
                   dict(H=H, BT=64, BC=16, MERGE_PREC=d._solve_tril_prec(dtype), DIAG_SUBST=d.SOLVE_TRIL_DIAG_SUBST,
                        SKIP_UPPER=d.SKIP_UPPER_BLOCKS, HEADS_FASTEST=d.HEADS_FASTEST),
                   *table(d.LAUNCH, "solve_tril", s))
        fused = dict(H=H, K=K, BT=64, BK=min(64, BK), BC=16, USE_G=use_g, DOT_PREC=prec,
                     PAIR_FACTORED=d.PAIR_DECAY_FACTORED, CUMSUM=use_g and d.KKT_CUMSUM, SKIP_UPPER=d.SKIP_UPPER_BLOCKS,
                     MERGE_PREC=d._solve_tril_prec(dtype), DIAG_SUBST=d.SOLVE_TRIL_DIAG_SUBST, HEADS_FASTEST=d.HEADS_FASTEST)
        yield (f"{tag}.kkt_solve", d._kkt_solve_kernel, fused, *table(d.LAUNCH, "kkt_solve", s))
        lowp = d._lowp(torch.empty(0, dtype=dtype))
        yield (f"{tag}.wu", d._wu_kernel, dict(C, BK=min(64, BK), BV=min(64, BV), USE_G=use_g, LOWP=lowp, DOT_PREC=prec,
                                                     SKIP_UPPER=d.SKIP_UPPER_BLOCKS, HEADS_FASTEST=d.HEADS_FASTEST),
               *table(d.LAUNCH, "wu", s))
        yield (f"{tag}.fwd_h", d._fwd_h_kernel, dict(C, BK=BK, BV=min(32, BV), USE_G=use_g, USE_H0=True, STORE_HT=True,
                                                     DOT_PREC=prec), *table(d.LAUNCH, "fwd_h_bv32", s))
        # V block 64: 2k .. 16k tokens per sequence in a 64k-token batch (``delta.walk_bv``)
        yield (f"{tag}.fwd_h_bv64", d._fwd_h_kernel, dict(C, BK=BK, BV=min(64, BV), USE_G=use_g, USE_H0=True,
                                                          STORE_HT=True, DOT_PREC=prec), *table(d.LAUNCH, "fwd_h", s))
        yield (f"{tag}.fwd_o", d._fwd_o_kernel, dict(C, BK=min(64, BK), BV=min(128, BV), USE_G=use_g, DOT_PREC=prec, PAIR_FACTORED=d.PAIR_DECAY_FACTORED,
                                                     HEADS_FASTEST=d.HEADS_FASTEST, STORE_P=d.KEEP_P),
               *table(d.LAUNCH, "fwd_o", s))
        yield (f"{tag}.bwd_dv_local", d._bwd_dv_local_kernel, dict(C, BK=min(64, BK), BV=min(128, BV), USE_G=use_g,
                                                                   DOT_PREC=prec, PAIR_FACTORED=d.PAIR_DECAY_FACTORED, HEADS_FASTEST=d.HEADS_FASTEST,
                                                                   FROM_P=d.KEEP_P),
               *table(d.LAUNCH, "bwd_dv_local", s))
        dh_gated = use_g or d.UNGATED_DH_ZERO_GATE  # the ungated rule runs it on a zero gate
        # the reverse walk's launches: V block 32 (32k) and 64 (2k .. 16k: the larger shared memory)
        for job, bv in (("bwd_dh", 32), ("bwd_dh_bv64", 64)):
            yield (f"{tag}.{job}", d._bwd_dh_kernel, dict(C, BK=BK, BV=min(bv, BV), USE_G=dh_gated, USE_DHT=True,
                                                          STORE_DH0=True, DOT_PREC=prec), *table(d.LAUNCH, "bwd_dh", s))
        shared = dict(C, USE_G=use_g, DOT_PREC=prec, PAIR_FACTORED=d.PAIR_DECAY_FACTORED, HEADS_FASTEST=d.HEADS_FASTEST)
        wy_flags = dict(LOWP=lowp, ROWSUMS_COMBINED=d.WY_BWD_ROWSUMS_COMBINED, SKIP_UPPER=d.SKIP_UPPER_BLOCKS)
        dqkwg_cx = dict(shared, BK=min(d.DQKWG_BK, BK), BV=min(d.DQKWG_BV, BV), DG_FROM_ROWS=d.DQKWG_DG_FROM_ROWS,
                        DS_UNMASKED=d.DQKWG_DS_UNMASKED)
        dqkwg_launch = table(d.LAUNCH, ("bwd_dqkwg_gated" if use_g else "bwd_dqkwg") + ("_bv32" if d.DQKWG_BV == 32 else ""), s)
        nk = triton.cdiv(K, dqkwg_cx["BK"])
        yield (f"{tag}.bwd_dqkwg", d._bwd_dqkwg_kernel, dqkwg_cx, *dqkwg_launch)
        yield (f"{tag}.wy_bwd", d._wy_bwd_kernel, dict(shared, BK=min(32, BK), BV=min(32, BV), NK_G=nk, **wy_flags),
               *table(d.LAUNCH, "wy_bwd_gated" if use_g else "wy_bwd", s))
    for use_g in (True, False):
        tag = "simple_gla" if use_g else "linear_attn"
        yield (f"{tag}.fwd_h", sd._fwd_h_kernel, dict(C, BK=min(64, BK), BV=min(32, BV), USE_G=use_g, USE_H0=True,
                                                      STORE_HT=True, DOT_PREC=prec), *table(sd.LAUNCH, "walk", s))
        yield (f"{tag}.fwd_o", sd._fwd_o_kernel, dict(C, BK=min(64, BK), BV=min(128, BV), USE_G=use_g, DOT_PREC=prec),
               *table(sd.LAUNCH, "fwd_o", s))
        yield (f"{tag}.bwd_dh", sd._bwd_dh_kernel, dict(C, BK=min(64, BK), BV=min(32, BV), USE_G=use_g, USE_DHT=True,
                                                        STORE_DH0=True, DOT_PREC=prec), *table(sd.LAUNCH, "walk", s))
        yield (f"{tag}.bwd_dqkv", sd._bwd_dqkv_kernel, dict(C, BK=BK, BV=min(64, BV), USE_G=use_g, DOT_PREC=prec),
               *table(sd.LAUNCH, "bwd_dqkv", s))
    span_max, units = g.chunk_paths()
    wc_lowp = g._whole_chunk_lowp(dtype)
    keep_a = g.KEEP_A and g.WHOLE_CHUNK
    yield ("gla.cumsum", g._cumsum_kernel, dict(H=H, K=K, BT=64, BK=BK), *table(g.LAUNCH, "cumsum", s))
    # the walks over all of V (gla.WALK_FULL_V) and, switched off, at long sequences' V block 32
    walks = ((128, "", "walk_bv128"), (32, "_bv32", "walk_bv32"))
    for bv, tag, entry in walks:
        yield (f"gla.fwd_h{tag}", g._fwd_h_kernel, dict(C, BK=min(64, BK), BV=min(bv, BV), USE_H0=True, STORE_HT=True,
                                                       DOT_PREC=prec), *table(g.LAUNCH, entry, s))
    ia_lowp, ia_lowp_diag = g._intra_a_lowp(dtype)
    yield ("gla.intra_a", g._intra_a_kernel, dict(H=H, K=K, BT=64, BC=16, NC=4, BK=BK, BKD=min(g.BKD, BK),
                                                  DOT_PREC=prec, SPAN_MAX=g.SPAN_MAX,
                                                  LOWP=ia_lowp, LOWP_DIAG=ia_lowp_diag, SPAN_MAX_CHUNK=span_max,
                                                  UNITS=units, CHECK_FIRST=g.STEEP_CHECK_FIRST),
           *table(g.LAUNCH, "intra_a", s))
    yield ("gla.fwd_o", g._fwd_o_kernel, dict(C, BK=min(g.FWD_O_BK, BK), BV=min(128, BV), DOT_PREC=prec, SPAN_MAX_CHUNK=span_max,
                                              LOWP=wc_lowp, STORE_A=keep_a, SKIP_UPPER=g.SKIP_UPPER_BLOCKS), *table(g.LAUNCH, "fwd_o", s))
    for bv, tag, entry in walks:
        yield (f"gla.bwd_dh{tag}", g._bwd_dh_kernel, dict(C, BK=min(64, BK), BV=min(bv, BV), USE_DHT=True,
                                                         STORE_DH0=True, DOT_PREC=prec), *table(g.LAUNCH, entry, s))
    yield ("gla.bwd_chunk", g._bwd_chunk_kernel, dict(C, BK=min(g.BWD_CHUNK_BK, BK), BV=min(64, BV), DOT_PREC=prec, SPAN_MAX_CHUNK=span_max,
                                                      LOWP=wc_lowp, WITH_DV=not g.BWD_DV_SEPARATE,
                                                      READ_A=keep_a, ONE_TOTAL=g.BWD_CHUNK_ONE_TOTAL, SKIP_UPPER=g.SKIP_UPPER_BLOCKS),
           *table(g.LAUNCH, "bwd_chunk", s))
    if g.BWD_DV_SEPARATE:
        yield ("gla.bwd_dv", g._bwd_dv_kernel, dict(C, BK=min(64, BK), BV=min(128, BV), DOT_PREC=prec,
                                                    SPAN_MAX_CHUNK=span_max, LOWP=wc_lowp, READ_A=keep_a, SKIP_UPPER=g.SKIP_UPPER_BLOCKS),
               *table(g.LAUNCH, "bwd_dv", s))
    yield ("gla.bwd_sub", g._bwd_sub_kernel, dict(C, BC=16, NC=4, BK=min(g.BWD_SUB_BK, BK), BV=min(64, BV), DOT_PREC=prec,
                                                  SPAN_MAX=g.SPAN_MAX, SPAN_MAX_CHUNK=span_max, UNITS=units,
                                                  CHECK_FIRST=g.STEEP_CHECK_FIRST),
           *table(g.LAUNCH, "bwd_sub", s))
    yield ("gla.rev_cumsum", g._rev_cumsum_kernel, dict(H=H, K=K, BT=64, BK=min(64, BK), NP=4, SPAN_MAX_CHUNK=span_max,
                                                        UNITS=units, CHECK_FIRST=g.STEEP_CHECK_FIRST),
           *table(g.LAUNCH, "rev_cumsum", s))
    # the decode step (blocks.kernels.step) of each family: gate none / scalar / per key, delta or not
    for tag, gate, delta in (("linear_attn", st.NO_GATE, False), ("simple_gla", st.SCALAR_GATE, False),
                             ("gla", st.KEY_GATE, False), ("delta_rule", st.NO_GATE, True),
                             ("gated_delta_rule", st.SCALAR_GATE, True)):
        # a [B, H] gate or beta has head stride 1, which the JIT specialises as a constant
        unit = dict(sbeta_h=1, **({"sg_h": 1} if gate == st.SCALAR_GATE else {}))
        yield (f"decode_step.{tag}", st._step_kernel, dict(K=K, V=V, BK=BK, BV=4096 // BK, GATE=gate, DELTA=delta,
                                                          HAS_STATE=True, **unit), 4, 1, None)
    # the decode mixer of the benchmark's decode models (conv 4 for the delta rules, none for simple_gla)
    for tag, delta, gated, conv in (("gated_deltanet", True, True, 4), ("deltanet", True, False, 4),
                                    ("simple_gla", False, True, 0)):
        for nc in (1, 2, 4):  # the whole state at once, in two or four slices of values (decode_mixer.CHUNKS)
            yield (f"decode_mixer{'' if nc == 1 else f'_chunks{nc}'}.{tag}", dm._mixer_kernel,
                   dict(K=K, V=V, BK=BK, BV=BV, NC=nc, TRIGGER=dm._TRIGGERS[dm.LAUNCH_DEPENDENTS], PDL=dm.PDL_WAIT_FIRST,
                        EARLY=dm._state_before_wait(), OLD_O=dm._old_state_output(delta),
                        LATE_CACHE=dm.CACHE_SHIFT_LAST,
                        W=conv, DELTA=delta, GATED=gated, NORM=True, OUT_GATE=True, WRITE_CACHE=conv > 0,
                        DTYPE=dm._DTYPES[dtype]), dm.NUM_WARPS, 1, None)
    # the decode layer's GEMMs at their CONFIGS, as ``archsearch.decode_layer`` calls them on the
    # benchmark model's weights (``decode_gemm.decode_shapes``): in_proj and w1|w3 on a norm's rows,
    # o_proj and w2 with the residual and the next norm in their last split
    from decode_gemm import decode_shapes

    shapes = decode_shapes()
    for role, case, swiglu, residual in (("in_proj", "in_proj", False, False), ("swiglu", "w13", True, False),
                                         ("o_proj", "o_proj", False, True), ("w2", "w2", False, True)):
        k_per, splits = sk._split(shapes[case][1], sk._config(role, dtype))
        constexprs, launch = sk.kernel_constexprs(role, dtype, k_per, swiglu=swiglu, tiles_in=0 if residual else 64,
                                                  residual=residual, splits=splits, gamma=residual,
                                                  balanced={"in_proj": sk.BALANCED_LINEAR,
                                                            "swiglu": sk.BALANCED_SWIGLU}.get(role, False))
        yield (f"skinny.{role}", sk._skinny_kernel, dict(constexprs, PDL=sk.PDL),
               launch["num_warps"], launch["num_stages"], None)  # as skinny._launch
    # the softmax layers' decode attention (16 heads of 128; one program per kv head, or split)
    for tag, G in (("mha", 1), ("gqa4", 4)):
        for splits in (1, 4):
            yield (f"decode_attention.{tag}{'' if splits == 1 else f'_split{splits}'}", da._attend_kernel,
                   dict(H=H, HKV=H // G, G=G, D=K, HALF=K // 2, GP=16, BH=p2(K // 2), BD=BK, BN=da.ATTEND_BLOCK_N,
                        SPLITS=splits, OUT_GATE=G > 1, DOT_PREC=prec, FLAGS=da.ATTEND_MASK == "flags"),
                   da.ATTEND_WARPS, da.ATTEND_STAGES, None)


def divisibility_hints(fn, sig: dict[str, str]) -> set[str]:
    """The arguments the JIT would specialise as divisible by 16 in the benchmark's launches: every
    pointer (torch tensors are 16-byte aligned; without this hint no load is vectorised or
    software-pipelined, and registers, spills and async copies come out unlike the GPU's: gla
    bwd_sub 840 B of spills instead of 80, delta bwd_dqkwg 255 registers instead of the 162 Nsight
    Compute read on the H200), and every integer the kernel does not list in ``do_not_specialize``
    (the chunk kernels list their lengths; the decode kernels' sizes and strides, e.g. the rows of
    the 8224-wide projection and 16 heads, are all multiples of 16)."""
    return {n for n in fn.arg_names if sig[n].startswith("*") or (sig[n] == "i32" and n not in fn.do_not_specialize)}


def compile_one(fn, types: dict, constexprs: dict, num_warps: int, num_stages: int, arch: int,
                maxnreg: int | None = None):
    names = fn.arg_names
    # a constexpr parameter with a default (one a new switch adds as ``NAME: tl.constexpr = False``) takes it
    # unless given, as a launch that leaves it out does: callers list only the constexprs they set
    defaults = {p.name: p.default for p in getattr(fn, "params", ()) if p.is_constexpr and p.has_default}
    constexprs = {**{n: v for n, v in defaults.items() if n not in constexprs}, **constexprs}
    sig = {n: ("constexpr" if n in constexprs else types[n]) for n in names}
    hinted = divisibility_hints(fn, sig)
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if n in hinted}
    source = ASTSource
    if getattr(fn, "is_gluon", lambda: False)():  # a Gluon kernel (benchmarks/gluon_probe.py)
        from triton.experimental.gluon._runtime import GluonASTSource as source
    src = source(fn, sig, constexprs={(names.index(k),): v for k, v in constexprs.items()}, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32),
                          options={"num_warps": num_warps, "num_stages": num_stages,
                                   **({"maxnreg": maxnreg} if maxnreg else {})})


def _cuobjdump(kernel, flag: str, tool_name: str = "cuobjdump") -> str:
    """The bundled ``cuobjdump <flag>`` (or ``tool_name``, e.g. ``nvdisasm``) of the kernel's cubin."""
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / tool_name
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        return subprocess.run([str(tool), flag, f.name], capture_output=True, text=True, check=True).stdout


# Per-SM limits of sm_90 (H100 / H200): 64K 32-bit registers, 228 KB of shared memory (each
# resident program also reserves 1 KB), 64 warps, 32 programs; registers are given out per warp in
# blocks of 256 (per thread: rounded up to a multiple of 8).
SM90 = dict(regs=65536, smem=233472, smem_reserved=1024, warps=64, programs=32)


def programs_per_sm(regs: int, warps: int, smem: int, sm: dict = SM90) -> tuple[int, str]:
    """``(programs of one kernel resident per SM, what limits them)``: ``"regs"``, ``"smem"``,
    ``"warps"`` or ``"programs"``. A register cap pays only where it raises this number (and
    spills little): ``docs/benchmarks/register_caps.md``."""
    per_warp = -(-regs * 32 // 256) * 256
    limits = {"regs": sm["regs"] // (per_warp * warps), "smem": sm["smem"] // (smem + sm["smem_reserved"]),
              "warps": sm["warps"] // warps, "programs": sm["programs"]}
    limiter = min(limits, key=limits.get)
    return limits[limiter], limiter


def cap_for_programs(programs: int, warps: int, sm: dict = SM90) -> int:
    """The largest register cap per thread (``maxnreg``, a multiple of 8) at which ``programs``
    programs of ``warps`` warps fit an SM by registers (``programs_per_sm``'s per-warp blocks of
    256). Below ptxas's floor (24) no cap fits them: the caller checks."""
    per_warp = sm["regs"] // (programs * warps) // 256 * 256
    return per_warp // 32 // 8 * 8


def failure_reason(exc: Exception) -> str:
    """One line for a failed compile: ptxas's fatal line where there is one (e.g. an instruction that
    needs more registers than a cap), else the exception's first line."""
    lines = str(exc).splitlines() or [type(exc).__name__]
    return next((ln for ln in lines if "ptxas fatal" in ln), lines[0]).strip()


def one_more_program(runs, arch: int) -> int:
    """``--one-more-program``: per kernel whose programs per SM its registers limit, compiled again at
    the cap that fits one program more (where shared memory and warps allow it): the spills that
    cap costs. A cap that spills little is a launch entry to time (``train_ab.py
    --variants="-;LAUNCH.<entry>.maxnreg=N"``); ``docs/benchmarks/register_caps.md``. Returns how many
    kernels did not compile as launched (a ``FAILED`` row each, as the resources table's); a kernel
    that does not compile at the cap is a row of the table, not a failure."""
    print("| kernel | dtype | warps | stages | regs / programs per SM | cap | regs / stack (B/thread) at the cap | "
          "programs per SM at the cap | SASS instr |\n|---|---|---|---|---|---|---|---|---|")
    failures = 0
    for act, (name, fn, cx, warps, stages, cap) in runs:
        try:
            kernel = compile_one(fn, arg_types(act, fn), cx, warps, stages, arch, cap)
        except Exception as exc:  # noqa: BLE001 - report every kernel, then fail
            failures += 1
            print(f"| {name} | {act} | {warps} | {stages} | FAILED: {failure_reason(exc)[:150]} |||||", flush=True)
            continue
        regs, smem = int(resources(kernel).get("REG", 255)), kernel.metadata.shared
        programs, limit = programs_per_sm(regs, warps, smem)
        more = cap_for_programs(programs + 1, warps)
        if limit != "regs" or more < 24 or programs_per_sm(more, warps, smem)[0] <= programs:
            continue  # not registers, or one more program does not fit for another reason
        try:
            capped = compile_one(fn, arg_types(act, fn), cx, warps, stages, arch, more)
        except Exception as exc:  # noqa: BLE001 - e.g. ptxas: an instruction needs more registers than the cap
            print(f"| {name} | {act} | {warps} | {stages} | {regs} / {programs} | {more} | does not compile: "
                  f"{failure_reason(exc)[:120]} | - | - |", flush=True)
            continue
        res = resources(capped)
        print(f"| {name} | {act} | {warps} | {stages} | {regs} / {programs} | {more} | {res.get('REG')} / "
              f"{res.get('STACK')} | {programs_per_sm(int(res.get('REG', more)), warps, smem)[0]} | "
              f"{sass_counts(kernel)[0]} -> {sass_counts(capped)[0]} |", flush=True)
    return failures


def resources(kernel) -> dict[str, str]:
    """``{"REG": .., "STACK": .., "SHARED": ..}`` from ``cuobjdump -res-usage`` of the cubin."""
    fields = {}
    for line in _cuobjdump(kernel, "-res-usage").splitlines():
        if "REG:" in line:
            for item in line.replace(",", " ").split():
                if ":" in item:
                    key, _, val = item.partition(":")
                    fields[key] = val
    return fields


# one SASS instruction: its address (4 hex digits, more past 64 KB of code) and its opcode
_SASS_OP = re.compile(r"/\*(?P<addr>[0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?(?P<op>[A-Z][A-Z0-9_.]*)")


def sass_by_line(kernel) -> dict[tuple[str, int], collections.Counter]:
    """SASS opcodes (without modifiers) per source line ``(file name, line)``, from ``nvdisasm``'s
    line info (Triton compiles with it): where a kernel's instructions come from, e.g. which part of
    an epilogue is worth rewriting. Counted statically, like ``sass_counts``."""
    by_line: dict[tuple[str, int], collections.Counter] = collections.defaultdict(collections.Counter)
    where = ("?", 0)
    for text in _cuobjdump(kernel, "-g", "nvdisasm").splitlines():
        loc = re.search(r'//## File "([^"]+)", line (\d+)', text)
        if loc:
            where = (Path(loc.group(1)).name, int(loc.group(2)))
            continue
        op = _SASS_OP.search(text)
        if op:
            by_line[where][op.group("op").split(".")[0]] += 1
    return by_line


def print_lines(kernel, top: int) -> None:
    """The ``top`` source lines with the most SASS instructions, as markdown rows under the kernel."""
    counts = sorted(sass_by_line(kernel).items(), key=lambda kv: -sum(kv[1].values()))[:top]
    for (file, line), ops in counts:
        common = ", ".join(f"{op} {n}" for op, n in ops.most_common(4))
        print(f"|  | {file}:{line} | {sum(ops.values())} instructions: {common} ||||||||")


_SASS_BRANCH = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?BRA\s+0x([0-9a-f]+)")


def loop_bodies(kernel) -> list[tuple[int, collections.Counter]]:
    """``(instructions, opcodes)`` of each loop of the kernel's SASS, in address order: the
    instructions from a backward branch's target to the branch. What one iteration of a walk or a
    K loop issues, which the whole kernel's static count hides under prologues, epilogues and both
    sides of runtime branches (the count that found gla's exponential fix-ups: a walk step's 444
    instructions, 54 of them the fix-ups)."""
    return sass_loops(_cuobjdump(kernel, "-sass"))


def sass_loops(sass: str) -> list[tuple[int, collections.Counter]]:
    """``loop_bodies`` of SASS text. A backward branch that crosses a loop (its target inside the
    loop's body, itself past the loop's end) is not a loop: ptxas places the retry paths of
    barrier waits (TMA, ``wgmma``, mbarriers) after the kernel's body and branches from them back
    into it, and counting those would add spans of two loops' worth of code."""
    ops = [(int(m.group("addr"), 16), m.group("op").split(".")[0]) for m in _SASS_OP.finditer(sass)]
    spans = sorted((target, at) for at, target in
                   ((int(m.group(1), 16), int(m.group(2), 16)) for m in _SASS_BRANCH.finditer(sass))
                   if target < at)  # a branch to itself is the trap loop after EXIT, not a loop
    loops = [(lo, hi) for lo, hi in spans
             if not any(lo2 < lo <= hi2 < hi for lo2, hi2 in spans)]  # crosses an earlier-starting loop
    return [(sum(body.values()), body) for body in
            (collections.Counter(op for addr, op in ops if lo <= addr <= hi) for lo, hi in loops)]


def print_loops(kernel) -> None:
    """Each loop body's instruction count and commonest opcodes, as markdown rows under the kernel."""
    for i, (n, ops) in enumerate(loop_bodies(kernel)):
        common = ", ".join(f"{op} {c}" for op, c in ops.most_common(6))
        print(f"|  | loop {i} | {n} instructions per iteration: {common} ||||||||")


def sass_counts(kernel) -> tuple[int, int, int]:
    """``(instructions, shuffles, barriers)`` in the kernel's SASS, counted statically (a loop body
    once): cross-thread reductions show up as ``SHFL`` and, across warps, ``BAR``; compare variants
    of one kernel with it, not run times."""
    ops = [m.group("op") for m in _SASS_OP.finditer(_cuobjdump(kernel, "-sass"))]
    return len(ops), sum(o.startswith("SHFL") for o in ops), sum(o.startswith("BAR") for o in ops)


def pipelining(kernel) -> tuple[int, str]:
    """``(async copies, values carried by each loop)`` from the kernel's TTGIR: whether Triton's
    software pipeliner took the kernel's loops. A loop that carries only its accumulator (``1``)
    with no async copies was not pipelined: each iteration waits for its own loads."""
    ttg = kernel.asm["ttgir"]
    loops = re.findall(r"scf\.for .*?iter_args\((.*?)\) ->", ttg)
    return len(re.findall("async_copy_global_to_local", ttg)), "/".join(str(len(x.split(","))) for x in loops) or "-"


def without_gdc(constexprs: dict) -> dict:
    """A job's constexprs as the host code launches the kernel on a GPU without grid dependency control
    (``tiles.pdl_launch``, ``tiles.arch_has_gdc``): ``PDL`` off and the decode mixer's ``TRIGGER`` 0."""
    return {**constexprs, **{name: off for name, off in (("PDL", False), ("TRIGGER", 0)) if name in constexprs}}


def attempts_to_fit(shared_at, stages: int, loop_blocks: dict[str, int], limit: int) -> list[tuple[dict, int]]:
    """``(settings, shared bytes)`` in the order ``blocks.kernels.fitted`` tries them
    (``fitted.launch_attempts``: the stage count from ``stages`` down, then each loop block halved),
    ending at the first whose ``shared_at(settings)`` is within ``limit`` bytes, or at the last."""
    steps = []
    for settings in fitted.launch_attempts(stages, loop_blocks):
        steps.append((settings, shared_at(settings)))
        if steps[-1][1] <= limit:
            break
    return steps


def _blocks_suffix(settings: dict) -> str:
    """``, BV 32`` for each loop block in the settings, else nothing."""
    return "".join(f", {name} {block}" for name, block in settings.items() if name != "num_stages")


def settings_label(settings: dict) -> str:
    """``3`` (stages), or ``1, BV 32`` where a loop block is in the settings."""
    return f"{settings['num_stages']}{_blocks_suffix(settings)}"


def fits_label(settings: dict) -> str:
    """``2 stages``, ``1 stage, BV 32``."""
    stages = settings["num_stages"]
    return f"{stages} stage{'s' if stages > 1 else ''}{_blocks_suffix(settings)}"


def print_fit(runs, limit_kb: int, arch: int) -> int:
    """``--fit-shared``: per kernel whose launch needs more than ``limit_kb`` KB of shared memory, the
    bytes at each setting ``blocks.kernels.fitted`` would try; returns how many never fit."""
    print(f"| kernel | dtype | warps | shared (B) by stages (, loop block), down to {limit_kb} KB | fits at |\n"
          "|---|---|---|---|---|")
    misfits = 0
    for act, (name, fn, cx, warps, stages, cap) in runs:
        def shared_at(settings):
            blocks = {k: v for k, v in settings.items() if k != "num_stages"}
            return compile_one(fn, arg_types(act, fn), {**cx, **blocks}, warps, settings["num_stages"], arch,
                               cap).metadata.shared

        loop_blocks = {n: cx[n] for n in getattr(fn, "loop_blocks", ()) if n in cx}
        steps = attempts_to_fit(shared_at, stages or 3, loop_blocks, limit_kb * 1024)
        if len(steps) == 1 and steps[0][1] <= limit_kb * 1024:
            continue
        fits = steps[-1][1] <= limit_kb * 1024
        misfits += not fits
        print(f"| {name} | {act} | {warps} | {' / '.join(f'{settings_label(st)}: {b}' for st, b in steps)} | "
              f"{fits_label(steps[-1][0]) if fits else 'never (that pass runs the PyTorch form)'} |", flush=True)
    return misfits


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, default=90, help="compute capability without the dot (90 = H100/H200)")
    ap.add_argument("--dtype", choices=("bf16", "fp32", "both"), default="bf16")
    ap.add_argument("--kernels", default="", help="comma-separated name fragments to keep (default all)")
    ap.add_argument("--warps", default="", help="comma list of warp counts to compile each kernel at "
                    "instead of the host code's (e.g. 4,8,16: where do the spills go?)")
    ap.add_argument("--stages", default="", help="comma list of pipelining stage counts to compile each kernel "
                    "at instead of the host code's (e.g. 1,2,3: its shared memory per stage, what fits beside it)")
    ap.add_argument("--set", default="", help="module switches to give other values first, as the launch "
                    "sweep's --set (e.g. UNGATED_DH_ZERO_GATE=False: compile the kernels that path runs)")
    ap.add_argument("--maxnreg", default="", help="comma list of register caps per thread to compile each "
                    "kernel at (ptxas .maxnreg; 0 = none); default: each launch table's own (none unless set)")
    ap.add_argument("--lines", type=int, default=0, metavar="N", help="also print, under each kernel, the N source "
                    "lines with the most SASS instructions (nvdisasm line info)")
    ap.add_argument("--loops", action="store_true", help="also print, under each kernel, the SASS instructions of "
                    "each loop's body (one iteration) and its commonest opcodes")
    ap.add_argument("--fit-shared", type=int, default=0, metavar="KB", help="instead of the resources table: the "
                    "kernels whose launch needs more than KB KB of shared memory per program, compiled at fewer "
                    "stages until they fit (what blocks.kernels.fitted does on such a GPU; 99 = consumer GPUs, "
                    "163 = A100); exits 1 if one never fits (there the op runs its PyTorch form: blocks.kernels.fallback)")
    ap.add_argument("--one-more-program", action="store_true", help="instead of the resources table: each "
                    "kernel that its registers limit, compiled at the register cap that fits one more program "
                    "per SM, with the spills that costs (candidates for LAUNCH.<entry>.maxnreg)")
    opts = ap.parse_args()
    if opts.fit_shared < 0:
        ap.error(f"--fit-shared: must be >= 0 KB, got {opts.fit_shared}")
    if opts.lines < 0:
        ap.error(f"--lines: must be >= 0, got {opts.lines}")
    try:
        apply_sets(opts.set)
    except ValueError as exc:
        ap.error(str(exc))
    warp_counts = comma_ints(opts.warps)
    if warp_counts is None:
        ap.error(f"--warps: a comma list of integers, got {opts.warps!r}")
    stage_counts = comma_ints(opts.stages)
    if stage_counts is None or any(n < 1 for n in stage_counts):
        ap.error(f"--stages: a comma list of positive integers, got {opts.stages!r}")
    reg_caps = comma_ints(opts.maxnreg)
    if reg_caps is None:
        ap.error(f"--maxnreg: a comma list of integers, got {opts.maxnreg!r}")
    keep = [k for k in opts.kernels.split(",") if k]
    dtypes = ("bf16", "fp32") if opts.dtype == "both" else (opts.dtype,)
    launched = (lambda cx: cx) if tiles.arch_has_gdc(opts.arch // 10) else without_gdc
    runs = ((a, (name, fn, launched(cx), w, st, cap or None)) for a in dtypes
            for (name, fn, cx, host_w, host_st, host_cap) in jobs(a)
            for w in (warp_counts or [host_w]) for st in (stage_counts or [host_st]) for cap in (reg_caps or [host_cap]))
    runs = ((act, job) for act, job in runs if not keep or any(k in job[0] for k in keep))
    if opts.fit_shared:
        return 1 if print_fit(runs, opts.fit_shared, opts.arch) else 0
    if opts.one_more_program:
        return 1 if one_more_program(runs, opts.arch) else 0
    failures = 0
    print("| kernel | dtype | warps | stages | regs (cap) | stack (B/thread) | shared (B) | programs / SM (limit) | "
          "async copies | loop-carried | SASS instr / SHFL / BAR | compile s |\n|---|---|---|---|---|---|---|---|---|---|---|---|")
    for act, (name, fn, cx, warps, stages, cap) in runs:
        t0 = time.time()
        try:
            kernel = compile_one(fn, arg_types(act, fn), cx, warps, stages, opts.arch, cap)
            res = resources(kernel)
            copies, carried = pipelining(kernel)
            sass = " / ".join(map(str, sass_counts(kernel)))
            occupancy = "-"  # the per-SM limits below are sm_90's
            if opts.arch == 90:
                occupancy = "{} ({})".format(*programs_per_sm(int(res.get("REG", 255)), warps, kernel.metadata.shared))
            print(f"| {name} | {act} | {warps} | {stages} | {res.get('REG')}{f' ({cap})' if cap else ''} | {res.get('STACK')} | "
                  f"{kernel.metadata.shared} | {occupancy} | {copies} | {carried} | {sass} | "
                  f"{time.time() - t0:.0f} |", flush=True)
            if opts.lines:
                print_lines(kernel, opts.lines)
            if opts.loops:
                print_loops(kernel)
        except Exception as exc:  # noqa: BLE001 - report every kernel, then fail
            failures += 1
            print(f"| {name} | {act} | {warps} | {stages} | FAILED: {type(exc).__name__}: {failure_reason(exc)[:150]} |||||||",
                  flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
