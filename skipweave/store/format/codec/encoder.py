"""Encoding: walking an object into a tree of nodes and a flat dict of tensors (:func:`encode`).

The :class:`Encoder` holds one call's state -- the tensors stored so far (no two sharing storage), the nodes
of tensors and arrays already met (aliases encode once), the containers on the current path (cycles are
refused), whether anything was pickled and the lowest codec version describing the tree -- and dispatches each
value to its kind's module. Host containers (a DataProto, a TensorDict) are encoded by the host type an
integration registered (:mod:`skipweave.store.hosts`).
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import enum
import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

import skipweave.store.format.codec.arrays as arrays
import skipweave.store.format.codec.containers as containers
import skipweave.store.format.codec.objects as objects
import skipweave.store.format.codec.pickled as pickled
import skipweave.store.format.codec.tensors as tensors
from skipweave.store import classes
from skipweave.store.classes import class_ref
from skipweave.store.format.codec.scalars import INT_JSON_LIMIT, float_node
from skipweave.store.format.tree import CodecError, NodePath, path_text
from skipweave.store.hosts import host_of

logger = logging.getLogger(__name__)

_CHECKED_CLASSES: set[tuple[type, str]] = set()  # (class, kind) the encoder has checked for replayability

_Snapshot = tuple[int, int, set[int], dict[int, dict[str, Any]], bool, int]


@dataclass
class Encoded:
    """The encoded form of an object.

    Attributes:
        tree: JSON-serialisable skeleton ``{"codec_version": v, "root": node}``, ``v`` being 1, or 2 when
            the tree holds a compact object array.
        tensors: flat ``name -> tensor`` mapping; each tensor is contiguous, on CPU and owns its storage
            relative to the other entries (ready for ``safetensors.torch.save_file``).
        pickled: True if any part of the object was pickled (only possible with ``allow_pickle=True``).
    """

    tree: dict[str, Any]
    tensors: dict[str, torch.Tensor]
    pickled: bool


class Encoder:
    """The state of one :func:`encode` call; the kinds' encoders receive it (it is a
    :class:`skipweave.store.hosts.NodeEncoder` for host types).

    Args:
        allow_pickle: pickle values the codec does not support instead of refusing them.
        trusted: refs the replay will trust: no replay warning for them.
    """

    def __init__(self, allow_pickle: bool, trusted: Collection[str] = ()) -> None:
        self.allow_pickle = allow_pickle
        self.trusted = frozenset((trusted,) if isinstance(trusted, str) else trusted)  # no replay warning for these
        self.tensors: dict[str, torch.Tensor] = {}
        self.pickled = False
        self._counter = 0
        self._storages: set[int] = set()  # untyped storage data_ptr of every stored tensor
        # id(original tensor/array) -> node, for aliasing; the originals are kept alive in ``keep`` so that
        # an id can never be reused by another (temporary) object during one encode call.
        self.by_id: dict[int, dict[str, Any]] = {}
        self.keep: list[Any] = []
        self.stack: set[int] = set()  # ids of containers on the current path (cycle detection)
        self.version = 1  # lowest codec version describing the nodes made so far

    # -- state snapshots, so a failed optional sub-encoding leaves no trace -------------------------------
    def _snapshot(self) -> _Snapshot:
        return self._counter, len(self.tensors), set(self._storages), dict(self.by_id), self.pickled, self.version

    def _rollback(self, snap: _Snapshot) -> None:
        counter, n_tensors, storages, by_id, pickled, version = snap
        for key in list(self.tensors)[n_tensors:]:
            del self.tensors[key]
        self._counter, self._storages, self.by_id, self.pickled = counter, storages, by_id, pickled
        self.version = version

    # -- tensor storage --------------------------------------------------------------------------------
    def add(self, t: torch.Tensor) -> str:
        """Store a contiguous CPU tensor, cloning it only if its storage is already used by another entry;
        returns its key (``"t<n>"``)."""
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if storage.nbytes() > 0 and ptr != 0:
            if ptr in self._storages:
                t = t.clone()
                ptr = t.untyped_storage().data_ptr()
            self._storages.add(ptr)
        key = f"t{self._counter}"
        self._counter += 1
        self.tensors[key] = t
        return key

    def store_torch(self, t: torch.Tensor) -> tuple[str, str]:
        """Return (key, storage mode) for a contiguous CPU tensor; mode is "native" or "bytes"."""
        if t.dtype in tensors.SAFE_TORCH_DTYPES:
            return self.add(t), "native"
        return self.add(t.reshape(-1).view(torch.uint8)), "bytes"

    # -- dispatch ---------------------------------------------------------------------------------------
    def encode(self, obj: Any, path: NodePath) -> dict[str, Any]:
        """The node of ``obj`` (any supported value).

        Raises:
            PickleRefused: ``obj`` (or a part) needs pickle and ``allow_pickle`` is False.
            CodecError: ``obj`` cannot be encoded at all; the message names ``path``.
        """
        tp = type(obj)
        fast = _FAST_ENCODERS.get(tp)  # the common exact types, without the checks below
        if fast is not None:
            return fast(self, obj, path)
        if obj is None:
            return {"t": "none"}
        if tp is bool:
            return {"t": "bool", "v": obj}
        if tp is int:
            if -INT_JSON_LIMIT <= obj < INT_JSON_LIMIT:
                return {"t": "int", "v": obj}
            return {"t": "int", "s": str(obj)}
        if tp is float:
            return float_node(obj)
        if tp is str:
            return {"t": "str", "v": obj}
        if tp is bytes or tp is bytearray:
            return {"t": tp.__name__, "b64": base64.b64encode(obj).decode("ascii")}
        if tp is complex:
            return {"t": "complex", "re": float_node(obj.real), "im": float_node(obj.imag)}
        if isinstance(obj, torch.Tensor):
            return tensors.encode_tensor(self, obj, path)
        if tp is np.ndarray:
            return arrays.encode_ndarray(self, obj, path)
        if isinstance(obj, np.generic) and obj.dtype.kind != "V":
            return arrays.encode_npscalar(obj)
        if isinstance(obj, enum.Enum):
            return objects.encode_enum(self, obj, path)
        if tp is torch.Size:
            return {"t": "torch_size", "v": [int(x) for x in obj]}
        if tp is torch.dtype:
            return {"t": "torch_dtype", "v": str(obj)}
        if tp is torch.device:
            return {"t": "torch_device", "v": str(obj)}
        if tp in (dict, collections.OrderedDict, list, tuple, set, frozenset):
            return self._guarded(obj, path, containers.encode_container)
        if objects.is_namedtuple(obj):
            return self._guarded(obj, path, objects.encode_namedtuple)
        host = host_of(obj)
        if host is not None:
            return self._guarded(obj, path, host.encode)
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            return self._guarded(obj, path, objects.encode_dataclass)
        return self.encode_pickle(obj, path)

    def push(self, obj: Any, path: NodePath) -> int:
        """Enter a container being encoded; returns its ``id``, to discard from :attr:`stack` when done.

        Raises:
            CodecError: the container is already on the path (a reference cycle).
        """
        oid = id(obj)
        if oid in self.stack:
            raise CodecError(f"{path_text(path)}: reference cycle through a {class_ref(type(obj))} cannot be encoded")
        self.stack.add(oid)
        return oid

    def _guarded(self, obj: Any, path: NodePath, fn: Callable[[Any, Any, NodePath], dict[str, Any]]) -> dict[str, Any]:
        oid = self.push(obj, path)
        try:
            return fn(self, obj, path)
        finally:
            self.stack.discard(oid)

    # -- what host types and kinds ask of the encoder ----------------------------------------------------
    def encode_pickle(self, obj: Any, path: NodePath, reason: str | None = None) -> dict[str, Any]:
        """The ``pickle`` node of ``obj`` (see :func:`skipweave.store.format.codec.pickled.encode_pickle`)."""
        return pickled.encode_pickle(self, obj, path, reason)

    def encode_native(self, obj: Any, path: NodePath) -> dict[str, Any] | None:
        """The node of ``obj`` without pickle, or None, leaving no trace, when it cannot be encoded natively."""
        snap = self._snapshot()
        allow = self.allow_pickle
        self.allow_pickle = False
        try:
            return self.encode(obj, path)
        except CodecError as exc:
            self._rollback(snap)
            logger.debug("not recording %s: %s", path_text(path), exc)
            return None
        finally:
            self.allow_pickle = allow

    def class_ref(self, cls: type, path: NodePath, kind: str) -> str:
        """``class_ref(cls)``; refuses local classes, warns once per class that a replay would refuse it.

        Raises:
            CodecError: ``cls`` is defined inside a function (no replay could find it).
        """
        if "<locals>" in cls.__qualname__:
            raise CodecError(
                f"{path_text(path)}: class {class_ref(cls)} is defined inside a function and could not be found "
                "when decoding; define it at module level"
            )
        key = (cls, kind)
        if key not in _CHECKED_CLASSES and class_ref(cls) not in self.trusted:
            _CHECKED_CLASSES.add(key)
            problem = classes.replay_problem(cls, kind)
            if problem:
                logger.warning("skipweave: recording %s (%s) that a replay will refuse unless approved: %s",
                               path_text(path) or "<root>", class_ref(cls), problem)
        return class_ref(cls)


_FAST_ENCODERS: dict[type, Callable[[Encoder, Any, NodePath], dict[str, Any]]] = {
    dict: containers.encode_plain_dict,
    list: containers.encode_plain_seq,
    tuple: containers.encode_plain_seq,
    torch.Tensor: tensors.encode_tensor,
    np.ndarray: arrays.encode_ndarray,
}
"""Exact type -> what :meth:`Encoder.encode`'s checks would pick for it (looked up before them)."""


def encode(
    obj: Any, *, allow_pickle: bool = False, root_name: str = "obj", trusted: Collection[str] = ()
) -> Encoded:
    """Encode ``obj`` into a JSON skeleton and a flat dict of CPU tensors.

    Contiguous CPU tensors and native-endian numeric numpy arrays are not copied (the entries of
    ``Encoded.tensors`` share memory with them); non-contiguous or accelerator tensors are copied to
    contiguous CPU tensors, and a tensor whose storage is already used by another entry is cloned so the
    result can be saved with safetensors. Likewise the compact form of an object array holds the array's
    own elements: serialise the tree before mutating them.

    A class that a replay in this process would refuse (an unregistered DataProto-like class, a dataclass or
    namedtuple defining ``__del__``) is still recorded -- the replay may list it in
    ``skip.<role>.trusted_classes`` -- but unless it is in ``trusted``, a warning naming it and the fix is
    logged once per class, while there is time to register it.

    Args:
        obj: the value to encode (see :mod:`skipweave.store.format.codec` for the supported types).
        allow_pickle: pickle values the codec does not support instead of refusing them.
        root_name: name of ``obj`` used as the start of paths in error messages (e.g. ``"result"``).
        trusted: refs the replay will trust (``skip.<role>.trusted_classes``): no replay warning for them.

    Returns:
        An :class:`Encoded` with ``tree == {"codec_version": v, "root": node}``: ``v`` is 2 when an object
        array took a compact form (``strs``/``json``), else 1.

    Raises:
        PickleRefused: a value needs pickle and ``allow_pickle`` is False; the message names its path
            (e.g. ``result.batch['x']``) and type and says how to opt in.
        CodecError: a value cannot be encoded at all (reference cycle, meta tensor, class defined inside a
            function, unpicklable object).
    """
    enc = Encoder(allow_pickle, trusted)
    root = enc.encode(obj, root_name)
    return Encoded(tree={"codec_version": enc.version, "root": root}, tensors=enc.tensors, pickled=enc.pickled)
