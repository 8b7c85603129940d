"""Host types: container classes of a host library that the codec stores as nodes of their own kind.

The store names no host. A trainer's results are often instances of its framework's containers (verl's
``DataProto``, tensordict's ``TensorDict``); an integration describes each such container as a
:class:`HostType` -- how to recognise an instance, how to encode and decode its node, which classes a replay
may rebuild as it, how to list its children for ``skipweave show``, how to hash it for an input
fingerprint, what of it a verify run compares and how ``skipweave export`` splits it into samples -- and adds it
to :data:`HOST_TYPES`. The codec (:mod:`skipweave.store.format.codec`), the class rules
(:mod:`skipweave.store.classes`), the tree summary (:mod:`skipweave.store.format.tree`), the input fingerprint
(:mod:`skipweave.weaving.fingerprint`), the comparison (:mod:`skipweave.verify.compare`) and the exporter
(:mod:`skipweave.export.samples`) read the registry; see docs/architecture.md.

A host type's ``kind`` is the node tag ``"t"`` written to disk and the class kind of
:func:`skipweave.store.classes.register`: it is part of the format and never changes once recordings exist.
Registration order matters where an object could match two host types: the first registered wins (the
shipped integrations register tensordict's types before verl's DataProto shape).

This module imports neither torch nor any host library, so the torch-free readers (``show``) may use it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from skipweave import hooks


class NodeEncoder(Protocol):
    """What a host type's encoder may ask of the codec's encoder.

    ``path`` arguments are :data:`skipweave.store.format.tree.NodePath` values naming the object in error messages.
    """

    allow_pickle: bool

    def encode(self, obj: Any, path: Any) -> dict[str, Any]:
        """Encode a child value (any supported type); raises ``CodecError``/``PickleRefused`` as ``encode``."""

    def class_ref(self, cls: type, path: Any, kind: str) -> str:
        """``"module:qualname"`` of ``cls`` for a node of ``kind``; refuses local classes (``CodecError``) and
        warns once per class that a replay here would refuse."""

    def encode_native(self, obj: Any, path: Any) -> dict[str, Any] | None:
        """Encode ``obj`` without pickle, or return None (leaving no trace) when it cannot be: for optional
        parts of a node, kept only if natively supported."""

    def encode_pickle(self, obj: Any, path: Any, reason: str | None = None) -> dict[str, Any]:
        """Pickle ``obj`` if allowed, else raise ``PickleRefused`` naming ``reason``."""


class NodeDecoder(Protocol):
    """What a host type's decoder may ask of the codec's decoder."""

    def decode(self, node: Any, path: Any) -> Any:
        """Decode a child node (untrusted input: every error is a ``CodecError`` naming the path)."""

    def resolve(self, ref: Any, kind: str, path: Any) -> type:
        """The class a node names, under :func:`skipweave.store.classes.resolve`'s rules (``CodecError``)."""

    def device(self, recorded: Any) -> str | None:
        """The device to build on for a recorded device string: the recorded one when available here,
        else ``"cpu"`` (with a warning logged once per device); None for None."""


class Samples(NamedTuple):
    """How a recorded host object splits into samples, for ``skipweave export`` (:mod:`skipweave.export`).

    Attributes:
        size: the number of samples (the host's batch size); every value of ``columns`` has this many items along
            its first axis.
        columns: per-sample fields by column name: tensors and numpy arrays of ``size`` rows, lists or tuples of
            ``size`` items, or mappings of such values (their keys joined to the name with ``.``).
        per_call: fields of the call as a whole (``meta_info``), by column name; each row repeats them. Mappings
            are joined with ``.`` as above (``meta_info.temperature``).
    """

    size: int
    columns: Mapping[str, Any]
    per_call: Mapping[str, Any]


class FingerprintParts(NamedTuple):
    """How an input fingerprint hashes a host object: ``opening`` tag and ``header`` text, then each named
    part (hashed as a child at that name, so ignore paths address it), then the ``closing`` tag.

    The tags are part of stored fingerprints: a host type keeps them once recordings exist.
    """

    opening: bytes
    header: str
    parts: Iterable[tuple[str, Any]]
    closing: bytes


class Compared(NamedTuple):
    """What a comparison (:func:`skipweave.verify.compare.compare`) compares of a host object: its ``fields`` by name,
    walked as a mapping's items (path ``<object>.<name>``), and its ``shape``, compared beside them as a whole.

    Attributes:
        fields: the object's fields by name (a mapping; read once per comparison).
        shape: what the object's shape is (a ``TensorDict``'s batch size: a sequence of ints, or an int), or None when
            it has none; a pair whose shapes differ diverges at the object's own path (kind ``shape``).
    """

    fields: Mapping[Any, Any]
    shape: Any = None


@dataclass(frozen=True, eq=False)
class HostType:
    """A host container the codec stores as a node of its own kind.

    Attributes:
        kind: the node tag and class kind (``"dataproto"``); fixed once recordings exist.
        label: what the objects are called in messages (``"DataProto-like object"``).
        matches: whether an object (never a class) is one of these; must import nothing and raise nothing.
        encode: ``(encoder, obj, path) -> node``; the node's ``"t"`` is ``kind``.
        decode: ``(decoder, node, path) -> obj`` for a node of ``kind`` (untrusted: check what you use).
        children: ``node -> ((path suffix, child node), ...)`` for the leaf summary; may raise
            ``KeyError``/``TypeError``/``AttributeError`` on a malformed node.
        approved: ``"module:qualname"`` refs a replay rebuilds without further checks (the host's own
            classes; users add theirs with :func:`skipweave.store.classes.register`).
        approved_note: how messages name ``approved`` (``"verl's DataProto"``); empty to leave them out.
        class_problem: for a class neither approved, registered nor trusted: why it may not be rebuilt as this
            kind, or None when its shape alone approves it. None (the attribute) approves registered classes only.
        shape_rule: for messages, which unregistered classes ``class_problem`` approves (``"DataProto-like
            classes of your own (...)"``); empty when the message should only point at registration.
        data_only: the decoder builds instances with ``object.__new__`` and sets attributes: a class defining
            ``__del__`` is refused unless registered or trusted, as for dataclasses.
        fingerprint: ``obj -> FingerprintParts``, or None to hash the object as what else it is (a dataclass,
            an object with attributes).
        samples: ``view -> Samples | None``: the sample axis of a recorded object, for ``skipweave export``. It gets
            the object's read-only view (:class:`skipweave.store.format.codec.view.RecordedObject`: a mapping of the
            fields ``children`` lists, by name, and ``batch_size``), never the rebuilt object, and returns None when
            the object has no sample axis (then it is one row per call). None (the attribute): the type has none.
        compared: ``obj -> Compared``: what a verify run or ``skipweave diff`` compares of an object of this type. Also
            given the read-only view of a recorded one (:class:`skipweave.store.format.codec.view.RecordedObject` of
            this ``kind``: a mapping of the children :attr:`children` lists, with the recorded ``batch_size``), so
            that a recording compares with another as the live objects would. None: the object is compared as what
            else it is (a dataclass by its fields, a mapping by its keys, another object by its public attributes).
    """

    kind: str
    label: str
    matches: Callable[[Any], bool]
    encode: Callable[[NodeEncoder, Any, Any], dict[str, Any]]
    decode: Callable[[NodeDecoder, Mapping[str, Any], Any], Any]
    children: Callable[[Mapping[str, Any]], Iterable[tuple[str, Any]]]
    approved: tuple[str, ...] = ()
    approved_note: str = ""
    class_problem: Callable[[type], str | None] | None = None
    shape_rule: str = ""
    data_only: bool = False
    fingerprint: Callable[[Any], FingerprintParts] | None = None
    samples: Callable[[Any], Samples | None] | None = None
    compared: Callable[[Any], Compared] | None = None


HOST_TYPES: hooks.Registry[HostType] = hooks.Registry("host type")
"""The host types the codec knows, in the order objects are tested against them."""


def host_of(obj: Any) -> HostType | None:
    """The first registered host type ``obj`` is an instance of, or None.

    Args:
        obj: any object (a class is never a host object).
    """
    for host in HOST_TYPES.items():
        if host.matches(obj):
            return host
    return None


def host_for_kind(kind: Any) -> HostType | None:
    """The registered host type whose node tag / class kind is ``kind`` (any value, from a file), or None."""
    for host in HOST_TYPES.items():
        if host.kind == kind:
            return host
    return None


def host_kinds() -> tuple[str, ...]:
    """The kinds of every registered host type, in registration order."""
    return tuple(host.kind for host in HOST_TYPES.items())


__all__ = ["HOST_TYPES", "Compared", "FingerprintParts", "HostType", "NodeDecoder", "NodeEncoder", "Samples",
           "host_for_kind",
           "host_kinds", "host_of"]
