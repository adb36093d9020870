"""Language modelling through Hugging Face ``datasets``.

Sources (first that applies):

- ``data_files``: local text / JSON (lines) / parquet files, loaded with
  ``datasets.load_dataset("text" | "json" | "parquet", data_files=...)``. A dict
  ``{"train": ..., "validation": ...}`` gives the validation split explicitly; otherwise documents
  are split deterministically (a hash of each document's text, ``val_fraction`` of them held out).
  Text files are read one document per paragraph (blank-line separated).
- ``dataset``: a dataset name (``datasets.load_dataset(dataset, dataset_config, split=...)``) on
  machines that reach the Hugging Face hub.
- neither: the embedded corpus, the English documentation that CPython ships in
  ``pydoc_data.topics`` (~470 KB of real text; no download, present on every Python install).

Documents are tokenized (``tokenizer="byte"`` by default: UTF-8 bytes + EOS, vocab 257; any other
name is loaded with ``transformers.AutoTokenizer``), joined as ``EOS d1 EOS d2 EOS ...`` and cut
into windows of ``seq_len + 1`` tokens (inputs ``w[:-1]``, targets ``w[1:]``).

Validation scores every token of the validation stream once (the last partial window too):
``loss`` (mean nats per token), ``perplexity = exp(loss)``, ``accuracy`` (next-token argmax) and
``bpb = total nats / (ln 2 * total UTF-8 bytes of the validation documents)``, which compares
across tokenizers since the byte count does not depend on them (the EOS predictions count in the
nats, not in the bytes).
"""
from __future__ import annotations

import dataclasses
import glob
import hashlib
import math
import os
import sys
from typing import Any, Iterator, Union

import numpy as np
import torch

from archsearch.errors import UserError
from archsearch.tasks.base import (
    IGNORE,
    Batch,
    Task,
    check_stream_args,
    require,
    score_sums,
    shard_indices,
)
from archsearch.tasks.tokenizer import get_tokenizer

FORMATS = ("auto", "text", "json", "parquet")
_EXT = {".txt": "text", ".text": "text", ".md": "text", ".rst": "text", ".json": "json", ".jsonl": "json",
        ".parquet": "parquet"}
_COMPRESSION = (".gz", ".bz2", ".xz", ".zst", ".lz4", ".zip")


@dataclasses.dataclass
class LMParams:
    data_files: Union[str, list, dict, None] = None
    format: str = "auto"
    dataset: Union[str, None] = None
    dataset_config: Union[str, None] = None
    dataset_split: str = "train"
    validation_split: Union[str, None] = None
    text_field: str = "text"
    tokenizer: str = "byte"
    seq_len: int = 256
    val_fraction: float = 0.1
    max_eval_tokens: Union[int, None] = None

    def validate(self) -> None:
        require(self.seq_len >= 1, "lm.seq_len", "be >= 1", self.seq_len)
        require(0 < self.val_fraction < 1, "lm.val_fraction", "be in (0, 1)", self.val_fraction)
        require(self.format in FORMATS, "lm.format", f"be one of {', '.join(FORMATS)}", self.format)
        require(self.max_eval_tokens is None or self.max_eval_tokens >= 1, "lm.max_eval_tokens",
                "be >= 1 (or null for the whole validation split)", self.max_eval_tokens)
        if self.data_files is not None and self.dataset is not None:
            raise UserError("lm.data_files: give either data_files or dataset, not both")
        files = self.data_files
        ok = isinstance(files, str) or (
            isinstance(files, list) and files and all(isinstance(f, str) for f in files)
        ) or (
            isinstance(files, dict) and files and all(isinstance(k, str) for k in files)
        ) or files is None
        require(bool(ok), "lm.data_files", "be a path, a list of paths or {split: paths}", files)
        if isinstance(files, dict):
            unknown = sorted(set(files) - {"train", "validation", "test"})
            require(not unknown, "lm.data_files", "have only the splits train, validation, test", sorted(files))
            require("train" in files, "lm.data_files", "name a train split", sorted(files))


def embedded_corpus() -> list[str]:
    """The built-in corpus: CPython's ``pydoc_data.topics`` texts, ordered by topic name."""
    try:
        from pydoc_data.topics import topics
    except ImportError:  # pragma: no cover - stripped-down Python builds
        raise UserError(
            "lm: the embedded corpus needs the standard-library module pydoc_data, which this Python lacks; "
            "pass lm.data_files"
        ) from None
    return [topics[k] for k in sorted(topics)]


def hash_split(docs: list[str], val_fraction: float) -> tuple[list[str], list[str]]:
    """Deterministic document split: a document goes to validation when the first 8 bytes of the
    sha256 of its text, as a fraction of 2**64, fall below ``val_fraction`` (stable across runs,
    machines and document order). At least one document lands on each side."""
    if len(docs) < 2:
        raise UserError(
            f"lm.data_files: {len(docs)} document(s) cannot be split into train and validation; "
            "add documents or give {train: ..., validation: ...}"
        )
    scores = [int.from_bytes(hashlib.sha256(d.encode("utf-8")).digest()[:8], "big") / 2**64 for d in docs]
    val = [s < val_fraction for s in scores]
    if all(val) or not any(val):  # keep both sides non-empty: move the extreme document over
        pick = min(range(len(docs)), key=scores.__getitem__) if not any(val) else max(
            range(len(docs)), key=scores.__getitem__)
        val[pick] = not val[pick]
    return [d for d, v in zip(docs, val) if not v], [d for d, v in zip(docs, val) if v]


def _infer_format(path: str) -> str:
    name = path.lower()
    for comp in _COMPRESSION:
        if name.endswith(comp):
            name = name[: -len(comp)]
    ext = os.path.splitext(name)[1]
    if ext not in _EXT:
        raise UserError(f"lm.format: cannot tell the format of {path!r} from its extension; set lm.format "
                        "to text, json or parquet")
    return _EXT[ext]


def _check_paths(paths: list[str]) -> None:
    for path in paths:
        if any(c in path for c in "*?["):
            if not glob.glob(path):
                raise UserError(f"lm.data_files: no file matches {path!r}")
        elif not os.path.isfile(path):
            raise UserError(f"lm.data_files: no such file: {path}")


def _load_docs(p: LMParams) -> tuple[list[str], list[str], str]:
    """-> (train documents, validation documents, a short description of the source)."""
    import datasets

    datasets.disable_progress_bars()
    if p.data_files is None and p.dataset is None:
        docs = embedded_corpus()
        train, val = hash_split(docs, p.val_fraction)
        # The text is CPython's and changes between Python versions: the fingerprint says which.
        digest = hashlib.sha256("\0".join(docs).encode("utf-8")).hexdigest()[:12]
        return train, val, f"embedded:pydoc_data.topics (python {sys.version_info[0]}.{sys.version_info[1]}, sha256 {digest})"
    if p.data_files is not None:
        files = p.data_files
        splits = {k: ([v] if isinstance(v, str) else list(v)) for k, v in files.items()} if isinstance(
            files, dict) else {"train": [files] if isinstance(files, str) else list(files)}
        paths = [f for fs in splits.values() for f in fs]
        _check_paths(paths)
        fmt = p.format if p.format != "auto" else _infer_format(paths[0])
        kwargs = {"sample_by": "paragraph"} if fmt == "text" else {}
        try:
            ds = datasets.load_dataset(fmt, data_files=splits, **kwargs)
        except Exception as exc:  # malformed JSON / parquet: report the cause in one line
            raise UserError(f"lm.data_files: cannot read {paths[0]!r} as {fmt}: {str(exc).splitlines()[0]}") from None
        source = f"{fmt}:{','.join(paths)}"
        val_name = "validation" if "validation" in ds else ("test" if "test" in ds else None)
    else:
        try:
            ds = {"train": datasets.load_dataset(p.dataset, p.dataset_config, split=p.dataset_split)}
            if p.validation_split:
                ds["validation"] = datasets.load_dataset(p.dataset, p.dataset_config, split=p.validation_split)
        except Exception as exc:  # offline, unknown name, missing config
            raise UserError(f"lm.dataset: cannot load {p.dataset!r}: {str(exc).splitlines()[0]}") from None
        source = f"hub:{p.dataset}" + (f"/{p.dataset_config}" if p.dataset_config else "")
        val_name = "validation" if p.validation_split else None
    docs = {}
    for split in ["train"] + ([val_name] if val_name else []):
        table = ds[split]
        if p.text_field not in table.column_names:
            raise UserError(f"lm.text_field: no column {p.text_field!r} in the {split} data; columns: "
                            f"{', '.join(table.column_names)}")
        docs[split] = [t for t in table[p.text_field] if isinstance(t, str) and t.strip()]
    if val_name:
        train, val = docs["train"], docs[val_name]
    else:
        train, val = hash_split(docs["train"], p.val_fraction)
    if not train or not val:
        raise UserError(f"lm.data_files: {source} has no non-empty {'train' if not train else 'validation'} documents")
    return train, val, source


class LanguageModeling(Task):
    """Next-token prediction on a text corpus (see module docstring). Data load on first use."""

    name = "lm"
    Params = LMParams
    metrics = {"loss": "minimize", "perplexity": "minimize", "bpb": "minimize", "accuracy": "maximize"}

    def __init__(self, params: LMParams) -> None:
        super().__init__(params)
        self.tokenizer = get_tokenizer(params.tokenizer)  # UserError now, not at the first batch
        self.vocab_size = self.tokenizer.vocab_size
        self.seq_len = params.seq_len
        self._data: dict[str, Any] | None = None

    @property
    def data(self) -> dict[str, Any]:
        """``train``: token windows ``[N, seq_len + 1]``; ``val``: the validation token stream;
        ``val_bytes``: UTF-8 bytes of the documents in it; ``source``."""
        if self._data is None:
            self._data = self._prepare()
        return self._data

    def _stream(self, docs: list[str]) -> np.ndarray:
        """``EOS d1 EOS d2 ... dn EOS`` as int64."""
        eos = np.array([self.tokenizer.eos_id], dtype=np.int64)
        parts = [eos]
        for start in range(0, len(docs), 512):
            for ids in self.tokenizer.encode_batch(docs[start : start + 512]):
                parts += [ids, eos]
        return np.concatenate(parts)

    def _prepare(self) -> dict[str, Any]:
        p = self.p
        train_docs, val_docs, source = _load_docs(p)
        train = self._stream(train_docs)
        n_windows = (len(train) - 1) // p.seq_len
        if n_windows < 1:
            raise UserError(f"lm.seq_len: the training text has {len(train)} tokens, fewer than one window of "
                            f"{p.seq_len + 1}")
        windows = np.lib.stride_tricks.sliding_window_view(train, p.seq_len + 1)[:: p.seq_len][:n_windows]
        if p.max_eval_tokens is not None:  # whole documents only, so the byte count stays exact
            kept, total = [], 0
            for doc in val_docs:
                n = len(self.tokenizer.encode(doc)) + 1
                if kept and total + n > p.max_eval_tokens:
                    break
                kept.append(doc)
                total += n
            val_docs = kept
        val = self._stream(val_docs)
        return {
            "train": np.ascontiguousarray(windows),
            "val": val,
            "val_bytes": sum(len(d.encode("utf-8")) for d in val_docs),
            "train_tokens": int(len(train)),
            "source": source,
        }

    def train_batches(self, batch_size: int, seed: int, rank: int = 0, world_size: int = 1) -> Iterator[Batch]:
        check_stream_args(batch_size, rank, world_size)
        windows = self.data["train"]
        order = shard_indices(len(windows), seed, rank, world_size)
        while True:
            idx = np.fromiter(order, dtype=np.int64, count=batch_size)
            w = torch.from_numpy(windows[idx])
            yield w[:, :-1].contiguous(), w[:, 1:].contiguous()

    def val_windows(self) -> tuple[np.ndarray, np.ndarray]:
        """Validation ``(inputs, targets)`` ``[N, seq_len]`` covering every token of the stream after
        the first exactly once; the last window is padded (EOS inputs, -100 targets)."""
        val, S = self.data["val"], self.p.seq_len
        n = math.ceil((len(val) - 1) / S)
        inputs = np.full((n, S), self.tokenizer.eos_id, dtype=np.int64)
        targets = np.full((n, S), IGNORE, dtype=np.int64)
        for i in range(n):
            chunk = val[i * S : i * S + S + 1]
            inputs[i, : len(chunk) - 1] = chunk[:-1]
            targets[i, : len(chunk) - 1] = chunk[1:]
        return inputs, targets

    def evaluate(self, model: Any, device: torch.device | str, batch_size: int = 16) -> dict[str, float]:
        inputs, targets = self.val_windows()
        correct, nats, count = score_sums(model, inputs, targets, device, batch_size)
        loss = nats / count
        return {
            "loss": loss,
            "perplexity": math.exp(min(loss, 700.0)),
            "bpb": nats / (math.log(2) * self.data["val_bytes"]),
            "accuracy": correct / count,
        }
