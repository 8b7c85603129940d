"""``decode_view``: a recording read without any of its classes (what ``skipweave diff`` compares): classes stay names,
their recorded fields are kept, nothing is imported or constructed.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import sys
from typing import Any, NamedTuple

import numpy as np
import pytest
import torch

from skipweave.store.format.codec import CodecError, decode_view, encode
from skipweave.store.format.codec.view import RecordedEnum, RecordedObject
from skipweave.verify.compare import compare


@dataclasses.dataclass
class Rollout:
    responses: torch.Tensor
    meta: dict[str, Any]


@dataclasses.dataclass
class Other:
    responses: torch.Tensor
    meta: dict[str, Any]


class Pair(NamedTuple):
    left: int
    right: float


class Color(enum.Enum):
    RED = 1
    BLUE = 2


class Batch:
    """DataProto-shaped, of the host's own: a ``dataproto`` node."""

    def __init__(self, batch: dict[str, Any], meta_info: dict[str, Any]) -> None:
        self.batch, self.non_tensor_batch, self.meta_info = batch, {"uid": np.array(["a", "b"], dtype=object)}, \
            meta_info


def view(obj: Any, rename: dict[str, str] | None = None) -> Any:
    """``obj`` encoded, through JSON (as on disk), decoded as a view; ``rename`` rewrites class names in the tree."""
    import skipweave.integrations.verl.hosts  # noqa: F401 - the DataProto host type, as the CLI loads it

    encoded = encode(obj)
    text = json.dumps(encoded.tree)
    for old, new in (rename or {}).items():
        text = text.replace(old, new)
    return decode_view(json.loads(text), encoded.tensors)


def test_classes_are_names_and_their_recorded_fields_a_read_only_mapping() -> None:
    got = view(Rollout(torch.arange(4), {"step": 1}))
    assert isinstance(got, RecordedObject) and dict(got).keys() == {"responses", "meta"}
    assert got.ref == f"{__name__}:Rollout" and type(got).__qualname__ == "Rollout"
    assert type(got).__module__ == __name__
    assert torch.equal(got["responses"], torch.arange(4)) and got["meta"] == {"step": 1}
    assert type(view(Rollout(torch.zeros(1), {}))) is type(got)  # one view type per recorded class
    with pytest.raises(TypeError):
        got["meta"] = {}  # type: ignore[index]


def test_a_class_this_process_never_imported_is_read_and_never_imported() -> None:
    got = view(Rollout(torch.arange(3), {"step": 2}), rename={f"{__name__}:Rollout": "not_a_module_xyz:Batch"})
    assert "not_a_module_xyz" not in sys.modules
    assert got.ref == "not_a_module_xyz:Batch" and torch.equal(got["responses"], torch.arange(3))


def test_views_compare_by_class_name_and_fields() -> None:
    a = view(Rollout(torch.arange(4), {"step": 1}))
    assert compare(a, view(Rollout(torch.arange(4), {"step": 1}))).status == "identical"
    changed = compare(a, view(Rollout(torch.tensor([0, 1, 7, 3]), {"step": 1})))
    assert changed.first is not None and (changed.first.path, changed.first.detail["first_index"]) == (
        "responses", [2])
    renamed = compare(a, view(Other(torch.arange(4), {"step": 1})))
    assert renamed.first is not None and renamed.first.kind == "type"
    assert renamed.first.detail == {"recorded": f"{__name__}.Rollout", "live": f"{__name__}.Other"}
    fewer = view(Rollout(torch.arange(4), {}), rename={'"meta"': '"metadata"'})
    assert compare(a, fewer).first.kind == "keys"  # type: ignore[union-attr]


def test_host_objects_namedtuples_and_enums() -> None:
    batch = view(Batch({"responses": torch.arange(6).reshape(2, 3)}, {"timing": {"gen": 0.5}, "step": 1}))
    assert batch.kind == "dataproto" and list(batch) == ["batch", "non_tensor_batch", "meta_info"]
    other = view(Batch({"responses": torch.arange(6).reshape(2, 3)}, {"timing": {"gen": 0.9}, "step": 1}))
    out = compare(batch, other)
    assert out.first is not None and out.first.path == "meta_info.timing.gen"  # the paths a verify run names
    pair = view(Pair(1, 0.5))
    assert dict(pair) == {"left": 1, "right": 0.5} and pair.kind == "namedtuple"
    red = view({"c": Color.RED})["c"]
    assert isinstance(red, RecordedEnum) and red == view(Color.RED) and repr(red) == "Color.RED"
    assert compare({"c": red}, {"c": view(Color.BLUE)}).first.detail == {  # type: ignore[union-attr]
        "recorded": "Color.RED", "live": "Color.BLUE"}


def test_a_tensordict_keeps_its_keys_and_batch_size() -> None:
    from tensordict import TensorDict

    from skipweave.integrations.discovery import load_integrations

    load_integrations()  # the host type, as the CLI loads it (the test session has loaded it already)

    got = view(TensorDict({"responses": torch.arange(6).reshape(2, 3)}, batch_size=[2]))
    assert list(got) == ["responses"] and got.batch_size == [2]
    flat = view(TensorDict({"responses": torch.arange(6).reshape(2, 3)}, batch_size=[]))
    assert compare(got, flat).first.kind == "shape"  # type: ignore[union-attr]


def test_a_malformed_class_reference_is_a_codec_error() -> None:
    with pytest.raises(CodecError, match="malformed class reference"):
        view(Rollout(torch.arange(1), {}), rename={f"{__name__}:Rollout": "x" * 600})
