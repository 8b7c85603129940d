"""Schema of the ``skip`` configuration: one :class:`RoleConfig` per role, validated before weaving.

The shape follows verl's ``skip.<role>`` section (``enable``, ``dump_dir``, ``steps``, ``action``) and
adds what a zero-change tool needs: ``targets`` (what to hijack), ``step`` (where the step number
comes from), ``bypass`` (which calls always run live) and the store's safety knobs.

Every value is checked here, before anything is patched; a bad value raises
:class:`~skipweave.config.errors.ConfigError` naming the key, the value and what is allowed.
"""

from __future__ import annotations

import difflib
import enum
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from skipweave.config.errors import ConfigError
from skipweave.config.legacy import MISSING
from skipweave.store.fs import NAME_RULE, name_problem

DEFAULT_DUMP_DIR = "~/.cache/skipweave"


class Action(str, enum.Enum):
    """What a proxy does at an eligible step.

    - ``cache``: replay the entry recorded for this very step, else call through and record it.
    - ``repeat``: replay this step if recorded, else the nearest earlier recorded step, else the
      nearest later one, else call through and record (verl's current ``repeat``).
    - ``repeat_cycle``: cycle through the recorded steps in order (verl 2026's legacy ``repeat``).
    - ``repeat_last``: always the last recorded step (verl 2026's legacy ``repeat_last``).
    """

    CACHE = "cache"
    REPEAT = "repeat"
    REPEAT_CYCLE = "repeat_cycle"
    REPEAT_LAST = "repeat_last"


class StepSourceKind(str, enum.Enum):
    """Where a proxy reads the training step of a call (see :mod:`skipweave.policy.steps`)."""

    AUTO = "auto"
    SET_STEP = "set_step"
    ARG = "arg"
    ATTR = "attr"
    REGEX = "regex"
    COUNTER = "counter"
    EXPR = "expr"


class BypassKind(str, enum.Enum):
    """How a proxy decides that a call always runs live (see :mod:`skipweave.policy.bypass`)."""

    ARG = "arg"
    NEVER = "never"
    CALLABLE = "callable"
    EXPR = "expr"


class OnMismatch(str, enum.Enum):
    """What to do when a replayed entry's input fingerprint differs from the live call's."""

    WARN = "warn"
    REGENERATE = "regenerate"
    ERROR = "error"


class ShardKind(str, enum.Enum):
    """How entries of several processes calling one target at one step are kept apart.

    - ``auto`` / ``rank``: the ``RANK`` environment variable (verl's worker groups and torchrun set it
      in every worker), else ``LOCAL_RANK``, else ``0``. Writers that share a shard this way (Ray actors or
      threads without a rank of their own) are told apart by their inputs.
    - ``fingerprint``: the input fingerprint (each distinct input is its own shard).
    - ``none``: one shard for every process.
    """

    AUTO = "auto"
    RANK = "rank"
    FINGERPRINT = "fingerprint"
    NONE = "none"


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


@dataclass(frozen=True)
class StepSet:
    """The steps eligible for record/replay: every step, or a union of inclusive ranges.

    Attributes:
        ranges: inclusive ``(first, last)`` pairs, sorted; ``None`` means every step.
    """

    ranges: tuple[tuple[int, int], ...] | None = None

    def __contains__(self, step: object) -> bool:
        if self.ranges is None:
            return True
        if not isinstance(step, int):
            return False
        for lo, hi in self.ranges:
            if lo <= step <= hi:
                return True
        return False

    def to_config(self) -> str | list[int | str]:
        """Return the canonical config form: ``"all"`` or a list of ints and ``"a-b"`` strings."""
        if self.ranges is None:
            return "all"
        return [lo if lo == hi else f"{lo}-{hi}" for lo, hi in self.ranges]


@dataclass(frozen=True)
class StepSourceConfig:
    """Where the step of a call comes from.

    Attributes:
        source: see :class:`StepSourceKind`; ``auto`` is verl's convention
            (``meta_info["global_steps"]`` of the first argument when present, else the call counter).
        arg: positional index or keyword name of the argument to read (``arg``, ``regex``).
        path: dotted attribute/key path inside the argument (``arg``, ``regex``) or inside the
            bound instance (``attr``), e.g. ``meta_info.global_steps`` or ``state.global_step``.
        pattern: regular expression with one group that captures the step (``regex``), e.g.
            ``sample_\\d+_(\\d+)$`` for verl's async sample ids.
        expr: a Python expression giving the step (``expr``; setting it selects that source), over ``self``,
            the target's parameters by name, ``args`` and ``kwargs``, e.g. ``self.state.global_step``
            (a ``transformers.Trainer``'s step, counted from 0). See :mod:`skipweave.policy.expressions`.
    """

    source: StepSourceKind = StepSourceKind.AUTO
    arg: int | str = 0
    path: str = "meta_info.global_steps"
    pattern: str | None = None
    expr: str | None = None


@dataclass(frozen=True)
class BypassConfig:
    """Which calls always run live (record nothing, advance no counter).

    Attributes:
        when: see :class:`BypassKind`. Default ``arg``: any of ``paths`` truthy on argument ``arg``,
            which with the defaults is verl's ``meta_info["validate"]`` on the first argument.
        arg: positional index or keyword name of the argument to inspect.
        paths: dotted paths inside that argument; a call is bypassed when any is truthy.
        callable: ``pkg.mod:fn`` called as ``fn(args, kwargs) -> bool`` (``when: callable``).
        expr: a Python expression, truthy for a call that runs live (``when: expr``; setting it selects that
            kind), over ``self``, the target's parameters by name, ``args`` and ``kwargs``, e.g.
            ``not self.model.training`` (evaluation) or ``prompts.meta_info.get('validate')``.
    """

    when: BypassKind = BypassKind.ARG
    arg: int | str = 0
    paths: tuple[str, ...] = ("meta_info.validate",)
    callable: str | None = None
    expr: str | None = None


@dataclass(frozen=True)
class FingerprintConfig:
    """How inputs are fingerprinted and what a mismatch on replay does.

    Attributes:
        on_mismatch: ``warn`` (serve and log), ``regenerate`` (call through, re-record) or ``error``.
        ignore: dotted paths left out of the fingerprint: first part an argument index, a keyword
            name or ``*``; e.g. ``*.non_tensor_batch.uid`` (verl's per-run random ids).
    """

    on_mismatch: OnMismatch = OnMismatch.WARN
    ignore: tuple[str, ...] = ("*.non_tensor_batch.uid", "*.meta_info.timing")


DEFAULT_COMPRESS = "none"
"""Default ``skip.<role>.compress`` (chosen from bench/run.py's ``compress`` rows, see docs/performance.md)."""

DEFAULT_WRITE_BUFFER = 2 << 30
"""Default ``skip.<role>.write_buffer``: 2 GiB of recordings in memory at most, per process and role."""


@dataclass(frozen=True)
class RoleConfig:
    """Validated settings of one role (``skip.<role>``).

    Attributes:
        role: the role name, e.g. ``rollout``.
        enable: weave this role's targets at all.
        action: see :class:`Action`.
        steps: eligible steps; other steps run live and are not recorded.
        dump_dir: absolute path of the store root (``~`` expanded, made absolute when read).
        namespace: sub-folder of ``dump_dir`` naming the run identity.
        targets: what to hijack, in config order.
        step: where the step comes from.
        bypass: which calls always run live.
        fingerprint: input fingerprint settings.
        shard: how several processes' entries are kept apart.
        restore_rng: on replay, restore the generators the real call changed (python `random`, numpy's global
            generator, torch CPU and CUDA) to the state it left them in; the ones it did not change are neither
            recorded nor touched.
        allow_pickle: let results the safe codec cannot hold be pickled (and loaded).
        trusted_classes: ``pkg.mod:Class`` classes a replay may rebuild besides the ones the codec approves by
            itself (dataclasses, enums and namedtuples already imported, verl's ``DataProto``, tensordict);
            e.g. a DataProto-like class of your own. A listed class's module may be imported on replay.
        calls_per_step: calls one process makes per step, when known; used to tell a step left
            incomplete by an interrupted run. ``None``: learned from finished steps, else 1.
        record_steps: for ``repeat*`` actions, steps recorded when missing even though another
            recorded step could serve them (verl 2026's ``1..max_dump_step``); ``None``: only the first.
        echo: live values a replay copies into the served result, ``{destination: source}``: the destination an
            item or attribute of ``result``, the source an expression over the call (the generic form of
            verl's ``uid`` echo), e.g. ``{"result.meta_info['request_id']": "prompts.meta_info['request_id']"}``.
        effects: attributes or items the target changes besides returning its result, e.g. ``self._metrics``
            or ``self.state.num_input_tokens_seen``: their values after the real call are recorded with the
            result and put back on replay (mappings and lists in place; of a list the call only appended to,
            just the appended items, appended again), so a replay leaves the host as the real call did.
        replay_only: nothing of the role runs live: every eligible call (and validation call, see
            ``record_validation``) is served from the store, and one whose recording is missing stops the run
            with :class:`~skipweave.weaving.proxy.ReplayMissing` naming role, target, step, call and dump
            dir; targets declared with ``stub`` are woven (never called). Profile ``rollout_replay``.
        record_validation: validation calls (the ones ``bypass`` lets through) still run live, and are recorded
            apart from training calls (shard ``val_<shard>``, never served to them) for a later replay-only
            run, which serves them. The recording profiles set it.
        single_flight: for ``repeat*`` actions, a call that a recording still being made in this process would
            serve waits for it and is then served, instead of generating too (e.g. steps 1-5 started together
            on an empty store: step 1 generates, 2-5 wait and replay it). ``false``: every such call generates.
        write_buffer: bytes of recordings a process may hold in memory while its background writer commits them
            (see :mod:`skipweave.store.write_behind`): a recorded call returns once its result is copied, and
            one that would go over waits for room. An entry larger than the buffer, or ``0``, is written in the
            caller's thread before the call returns. Given as an integer or with a unit (``512MB``, ``2GiB``).
        compress: ``none``, or ``zstd`` / ``zstd:<level>`` (1-22, ``zstd`` meaning level 1): new entries' tensor
            files are compressed with zstandard (a verl batch shrinks about 3x; a warm replay takes about 2.5x
            as long, see docs/performance.md). Entries of either form are served whatever the setting.
    """

    role: str
    enable: bool = False
    action: Action = Action.CACHE
    steps: StepSet = field(default_factory=StepSet)
    dump_dir: str = DEFAULT_DUMP_DIR
    namespace: str = "default"
    targets: tuple[TargetSpec, ...] = ()
    step: StepSourceConfig = field(default_factory=StepSourceConfig)
    bypass: BypassConfig = field(default_factory=BypassConfig)
    fingerprint: FingerprintConfig = field(default_factory=FingerprintConfig)
    shard: ShardKind = ShardKind.AUTO
    restore_rng: bool = True
    allow_pickle: bool = False
    trusted_classes: tuple[str, ...] = ()
    calls_per_step: int | None = None
    record_steps: StepSet | None = None
    echo: tuple[tuple[str, str], ...] = ()
    effects: tuple[str, ...] = ()
    single_flight: bool = True
    replay_only: bool = False
    record_validation: bool = False
    write_buffer: int = DEFAULT_WRITE_BUFFER
    compress: str = DEFAULT_COMPRESS

    @property
    def compress_level(self) -> int | None:
        """The zstd level of ``compress``, ``None`` for ``none``."""
        return None if self.compress == "none" else int(self.compress.split(":", 1)[1])

    def to_config(self) -> dict[str, Any]:
        """Return the canonical, JSON-serialisable ``skip.<role>`` mapping (re-parses identically)."""
        return {
            "enable": self.enable,
            "action": self.action.value,
            "steps": self.steps.to_config(),
            "dump_dir": self.dump_dir,
            "namespace": self.namespace,
            "targets": {
                t.name: {"path": t.path, "optional": t.optional, **({"proxy": t.proxy} if t.proxy else {}),
                         **({"stub": t.stub.to_config()} if t.stub is not None else {})}
                for t in self.targets
            },
            "step": {
                "source": self.step.source.value,
                "arg": self.step.arg,
                "path": self.step.path,
                "pattern": self.step.pattern,
                "expr": self.step.expr,
            },
            "bypass": {
                "when": self.bypass.when.value,
                "arg": self.bypass.arg,
                "paths": list(self.bypass.paths),
                "callable": self.bypass.callable,
                "expr": self.bypass.expr,
            },
            "fingerprint": {
                "on_mismatch": self.fingerprint.on_mismatch.value,
                "ignore": list(self.fingerprint.ignore),
            },
            "shard": self.shard.value,
            "restore_rng": self.restore_rng,
            "allow_pickle": self.allow_pickle,
            "trusted_classes": list(self.trusted_classes),
            "calls_per_step": self.calls_per_step,
            "record_steps": None if self.record_steps is None else self.record_steps.to_config(),
            "echo": dict(self.echo),
            "effects": list(self.effects),
            "single_flight": self.single_flight,
            "replay_only": self.replay_only,
            "record_validation": self.record_validation,
            "write_buffer": self.write_buffer,
            "compress": self.compress,
        }


@dataclass(frozen=True)
class SkipConfig:
    """The whole validated ``skip`` section: roles by name, in config order."""

    roles: dict[str, RoleConfig] = field(default_factory=dict)

    @property
    def enabled_roles(self) -> list[RoleConfig]:
        """Roles with ``enable: true`` and at least one target."""
        return [r for r in self.roles.values() if r.enable and r.targets]

    def to_config(self) -> dict[str, Any]:
        """Return ``{"skip": {role: mapping}}``, JSON-serialisable; :func:`parse_skip` accepts it."""
        return {"skip": {name: role.to_config() for name, role in self.roles.items()}}


ROLE_KEYS: tuple[str, ...] = tuple(f.name for f in fields(RoleConfig) if f.name != "role")
"""The keys of a ``skip.<role>`` mapping, in :class:`RoleConfig`'s order (derived from it: one list to keep)."""

NESTED_ROLE_KEYS: dict[str, tuple[str, ...]] = {
    name: tuple(f.name for f in fields(cls))
    for name, cls in (("step", StepSourceConfig), ("bypass", BypassConfig), ("fingerprint", FingerprintConfig))
}
"""The keys of the role keys that hold a fixed mapping (``skip.<role>.step.source`` …), derived from their classes."""

_ROLE_KEYS = set(ROLE_KEYS)
_RANGE_RE = re.compile(r"^\s*(-?\d+)\s*(?:-|\.\.|:)\s*(-?\d+)\s*$")
_PATH_RE = re.compile(r"^[A-Za-z_][\w.]*(:[A-Za-z_][\w.]*)?$")
_ROLE_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*$", re.ASCII)
_CLASS_REF_RE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$", re.ASCII)
_HYDRA_KEY_RE = re.compile(r"^_[a-z]+_$")  # Hydra's instantiate directives (_target_, _convert_ …), not roles


def _enum(cls: type[enum.Enum], key: str, value: Any) -> Any:
    try:
        return cls(value)
    except ValueError:
        allowed = ", ".join(repr(m.value) for m in cls)  # type: ignore[attr-defined]
        raise ConfigError(key, value, f"one of {allowed}") from None


def _bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    raise ConfigError(key, value, "true or false")


def _int(key: str, value: Any, *, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(key, value, "an integer")
    if minimum is not None and value < minimum:
        raise ConfigError(key, value, f"an integer >= {minimum}")
    return value


_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def _bytes(key: str, value: Any) -> int:
    """A size in bytes: an integer >= 0, or a number with a unit (``512MB``, ``1.5GiB``; powers of 1000 or 1024)."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise ConfigError(key, value, "a size in bytes >= 0 (an integer, or e.g. '512MB', '2GiB')")
        return value
    m = _SIZE_RE.match(value) if isinstance(value, str) else None
    size = float(m.group(1)) * _SIZE_UNITS[(m.group(2) or "").lower()] if m is not None else -1.0
    if size < 0 or size != int(size):  # '0.5B' is no number of bytes
        raise ConfigError(key, value, "a size in bytes >= 0 (an integer, or e.g. '512MB', '2GiB')")
    return int(size)


_COMPRESS_RE = re.compile(r"^zstd(?::(\d+))?$")


def _compress(key: str, value: Any) -> str:
    """``none`` (also false/off/null) or ``zstd:<level>`` (``zstd`` or true: level 1), canonical."""
    allowed = "none, zstd (level 1) or zstd:<level> with a level from 1 to 22"
    if value is None or value is False or (isinstance(value, str) and value.strip().lower() in ("none", "off",
                                                                                                 "false", "")):
        return "none"
    if value is True:
        return "zstd:1"
    m = _COMPRESS_RE.match(value.strip().lower()) if isinstance(value, str) else None
    if m is None:
        raise ConfigError(key, value, allowed)
    level = int(m.group(1) or 1)  # level 1: nearly level 3's size at about half its cost (bench: compress)
    if not 1 <= level <= 22:
        raise ConfigError(key, value, allowed)
    return f"zstd:{level}"


def _arg_ref(key: str, value: Any) -> int | str:
    if isinstance(value, bool) or not isinstance(value, (int, str)) or value == "":
        raise ConfigError(key, value, "a positional argument index (0, 1, …) or a keyword argument name")
    if isinstance(value, int) and value < 0:
        raise ConfigError(key, value, "a positional argument index >= 0")
    return value


def _str(key: str, value: Any, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value:
        raise ConfigError(key, value, "a non-empty string")
    return value


def _optional_path(key: str, value: Any) -> str:
    """A dotted path inside an argument; ``""`` or ``null`` means the argument itself."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ConfigError(key, value, "a dotted path such as 'meta_info.global_steps', or '' for the argument itself")
    return value


def _paths(key: str, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(
        isinstance(v, str) and v and all(part for part in v.split(".")) for v in value
    ):
        raise ConfigError(key, value, "a list of dotted paths such as ['0.meta_info.timing'] (no empty parts)")
    return tuple(value)


def parse_steps(key: str, value: Any) -> StepSet:
    """Parse ``steps``: ``"all"``/``null``, an int, ``"a-b"`` (inclusive), ``{start, end}`` or a list.

    Args:
        key: dotted key for error messages.
        value: the raw value.

    Returns:
        A :class:`StepSet` with merged, sorted inclusive ranges.

    Raises:
        ConfigError: on anything else, or a range whose end precedes its start.
    """
    allowed = "'all', a step (int), a list of steps, an inclusive range '3-7' or {start: 3, end: 7}"
    if value is None or (isinstance(value, str) and value.strip().lower() == "all"):
        return StepSet(None)
    items: Iterable[Any]
    if isinstance(value, (list, tuple)):
        items = value
        if not value:
            raise ConfigError(key, value, allowed + " (an empty list would select no step; use enable=false)")
    else:
        items = [value]
    ranges: list[tuple[int, int]] = []
    for item in items:
        if isinstance(item, bool):
            raise ConfigError(key, value, allowed)
        if isinstance(item, int):
            ranges.append((item, item))
        elif isinstance(item, str) and item.strip().lstrip("-").isdigit():
            ranges.append((int(item), int(item)))
        elif isinstance(item, str) and _RANGE_RE.match(item):
            m = _RANGE_RE.match(item)
            assert m is not None
            ranges.append((int(m.group(1)), int(m.group(2))))
        elif isinstance(item, Mapping) and set(item) == {"start", "end"}:
            ranges.append((_int(f"{key}.start", item["start"]), _int(f"{key}.end", item["end"])))
        else:
            raise ConfigError(key, value, allowed)
        if ranges[-1][1] < ranges[-1][0]:
            raise ConfigError(key, value, "ranges must end at or after their start, e.g. '3-7'")
        if ranges[-1][0] < 0:
            raise ConfigError(key, value, allowed + "; steps are 0 or more")
    ranges.sort()
    merged: list[tuple[int, int]] = []
    for lo, hi in ranges:
        if merged and lo <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
        else:
            merged.append((lo, hi))
    return StepSet(tuple(merged))


def normalize_target_path(path: str) -> str:
    """Return ``path`` unchanged; both ``pkg.mod:Qual.name`` and ``pkg.mod.Qual.name`` are accepted."""
    return path.strip()


def _targets(key: str, value: Any) -> tuple[TargetSpec, ...]:
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
            optional = _bool(f"{tkey}.optional", spec.get("optional", False))
            stub = _stub(f"{tkey}.stub", spec.get("stub")) if "stub" in spec else None
            proxy = _str(f"{tkey}.proxy", spec.get("proxy"), optional=True)
            if proxy is not None and not re.match(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$", proxy):
                raise ConfigError(f"{tkey}.proxy", proxy, "a class path like 'pkg.mod:ProxyClass'")
        else:
            raise ConfigError(tkey, spec, "a target path string or {path: ..., optional: true}")
        if not isinstance(path, str) or not re.match(r"^[A-Za-z_][\w.]*(:[A-Za-z_][\w.]*)?$", path.strip()):
            raise ConfigError(
                f"{tkey}" + (".path" if isinstance(spec, Mapping) else ""),
                path,
                "a path like 'pkg.mod:Class.method' or 'pkg.mod.Class.method'",
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
    data = _sub(key, value, {"returns", "stand_in", "methods", "attrs"})
    named = {}
    for part in ("methods", "attrs"):
        raw = data.get(part) or {}
        if not isinstance(raw, Mapping):
            raise ConfigError(f"{key}.{part}", raw, "a mapping name -> value, e.g. {shutdown: null}")
        for name in raw:
            if not isinstance(name, str) or not name.isidentifier():
                raise ConfigError(f"{key}.{part}", name, "Python identifiers as names")
        named[part] = tuple((str(n), _stub_value(f"{key}.{part}.{n}", v)) for n, v in raw.items())
    stand_in = _bool(f"{key}.stand_in", data.get("stand_in", False))
    if stand_in and data.get("returns") is not None:
        raise ConfigError(f"{key}.returns", data.get("returns"), "no returns with stand_in: true (the call returns "
                                                                "the stand-in)")
    return StubSpec(returns=_stub_value(f"{key}.returns", data.get("returns")), stand_in=stand_in,
                    methods=named["methods"], attrs=named["attrs"])


def _sub(key: str, value: Any, allowed_keys: set[str]) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(key, value, f"a mapping with keys {sorted(allowed_keys, key=str)}")
    unknown = set(value) - allowed_keys
    if unknown:
        bad = sorted(unknown, key=str)[0]
        raise no_such_key(f"{key}.{bad}", value[bad], allowed_keys)
    return value


def no_such_key(key: str, value: Any, allowed_keys: Iterable[str]) -> ConfigError:
    """Return the error of a key the schema does not have, with the closest allowed key as a did-you-mean.

    Args:
        key: the full dotted key, e.g. ``skip.rollout.dump_dri``; its last part is matched against ``allowed_keys``.
        value: the value found there.
        allowed_keys: the keys allowed beside it.
    """
    allowed = sorted(allowed_keys, key=str)
    close = difflib.get_close_matches(key.rpartition(".")[2], allowed, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return ConfigError(key, value, f"no such key; {hint}allowed keys are {allowed}")


def unknown_role_key(key: str, value: Any) -> ConfigError | None:
    """Return the :func:`no_such_key` error of a dotted key under ``skip.<role>`` that the schema does not have.

    Args:
        key: a dotted key as an override names it, e.g. ``skip.rollout.dump_dri`` or ``skip.rollout.step.sorce``.
        value: the value given to it, for the message.

    Returns:
        The error, or ``None`` for a key the schema has, one inside a free-form mapping (``targets.<name>``,
        ``echo``) and anything not of the form ``skip.<role>.<key>``.
    """
    parts = key.split(".")
    if len(parts) < 3 or parts[0] != "skip":
        return None
    if parts[2] not in _ROLE_KEYS:
        return no_such_key(".".join(parts[:3]), value, ROLE_KEYS)
    nested = NESTED_ROLE_KEYS.get(parts[2])
    if nested is not None and len(parts) > 3 and parts[3] not in nested:
        return no_such_key(".".join(parts[:4]), value, nested)
    return None


def _given(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` without its ``???`` values: a key a profile declares but leaves unset is read as absent (its
    default), never as ``null`` (which means something of its own for ``bypass``)."""
    return {k: v for k, v in data.items() if not (isinstance(v, str) and v == MISSING)}


def _dump_dir(key: str, value: Any) -> str:
    raw = _str(key, value)
    assert raw is not None
    expanded = os.path.expanduser(os.path.expandvars(raw))
    unset = re.search(r"\$\{?[A-Za-z_]\w*", expanded)
    if unset:  # expandvars leaves an unset variable as it is: it would become a folder named "$VAR"
        raise ConfigError(key, value, f"a path whose variables are set ({unset.group(0).lstrip('${')} is not)")
    if expanded.startswith("~"):
        raise ConfigError(key, value, f"a path whose ~user exists ({expanded.split(os.sep)[0]} does not)")
    return os.path.abspath(expanded)


def parse_role(role: str, raw: Any, *, prefix: str = "skip") -> RoleConfig:
    """Validate one ``skip.<role>`` mapping.

    A ``???`` value (OmegaConf's "missing": a key a profile declares but leaves unset) reads as absent, in the
    role and in its ``step``, ``bypass`` and ``fingerprint`` mappings: the key takes its default.

    Args:
        role: the role name.
        raw: the mapping (plain ``dict``; convert OmegaConf nodes first).
        prefix: key prefix used in error messages.

    Returns:
        The :class:`RoleConfig`.

    Raises:
        ConfigError: the first invalid key, naming it, its value and what is allowed.
    """
    key = f"{prefix}.{role}"
    if not _ROLE_NAME_RE.match(role) or name_problem(role) is not None:
        raise ConfigError(key, role, "a role name made of ASCII letters, digits, '_' and '-'")
    if raw is None:
        raw = {}
    if isinstance(raw, bool):  # `skip.rollout: false` reads as "off"
        raw = {"enable": raw}
    data = _given(_sub(key, raw, _ROLE_KEYS))
    step_raw = data.get("step")
    if isinstance(step_raw, str):
        step_raw = {"source": step_raw}
    step = _given(_sub(f"{key}.step", step_raw, set(NESTED_ROLE_KEYS["step"])))
    bypass_raw = data.get("bypass", {})
    if bypass_raw is None or bypass_raw is False:
        bypass_raw = {"when": "never"}
    bypass = _given(_sub(f"{key}.bypass", bypass_raw, set(NESTED_ROLE_KEYS["bypass"])))
    fp = _given(_sub(f"{key}.fingerprint", data.get("fingerprint"), set(NESTED_ROLE_KEYS["fingerprint"])))

    step_expr = _expression(f"{key}.step.expr", step.get("expr"))
    step_cfg = StepSourceConfig(
        source=_enum(StepSourceKind, f"{key}.step.source", step.get("source", "expr" if step_expr else "auto")),
        arg=_arg_ref(f"{key}.step.arg", step.get("arg", 0)),
        path=_optional_path(f"{key}.step.path", step.get("path", "meta_info.global_steps")),
        pattern=_str(f"{key}.step.pattern", step.get("pattern"), optional=True),
        expr=step_expr,
    )
    if (step_cfg.source is StepSourceKind.EXPR) != (step_expr is not None):
        raise ConfigError(f"{key}.step.expr", step_expr,
                          "an expression exactly when step.source=expr (setting step.expr alone selects it; "
                          f"step.source is {step_cfg.source.value!r})")
    if step_cfg.pattern is not None or step_cfg.source is StepSourceKind.REGEX:
        if step_cfg.pattern is None:
            raise ConfigError(
                f"{key}.step.pattern", None, "a regular expression with one group, e.g. 'sample_\\d+_(\\d+)$'"
            )
        try:
            compiled = re.compile(step_cfg.pattern)
        except re.error as exc:
            raise ConfigError(f"{key}.step.pattern", step_cfg.pattern, f"a valid regular expression ({exc})") from None
        if compiled.groups < 1:
            raise ConfigError(f"{key}.step.pattern", step_cfg.pattern, "a regular expression with one capturing group")

    bypass_expr = _expression(f"{key}.bypass.expr", bypass.get("expr"))
    bypass_cfg = BypassConfig(
        when=_enum(BypassKind, f"{key}.bypass.when", bypass.get("when", "expr" if bypass_expr else "arg")),
        expr=bypass_expr,
        arg=_arg_ref(f"{key}.bypass.arg", bypass.get("arg", 0)),
        paths=_paths(f"{key}.bypass.paths", bypass.get("paths", ["meta_info.validate"])),
        callable=_str(f"{key}.bypass.callable", bypass.get("callable"), optional=True),
    )
    if (bypass_cfg.when is BypassKind.EXPR) != (bypass_expr is not None):
        raise ConfigError(f"{key}.bypass.expr", bypass_expr,
                          "an expression exactly when bypass.when=expr (setting bypass.expr alone selects it; "
                          f"bypass.when is {bypass_cfg.when.value!r})")
    if bypass_cfg.when is BypassKind.CALLABLE and not bypass_cfg.callable:
        raise ConfigError(f"{key}.bypass.callable", None, "a function path 'pkg.mod:fn' when bypass.when=callable")
    if bypass_cfg.callable is not None and not _PATH_RE.match(bypass_cfg.callable):
        raise ConfigError(f"{key}.bypass.callable", bypass_cfg.callable, "a function path such as 'pkg.mod:fn'")

    if bypass_cfg.when is BypassKind.NEVER and bypass_cfg.callable is not None:
        raise ConfigError(f"{key}.bypass.callable", bypass_cfg.callable,
                          "no callable when bypass.when=never (set bypass.when=callable to use it)")
    if step_cfg.pattern is not None and step_cfg.source is not StepSourceKind.REGEX:
        raise ConfigError(f"{key}.step.pattern", step_cfg.pattern,
                          f"a pattern only with step.source=regex (step.source is {step_cfg.source.value!r})")

    calls = data.get("calls_per_step")
    return _checked(RoleConfig(
        role=role,
        enable=_bool(f"{key}.enable", data.get("enable", False)),
        action=_enum(Action, f"{key}.action", data.get("action", "cache")),
        steps=parse_steps(f"{key}.steps", data.get("steps", "all")),
        dump_dir=_dump_dir(f"{key}.dump_dir", _default(data.get("dump_dir"), DEFAULT_DUMP_DIR)),
        namespace=_namespace(f"{key}.namespace", _default(data.get("namespace"), "default")),
        targets=_targets(f"{key}.targets", data.get("targets")),
        step=step_cfg,
        bypass=bypass_cfg,
        fingerprint=FingerprintConfig(
            on_mismatch=_enum(OnMismatch, f"{key}.fingerprint.on_mismatch", fp.get("on_mismatch", "warn")),
            ignore=_paths(f"{key}.fingerprint.ignore", fp.get("ignore", list(FingerprintConfig().ignore))),
        ),
        shard=_enum(ShardKind, f"{key}.shard", data.get("shard", "auto")),
        restore_rng=_bool(f"{key}.restore_rng", data.get("restore_rng", True)),
        allow_pickle=_bool(f"{key}.allow_pickle", data.get("allow_pickle", False)),
        trusted_classes=_class_refs(f"{key}.trusted_classes", data.get("trusted_classes")),
        calls_per_step=None if calls is None else _int(f"{key}.calls_per_step", calls, minimum=1),
        record_steps=None
        if data.get("record_steps") is None
        else parse_steps(f"{key}.record_steps", data["record_steps"]),
        echo=_echo(f"{key}.echo", data.get("echo")),
        effects=_effects(f"{key}.effects", data.get("effects")),
        single_flight=_bool(f"{key}.single_flight", data.get("single_flight", True)),
        replay_only=_bool(f"{key}.replay_only", data.get("replay_only", False)),
        record_validation=_bool(f"{key}.record_validation", data.get("record_validation", False)),
        write_buffer=_bytes(f"{key}.write_buffer", data.get("write_buffer", DEFAULT_WRITE_BUFFER)),
        compress=_compress(f"{key}.compress", data.get("compress", DEFAULT_COMPRESS)),
    ), key, explicit_targets=isinstance(data.get("targets"), Mapping))


def _expression(key: str, value: Any, *, assignable: bool = False) -> str | None:
    """Check a config expression (compiled, as the proxy will); return its text, ``None`` when unset."""
    if value is None:
        return None
    from skipweave.policy.expressions import Expression  # compiles it: a syntax error names the key

    return Expression(key, value, assignable=assignable).text


def _echo(key: str, value: Any) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise ConfigError(key, value, "a mapping {destination: source}, e.g. "
                                      "{\"result.meta_info['uid']\": \"prompts.meta_info['uid']\"}")
    out = []
    for dest, source in value.items():
        dest_text = _expression(f"{key}[{dest!r}]", dest, assignable=True)
        source_text = _expression(f"{key}[{dest!r}]", source)
        assert dest_text is not None and source_text is not None
        out.append((dest_text, source_text))
    return tuple(out)


def _effects(key: str, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise ConfigError(key, value, "a list of attributes or items the target changes, e.g. ['self._metrics']")
    out = []
    for i, item in enumerate(value):
        text = _expression(f"{key}[{i}]", item, assignable=True)
        assert text is not None
        out.append(text)
    return tuple(out)


def _checked(role: RoleConfig, key: str, *, explicit_targets: bool) -> RoleConfig:
    """Refuse combinations that would silently do nothing (checked once the role's values are parsed)."""
    if role.record_steps is not None and role.action is Action.CACHE:
        raise ConfigError(f"{key}.record_steps", role.record_steps.to_config(),
                          "record_steps only with action repeat, repeat_cycle or repeat_last (cache records "
                          "every eligible step)")
    if role.enable and role.targets and all(t.stub is not None for t in role.targets):
        raise ConfigError(f"{key}.targets", [t.name for t in role.targets],
                          "at least one target the role replays besides its stubs (a stub only stands in for "
                          "the engine behind a replayed target)")
    if role.enable and explicit_targets and not role.targets:  # `targets: {}` (a missing key: filled elsewhere)
        raise ConfigError(f"{key}.targets", {}, "at least one target when the role is enabled, e.g. "
                          f"+{key}.targets.gen=my_pkg.rollout:Manager.generate_sequences")
    return role


def _default(value: Any, default: Any) -> Any:
    """``null`` (or missing) means "use skipweave's default"; a profile may leave a key null."""
    return default if value is None else value


def _namespace(key: str, value: Any) -> str:
    text = _str(key, str(value) if isinstance(value, (int, float)) else value)
    assert text is not None
    if name_problem(text) is not None or text.startswith("_"):
        raise ConfigError(key, value, f"{NAME_RULE}, not starting with '_'")
    return text


def _class_refs(key: str, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise ConfigError(key, value, "a list of class paths like 'my_pkg.protocol:Batch'")
    out = []
    for i, ref in enumerate(value):
        if not isinstance(ref, str) or not _CLASS_REF_RE.match(ref.strip()):
            raise ConfigError(f"{key}[{i}]", ref, "a class path like 'my_pkg.protocol:Batch' (module:qualname)")
        out.append(ref.strip())
    return tuple(out)


def parse_skip(skip: Any, *, prefix: str = "skip") -> SkipConfig:
    """Validate a whole ``skip`` section (``None`` or missing means every role disabled).

    Args:
        skip: mapping role name -> role mapping (plain containers).
        prefix: key prefix used in error messages.

    Returns:
        The :class:`SkipConfig`.

    Raises:
        ConfigError: the first invalid key.
    """
    if skip is None:
        return SkipConfig({})
    if not isinstance(skip, Mapping):
        raise ConfigError(prefix, skip, "a mapping of role name -> role settings, e.g. skip.rollout.enable=true")
    return SkipConfig({
        str(name): parse_role(str(name), raw, prefix=prefix)
        for name, raw in skip.items()
        if not _HYDRA_KEY_RE.match(str(name))  # e.g. verl's `skip._target_: verl.utils.skip.SkipManagerConfig`
    })
