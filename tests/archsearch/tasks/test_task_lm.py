"""The lm task: local text/JSON/parquet through `datasets`, the embedded corpus, packing, bpb."""
from __future__ import annotations

import importlib.util
import json
import math

import numpy as np
import pytest
import torch

from archsearch import tasks
from archsearch.errors import UserError
from archsearch.model import HybridLM
from archsearch.spec import ArchSpec, LayerSpec
from archsearch.tasks.base import IGNORE
from archsearch.tasks.lm import hash_split

PARAGRAPHS = [
    f"Paragraph {i}: the quick brown fox jumps over the lazy dog, caf\u00e9 number {i * 7}." for i in range(40)
]


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "tiny.txt"
    path.write_text("\n\n".join(PARAGRAPHS) + "\n", encoding="utf-8")
    return str(path)


class Uniform(torch.nn.Module):
    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab = vocab

    def forward(self, x):
        return torch.zeros(*x.shape, self.vocab), None


def test_text_file_packing_and_batches(text_file):
    task = tasks.build("lm", data_files=text_file, seq_len=16)
    assert task.vocab_size == 257 and task.seq_len == 16
    data = task.data
    val_docs = [p for p in PARAGRAPHS if p.encode() in bytes(t for t in data["val"] if t < 256)]
    assert 1 <= len(val_docs) < len(PARAGRAPHS)
    assert data["val_bytes"] == sum(len(p.encode("utf-8")) for p in val_docs)  # paragraphs = documents
    assert len(data["val"]) == data["val_bytes"] + len(val_docs) + 1  # EOS d1 EOS d2 ... EOS
    x, y = next(task.train_batches(batch_size=4, seed=0))
    assert x.shape == y.shape == (4, 16) and torch.equal(x[:, 1:], y[:, :-1])  # packed next-token windows
    assert (x == 256).any()  # documents separated by EOS


def test_untrained_model_scores_about_eight_bits_per_byte(text_file):
    task = tasks.build("lm", data_files=text_file, seq_len=16)
    torch.manual_seed(0)
    spec = ArchSpec(vocab_size=task.vocab_size, d_model=16,
                    layers=(LayerSpec("gated_deltanet", {"num_heads": 2}), LayerSpec("softmax", {"num_heads": 2})))
    out = task.evaluate(HybridLM(spec), "cpu", batch_size=8)
    assert set(out) == set(task.metrics)
    assert 7.5 < out["bpb"] < 8.8 and math.isfinite(out["perplexity"])
    assert abs(out["perplexity"] - math.exp(out["loss"])) < 1e-6 * out["perplexity"]


def test_bpb_is_total_nats_over_bytes(text_file):
    task = tasks.build("lm", data_files=text_file, seq_len=16)
    out = task.evaluate(Uniform(257), "cpu")
    inputs, targets = task.val_windows()
    n_scored = int((targets != IGNORE).sum())
    assert n_scored == len(task.data["val"]) - 1  # every token after the first, once
    assert out["loss"] == pytest.approx(math.log(257), rel=1e-6)
    assert out["bpb"] == pytest.approx(n_scored * math.log(257) / (math.log(2) * task.data["val_bytes"]), rel=1e-6)


def test_val_windows_cover_the_stream_once(text_file):
    task = tasks.build("lm", data_files=text_file, seq_len=7)
    inputs, targets = task.val_windows()
    val = task.data["val"]
    assert np.array_equal(targets[targets != IGNORE], val[1:])
    assert np.array_equal(inputs[targets != IGNORE], val[:-1])


def test_json_and_parquet_files_with_a_text_field(tmp_path):
    import datasets

    rows = [{"body": p, "id": i} for i, p in enumerate(PARAGRAPHS)]
    jpath = tmp_path / "docs.jsonl"
    jpath.write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    ppath = tmp_path / "docs.parquet"
    datasets.Dataset.from_list(rows).to_parquet(str(ppath))
    j = tasks.build("lm", data_files=str(jpath), text_field="body", seq_len=16)
    q = tasks.build("lm", data_files=str(ppath), text_field="body", seq_len=16)
    assert np.array_equal(j.data["val"], q.data["val"]) and np.array_equal(j.data["train"], q.data["train"])
    with pytest.raises(UserError, match="lm.text_field: no column 'text' in the train data; columns: body, id"):
        tasks.build("lm", data_files=str(jpath), seq_len=16).data


def test_explicit_validation_split(tmp_path):
    tr, va = tmp_path / "train.txt", tmp_path / "val.txt"
    tr.write_text("\n\n".join(PARAGRAPHS[:30]), encoding="utf-8")
    va.write_text("\n\n".join(PARAGRAPHS[30:]), encoding="utf-8")
    task = tasks.build("lm", data_files={"train": str(tr), "validation": str(va)}, seq_len=8)
    assert task.data["val_bytes"] == sum(len(p.encode()) for p in PARAGRAPHS[30:])


def test_embedded_corpus_needs_no_download():
    task = tasks.build("lm", seq_len=64, max_eval_tokens=3000)
    data = task.data
    assert data["source"].startswith("embedded:pydoc_data.topics (python 3.")
    assert data["train_tokens"] > 300_000  # real text of some size
    assert 0 < len(data["val"]) <= 3000 + 1 and data["val_bytes"] > 0
    text = bytes(int(t) for t in data["train"][:50].reshape(-1) if t < 256).decode("utf-8", "replace")
    assert sum(w in text for w in (" the ", " of ", " a ")) >= 2  # English
    torch.manual_seed(0)
    spec = ArchSpec(vocab_size=257, d_model=16, layers=(LayerSpec("gla", {"num_heads": 2}),))
    out = task.evaluate(HybridLM(spec), "cpu", batch_size=16)
    assert 7.5 < out["bpb"] < 8.8
    again = tasks.build("lm", seq_len=64, max_eval_tokens=3000)
    assert np.array_equal(again.data["val"], data["val"])  # deterministic split


def test_train_batches_shard_windows_across_ranks(tmp_path):
    rng = np.random.default_rng(0)  # random letters: no two windows alike
    paras = ["".join(rng.choice(list("abcdefghij"), size=60)) for _ in range(30)]
    path = tmp_path / "random.txt"
    path.write_text("\n\n".join(paras), encoding="utf-8")
    task = tasks.build("lm", data_files=str(path), seq_len=8)
    n = len(task.data["train"])
    assert len({w.tobytes() for w in task.data["train"]}) == n
    parts = []
    for rank in range(2):
        x, y = next(task.train_batches(batch_size=n // 2, seed=4, rank=rank, world_size=2))  # one epoch
        parts.append({r.numpy().tobytes() for r in torch.cat([x, y[:, -1:]], 1)})
    assert len(parts[0]) == len(parts[1]) == n // 2 and not (parts[0] & parts[1])


def test_hash_split_is_deterministic_and_order_free():
    docs = [f"document {i}" for i in range(200)]
    train, val = hash_split(docs, 0.1)
    assert 5 < len(val) < 40 and len(train) + len(val) == 200
    t2, v2 = hash_split(list(reversed(docs)), 0.1)
    assert sorted(v2) == sorted(val)
    assert hash_split(["a", "b"], 0.01)[1]  # both sides non-empty


def test_missing_file_is_a_one_line_user_error(tmp_path):
    missing = tmp_path / "nope.txt"
    with pytest.raises(UserError) as err:
        tasks.build("lm", data_files=str(missing)).data
    assert str(err.value) == f"lm.data_files: no such file: {missing}"
    with pytest.raises(UserError, match="no file matches"):
        tasks.build("lm", data_files=str(tmp_path / "*.jsonl")).data


@pytest.mark.parametrize(
    "params, field",
    [
        ({"seq_len": 0}, "lm.seq_len"),
        ({"val_fraction": 1.0}, "lm.val_fraction"),
        ({"format": "csv"}, "lm.format"),
        ({"data_files": 3}, "lm.data_files"),
        ({"data_files": {"dev": "x.txt"}}, "lm.data_files"),
        ({"data_files": "a.txt", "dataset": "wikitext"}, "lm.data_files"),
        ({"max_eval_tokens": 0}, "lm.max_eval_tokens"),
        ({"corpus": "x"}, "lm.corpus: unknown parameter"),
    ],
)
def test_bad_params_name_the_parameter(params, field):
    with pytest.raises(UserError) as err:
        tasks.build("lm", **params)
    assert str(err.value).startswith(field)


def test_unknown_extension_asks_for_a_format(tmp_path):
    path = tmp_path / "corpus.dat"
    path.write_text("a\n\nb\n")
    with pytest.raises(UserError, match="lm.format: cannot tell the format"):
        tasks.build("lm", data_files=str(path)).data
    task = tasks.build("lm", data_files=str(path), format="text", seq_len=1)
    val = task.data["val"]
    assert bytes(val[1:-1].tolist()).decode().strip() in {"a", "b"} and val[0] == val[-1] == 256


@pytest.mark.skipif(importlib.util.find_spec("transformers") is not None, reason="transformers is installed")
def test_named_tokenizer_without_transformers_is_a_user_error():
    with pytest.raises(UserError, match="lm.tokenizer: 'gpt2' needs the transformers package"):
        tasks.build("lm", tokenizer="gpt2")


def test_unreachable_hub_dataset_is_a_one_line_user_error():
    import os
    import subprocess
    import sys

    code = ("from archsearch import tasks\n"
            "from archsearch.errors import UserError\n"
            "try:\n"
            "    tasks.build('lm', dataset='nobody/no-such-dataset').data\n"
            "except UserError as e:\n"
            "    print(e)\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.startswith("lm.dataset: cannot load 'nobody/no-such-dataset': "), out.stderr[-2000:]
    assert out.stdout.count("\n") == 1


def test_byte_tokenizer_round_trip():
    from archsearch.tasks.tokenizer import ByteTokenizer, get_tokenizer

    tok = get_tokenizer("byte")
    assert isinstance(tok, ByteTokenizer) and tok.vocab_size == 257 and tok.eos_id == 256
    text = "na\u00efve caf\u00e9 \u2014 \U0001f600"
    ids = tok.encode(text)
    assert ids.dtype == np.int64 and len(ids) == len(text.encode("utf-8")) and ids.max() < 256
    assert tok.decode([*ids.tolist(), 256]) == text  # EOS is dropped
    assert [len(a) for a in tok.encode_batch(["ab", "", "\u00e9"])] == [2, 0, 2]
