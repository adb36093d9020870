"""A probe kernel for ``blocks.kernels.skinny._next_lines`` in Triton's interpreter (imported by the
interpreter tests only: it needs Triton): each program stores the byte offsets of the lines it would
prefetch, -1 where masked."""
import triton
import triton.language as tl

from blocks.kernels.skinny import _next_lines


@triton.jit
def probe(pf, out, rows, row_bytes, row_len, split_bytes, cols,
          RP: tl.constexpr, S: tl.constexpr, LINES: tl.constexpr):
    pid = tl.program_id(0)
    p, m = _next_lines(pf, pid, rows, row_bytes, row_len, split_bytes, cols, RP, S, LINES)
    off = p.to(tl.int64) - pf.to(tl.pointer_type(tl.int8)).to(tl.int64)
    o = pid * (RP * LINES) + tl.arange(0, RP)[:, None] * LINES + tl.arange(0, LINES)[None, :]
    tl.store(out + o, tl.where(m, off, -1))
