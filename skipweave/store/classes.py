"""Which classes decoding may construct: the approved host classes and the lookup rules for class references.

A codec tree names classes as ``"module:qualname"`` strings (field ``cls`` of ``enum``, ``namedtuple``,
``dataclass`` and host-type nodes, :mod:`skipweave.store.hosts`). A dump dir is untrusted input
(shared storage, copied from another cluster), so turning such a string back into a class must not let the
file run code: :func:`resolve` is the only way the codec does it, under these rules.

Lookup
------
* **No import.** The module must already be in ``sys.modules``: a recording cannot make this process import
  anything (no module planted beside a relative dump dir, no installed module imported for its side
  effects). The one exception is a ref the *user* listed in ``trusted`` (``skip.<role>.trusted_classes``),
  whose module is imported when missing.
* **Static walk.** The qualname is walked part by part with :func:`inspect.getattr_static` on that module
  object, so no module ``__getattr__`` (lazy loaders), metaclass ``__getattr__`` or descriptor runs.
* **Well-formed names.** The module is a dotted name of identifiers; every qualname part is an identifier not
  starting with ``"__"`` (no dunders such as ``__class__``/``__globals__``, no name-mangled attributes, no
  ``<locals>``). Single-underscore names are allowed: a module-private dataclass is still user data, and what
  keeps a private stdlib class such as ``tempfile._TemporaryFileCloser`` out is the kind rule below.
* **Canonical name.** For classes accepted by their shape (not registered, not trusted) the class found must
  carry that very name (``__module__`` and ``__qualname__``), as :func:`class_ref` writes it; an alias
  re-exported elsewhere is not followed.

Kinds
-----
* ``dataclass`` -- a dataclass (a class holding ``__dataclass_fields__``, looked up statically);
* ``enum`` -- a subclass of :class:`enum.Enum` (decoding looks members up, it constructs nothing new except a
  ``Flag`` combination);
* ``namedtuple`` -- a ``tuple`` subclass whose ``_fields`` is a tuple of strings;
* a host kind (:mod:`skipweave.store.hosts`: the kinds integrations register, e.g. ``dataproto``,
  ``tensordict``) -- a class the host type approves (its ``approved`` refs), one registered with
  :func:`register`, a trusted one, or a class the host type's own ``class_problem`` accepts by its shape
  (the DataProto shape accepts batch classes of the host's own, outside the standard library and data only,
  see :func:`library_problem` and :func:`acting_problem`; what remains possible is documented in
  docs/format.md's threat model).

Data only
---------
The codec builds dataclass, namedtuple and data-only host objects (such as the DataProto shape) with
``object.__new__`` / ``tuple.__new__`` and sets attributes with ``object.__setattr__``: no ``__new__``,
``__init__``, ``__post_init__`` or ``__setattr__`` of the class runs. What would still run is a finalizer, so
such a class (or any base) defining ``__del__`` is refused unless registered or trusted. Registration and
trust are explicit approvals: they skip the kind (for host kinds), data-only and canonical-name rules, never
the static lookup. Shape rules the codec needs to rebuild the object (a dataclass node needs a dataclass)
apply to trusted refs too.

Errors are :class:`~skipweave.store.format.tree.CodecError` with a message naming the ref and what to do; the
caller adds the node path.
"""

from __future__ import annotations

import enum
import importlib
import inspect
import logging
import sys
import threading
import types
from collections.abc import Collection
from types import ModuleType
from typing import Any

from skipweave.store.format.tree import CodecError
from skipweave.store.hosts import HOST_TYPES, HostType, host_for_kind, host_kinds

logger = logging.getLogger(__name__)

SHAPE_KINDS = ("dataclass", "enum", "namedtuple")
"""Kinds accepted by the class's shape alone (plus the data-only rule), without registration; the other
kinds are those of the registered host types (:func:`skipweave.store.hosts.host_kinds`)."""

_MISSING = object()
_lock = threading.Lock()
_registry: dict[str, str] = {}  # ref -> kind

_HOW_TO_APPROVE = (
    "import {mod!r} before replaying (e.g. in the trainer, before the replayed call){also}, or list {ref!r} in "
    "skip.<role>.trusted_classes (decode(..., trusted=[{ref!r}])) to have it imported"
)


def class_ref(cls: type) -> str:
    """Return ``"module:qualname"`` for a class, the name a codec tree gives it.

    Args:
        cls: the class.

    Returns:
        The reference string; decoding looks it up (without importing) under this module's rules.
    """
    return f"{cls.__module__}:{cls.__qualname__}"


def kinds() -> tuple[str, ...]:
    """Every class kind :func:`resolve` accepts: :data:`SHAPE_KINDS`, then the registered host kinds."""
    return SHAPE_KINDS + host_kinds()


def register(ref: str, kind: str) -> None:
    """Approve the class named ``ref`` as a host container of ``kind`` for decoding.

    A library or trainer whose results are DataProto-shaped objects of its own class calls this at import time
    (``register("my_pkg.data:Batch", "dataproto")``) so that replays rebuild them. Registering an already
    registered ref with the same kind is a no-op.

    Args:
        ref: ``"module:qualname"`` as :func:`class_ref` writes it (aliases such as
            a package's re-export work too: the name is looked up as written).
        kind: a host kind (:func:`skipweave.store.hosts.host_kinds`).

    Raises:
        ValueError: ``kind`` is not a host kind, ``ref`` is malformed, or ``ref`` is registered with another kind.
    """
    host_kind_names = host_kinds()
    if kind not in host_kind_names:
        raise ValueError(f"kind must be one of {', '.join(host_kind_names)}, not {kind!r}")
    problem = _ref_problem(ref)
    if problem:
        raise ValueError(f"cannot register {ref!r}: {problem}")
    with _lock:
        old = registered_kind(ref)
        if old is not None and old != kind:
            raise ValueError(f"{ref!r} is already registered as {old!r}, not {kind!r}")
        _registry[ref] = kind
    logger.debug("approved %s as %s for decoding", ref, kind)


def registered_kind(ref: str) -> str | None:
    """The kind ``ref`` is registered as (by :func:`register` or a host type's ``approved``), or None."""
    kind = _registry.get(ref)
    if kind is not None:
        return kind
    for host in HOST_TYPES.items():
        if ref in host.approved:
            return host.kind
    return None


def resolve(ref: Any, kind: str, *, trusted: Collection[str] = ()) -> type:
    """Return the class named by ``ref`` if decoding may construct it as a ``kind`` (see the module docstring).

    Args:
        ref: the ``cls`` field of a tree node (untrusted: any JSON value).
        kind: one of :func:`kinds`, the node type asking.
        trusted: refs the user approved (``skip.<role>.trusted_classes``); only these may be imported, and
            they skip the approval, data-only and canonical-name rules.

    Returns:
        The class.

    Raises:
        CodecError: malformed ref, module not imported (or, for a trusted ref, not importable), no such
            class, or a class decoding must not construct as ``kind``; the message says what to do.
        ValueError: ``kind`` is unknown (a bug in the caller).
    """
    host = host_for_kind(kind) if kind not in SHAPE_KINDS else None
    if host is None and kind not in SHAPE_KINDS:
        raise ValueError(f"unknown class kind {kind!r}")
    if not isinstance(ref, str):
        raise CodecError(f"class reference {ref!r:.100} is not a string")
    problem = _ref_problem(ref)
    if problem:
        raise CodecError(f"malformed class reference {ref!r:.200}: {problem}")
    is_trusted = ref == trusted if isinstance(trusted, str) else ref in trusted  # a lone str is one ref
    mod_name, _, qual = ref.partition(":")
    module = _module(mod_name, ref, kind, import_it=is_trusted)
    obj: Any = module
    for part in qual.split("."):
        nxt = inspect.getattr_static(obj, part, _MISSING)
        if nxt is _MISSING:
            raise CodecError(f"class {ref!r} does not exist here: {mod_name!r} has no attribute path {qual!r}")
        obj = nxt
    if not isinstance(obj, type):
        raise CodecError(f"{ref!r} is not a class ({type(obj).__name__}); refusing to construct it")
    cls: type = obj
    shape = _shape_problem(cls, kind)
    if shape:
        raise CodecError(f"{ref!r} {shape}; refusing to construct it")
    if is_trusted:
        return cls
    reg = registered_kind(ref)
    if reg is not None:
        if reg == kind:
            return cls
        raise CodecError(f"{ref!r} is approved as {reg!r}, not as {kind!r}; refusing to construct it")
    if host is not None:
        _check_host_class(host, cls, ref)
    canonical = f"{cls.__module__}:{cls.__qualname__}"
    if canonical != ref:
        raise CodecError(
            f"{ref!r} names the class {canonical!r} under another name; recordings name classes where they are "
            f"defined. List {ref!r} in skip.<role>.trusted_classes if this alias is intended"
        )
    if kind == "dataclass":
        fields = inspect.getattr_static(cls, "__dataclass_fields__", {})
        acting = acting_problem(cls, [f for f in fields if isinstance(f, str)])
        if acting:
            raise CodecError(f"class {ref!r} {acting}; list {ref!r} in skip.<role>.trusted_classes if you trust "
                             "the recording")
    data_only = host.data_only if host is not None else kind in ("dataclass", "namedtuple")
    finalizer = _finalizer_owner(cls) if data_only else None
    if finalizer is not None:
        raise CodecError(
            f"class {ref!r} defines a finalizer (__del__ in {finalizer}), which would run on data from the "
            f"recording when the object is collected; list {ref!r} in skip.<role>.trusted_classes if you "
            "trust the recording"
        )
    return cls


def replay_problem(cls: type, kind: str) -> str | None:
    """Why a replay in this process (without ``trusted``) would refuse ``cls`` as a ``kind``, or None.

    The encoder asks this to warn at recording time, while there is still time to register the class.

    Args:
        cls: a class the encoder is about to name in a tree.
        kind: one of :func:`kinds`.
    """
    ref = class_ref(cls)
    try:
        found = resolve(ref, kind)
    except CodecError as exc:
        return str(exc)
    if found is not cls:
        return f"{ref!r} names another class in this process than the one recorded"
    return None


# --------------------------------------------------------------------------------------------------------
# helpers

def _approved_notes(only: HostType | None = None) -> str:
    """`` (verl's DataProto and tensordict's classes are)``: what the host types (or ``only``) approve, for
    messages; empty when none says."""
    hosts = (only,) if only is not None else HOST_TYPES.items()
    notes = [host.approved_note for host in hosts if host.approved_note]
    if not notes:
        return ""
    return f" ({' and '.join(notes)} {'is' if len(notes) == 1 else 'are'})"


def _check_host_class(host: HostType, cls: type, ref: str) -> None:
    """Refuse an unregistered, untrusted class the host type does not accept by its shape."""
    kind = host.kind
    if host.class_problem is not None:
        problem = host.class_problem(cls)
        if problem is None:
            return
        if host.shape_rule:
            raise CodecError(
                f"class {ref!r} is not approved to be rebuilt as a {host.label}: it {problem}. skipweave "
                f"rebuilds {host.shape_rule}, classes registered with skipweave.store.classes.register({ref!r}, "
                f"{kind!r}){_approved_notes(host)} and classes listed in skip.<role>.trusted_classes"
            )
    raise CodecError(
        f"class {ref!r} is not approved to be rebuilt as a {host.label}: skipweave rebuilds only "
        f"classes registered with skipweave.store.classes.register({ref!r}, {kind!r}){_approved_notes()} "
        f"or listed in skip.<role>.trusted_classes "
        f"(decode(..., trusted=[{ref!r}])); do that if {ref!r} is your own class"
    )


def _ref_problem(ref: str) -> str | None:
    """What is wrong with the form of ``ref`` (``"module:qualname"``), or None."""
    mod_name, sep, qual = ref.partition(":")
    if not sep or not mod_name or not qual:
        return "expected 'module:qualname'"
    if not all(p.isidentifier() for p in mod_name.split(".")):
        return f"module {mod_name!r} is not a dotted name"
    for part in qual.split("."):
        if not part.isidentifier():
            return f"qualname part {part!r} is not an identifier (classes defined inside functions cannot be rebuilt)"
        if part.startswith("__"):
            return f"qualname part {part!r} is a dunder or name-mangled attribute"
    return None


def _module(mod_name: str, ref: str, kind: str, *, import_it: bool) -> ModuleType:
    module = sys.modules.get(mod_name)
    if isinstance(module, ModuleType):
        return module
    if import_it:
        try:
            return importlib.import_module(mod_name)
        except Exception as exc:
            raise CodecError(f"cannot import module {mod_name!r} of trusted class {ref!r}: {exc}") from exc
    raise CodecError(
        f"class {ref!r} cannot be rebuilt: module {mod_name!r} is not imported in this process, and skipweave "
        "never imports modules named by a recording; "
        + _HOW_TO_APPROVE.format(
            ref=ref,
            mod=mod_name,
            also="" if kind in SHAPE_KINDS or registered_kind(ref) else f" and register it as {kind!r}",
        )
    )


def _shape_problem(cls: type, kind: str) -> str | None:
    # static lookups: hasattr (as in dataclasses.is_dataclass) would run a metaclass __getattr__
    if kind == "dataclass" and not isinstance(inspect.getattr_static(cls, "__dataclass_fields__", None), dict):
        return "is not a dataclass"
    if kind == "enum" and not issubclass(cls, enum.Enum):
        return "is not an Enum class"
    if kind == "namedtuple":
        fields = inspect.getattr_static(cls, "_fields", None)
        if not (issubclass(cls, tuple) and isinstance(fields, tuple) and all(type(f) is str for f in fields)):
            return "is not a namedtuple class"
    return None


def library_problem(cls: type) -> str | None:
    """Why ``cls`` is not a class of the host's own, or None.

    A host type that rebuilds unregistered classes by their shape accepts only classes whose top-level module
    is outside the standard library (the home of the finalizer gadgets: ``tempfile``, ``subprocess``,
    ``weakref``...) and outside skipweave.

    Args:
        cls: the class a tree names.

    Returns:
        ``"is defined in the standard library (tempfile)"`` or the like, or None.
    """
    top = (cls.__module__ or "").partition(".")[0]
    if top in sys.stdlib_module_names or top in ("builtins", "skipweave"):
        return f"is defined in {'skipweave' if top == 'skipweave' else 'the standard library'} ({cls.__module__})"
    return None


def acting_problem(cls: type, names: Collection[str]) -> str | None:
    """Why setting ``names`` on an ``object.__new__`` instance of ``cls``, or using it, would run class code.

    ``object.__setattr__`` skips a class's ``__setattr__`` but still calls a data descriptor's ``__set__``
    (a property setter) at the name; a ``__getattribute__`` of its own runs on every attribute read.
    Slots (member descriptors) only store the value.

    Args:
        cls: the class to be built with ``object.__new__``.
        names: the attributes that will be set on it.

    Returns:
        What would run (``"has a property named 'meta_info', ..."``), or None.
    """
    for klass in cls.__mro__:
        if klass is not object and "__getattribute__" in vars(klass):
            return f"customises attribute access (__getattribute__ in {klass.__module__}:{klass.__qualname__})"
    for name in names:
        attr = inspect.getattr_static(cls, name, None)
        if attr is not None and not isinstance(attr, types.MemberDescriptorType) and (
                hasattr(type(attr), "__set__") or hasattr(type(attr), "__delete__")):
            return f"has a {type(attr).__name__} named {name!r}, whose setter would run on recorded data"
    return None


def _finalizer_owner(cls: type) -> str | None:
    """The ``module:qualname`` of the first class in ``cls``'s MRO defining ``__del__``, or None."""
    for klass in cls.__mro__:
        if klass is not object and "__del__" in vars(klass):
            return f"{klass.__module__}:{klass.__qualname__}"
    return None
