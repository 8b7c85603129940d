"""What a kind's encoder and decoder may ask of the walk that dispatches to them: two protocols, below both sides.

Each kind (:mod:`~skipweave.store.format.codec.tensors`, :mod:`~skipweave.store.format.codec.arrays`,
:mod:`~skipweave.store.format.codec.containers`, :mod:`~skipweave.store.format.codec.objects`,
:mod:`~skipweave.store.format.codec.pickled`) encodes and decodes its nodes with the help of the walk's state:
children go back through ``encode``/``decode``, tensors into the flat dict, aliases and cycles into shared tables.
The kinds are typed against :class:`EncodeWalk` and :class:`DecodeWalk`, not against
:class:`~skipweave.store.format.codec.encoder.Encoder` and :class:`~skipweave.store.format.codec.decoder.Decoder`,
which import the kinds to dispatch to them: typed against those, each kind imported the module that dispatches to it
(an import circle of seven modules, issue 43). The two protocols extend what a host type may ask
(:class:`skipweave.store.hosts.NodeEncoder`, :class:`~skipweave.store.hosts.NodeDecoder`) by the walk's own state,
which only the codec's kinds touch. This module imports neither torch nor a kind.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from skipweave.store.hosts import NodeDecoder, NodeEncoder

if TYPE_CHECKING:
    from collections.abc import Mapping

    import torch

    from skipweave.store.format.tree import NodePath


class EncodeWalk(NodeEncoder, Protocol):
    """The state of one encode call, as a kind's encoder uses it.

    Attributes:
        allow_pickle: values the codec does not support may be pickled.
        pickled: set once any part of the value was pickled.
        by_id: ``id(original tensor or array) -> node``, so an object met twice is stored once (aliasing).
        keep: the originals of :attr:`by_id`, kept alive for the call so no id is reused.
        stack: ids of the containers on the current path (cycle detection; see :meth:`push`).
        version: the lowest codec version describing the nodes made so far (a kind raises it).
    """

    allow_pickle: bool
    pickled: bool
    by_id: dict[int, dict[str, Any]]
    keep: list[Any]
    stack: set[int]
    version: int

    def add(self, t: torch.Tensor) -> str:
        """Store a contiguous CPU tensor; returns its key (``"t<n>"``)."""
        ...

    def store_torch(self, t: torch.Tensor) -> tuple[str, str]:
        """``(key, storage mode)`` for a contiguous CPU tensor; the mode is ``"native"`` or ``"bytes"``."""
        ...

    def push(self, obj: Any, path: NodePath) -> int:
        """Enter a container; returns its id, to discard from :attr:`stack` when done (``CodecError`` on a cycle)."""
        ...


class DecodeWalk(NodeDecoder, Protocol):
    """The state of one decode call, as a kind's decoder uses it.

    Attributes:
        allow_pickle: pickled nodes may be loaded.
        cache: ``(kind, key) -> decoded tensor or array``, so a stored object met twice decodes as one (aliasing).
    """

    allow_pickle: bool
    cache: dict[tuple[str, str], Any]

    def raw(self, node: Mapping[str, Any], path: NodePath) -> torch.Tensor:
        """The stored tensor a node's ``"k"`` names (``CodecError`` if missing or not a tensor)."""
        ...


__all__ = ["DecodeWalk", "EncodeWalk"]
