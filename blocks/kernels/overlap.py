"""Run a sequential chunk walk in segments beside the parallel per-chunk kernels around it.

A chunk walk (``_fwd_h``, ``_bwd_dh``) is one program per (batch, head, value block), each a chain
of ``NT`` dependent steps. Long sequences mean few such programs (128 at 16k or 32k tokens of 16
heads in a 64k-token batch: at most one per SM of an H200, each at ~6% occupancy) while the
per-chunk kernels before and after it, which could use the idle SMs, wait for the whole walk. Here the walk is cut into segments of chunks, the
state carried between them in float32 (as in registers, so results do not change); segment ``s``
runs on a high-priority side stream as soon as the kernels it needs for its chunks are done, and
the kernels that need its chunks' results start while segment ``s + 1`` walks. CUDA does not let a
kernel start on data another kernel is still writing, so the alternative, one persistent kernel
doing both, would need its own grid-wide synchronisation: streams and events are the library's way.

Off the GPU (Triton's interpreter) the segments run one after another in the same order, so the
segment bookkeeping is tested on CPU; one segment is the unsegmented launch.
"""
from __future__ import annotations

import functools
from typing import Callable

import torch

from .tiles import sm_count

Segment = tuple[int, int]  # chunks [c0, c1)


@functools.lru_cache(maxsize=None)
def walk_stream(device: torch.device) -> torch.cuda.Stream:
    """The device's high-priority stream for the walks (CUDA's block scheduler serves its pending
    programs first, so a segment is not queued behind the parallel kernels that fill the GPU)."""
    return torch.cuda.Stream(device=device, priority=-1)


def plan(nt: int, programs: int, x: torch.Tensor, segments: int, below_per_sm: float) -> list[Segment]:
    """Chunk ranges of a walk over ``nt`` chunks with ``programs`` programs: ``min(segments, nt)``
    ranges whose lengths differ by at most one, on a CUDA device only when the walk has fewer than
    ``below_per_sm`` programs per SM; else the single range ``[(0, nt)]``. Off CUDA (Triton's
    interpreter) there is no SM count: the ranges are cut whenever ``segments > 1``, so that the
    CPU tests run the segment bookkeeping.

    Ranges of equal length: short first and last ones (the pipeline's fill and drain), half the
    others' length, were a tie or a loss (H200 2026-12-03 13:13, docs/benchmarks/train_ab_1203_segments.md)."""
    if segments <= 1 or nt <= 1 or (x.is_cuda and programs >= below_per_sm * sm_count(x.device)):
        return [(0, nt)]
    n = min(segments, nt)
    cuts = [i * nt // n for i in range(n + 1)]
    return list(zip(cuts[:-1], cuts[1:]))


def run(segments: list[Segment], before: Callable[[int, int], None], walk: Callable[[int, int, int], None],
        after: Callable[[int, int], None], x: torch.Tensor) -> None:
    """For each segment ``(c0, c1)`` in walk order: ``before(c0, c1)`` (what the walk needs), then
    ``walk(c0, c1, i)`` (``i``: the segment's place in walk order, 0 first), then ``after(c0, c1)``
    (what needs the walk's results). With several segments on CUDA, the walks run in order on
    ``walk_stream`` and every ``before``/``after`` launch on the current stream, ordered by events.

    Every tensor the walks touch must be allocated before this is called and stay referenced until
    it returns: the current stream waits for the last segment before returning, so memory freed
    after that cannot be handed to a kernel while a walk still reads it."""
    if len(segments) == 1 or not x.is_cuda:
        for seg in segments:
            before(*seg)
        for i, seg in enumerate(segments):
            walk(*seg, i)
        for seg in segments:
            after(*seg)
        return
    main = torch.cuda.current_stream(x.device)
    side = walk_stream(x.device)
    ready: list[torch.cuda.Event] = []
    done: list[torch.cuda.Event] = []
    try:
        # all the "before" kernels first: none waits for a walk (each walk launched right after its
        # segment's "before" instead: no gain, H200 2026-12-03 13:23, train_ab_1203_segments.md)
        for seg in segments:
            before(*seg)
            ready.append(main.record_event())
        with torch.cuda.stream(side):
            for i, (seg, ev) in enumerate(zip(segments, ready)):
                side.wait_event(ev)
                walk(*seg, i)
                done.append(side.record_event())
        for seg, ev in zip(segments, done):
            main.wait_event(ev)
            after(*seg)
    finally:
        # also when a launch raised (a compile error): the caller's tensors are freed on the
        # current stream, which must not hand them out while a queued walk still uses them
        for ev in done:
            main.wait_event(ev)
