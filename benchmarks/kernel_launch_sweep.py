"""Which launch settings make each chunk kernel fastest on this GPU? Time every family's forward +
backward (bf16, 16 heads of dim 128, 64k tokens per batch) with ONE kernel's warps or pipelining
stages changed at a time, against the settings in the modules' ``LAUNCH`` tables.

    python benchmarks/kernel_launch_sweep.py [--families gla,delta_rule] [--lengths 2048,32768]
                                             [--out docs/benchmarks] [--workers 12] [--only switch]

Prints a markdown table (ms per fwd+bwd step, ratio to the current settings; < 1 is faster) and
writes ``kernel_launch_sweep.{json,md}`` to ``--out``. Every variant is first compiled in a pool of
worker processes at a tiny shape (Triton's on-disk cache then serves the timing process): compiling
80 variants one after another would take most of a GPU session. Timing runs in this process only,
one variant at a time, so the GPU is otherwise idle. The sequential chunk walks' V block
(each module's ``walk_bv``) is swept too, as ``walk_bv``; an entry with a register cap
(``maxnreg``) is also timed without it, and ``--caps 128,104`` times every entry at those caps.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project root, for blocks

import torch  # noqa: E402

from gpu_common import (HEAD_DIM, HEADS, TOKENS, apply_sets, comma_ints, cuda_time, linear_families,  # noqa: E402
                        fwd_bwd, kernel_settings, op_module, positional, switches_line, train_inputs)

from blocks.kernels import kernel_module, other_switch_values  # noqa: E402

WARPS = [4, 8, 16]  # --warps (e.g. 2,4,8,16: 2 warps for the small-tile kernels such as solve_tril)
CAPS: list[int] = []  # --caps: register caps per thread (ptxas maxnreg) to try on every entry
STAGES = (1, 2, 3)
WALK_BV = (16, 32, 64)


ONLY: set[str] = set()  # --only: entries to sweep (empty: all)
SET_ENV = "ARCHSEARCH_SWEEP_SET"  # --set, passed to the compile workers and timing children


def variants(family: str) -> list[tuple[str, str, int]]:
    """``(entry, setting, value)`` for every launch-table entry of the family's module: each other
    warp count, each other stage count; then each walk V block; then the other value of each of
    the module's ``SWITCHES`` (alternative kernels, as ``("switch", NAME, value)``). With ``ONLY``
    set, just those entries."""
    out = _all_variants(family)
    return [v for v in out if v[0] in ONLY or (v[0] == "switch" and f"switch:{v[1]}" in ONLY)] if ONLY else out


def valid_cap(c: int) -> bool:
    """Whether ptxas takes ``c`` as a register cap per thread (``maxnreg``): a multiple of 8 from 24
    to 255."""
    return 24 <= c <= 255 and c % 8 == 0


def _all_variants(family: str) -> list[tuple[str, str, int]]:
    mod = kernel_module(family)
    out = []
    for entry, cfg in mod.LAUNCH.items():
        out += [(entry, "num_warps", w) for w in WARPS if w != cfg["num_warps"]]
        out += [(entry, "num_stages", s) for s in STAGES if s != cfg["num_stages"]]
        if cfg.get("maxnreg"):  # the entry without its register cap
            out.append((entry, "maxnreg", None))
        out += [(entry, "maxnreg", c) for c in CAPS if c != cfg.get("maxnreg")]
    out += [("walk_bv", "BV", bv) for bv in WALK_BV]
    out += [("switch", name, v) for name, v in other_switch_values(mod).items()]
    return out


class Applied:
    """Context manager: one variant applied to the module (launch-table entry or walk V block)."""

    def __init__(self, family: str, variant: tuple[str, str, int] | None):
        self.mod, self.variant = kernel_module(family), variant

    def __enter__(self):
        if self.variant is None:
            return self
        entry, setting, value = self.variant
        if entry == "walk_bv":
            self.saved = self.mod.walk_bv
            self.mod.walk_bv = lambda x, chains, V: min(value, max(16, 1 << (V - 1).bit_length()))
        elif entry == "switch":
            self.saved = getattr(self.mod, setting)
            setattr(self.mod, setting, value)
        else:
            self.saved = dict(self.mod.LAUNCH[entry])
            self.mod.LAUNCH[entry][setting] = value
        return self

    def __exit__(self, *exc):
        if self.variant is None:
            return
        entry, setting = self.variant[:2]
        if entry == "walk_bv":
            self.mod.walk_bv = self.saved
        elif entry == "switch":
            setattr(self.mod, setting, self.saved)
        else:
            self.mod.LAUNCH[entry] = self.saved


def step(family: str, T: int, B: int = 0, dtype: torch.dtype = torch.bfloat16, pytorch_form: bool = False,
         device: str = "cuda"):
    """A closure running one fwd+bwd of the family's registered kernel on ``B`` (default
    ``TOKENS // T``) sequences of ``dtype``; ``pytorch_form``: of the op's PyTorch chunk form instead
    (``blocks.ops.<family>.chunk`` inside ``blocks.kernels.disabled()``, what the kernels are measured against)."""
    import blocks.kernels as kernels

    args = train_inputs(family, B or max(1, TOKENS // T), T, HEADS, HEAD_DIM, dtype=dtype, device=device)
    pos = positional(family, args)
    if pytorch_form:
        chunk = op_module(family).chunk

        def call() -> torch.Tensor:
            with kernels.disabled():
                return chunk(*pos)[0]

        return fwd_bwd(call, pos)
    kernel = kernels.get_kernel(family, "chunk")
    return fwd_bwd(lambda: kernel(*pos)[0], pos)


def _compile_one(job: tuple[str, tuple | None, int]) -> str:
    """Compile one variant at 3 chunks (a ragged one included: lengths do not recompile) and the
    timed length's batch ``B`` (the walks' V block follows the number of (batch, head) chains)."""
    family, variant, B = job
    apply_sets(os.environ.get(SET_ENV, ""))
    try:
        with Applied(family, variant):
            step(family, 192, B)()
        torch.cuda.synchronize()
        return ""
    except Exception as exc:  # noqa: BLE001 - reported per variant, the sweep goes on
        return f"{family} {variant}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"


def precompile(jobs: list, workers: int) -> list[str]:
    ctx = mp.get_context("spawn")
    with ctx.Pool(workers) as pool:
        return [e for e in pool.map(_compile_one, jobs, chunksize=1) if e]


def context_usable() -> bool:
    """Does this process's CUDA context still run work (False after an illegal memory access)?"""
    try:
        torch.cuda.synchronize()
        return torch.ones(1, device="cuda").add(1).item() == 2
    except Exception:  # noqa: BLE001 - any CUDA error here means the context is gone
        return False


def sweep_one(family: str, T: int, start: int = 0) -> None:
    """Child mode: time the current settings, the variants from index ``start`` on, the current
    settings again; one JSON line per result on stdout (the parent keeps what came before a crash)."""
    run = step(family, T)

    def emit(**row) -> None:
        print("ROW " + json.dumps(row), flush=True)

    emit(entry="(current)", setting="", value=0, ms=cuda_time(run, budget_s=0.4)[0] * 1e3)
    for index, (entry, setting, value) in enumerate(variants(family)):
        if index < start:
            continue
        emit(index=index, entry=entry, setting=setting, value=value, started=True)  # names a crash's culprit
        try:
            with Applied(family, (entry, setting, value)):
                sec, _ = cuda_time(run, budget_s=0.3)
        except Exception as exc:  # noqa: BLE001 - e.g. out of shared memory at 3 stages
            emit(index=index, entry=entry, setting=setting, value=value,
                 error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
            if not context_usable():
                # an illegal memory access poisons this process's CUDA context: every later
                # variant would fail too (the first sweeps' cascades); the parent starts a new child
                os._exit(3)
            continue
        emit(index=index, entry=entry, setting=setting, value=value, ms=sec * 1e3)
    emit(entry="(current again)", setting="", value=0, ms=cuda_time(run, budget_s=0.4)[0] * 1e3)


def _child(family: str, T: int, start: int, timeout: float) -> tuple[list[dict], str]:
    """Run ``sweep_one`` in a fresh process: ``(rows, error line or "")``."""
    cmd = [sys.executable, __file__, "--child", f"{family}:{T}:{start}", "--only", ",".join(sorted(ONLY)),
           "--warps", ",".join(map(str, WARPS)), "--caps", ",".join(map(str, CAPS)),
           "--set", os.environ.get(SET_ENV, "")]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        out = proc.stdout
        err = "" if proc.returncode == 0 else \
            f"exit {proc.returncode}: " + ((proc.stderr.strip().splitlines() or [""])[-1])[:160]
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err = f"timed out after {timeout:.0f} s"
    return [json.loads(line[4:]) for line in out.splitlines() if line.startswith("ROW ")], err


def sweep(families: list[str], lengths: list[int], log, save=lambda res: None, timeout: float = 600) -> dict:
    """``{family: {T: {base_ms, base_again_ms, variants: [...]}}}``. Each (family, length) is timed in
    child processes: an illegal memory access poisons a CUDA context, so a variant that causes one
    is recorded as crashing and a new child goes on from the next variant. ``save(res)`` after each
    length (partial results survive a time limit)."""
    res: dict = {}
    for family in families:
        res[family] = {}
        n_variants = len(variants(family))
        for T in lengths:
            done: list[dict] = []
            start, errors = 0, []
            while start < n_variants:
                rows, err = _child(family, T, start, timeout)
                done += [r for r in rows if not r.get("started")]
                last = rows[-1] if rows else None
                if not err:
                    break
                errors.append(err)
                if not (last and "index" in last):  # died outside a variant: give up on this length
                    break
                if last.get("started"):  # died inside the variant: that variant is the culprit
                    done.append(dict(last, started=False, error=f"crashed the process ({err})"))
                start = last["index"] + 1  # else it reported its error, then left a poisoned context
            base = next((r["ms"] for r in done if r["entry"] == "(current)"), None)
            again = [r["ms"] for r in done if r["entry"] == "(current again)"]
            found = [dict(r, ratio=r["ms"] / base) if base and "ms" in r else r for r in done
                     if not r["entry"].startswith("(current")]
            for r in found:
                r.pop("started", None)
            res[family][str(T)] = dict(base_ms=base, base_again_ms=again[-1] if again else None, variants=found,
                                       **({"errors": errors} if errors else {}))
            best = min((r for r in found if "ms" in r), key=lambda r: r["ms"], default=None)
            log(f"{family} T={T}: base {base} ms (again {again}); best "
                + (f"{best['entry']}.{best['setting']}={best['value']} {best['ms']:.3f} ms" if best else "none")
                + (f"; {len(errors)} crash(es): {errors[0]}" if errors else ""))
            save(res)
    return res


def markdown(res: dict, tables: dict) -> str:
    lines = ["| family | T | kernel | setting | current | tried | ms | ratio |", "|---|---|---|---|---|---|---|---|"]
    for family, by_len in res.items():
        for T, r in by_len.items():
            lines.append(f"| {family} | {T} | (current settings) | | | | {r['base_ms']} "
                         f"(again {r['base_again_ms']}) | 1 |")
            for v in sorted(r["variants"], key=lambda v: v.get("ratio", 9)):
                cur = {"walk_bv": f"{kernel_module(family).__name__}.walk_bv", "switch": "the other"}.get(v["entry"]) or \
                    tables[family][v["entry"]].get(v["setting"])  # an entry without a register cap has no maxnreg
                tail = f"{v['ms']:.3f} | {v.get('ratio', float('nan')):.3f}" if "ms" in v else f"{v['error']} |"
                lines.append(f"| {family} | {T} | {v['entry']} | {v['setting']} | {cur} | {v['value']} | {tail} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default="gla,delta_rule,gated_delta_rule")
    ap.add_argument("--lengths", default="2048,32768")
    ap.add_argument("--out", default="", help="folder for kernel_launch_sweep.{json,md} (default: print only)")
    ap.add_argument("--workers", type=int, default=12, help="compile processes")
    ap.add_argument("--only", default="", help="comma list of entries to sweep, e.g. 'switch' or "
                    "'wy_bwd,walk_bv' or one switch as 'switch:DQKWG_BK' (default: every launch-table "
                    "entry, walk_bv and switch)")
    ap.add_argument("--warps", default="4,8,16", help="warp counts to try per kernel (default 4,8,16)")
    ap.add_argument("--caps", default="", help="register caps per thread (ptxas maxnreg) to try on every "
                    "entry, e.g. 128,104: a cap that fits one more program on each SM can pay "
                    "(docs/benchmarks/register_caps.md; kernels_aot_regs.py --maxnreg shows the spills)")
    ap.add_argument("--set", default="", help="switch values for the base, e.g. 'BWD_SUB_BK=128' "
                    "(to sweep the launch of a kernel behind a switch)")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)  # FAMILY:T:START, see sweep()
    opts = ap.parse_args(argv)
    try:
        apply_sets(opts.set)
    except ValueError as exc:
        ap.error(str(exc))
    os.environ[SET_ENV] = opts.set  # the compile workers and timing children apply it too
    ONLY.update(filter(None, opts.only.split(",")))
    warps = comma_ints(opts.warps)
    if not warps or any(w < 1 or w & (w - 1) for w in warps):
        ap.error(f"--warps: a comma list of powers of two, got {opts.warps!r}")
    WARPS[:] = warps
    caps = comma_ints(opts.caps)
    if caps is None or not all(valid_cap(c) for c in caps):
        ap.error(f"--caps: a comma list of multiples of 8 from 24 to 255, got {opts.caps!r}")
    CAPS[:] = caps
    if opts.child:
        family, T, start = opts.child.split(":")
        sweep_one(family, int(T), int(start))
        return 0
    try:
        families = linear_families(opts.families)
    except ValueError as exc:
        ap.error(str(exc))
    lengths = comma_ints(opts.lengths)
    if lengths is None:
        ap.error(f"--lengths: a comma list of integers, got {opts.lengths!r}")
    if not torch.cuda.is_available():
        print("kernel_launch_sweep: needs a CUDA GPU (the settings are per-GPU)", file=sys.stderr)
        return 2
    unknown = ONLY - {e for f in families for v in _all_variants(f)
                      for e in (v[0], *([f"switch:{v[1]}"] if v[0] == "switch" else []))}
    if unknown:
        ap.error(f"--only: {sorted(unknown)} not an entry of {', '.join(families)}")
    if ONLY:  # a family with none of the entries has nothing to time
        families = [f for f in families if variants(f)]

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    jobs = [(f, v, max(1, TOKENS // T)) for T in lengths for f in families for v in [None] + variants(f)]
    t0 = time.time()
    errors = precompile(jobs, opts.workers)
    log(f"compiled {len(jobs)} (variant, batch) jobs in {time.time() - t0:.0f} s" + (f"; {len(errors)} failed" if errors else ""))
    for e in errors:
        log(f"  compile failed: {e}")
    tables = {f: {k: dict(v) for k, v in kernel_module(f).LAUNCH.items()} for f in families}
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, when=time.strftime("%Y-%m-%d %H:%M"),
                command="python benchmarks/kernel_launch_sweep.py " + " ".join(sys.argv[1:]),
                tables=tables, settings=kernel_settings(), compile_errors=errors)

    def save(res: dict) -> None:
        if not opts.out:
            return
        out = Path(opts.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "kernel_launch_sweep.json").write_text(json.dumps(dict(meta, results=res), indent=1))
        (out / "kernel_launch_sweep.md").write_text(
            f"# Launch-setting sweep ({meta['device']}, {meta['when']})\n\n`{meta['command']}`\n\n"
            f"Switches as run (rows named `switch` flip one): {switches_line(meta['settings'])}\n\n"
            + markdown(res, tables))

    res = sweep(families, lengths, log, save)
    print(markdown(res, tables))
    return 0


if __name__ == "__main__":
    sys.exit(main())
