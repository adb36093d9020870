"""The whole model's decode step captured as one CUDA graph, with static state buffers.

A decode step of a 24-layer model launches a few hundred small kernels; launched one by one from
Python the step is launch-bound (a single layer's state update alone costs ~60-110 us eagerly
against ~8 us of memory traffic). Replaying a captured graph removes the launch gaps, so the step
runs at the speed of the bytes it moves (weights + states).

A graph replays fixed kernels on fixed addresses, so every piece of state lives in a buffer that
never moves:

* linear layers: the float32 state ``S: [B, H, K, V]`` is updated in place by the fused Triton
  step (``blocks.kernels.inplace_decode_state``); conv caches ``[B, W-1, C]`` are copied back into
  their buffers (a few KB).
* softmax layers: a preallocated KV cache ``[B, capacity, Hkv, D]`` (a ring of ``window`` slots for
  windowed layers) is written at the current position, and attention reads the slots written so
  far (a ``[capacity]`` bool buffer marks them, set slot by slot; on CUDA the rotary, the cache
  writes, the attention over the slots below ``min(pos + 1, capacity)`` and the output gate are one
  kernel, ``blocks.kernels.decode_attention``; without it, the rotary and the writes are
  ``blocks.kernels.rope_cache``'s kernel and SDPA reads the whole cache through the mask); the
  position is a device scalar advanced inside the graph, so rotary embeddings follow.

The step reproduces ``HybridLM.decode_step`` through the model's public modules: the embedding,
each linear layer as it is (``HybridLayer``: norm, mixer, MLP), each softmax layer through its
norms, projections and MLP around the static cache, the final norm and the head; the GPU tests and
the benchmark check it against the eager model. Linear layers that ``archsearch.decode_layer``
serves (deltanet, gated_deltanet, simple_gla with RMSNorm and SwiGLU, batch <= 16) run as its
five kernels instead, each handing the next fused layer its first norm (as ``skinny.NormedRows``;
a fused first layer's comes with the embedding lookup, one kernel); softmax layers with the same
norms and MLP run those GEMMs around the cache's attention (``decode_layer.attention_step``,
``_SoftmaxCache.attend``). ``compile=True`` additionally runs
the other linear layers through ``torch.compile`` (fewer, fused kernels per layer).

    dec = GraphDecoder(model, batch=16, capacity=4096)      # model on CUDA, in eval mode
    logits = dec.prefill(prompt)                             # prompt [B, T]: eager prefill, states loaded
    logits = dec.step(token)                                 # token [B] -> logits [B, vocab] (static buffer)
    seconds = dec.time_step(iters=50)                        # per-step latency by graph replay
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from archsearch.errors import UserError
from blocks.common import rotary_frequencies

State = dict[str, torch.Tensor]


def available() -> bool:
    """True when a CUDA device is present (graph capture needs one)."""
    return torch.cuda.is_available()


# Softmax layers' rotary + KV-cache write as one Triton kernel on CUDA (``blocks.kernels.rope_cache``);
# off: PyTorch's ~45 small kernels per layer and step (blocks/kernels/rope_cache.py says how counted). (H200, 2026-12-01, the 3:1 hybrid's step at 1k
# context: 2.078 ms without it at 14:40, 1.568 with it at 14:45; docs/benchmarks/decode_softmax_layers.md.)
ROPE_CACHE_KERNEL = True
# The softmax layers' whole attention step (rotary, cache write, attention over the written slots,
# output gate) as one Triton kernel on CUDA (``blocks.kernels.decode_attention``); off: the rotary +
# cache kernel above, then SDPA with the cache's bool mask and the gate's PyTorch ops. (H200,
# 2026-12-01 15:41, the 3:1 hybrid's step, both in one call: 1.553 / 2.083 / 4.177 ms at 1k / 4k /
# 16k context against 1.617 / 2.162 / 4.247 without it; 124 kernels per step instead of 148;
# docs/benchmarks/decode_attention.md.)
ATTEND_KERNEL = True
# The model's head after a fused last layer as a skinny GEMM (``decode_layer.head_step``) on the final
# norm as that layer's w2 hands it on (``NormedRows``, the residual add and norm in w2's epilogue),
# instead of w2's partials + add_norm and the head on cuBLAS (nvjet, 35-36 us on the H200 for 32000 x
# 2048 in bf16, launched without PDL, so it neither prefetches nor starts under the kernel before).
HEAD_KERNEL = False
# what the benchmarks' ``--set`` / ``--compiled-sets`` may flip (benchmarks/gpu_common.py)
SWITCHES = {"ROPE_CACHE_KERNEL": (False, True), "ATTEND_KERNEL": (False, True), "HEAD_KERNEL": (False, True)}


class _SoftmaxCache:
    """Static KV cache of one softmax layer: ``k, v: [B, cap, Hkv, D]`` in the activation dtype."""

    def __init__(self, block, batch: int, capacity: int, dtype: torch.dtype, device: torch.device) -> None:
        self.block = block
        window = block.config.window
        self.cap = min(window, capacity) if window else capacity
        shape = (batch, self.cap, block.num_kv_heads, block.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.slots = torch.arange(self.cap, device=device)
        self.valid = torch.zeros(self.cap, dtype=torch.bool, device=device)  # slots written: the attention mask
        self.inv_freq = rotary_frequencies(block.head_dim, block.config.rope_theta, device)  # for the fused kernel

    def load(self, k_cache: torch.Tensor, v_cache: torch.Tensor, pos: int) -> None:
        """Place an eager cache (the last ``n`` tokens, in order, positions ``pos-n .. pos-1``): every
        token of a full-attention layer, a windowed layer's last ``min(pos, window)``. So the
        written slots are those below ``min(pos, cap)``, which the attention kernel reads without
        the mask (``decode_attention.ATTEND_MASK``)."""
        n = k_cache.shape[1]
        if n > self.cap:
            raise UserError(f"capacity: the prompt's {n} cached tokens exceed the cache capacity {self.cap}")
        if n != min(pos, self.cap):
            raise UserError(f"position: a cache of {n} tokens at position {pos} leaves earlier positions out; "
                            f"expected {min(pos, self.cap)} (the layer's whole context, or its window)")
        self.k.zero_()
        self.v.zero_()
        slots = (torch.arange(pos - n, pos, device=self.k.device) % self.cap)
        self.k[:, slots] = k_cache.to(self.k.dtype)
        self.v[:, slots] = v_cache.to(self.v.dtype)
        self.valid.zero_()
        self.valid[slots] = True

    def fill(self, pos: int) -> None:
        """Mark the slots of positions ``< pos`` written (after ``randomize`` filled the caches)."""
        self.valid.copy_(self.slots < min(pos, self.cap))

    def step(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """``x: [B, 1, d_model]`` (normed) at position ``pos`` (0-d long tensor) -> ``[B, 1, d_model]``."""
        return self.block.o_proj(self.attend(self.block.in_proj(x), pos))

    def attend(self, proj: dict[str, torch.Tensor], pos: torch.Tensor) -> torch.Tensor:
        """The step between the projections: ``proj``, the input projection's columns
        (``[B, 1, width]`` views by name) -> ``o: [B, 1, H*D]`` before ``o_proj``; writes this
        position's key and value into the cache."""
        from blocks.ops.utils import cuda_kernel

        blk = self.block
        B = proj["q"].shape[0]
        H, Hkv, D = blk.num_heads, blk.num_kv_heads, blk.head_dim
        whole = cuda_kernel("attend_cache", "decode", proj["q"]) if ATTEND_KERNEL else None
        if whole is not None and (blk.gate is None or blk.gate.act_name == "sigmoid"):
            return whole(proj["q"], proj["k"], proj["v"], proj.get("gate") if blk.gate is not None else None,
                         self.inv_freq, pos, self.k, self.v, self.valid)
        fused = cuda_kernel("rope_cache", "decode", proj["q"]) if ROPE_CACHE_KERNEL else None
        if fused is not None:  # rotary, the cache writes and the slot's flag in one kernel
            q = fused(proj["q"], proj["k"], proj["v"], self.inv_freq, pos, self.k, self.v, self.valid)
            g = proj.get("gate")
        else:
            q, k, v, g = blk.heads_of(proj, pos)  # [B, 1, H, D], [B, 1, Hkv, D] x2, gate [B, 1, H*D] | None
            slot = torch.remainder(pos, self.cap).view(1)
            self.k.index_copy_(1, slot, k)
            self.v.index_copy_(1, slot, v)
            self.valid.index_fill_(0, slot, True)
        # the written slots (a ring: keys are already rotated, so slot order is irrelevant)
        o = F.scaled_dot_product_attention(
            q.transpose(1, 2), self.k.transpose(1, 2), self.v.transpose(1, 2),
            attn_mask=self.valid[None, None, None, :], enable_gqa=H != Hkv,
        ).transpose(1, 2).reshape(B, 1, H * D)
        if blk.gate is not None:
            o = blk.gate(o, g)
        return o


# GraphDecoder(compile=...) -> torch.compile's arguments. Inductor's own CUDA graphs stay off: the
# whole step is captured as one graph here. Inductor's programmatic dependent launch
# (options={"triton.enable_pdl": True}) was tried as a mode and lost: the compiled gated_deltanet
# x24 step took 2.275 against 2.014 ms without it, 1.880 against 1.822 ms with the fused decode
# mixer (H200, 2026-12-01 10:24, docs/benchmarks/decode_mixer_pdl.md).
COMPILE_MODES = {"default": {"mode": "default"}, "max-autotune": {"mode": "max-autotune-no-cudagraphs"}}


class GraphDecoder:
    """``model``'s decode step for ``batch`` sequences of up to ``capacity`` positions, as one CUDA graph.

    The graph is captured on the first ``step``; ``prefill``/``load``/``randomize`` set the state.
    """

    def __init__(self, model, batch: int, capacity: int, compile: bool | str = False, use_graph: bool = True) -> None:
        """``use_graph=False`` runs the same static-buffer step eagerly (any device, no capture): the
        CPU tests check the static path against ``HybridLM.decode_step`` this way. ``compile``: False,
        True (= ``"default"``), ``"max-autotune"`` (Inductor also times Triton GEMM templates
        against cuBLAS for the step's skinny matmuls; minutes of compiling; ``COMPILE_MODES``)."""
        if not (isinstance(compile, bool) or compile in COMPILE_MODES):
            raise UserError(f"compile: must be true, false or one of {', '.join(COMPILE_MODES)}, got {compile!r}")
        if use_graph and not available():
            raise UserError("decode graph: needs a CUDA device (none found)")
        if batch < 1:
            raise UserError(f"batch: must be >= 1, got {batch}")
        if capacity < 1:
            raise UserError(f"capacity: must be >= 1, got {capacity}")
        param = next(model.parameters())
        if use_graph and param.device.type != "cuda":
            raise UserError("decode graph: the model must be on a CUDA device (call model.cuda())")
        self.use_graph = use_graph
        self.model = model.eval()
        self.batch, self.capacity = batch, capacity
        self.device, self.dtype = param.device, param.dtype
        self.pos = torch.zeros((), dtype=torch.long, device=self.device)
        self.position = 0  # host mirror of ``pos``: no device sync to check the capacity
        self.token = torch.zeros(batch, dtype=torch.long, device=self.device)
        self.caches: dict[int, _SoftmaxCache] = {}
        self.states: list[State | None] = [None] * len(model.layers)
        for i, layer in enumerate(model.layers):
            if layer.mixer.name == "softmax":
                self.caches[i] = _SoftmaxCache(layer.mixer, batch, capacity, self.dtype, self.device)
        # Layers that run as archsearch.decode_layer's kernels (linear ones as its step, softmax ones as
        # its attention_step, where they apply and it is switched on), each handing the next fused
        # layer its first RMSNorm (the last: the final norm's).
        self.fused_layers, self.next_norms = self._plan_fused_layers()
        # ... and, before a fused first layer, the embedding lookup and its norm1 as one kernel
        self.fused_embed = 0 in self.fused_layers and self._embed_fuses()
        # ... and, after a fused last layer, the head as a skinny GEMM on its final norm
        self.fused_head = len(self.model.layers) - 1 in self.fused_layers and self._head_fuses()
        # compile=True runs each other linear layer through torch.compile (regional compilation: the
        # layers share their code, so Inductor compiles once and every layer reuses it); it fuses
        # the dozens of small elementwise kernels per layer that otherwise dominate a decode step.
        mode = "default" if compile is True else compile
        self.layer_fns = [torch.compile(layer, dynamic=False, **COMPILE_MODES[mode])
                          if mode and i not in self.caches and i not in self.fused_layers else layer
                          for i, layer in enumerate(model.layers)]
        self.compiled = mode  # False or the mode's name
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None
        self._init_linear_states()

    @torch.no_grad()
    def _plan_fused_layers(self) -> tuple[set[int], dict[int, torch.nn.Module | None]]:
        """``({layer index: runs decode_layer.step, or attention_step for a softmax layer}, {index: the
        RMSNorm its step applies last})``."""
        from archsearch import decode_layer

        layers = self.model.layers
        probe = self._probe()
        fused = {i for i, layer in enumerate(layers)
                 if (decode_layer.attention_applies if i in self.caches else decode_layer.applies)(layer, probe)}
        final = self.model.final_norm if decode_layer.is_rmsnorm(self.model.final_norm) else None
        nexts = {i: (layers[i + 1].norm1 if i + 1 in fused else None) if i + 1 < len(layers) else final
                 for i in fused}
        return fused, nexts

    @torch.no_grad()
    def _embed_fuses(self) -> bool:
        from archsearch import decode_layer

        return decode_layer.embed_applies(self.model.embed, self.model.layers[0], self._probe())

    @torch.no_grad()
    def _head_fuses(self) -> bool:
        from archsearch import decode_layer

        return HEAD_KERNEL and decode_layer.head_applies(self.model.head, self.model.final_norm, self._probe())

    def _probe(self) -> torch.Tensor:
        """An uninitialised step input ``[B, 1, d_model]``: what ``decode_layer``'s checks look at."""
        return torch.empty(self.batch, 1, self.model.embed.embedding_dim, dtype=self.dtype, device=self.device)

    # --- state -------------------------------------------------------------------------------
    @torch.no_grad()
    def _init_linear_states(self) -> None:
        # The shapes of a linear layer's state come from the block itself: one eager step on zeros.
        x = torch.zeros(self.batch, 1, self.model.spec.d_model, dtype=self.dtype, device=self.device)
        for i, layer in enumerate(self.model.layers):
            if i in self.caches:
                continue
            _, state = layer.mixer(x, None)
            self.states[i] = {name: torch.zeros_like(t).contiguous() for name, t in state.items()}

    @torch.no_grad()
    def load(self, states: Sequence[State | None], position: int) -> None:
        """Copy eager decode states (``HybridLM.prefill``/``decode_step``) after ``position`` tokens."""
        if len(states) != len(self.model.layers):
            raise UserError(f"states: expected {len(self.model.layers)} layer states, got {len(states)}")
        self._check_room(position)
        for i, state in enumerate(states):
            if i in self.caches:
                self.caches[i].load(state["k_cache"], state["v_cache"], position)
            else:
                for name, buf in self.states[i].items():
                    buf.copy_(state[name])
        self.pos.fill_(position)
        self.position = position

    @torch.no_grad()
    def prefill(self, prompt: torch.Tensor) -> torch.Tensor:
        """Eager prefill of ``prompt: [B, T]`` then load its states; returns the last logits ``[B, V]``."""
        if prompt.shape[0] != self.batch:
            raise UserError(f"prompt: batch must be {self.batch}, got {prompt.shape[0]}")
        logits, states = self.model.prefill(prompt.to(self.device))
        self.load(states, prompt.shape[1])
        return logits

    @torch.no_grad()
    def randomize(self, position: int, generator: torch.Generator | None = None) -> None:
        """Random states as after ``position`` tokens (for timing: never time on zeros)."""
        self._check_room(position)
        for i, state in enumerate(self.states):
            if i in self.caches:
                c = self.caches[i]
                for buf in (c.k, c.v):
                    buf.copy_(torch.randn(buf.shape, generator=generator, device=self.device, dtype=torch.float32))
                c.fill(position)
            else:
                for buf in state.values():
                    buf.copy_(0.1 * torch.randn(buf.shape, generator=generator, device=self.device, dtype=torch.float32))
        self.pos.fill_(position)
        self.position = position

    def _check_room(self, position: int) -> None:
        if position < 0:
            raise UserError(f"position: must be >= 0, got {position}")
        full = [i for i, c in self.caches.items() if not c.block.config.window]
        if full and position >= self.capacity:
            raise UserError(f"capacity: position {position} is past the KV-cache capacity {self.capacity} "
                            f"of softmax layer {full[0]}; build the GraphDecoder with a larger capacity")

    # --- the step ----------------------------------------------------------------------------
    def _forward(self) -> torch.Tensor:
        """One decode step on the static buffers: reads ``token``, ``pos`` and the states, writes the
        states in place, advances ``pos``; returns logits ``[B, V]``."""
        from archsearch import decode_layer

        model = self.model
        if self.fused_embed:  # x and its norm1 in one kernel
            x, hn = decode_layer.embed(model.embed, self.token, model.layers[0].norm1)
        else:
            x = model.embed(self.token[:, None])  # [B, 1, d_model]
            hn = None  # norm1 of x, where the fused layer before computed it
        # the layers whose norm the layer before hands on as NormedRows (the head: the final norm)
        handed_on = self.fused_layers | ({len(model.layers)} if self.fused_head else set())
        for i, layer in enumerate(model.layers):
            if i in self.fused_layers and i in self.caches:
                x, hn = decode_layer.attention_step(layer, x, hn, self.caches[i].attend, self.pos,
                                                    self.next_norms[i], hand_on=i + 1 in handed_on)
                continue
            if i in self.fused_layers:
                x, hn, new = decode_layer.step(layer, x, hn, self.states[i], self.next_norms[i],
                                               hand_on=i + 1 in handed_on)
                self._keep_state(i, layer, new)
                continue
            if i not in self.caches:
                x, new = self.layer_fns[i](x, self.states[i])  # HybridLayer: x + mixer(norm1 x), + MLP
                self._keep_state(i, layer, new)
                continue
            x = x + self.caches[i].step(layer.norm1(x), self.pos)
            if layer.mlp is not None:
                x = x + layer.mlp(layer.norm2(x))
        if self.fused_head:  # before the position's update: the head's weights prefetch under w2
            logits = decode_layer.head_step(model.head, hn)
        # a kernel launched without PDL between two steps' fused mixers, which read their state
        # before waiting for the kernel before them (decode_mixer.mixer_step: the ordering it needs)
        self.pos.add_(1)
        if self.fused_head:
            return logits
        # hn is still set only after a fused last layer: the final norm of x
        return model.head(model.final_norm(x) if hn is None else hn)[:, 0]

    def _keep_state(self, i: int, layer, new: State) -> None:
        """Copy layer ``i``'s new decode state into its static buffers (unless written in place)."""
        for name, buf in self.states[i].items():
            t = new[name]
            if t.data_ptr() == buf.data_ptr():  # the fused step wrote S in place
                continue
            if t.shape != buf.shape:
                raise UserError(f"layers[{i}] ({layer.mixer.name}): decode state {name!r} changes "
                                f"shape {tuple(buf.shape)} -> {tuple(t.shape)}; cannot capture")
            buf.copy_(t)

    @torch.no_grad()
    def capture(self) -> None:
        """Warm up (compiles Triton kernels, creates library handles) and capture the step.

        The warm-up steps run on the real buffers, so the states are saved and restored around them.
        """
        from blocks.kernels import inplace_decode_state

        saved = self._snapshot()
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with inplace_decode_state(), torch.cuda.stream(stream):
            for _ in range(2):
                self._forward()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        self._restore(saved)
        graph = torch.cuda.CUDAGraph()
        with inplace_decode_state(), torch.cuda.graph(graph):
            self.logits = self._forward()
        self.graph = graph
        self._restore(saved)  # capture does not run kernels, but keep the buffers exactly as loaded

    def _snapshot(self) -> list[torch.Tensor]:
        return [t.clone() for t in self._buffers()]

    def _restore(self, saved: list[torch.Tensor]) -> None:
        for buf, old in zip(self._buffers(), saved):
            buf.copy_(old)

    def _buffers(self) -> list[torch.Tensor]:
        bufs = [self.pos]
        for i, state in enumerate(self.states):
            if i in self.caches:
                bufs += [self.caches[i].k, self.caches[i].v, self.caches[i].valid]
            else:
                bufs += list(state.values())
        return bufs

    def step(self, token: torch.Tensor) -> torch.Tensor:
        """Advance every sequence by ``token: [B]``; returns logits ``[B, V]``, a static buffer that
        the next step overwrites (clone it to keep it). Tokens are not range-checked on the host
        (that would synchronise every step): with the fused embedding (``fused_embed``, a fused
        first layer) a token outside the vocabulary makes that sequence's logits NaN, and its
        states (recurrent, conv, KV cache) with them, for every later step until ``load``/``prefill``;
        without it ``nn.Embedding`` raises a device-side assert."""
        self._check_room(self.position)
        self.token.copy_(token)
        if not self.use_graph:
            from blocks.kernels import inplace_decode_state

            with torch.no_grad(), inplace_decode_state():
                self.logits = self._forward()
        else:
            if self.graph is None:
                self.capture()
            self.graph.replay()
        self.position += 1
        return self.logits

    def time_step(self, iters: int = 50, warmup: int = 5) -> float:
        """Median seconds per decode step by graph replay (the states advance; positions must fit)."""
        if not self.use_graph:
            raise UserError("decode graph: time_step needs the captured graph (use_graph=True)")
        if self.graph is None:
            self.capture()
        self._check_room(self.position + warmup + iters)
        for _ in range(warmup):
            self.graph.replay()
        times = []
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(iters):
            start.record()
            self.graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        self.position += warmup + iters
        times.sort()
        return times[len(times) // 2]


def decode_bytes(model, batch: int, context: int) -> int:
    """Bytes a decode step must move at ``context``: every weight read once (a tied embedding once:
    only the head reads it all) plus every state read and written (KV caches read, one slot written)."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    weights -= model.embed.weight.numel() * model.embed.weight.element_size() if model.head.weight is not model.embed.weight else 0
    dtype = next(model.parameters()).dtype
    state = 0
    for layer in model.layers:
        b = layer.mixer.state_bytes(batch, context, dtype)
        state += b if layer.mixer.name == "softmax" else 2 * b
    return weights + state


def capture(model, states: Sequence[State | None], token: torch.Tensor, capacity: int | None = None,
            compile: bool = False):
    """``archsearch.measure``'s hook: a greedy stepper ``token [B] -> next token [B]`` that replays the
    captured graph, starting from eager ``states`` (e.g. after ``HybridLM.prefill``).

    ``capacity`` (positions, default the current one + 4096) sizes the softmax KV caches;
    ``compile`` as ``GraphDecoder``'s. The ``GraphDecoder`` is available as ``stepper.decoder``.
    """
    position = 0
    for state in states:
        if state is not None and "pos" in state:
            position = int(state["pos"])  # one host sync, before capture
            break
    dec = GraphDecoder(model, int(token.shape[0]), capacity or position + 4096, compile=compile)
    dec.load(states, position)
    dec.capture()

    def stepper(tok: torch.Tensor) -> torch.Tensor:
        return dec.step(tok).argmax(-1)

    stepper.decoder = dec  # type: ignore[attr-defined]
    return stepper
