# Sourced by the GPU benchmark scripts (from the repository root, with PY set): makes optuna,
# deepspeed and datasets importable on the project's GPU host, which has no package index, by
# installing the wheels carried in .whl/ (see the project's device README) unless they import.
if ! $PY -c "import optuna, deepspeed, datasets" >/dev/null 2>&1; then
  if ls .whl/*.whl >/dev/null 2>&1; then
    pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/site/bin:$PATH
  else
    echo "optuna/deepspeed missing and no .whl/ wheelhouse" >&2; exit 1
  fi
else
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
# DeepSpeed's op builder cannot parse the host's "9.0a"; nothing here compiles DeepSpeed ops, but
# an import-time probe must not fail on it.
export TORCH_CUDA_ARCH_LIST=9.0
