"""Decoding names no code (issue 13): crafted trees passed straight to ``codec.decode`` cannot import, construct
or collect anything a recording names beyond what :mod:`skipweave.store.classes` allows.

Every tree here is self-consistent (well-formed nodes, the tensors it names present), so a refusal comes from the
trust rules, not from a malformed tree; each test fails on a decoder that imports ``cls`` modules
(``importlib.import_module``) or sets whatever attributes a node lists.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import gc
import json
import logging
import re
import sys
import textwrap
import time
import types
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest
import torch

from skipweave.store import classes
from skipweave.store.format.codec import CodecError, class_ref, decode, encode

# --------------------------------------------------------------------------------------------------------
# module-level helper types (this module is imported, so its classes can be found without importing)


@dataclasses.dataclass
class Point:
    x: float
    y: float


class Shade(enum.Enum):
    DARK = 1
    LIGHT = 2


class Pair(NamedTuple):
    left: Any
    right: Any


FINALIZED: list[Any] = []


@dataclasses.dataclass
class Closer:
    """A dataclass with a finalizer acting on a field: refused unless trusted."""

    name: str

    def __del__(self) -> None:
        FINALIZED.append(self.name)


class ApprovedProto:
    """A DataProto-like host class, registered below as a host library registers its own."""

    def __init__(self) -> None:
        self.batch: Any = None
        self.non_tensor_batch: dict[str, Any] = {}
        self.meta_info: dict[str, Any] = {}

    @property
    def size(self) -> int:
        return 0

    @size.setter
    def size(self, value: int) -> None:  # a property setter is class code: a recording must not reach it
        raise AssertionError("decoding ran a property setter")


class UnapprovedProto:
    """DataProto-shaped, never registered."""

    def __init__(self) -> None:
        self.batch: Any = {"x": torch.arange(3)}
        self.non_tensor_batch: dict[str, Any] = {}
        self.meta_info: dict[str, Any] = {"step": 1}


class TrustedProto(UnapprovedProto):
    """DataProto-shaped, never registered, trusted by the recording role."""


classes.register(class_ref(ApprovedProto), "dataproto")

META_ASKED: list[str] = []


class Chatty(type):
    """A metaclass answering any attribute: checking a class for ``__dataclass_fields__`` must not ask it."""

    def __getattr__(cls, name: str) -> Any:
        META_ASKED.append(name)
        return {}


class Talker(metaclass=Chatty):
    pass


def tree_of(root: dict[str, Any]) -> dict[str, Any]:
    return {"codec_version": 1, "root": root}


def none() -> dict[str, Any]:
    return {"t": "none"}


def proto_node(ref: str, **extra: dict[str, Any]) -> dict[str, Any]:
    node: dict[str, Any] = {"t": "dataproto", "cls": ref, "batch": none(), "non_tensor_batch": none(),
                            "meta_info": none()}
    if extra:
        node["extra"] = extra
    return node


# --------------------------------------------------------------------------------------------------------
# no import


def _node_naming(kind: str, ref: str) -> dict[str, Any]:
    """A well-formed node of ``kind`` whose ``cls`` is ``ref``."""
    if kind == "dataclass":
        return {"t": "dataclass", "cls": ref, "v": {"x": {"t": "int", "v": 1}}}
    if kind == "enum":
        return {"t": "enum", "cls": ref, "name": "A"}
    if kind == "namedtuple":
        return {"t": "namedtuple", "cls": ref, "v": {"x": {"t": "int", "v": 1}}}
    if kind == "dataproto":
        return proto_node(ref)
    if kind == "tensordict":
        return {"t": "tensordict", "cls": ref, "batch_size": [], "device": None, "v": {}}
    return {"t": "nontensordata", "cls": ref, "batch_size": [], "device": None, "data": none()}


@pytest.fixture
def planted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Path]]:
    """A module file beside a relative dump dir (in the cwd and on sys.path) that leaves a file when imported."""
    name = f"sw_planted_{uuid.uuid4().hex[:10]}"
    marker = tmp_path / "imported.txt"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(f"""
        import dataclasses, enum, typing
        open({str(marker)!r}, "w").write("planted module ran")

        @dataclasses.dataclass
        class Thing:
            x: int

        class Kind(enum.Enum):
            A = 1
        """))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name, marker
    sys.modules.pop(name, None)


@pytest.mark.parametrize("kind", ["dataclass", "enum", "namedtuple", "dataproto", "tensordict", "nontensordata"])
def test_a_planted_module_named_by_a_node_is_not_imported(kind: str, planted: tuple[str, Path]) -> None:
    name, marker = planted
    ref = f"{name}:Kind" if kind == "enum" else f"{name}:Thing"
    with pytest.raises(CodecError, match=rf"obj: class '{name}:\w+' cannot be rebuilt: module '{name}' is not "
                                         "imported in this process"):
        decode(tree_of(_node_naming(kind, ref)), {})
    assert not marker.exists()
    assert name not in sys.modules


def test_a_nested_planted_ref_is_not_imported_either(planted: tuple[str, Path]) -> None:
    name, marker = planted
    tree = tree_of({"t": "list", "v": [{"t": "int", "v": 1}, _node_naming("dataclass", f"{name}.sub:Thing")]})
    with pytest.raises(CodecError, match=r"obj\[1\]: .*not imported"):
        decode(tree, {})
    assert not marker.exists() and name not in sys.modules


def test_a_dataclass_of_a_module_not_yet_imported_says_to_import_it_and_trust_imports_it(
    planted: tuple[str, Path]
) -> None:
    name, marker = planted
    ref = f"{name}:Thing"
    tree = tree_of(_node_naming("dataclass", ref))
    with pytest.raises(CodecError) as err:
        decode(tree, {})
    msg = str(err.value)
    assert f"import '{name}' before replaying" in msg and "skip.<role>.trusted_classes" in msg and ref in msg
    assert not marker.exists()
    out = decode(tree, {}, trusted=[ref])  # the user named it: its module may be imported
    assert marker.exists() and name in sys.modules
    assert type(out).__name__ == "Thing" and out.x == 1
    marker.unlink()
    assert decode(tree, {}).x == 1  # imported now: found without trust, not imported again
    assert not marker.exists()


def test_lookup_is_static_no_module_getattr_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    lazy = types.ModuleType("sw_lazy_mod")

    def module_getattr(attr: str) -> Any:  # a PEP 562 lazy loader: would import on attribute access
        calls.append(attr)
        return Point

    lazy.__getattr__ = module_getattr  # type: ignore[method-assign]
    monkeypatch.setitem(sys.modules, "sw_lazy_mod", lazy)
    assert lazy.Anything is Point and calls == ["Anything"]  # the hook is live
    calls.clear()
    with pytest.raises(CodecError, match="has no attribute path 'Lazy'"):
        decode(tree_of({"t": "dataclass", "cls": "sw_lazy_mod:Lazy", "v": {"x": none(), "y": none()}}), {})
    assert calls == []


def test_kind_checks_do_not_run_a_metaclass_getattr() -> None:
    META_ASKED.clear()
    with pytest.raises(CodecError, match="is not a dataclass"):
        decode(tree_of({"t": "dataclass", "cls": class_ref(Talker), "v": {}}), {})
    assert META_ASKED == []


def test_torch_names_from_a_tree_do_not_reach_torch_lazy_imports(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's module ``__getattr__`` imports submodules (``torch._dynamo``, ``torch.onnx``) on first access."""
    asked: list[str] = []

    def spy(name: str) -> Any:
        asked.append(name)
        raise AttributeError(name)

    monkeypatch.setattr(torch, "__getattr__", spy, raising=False)
    with pytest.raises(CodecError, match="unknown torch dtype 'onnx'"):
        decode(tree_of({"t": "torch_dtype", "v": "onnx"}), {})
    tensor = {"t": "tensor", "k": "t0", "dtype": "torch.float32", "shape": [2], "device": "hpu:0"}
    out = decode(tree_of(tensor), {"t0": torch.ones(2)})  # no hpu here: restored on CPU
    assert out.device.type == "cpu"
    assert asked == []


@pytest.mark.parametrize(
    "ref",
    ["no_colon", ":Point", "mod:", "a..b:X", "mod:<locals>.X", f"{__name__}:Point.__init__", "builtins:__class__",
     f"{__name__}:Point.__globals__", "mod:A-B", 5, None],
)
def test_malformed_refs_are_refused(ref: Any) -> None:
    with pytest.raises(CodecError, match="malformed class reference|is not a string"):
        decode(tree_of({"t": "dataclass", "cls": ref, "v": {}}), {})


# --------------------------------------------------------------------------------------------------------
# only approved classes, data only


def test_a_stdlib_finalizer_gadget_named_by_a_dataproto_node_is_refused(tmp_path: Path) -> None:
    # tempfile._TemporaryFileCloser.__del__ -> close() -> unlink(self.name) once self.file.close() returned:
    # a decoder setting arbitrary attributes on any class deleted this file when the object was collected.
    victim = tmp_path / "outside_the_store.txt"
    victim.write_text("precious")
    inner = proto_node("tempfile:_TemporaryFileCloser")
    outer = proto_node("tempfile:_TemporaryFileCloser", file=inner, name={"t": "str", "v": str(victim)},
                       delete={"t": "bool", "v": True})
    with pytest.raises(CodecError, match=r"'tempfile:_TemporaryFileCloser' is not approved to be rebuilt as a "
                                         r"DataProto-like object.*register.*trusted_classes"):
        decode(tree_of({"t": "dict", "v": {"result": outer}}), {})
    gc.collect()
    assert victim.read_text() == "precious"


@pytest.mark.parametrize("ref", ["subprocess:Popen", "weakref:finalize", "tempfile:_TemporaryFileCloser"])
@pytest.mark.parametrize("kind", ["dataclass", "namedtuple", "dataproto", "tensordict", "nontensordata"])
def test_stdlib_classes_are_refused_for_every_constructing_kind(ref: str, kind: str) -> None:
    import subprocess  # noqa: F401  (imported: the refusal must come from the kind rules)
    import tempfile  # noqa: F401
    import weakref  # noqa: F401

    with pytest.raises(CodecError, match=rf"obj: (class )?'{re.escape(ref)}' is not (a|an|approved)"):
        decode(tree_of(_node_naming(kind, ref)), {})


def test_a_dataclass_with_a_finalizer_is_refused_unless_trusted() -> None:
    FINALIZED.clear()
    ref = class_ref(Closer)
    tree = tree_of({"t": "dataclass", "cls": ref, "v": {"name": {"t": "str", "v": "from the file"}}})
    with pytest.raises(CodecError, match=rf"'{ref}' defines a finalizer \(__del__ in {ref}\)"):
        decode(tree, {})
    gc.collect()
    assert FINALIZED == []
    out = decode(tree, {}, trusted=[ref])
    assert type(out) is Closer and out.name == "from the file"
    del out
    gc.collect()
    assert FINALIZED == ["from the file"]


def test_recording_a_dataclass_with_a_finalizer_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="skipweave.store.format.codec"):
        encode([Closer("a"), Closer("b")])
        encode(Closer("c"))
    msgs = [r.getMessage() for r in caplog.records if class_ref(Closer) in r.getMessage()]
    assert len(msgs) == 1 and "a replay will refuse unless approved" in msgs[0] and "finalizer" in msgs[0]


def test_an_alias_is_not_followed_unless_trusted(monkeypatch: pytest.MonkeyPatch) -> None:
    alias_mod = types.ModuleType("sw_alias_mod")
    alias_mod.Alias = Point  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "sw_alias_mod", alias_mod)
    tree = tree_of({"t": "dataclass", "cls": "sw_alias_mod:Alias", "v": {"x": {"t": "int", "v": 1}, "y": none()}})
    with pytest.raises(CodecError, match=rf"names the class '{class_ref(Point)}' under another name"):
        decode(tree, {})
    assert decode(tree, {}, trusted=["sw_alias_mod:Alias"]) == Point(1, None)  # type: ignore[arg-type]


def test_a_class_approved_for_one_kind_is_refused_as_another() -> None:
    with pytest.raises(CodecError, match="is approved as 'dataproto', not as 'tensordict'"):
        decode(tree_of(_node_naming("tensordict", class_ref(ApprovedProto))), {})


def test_the_hosts_own_dataproto_like_class_round_trips_without_registration() -> None:
    """A trainer's own batch class (verl's shape) replays with zero configuration: imported, not stdlib, data only."""
    enc = encode(UnapprovedProto())
    out = decode(json.loads(json.dumps(enc.tree)), enc.tensors, root_name="result")
    assert type(out) is UnapprovedProto and torch.equal(out.batch["x"], torch.arange(3))
    assert out.meta_info == {"step": 1}


class FinalizingProto(UnapprovedProto):
    """DataProto-shaped, with a finalizer: it would act on recorded data when collected."""

    def __del__(self) -> None:  # pragma: no cover - must never run on decoded data
        pass


class PropertyProto:
    """DataProto-shaped, but ``meta_info`` is a property whose setter would run on recorded data."""

    def __init__(self) -> None:
        self.batch: Any = {}
        self.non_tensor_batch: dict[str, Any] = {}
        self._meta: dict[str, Any] = {}

    @property
    def meta_info(self) -> dict[str, Any]:
        return self._meta

    @meta_info.setter
    def meta_info(self, value: dict[str, Any]) -> None:  # pragma: no cover - must never run on decoded data
        raise AssertionError("decoding ran a property setter")


@pytest.mark.parametrize("cls,why", [(FinalizingProto, "defines a finalizer"), (PropertyProto, "property")])
def test_a_dataproto_like_class_that_could_act_is_refused_unless_trusted(
    cls: type, why: str, caplog: pytest.LogCaptureFixture,
) -> None:
    ref = class_ref(cls)
    with caplog.at_level(logging.WARNING, logger="skipweave.store.format.codec"):
        enc = encode(cls())
    assert any("a replay will refuse unless approved" in r.getMessage() and ref in r.getMessage()
               for r in caplog.records)
    tree = json.loads(json.dumps(enc.tree))
    with pytest.raises(CodecError, match=why) as err:
        decode(tree, enc.tensors, root_name="result")
    assert str(err.value).startswith("result: class") and "trusted_classes" in str(err.value)
    if cls is FinalizingProto:
        out = decode(tree, enc.tensors, trusted=[ref])
        assert type(out) is FinalizingProto


def test_recording_a_class_the_replay_trusts_does_not_warn(caplog: pytest.LogCaptureFixture) -> None:
    ref = class_ref(FinalizingProto)
    with caplog.at_level(logging.WARNING, logger="skipweave.store.format.codec"):
        enc = encode(FinalizingProto(), trusted=[ref])
    assert ref not in caplog.text
    assert type(decode(enc.tree, enc.tensors, trusted=[ref])) is FinalizingProto


def test_registering_is_checked() -> None:
    with pytest.raises(ValueError, match="kind must be one of"):
        classes.register(class_ref(Point), "dataclass")
    with pytest.raises(ValueError, match="malformed|expected"):
        classes.register("no_colon", "dataproto")
    with pytest.raises(ValueError, match="already registered as 'dataproto'"):
        classes.register(class_ref(ApprovedProto), "tensordict")
    classes.register(class_ref(ApprovedProto), "dataproto")  # same kind again: no-op
    assert classes.registered_kind("verl.protocol:DataProto") == "dataproto"
    assert classes.registered_kind("tensordict._td:TensorDict") == "tensordict"


# --------------------------------------------------------------------------------------------------------
# only declared fields / safe attribute names


@pytest.mark.parametrize(
    ("fields", "shown"),
    [
        ({"xx": 1, "y": 2}, "['xx', 'y']"),  # renamed
        ({"x": 1}, "['x']"),  # missing
        ({"x": 1, "y": 2, "z": 3}, "['x', 'y', 'z']"),  # extra
    ],
)
def test_dataclass_fields_must_match_the_class(fields: dict[str, int], shown: str) -> None:
    tree = tree_of({"t": "dataclass", "cls": class_ref(Point),
                    "v": {k: {"t": "int", "v": v} for k, v in fields.items()}})
    expected = f"obj: recorded fields {shown} do not match the class's fields ['x', 'y'] of '{class_ref(Point)}'"
    with pytest.raises(CodecError, match=re.escape(expected)):
        decode(tree, {})


def test_namedtuple_keys_must_equal_fields() -> None:
    tree = tree_of({"t": "namedtuple", "cls": class_ref(Pair), "v": {"left": none(), "other": none()}})
    with pytest.raises(CodecError, match=r"recorded fields \['left', 'other'\] do not match .*\['left', 'right'\]"):
        decode(tree, {})


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("__class__", "dunder"),
        ("__dict__", "dunder"),
        ("_ApprovedProto__x", None),  # single underscore: allowed (documented), an ordinary attribute
        ("size", "is a property of the class"),
        ("not-an-identifier", "not an identifier"),
    ],
)
def test_dataproto_extras_are_limited_to_plain_attribute_names(name: str, why: str | None) -> None:
    tree = tree_of(proto_node(class_ref(ApprovedProto), **{name: {"t": "int", "v": 1}}))
    if why is None:
        assert getattr(decode(tree, {}), name) == 1
        return
    with pytest.raises(CodecError, match=why):
        decode(tree, {})


def test_a_class_swap_through_extras_is_refused() -> None:
    tree = tree_of(proto_node(class_ref(ApprovedProto), __class__={"t": "int", "v": 1}))
    with pytest.raises(CodecError, match="'__class__' is a dunder"):
        decode(tree, {})


def test_encode_leaves_out_extras_decode_would_refuse() -> None:
    proto = ApprovedProto()
    proto.__dict__["__weird__"] = 1
    proto.__dict__["not an identifier"] = 2
    proto.note = "kept"  # type: ignore[attr-defined]
    enc = encode(proto)
    assert list(enc.tree["root"]["extra"]) == ["note"]
    assert decode(enc.tree, enc.tensors).note == "kept"


# --------------------------------------------------------------------------------------------------------
# round trips that must keep working


def test_enum_namedtuple_dataclass_and_registered_proto_round_trip() -> None:
    proto = ApprovedProto()
    proto.batch = {"ids": torch.arange(4)}
    proto.meta_info = {"shade": Shade.LIGHT, "pair": Pair(Point(1.0, 2.0), [Shade.DARK])}
    enc = encode(proto)
    out = decode(json.loads(json.dumps(enc.tree)), enc.tensors)
    assert type(out) is ApprovedProto and torch.equal(out.batch["ids"], torch.arange(4))
    assert out.meta_info["shade"] is Shade.LIGHT
    assert out.meta_info["pair"] == Pair(Point(1.0, 2.0), [Shade.DARK]) and type(out.meta_info["pair"]) is Pair


def test_unknown_enum_member_is_an_error() -> None:
    with pytest.raises(CodecError, match="has no member 'DIM'"):
        decode(tree_of({"t": "enum", "cls": class_ref(Shade), "name": "DIM"}), {})


def test_tensordict_stack_nodes_need_a_lazy_stack_class_and_tensordict_parts() -> None:
    import tensordict

    part = {"t": "tensordict", "cls": "tensordict._td:TensorDict", "batch_size": [], "device": None, "v": {}}
    flat = {"t": "tensordict", "cls": "tensordict._td:TensorDict", "batch_size": [1], "device": None,
            "stack_dim": 0, "stack": [part]}
    with pytest.raises(CodecError, match="is not a lazy stack"):
        decode(tree_of(flat), {})
    bad_parts = {**flat, "cls": class_ref(tensordict.LazyStackedTensorDict), "stack": [{"t": "str", "v": "/x"}]}
    with pytest.raises(CodecError, match=r"tensordicts\[0\]: a builtins:str cannot be stacked"):
        decode(tree_of(bad_parts), {})
    good = decode(tree_of({**flat, "cls": class_ref(tensordict.LazyStackedTensorDict)}), {})
    assert type(good) is tensordict.LazyStackedTensorDict


# --------------------------------------------------------------------------------------------------------
# other crafted trees


def test_object_array_item_count_is_checked_before_allocating() -> None:
    tree = tree_of({"t": "ndarray", "dtype": "|O", "shape": [10**6, 10**6], "items": []})
    t0 = time.perf_counter()
    with pytest.raises(CodecError, match=r"object array has 0 items, expected 1000000000000"):
        decode(tree, {})
    assert time.perf_counter() - t0 < 1.0


def test_a_crafted_string_width_is_refused() -> None:
    tree = tree_of({"t": "ndarray", "dtype": "<U100000000", "shape": [4], "items": ["a", "b", "c", "d"]})
    with pytest.raises(CodecError, match="refusing a crafted width"):
        decode(tree, {})
    small = decode(tree_of({"t": "ndarray", "dtype": "<U8", "shape": [2], "items": ["a", "bc"]}), {})
    assert small.dtype == np.dtype("<U8") and list(small) == ["a", "bc"]  # a padded small array is fine


@pytest.mark.parametrize("shape", [[-1], [2, -2], [1.5], ["3"], "3", [True]])
def test_shapes_must_be_lists_of_non_negative_ints(shape: Any) -> None:
    with pytest.raises(CodecError, match="is not a list of non-negative ints"):
        decode(tree_of({"t": "ndarray", "dtype": "|O", "shape": shape, "items": []}), {})


@pytest.mark.parametrize("dtype", ["|O", "i8,O", "O8"])
def test_raw_bytes_never_become_python_objects(dtype: str) -> None:
    raw = torch.zeros(16, dtype=torch.uint8)
    npscalar = tree_of({"t": "npscalar", "dtype": dtype, "b64": base64.b64encode(bytes(16)).decode()})
    with pytest.raises(CodecError, match="holds Python objects"):
        decode(npscalar, {})
    if np.dtype(dtype).kind != "O":  # an "|O" ndarray node takes the element-wise path, never raw bytes
        arr = tree_of({"t": "ndarray", "dtype": dtype, "shape": [1], "k": "t0", "storage": "bytes"})
        with pytest.raises(CodecError, match="holds Python objects"):
            decode(arr, {"t0": raw})


def test_a_non_string_dtype_is_refused() -> None:
    with pytest.raises(CodecError, match="is not a string"):
        decode(tree_of({"t": "npscalar", "dtype": [["a", "O"]], "b64": ""}), {})


def test_deep_nesting_is_a_codec_error_not_a_recursion_error() -> None:
    node: dict[str, Any] = {"t": "none"}
    for _ in range(50_000):
        node = {"t": "list", "v": [node]}
    with pytest.raises(CodecError, match="nested too deeply"):
        decode(tree_of(node), {})


@pytest.mark.parametrize(
    "root",
    [
        {"t": "dict", "kv": [[{"t": "list", "v": []}, none()]]},  # unhashable key
        {"t": {"x": 1}},  # unhashable tag
        {"t": "tensor", "k": "t0", "dtype": "torch.float32", "shape": [99]},  # shape does not fit the data
        {"t": "npscalar", "dtype": "<f8", "b64": "AA=="},  # too few bytes
        {"t": "dataclass", "cls": class_ref(Point), "v": [1, 2]},
        {"t": "dataproto", "cls": class_ref(ApprovedProto), "batch": none(), "non_tensor_batch": none(),
         "meta_info": none(), "extra": [1]},
    ],
)
def test_any_failure_inside_decode_is_a_codec_error(root: dict[str, Any]) -> None:
    with pytest.raises(CodecError):
        decode(tree_of(root), {"t0": torch.zeros(2)})


class Missing(enum.Enum):
    """An enum whose ``_missing_`` would run on a value a recording names."""

    A = 1

    @classmethod
    def _missing_(cls, value: object) -> Missing:  # pragma: no cover - must never run on decoded data
        raise AssertionError("decoding ran _missing_")


@dataclasses.dataclass
class Watching:
    """A dataclass reading its attributes through its own code."""

    x: int = 0

    def __getattribute__(self, name: str) -> Any:  # pragma: no cover - must never be built from a recording
        return object.__getattribute__(self, name)


def test_an_enum_value_is_looked_up_in_the_member_table_only() -> None:
    ref = class_ref(Missing)
    assert decode({"codec_version": 1, "root": {"t": "enum", "cls": ref, "value": {"t": "int", "v": 1}}}, {}) \
        is Missing.A
    with pytest.raises(CodecError, match="has no member of value"):
        decode({"codec_version": 1, "root": {"t": "enum", "cls": ref, "value": {"t": "str", "v": "x"}}}, {})


def test_a_dataclass_with_its_own_attribute_access_is_refused() -> None:
    tree = {"codec_version": 1, "root": {"t": "dataclass", "cls": class_ref(Watching),
                                          "v": {"x": {"t": "int", "v": 1}}}}
    with pytest.raises(CodecError, match="__getattribute__"):
        decode(tree, {})
    assert type(decode(tree, {}, trusted=[class_ref(Watching)])) is Watching
