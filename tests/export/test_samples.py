"""Where a recorded result's samples are (skipweave/export/samples.py), asked of views the codec really decodes, and
the pieces around it: decoded text (text.py), Arrow columns and schemas (sinks.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from skipweave.export.samples import split
from skipweave.export.sinks import ParquetSink, Rows, SchemaChanged, arrow_column, unify
from skipweave.export.text import decode_texts
from skipweave.store.format.codec import decode_view, encode


def view(obj: Any) -> Any:
    """``obj`` as an export reads it: encoded, then decoded as a view (no class rebuilt)."""
    encoded = encode(obj)
    return decode_view(encoded.tree, encoded.tensors)


class Proto:
    """verl's DataProto shape."""

    def __init__(self, batch: Any, non_tensor_batch: Any, meta_info: Any) -> None:
        self.batch = batch
        self.non_tensor_batch = non_tensor_batch
        self.meta_info = meta_info


@dataclasses.dataclass
class Scored:
    ids: list[list[int]]
    score: list[float]
    model: str


def test_a_dataproto_view_splits_by_its_batch_with_meta_info_per_call() -> None:
    got = split(view(Proto({"responses": torch.ones(3, 2, dtype=torch.long), "rewards": torch.zeros(3)},
                           {"uid": np.array(["a", "b", "c"], dtype=object), "rewards": np.array([1, 2, 3])},
                           {"global_steps": 4, "timing": {"gen": 0.5}})))
    assert got.count == 3
    assert list(got.columns) == ["responses", "rewards", "uid", "non_tensor_batch.rewards"]
    assert got.per_call == {"meta_info.global_steps": 4, "meta_info.timing.gen": 0.5}


def test_a_dataproto_with_a_tensordict_batch_or_only_non_tensor_columns() -> None:
    from tensordict import TensorDict

    td = TensorDict({"ids": torch.zeros(2, 5), "inner": TensorDict({"v": torch.ones(2)}, batch_size=[2])},
                    batch_size=[2])
    got = split(view(Proto(td, {}, {})))
    assert got.count == 2 and list(got.columns) == ["ids", "inner.v"] and got.per_call == {}
    got = split(view(Proto(None, {"uid": np.array(["x"], dtype=object)}, {"k": 1})))
    assert got.count == 1 and list(got.columns) == ["uid"] and got.per_call == {"meta_info.k": 1}
    got = split(view(Proto({}, {}, {"k": 1})))  # no row anywhere: one row for the call
    assert got.count is None and got.per_call == {"meta_info.k": 1}


def test_tensordicts_and_lazy_stacks() -> None:
    from tensordict import LazyStackedTensorDict, TensorDict

    got = split(view(TensorDict({"a": torch.arange(6).reshape(3, 2)}, batch_size=[3])))
    assert got.count == 3 and list(got.columns) == ["a"]
    stack = LazyStackedTensorDict(*[TensorDict({"x": torch.full((2,), float(i))}, batch_size=[]) for i in range(4)],
                                  stack_dim=0)
    got = split(view(stack))
    assert got.count == 4 and [t.tolist() for t in got.columns["x"]] == [[float(i)] * 2 for i in range(4)]
    got = split(view(TensorDict({"a": torch.zeros(2)}, batch_size=[])))  # no batch dimension: one row
    assert got.count is None and "a" in got.per_call


def test_plain_results() -> None:
    got = split(view({"prompt_ids": [[1, 2], [3]], "rewards": torch.tensor([0.5, 1.0]), "n": 7, "cfg": {"t": 1}}))
    assert got.count == 2 and list(got.columns) == ["prompt_ids", "rewards"]
    assert got.per_call == {"n": 7, "cfg.t": 1}
    got = split(view({"a": [1, 2, 3], "b": [1, 2]}))  # lengths differ: no axis
    assert got.count is None and set(got.per_call) == {"a", "b"}
    got = split(view([{"text": "x", "r": 1}, {"text": "y", "extra": True}]))  # records
    assert got.count == 2 and got.columns == {"text": ["x", "y"], "r": [1, None], "extra": [None, True]}
    got = split(view(([1, 2, 3], torch.zeros(3, 2))))  # a tuple of sequences of one length
    assert got.count == 3 and list(got.columns) == ["0", "1"]
    got = split(view(torch.arange(4)))
    assert got.count == 4 and list(got.columns) == ["result"]
    got = split(view(Scored([[1], [2, 3]], [0.1, 0.2], "m")))  # a dataclass view is a mapping of its fields
    assert got.count == 2 and list(got.columns) == ["ids", "score"] and got.per_call == {"model": "m"}
    for scalar in (1.5, "text", None, []):
        got = split(view(scalar))
        assert got.count is None and list(got.per_call) == ["result"]


class Words:
    """A stand-in tokenizer: ids joined as ``w<id>``."""

    def batch_decode(self, rows: list[list[int]], skip_special_tokens: bool = False) -> list[str]:
        assert skip_special_tokens is False
        return [" ".join(f"w{i}" for i in row) for row in rows]


def test_text_respects_verl_layout_own_masks_and_unpadded_lists() -> None:
    verl = {"prompts": torch.tensor([[0, 0, 5], [0, 6, 7]]), "responses": torch.tensor([[8, 2, 0], [9, 0, 0]]),
            "attention_mask": torch.tensor([[0, 0, 1, 1, 1, 0], [0, 1, 1, 1, 1, 0]]),  # a tool token masked in
            "response_mask": torch.tensor([[1, 1, 0], [1, 0, 0]])}                     # response_mask only
    assert decode_texts(Words(), verl, 2) == {"prompt_text": ["w5", "w6 w7"], "response_text": ["w8 w2", "w9 w0"]}
    del verl["attention_mask"]
    assert decode_texts(Words(), verl, 2)["response_text"] == ["w8 w2", "w9"]
    assert decode_texts(Words(), verl, 2)["prompt_text"] == ["w0 w0 w5", "w0 w6 w7"]  # no mask: every id
    trl = {"prompt_ids": torch.tensor([[0, 4], [3, 4]]), "prompt_mask": torch.tensor([[0, 1], [1, 1]]),
           "completion_ids": [[5], [6, 2]]}
    assert decode_texts(Words(), trl, 2) == {"prompt_text": ["w4", "w3 w4"], "response_text": ["w5", "w6 w2"]}
    assert decode_texts(Words(), {"other": [1, 2]}, 2) == {}


def test_arrow_columns_and_schemas(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    col = arrow_column(pa, torch.arange(12, dtype=torch.int32).reshape(2, 3, 2), 2, True)
    assert col.type == pa.list_(pa.list_(pa.int32())) and col.to_pylist()[1] == [[6, 7], [8, 9], [10, 11]]
    assert arrow_column(pa, torch.ones(2, dtype=torch.bfloat16), 2, True).type == pa.float32()
    mixed = arrow_column(pa, np.array(["a", [1]], dtype=object), 2, True)  # no common type: JSON text
    assert mixed.to_pylist() == ['"a"', "[1]"]
    assert arrow_column(pa, {"a": 1}, 3, False).to_pylist() == [{"a": 1}] * 3

    sink = ParquetSink(str(tmp_path / "x.parquet"))
    sink.write(Rows(2, [("a", True, [1, 2]), ("b", False, None)]))
    sink.write(Rows(1, [("a", True, [3])]))  # a missing column: nulls
    with pytest.raises(SchemaChanged, match="'b'"):
        sink.write(Rows(1, [("a", True, [4]), ("b", False, "text")]))  # null cannot take a string
    with pytest.raises(SchemaChanged, match=r"\['c'\]"):
        sink.write(Rows(1, [("a", True, [4]), ("c", False, 1)]))
    sink.abort()
    assert not list(tmp_path.iterdir())
    schema = unify(pa, [pa.schema([("a", pa.int64()), ("b", pa.null())]), pa.schema([("a", pa.float64()),
                                                                                     ("c", pa.string())])])
    assert schema.names == ["a", "b", "c"] and schema.field("a").type == pa.float64()
    with pytest.raises(SchemaChanged, match="no common type"):
        unify(pa, [pa.schema([("a", pa.int64())]), pa.schema([("a", pa.string())])])


def test_plain_values_are_json_ready() -> None:
    import json

    from skipweave.export.values import plain, rows_of

    days = np.array(["2026-12-01", "2026-12-02"], dtype="datetime64[D]")
    assert rows_of(days, 2) == ["2026-12-01", "2026-12-02"]
    assert plain(np.array([b"a", b"b"])) == ["YQ==", "Yg=="]
    assert plain({"x": torch.ones(2, dtype=torch.bfloat16), 3: np.float32(0.5), "s": {1, 2}}) == {
        "x": [1.0, 1.0], "3": 0.5, "s": [1, 2]}
    assert plain(np.array([[1, None]], dtype=object)) == [[1, None]]
    json.dumps([plain(v) for v in (days, torch.float16, 1 + 2j, torch.Size([2, 3]))])
