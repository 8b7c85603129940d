"""Decoding a tree into a read-only view: every class a node names stays a name, and its recorded fields are kept.

:func:`decode` rebuilds a result's objects, which needs their classes: imported in this process and approved (see
*Decoding constructs* in :mod:`skipweave.store.format.codec`). Comparing two recordings needs neither: ``skipweave
diff`` reads both stores with :func:`decode_view`, so a store whose host classes this process cannot import (the
trainer's ``Batch`` defined in a package not on its path) is compared without ``--trust`` or ``PYTHONPATH``.

What a view holds, node by node:

- tensors, arrays, numbers, strings, bytes and the plain containers (dict, list, tuple, set): as :func:`decode` gives
  them (they name no class);
- a dataclass, namedtuple or host-type node (verl's ``DataProto`` shape, a ``TensorDict``): a
  :class:`RecordedObject`, a read-only mapping of its recorded fields whose type carries the recorded class's name
  (``type(view).__module__``, ``__qualname__``), so two views of the same class are of one type and views of
  different classes differ by type. Dataclass and namedtuple fields are keyed by name; a host type's by the children
  it lists (:attr:`skipweave.store.hosts.HostType.children`: ``.batch`` is ``batch``, ``['responses']`` is
  ``responses``, ``.tensordicts[0]`` item 0 of ``tensordicts``); a recorded ``batch_size`` (a ``TensorDict``'s) is
  kept as the view's ``batch_size``;
- an enum member: a :class:`RecordedEnum`, equal to another of the same class and member.

No class is looked up, imported or constructed but the view types of this module; a class name is data (checked for
type and size), never resolved. Pickled nodes are decoded (unpickled) only with ``allow_pickle``, as by
:func:`decode`.
"""

from __future__ import annotations

import ast
import re
import sys
import threading
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

import torch

from skipweave.store.format.codec.decoder import Decoder
from skipweave.store.format.tree import CodecError, NodePath, attr_label, check_root, path_text
from skipweave.store.hosts import HostType

MAX_REF_CHARS = 512
"""The longest class reference a view keeps (``module:qualname``); a longer one is a malformed tree."""


class RecordedObject(Mapping[str, Any]):
    """A recorded instance of a class this process does not rebuild: its recorded fields, read-only.

    Each recorded class gets a subclass of its own (:func:`view_type`) named as the class was (``__module__``,
    ``__qualname__``), so a comparison tells two classes apart by type and names them as the recording did.

    Attributes:
        ref: the recorded class, ``"module:qualname"`` (a class attribute of the view type).
        kind: the node kind it was recorded as (``dataclass``, ``namedtuple``, ``dataproto``, ``tensordict``, ...).
        batch_size: the recorded batch size (a ``TensorDict``'s), else ``None``.
    """

    ref: ClassVar[str] = ""

    def __init__(self, kind: str, fields: dict[str, Any], batch_size: list[int] | None = None) -> None:
        self.kind = kind
        self._fields = fields
        self.batch_size = batch_size

    def __getitem__(self, key: str) -> Any:
        return self._fields[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    def __repr__(self) -> str:
        return f"<recorded {self.ref} ({self.kind}): {', '.join(map(str, self._fields))}>"


class RecordedEnum:
    """A recorded enum member: its class (``ref``) and its member's name, or its value for a ``Flag`` combination
    without one. Equal to another of the same class and member; compared as one value."""

    __slots__ = ("member", "ref")

    def __init__(self, ref: str, member: Any) -> None:
        self.ref = ref
        self.member = member

    def __eq__(self, other: object) -> bool:
        return type(other) is RecordedEnum and (self.ref, self.member) == (other.ref, other.member)

    def __hash__(self) -> int:
        return hash((self.ref, repr(self.member)))

    def __repr__(self) -> str:
        return f"{self.ref.partition(':')[2] or self.ref}.{self.member}"


_types: dict[str, type[RecordedObject]] = {}
_types_lock = threading.Lock()


def view_type(ref: str) -> type[RecordedObject]:
    """The view type of the class ``ref`` (``"module:qualname"``): one per reference in this process, named as the
    class (``module``, ``qualname``). The name is data: nothing is looked up by it.

    Raises:
        CodecError: ``ref`` is not a string of 1 to :data:`MAX_REF_CHARS` characters.
    """
    if not isinstance(ref, str) or not 0 < len(ref) <= MAX_REF_CHARS:
        raise CodecError(f"malformed class reference {ref!r:.100} (a 'module:qualname' string of at most "
                         f"{MAX_REF_CHARS} characters)")
    with _types_lock:
        found = _types.get(ref)
        if found is None:
            module, _, qualname = ref.rpartition(":") if ":" in ref else ("", "", ref)
            name = qualname.rpartition(".")[2] or qualname
            found = _types[ref] = type(name, (RecordedObject,), {
                "__module__": module, "__qualname__": qualname, "__slots__": (), "ref": ref})
        return found


def _ref(node: Mapping[str, Any], default: str, path: NodePath) -> str:
    ref = node.get("cls") or default
    if not isinstance(ref, str) or not 0 < len(ref) <= MAX_REF_CHARS:
        raise CodecError(f"{path_text(path)}: malformed class reference {ref!r:.100}")
    return ref


def _fields(dec: Decoder, node: Mapping[str, Any], path: NodePath) -> dict[str, Any]:
    recorded = node["v"]
    if not isinstance(recorded, Mapping):
        raise CodecError(f"{path_text(path)}: fields are a {type(recorded).__name__}, not a mapping")
    return {str(k): dec.decode(v, (path, attr_label, k)) for k, v in recorded.items()}


def view_fields(dec: Decoder, node: Mapping[str, Any], path: NodePath) -> RecordedObject:
    """The view of a ``dataclass`` or ``namedtuple`` node: its fields by name."""
    kind = str(node["t"])
    return view_type(_ref(node, kind, path))(kind, _fields(dec, node, path))


def view_enum(dec: Decoder, node: Mapping[str, Any], path: NodePath) -> RecordedEnum:
    """The view of an ``enum`` node: its class and member name (or its value, for a ``Flag`` combination)."""
    ref = _ref(node, "enum", path)
    if "name" in node:
        if not isinstance(node["name"], str):
            raise CodecError(f"{path_text(path)}: enum member name {node['name']!r:.100} is not a string")
        return RecordedEnum(ref, node["name"])
    value = dec.decode(node["value"], (path, str, ".value"))
    try:
        hash(value)
    except TypeError:
        raise CodecError(f"{path_text(path)}: enum value {value!r:.100} is not hashable") from None
    return RecordedEnum(ref, value)


_ATTR = re.compile(r"\.([A-Za-z_]\w*)")
_ATTR_ITEM = re.compile(r"\.([A-Za-z_]\w*)\[(\d+)\]")
_KEY = re.compile(r"\[(.*)\]", re.DOTALL)
MAX_KEY_CHARS = 10_000
"""The longest key label (``['...']``) read back as a key; a longer one is kept as its text."""


def _child_key(label: str) -> tuple[str, int | None]:
    """The field a host type's child label names (``.batch``, ``['responses']``, ``.tensordicts[0]``: see
    :mod:`skipweave.store.format.tree`'s ``attr_label``, ``key_label``): ``(name, index or None)``; a label of
    another form is its own name."""
    if (m := _ATTR.fullmatch(label)) is not None:
        return m.group(1), None
    if (m := _ATTR_ITEM.fullmatch(label)) is not None:
        return m.group(1), int(m.group(2))
    if len(label) <= MAX_KEY_CHARS and (m := _KEY.fullmatch(label)) is not None:
        try:
            key = ast.literal_eval(m.group(1))  # a repr of a key: literals only, nothing runs
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return label, None
        return str(key), None
    return label, None


def view_host(host: HostType) -> Any:
    """The decoder of a host type's nodes as views: the children its ``children`` lists, by field."""

    def decode(dec: Decoder, node: Mapping[str, Any], path: NodePath) -> RecordedObject:
        fields: dict[str, Any] = {}
        for label, child in host.children(node):
            name, index = _child_key(str(label))
            value = dec.decode(child, (path, str, str(label)))
            if index is None:
                fields[name] = value
            else:
                items = fields.setdefault(name, [])
                if not isinstance(items, list) or index != len(items):
                    raise CodecError(f"{path_text(path)}: child {label!r:.100} is out of order")
                items.append(value)
        size = node.get("batch_size")
        batch_size = [int(x) for x in size] if isinstance(size, list) and all(
            type(x) is int for x in size) else None
        return view_type(_ref(node, host.kind, path))(host.kind, fields, batch_size)

    return decode


class ViewDecoder(Decoder):
    """A :class:`~skipweave.store.format.codec.decoder.Decoder` that keeps every class a node names as a name (see
    the module docstring)."""

    def __init__(self, tensors: Mapping[str, torch.Tensor], allow_pickle: bool) -> None:
        super().__init__(tensors, allow_pickle, ())
        self.kinds = {**self.kinds, "dataclass": view_fields, "namedtuple": view_fields, "enum": view_enum}

    def host_decoder(self, host: HostType) -> Any:
        return view_host(host)


def decode_view(tree: dict[str, Any], tensors: Mapping[str, torch.Tensor], *, allow_pickle: bool = False,
                root_name: str = "obj") -> Any:
    """The read-only view of the object :func:`~skipweave.store.format.codec.encode` encoded (see the module
    docstring): what :func:`~skipweave.store.format.codec.decode` gives, but every dataclass, namedtuple, enum and
    host object as a view of its recorded fields, whatever this process imports.

    Args:
        tree: ``Encoded.tree`` (possibly after a JSON round trip); untrusted.
        tensors: ``Encoded.tensors`` or the dict a tensor file is read into.
        allow_pickle: unpickle pickled nodes (else :class:`~skipweave.store.format.codec.PickleRefused`).
        root_name: the start of paths in error messages.

    Raises:
        PickleRefused: a pickled node and ``allow_pickle`` is False.
        CodecError: unknown ``codec_version`` or node kind (a host type no integration here registers), a malformed
            tree or class reference, a missing tensor, nesting beyond the recursion limit; the message names the path.
    """
    root = check_root(tree)
    try:
        return ViewDecoder(tensors, allow_pickle).decode(root, root_name)
    except RecursionError:
        raise CodecError(
            f"{root_name}: the tree is nested too deeply to decode (beyond Python's recursion limit of "
            f"{sys.getrecursionlimit()})"
        ) from None


__all__ = ["MAX_REF_CHARS", "RecordedEnum", "RecordedObject", "ViewDecoder", "decode_view", "view_type"]
