"""Schema of the ``skip`` configuration: one :class:`RoleConfig` per role, each key declared once.

The shape follows verl's ``skip.<role>`` section (``enable``, ``dump_dir``, ``steps``, ``action``) and
adds what a zero-change tool needs: ``targets`` (what to hijack), ``step`` (where the step number
comes from), ``bypass`` (which calls always run live) and the store's safety knobs.

The defaults name no host: where a host's calls carry their step, validation flag and per-run ids is the host's
*convention*, declared by its integration and named by a role (``convention: verl``, see
:mod:`skipweave.config.conventions`), whose values fill the keys the role leaves unset.

Each key is declared once, as a field with its default and parser (:func:`skipweave.config.fields.key`); the
keys, their parsing (:mod:`skipweave.config.parse`) and ``to_config`` derive from the declarations. Every value
is checked before anything is patched; a bad value raises :class:`~skipweave.config.errors.ConfigError`
naming the key, the value and what is allowed.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from typing import Any

from skipweave.config.compare import CompareSpec, parse_compare
from skipweave.config.env_keys import parse_env_keys
from skipweave.config.errors import ConfigError
from skipweave.config.fields import Declared, key, keys_of, mapping_parser
from skipweave.config.targets import StubSpec, TargetSpec, parse_targets, targets_form
from skipweave.config.values import (
    StepSet,
    enum_parser,
    optional_bytes,
    optional_count,
    optional_steps,
    optional_str,
    or_default,
    parse_arg_ref,
    parse_bool,
    parse_bytes,
    parse_class_refs,
    parse_compress,
    parse_convention,
    parse_dump_dir,
    parse_echo,
    parse_effects,
    parse_expr,
    parse_namespace,
    parse_note_key,
    parse_optional_path,
    parse_paths,
    parse_pin,
    parse_report_path,
    parse_steps,
)

DEFAULT_DUMP_DIR = "~/.cache/skipweave"

_FUNCTION_PATH_RE = re.compile(r"^[A-Za-z_][\w.]*(:[A-Za-z_][\w.]*)?$")


class Action(str, enum.Enum):
    """What a proxy does at an eligible step.

    - ``cache``: replay the entry recorded for this very step, else call through and record it.
    - ``repeat``: replay this step if recorded, else the nearest earlier recorded step, else the
      nearest later one, else call through and record (verl's current ``repeat``).
    - ``repeat_cycle``: cycle through the recorded steps in order (verl 2026's legacy ``repeat``).
    - ``repeat_last``: always the last recorded step (verl 2026's legacy ``repeat_last``).
    - ``verify``: run the call live and compare its result with the recording of this very step (matched as
      ``cache`` matches); ``serve`` says which of the two the host gets. Records nothing (see docs/verify.md).
    """

    CACHE = "cache"
    REPEAT = "repeat"
    REPEAT_CYCLE = "repeat_cycle"
    REPEAT_LAST = "repeat_last"
    VERIFY = "verify"


class Serve(str, enum.Enum):
    """What a verified call hands the host (``action: verify``).

    - ``live``: the live result (the run goes on as an unwoven run would).
    - ``recorded``: the recording, served as a replay serves it (RNG state included): the run trains on what the
      recording run trained on, so everything downstream stays bit-identical to it.
    """

    LIVE = "live"
    RECORDED = "recorded"


class OnDiverge(str, enum.Enum):
    """What a verified call that diverges from its recording does.

    - ``warn``: log one WARNING line naming the first diverging field (and go on).
    - ``error``: raise :class:`~skipweave.weaving.verifier.Diverged` in the host's call, naming role, target, step,
      call and the first diverging field; the run stops there.
    """

    WARN = "warn"
    ERROR = "error"


class StepSourceKind(str, enum.Enum):
    """Where a proxy reads the training step of a call (see :mod:`skipweave.policy.steps`).

    - ``auto``: the step at ``path`` of argument ``arg`` when ``path`` is set and the call has one there, else the step
      given to :func:`skipweave.set_step`, else the call counter.
    - ``set_step``: the step given to :func:`skipweave.set_step`.
    - ``arg``: argument ``arg`` (at ``path`` inside it, when set).
    - ``attr``: ``path`` of the bound instance.
    - ``regex``: the group of ``pattern`` in the text of argument ``arg`` (at ``path``).
    - ``counter``: the call counter (1, 2, ...).
    - ``expr``: the value of ``expr``.
    """

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
    """What to do when a replayed entry's input fingerprint (``on_mismatch``) or environment (``on_env_mismatch``)
    differs from the live call's."""

    WARN = "warn"
    REGENERATE = "regenerate"
    ERROR = "error"


class OnForeign(str, enum.Enum):
    """What a call does when the entry that would serve it is of a format version this skipweave does not read (a
    newer skipweave wrote it): ``warn`` runs it live, records nothing over the entry and says once which version it
    found and what to upgrade; ``error`` stops the run with :class:`~skipweave.weaving.replay.ForeignRecording`."""

    WARN = "warn"
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
class StepSourceConfig(Declared):
    """Where the step of a call comes from.

    Attributes:
        source: see :class:`StepSourceKind`; ``auto`` (default): the step at ``path`` of the argument when ``path`` is
            set and the call has it, else :func:`skipweave.set_step`'s, else the call counter.
        arg: positional index or keyword name of the argument to read (``auto``, ``arg``, ``regex``).
        path: dotted attribute/key path inside the argument (``auto``, ``arg``, ``regex``) or inside the bound
            instance (``attr``, which needs one), e.g. ``batch.step`` or ``state.global_step``; ``None`` (default):
            the argument itself (``arg``, ``regex``), no argument read (``auto``). A role's ``convention`` may set it.
        pattern: regular expression with one group that captures the step (``regex``), e.g.
            ``sample_\\d+_(\\d+)$`` for sample ids such as ``sample_3_17``.
        expr: a Python expression giving the step (``expr``; setting it selects that source), over ``self``,
            the target's parameters by name, ``args`` and ``kwargs``, e.g. ``self.state.global_step``
            (a ``transformers.Trainer``'s step, counted from 0). See :mod:`skipweave.policy.expressions`.
    """

    source: StepSourceKind = key(StepSourceKind.AUTO, parse=enum_parser(StepSourceKind),
                                 raw_default=lambda data: "auto" if data.get("expr") is None else "expr")
    arg: int | str = key(0, parse=parse_arg_ref)
    path: str | None = key(None, parse=parse_optional_path)
    pattern: str | None = key(None, parse=optional_str)
    expr: str | None = key(None, parse=parse_expr)


def _step_shorthand(value: Any) -> Any:
    """``step: counter`` (a string) means ``{source: counter}``."""
    return {"source": value} if isinstance(value, str) else value


def _check_step(key: str, step: StepSourceConfig) -> None:
    """Refuse a ``step`` whose keys contradict each other (an expression without ``source: expr``, a pattern
    that is no regular expression with a group, or one given to another source)."""
    if (step.source is StepSourceKind.EXPR) != (step.expr is not None):
        raise ConfigError(f"{key}.expr", step.expr,
                          "an expression exactly when step.source=expr (setting step.expr alone selects it; "
                          f"step.source is {step.source.value!r})")
    if step.pattern is not None or step.source is StepSourceKind.REGEX:
        if step.pattern is None:
            raise ConfigError(f"{key}.pattern", None, "a regular expression with one group, e.g. 'sample_\\d+_(\\d+)$'")
        try:
            compiled = re.compile(step.pattern)
        except re.error as exc:
            raise ConfigError(f"{key}.pattern", step.pattern, f"a valid regular expression ({exc})") from None
        if compiled.groups < 1:
            raise ConfigError(f"{key}.pattern", step.pattern, "a regular expression with one capturing group")
    if step.pattern is not None and step.source is not StepSourceKind.REGEX:
        raise ConfigError(f"{key}.pattern", step.pattern,
                          f"a pattern only with step.source=regex (step.source is {step.source.value!r})")
    if step.source is StepSourceKind.ATTR and not step.path:
        raise ConfigError(f"{key}.path", step.path, "a dotted path into the bound instance when step.source=attr, "
                          "e.g. 'state.global_step'")


@dataclass(frozen=True)
class BypassConfig(Declared):
    """Which calls always run live (record nothing, advance no counter).

    Attributes:
        when: see :class:`BypassKind`. Default ``arg``: any of ``paths`` truthy on argument ``arg`` (with no
            ``paths``, the default, no call is bypassed; a role's ``convention`` may name some).
        arg: positional index or keyword name of the argument to inspect.
        paths: dotted paths inside that argument, e.g. ``batch.is_eval``; a call is bypassed when any is truthy.
        callable: ``pkg.mod:fn`` called as ``fn(args, kwargs) -> bool`` (``when: callable``).
        expr: a Python expression, truthy for a call that runs live (``when: expr``; setting it selects that
            kind), over ``self``, the target's parameters by name, ``args`` and ``kwargs``, e.g.
            ``not self.model.training`` (evaluation) or ``prompts.meta_info.get('validate')``.
    """

    when: BypassKind = key(BypassKind.ARG, parse=enum_parser(BypassKind),
                           raw_default=lambda data: "arg" if data.get("expr") is None else "expr")
    arg: int | str = key(0, parse=parse_arg_ref)
    paths: tuple[str, ...] = key((), parse=parse_paths)
    callable: str | None = key(None, parse=optional_str)
    expr: str | None = key(None, parse=parse_expr)


def _bypass_shorthand(value: Any) -> Any:
    """``bypass: null`` or ``bypass: false`` means ``{when: never}``."""
    return {"when": "never"} if value is None or value is False else value


def _check_bypass(key: str, bypass: BypassConfig) -> None:
    """Refuse a ``bypass`` whose keys contradict each other (an expression without ``when: expr``, a callable
    missing, malformed or given with ``when: never``)."""
    if (bypass.when is BypassKind.EXPR) != (bypass.expr is not None):
        raise ConfigError(f"{key}.expr", bypass.expr,
                          "an expression exactly when bypass.when=expr (setting bypass.expr alone selects it; "
                          f"bypass.when is {bypass.when.value!r})")
    if bypass.when is BypassKind.CALLABLE and not bypass.callable:
        raise ConfigError(f"{key}.callable", None, "a function path 'pkg.mod:fn' when bypass.when=callable")
    if bypass.callable is not None and not _FUNCTION_PATH_RE.match(bypass.callable):
        raise ConfigError(f"{key}.callable", bypass.callable, "a function path such as 'pkg.mod:fn'")
    if bypass.when is BypassKind.NEVER and bypass.callable is not None:
        raise ConfigError(f"{key}.callable", bypass.callable,
                          "no callable when bypass.when=never (set bypass.when=callable to use it)")


@dataclass(frozen=True)
class FingerprintConfig(Declared):
    """How inputs are fingerprinted and what a mismatch on replay does.

    Attributes:
        on_mismatch: ``warn`` (serve and log), ``regenerate`` (call through, re-record) or ``error``.
        ignore: dotted paths left out of the fingerprint: first part an argument index, a keyword
            name or ``*``; e.g. ``*.request_ids`` (ids a host draws anew in every run). A parameter is named by
            its index (after ``self``) or its name however the call passes it (docs/format.md, ``fingerprint_rule``).
            Default: none (a role's ``convention`` may name some).
        include: dotted paths (as ``ignore``'s) of the only parts hashed; empty (default): every part. For a phase
            that reads a few fields of a batch the phases before it add to, e.g. reference log-probs, which read
            ``*.batch.input_ids`` and ``*.batch.attention_mask`` but not the rewards unioned into the batch.
        env: dotted paths into the app's whole config whose values belong to each new entry's environment, e.g.
            ``[actor_rollout_ref.model.path, actor_rollout_ref.rollout.temperature]``: read once when the config is read
            (a path the config does not have is an error; at most 256 paths of at most 256 characters), kept as they
            are or, when long (or an integer beyond 64 bits), as a short hash; a replay compares them, with the versions
            of torch, transformers and the engines the loaded integrations name, the host package's version and the
            target's source, with the recording's (docs/format.md#environment). Held as ``{path: value}`` once read.
        on_env_mismatch: what a replayed entry recorded in another environment does: ``warn`` (serve it; one WARNING
            per changed field), ``regenerate`` (call through, re-record) or ``error``
            (:class:`~skipweave.weaving.replay.EnvironmentMismatch`).
    """

    on_mismatch: OnMismatch = key(OnMismatch.WARN, parse=or_default(OnMismatch.WARN.value, enum_parser(OnMismatch)))
    ignore: tuple[str, ...] = key((), parse=parse_paths)
    include: tuple[str, ...] = key((), parse=parse_paths)
    env: tuple[tuple[str, Any], ...] = key((), parse=parse_env_keys, form=dict)
    on_env_mismatch: OnMismatch = key(OnMismatch.WARN, parse=enum_parser(OnMismatch))


@dataclass(frozen=True)
class KeepConfig(Declared):
    """Which recorded steps of the role are kept; all unset (default): every step, forever.

    Attributes:
        last: keep at most the newest ``last`` steps (a count >= 1); ``None``: no count limit.
        bytes: then remove the oldest steps left until the role's steps hold at most this size (an integer, or
            with a unit: ``500GB``, ``2GiB``); ``None``: no size limit.
        pin: steps never removed (a step, a list of steps and ranges ``'10-20'``); ``None``: none.
    """

    last: int | None = key(None, parse=optional_count)
    bytes: int | None = key(None, parse=optional_bytes)
    pin: StepSet | None = key(None, parse=parse_pin)


DEFAULT_COMPRESS = "none"
"""Default ``skip.<role>.compress`` (chosen from bench/run.py's ``compress`` rows, see docs/performance.md)."""

DEFAULT_WRITE_BUFFER = 2 << 30
"""Default ``skip.<role>.write_buffer``: 2 GiB of recordings in memory at most, per process and role."""


@dataclass(frozen=True)
class RoleConfig(Declared):
    """Validated settings of one role (``skip.<role>``).

    Attributes:
        role: the role name, e.g. ``rollout``.
        convention: the host convention the role's calls follow (``verl``: a ``DataProto``'s step, validation flag
            and per-run ids), declared by a loaded integration (:mod:`skipweave.config.conventions`); its values fill
            the keys the role leaves unset. ``None``: the schema's defaults only. The profiles of a host set it.
        enable: weave this role's targets at all.
        action: see :class:`Action`.
        steps: eligible steps; other steps run live and are not recorded.
        dump_dir: absolute path of the store root (``~`` expanded, made absolute when read).
        namespace: sub-folder of ``dump_dir`` naming the run identity.
        require_shared: in a Ray job, a worker whose ``dump_dir`` is not the driver's folder (a node-local path such
            as ``~/...`` or ``/tmp/...`` on another node; see docs/ray.md#several-nodes) refuses every call of the
            role's targets with :class:`~skipweave.weaving.shared_dirs.DumpDirNotShared` before the target runs,
            instead of one WARNING and recording where the driver never looks.
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
        keep: which recorded steps are kept (:class:`KeepConfig`: ``last``, ``bytes``, ``pin``): after a new step is
            committed, the recording process removes whole steps beyond the newest ``last``, then the oldest until
            the role's steps hold at most ``bytes``, off the recorded calls (in its background writer); and once more
            when the run ends (unweave, exit: at most 5 s, so the rule holds on disk after a quick run too); never a
            pinned step, the step just written or one a writer may still be adding to ([retention](cli.md#retention)).
            Default: every step is kept.
        compress: ``none``, or ``zstd`` / ``zstd:<level>`` (1-22, ``zstd`` meaning level 1): new entries' tensor
            files are compressed with zstandard (a verl batch shrinks about 3x; a warm replay takes about 2.5x
            as long, see docs/performance.md). Entries of either form are served whatever the setting.
        serve: ``action: verify`` only: what a verified call hands the host (:class:`Serve`).
        on_diverge: ``action: verify`` only: what a diverging call does (:class:`OnDiverge`).
        compare: ``action: verify`` only: what "equal" means per field of a result
            (:class:`~skipweave.config.compare.CompareSpec`, default: every field exact).
        report: ``action: verify`` only: the JSON-lines file that gets one record per verified call (absolute once
            read; its path is logged at exit). ``None``: ``skipweave-verify.jsonl`` in a Hydra job's output folder,
            else ``skipweave-verify-<time>-<pid>.jsonl`` in the folder the run started in; fixed when the config is
            read, so the Ray workers of the run write to the same file.
        depends_on_update: the role's results are computed from weights the run itself trains (old log-probs,
            critic values): a replay is the live result only while every update before it is bit-identical to
            the recording run's (same loss, optimizer, data and seeds). When a target of such a role is patched
            (any action but ``verify``), a WARNING says so (docs/phases.md). The profiles of such roles set it.
        follows: a role whose ``dump_dir``, ``namespace``, ``steps`` and ``fingerprint.env`` this one takes where it
            leaves them unset, after the config adapters filled theirs (verl's legacy keys, its run identity): one
            store for every phase of a step, and one list of config keys its recordings are checked against. The
            phase profiles set ``rollout`` (and declare its store keys, so that the role exists when no rollout
            profile is composed); a role the config does not have is an error naming the roles it has.
        on_foreign: what a call does whose recording is of a format version this skipweave does not read, written by
            a newer skipweave (:class:`OnForeign`): ``warn`` (run it live, record nothing over the entry, one
            WARNING per version naming the skipweave to upgrade to) or ``error``. Such an entry is never served,
            set aside or removed.
        note: the key under which this role's results carry how skipweave settled their call (verl's
            ``meta_info[<note>]``); ``None``: the host's own key (``skipweave``). The phase profiles give each phase
            a key of its own (``skipweave_reward``, ...): verl's ``DataProto.union`` of a step's phase results
            refuses two different values under one key, as a replayed reward beside a recorded reference has.
    """

    role: str
    convention: str | None = key(None, parse=parse_convention)
    enable: bool = key(False, parse=parse_bool)
    action: Action = key(Action.CACHE, parse=enum_parser(Action))
    steps: StepSet = key(parse=parse_steps, default_factory=StepSet)
    dump_dir: str = key(DEFAULT_DUMP_DIR, parse=or_default(DEFAULT_DUMP_DIR, parse_dump_dir))
    namespace: str = key("default", parse=or_default("default", parse_namespace))
    require_shared: bool = key(False, parse=parse_bool)
    targets: tuple[TargetSpec, ...] = key((), parse=parse_targets, form=targets_form)
    step: StepSourceConfig = key(parse=mapping_parser(StepSourceConfig, shorthand=_step_shorthand, check=_check_step),
                                 default_factory=StepSourceConfig, raw_default={})
    bypass: BypassConfig = key(parse=mapping_parser(BypassConfig, shorthand=_bypass_shorthand, check=_check_bypass),
                               default_factory=BypassConfig, raw_default={})
    fingerprint: FingerprintConfig = key(parse=mapping_parser(FingerprintConfig), default_factory=FingerprintConfig,
                                         raw_default={})
    shard: ShardKind = key(ShardKind.AUTO, parse=enum_parser(ShardKind))
    restore_rng: bool = key(True, parse=parse_bool)
    allow_pickle: bool = key(False, parse=parse_bool)
    trusted_classes: tuple[str, ...] = key((), parse=parse_class_refs)
    calls_per_step: int | None = key(None, parse=optional_count)
    record_steps: StepSet | None = key(None, parse=optional_steps)
    echo: tuple[tuple[str, str], ...] = key((), parse=parse_echo, form=dict)
    effects: tuple[str, ...] = key((), parse=parse_effects)
    single_flight: bool = key(True, parse=parse_bool)
    replay_only: bool = key(False, parse=parse_bool)
    record_validation: bool = key(False, parse=parse_bool)
    write_buffer: int = key(DEFAULT_WRITE_BUFFER, parse=parse_bytes)
    keep: KeepConfig = key(parse=mapping_parser(KeepConfig), default_factory=KeepConfig, raw_default={})
    compress: str = key(DEFAULT_COMPRESS, parse=parse_compress)
    serve: Serve = key(Serve.LIVE, parse=enum_parser(Serve))
    on_diverge: OnDiverge = key(OnDiverge.WARN, parse=enum_parser(OnDiverge))
    compare: CompareSpec = key(parse=parse_compare, default_factory=CompareSpec, raw_default=None)
    report: str | None = key(None, parse=parse_report_path)
    depends_on_update: bool = key(False, parse=parse_bool)
    follows: str | None = key(None, parse=optional_str)
    note: str | None = key(None, parse=parse_note_key)
    on_foreign: OnForeign = key(OnForeign.WARN, parse=enum_parser(OnForeign))

    @property
    def compress_level(self) -> int | None:
        """The zstd level of ``compress``, ``None`` for ``none``."""
        return None if self.compress == "none" else int(self.compress.split(":", 1)[1])


STRICT_KEY = "strict"
"""The key of ``skip.strict`` (:attr:`SkipConfig.strict`): a setting of the run, not a role."""

RUN_KEYS: tuple[str, ...] = (STRICT_KEY,)
"""The keys directly under ``skip`` that are settings of the run as a whole, not roles."""


@dataclass(frozen=True)
class SkipConfig:
    """The whole validated ``skip`` section: roles by name, in config order, and the settings of the run as a whole.

    Attributes:
        roles: the roles by name (``skip.<role>``), in config order.
        strict: fail the run when skipweave failed at what it was asked while the program went on: a target never
            woven, a role that recorded and replayed nothing, a record that could not be written, a step or bypass
            that could not be read. The exit summary names each with its key, and a program that would end with exit
            status 0 ends with 4 instead; a non-zero status of the program's own is kept. ``skipweave run --strict``
            sets it; with Hydra, ``+skip.strict=true``. A program that calls ``skipweave.weave()`` itself keeps its
            exit status and gets an ERROR line instead (docs/troubleshooting.md#a-run-that-recorded-nothing). Being
            a key of ``skip``, ``strict`` is no role's name.
    """

    roles: dict[str, RoleConfig] = field(default_factory=dict)
    strict: bool = False

    @property
    def enabled_roles(self) -> list[RoleConfig]:
        """Roles with ``enable: true`` and at least one target."""
        return [r for r in self.roles.values() if r.enable and r.targets]

    def to_config(self) -> dict[str, Any]:
        """Return ``{"skip": {role: mapping, ...}}`` (and ``strict: true`` when set), JSON-serialisable;
        :func:`parse_skip` accepts it."""
        out: dict[str, Any] = {name: role.to_config() for name, role in self.roles.items()}
        if self.strict:
            out[STRICT_KEY] = True
        return {"skip": out}


ROLE_KEYS: tuple[str, ...] = keys_of(RoleConfig)
"""The keys of a ``skip.<role>`` mapping, in :class:`RoleConfig`'s order (derived from its declarations)."""

NESTED_ROLE_KEYS: dict[str, tuple[str, ...]] = {
    name: keys_of(cls)
    for name, cls in (("step", StepSourceConfig), ("bypass", BypassConfig), ("fingerprint", FingerprintConfig),
                      ("keep", KeepConfig))
}
"""The keys of the role keys that hold a fixed mapping (``skip.<role>.step.source`` …), derived from their classes."""

__all__ = ["DEFAULT_COMPRESS", "DEFAULT_DUMP_DIR", "DEFAULT_WRITE_BUFFER", "NESTED_ROLE_KEYS", "ROLE_KEYS", "RUN_KEYS",
           "STRICT_KEY", "Action", "CompareSpec", "OnDiverge", "Serve",
           "BypassConfig", "BypassKind", "FingerprintConfig", "KeepConfig", "OnForeign", "OnMismatch", "RoleConfig",
           "ShardKind",
           "SkipConfig",
           "StepSet", "StepSourceConfig", "StepSourceKind", "StubSpec", "TargetSpec"]
