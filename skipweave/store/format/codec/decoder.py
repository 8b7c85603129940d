"""Decoding: rebuilding an object from a tree and its tensors (:func:`decode`).

The tree is untrusted input. The :class:`Decoder` dispatches each node by its tag to its kind's decoder (or
to the registered host type of that kind, :mod:`skipweave.store.hosts`), resolves classes only under
:mod:`skipweave.store.classes`' rules, and turns any other exception into a :class:`CodecError` naming the
node's path.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection, Mapping
from typing import Any

import torch

import skipweave.store.format.codec.arrays as arrays
import skipweave.store.format.codec.containers as containers
import skipweave.store.format.codec.devices as devices
import skipweave.store.format.codec.objects as objects
import skipweave.store.format.codec.pickled as pickled
import skipweave.store.format.codec.scalars as scalars
import skipweave.store.format.codec.tensors as tensors
from skipweave.store import classes
from skipweave.store.classes import class_ref
from skipweave.store.format.tree import CodecError, NodePath, check_root, path_text
from skipweave.store.hosts import HostType, host_for_kind


class Decoder:
    """The state of one :func:`decode` call; the kinds' decoders receive it (it is a
    :class:`skipweave.store.hosts.NodeDecoder` for host types).

    Args:
        tensors: the stored tensors by key.
        allow_pickle: allow unpickling entries recorded with ``allow_pickle=True``.
        trusted: refs the user approved (``skip.<role>.trusted_classes``).
    """

    def __init__(self, tensors: Mapping[str, torch.Tensor], allow_pickle: bool, trusted: Collection[str]) -> None:
        self.tensors = tensors
        self.allow_pickle = allow_pickle
        self.trusted = frozenset((trusted,) if isinstance(trusted, str) else trusted)  # a lone str is one ref
        self.cache: dict[tuple[str, str], Any] = {}  # (kind, key) -> decoded tensor/array (aliasing)
        self.kinds = _DECODERS  # node tag -> decoder of the codec's own kinds (a subclass may replace some)

    def raw(self, node: Mapping[str, Any], path: NodePath) -> torch.Tensor:
        """The stored tensor a node's ``"k"`` names (``CodecError`` if missing or not a tensor)."""
        key = node.get("k")
        if not isinstance(key, str) or key not in self.tensors:
            raise CodecError(f"{path_text(path)}: tensor entry {key!r} is missing from the stored tensors")
        t = self.tensors[key]
        if not isinstance(t, torch.Tensor):
            raise CodecError(f"{path_text(path)}: stored entry {key!r} is a {class_ref(type(t))}, not a tensor")
        return t

    def resolve(self, ref: Any, kind: str, path: NodePath) -> type:
        """The class a node names, under :mod:`skipweave.store.classes`' rules (never imports unless trusted).

        Raises:
            CodecError: the class may not be constructed here; the message starts with the node's path.
        """
        try:
            return classes.resolve(ref, kind, trusted=self.trusted)
        except CodecError as exc:
            raise CodecError(f"{path_text(path) or '<root>'}: {exc}") from None

    def device(self, recorded: Any) -> str | None:
        """The device to build a host container on (see :func:`skipweave.store.format.codec.devices.build_device`)."""
        return devices.build_device(recorded)

    def host_decoder(self, host: HostType) -> Callable[[Any, Mapping[str, Any], NodePath], Any]:
        """The decoder of a registered host type's nodes: its own (a subclass may decode them otherwise, see
        :mod:`skipweave.store.format.codec.view`)."""
        return host.decode

    def decode(self, node: Any, path: NodePath) -> Any:
        """The object of ``node``.

        Raises:
            PickleRefused: a pickled node and ``allow_pickle`` is False.
            CodecError: anything else wrong with the node; the message names ``path``.
        """
        if (type(node) is not dict and not isinstance(node, Mapping)) or "t" not in node:
            raise CodecError(f"{path_text(path)}: malformed codec node {node!r:.200}")
        tag = node["t"]
        try:
            fn = self.kinds[tag]
        except (KeyError, TypeError):
            host = host_for_kind(tag) if type(tag) is str else None
            if host is None:
                raise CodecError(f"{path_text(path)}: unknown codec node type {tag!r:.100}") from None
            fn = self.host_decoder(host)
        try:
            return fn(self, node, path)
        except (CodecError, RecursionError):
            raise  # RecursionError: turned into a CodecError once, at the top (formatting here could recurse)
        except Exception as exc:
            raise CodecError(f"{path_text(path)}: cannot decode {tag!r} node: {type(exc).__name__}: {exc}") from exc


_DECODERS: dict[str, Callable[[Decoder, Mapping[str, Any], NodePath], Any]] = {
    **scalars.DECODERS,
    **tensors.DECODERS,
    **arrays.DECODERS,
    **pickled.DECODERS,
    **containers.DECODERS,
    **objects.DECODERS,
}
"""Node tag -> decoder, for every kind the codec itself holds (host kinds come from the registry)."""


def decode(
    tree: dict[str, Any],
    tensors: Mapping[str, torch.Tensor],
    *,
    allow_pickle: bool = False,
    root_name: str = "obj",
    trusted: Collection[str] = (),
) -> Any:
    """Rebuild the object encoded by :func:`skipweave.store.format.codec.encode`.

    The tree is untrusted input: decoding imports no module and constructs only the classes
    :mod:`skipweave.store.classes` allows (see *Decoding constructs* in :mod:`skipweave.store.format.codec`). Tensors
    are moved to their recorded device when it exists here, otherwise they stay on CPU and a warning is logged
    once per device. Tensor data is not copied when the device is CPU.

    Args:
        tree: ``Encoded.tree`` (possibly after a JSON round trip).
        tensors: ``Encoded.tensors`` or the dict returned by ``safetensors.torch.load_file``.
        allow_pickle: allow unpickling entries that were recorded with ``allow_pickle=True``.
        root_name: name used as the start of paths in error messages.
        trusted: ``"module:qualname"`` refs the user approved (``skip.<role>.trusted_classes``): their modules
            may be imported and they skip the approval and data-only rules.

    Returns:
        The decoded object.

    Raises:
        PickleRefused: the tree contains a pickled entry and ``allow_pickle`` is False.
        CodecError: unknown ``codec_version``, malformed tree, missing tensor, nesting beyond the recursion
            limit, or a class (dataclass, enum, namedtuple, host type) that is not imported here, not
            approved, or whose fields differ from the recorded ones; the message names the path.
    """
    root = check_root(tree)
    try:
        return Decoder(tensors, allow_pickle, trusted).decode(root, root_name)
    except RecursionError:
        raise CodecError(
            f"{root_name}: the tree is nested too deeply to decode (beyond Python's recursion limit of "
            f"{sys.getrecursionlimit()})"
        ) from None
