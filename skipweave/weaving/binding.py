"""Binding a call's arguments to its target's parameters, for the ``signature`` fingerprint rule.

A host may call one target as ``gen(batch, 3)``, ``gen(batch, step=3)`` or ``gen(batch=batch, step=3)``: one input,
three call forms. Hashed as passed (the ``arguments`` rule of format 1) they are three fingerprints; bound to the
target's parameters first they are one. :class:`Binding` is built once per target at weave time
(:func:`binding_of`, from ``inspect.signature`` of the unwrapped function, ``self``/``cls`` left out as wrapt leaves
them out of ``args``) and binds each call (:meth:`Binding.bind`) in plain Python: ``inspect.Signature.bind`` costs
several microseconds a call, this a fraction of one (bench/run.py ``--only small``).

What a bound call holds (docs/format.md "Manifest", ``fingerprint_rule``):

- every parameter the call passed, by name, however it was passed;
- not a parameter the call left out (its default applies and is not hashed), nor one passed equal to its default
  when that default is a plain immutable value (``None``, a ``bool``, ``int``, ``float`` or ``str``, compared by
  type and value, floats by bit pattern): ``gen(b)`` and ``gen(b, step=None)`` with ``step=None`` as default are one
  call. A default of any other type (a list, a config object) is hashed when passed explicitly, since an equal
  object need not be the same input. A decorated target (one whose signature is read through ``__wrapped__``:
  ``functools.wraps``, a wrapt decorator) leaves out no value passed explicitly: its wrapper may give a parameter a
  default other than the inner function's;
- ``*args`` as the tuple of the extra positional arguments under its name, ``**kwargs`` as the mapping of the extra
  keyword arguments under its name (each left out when empty).

A call that does not fit the signature (a missing or unknown argument: the call itself will raise ``TypeError``)
is not bound, and its fingerprint falls back to the ``arguments`` rule.
"""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

_SIMPLE_DEFAULTS = (type(None), bool, int, float, str)
"""Types of defaults that a value passed explicitly is compared with (and left out when equal)."""

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


@dataclass(frozen=True)
class Binding:
    """How a call's ``args`` and ``kwargs`` bind to one target's parameters (``self``/``cls`` not among them).

    Attributes:
        positional: names of the parameters filled by position, in order.
        keyword: names of the parameters a keyword argument fills (positional-or-keyword and keyword-only).
        var_positional: name of the ``*args`` parameter, or ``None``.
        var_keyword: name of the ``**kwargs`` parameter, or ``None``.
        required_positional: how many leading positional parameters have no default.
        required_keyword: keyword-only parameters without a default.
        simple_defaults: parameter name -> its default, for defaults of a plain immutable type (see the module
            docstring): a value passed equal to it is left out.
        order: every parameter name, sorted: the order a bound call is hashed in.
        index: positional parameter name -> its position as text (``"0"``, ``"1"``, ...): how ``fingerprint.ignore``
            and ``include`` paths written for the ``arguments`` rule name it (:mod:`skipweave.weaving.fingerprint`).
        plain: only positional parameters without defaults (no ``*args``, ``**kwargs`` or keyword-only ones): a call
            passing exactly one positional argument per parameter binds without further checks.
    """

    positional: tuple[str, ...]
    keyword: frozenset[str]
    var_positional: str | None
    var_keyword: str | None
    required_positional: int
    required_keyword: tuple[str, ...]
    simple_defaults: Mapping[str, Any]
    order: tuple[str, ...]
    index: Mapping[str, str]
    plain: bool

    @classmethod
    def of(cls, params: list[inspect.Parameter], *, own_defaults: bool = True) -> Binding:
        """The binding of a signature's parameters (``self``/``cls`` already removed). ``own_defaults``: the
        parameters' defaults are the ones a call left out gets (else, a signature read through ``__wrapped__``, no
        value passed equal to a default is left out: the wrapper the call reaches may apply defaults of its own)."""
        positional = tuple(p.name for p in params if p.kind in _POSITIONAL)
        keyword = frozenset(p.name for p in params if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                                  inspect.Parameter.KEYWORD_ONLY))
        var_pos = next((p.name for p in params if p.kind is inspect.Parameter.VAR_POSITIONAL), None)
        var_kw = next((p.name for p in params if p.kind is inspect.Parameter.VAR_KEYWORD), None)
        empty = inspect.Parameter.empty
        required = 0
        for p in params:  # positional parameters without a default come first (Python requires it)
            if p.kind not in _POSITIONAL or p.default is not empty:
                break
            required += 1
        simple = {p.name: p.default for p in params if type(p.default) in _SIMPLE_DEFAULTS} if own_defaults else {}
        plain = (var_pos is None and var_kw is None and len(positional) == len(params) == required)
        return cls(positional, keyword, var_pos, var_kw, required,
                   tuple(p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is empty),
                   simple, tuple(sorted(p.name for p in params)), {n: str(i) for i, n in enumerate(positional)},
                   plain)

    def bind(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any] | None:
        """Bind one call: parameter name -> value (see the module docstring for what is left out), or ``None`` when
        the call does not fit the signature (it will raise ``TypeError`` itself)."""
        positional = self.positional
        n = len(args)
        if self.plain and not kwargs:  # the common case: f(a, b) of def f(a, b)
            return dict(zip(positional, args, strict=True)) if n == len(positional) else None
        npos = len(positional)
        if n > npos:
            if self.var_positional is None:
                return None
            bound = dict(zip(positional, args, strict=False))
            bound[self.var_positional] = args[npos:]
        else:
            bound = dict(zip(positional, args, strict=False))
        if kwargs:
            extra: dict[str, Any] | None = None
            for name, value in kwargs.items():
                if name in self.keyword:
                    if name in bound:  # given by position and by keyword
                        return None
                    bound[name] = value
                elif self.var_keyword is not None:  # a positional-only name passed by keyword lands here too
                    if extra is None:
                        extra = {}
                    extra[name] = value
                else:
                    return None
            if extra:
                bound[self.var_keyword] = extra  # type: ignore[index]  # (set whenever extra is)
        if n < self.required_positional and any(p not in bound for p in positional[n:self.required_positional]):
            return None
        if any(p not in bound for p in self.required_keyword):
            return None
        for name, default in self.simple_defaults.items():
            if name in bound and _is_default(bound[name], default):
                del bound[name]
        return bound


def _is_default(value: Any, default: Any) -> bool:
    """Whether ``value`` hashes as ``default`` would: same type and value; floats by bit pattern (``-0.0`` is not
    ``0.0``, a NaN only when it is the default object itself)."""
    if value is default:
        return True
    if type(value) is not type(default) or value != default:
        return False
    return type(value) is not float or math.copysign(1.0, value) == math.copysign(1.0, default)


def binding_of(original: Any, owner: Any) -> Binding | None:
    """The :class:`Binding` of a target, built at weave time.

    Args:
        original: what the weaver found on ``owner`` (``inspect.getattr_static``): a function, or a
            ``classmethod``/``staticmethod`` object.
        owner: the class or module holding it: a method of a class (not a ``staticmethod``) and a ``classmethod``
            lose their first parameter, which wrapt passes as ``instance``, never in ``args`` (as
            :func:`skipweave.weaving.weaver` reads parameter positions).

    Returns:
        The binding, or ``None`` when the target has no signature ``inspect`` can read (a builtin, some C
        extension callables): its calls are fingerprinted by the ``arguments`` rule.
    """
    func = original.__func__ if isinstance(original, (classmethod, staticmethod)) else original
    while (inner := _skipweave_wrapped(func)) is not None:  # a target woven by another role: its own function
        func = inner
    try:
        params = list(inspect.signature(func).parameters.values())  # follows __wrapped__: the unwrapped function
    except (TypeError, ValueError) as exc:
        logger.debug("skipweave: no signature of %r (%s); its calls are fingerprinted as passed", func, exc)
        return None
    drops_first = isinstance(original, classmethod) or (inspect.isclass(owner) and not isinstance(original,
                                                                                                    staticmethod))
    if drops_first and params and params[0].kind in _POSITIONAL:
        params = params[1:]
    # A decorated target (functools.wraps, a wrapt decorator) is called through its wrapper, which may supply a
    # default of its own (``kwargs.setdefault("temperature", 0.7)``): ``gen(b)`` and ``gen(b, temperature=1.0)``
    # then differ although 1.0 is the inner default. The parameters still name the arguments; defaults are not used.
    return Binding.of(params, own_defaults=not hasattr(func, "__wrapped__"))


def _skipweave_wrapped(func: Any) -> Any:
    """The function inside ``func`` when ``func`` is skipweave's own wrapper (a target another role wove first),
    else ``None``."""
    from skipweave.weaving.unpatch import wrapper_of

    wrapper = wrapper_of(func)
    # a proxy, and the front of one, name it as `skipweave_proxy` (this module sits below the proxy's: no import)
    return func.__wrapped__ if getattr(wrapper, "skipweave_proxy", None) is not None else None


__all__ = ["Binding", "binding_of"]
