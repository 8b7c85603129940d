"""Round-trip tests for skipweave.store.format.codec (real tensors, real safetensors files, no mocks)."""

from __future__ import annotations

import collections
import dataclasses
import enum
import json
import logging
import math
import struct
import sys
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from skipweave.store import classes
from skipweave.store.format.codec import CodecError, Encoded, PickleRefused, class_ref, decode, encode, summarize

# --------------------------------------------------------------------------------------------------------
# module-level helper types (decoding finds classes by "module:qualname" in modules already imported)


@dataclasses.dataclass
class DataProto:
    """Stand-in for verl's DataProto (a dataclass with batch / non_tensor_batch / meta_info)."""

    batch: Any = None
    non_tensor_batch: dict[str, Any] = dataclasses.field(default_factory=dict)
    meta_info: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        raise AssertionError("the codec must not call __init__/__post_init__ when decoding")


class PlainProto:
    """A non-dataclass DataProto-like object with extra attributes."""

    def __init__(self, batch: Any, non_tensor_batch: Any, meta_info: Any) -> None:
        self.batch = batch
        self.non_tensor_batch = non_tensor_batch
        self.meta_info = meta_info
        self.note = "kept"
        self.callback = lambda x: x  # not codec-supported: dropped silently


# Decoding rebuilds DataProto-like objects only of approved classes (a recording must not name any class and set
# attributes on it): these fakes are registered as a host library registers its own class. Dataclasses, enums
# and namedtuples below need no approval: this module is imported and they define no __del__.
for _proto_cls in (DataProto, PlainProto):
    classes.register(class_ref(_proto_cls), "dataproto")


@dataclasses.dataclass
class Point:
    x: float
    y: float
    tags: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Frozen:
    a: int
    inner: Point


@dataclasses.dataclass
class NoInit:
    a: int
    b: list[int] = dataclasses.field(default_factory=list, init=False)


class Color(enum.Enum):
    RED = "r"
    GREEN = "g"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Perm(enum.Flag):
    R = 1
    W = 2


class Pair(NamedTuple):
    left: Any
    right: Any


class Tag(str):
    """A str subclass: JSON would give back a plain str, so object arrays holding one are encoded element-wise."""


class Opaque:
    """Arbitrary class: needs pickle."""

    def __init__(self, v: int) -> None:
        self.v = v

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Opaque) and other.v == self.v

    __hash__ = None  # type: ignore[assignment]


# --------------------------------------------------------------------------------------------------------
# helpers


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().resolve_conj().resolve_neg().contiguous().reshape(-1).view(torch.uint8)


def assert_same(a: Any, b: Any, path: str = "") -> None:
    """Exact structural equality: same types everywhere, bitwise-equal tensors/arrays, same dict key order."""
    assert type(a) is type(b), f"{path}: {type(a)} != {type(b)}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and a.device == b.device, path
        assert torch.equal(_bits(a), _bits(b)), path
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, path
        if a.dtype.kind == "O":
            for i, (x, y) in enumerate(zip(a.flat, b.flat, strict=True)):
                assert_same(x, y, f"{path}.flat[{i}]")
        else:
            assert np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes(), path
    elif isinstance(a, np.generic):
        assert a.dtype == b.dtype and np.asarray(a).tobytes() == np.asarray(b).tobytes(), path
    elif isinstance(a, float):
        assert struct.pack("<d", a) == struct.pack("<d", b) or (math.isnan(a) and math.isnan(b)), path
    elif isinstance(a, complex):
        assert_same(a.real, b.real, f"{path}.real")
        assert_same(a.imag, b.imag, f"{path}.imag")
    elif isinstance(a, dict):
        assert list(a.keys()) == list(b.keys()), path
        for (ka, va), kb in zip(a.items(), b.keys(), strict=True):
            assert type(ka) is type(kb), f"{path}: key {ka!r}"
            assert_same(va, b[kb], f"{path}[{ka!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, (set, frozenset)):
        assert a == b, path
    elif dataclasses.is_dataclass(a) or hasattr(a, "meta_info"):
        assert_same(vars(a), vars(b), path)
    else:
        assert a == b, path


def via_file(enc: Encoded, tmp_path: Path, name: str = "x") -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Store an Encoded as JSON + safetensors and read it back."""
    (tmp_path / f"{name}.json").write_text(json.dumps(enc.tree, allow_nan=False))
    st = tmp_path / f"{name}.safetensors"
    save_file(enc.tensors, str(st))
    return json.loads((tmp_path / f"{name}.json").read_text()), load_file(str(st))


def roundtrip(obj: Any, tmp_path: Path, allow_pickle: bool = False) -> Any:
    """Round-trip through memory and through a real file; check both and return the file result."""
    enc = encode(obj, allow_pickle=allow_pickle)
    assert_same(obj, decode(enc.tree, enc.tensors, allow_pickle=allow_pickle), "memory")
    tree, tensors = via_file(enc, tmp_path)
    out = decode(tree, tensors, allow_pickle=allow_pickle)
    assert_same(obj, out, "file")
    return out


# --------------------------------------------------------------------------------------------------------
# tensors

ALL_TORCH_DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.complex128,
    torch.uint16,
    torch.uint32,
    torch.uint64,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
]


@pytest.mark.parametrize("dtype", ALL_TORCH_DTYPES, ids=str)
def test_tensor_every_dtype(dtype: torch.dtype, tmp_path: Path) -> None:
    base = torch.tensor([[0.0, 1.5, -2.0], [3.0, -0.0, 100.0]])
    if dtype == torch.bool:
        t = base > 0
    elif dtype.is_complex:
        t = torch.complex(base, -base).to(dtype)
    elif dtype in (torch.uint8, torch.uint16, torch.uint32, torch.uint64):
        t = base.abs().to(torch.int64).to(dtype)
    else:
        t = base.to(dtype)
    out = roundtrip({"t": t, "scalar": t[1, 2].clone()}, tmp_path)
    assert out["t"].dtype == dtype and out["scalar"].shape == torch.Size([])


def test_tensor_layouts_and_shared_storage(tmp_path: Path) -> None:
    x = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    obj = {
        "x": x,
        "transposed": x.T,  # non-contiguous view
        "strided": x[:, ::2],
        "row": x[1],  # contiguous view sharing x's storage
        "view": x.view(6, 4),  # same storage pointer as x
        "expanded": torch.tensor([1, 2, 3]).expand(4, 3),
        "zero_d": torch.tensor(7, dtype=torch.int64),
        "empty": torch.empty(0, 3, dtype=torch.bfloat16),
        "from_numpy": torch.from_numpy(np.arange(5, dtype=np.int32)),
        "conj": torch.tensor([1 + 2j]).conj(),
        "grad": torch.ones(2, requires_grad=True) * 2,
    }
    out = roundtrip(obj, tmp_path)
    assert not out["grad"].requires_grad  # documented: requires_grad is not preserved
    for name in ("transposed", "strided", "expanded"):
        assert torch.equal(out[name], obj[name])


def test_same_tensor_object_is_stored_once_and_decoded_aliased(tmp_path: Path) -> None:
    t = torch.arange(4)
    enc = encode([t, t, {"again": t}])
    assert len(enc.tensors) == 1
    tree, tensors = via_file(enc, tmp_path)
    out = decode(tree, tensors)
    assert out[0] is out[1] is out[2]["again"]
    assert torch.equal(out[0], t)


def test_encode_is_zero_copy_for_contiguous_cpu_data() -> None:
    t = torch.arange(1000, dtype=torch.float32)
    a = np.arange(1000, dtype=np.int64)
    enc = encode({"t": t, "a": a})
    ptrs = {v.data_ptr() for v in enc.tensors.values()}
    assert t.data_ptr() in ptrs
    assert a.ctypes.data in ptrs


def test_unavailable_device_restores_on_cpu_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    if torch.cuda.is_available() and torch.cuda.device_count() > 7:
        pytest.skip("cuda:7 exists here")
    enc = encode({"a": torch.ones(2), "b": torch.zeros(3)})
    tree = json.loads(json.dumps(enc.tree))
    for node in tree["root"]["v"].values():
        node["device"] = "cuda:7"
    with caplog.at_level(logging.WARNING, logger="skipweave.store.format.codec"):
        out = decode(tree, enc.tensors)
        out2 = decode(tree, enc.tensors)
    assert out["a"].device.type == "cpu" and out2["b"].device.type == "cpu"
    msgs = [r.getMessage() for r in caplog.records if "cuda:7" in r.getMessage()]
    assert len(msgs) == 1  # once per device per process ("cuda:7" is used by no other test)
    assert "recorded on cuda:7, not available here, restored on CPU" in msgs[0]


def test_recorded_device_string_is_kept() -> None:
    enc = encode(torch.ones(1))
    assert enc.tree["root"]["device"] == "cpu"


# --------------------------------------------------------------------------------------------------------
# numpy


NUMPY_ARRAYS = {
    "bool": np.array([True, False, True]),
    "int8": np.array([-1, 2], dtype=np.int8),
    "uint8": np.array([1, 255], dtype=np.uint8),
    "int16": np.array([-300, 2], dtype=np.int16),
    "uint16": np.array([1, 65535], dtype=np.uint16),
    "int32": np.array([-(2**31), 7], dtype=np.int32),
    "uint32": np.array([2**32 - 1, 0], dtype=np.uint32),
    "int64": np.array([-(2**63), 2**63 - 1], dtype=np.int64),
    "uint64": np.array([2**64 - 1, 3], dtype=np.uint64),
    "float16": np.array([0.5, -np.inf], dtype=np.float16),
    "float32": np.array([[1.5, np.nan], [-0.0, 3.0]], dtype=np.float32),
    "float64": np.linspace(0, 1, 7),
    "longdouble": np.array([1.25, 2.5], dtype=np.longdouble),
    "complex64": np.array([1 + 2j], dtype=np.complex64),
    "complex128": np.array([[1 - 2j, 3j]], dtype=np.complex128),
    "big_endian": np.array([1, 2, 3], dtype=">i4"),
    "datetime": np.array(["2024-01-02T03:04:05", "NaT"], dtype="datetime64[s]"),
    "timedelta": np.array([5, -1], dtype="timedelta64[ms]"),
    "unicode": np.array(["héllo", "", "x"]),
    "unicode_2d": np.array([["a", "bc"], ["def", "g"]]),
    "bytes": np.array([b"ab", b"", b"\x00x"]),
    "zero_d": np.array(3.5),
    "empty": np.zeros((0, 4), dtype=np.float32),
    "fortran": np.asfortranarray(np.arange(6, dtype=np.int16).reshape(2, 3)),
    "strided": np.arange(20, dtype=np.float64)[::3],
    "negative_stride": np.arange(5, dtype=np.int32)[::-1],
}


@pytest.mark.parametrize("name", list(NUMPY_ARRAYS))
def test_numpy_arrays(name: str, tmp_path: Path) -> None:
    arr = NUMPY_ARRAYS[name]
    out = roundtrip({"a": arr}, tmp_path)["a"]
    assert type(out) is np.ndarray and out.dtype == arr.dtype and out.shape == arr.shape
    if arr.dtype.kind not in "fcmM":
        assert np.array_equal(out, arr)
    else:
        assert np.array_equal(out, arr, equal_nan=True)


def test_read_only_array(tmp_path: Path) -> None:
    arr = np.arange(4, dtype=np.float32)
    arr.setflags(write=False)
    roundtrip(arr, tmp_path)


def test_object_arrays(tmp_path: Path) -> None:
    uid = np.array(["a-1", "b-2", "c-3"], dtype=object)
    mixed = np.empty(5, dtype=object)
    mixed[:] = [{"k": [1, 2]}, [3, (4, 5)], None, np.array([1.5, 2.5]), np.float32(2.0)]
    grid = np.empty((2, 3), dtype=object)
    for i in range(2):
        for j in range(3):
            grid[i, j] = f"cell{i}{j}" if j else {"i": i, "t": torch.tensor([i])}
    out = roundtrip({"uid": uid, "mixed": mixed, "grid": grid, "empty": np.empty((0,), dtype=object)}, tmp_path)
    assert out["grid"].shape == (2, 3) and out["grid"][1, 0]["i"] == 1
    assert isinstance(out["mixed"][1], list) and isinstance(out["mixed"][3], np.ndarray)


def _object_array(values: list[Any], shape: tuple[int, ...] | None = None) -> np.ndarray:
    """An object array holding ``values`` as they are (np.array would turn nested lists into dimensions)."""
    arr = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        arr[i] = v
    return arr.reshape(shape) if shape is not None else arr


def _array_node(tree: dict[str, Any], key: str) -> dict[str, Any]:
    node = tree["root"]["v"][key]
    assert node["t"] == "ndarray" and node["dtype"] == "|O"
    return node  # type: ignore[no-any-return]


def test_object_array_of_strings_is_one_json_list(tmp_path: Path) -> None:
    strs = ["", "a-1", "ünïcödé", "\U0001f600 emoji", "nul \x00 inside", "\ud800 lone surrogate", "x" * 10_000]
    obj = {
        "uid": _object_array(strs),
        "grid": _object_array([f"cell{i}" for i in range(6)], (2, 3)),
        "zero_d": _object_array(["only"], ()),
    }
    obj["transposed"] = obj["grid"].T  # not C-contiguous: elements stored in C order of the view
    enc = encode(obj)
    assert enc.tree["codec_version"] == 2
    uid = _array_node(enc.tree, "uid")
    assert uid == {"t": "ndarray", "dtype": "|O", "shape": [len(strs)], "strs": strs}
    grid = _array_node(enc.tree, "grid")
    assert grid["shape"] == [2, 3] and grid["strs"] == [f"cell{i}" for i in range(6)] and "items" not in grid
    out = roundtrip(obj, tmp_path)
    assert out["grid"][1, 0] == "cell3" and out["zero_d"].shape == () and out["zero_d"][()] == "only"
    assert _array_node(enc.tree, "transposed")["strs"][:2] == ["cell0", "cell3"]
    assert out["transposed"].shape == (3, 2) and out["transposed"][0, 1] == "cell3"
    assert all(type(x) is str for x in out["uid"]) and list(out["uid"]) == strs
    assert out["uid"].flags.writeable


def test_object_array_of_json_values_is_one_json_list(tmp_path: Path) -> None:
    # verl's raw_prompt: one list of chat messages per row; reward_model / extra_info: one small dict per row
    raw_prompt = _object_array(
        [[{"role": "system", "content": "be brief"}, {"role": "user", "content": f"q{i}"}] for i in range(3)]
    )
    extra_info = _object_array(
        [{"zeta": i, "alpha": f"a{i}", "mid": [i, None, True], "beta": {"z": 1.5, "a": -0.0}} for i in range(3)]
    )
    scalars = _object_array(
        [None, True, False, 0, 1, -(2**63), 2**63 - 1, 1.0, -0.0, 1e-310, 1 / 3, "s", [], {}, [[[]]]]
    )
    grid = _object_array([{"i": i} if i % 2 else [i] for i in range(4)], (2, 2))
    obj = {"raw_prompt": raw_prompt, "extra_info": extra_info, "scalars": scalars, "grid": grid}
    enc = encode(obj)
    assert enc.tree["codec_version"] == 2
    for key in obj:
        node = _array_node(enc.tree, key)
        assert "json" in node and "items" not in node and "strs" not in node, key
    assert _array_node(enc.tree, "raw_prompt")["json"][2][1] == {"role": "user", "content": "q2"}
    out = roundtrip(obj, tmp_path)  # exact: element types (bool is not int), values, -0.0, key order
    assert list(out["extra_info"][0]) == ["zeta", "alpha", "mid", "beta"]
    assert list(out["extra_info"][0]["beta"]) == ["z", "a"]
    assert [type(x) for x in out["scalars"][:5]] == [type(None), bool, bool, int, int]
    assert out["raw_prompt"].shape == (3,) and type(out["raw_prompt"][0]) is list
    assert out["grid"].shape == (2, 2) and out["grid"][0, 1] == {"i": 1}


@pytest.mark.parametrize(
    "odd",
    [
        pytest.param(Tag("sub"), id="str_subclass"),
        pytest.param({"pair": (1, 2)}, id="tuple_inside"),
        pytest.param([1.0, float("nan")], id="nan_inside"),
        pytest.param(float("inf"), id="inf"),
        pytest.param({1: "int key"}, id="non_str_key"),
        pytest.param(b"raw", id="bytes"),
        pytest.param(collections.OrderedDict([("b", 1), ("a", 2)]), id="dict_subclass"),
        pytest.param({"big": 2**64}, id="int_beyond_64_bits"),
        pytest.param(Level.HIGH, id="int_subclass"),
        pytest.param(np.str_("numpy str"), id="numpy_str"),
        pytest.param([np.float64(1.5)], id="float_subclass_inside"),
        pytest.param(torch.tensor([1, 2]), id="tensor"),
    ],
)
def test_object_arrays_that_json_cannot_hold_fall_back_element_wise(odd: Any, tmp_path: Path) -> None:
    arr = _object_array(["plain", {"k": ["v"]}, odd])
    enc = encode({"a": arr}, allow_pickle=True)
    node = _array_node(enc.tree, "a")
    assert "items" in node and "json" not in node and "strs" not in node
    assert enc.tree["codec_version"] == 1  # no compact node: version-1 readers can still read this tree
    out = roundtrip({"a": arr}, tmp_path, allow_pickle=True)["a"]
    assert type(out[2]) is type(odd)


def test_object_array_fallback_keeps_cycle_detection_and_deep_nesting(tmp_path: Path) -> None:
    cyclic: list[Any] = ["x"]
    cyclic.append(cyclic)
    with pytest.raises(CodecError, match="cycle"):
        encode({"a": _object_array(["ok", cyclic])})
    deep: list[Any] = []
    for _ in range(120):  # deeper than the plain-JSON check goes: stored element-wise, still exact
        deep = [deep]
    enc = encode({"a": _object_array([deep, "s"])})
    assert "items" in _array_node(enc.tree, "a")
    roundtrip({"a": _object_array([deep, "s"])}, tmp_path)


def test_empty_object_array_keeps_version_1(tmp_path: Path) -> None:
    obj = {"empty": np.empty((0,), dtype=object), "empty_2d": np.empty((3, 0), dtype=object)}
    enc = encode(obj)
    assert enc.tree["codec_version"] == 1 and _array_node(enc.tree, "empty")["items"] == []
    out = roundtrip(obj, tmp_path)
    assert out["empty_2d"].shape == (3, 0)


# A tree as skipweave wrote it before the compact forms (codec_version 1): one node per element.
OLD_TREE = """{"codec_version": 1, "root": {"t": "dict", "v": {
  "uid": {"t": "ndarray", "dtype": "|O", "shape": [2], "items": [{"t": "str", "v": "u0"}, {"t": "str", "v": ""}]},
  "grid": {"t": "ndarray", "dtype": "|O", "shape": [1, 2], "items": [{"t": "str", "v": "a"}, {"t": "none"}]},
  "extra_info": {"t": "ndarray", "dtype": "|O", "shape": [1], "items": [{"t": "dict", "v": {
      "zeta": {"t": "int", "v": 1}, "alpha": {"t": "list", "v": [{"t": "bool", "v": true}]}}}]}}}}"""


def test_version_1_tree_still_decodes() -> None:
    tree = json.loads(OLD_TREE)
    out = decode(tree, {})
    grid = np.empty((1, 2), dtype=object)
    grid[0, 0] = "a"
    assert_same(
        out,
        {
            "uid": _object_array(["u0", ""]),
            "grid": grid,
            "extra_info": _object_array([{"zeta": 1, "alpha": [True]}]),
        },
    )
    assert [r["kind"] for r in summarize(tree)] == ["ndarray"] * 3


def test_compact_form_with_wrong_length_is_an_error() -> None:
    enc = encode({"a": _object_array(["x", "y"])})
    tree = json.loads(json.dumps(enc.tree))
    tree["root"]["v"]["a"]["strs"].pop()
    with pytest.raises(CodecError, match=r"obj\['a'\].*1 elements, expected a list of 2"):
        decode(tree, {})


def test_dropped_dataproto_extra_does_not_raise_the_version() -> None:
    proto = PlainProto({"x": torch.ones(1)}, {}, {})
    proto.note = {"uid": _object_array(["a"]), "bad": Opaque(1)}  # type: ignore[assignment]  # dropped
    enc = encode(proto)
    assert "extra" not in enc.tree["root"] and enc.tree["codec_version"] == 1


def test_numpy_scalars(tmp_path: Path) -> None:
    values = [
        np.float32(1.5),
        np.float64(-0.0),
        np.float16(np.nan),
        np.int64(-(2**62)),
        np.uint8(255),
        np.bool_(True),
        np.complex64(1 - 1j),
        np.str_("hé"),
        np.bytes_(b"ab"),
        np.datetime64("2024-01-01", "D"),
        np.longdouble(1.125),
    ]
    out = roundtrip(values, tmp_path)
    assert [type(v) for v in out] == [type(v) for v in values]


# --------------------------------------------------------------------------------------------------------
# Python values, containers, dataclasses, enums


def test_python_scalars_and_containers(tmp_path: Path) -> None:
    obj: dict[Any, Any] = {
        "none": None,
        "bools": [True, False],
        "ints": (0, -1, 2**200, -(2**70), 2**63 - 1, -(2**63)),
        "floats": [0.0, -0.0, 1e-310, float("inf"), float("-inf"), float("nan"), 1 / 3],
        "complex": complex(1.5, float("nan")),
        "str": "ünïcödé \x00 \U0001f600",
        "bytes": b"\x00\xffabc",
        "bytearray": bytearray(b"xy"),
        "empty": [[], (), {}, set(), frozenset()],
        "set": {"b", "a", 3},
        "frozenset": frozenset({(1, 2), "x"}),
        "nested": [({"a": (1, [2, 3])},)],
        1: "int key",
        2.5: "float key",
        False: "bool key",
        None: "none key",
        (1, "a"): "tuple key",
        "z": "str key after others",
        "odict": collections.OrderedDict([("b", 1), ("a", 2)]),
        "torch_meta": [torch.Size([2, 3]), torch.bfloat16, torch.device("cuda:1")],
        "namedtuple": Pair(left=torch.ones(1), right=[1]),
    }
    tree = encode(obj).tree
    json.dumps(tree, allow_nan=False)  # no NaN/Infinity literals anywhere
    out = roundtrip(obj, tmp_path)
    assert list(out) == list(obj)
    assert type(out["odict"]) is collections.OrderedDict and type(out["namedtuple"]) is Pair
    assert [type(k) for k in out][12:14] == [int, float] and False in out and type(list(out)[14]) is bool


def test_dict_key_order_is_kept(tmp_path: Path) -> None:
    obj = {k: i for i, k in enumerate(["zeta", "alpha", "mid", "beta"])}
    assert list(roundtrip(obj, tmp_path)) == ["zeta", "alpha", "mid", "beta"]


def test_dataclasses_and_enums(tmp_path: Path) -> None:
    noinit = NoInit(a=1)
    noinit.b.append(5)
    obj = {
        "point": Point(1.0, -2.0, ("a", "b")),
        "frozen": Frozen(3, Point(0.5, 0.25)),
        "noinit": noinit,
        "enums": [Color.RED, Level.HIGH, Perm.R, Perm.R | Perm.W],
    }
    out = roundtrip(obj, tmp_path)
    assert out["frozen"] == obj["frozen"] and out["noinit"].b == [5]
    assert out["enums"][0] is Color.RED and out["enums"][1] is Level.HIGH
    assert out["enums"][3] == Perm.R | Perm.W


def test_local_class_is_rejected_at_encode() -> None:
    @dataclasses.dataclass
    class Local:
        a: int

    with pytest.raises(CodecError, match="inside a function"):
        encode({"x": Local(1)})


def test_decode_refuses_non_dataclass_and_unknown_class() -> None:
    enc = encode(Point(1.0, 2.0))
    tree = json.loads(json.dumps(enc.tree))
    tree["root"]["cls"] = "collections:OrderedDict"
    with pytest.raises(CodecError, match="not a dataclass"):
        decode(tree, enc.tensors)
    tree["root"]["cls"] = "no_such_module_skipweave:Thing"
    with pytest.raises(CodecError, match="no_such_module_skipweave"):
        decode(tree, enc.tensors)


def test_cycle_is_an_error() -> None:
    a: list[Any] = [1]
    a.append(a)
    with pytest.raises(CodecError, match="cycle"):
        encode(a)


# --------------------------------------------------------------------------------------------------------
# DataProto-like objects


def _make_proto() -> DataProto:
    proto = DataProto.__new__(DataProto)  # skip the raising __post_init__
    proto.batch = {
        "input_ids": torch.randint(0, 1000, (4, 16)),
        "attention_mask": torch.ones(4, 16, dtype=torch.bool),
        "old_log_probs": torch.randn(4, 16, dtype=torch.bfloat16),
    }
    proto.non_tensor_batch = {
        "uid": np.array(["u0", "u1", "u2", "u3"], dtype=object),
        "raw_prompt": np.array([[{"role": "user", "content": f"q{i}"}] for i in range(4)] + [None], dtype=object)[:4],
        "scores": np.array([0.1, 0.2, 0.3, 0.4]),
    }
    proto.meta_info = {"global_steps": 3, "timing": {"gen": 1.25}, "eos_token_id": [1, 2], "temperature": 1.0}
    return proto


def test_dataproto_roundtrip(tmp_path: Path) -> None:
    proto = _make_proto()
    out = roundtrip(proto, tmp_path)
    assert type(out) is DataProto
    assert torch.equal(out.batch["input_ids"], proto.batch["input_ids"])
    assert out.non_tensor_batch["raw_prompt"][2] == [{"role": "user", "content": "q2"}]


def test_dataproto_with_none_batch_and_plain_class(tmp_path: Path) -> None:
    empty = DataProto.__new__(DataProto)
    empty.batch, empty.non_tensor_batch, empty.meta_info = None, {}, {}
    assert roundtrip(empty, tmp_path).batch is None

    plain = PlainProto({"x": torch.arange(3)}, {"uid": np.array(["a"], dtype=object)}, {"k": 1})
    enc = encode(plain)
    tree, tensors = via_file(enc, tmp_path, "plain")
    out = decode(tree, tensors)
    assert type(out) is PlainProto and out.note == "kept" and not hasattr(out, "callback")
    assert torch.equal(out.batch["x"], plain.batch["x"])


def test_dataproto_unimportable_class_names_it() -> None:
    enc = encode(_make_proto())
    tree = json.loads(json.dumps(enc.tree))
    tree["root"]["cls"] = "gone_module_xyz:DataProto"
    with pytest.raises(CodecError, match="gone_module_xyz:DataProto"):
        decode(tree, enc.tensors)


def test_tensordict_batch(tmp_path: Path) -> None:
    import tensordict
    td = tensordict.TensorDict(
        {
            "input_ids": torch.arange(8).reshape(2, 4),
            "nested": tensordict.TensorDict({"a": torch.ones(2)}, [2]),
        },
        batch_size=[2],
    )
    proto = DataProto.__new__(DataProto)
    proto.batch, proto.non_tensor_batch, proto.meta_info = td, {}, {}
    enc = encode(proto)
    tree, tensors = via_file(enc, tmp_path)
    out = decode(tree, tensors)
    assert type(out.batch) is type(td) and list(out.batch.batch_size) == [2]
    assert torch.equal(out.batch["input_ids"], td["input_ids"])
    assert torch.equal(out.batch["nested", "a"], td["nested", "a"])
    assert summarize(tree)[0] == {
        "path": "batch['input_ids']",
        "kind": "tensor",
        "dtype": "torch.int64",
        "shape": [2, 4],
    }


def test_tensordict_non_tensor_data_and_lazy_stack(tmp_path: Path) -> None:
    import tensordict
    td = tensordict.TensorDict({"x": torch.ones(2, 3)}, batch_size=[2])
    td["note"] = "hello"
    stack = tensordict.LazyStackedTensorDict(
        tensordict.TensorDict({"a": torch.ones(2)}, []),
        tensordict.TensorDict({"a": torch.zeros(2)}, []),
        stack_dim=0,
    )
    enc = encode({"td": td, "stack": stack})
    tree, tensors = via_file(enc, tmp_path)
    out = decode(tree, tensors)
    assert out["td"]["note"] == "hello" and torch.equal(out["td"]["x"], td["x"])
    assert type(out["stack"]) is type(stack) and torch.equal(out["stack"]["a"], stack["a"])


def test_tensordict_missing_package_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # Make `import tensordict` fail as it does where the package is absent.
    for name in [m for m in sys.modules if m == "tensordict" or m.startswith("tensordict.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "tensordict", None)
    tree = {
        "codec_version": 1,
        "root": {
            "t": "tensordict",
            "cls": "tensordict._td:TensorDict",
            "batch_size": [1],
            "device": None,
            "v": {},
        },
    }
    with pytest.raises(CodecError, match="tensordict"):
        decode(tree, {})


def test_summarize_from_json_only() -> None:
    enc = encode(_make_proto())
    tree = json.loads(json.dumps(enc.tree))
    rows = {r["path"]: r for r in summarize(tree)}
    assert rows["batch['input_ids']"] == {
        "path": "batch['input_ids']",
        "kind": "tensor",
        "dtype": "torch.int64",
        "shape": [4, 16],
    }
    assert rows["batch['old_log_probs']"]["dtype"] == "torch.bfloat16"
    assert rows["non_tensor_batch['uid']"] == {
        "path": "non_tensor_batch['uid']",
        "kind": "ndarray",
        "dtype": "object",
        "shape": [4],
    }
    assert rows["non_tensor_batch['scores']"]["dtype"] == "float64"
    assert rows["meta_info['timing']['gen']"]["kind"] == "float"
    assert rows["meta_info['eos_token_id'][1]"]["kind"] == "int"


# --------------------------------------------------------------------------------------------------------
# pickle opt-in


def test_pickle_refused_on_encode_names_path_and_type() -> None:
    proto = _make_proto()
    proto.meta_info["obj"] = Opaque(3)
    with pytest.raises(PickleRefused) as err:
        encode(proto, root_name="result")
    msg = str(err.value)
    assert "result.meta_info['obj']" in msg
    assert "Opaque" in msg and "allow_pickle=true" in msg


def test_pickle_allowed_roundtrip_and_refused_on_decode(tmp_path: Path) -> None:
    obj: dict[str, Any] = {"opaque": Opaque(5), "t": torch.arange(3), "fn": math.sqrt}
    enc = encode(obj, allow_pickle=True)
    assert enc.pickled
    assert not encode({"t": torch.arange(3)}).pickled
    tree, tensors = via_file(enc, tmp_path)
    with pytest.raises(PickleRefused, match="recorded with allow_pickle=true"):
        decode(tree, tensors)
    out = decode(tree, tensors, allow_pickle=True)
    assert out["opaque"] == Opaque(5) and out["fn"] is math.sqrt
    assert torch.equal(out["t"], obj["t"])
    assert [r["kind"] for r in summarize(tree)] == ["pickle", "tensor", "pickle"]


def test_unknown_codec_version() -> None:
    enc = encode(1)
    with pytest.raises(CodecError, match="codec_version"):
        decode({**enc.tree, "codec_version": 99}, enc.tensors)
    with pytest.raises(CodecError):
        decode({"root": enc.tree["root"]}, enc.tensors)


def test_missing_tensor_is_an_error() -> None:
    enc = encode({"x": torch.ones(1)})
    with pytest.raises(CodecError, match="missing"):
        decode(enc.tree, {})


def test_a_strs_list_holding_other_values_is_refused() -> None:
    enc = encode(np.array(["a", "b"], dtype=object))
    tree = json.loads(json.dumps(enc.tree))
    tree["root"]["strs"] = ["a", 2]
    with pytest.raises(CodecError, match="not strings"):
        decode(tree, enc.tensors)


def test_read_only_and_non_native_arrays_round_trip() -> None:
    frozen = np.arange(6, dtype=np.int32).reshape(2, 3)
    frozen.flags.writeable = False  # torch.from_numpy would warn: the codec quiets it for read-only arrays only
    odd = np.arange(4, dtype=">i4")  # not native: stored as bytes
    odd.flags.writeable = False
    enc = encode({"frozen": frozen, "plain": np.arange(3), "odd": odd})
    out = decode(enc.tree, enc.tensors)
    assert np.array_equal(out["frozen"], frozen) and np.array_equal(out["odd"], odd) and out["odd"].dtype == odd.dtype
    assert np.array_equal(out["plain"], np.arange(3))


def test_error_paths_name_the_nested_node() -> None:
    # paths are built only when an error is raised: check they read as the eager ones did
    tree = encode({"a": [{(1, "k"): {"x": torch.arange(6).reshape(2, 3)}}], "b": 1}).tree
    tensor_node = tree["root"]["v"]["a"]["v"][0]["kv"][0][1]["v"]["x"]
    tensor_node["shape"] = [2, -3]
    with pytest.raises(CodecError, match=r"^res\['a'\]\[0\]\[\(1, 'k'\)\]\['x'\]: shape \[2, -3\] is not a list"):
        decode(tree, encode({"a": [{(1, "k"): {"x": torch.arange(6).reshape(2, 3)}}]}).tensors, root_name="res")
    tensor_node["shape"] = [4, 2]
    with pytest.raises(CodecError, match=r"^\['a'\]\[0\]\[\(1, 'k'\)\]\['x'\]: cannot decode 'tensor' node"):
        decode(tree, encode({"a": [{(1, "k"): {"x": torch.arange(6).reshape(2, 3)}}]}).tensors, root_name="")
    with pytest.raises(PickleRefused, match=r"cannot encode obj\['a'\]\.y\[1\] of type"):
        encode({"a": Point(1, [2, object()])})


def test_stored_shapes_are_restored_with_and_without_a_reshape() -> None:
    obj = {
        "flat": torch.arange(5),
        "matrix": torch.arange(6, dtype=torch.int32).reshape(2, 3),
        "scalar": torch.tensor(2.5),
        "u32": np.arange(6, dtype=np.uint32).reshape(3, 2),  # stored as raw bytes
        "u32_flat": np.arange(4, dtype=np.uint32),
        "c64": torch.ones(2, 2, dtype=torch.complex64),  # stored as raw bytes
        "i8": np.arange(3, dtype=np.int64),
        "empty": np.zeros((0, 3), dtype=np.float32),
    }
    enc = encode(obj)
    out = decode(json.loads(json.dumps(enc.tree)), enc.tensors)
    for name, value in obj.items():
        assert type(out[name]) is type(value), name
        assert out[name].dtype == value.dtype and tuple(out[name].shape) == tuple(value.shape), name
        if isinstance(value, torch.Tensor):
            assert torch.equal(out[name], value), name
        else:
            np.testing.assert_array_equal(out[name], value)
