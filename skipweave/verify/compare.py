"""Compare a live result with its recording, field by field, and say where they first differ and by how much.

A result is walked as a tree: dict keys, list and tuple indices, dataclass fields, the fields of a host object as its
host type says (:attr:`skipweave.store.hosts.HostType.compared`: its fields and a shape beside them; the registry is
asked, so this module names no host), the keys of another mapping-like object, the public attributes of an object
without an ``==`` of its own (a DataProto-shaped batch: ``batch``, ``non_tensor_batch``, ``meta_info``), the elements
of an object array. Paths are dotted (``batch.responses``,
``non_tensor_batch.uid.3``, ``meta_info.timing_s``). What "equal" means is a :class:`CompareSpec`: a rule per path
glob (``exact``, ``ignore``, or a :class:`Tolerance`), the default for the rest. A rule on a path holds for
everything below it, unless a longer path has its own. Keys are joined as they are: a key that itself holds a dot
is read as a deeper path by the rules, and glob characters in keys (``*?[``) need ``fnmatch``'s ``[*]`` escapes.

The comparison never raises: a pair that cannot be compared (a sparse tensor, an ``==`` that raises) is an
``error`` divergence. A structure that contains itself is compared once. Equal tensors take one pass
(``torch.equal``); differing float tensors are compared in float32 (float64 and complex fields in their own
precision): a pair of float32 tensors of N bytes each then takes about 4N bytes more at peak.

Token ids are compared as token sequences wherever they live, integer tensors (verl) or Python lists (TRL, vLLM):
:mod:`skipweave.verify.tokens` says what a token field is and how two are compared.

What a :class:`Divergence` says, per kind of field:

- token fields: the first diverging position (``[sample, position]``, one index per dimension), the recorded and the
  live token there (``None`` past a sequence's end) and the token match ratio, ``detail["tokens"]`` ``True``;
  integer scalar tensors and bool tensors alike, with ``tokens: False``;
- float tensors and float numbers: max ``|Δ|``, max relative ``Δ`` (against ``|recorded|``), the index of the max
  ``|Δ|``, and the fraction of elements beyond the tolerance (``exact``: beyond equality); a 0-d tensor's (a loss)
  recorded and live value too;
- integers and other scalars: the recorded and the live value;
- a shape, dtype, type, length or key-set mismatch, said as such.

A float field whose elements all lie within its tolerance but are not all equal is ``close``; a comparison is
``identical`` when every compared field is equal, ``close`` when some are only close, else ``diverged``.
"""

from __future__ import annotations

import cmath
import dataclasses
import enum
import math
import numbers
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from skipweave.config.compare import EXACT, IGNORE, CompareSpec, Rule, Tolerance
from skipweave.store.hosts import Compared, host_for_kind, host_of
from skipweave.verify.tokens import SampleCount, compare_sequences, is_token_tensor, token_pair

Status = Literal["identical", "close", "diverged"]
"""A comparison's (and a field's) status."""
IDENTICAL: Final = "identical"
CLOSE: Final = "close"
DIVERGED: Final = "diverged"


@dataclass
class Divergence:
    """Where and how one field differs.

    Attributes:
        path: the field's dotted path (``""`` for the result itself).
        kind: ``value``, ``shape``, ``dtype``, ``type``, ``length``, ``keys`` or ``missing``.
        status: ``close`` (within tolerance) or ``diverged``.
        detail: what the kind tells (see the module docstring), JSON-ready.
    """

    path: str
    kind: str
    status: Status
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class Comparison:
    """The outcome of comparing one live result with its recording.

    Attributes:
        status: ``identical``, ``close`` or ``diverged``.
        first: the first diverging field in walk order (for ``close``: the first close one), ``None`` when identical.
        fields: leaf fields compared (ignored ones not counted).
        divergences: every field that is not equal, in walk order.
        tokens: token fields compared (see the module docstring), equal or not.
        floats: float fields compared (tensors, arrays and numbers), equal or not.
    """

    status: Status
    first: Divergence | None
    fields: int
    divergences: list[Divergence]
    tokens: int = 0
    floats: int = 0

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready record (one line of a divergence report)."""
        first = None if self.first is None else dataclasses.asdict(self.first)
        token = self.first_token
        return {"status": self.status, "fields": self.fields, "first": first,
                "diverged": sum(d.status == DIVERGED for d in self.divergences),
                "close": sum(d.status == CLOSE for d in self.divergences),
                "token_match": self.token_match, "max_abs_diff": _plain(self.max_abs_diff),
                "first_token": None if token is None else dataclasses.asdict(token)}

    @property
    def first_token(self) -> Divergence | None:
        """The first token field that differs, in walk order (``None`` when every token field is equal)."""
        return next((d for d in self.divergences if d.detail.get("tokens") is True), None)

    @property
    def token_match(self) -> float | None:
        """The lowest token match ratio of the token fields (``1.0`` when every one is equal); ``None`` when the
        result has no token field, or one differs in a way no ratio tells (its shape, dtype or number of samples)."""
        if not self.tokens:
            return None
        ratios = []
        for d in self.divergences:
            if d.detail.get("tokens") is True:
                ratio = d.detail.get("match_ratio")
                if d.kind != "value" or not isinstance(ratio, float | int):
                    return None
                ratios.append(float(ratio))
        return min(ratios) if ratios else 1.0

    @property
    def max_abs_diff(self) -> float | None:
        """The largest max ``|Δ|`` of the float fields that differ (``0.0`` when none does; ``inf`` for an inf or
        NaN mismatch); ``None`` when the result has no float field."""
        if not self.floats:
            return None
        out = 0.0
        for d in self.divergences:
            value = d.detail.get("max_abs_diff")
            if isinstance(value, str):  # "inf"/"nan", strict-JSON form
                return math.inf
            if isinstance(value, float | int):
                try:
                    out = max(out, float(value))
                except OverflowError:  # an integer difference past a float's range
                    return math.inf
        return out


def compare(recorded: Any, live: Any, spec: CompareSpec | None = None) -> Comparison:
    """Compare ``live`` with ``recorded`` under ``spec`` (default: every field exact).

    Raises nothing for any pair of values: a pair that cannot be compared is a ``type`` divergence.
    """
    walk = _Walk(spec or CompareSpec())
    walk.visit("", recorded, live)
    diverged = [d for d in walk.found if d.status == DIVERGED]
    if diverged:
        return Comparison(DIVERGED, diverged[0], walk.leaves, walk.found, walk.tokens, walk.floats)
    if walk.found:
        return Comparison(CLOSE, walk.found[0], walk.leaves, walk.found, walk.tokens, walk.floats)
    return Comparison(IDENTICAL, None, walk.leaves, [], walk.tokens, walk.floats)


def _join(path: str, part: Any) -> str:
    return f"{path}.{part}" if path else str(part)


def _type_name(obj: Any) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


class _Walk:
    """One walk over a pair of results; with ``listing``, over one result paired with itself, naming its leaves
    (:func:`paths`) without comparing them."""

    def __init__(self, spec: CompareSpec, listing: bool = False) -> None:
        self.spec = spec
        self.found: list[Divergence] = []
        self.leaves = 0
        self.tokens = 0  # token fields compared
        self.floats = 0  # float fields compared
        self.open: set[tuple[int, int]] = set()
        self.listed: list[str] | None = [] if listing else None
        from skipweave.store.format.codec.view import RecordedObject  # torch: as the walk itself, on first use

        self.views = RecordedObject

    def host_fields(self, obj: Any) -> Compared | None:
        """What ``obj``'s host type compares of it (a live host object, or the view of a recorded one, whose kind
        names its host type), or None when it is no host object or its host type leaves it to the other rules."""
        if type(obj) in _PLAIN:
            return None
        host = host_for_kind(obj.kind) if isinstance(obj, self.views) else host_of(obj)
        return host.compared(obj) if host is not None and host.compared is not None else None

    def leaf(self, path: str) -> bool:
        """Count a leaf field; True when the walk only lists paths (the caller then compares nothing)."""
        self.leaves += 1
        if self.listed is None:
            return False
        self.listed.append(path)
        return True

    def add(self, path: str, kind: str, status: Status = DIVERGED, **detail: Any) -> None:
        self.found.append(Divergence(path, kind, status, detail))

    def wanted(self, path: str) -> bool:
        """Whether anything at or below ``path`` is compared (its rule is not ``ignore``, or a rule names a field
        below it)."""
        return self.spec.rule_for(path) != IGNORE or self.spec.names_below(path)

    def visit(self, path: str, a: Any, b: Any) -> None:
        # an ignored field is skipped whole, unless a rule names a field below it: then the walk goes on to reach
        # those, its other leaves skipped ("compare only batch.responses")
        rule = self.spec.rule_for(path)
        if rule == IGNORE and not self.spec.names_below(path):
            return
        key = (id(a), id(b))
        if key in self.open:  # a structure that contains itself: this pair is being compared further up
            return
        self.open.add(key)
        try:
            self._dispatch(path, a, b, rule)
        except Exception as exc:  # noqa: BLE001 - a pair that cannot be compared is a divergence, never an error
            self.leaves += 1
            self.add(path, "error", error=f"{type(exc).__name__}: {_short(exc)}")
        finally:
            self.open.discard(key)

    def _dispatch(self, path: str, a: Any, b: Any, rule: Rule) -> None:
        import numpy as np
        import torch

        if rule == IGNORE and not (_is_container(a) or _is_container(b)):
            return  # an ignored leaf, met on the way to the fields a rule names below an ignored container
        if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
            self._tensors(path, a, b, rule)
        elif isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
            self._arrays(path, a, b, rule)
        elif type(a) is not type(b) and not (_is_number(a) and _is_number(b)):
            self.leaves += 1
            self.add(path, "type", recorded=_type_name(a), live=_type_name(b))
        elif (fields := self.host_fields(a)) is not None:
            self._host(path, fields, self.host_fields(b))
        elif isinstance(a, Mapping):
            self._mapping(path, a, b)
        elif isinstance(a, (list, tuple)):
            nested = token_pair(a, b)
            if nested is not None and not (rule == IGNORE and self.spec.names_below(path)):
                self._tokens(path, a, b, nested)
                return
            if len(a) != len(b):
                self.leaves += 1
                self.add(path, "length", recorded=len(a), live=len(b))
                return
            for i, (x, y) in enumerate(zip(a, b, strict=True)):
                self.visit(_join(path, i), x, y)
        elif dataclasses.is_dataclass(a) and not isinstance(a, type):
            for f in dataclasses.fields(a):
                self.visit(_join(path, f.name), getattr(a, f.name), getattr(b, f.name))
        elif _is_number(a) or isinstance(a, (str, bytes, enum.Enum, BaseException)) or a is None:
            self._scalar(path, a, b, rule)
        elif hasattr(a, "keys") and hasattr(a, "__getitem__"):  # mapping-like, no Mapping: its keys
            self._mapping(path, {k: a[k] for k in a.keys()}, {k: b[k] for k in b.keys()})
        elif type(a).__eq__ is object.__eq__:  # no == of its own (a DataProto-shaped batch): attributes, not address
            self._mapping(path, _state(a), _state(b))
        else:
            self._scalar(path, a, b, rule)

    def _tokens(self, path: str, a: Any, b: Any, nested: bool) -> None:
        """Compare two token fields (lists or tuples of ints, or of such lists: :mod:`skipweave.verify.tokens`)."""
        if self.leaf(path):
            return
        self.tokens += 1
        found = compare_sequences(a, b, nested)
        if isinstance(found, SampleCount):  # another number of samples: no ratio can be told
            self.add(path, "length", recorded=found.recorded, live=found.live, tokens=True)
        elif found is not None:
            self.add(path, "value", first_index=found.first_index, recorded=_plain(found.recorded),
                     live=_plain(found.live), match_ratio=found.match_ratio, tokens=True)

    def _host(self, path: str, a: Compared, b: Compared | None) -> None:
        """A host object, as its host type says: its shape (when it has one), then its fields as a mapping's."""
        b = b if b is not None else Compared({})  # (one type, one host type: only a host type that changes its mind)
        if a.shape is not None or b.shape is not None:
            shape_a, shape_b = _shape(a.shape), _shape(b.shape)
            if shape_a != shape_b:
                self.leaves += 1
                self.add(path, "shape", recorded=shape_a, live=shape_b)
        self._mapping(path, a.fields, b.fields)

    def _mapping(self, path: str, a: Mapping[Any, Any], b: Mapping[Any, Any]) -> None:
        # keys(), not iteration: a Mapping's iteration may walk something else (a host's batch dimension)
        keys_a, keys_b = list(a.keys()), list(b.keys())
        try:  # sets: a result with 40,000 keys took 21 s with list membership
            in_a: Any = set(keys_a)
            in_b: Any = set(keys_b)
        except TypeError:  # unhashable keys (a mapping-like host object): lists
            in_a, in_b = keys_a, keys_b
        missing = [str(k) for k in keys_a if k not in in_b and self.wanted(_join(path, k))]
        extra = [str(k) for k in keys_b if k not in in_a and self.wanted(_join(path, k))]
        if missing or extra:
            self.leaves += 1
            self.add(path, "keys", missing_in_live=missing, only_in_live=extra)
        for k in keys_a:
            if k in in_b:
                self.visit(_join(path, k), a[k], b[k])

    def _scalar(self, path: str, a: Any, b: Any, rule: Rule) -> None:
        if self.leaf(path):
            return
        if _is_number(a) and _is_number(b):
            integers = isinstance(a, numbers.Integral) and isinstance(b, numbers.Integral)
            if not integers:
                self.floats += 1
            if (_is_nan(a) and _is_nan(b)) or _equal(a, b):  # inf == inf: their difference would be NaN
                return
            if integers:  # exact, and no |Δ|: a count or a step is no float field ("max |Δ| 94" read as a drift)
                self.add(path, "value", recorded=_plain(a), live=_plain(b))
                return
            delta: Any = abs(complex(b) - complex(a)) if isinstance(a, complex) or isinstance(b, complex) or \
                not (isinstance(a, numbers.Real) and isinstance(b, numbers.Real)) else abs(float(b) - float(a))
            if delta == 0:
                return
            status: Status = DIVERGED
            # an inf or NaN on either side is never within a tolerance (rtol * inf is inf)
            if isinstance(rule, Tolerance) and _finite(a) and _finite(b):
                try:
                    status = CLOSE if delta <= rule.atol + rule.rtol * abs(a) else DIVERGED
                except (OverflowError, TypeError):
                    status = DIVERGED
            self.add(path, "value", status, recorded=_plain(a), live=_plain(b), max_abs_diff=_plain(delta))
            return
        try:
            if isinstance(a, BaseException) and type(a).__eq__ is object.__eq__:  # by what it says, not identity
                same = type(a) is type(b) and a.args == b.args
            else:
                same = bool(a == b)
        except Exception:  # noqa: BLE001 - an object whose == raises or is not a truth value
            same = False
        if not same:
            self.add(path, "value", recorded=_short(a), live=_short(b))

    def _arrays(self, path: str, a: Any, b: Any, rule: Rule) -> None:
        import numpy as np
        import torch

        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
            self.leaves += 1
            self.add(path, "type", recorded=_type_name(a), live=_type_name(b))
            return
        if a.dtype == object or b.dtype == object:
            if a.dtype != b.dtype or a.shape != b.shape:
                self.leaves += 1
                self.add(path, "shape" if a.shape != b.shape else "dtype", recorded=_describe(a),
                         live=_describe(b))
                return
            flat_a, flat_b = a.reshape(-1), b.reshape(-1)
            if self.listed is None and all(type(x) is str for x in flat_a) and all(type(y) is str for y in flat_b) \
                    and bool((flat_a == flat_b).all()):
                # verl's uid/prompt columns: equal strings need no walk (20x faster at 1,000 samples); a rule on
                # one element would only change the count of fields compared, never the outcome
                self.leaves += flat_a.size
                return
            for i, (x, y) in enumerate(zip(flat_a, flat_b, strict=True)):
                self.visit(_join(path, i), x, y)
            return
        try:
            self._tensors(path, torch.from_numpy(np.ascontiguousarray(a)), torch.from_numpy(np.ascontiguousarray(b)),
                          rule)
        except (TypeError, ValueError):  # a dtype torch does not have (strings, datetimes, big-endian): elements
            if self.leaf(path):
                return
            is_tokens = (a.dtype.kind in "iu" and a.ndim >= 1) or (b.dtype.kind in "iu" and b.ndim >= 1)
            self.tokens += is_tokens
            self.floats += not is_tokens and (a.dtype.kind in "fc" or b.dtype.kind in "fc")
            same_kind = a.dtype == b.dtype or (a.dtype.kind == b.dtype.kind and a.dtype.kind in "US")
            if not same_kind or a.shape != b.shape:
                mark: dict[str, Any] = {"tokens": True} if is_tokens else {}
                self.add(path, "shape" if a.shape != b.shape else "dtype", recorded=_describe(a), live=_describe(b),
                         **mark)
            elif not np.array_equal(a, b, equal_nan=a.dtype.kind in "fcmM"):
                where = np.argwhere(a != b)
                self.add(path, "value", first_index=[int(i) for i in where[0]] if len(where) else None,
                         match_ratio=float((a == b).mean()) if a.size else 1.0, tokens=is_tokens)

    def _tensors(self, path: str, a: Any, b: Any, rule: Rule) -> None:
        import torch

        if self.leaf(path):
            return
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            self.add(path, "type", recorded=_type_name(a), live=_type_name(b))
            return
        is_tokens = is_token_tensor(a) or is_token_tensor(b)
        self.tokens += is_tokens
        self.floats += not is_tokens and (a.is_floating_point() or a.is_complex() or b.is_floating_point()
                                       or b.is_complex())
        mark: dict[str, Any] = {"tokens": True} if is_tokens else {}  # a token field no ratio tells (token_match None)
        if a.dtype != b.dtype:
            self.add(path, "dtype", recorded=str(a.dtype), live=str(b.dtype), **mark)
            return
        if a.shape != b.shape:
            self.add(path, "shape", recorded=list(a.shape), live=list(b.shape), **mark)
            return
        if a.numel() == 0:
            return
        a, b = a.detach().cpu(), b.detach().cpu()
        if torch.equal(a, b):  # the common case of a verify run, one pass (NaNs never equal: they go the long way)
            return
        if not (a.is_floating_point() or a.is_complex()):
            ne = a != b
            first = [int(i) for i in ne.nonzero()[0]] if ne.dim() else []
            self.add(path, "value", first_index=first, recorded=_plain(a[tuple(first)].item()),
                     live=_plain(b[tuple(first)].item()), match_ratio=1.0 - float(ne.float().mean()),
                     tokens=is_tokens)
            return
        # float64 and complex128 fields in their own precision, narrower floats in float32, which holds every
        # float16/bfloat16 value exactly (and float32 costs half the passes' memory of float64)
        wide = a.dtype if a.dtype in (torch.float64, torch.complex128) else (
            torch.complex128 if a.is_complex() else torch.float32)
        fa, fb = a.to(wide), b.to(wide)
        diff = (fa - fb).abs()
        diff.masked_fill_(fa == fb, 0.0)  # inf == inf (inf - inf is NaN)
        nan = diff.isnan()
        if bool(nan.any()):  # NaN on one side only is infinitely far (never within a tolerance); on both, equal
            both = fa.isnan() & fb.isnan()
            diff.masked_fill_(nan, math.inf).masked_fill_(both, 0.0)
        if not bool(diff.any()):
            return
        scale = fa.abs()
        scale.masked_fill_(~scale.isfinite(), 0.0)
        atol, rtol = (rule.atol, rule.rtol) if isinstance(rule, Tolerance) else (0.0, 0.0)
        beyond = diff > atol + rtol * scale if rtol else diff > atol
        if rtol:  # rtol * |recorded| may overflow to inf near the dtype's largest value: inf is never within it
            beyond |= diff.isinf()
        at = [int(i) for i in torch.unravel_index(diff.argmax(), diff.shape)] if diff.dim() else []
        rel = diff / scale.clamp_min(torch.finfo(diff.dtype).tiny)
        # a 0-d tensor (a loss, a norm) has no index to point at: its two values say what differs
        values = {} if diff.dim() else {"recorded": _plain(fa.item()), "live": _plain(fb.item())}
        self.add(path, "value", DIVERGED if bool(beyond.any()) else CLOSE, max_abs_diff=_plain(float(diff.max())),
                 max_rel_diff=_plain(float(rel.max())), at=at, beyond_fraction=float(beyond.double().mean()),
                 **values)


_PLAIN = frozenset({dict, list, tuple, str, bytes, int, float, bool, type(None)})
"""Types no host type claims: the walk asks the registry about no value of these (most of a result's nodes)."""


def _is_number(x: Any) -> bool:
    """A Python or numpy number (``numbers.Number``: numpy's ``np.number`` registers), bools and numpy bools not."""
    return isinstance(x, numbers.Number) and not isinstance(x, bool) and type(x).__name__ != "bool_"


def _finite(x: Any) -> bool:
    try:
        return bool(cmath.isfinite(complex(x)))
    except (OverflowError, TypeError, ValueError):  # an integer past a float's range
        return isinstance(x, numbers.Integral)


def _equal(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - a number type whose == misbehaves: compared by difference
        return False


def _is_container(x: Any) -> bool:
    """What the walk goes into rather than compares as one leaf."""
    import numpy as np

    return (isinstance(x, (Mapping, list, tuple)) or (dataclasses.is_dataclass(x) and not isinstance(x, type))
            or (isinstance(x, np.ndarray) and x.dtype == object) or (hasattr(x, "keys") and hasattr(x, "__getitem__"))
            or (type(x).__eq__ is object.__eq__ and not (_is_number(x) or x is None)) or _has_host_fields(x))


def _has_host_fields(x: Any) -> bool:
    """Whether ``x`` is an object whose host type says what of it is compared (:attr:`HostType.compared`)."""
    if type(x) in _PLAIN:
        return False
    host = host_of(x)
    return host is not None and host.compared is not None


def _shape(size: Any) -> Any:
    """A batch size as a list of ints (a bare int as one dimension; anything else as its text)."""
    if size is None:
        return None
    if isinstance(size, int):
        return [size]
    try:
        return [int(x) for x in size]
    except (TypeError, ValueError):
        return _short(size)


def _is_nan(x: Any) -> bool:
    try:
        return bool(x != x)
    except Exception:  # noqa: BLE001
        return False


def _plain(x: Any) -> Any:
    """A JSON-ready value: numpy scalars as Python ones, non-finite floats and complex numbers as strings (strict JSON
    has no NaN or Infinity)."""
    if hasattr(x, "item") and type(x).__module__ == "numpy":
        x = x.item()
    if isinstance(x, int) and not isinstance(x, bool) and x.bit_length() > 1000:
        return f"<{x.bit_length()}-bit integer>"  # JSON (and str) refuse integers of 4,300 digits and more
    if isinstance(x, bool) or x is None or isinstance(x, (int, str)):
        return x
    if isinstance(x, float):
        return x if math.isfinite(x) else str(x)
    return str(x)


def _state(obj: Any) -> dict[str, Any]:
    """What an object without an ``==`` of its own is compared by: its public attributes (``__dict__`` and
    ``__slots__``), else every attribute; an object with none at all is equal to any other of its type."""
    every = dict(getattr(obj, "__dict__", None) or {})
    for cls in type(obj).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        for name in [slots] if isinstance(slots, str) else slots:
            if name not in ("__dict__", "__weakref__") and hasattr(obj, name):
                every[name] = getattr(obj, name)
    public = {k: v for k, v in every.items() if not k.startswith("_")}
    return public or every


def _describe(a: Any) -> str:
    return f"{a.dtype}{list(a.shape)}"


def _short(x: Any, limit: int = 80) -> Any:
    if x is None or isinstance(x, (bool, int, float)):
        return _plain(x)
    try:
        text = repr(x)
    except Exception:  # noqa: BLE001 - a host object whose repr raises
        text = f"<{_type_name(x)}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def paths(result: Any) -> Iterator[str]:
    """Every leaf path of ``result`` as :func:`compare` walks it (for listing what a ``compare.fields`` glob can
    name)."""
    walk = _Walk(CompareSpec(), listing=True)
    walk.visit("", result, result)
    yield from walk.listed or ()


__all__ = ["CLOSE", "CompareSpec", "Comparison", "DIVERGED", "Divergence", "EXACT", "IDENTICAL",
           "IGNORE", "Rule", "Tolerance", "compare", "paths"]
