"""A safe codec turning rollout results into a JSON skeleton plus a flat dict of tensors (see docs/architecture.md).

Each kind's encoder and decoder sit side by side in one module: :mod:`~skipweave.store.format.codec.scalars`,
:mod:`~skipweave.store.format.codec.tensors`, :mod:`~skipweave.store.format.codec.arrays`,
:mod:`~skipweave.store.format.codec.containers`, :mod:`~skipweave.store.format.codec.objects` (dataclass, namedtuple,
enum), :mod:`~skipweave.store.format.codec.pickled`; host containers come from the host types integrations register
(:mod:`skipweave.store.hosts`). :mod:`~skipweave.store.format.codec.encoder` and
:mod:`~skipweave.store.format.codec.decoder` walk a value and dispatch; :mod:`~skipweave.store.format.codec.devices`
says
which recorded devices exist here.

``encode`` walks an object and produces an :class:`Encoded` value:

* ``tree`` -- a JSON-serialisable dict (``json.dumps`` works on it, no NaN/Infinity literals) of the form
  ``{"codec_version": 1 or 2, "root": <node>}`` (see *Versions* below). Every node is a dict with a short
  type tag ``"t"`` (``"tensor"``, ``"ndarray"``, ``"dict"``, ``"list"``, ``"dataproto"``, ...).
* ``tensors`` -- a flat ``name -> torch.Tensor`` dict (names ``"t0"``, ``"t1"``, ...), every tensor
  contiguous, on CPU and not sharing storage with another entry, so it can be handed to
  ``safetensors.torch.save_file`` directly.

``decode`` inverts it. The round trip is exact for the supported types (type, dtype, shape, values, dict key
order, tuple vs list). Nothing is pickled unless ``allow_pickle=True`` is passed to both functions, and
decoding constructs only the classes *Decoding constructs* below allows.

Supported values
----------------
* ``None``, ``bool``, ``int`` (any size), ``float`` (incl. nan, +-inf, -0.0), ``complex``, ``str``, ``bytes``,
  ``bytearray``;
* ``dict`` (keys of any supported hashable type, key types and order kept), ``collections.OrderedDict``,
  ``list``, ``tuple``, namedtuples, ``set``, ``frozenset``;
* ``torch.Tensor`` of any strided dtype (CPU or accelerator; the device string is recorded and restored when
  available, otherwise the tensor is restored on CPU with a warning logged once per device);
  ``requires_grad`` is NOT preserved, tensor subclasses (e.g. ``nn.Parameter``) decode as plain tensors,
  and tensors that were the same Python object decode as one shared tensor;
* ``torch.Size``, ``torch.dtype``, ``torch.device``;
* ``numpy.ndarray`` (exact type only) of numeric, bool, datetime, string (``U``/``S``) and object dtype,
  and numpy scalars (``np.float32(1.5)`` ...). Object arrays take one of three forms (see below);
* dataclass instances and enum members of module-level classes (see *Decoding constructs* for what a replay
  accepts);
* instances of the host types integrations register (:mod:`skipweave.store.hosts`; the shipped ones are
  verl's ``DataProto`` shape, with attributes ``batch``, ``non_tensor_batch``, ``meta_info``, and tensordict's
  ``TensorDict``, lazy stacks and ``NonTensorData``); a replay rebuilds them only for approved classes
  (a host type's own, classes registered with :func:`skipweave.store.classes.register`, trusted refs, or
  what the host type accepts by shape). Encoding warns once per class it records that a replay in this
  process would refuse.

Anything else is pickled when ``allow_pickle=True`` (the bytes go into ``tensors`` as a uint8 tensor) and
refused with :class:`PickleRefused` otherwise.

Decoding does not copy tensor data: decoded tensors and numeric arrays may share memory with the entries of
``tensors`` passed in.

Decoding constructs
-------------------
A tree is untrusted input (a dump dir on shared storage, copied from another cluster): decoding imports no
module and runs no code a tree names. The ``cls`` of ``enum``, ``namedtuple``, ``dataclass`` and host-type nodes
is looked up by :func:`skipweave.store.classes.resolve`: the module
must already be imported (refs listed in ``decode(..., trusted=...)``, the user's
``skip.<role>.trusted_classes``, are the only ones imported), the qualname is walked statically, and the class
must be of the node's kind -- a dataclass or namedtuple defining no ``__del__`` (data only), an Enum, or for
host-type nodes an approved class; a trusted ref is approved for any kind and skips the data-only rule. Then:

* dataclasses, namedtuples and enum members are rebuilt without running class code
  (:mod:`skipweave.store.format.codec.objects`);
* host containers are rebuilt by their host type's decoder, under the same rules (the DataProto shape sets
  only ``batch``/``non_tensor_batch``/``meta_info`` and recorded extra attributes that are plain identifiers
  the class does not define as data descriptors; TensorDicts go through tensordict's own constructors).

Other crafted inputs are refused as :class:`CodecError` too: numpy dtypes holding Python objects in the
raw-bytes and numpy-scalar forms, shapes that are not lists of non-negative ints, an object or string array
whose item count does not match its shape (checked before allocating), a string dtype padded to an absurd
width, torch dtype names that are not dtypes (looked up without torch's lazy submodule imports) and nesting
beyond the recursion limit. Any other exception inside decoding surfaces as a :class:`CodecError` naming the
node's path.

Object arrays take one of three forms (``strs``, ``json``, ``items``): see :mod:`skipweave.store.format.codec.arrays`.

``decode_view`` decodes without any class: dataclasses, namedtuples, enums and host objects come back as read-only
views of their recorded fields that keep their class's name (:mod:`skipweave.store.format.codec.view`), which is what
``skipweave diff`` compares.

Versions
--------
A tree carries the lowest ``codec_version`` that describes it: ``2`` when it holds a compact object array
(``strs`` or ``json``, added in version 2), ``1`` otherwise. An older reader, which understands 1 only,
therefore refuses a tree using the new forms with an "unknown codec_version" error naming both versions
(instead of failing obscurely on the missing ``items``, or worse), while trees without them stay
readable by it. This package reads versions 1 and 2; :data:`CODEC_VERSION` is the newest it writes.
"""

from __future__ import annotations

from skipweave.store.classes import class_ref
from skipweave.store.format.codec.decoder import decode
from skipweave.store.format.codec.encoder import Encoded, encode
from skipweave.store.format.codec.pickled import PickleRefused
from skipweave.store.format.codec.view import decode_view
from skipweave.store.format.tree import CodecError, summarize

CODEC_VERSION = 2
"""The newest codec version this package writes; a tree records the lowest version able to describe it."""

__all__ = [
    "CODEC_VERSION",
    "CodecError",
    "Encoded",
    "PickleRefused",
    "class_ref",
    "decode",
    "decode_view",
    "encode",
    "summarize",
]
