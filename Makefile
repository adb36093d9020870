# Two commands for a new user:
#   make demo   set up .venv and run the embedded default study (mqar_tiny), printing its Pareto front
#   make test   set up .venv and run the test suite (CPU; GPU tests skip without a GPU)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch first, pinned to the CPU build that pip finds locally: an unpinned torch (or DeepSpeed
# installed before torch) pulls a multi-GB CUDA build. GPU users install their own torch first
# and run `pip install -e .` (pyproject's torch requirement is a range).
TORCH_SPEC ?= torch==2.13.0

.PHONY: setup demo test test-kernels clean

$(BIN)/archsearch: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[dev]"
	@touch $@

setup: $(BIN)/archsearch

# One thread per CPU trial unless the caller says otherwise: tiny models gain nothing from more,
# and on a busy machine 2 spinning threads per trial ran ~10x slower (README, "make demo").
demo: setup
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(BIN)/archsearch launch mqar_tiny

test: setup
	$(BIN)/python -m pytest -q

# The Triton kernels run through Triton's CPU interpreter (float32, tiny shapes) against the
# PyTorch forms, every load and store checked against the launch's tensors; and the launch tables. Triton and a NumPy its interpreter supports
# (< 2.3) go into their own folder, so the main environment stays as it is.
KERNEL_DEPS := .triton-cpu
KERNEL_TESTS := tests/blocks/test_kernels_gpu.py tests/blocks/test_kernels_gpu_gla_delta.py tests/blocks/test_kernels_launch.py \
	tests/blocks/test_kernels_skinny.py tests/blocks/test_kernels_decode_attention.py
$(KERNEL_DEPS)/.installed: | setup
	$(BIN)/pip install -q --target $(KERNEL_DEPS) "triton>=3.4" "numpy<2.3"
	@touch $@

# And every kernel compiled ahead of time for sm_90 with the GPU host's Triton (the project's H200
# runs 3.6, which rejects some source the newest accepts; no GPU needed, ~100 s).
HOST_TRITON := .triton-host
HOST_TRITON_SPEC ?= triton==3.6.0
$(HOST_TRITON)/.installed: | setup
	$(BIN)/pip install -q --no-deps --target $(HOST_TRITON) "$(HOST_TRITON_SPEC)"
	@touch $@

# And the oldest Triton the kernels are offered with (blocks.kernels.MIN_TRITON; torch 2.7's), which
# lacks grid dependency control: every kernel compiles there too (~150 s).
MIN_TRITON := .triton-min
MIN_TRITON_SPEC ?= triton==3.3.1
$(MIN_TRITON)/.installed: | setup
	$(BIN)/pip install -q --no-deps --target $(MIN_TRITON) "$(MIN_TRITON_SPEC)"
	@touch $@

test-kernels: setup $(KERNEL_DEPS)/.installed $(HOST_TRITON)/.installed $(MIN_TRITON)/.installed
	TRITON_INTERPRET=1 PYTHONPATH=$(KERNEL_DEPS) $(BIN)/python -m pytest -q $(KERNEL_TESTS) -k "interpreter or launch"
	ARCHSEARCH_HOST_TRITON=$(HOST_TRITON) ARCHSEARCH_MIN_TRITON=$(MIN_TRITON) $(BIN)/python -m pytest -q tests/blocks/test_kernels_host_triton.py

clean:
	rm -rf $(VENV) $(KERNEL_DEPS) $(HOST_TRITON) $(MIN_TRITON) studies runs
