"""The ``targets`` of a role: what to hijack, and what a stub target hands the host in replay-only runs."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from skipweave.config.errors import ConfigError
from skipweave.config.fields import sub_mapping
from skipweave.config.values import parse_bool, parse_str
from skipweave.store.fs import NAME_RULE, name_problem

_DOTTED = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"
_TARGET_PATH_RE = re.compile(rf"^(?:{_DOTTED}:{_DOTTED}|[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)\Z")
"""``module:attr.path`` or a dotted path of two parts or more: no empty part (``Policy.``), and never one name
alone (``generate``: no module to find it in)."""
_PROXY_PATH_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


@dataclass(frozen=True)
class TargetSpec:
    """One method or function to hijack.

    Attributes:
        name: the key under ``skip.<role>.targets``; used in the store layout.
        path: ``pkg.mod:Qual.name`` or the dotted form Hydra uses for ``_target_``.
        optional: when True a path that does not resolve is logged and skipped, not an error.
        proxy: ``pkg.mod:Class`` of a :class:`~skipweave.weaving.proxy.SkipProxy` subclass that serves
            this target instead of the generic proxy (a host integration, e.g. verl's agent loop);
            ``None`` for the generic proxy.
        stub: the target is woven only in replay-only runs (``replay_only: true``) and never called there:
            see :class:`StubSpec`. ``None``: a target the role records and replays.
    """

    name: str
    path: str
    optional: bool = False
    proxy: str | None = None
    stub: StubSpec | None = None


@dataclass(frozen=True)
class StubSpec:
    """What a stub target hands the host instead of calling it (replay-only runs; see
    :mod:`skipweave.weaving.stubs`).

    Attributes:
        returns: what a call of a function or method target returns (``null``: ``None``; a coroutine's
            awaitable for an ``async`` target). A class target (its constructor) returns a stand-in instance.
        stand_in: a method target returns a stand-in of its class instead of ``returns`` (a factory such as
            verl's ``AgentLoopManager.create`` classmethod); ``methods`` and ``attrs`` then apply to it.
        methods: for a class target: method name -> what it returns on the stand-in (``null`` for a no-op
            such as ``shutdown``); other methods of the class the host calls fail, naming the method.
        attrs: for a class target: attribute name -> its value on the stand-in (e.g. ``workers: []``).
    """

    returns: Any = None
    stand_in: bool = False
    methods: tuple[tuple[str, Any], ...] = ()
    attrs: tuple[tuple[str, Any], ...] = ()

    def to_config(self) -> dict[str, Any]:
        """The canonical ``stub`` mapping."""
        return {"returns": self.returns, "stand_in": self.stand_in, "methods": dict(self.methods),
                "attrs": dict(self.attrs)}


def normalize_target_path(path: str) -> str:
    """Return ``path`` unchanged; both ``pkg.mod:Qual.name`` and ``pkg.mod.Qual.name`` are accepted."""
    return path.strip()


def parse_targets(key: str, value: Any) -> tuple[TargetSpec, ...]:
    """The ``targets`` mapping: name -> path string, or ``{path, optional, proxy, stub}``; a ``null`` entry is
    left out (it removes a target another config source added)."""
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise ConfigError(
            key, value, "a mapping name -> 'pkg.mod:Class.method' (or {path: ..., optional: true})"
        )
    specs = []
    for name, spec in value.items():
        tkey = f"{key}.{name}"
        if spec is None:  # a null entry removes a target another config source added
            continue
        problem = name_problem(name)
        if problem is not None:  # the name is a folder of the dump dir
            raise ConfigError(key, name, f"target names that are one folder name: {NAME_RULE} (this one {problem})")
        proxy: str | None = None
        stub: StubSpec | None = None
        if isinstance(spec, str):
            path: Any = spec
            optional = False
        elif isinstance(spec, Mapping):
            unknown = set(spec) - {"path", "optional", "proxy", "stub"}
            if unknown:
                raise ConfigError(
                    tkey, dict(spec), f"keys 'path', 'optional', 'proxy' and 'stub' only (got "
                                      f"{sorted(unknown, key=str)})"
                )
            path = spec.get("path")
            optional = parse_bool(f"{tkey}.optional", spec.get("optional", False))
            stub = _stub(f"{tkey}.stub", spec.get("stub")) if "stub" in spec else None
            proxy = parse_str(f"{tkey}.proxy", spec.get("proxy"), optional=True)
            if proxy is not None and not _PROXY_PATH_RE.match(proxy):
                raise ConfigError(f"{tkey}.proxy", proxy, "a class path like 'pkg.mod:ProxyClass'")
        else:
            raise ConfigError(tkey, spec, "a target path string or {path: ..., optional: true}")
        if not isinstance(path, str) or not _TARGET_PATH_RE.match(path.strip()):
            raise ConfigError(
                f"{tkey}" + (".path" if isinstance(spec, Mapping) else ""),
                path,
                "a path like 'pkg.mod:Class.method' or 'pkg.mod.Class.method': a module and a name inside it, "
                "without an empty part",
            )
        if stub is not None and proxy is not None:
            raise ConfigError(f"{tkey}.proxy", proxy, "no proxy on a stub target (a stub is never called)")
        specs.append(TargetSpec(name=str(name), path=normalize_target_path(path), optional=optional, proxy=proxy,
                                stub=stub))
    return tuple(specs)


def _stub_value(key: str, value: Any) -> Any:
    """A stub's declared value: plain data only (it is deep-copied into the host on every call)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Mapping):
        return {str(k): _stub_value(f"{key}.{k}", v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_stub_value(f"{key}[{i}]", v) for i, v in enumerate(value)]
    raise ConfigError(key, value, "plain data: null, a number, a string, a list or a mapping")


def _stub(key: str, value: Any) -> StubSpec:
    if value is None or value is True:
        return StubSpec()
    data = sub_mapping(key, value, {"returns", "stand_in", "methods", "attrs"})
    named = {}
    for part in ("methods", "attrs"):
        raw = data.get(part) or {}
        if not isinstance(raw, Mapping):
            raise ConfigError(f"{key}.{part}", raw, "a mapping name -> value, e.g. {shutdown: null}")
        for name in raw:
            if not isinstance(name, str) or not name.isidentifier():
                raise ConfigError(f"{key}.{part}", name, "Python identifiers as names")
        named[part] = tuple((str(n), _stub_value(f"{key}.{part}.{n}", v)) for n, v in raw.items())
    stand_in = parse_bool(f"{key}.stand_in", data.get("stand_in", False))
    if stand_in and data.get("returns") is not None:
        raise ConfigError(f"{key}.returns", data.get("returns"), "no returns with stand_in: true (the call returns "
                                                                "the stand-in)")
    return StubSpec(returns=_stub_value(f"{key}.returns", data.get("returns")), stand_in=stand_in,
                    methods=named["methods"], attrs=named["attrs"])




def targets_form(targets: tuple[TargetSpec, ...]) -> dict[str, Any]:
    """The canonical ``targets`` mapping of parsed targets (what :func:`parse_targets` reads back)."""
    return {
        t.name: {"path": t.path, "optional": t.optional, **({"proxy": t.proxy} if t.proxy else {}),
                 **({"stub": t.stub.to_config()} if t.stub is not None else {})}
        for t in targets
    }


__all__ = ["StubSpec", "TargetSpec", "normalize_target_path", "parse_targets", "targets_form"]
