"""One golden-recording test: the plan of its mode, woven for the test's duration, judged, then unwoven.

A test marked ``@pytest.mark.skipweave(*profiles, dump_dir=... | bundle=..., cfg=..., **overrides)`` (the plugin,
:mod:`skipweave.testing.pytest_plugin`, reads the marker) runs in one of three modes, ``--skipweave-mode``:

- ``replay`` (default): every enabled role replays from a copy of the recording (the committed one is never written
  to: a run leaves marks in its dump dir), replay-only, so a call no recording serves raises
  :class:`~skipweave.ReplayMissing` naming role, target and step, and the stand-ins (``stub:``) replace the engine. A
  role whose action is ``verify`` runs live and is compared with its recording, with ``on_diverge: error`` unless the
  marker sets it (:class:`~skipweave.Diverged` names step, field and position) and a report file of the test's own,
  read after the call: a divergence, an unrecorded call or a ``ReplayMissing`` the host caught and went on from fails
  the test too.
- ``record``: every enabled role records into a fresh folder beside the recording (a ``verify`` role as ``cache``),
  nothing replay-only, so the real engine runs; when the test passes, that folder replaces the recording (the change
  is *blessed*), when it fails the recording stays as it was.
- ``off``: nothing is woven; the test runs as if unmarked.

Paths the marker names (``dump_dir``, ``bundle``, ``cfg``, profile files) are relative to the test file's folder,
where a committed recording lives beside its test.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from skipweave.testing.bless import bless, bless_bundle, replace_problem
from skipweave.testing.errors import GoldenError, MarkerError

logger = logging.getLogger(__name__)

__all__ = ["GoldenError", "GoldenRun", "MarkerError", "MarkerSpec", "Mode", "MODES", "RoleCounts", "Summary"]


class Mode(str, Enum):
    """What a marked test does with its recording (``--skipweave-mode``)."""

    REPLAY = "replay"
    RECORD = "record"
    OFF = "off"


MODES: tuple[str, ...] = tuple(m.value for m in Mode)
"""The values of ``--skipweave-mode``, the default first."""

RESERVED = ("dump_dir", "bundle", "cfg")
"""The marker's keyword arguments that are no override."""


def _is_path_spec(spec: str) -> bool:
    """A profile spec that names a file (as :func:`skipweave.config.profiles.resolve_profile` tells them)."""
    return spec.endswith((".yaml", ".yml")) or "/" in spec or os.sep in spec


@dataclass(frozen=True)
class MarkerSpec:
    """A ``skipweave`` marker's arguments, checked, its paths absolute.

    Attributes:
        profiles: profile names or absolute profile-file paths, composed in order (later ones win).
        recording: the recording: a dump dir, or a bundle (a ``.zip`` replayed in place, packed anew when blessed).
        kind: ``dump_dir`` or ``bundle``: the argument that named it.
        cfg: the base config (``None``, a mapping, or an absolute path to a YAML file such as the app's config).
        overrides: ``(key under skip, value)`` pairs set after the profiles compose, in the marker's order.
    """

    profiles: tuple[str, ...]
    recording: Path
    kind: str
    cfg: Mapping[str, Any] | Path | None
    overrides: tuple[tuple[str, Any], ...]

    @classmethod
    def from_marker(cls, args: Sequence[Any], kwargs: Mapping[str, Any], test_dir: Path) -> MarkerSpec:
        """Check a marker's arguments.

        Args:
            args: the profiles (names, or paths of profile files relative to ``test_dir``).
            kwargs: ``dump_dir`` or ``bundle`` (exactly one), ``cfg`` and the overrides: ``role.key=value`` pairs
                under ``skip`` (``**{"update.compare.default": {"atol": 1e-6}}``, or ``update__on_diverge="warn"``:
                ``__`` reads as ``.``), whose values are Python values, set as they are.
            test_dir: the folder of the test file: relative paths are relative to it.

        Raises:
            MarkerError: a profile that is no string, neither or both of ``dump_dir`` and ``bundle``, a path that is
                no string, a recording that is the test file's folder or one of its parents, a ``cfg`` file that does
                not exist, an override key that is empty.
        """
        profiles = []
        for spec in args:
            if not isinstance(spec, (str, os.PathLike)) or not str(spec):
                raise MarkerError(f"skipweave marker: profile {spec!r} is not allowed: a profile is a shipped name "
                                  f"('rollout_cache') or the path of a YAML file, relative to {test_dir}")
            text = os.fspath(spec)
            profiles.append(str(test_dir / text) if _is_path_spec(text) and not os.path.isabs(text) else text)
        named = [k for k in ("dump_dir", "bundle") if kwargs.get(k) is not None]
        if len(named) != 1:
            raise MarkerError(f"skipweave marker: got {named or 'neither'} of dump_dir= and bundle=; give exactly one: "
                              "the recording the test replays (dump_dir=: a folder; bundle=: a single-file recording), "
                              f"relative to {test_dir}")
        kind = named[0]
        recording = _path(kind, kwargs[kind], test_dir)
        here = test_dir.resolve()
        if recording.resolve() in (here, *here.parents):
            # blessing renames the recording aside and removes it: never the folder holding the test (or above it)
            raise MarkerError(f"skipweave marker: {kind}={kwargs[kind]!r} is not allowed: it names {recording}, the "
                              "test file's folder or one it lies in, which blessing would replace; name a folder "
                              "(dump_dir=) or a .zip (bundle=) of the recording's own beside the test, e.g. "
                              "dump_dir='golden/my_test'")
        from skipweave.store.bundle.layout import is_bundle_path

        if (kind == "bundle") != is_bundle_path(str(recording)):
            raise MarkerError(f"skipweave marker: {kind}={kwargs[kind]!r} is not allowed: bundle= names a bundle (a "
                              "file ending in .zip, see skipweave pack), dump_dir= a folder")
        cfg = kwargs.get("cfg")
        if cfg is not None and not isinstance(cfg, Mapping):
            cfg = _path("cfg", cfg, test_dir)
            if not cfg.is_file():
                raise MarkerError(f"skipweave marker: cfg={kwargs['cfg']!r}: there is no file {cfg}; cfg= is a "
                                  "mapping or the path of a YAML config (the app's, whose skip node declares its "
                                  "targets), relative to the test file's folder")
        overrides = []
        for key, value in kwargs.items():
            if key in RESERVED:
                continue
            dotted = key.replace("__", ".").strip(".")
            if not dotted or "" in dotted.split("."):
                raise MarkerError(f"skipweave marker: override {key!r} is not allowed: an override names a key under "
                                  "skip, e.g. rollout__steps=[1, 2] or **{'update.compare.default': 'exact'}")
            overrides.append((dotted, value))
        return cls(tuple(profiles), recording, kind, cfg, tuple(overrides))

    @property
    def explicit(self) -> frozenset[str]:
        """The keys the marker's overrides set (a mode leaves them as the marker says)."""
        return frozenset(key for key, _ in self.overrides)


def _path(name: str, value: Any, test_dir: Path) -> Path:
    if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
        raise MarkerError(f"skipweave marker: {name}={value!r} is not allowed: a path (str or os.PathLike), "
                          f"relative to the test file's folder {test_dir}")
    path = Path(os.path.expanduser(os.fspath(value)))
    return path if path.is_absolute() else test_dir / path


def compose(spec: MarkerSpec) -> dict[str, Any]:
    """The marker's plan, validated (follows resolved), as a plain ``{"skip": {...}}`` mapping.

    Raises:
        skipweave.ConfigError: a profile found nowhere, a bad value (naming key, value and what is allowed).
    """
    from omegaconf import OmegaConf

    from skipweave.config.loader import load_skip_config
    from skipweave.integrations.discovery import load_integrations

    load_integrations()  # first: their adapters read the config, their profiles may be named
    base: Any = OmegaConf.load(spec.cfg) if isinstance(spec.cfg, Path) else spec.cfg
    if spec.profiles:
        from skipweave.config.profiles import compose_profile

        cfg = compose_profile(list(spec.profiles), base=base)
    else:
        cfg = OmegaConf.create(base if base is not None else {})
    OmegaConf.set_struct(cfg, False)
    for key, value in spec.overrides:
        OmegaConf.update(cfg, f"skip.{key}", value, merge=True, force_add=True)
    plan: dict[str, Any] = load_skip_config(cfg).to_config()
    return plan


def for_mode(plan: Mapping[str, Any], mode: Mode, dump_dir: Path, report: Path | None,
             explicit: frozenset[str] = frozenset()) -> dict[str, Any]:
    """``plan`` (as :func:`compose` returns it) changed for ``mode`` (not ``off``): every enabled role on ``dump_dir``;
    replaying, replay-only, a verify role reporting to ``report`` and stopping at its first divergence (unless
    ``explicit`` holds its ``on_diverge``); recording, nothing replay-only, a verify role recording as ``cache``."""
    skip: dict[str, Any] = {}
    for name, role in plan.get("skip", {}).items():
        if not isinstance(role, Mapping) or not role.get("enable") or not role.get("targets"):
            skip[name] = role
            continue
        role = {**role, "dump_dir": str(dump_dir)}
        verify = role.get("action") == "verify"
        if mode is Mode.REPLAY:
            if verify:
                role["report"] = str(report) if report is not None else None
                if f"{name}.on_diverge" not in explicit:
                    role["on_diverge"] = "error"  # fail at the first diverging call, naming step, field, position
            else:
                role["replay_only"] = True  # a call with no recording stops the test, naming role, target, step
        else:
            role["replay_only"] = False  # the real engine runs: its stand-ins are woven in replay-only runs only
            if verify:
                role.update(action="cache", serve="live", on_diverge="warn", report=None)
        skip[name] = role
    return {**plan, "skip": skip}


@dataclass(frozen=True)
class RoleCounts:
    """What one role of a marked test did so far (every target of the role summed).

    Attributes:
        role, action: the role and its action in this mode (``cache``, ``verify``, ...).
        replay_only: the role was replay-only (every replaying role is, in mode ``replay``).
        hits, misses, bypasses: calls served from the recording, run live and recorded, run live unrecorded.
        identical, close, diverged, unrecorded: a verify role's calls by how they compared (each ran live).
    """

    role: str
    action: str
    replay_only: bool
    hits: int = 0
    misses: int = 0
    bypasses: int = 0
    identical: int = 0
    close: int = 0
    diverged: int = 0
    unrecorded: int = 0

    @property
    def verified(self) -> int:
        """Calls compared with their recording (or that found none)."""
        return self.identical + self.close + self.diverged + self.unrecorded

    @property
    def live(self) -> int:
        """Calls that ran the real code: misses, bypasses and verified calls."""
        return self.misses + self.bypasses + self.verified

    def text(self) -> str:
        """One line for the test's report section."""
        how = self.action + (", replay-only" if self.replay_only else "")
        line = f"role {self.role} ({how}): hits {self.hits}, misses {self.misses}, live calls {self.live}"
        if self.verified:
            line += (f"; verified {self.verified}: identical {self.identical}, close {self.close}, "
                     f"diverged {self.diverged}, unrecorded {self.unrecorded}")
        return line


class Summary:
    """The counters of a marked test, per role, read when asked (the ``skipweave_summary`` fixture).

    Attributes:
        mode: ``replay``, ``record`` or ``off`` (also for a test without the marker).
        recording: the marker's recording (``None`` without a marker).
        dump_dir: the folder the roles read and write in this test: a copy of the recording (``replay``), the fresh
            folder that replaces it when the test passes (``record``), ``None`` (``off``).
    """

    def __init__(self, mode: Mode, recording: Path | None = None, dump_dir: Path | None = None,
                 counts: Callable[[], dict[str, RoleCounts]] | None = None) -> None:
        self.mode = mode.value
        self.recording = recording
        self.dump_dir = dump_dir
        self._counts = counts or dict

    def roles(self) -> dict[str, RoleCounts]:
        """Each enabled role's counts now, in plan order (empty when nothing is woven)."""
        return self._counts()

    def __getitem__(self, role: str) -> RoleCounts:
        roles = self.roles()
        if role not in roles:
            raise KeyError(f"skipweave_summary: no role {role!r} in this test's plan (mode {self.mode}); its roles: "
                           f"{sorted(roles) or 'none'}")
        return roles[role]

    def text(self) -> str:
        """The report section: the mode, the recording and one line per role."""
        head = f"skipweave mode {self.mode}" + (f", recording {self.recording}" if self.recording else "")
        if self.dump_dir is not None and self.dump_dir != self.recording:
            head += f" (dump dir {self.dump_dir})"
        return "\n".join([head, *("  " + counts.text() for counts in self.roles().values())])


class GoldenRun:
    """The weave of one marked test, from setup to teardown.

    Args:
        spec: the marker's arguments.
        mode: the session's mode.
        nodeid: the test's id, for the commands the messages suggest.
    """

    def __init__(self, spec: MarkerSpec, mode: Mode, nodeid: str) -> None:
        self.spec = spec
        self.mode = mode
        self.nodeid = nodeid
        self.work: Path | None = None  # replay: the temp folder holding the copy and the report
        self.dump_dir: Path | None = None
        self.report: Path | None = None
        self.roles: dict[str, tuple[str, bool, tuple[str, ...]]] = {}  # role -> (action, replay_only, targets)
        self.baseline: dict[tuple[str, str], tuple[int, int, int]] = {}
        self.woven = False
        self.final: dict[str, RoleCounts] | None = None
        self.plan: Any = None  # the SkipConfig woven for the marker (its identity tells whether it is still woven)
        self.namespaces: dict[str, str] = {}  # role -> namespace (where its entries sit in the dump dir)
        self.replaced = False  # the marker's plan was no longer the woven one when last looked at
        self.finished = False

    # ------------------------------------------------------------------ setup
    def start(self) -> None:
        """Weave the plan of the mode (nothing in mode ``off``).

        Raises:
            GoldenError: mode ``replay`` and there is no recording.
            skipweave.ConfigError, skipweave.TargetNotFound: the plan is wrong (nothing is woven).
        """
        if self.mode is Mode.OFF:
            return
        recording = self.spec.recording
        if self.mode is Mode.REPLAY:
            if not recording.exists():
                raise GoldenError(f"skipweave: no recording at {recording} ({self.spec.kind}= of the test's "
                                  f"skipweave marker) to replay; record it: pytest --skipweave-mode=record "
                                  f"'{self.nodeid}'")
            self.work = Path(tempfile.mkdtemp(prefix="skipweave-golden-"))
            self.report = self.work / "verify.jsonl"
            if self.spec.kind == "bundle":
                self.dump_dir = recording  # read in place: a run writes nothing in or beside a bundle
            else:
                self.dump_dir = self.work / "recording"
                # A run leaves marks in its dump dir and may set damaged entries aside: never in the committed one.
                shutil.copytree(recording, self.dump_dir, symlinks=True)
        else:
            problem = replace_problem(recording, self.spec.kind)
            if problem is not None:  # said before the test runs: blessing would refuse it after
                raise GoldenError(f"skipweave mode record: {problem}; {recording} left as it was")
            recording.parent.mkdir(parents=True, exist_ok=True)
            # Beside the recording (one file system), so that blessing it is a rename.
            self.dump_dir = recording.with_name(f".{recording.name}.recording-{uuid.uuid4().hex[:12]}")
            self.dump_dir.mkdir()
        try:
            self._weave()
        except BaseException:
            self._drop_work()
            raise

    def _weave(self) -> None:
        from skipweave import api
        from skipweave.config.loader import load_skip_config
        from skipweave.report import for_target

        assert self.dump_dir is not None
        plan = load_skip_config(for_mode(compose(self.spec), self.mode, self.dump_dir, self.report,
                                         self.spec.explicit))
        self.roles = {r.role: (r.action.value, r.replay_only, tuple(t.name for t in r.targets))
                      for r in plan.enabled_roles}
        self.namespaces = {r.role: r.namespace for r in plan.enabled_roles}
        _quiet_exit_summary()
        api.weave(plan)
        self.woven = True
        self.plan = api.woven_plan()
        for role, (_, _, targets) in self.roles.items():  # after weave: it ended any plan woven before (and its counts)
            for target in targets:
                c = for_target(role, target)
                self.baseline[(role, target)] = (c.hits, c.misses, c.bypasses)

    # ------------------------------------------------------------------ during and after the call
    def summary(self) -> Summary:
        """The test's :class:`Summary` (counts read when asked; frozen once the test is unwoven)."""
        return Summary(self.mode, self.spec.recording, self.dump_dir, self.counts)

    def counts(self) -> dict[str, RoleCounts]:
        """Each enabled role's counts so far."""
        if self.final is not None:
            return dict(self.final)
        from skipweave.report import for_target

        verified = self._verified()
        out = {}
        for role, (action, replay_only, targets) in self.roles.items():
            hits = misses = bypasses = 0
            for target in targets:
                c = for_target(role, target)
                h0, m0, b0 = self.baseline.get((role, target), (0, 0, 0))
                hits, misses, bypasses = hits + c.hits - h0, misses + c.misses - m0, bypasses + c.bypasses - b0
            out[role] = RoleCounts(role, action, replay_only, hits, misses, bypasses, **verified.get(role, {}))
        return out

    def _lines(self) -> list[Mapping[str, Any]]:
        """The lines of the test's verify report (every process of the test appends to it)."""
        from skipweave.verify.report import read_lines

        if self.mode is not Mode.REPLAY or self.report is None or not self.report.exists():
            return []
        return list(read_lines(str(self.report)))

    def _verified(self) -> dict[str, dict[str, int]]:
        from skipweave.verify.report import tally

        lines = self._lines()
        out = {}
        for role in {str(line.get("role")) for line in lines}:
            counts = tally([x for x in lines if x.get("role") == role]).counts
            out[role] = {k: counts.get(k, 0) for k in ("identical", "close", "diverged", "unrecorded")}
        return out

    def plan_replaced(self) -> bool:
        """Whether the marker's plan, woven at setup, is no longer the plan woven (the test or a fixture wove one of
        its own with ``skipweave.weave``, which replaces it, or unwove it): what the test then did is not the
        recording's. Remembered in :attr:`replaced` once seen."""
        if self.woven and not self.replaced:
            from skipweave import api

            self.replaced = api.woven_plan() is not self.plan
        return self.replaced

    def _replaced_text(self) -> str:
        return ("the marker's plan is no longer the one woven: the test or a fixture wove a plan of its own "
                "(skipweave.weave replaces the woven plan) or unwove it; a marked test weaves nothing else")

    def problems(self, *, body_failed: bool = False) -> list[str]:
        """What fails the test although its body passed. Both modes: the marker's plan is no longer woven (the test
        wove its own). Mode ``replay``: a verify role's divergence or unrecorded call, a replay-only call no
        recording served (its ``ReplayMissing`` caught by the host), an enabled verify role that compared no call,
        no enabled role that saw a call (the test verified nothing); each names role, target, step and what to do.
        ``body_failed``: the test failed already (these then say what to do only)."""
        out = []
        if self.plan_replaced():
            out.append(f"skipweave: {self._replaced_text()}; the recording {self.spec.recording} was not "
                       + ("replayed" if self.mode is Mode.REPLAY else "recorded (nothing is blessed)"))
        if self.mode is not Mode.REPLAY:
            return out
        from skipweave.report import replay_missing_noted
        from skipweave.verify.report import UNRECORDED, describe, tally

        lines = self._lines()
        for role in self.roles:
            mine = [x for x in lines if x.get("role") == role]
            first = tally(mine).first
            if first is not None and first.get("status") == "diverged":
                out.append(f"skipweave verify: {describe(first)}; recording {self.spec.recording}. If the change is "
                           f"intended, bless it: pytest --skipweave-mode=record '{self.nodeid}'")
            missing = sorted((x for x in mine if x.get("status") == UNRECORDED),
                             key=lambda x: (x.get("step") or 0, x.get("call") or 0))
            if missing:
                out.append(f"skipweave verify: {describe(missing[0])} ({len(missing)} such call(s)): the recording "
                           f"{self.spec.recording} holds nothing for it; record it: pytest --skipweave-mode=record "
                           f"'{self.nodeid}'")
        where, more = replay_missing_noted()
        if where is not None:
            how = "" if body_failed else " (ReplayMissing, which the code under test caught)"
            out.append(f"skipweave: a replay-only call found no recording{how}: {where}"
                       + (f" (and {more} more)" if more else "")
                       + f"; record it: pytest --skipweave-mode=record '{self.nodeid}'")
        if not body_failed and not self.replaced:
            out.extend(self._idle())
        return out

    def _idle(self) -> list[str]:
        """Mode ``replay``: the roles that checked nothing — an enabled verify role that compared no call, or every
        role at no call at all (a test that passes so verified nothing)."""
        counts = self.counts()
        check = ("check that the test reaches the role's targets ({targets}) at the steps its recording holds "
                 f"(recording {self.spec.recording})")
        out = []
        for role, (action, _, targets) in self.roles.items():
            if action == "verify" and counts[role].verified == 0:
                out.append(f"skipweave: role {role} (verify) compared no call with its recording: the test passed "
                           "having verified nothing; " + check.format(targets=", ".join(targets)))
        if self.roles and not out and all(c.hits + c.live == 0 for c in counts.values()):
            every = ", ".join(f"{r}: {', '.join(t)}" for r, (_, _, t) in self.roles.items())
            out.append("skipweave: no role of the marker saw a call (every role at hits 0, live calls 0): the test "
                       "passed having replayed nothing; " + check.format(targets=every))
        return out

    def unrecorded_roles(self) -> list[str]:
        """Mode ``record``, once unwoven: the enabled roles of the marker with no entry in the fresh recording (the
        store's own scan of it, so calls recorded by other processes count)."""
        from skipweave.store.scan import scan

        assert self.dump_dir is not None
        found = {(p.namespace, p.role) for p in scan(str(self.dump_dir)).parts if p.entries}
        return [role for role in self.roles if (self.namespaces.get(role, "default"), role) not in found]

    # ------------------------------------------------------------------ teardown
    def finish(self, passed: bool, why: str = "the test did not pass") -> str:
        """Unweave, then keep what the mode keeps: ``record`` blesses the fresh recording when the test ``passed``
        (setup, call and teardown) and every enabled role recorded something (else drops it, the recording left as
        it was); ``replay`` drops its copy when the test passed (else keeps it, for the report it names). Once only:
        a second call (the session's end after an interrupt) does nothing.

        Args:
            passed: the test passed (setup, call and teardown).
            why: why it did not, for the line returned.

        Returns:
            One line for the report section: what became of the recording.

        Raises:
            GoldenError: mode ``record``, the test passed, and the recording cannot be blessed: an enabled role
                recorded nothing (named, with whether the test wove its own plan), the path is not a recording
                blessing may replace, or the bundle could not be packed. The recording is left as it was and the
                fresh folder removed.
        """
        if self.mode is Mode.OFF:
            return "skipweave mode off: nothing woven"
        if self.finished:
            return "skipweave: already finished"
        self.finished = True
        if self.woven:
            from skipweave import api

            self.plan_replaced()
            self.final = self.counts()
            api.unweave()  # commits what the background writer still holds
            self.woven = False
        assert self.dump_dir is not None
        recording = self.spec.recording
        if self.mode is Mode.RECORD:
            try:  # the fresh folder goes on every path but the bless that renames it (an interrupt included)
                if not passed:
                    return f"skipweave mode record: {why}; {recording} left as it was"
                idle = self.unrecorded_roles()
                if idle:
                    targets = "; ".join(f"role {r}: {', '.join(self.roles[r][2])}" for r in idle)
                    cause = (f"; {self._replaced_text()}" if self.replaced else
                             "; check that the test reaches the role's targets")
                    raise GoldenError(f"skipweave mode record: {recording} left as it was: enabled role(s) "
                                      f"{', '.join(idle)} of the marker recorded nothing ({targets}){cause}")
                if self.spec.kind == "bundle":
                    bless_bundle(self.dump_dir, recording)
                else:
                    bless(self.dump_dir, recording)
                return f"skipweave mode record: blessed {recording}"
            finally:
                shutil.rmtree(self.dump_dir, ignore_errors=True)
        if passed:
            self._drop_work()
            return f"skipweave mode replay: replayed {recording}"
        return f"skipweave mode replay: the replayed copy of {recording} and the verify report kept in {self.work}"

    def _drop_work(self) -> None:
        if self.mode is Mode.REPLAY and self.work is not None:
            shutil.rmtree(self.work, ignore_errors=True)
        elif self.mode is Mode.RECORD and self.dump_dir is not None:
            shutil.rmtree(self.dump_dir, ignore_errors=True)


_QUIETED: list[bool] = []


def _quiet_exit_summary() -> None:
    """Once per process: give the ``skipweave`` logger a handler of its own (a ``NullHandler``), so that its exit
    summary (totals over every test's weave) does not print on stderr after pytest's result line, where it reads like
    a verdict; records still reach pytest's log capture through the root logger. Each test has its own summary in its
    report section."""
    if not _QUIETED:
        _QUIETED.append(True)
        log = logging.getLogger("skipweave")
        if not log.handlers:
            log.addHandler(logging.NullHandler())
