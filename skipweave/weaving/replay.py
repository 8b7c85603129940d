"""Replay of one call: find the entry that serves it, read it, and hand the host the recorded result.

The serving step is chosen beforehand (:meth:`~skipweave.weaving.calls.CallLedger.choose`); here the call is
matched to an entry of that step's part (:mod:`skipweave.policy.matching`), the entry is read and decoded
(:meth:`Replayer.read_entry`, file I/O only: an ``async`` target runs it in a worker thread), and served
(:meth:`Replayer.serve`, in the host's thread: fingerprint check, echoes and declared effects, RNG state, counters).
An entry that cannot be served is set aside and the call runs live and is recorded again. See
docs/architecture.md for the path of one call.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any, NoReturn

from skipweave import report
from skipweave.config.schema import OnForeign, OnMismatch
from skipweave.policy.expressions import ExpressionFailed
from skipweave.policy.matching import Match, PartView, match_call, view_of
from skipweave.store.errors import EntryForeign
from skipweave.store.format import codec
from skipweave.store.format.environment import Field, changes_from, describe, fields_of, identical
from skipweave.store.format.manifest import EntryInvalid, seconds_of
from skipweave.store.format.versions import fingerprint_rule
from skipweave.store.fs import UnsafePath
from skipweave.store.identity import started_unix, this_writer
from skipweave.weaving.calls import LIVE_ONLY, NOT_SERVED, Call, Hit, Unserved
from skipweave.weaving.notes import annotate
from skipweave.weaving.rng import prepare_rng_state

if TYPE_CHECKING:
    from skipweave.weaving.context import TargetContext

logger = logging.getLogger(__name__)

VIEW_TTL_S = 1.0
"""Seconds a part's judged entries (:class:`~skipweave.policy.matching.PartView`) are reused while it is unchanged."""

MAX_VIEWS = 4096
"""Part views one target keeps; past it they are dropped (a long run does not keep every step's view)."""

MAX_WARNED = 1024
"""Environment changes one target remembers having warned of; past it, further ones are logged at DEBUG."""


class FingerprintMismatch(RuntimeError):
    """A replayed entry was recorded for other inputs and ``fingerprint.on_mismatch`` is ``error``."""


class EnvironmentMismatch(FingerprintMismatch):
    """A replayed entry was recorded in another environment (versions of torch, transformers, vllm, sglang or the
    host package, the target's source, a key ``fingerprint.env`` names) and ``fingerprint.on_env_mismatch`` is
    ``error``. The message names role, target, step, call and each changed field ``old -> new``. A subclass of
    :class:`FingerprintMismatch`: a handler of that catches it too."""


class ForeignRecording(RuntimeError):
    """The recording that would serve a call is of a format version this skipweave does not read (a newer skipweave
    wrote it) and ``skip.<role>.on_foreign`` is ``error``. The message names role, target, step, call, the version,
    the skipweave that wrote it and what to upgrade to; the entry is left as it is."""


class ReplayMissing(RuntimeError):
    """A replay-only role (``skip.<role>.replay_only``) met a call no recording serves: the run stops here
    instead of generating. The message names the role, target, step, call index and dump dir."""


Read = tuple[Match, Any, Any]
"""What :meth:`Replayer.read_entry` found: ``(match, key, loaded)`` (``match.call``: the entry's call index)."""


class Replayer:
    """Serves the calls of one woven target from its store.

    Args:
        ctx: the target's context (its role, target, store, ledger and declared effects; its ``on_replay`` hook
            shapes what a hit hands the host).
    """

    def __init__(self, ctx: TargetContext) -> None:
        self.ctx = ctx
        self.views: dict[tuple[int, str], tuple[tuple[Any, ...], PartView, float]] = {}
        self.lock = threading.Lock()
        self.warned: frozenset[Any] = frozenset()  # the environment changes warned of (see mismatch)
        self.live: dict[str, Field] | None = None  # the live environment flattened, once (see live_fields)
        self._vanished: set[int] = set()  # recorded steps removed while this run served them (warned once)
        self._served_from: dict[int, int] = {}  # step -> the recorded step that served a call of it
        self.live_unchecked = False  # it could not be: environments are not compared

    def read_entry(self, d: Call, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Read | Unserved:
        """The file I/O of a replay (match the call to an entry, read and decode it): ``(match, key, loaded)``,
        or, when nothing is served, :class:`~skipweave.weaving.calls.Unserved` (why, and what its live run does).
        Touches no host object: an ``async`` target runs it in a worker thread, off the event loop."""
        if d.served is None or d.no_store:
            if d.served is None and not d.no_store and d.step in self._served_from:
                return self._gone(d)
            return NOT_SERVED
        store = self.ctx.store
        matched = self._match(d, args, kwargs)
        if matched is None:  # the part is unreadable
            return LIVE_ONLY
        match, mtime = matched
        if match.call is None:
            if not match.shared:  # its slot may hold what a newer skipweave recorded
                found = store.foreign_calls(d.served, self.ctx.target.name, d.shard, mtime=mtime).get(d.call)
                if found is not None:
                    return self.foreign(d, found)
            return NOT_SERVED
        key = store.key(d.served, self.ctx.target.name, d.shard, match.call)
        try:
            return match, key, store.load(key, mtime=mtime)
        except EntryForeign as exc:  # kept as it is: never set aside, never recorded over
            return self.foreign(d, exc, slot=match.call)
        except FileNotFoundError:  # removed since the part was read: a plain miss, recorded at the call's position
            return self.vanished(d, key.step)
        except UnsafePath as exc:  # a symlink or a file where a folder should be: never touched
            logger.warning("skipweave: entry %s is not served: %s; running live without recording", key, exc)
            return Unserved(record=False, slot=match.call)
        except (EntryInvalid, codec.CodecError) as exc:
            return self.unusable(key, str(exc), match.call)
        except OSError as exc:
            logger.warning("skipweave: entry %s is unreadable (%s); running live without recording", key, exc)
            return Unserved(record=False, slot=match.call)
        except Exception as exc:  # whatever a crafted or damaged entry provokes: a miss, never the host's error
            return self.unusable(key, f"{type(exc).__name__}: {exc}", match.call)

    def foreign(self, d: Call, found: EntryForeign, slot: int | None = None) -> Unserved:
        """The entry that would serve ``d`` is of a format version this skipweave does not read (``found`` says which
        and who wrote it): ``d`` runs live and records nothing (the entry stays as it is); one WARNING per version
        and writer (then DEBUG), or, with ``skip.<role>.on_foreign: error``, :class:`ForeignRecording`. Returns that
        outcome (``slot``: the entry's call index, when it was matched).

        Raises:
            ForeignRecording: ``on_foreign`` is ``error``.
        """
        role, target = self.ctx.role, self.ctx.target.name
        where = f"role {role.role} target {target} step {d.step} call {d.call}"
        why = (f"its recording is of format version {found.version}, which this skipweave does not read "
               f"({found.writer and 'written by skipweave ' + found.writer or 'writer unknown'})")
        if role.on_foreign is OnForeign.ERROR:
            raise ForeignRecording(f"{where}: {found}; set skip.{role.role}.on_foreign=warn to run such calls live")
        first = self._first(frozenset({("foreign", found.version, found.writer)}))
        (logger.warning if first else logger.debug)(
            "skipweave: %s: %s; running it live and recording nothing over it (skip.%s.on_foreign=error stops "
            "instead)", where, found, role.role)
        return Unserved(why, record=False, slot=slot)

    def _gone(self, d: Call) -> Unserved:
        """``d`` finds no recording, yet an earlier call of its step was served from step ``src``: when ``src`` is
        no longer recorded, another process removed it meanwhile (:meth:`vanished`)."""
        src = self._served_from[d.step]
        if src not in self.ctx.store.recorded_steps(self.ctx.target.name, d.shard):
            return self.vanished(d, src)
        return NOT_SERVED

    def vanished(self, d: Call, step: int) -> Unserved:
        """Recorded step ``step``, which served (or was about to serve) calls of ``d``'s step, was removed while this
        run served it (retention or ``gc`` in another process): ``d`` and the step's other calls run live and are
        recorded (or, in a replay-only run, stop with this as the reason, which the returned outcome holds). Said once
        per step, as a WARNING that names the cause."""
        role = self.ctx.role.role
        why = (f"step {step}, which served this step's calls, was removed while this run served it (by "
               f"retention or gc in another process? skip.{role}.keep.pin keeps the steps other runs replay)")
        with self.lock:
            if step in self._vanished:
                return Unserved(why)
            self._vanished.add(step)
        logger.warning("skipweave: role %s target %s: recorded step %d was removed while this run served it (retention "
                       "or gc in another process?); the calls it would have served run live. Pin the steps other runs "
                       "replay (skip.%s.keep.pin) or give them a dump dir of their own", role, self.ctx.target.name,
                       step, role)
        return Unserved(why)

    def serve(self, d: Call, read: Read | Unserved, args: tuple[Any, ...], kwargs: Mapping[str, Any],
              t0: float) -> Hit | Unserved:
        """The rest of a replay, in the host's thread: fingerprint check, RNG state, echo and effects, counters.
        Returns the :class:`~skipweave.weaving.calls.Hit` (what the host gets), or, when the call runs live,
        :class:`~skipweave.weaving.calls.Unserved` (``read`` itself when nothing was read).

        Raises:
            FingerprintMismatch: the entry was made for other inputs and ``on_mismatch`` is ``error``.
        """
        if isinstance(read, Unserved):
            return read
        ctx = self.ctx
        role, target = ctx.role, ctx.target
        match, key, loaded = read
        recorded_fp = loaded.manifest.get("input_fingerprint")  # "" for entries imported without their inputs
        # the live inputs fingerprinted by the rule the entry's was taken with (format 1: as passed)
        if (not match.exact and d.served == d.step and recorded_fp
                and recorded_fp != (live_fp := ctx.ledger.fingerprint(d, args, kwargs,
                                                                       fingerprint_rule(loaded.manifest)))):
            if not self.mismatch(
                    d, role.fingerprint.on_mismatch, FingerprintMismatch, "on_mismatch",
                    error=f"the recorded entry was made for other inputs (recorded {recorded_fp}, live {live_fp})",
                    hint=f"add the differing fields to skip.{role.role}.fingerprint.ignore",
                    warn=f"inputs differ from the recording (fingerprint {recorded_fp} vs {live_fp})",
                    regenerate="inputs differ from the recording"):
                return Unserved(replace=True, slot=match.call)  # regenerated in its place
        recorded_env = loaded.manifest.get("environment")  # entries written before it have none: served as they were
        # (by value and type: a plain != finds a recorded 0 equal to a live false)
        if (recorded_env is not None and not identical(recorded_env, ctx.environment.value())
                and not self.environment_matches(d, recorded_env)):
            return Unserved(replace=True, slot=match.call)
        try:  # the recorded RNG state is checked now and restored last: a replay that fails changes nothing
            restore_rng = (prepare_rng_state(loaded.rng_state) if role.restore_rng and loaded.rng_state
                           else None)
            result = ctx.on_replay(loaded.result, args, kwargs)
        except Exception as exc:  # a malformed RNG state, or a result the echo hook cannot use
            return self.unusable(key, f"it cannot be replayed here ({type(exc).__name__}: {exc})", match.call)
        effects = ctx.effects
        if effects.echo or effects.effects:
            try:
                effects.restore(d, loaded, result, args, kwargs)
            except ExpressionFailed as exc:  # the config does not fit this call: run it live, keep the entry
                logger.warning("skipweave: entry %s is not served: %s; running live without recording", key, exc)
                return Unserved(str(exc), record=False, slot=match.call)
        if restore_rng is not None:
            restore_rng()
        annotate(result, report.HIT, d.step, d.served, role.note)
        if d.served is not None:
            self._served_from[d.step] = d.served
        report.event(
            report.HIT, role=role.role, target=target.name, step=d.step, served=d.served,
            nbytes=loaded.bytes, seconds=time.perf_counter() - t0,
            saved=seconds_of(loaded.manifest), call=match.call,
        )
        return Hit(result)

    def mismatch(self, d: Call, policy: OnMismatch, raises: type[FingerprintMismatch], setting: str, *, error: str,
                 hint: str, warn: str, regenerate: str, once: frozenset[Any] | None = None) -> bool:
        """The one decision for an entry recorded for another call: its inputs (``fingerprint.on_mismatch``) or its
        environment (``on_env_mismatch``): raise, call through and re-record (``regenerate``), or serve it with a
        WARNING (``warn``). Returns whether the entry is served (``False``: it is regenerated in its place).

        Args:
            d: the call.
            policy: the role's setting.
            raises: the exception raised with ``error``.
            setting: the key of ``policy`` under ``skip.<role>.fingerprint``, for messages.
            error, hint, warn, regenerate: what the message says with each policy (``hint``: how else to settle it).
            once: the changes this mismatch is; a WARNING (``warn``, ``regenerate``) is logged only while one of them is
                new to this target (then at DEBUG: per-sample targets replay thousands of entries). ``None``: each time.

        Raises:
            FingerprintMismatch: ``policy`` is ``error`` (an instance of ``raises``).
        """
        role = self.ctx.role
        where = f"role {role.role} target {self.ctx.target.name} step {d.step} call {d.call}"
        if policy is OnMismatch.ERROR:
            raise raises(f"{where}: {error}; set skip.{role.role}.fingerprint.{setting}=warn or regenerate, or {hint}")
        log = logger.warning if once is None or self._first(once) else logger.debug
        if policy is OnMismatch.REGENERATE:
            log("skipweave: %s: %s; regenerating", where, regenerate)
            return False
        log("skipweave: %s: %s; serving the recording anyway (fingerprint.%s=warn)", where, warn, setting)
        return True

    def _first(self, changes: frozenset[Any]) -> bool:
        """Whether one of ``changes`` was not warned of yet for this target (they are all remembered now). Bounded: a
        crafted dump dir with endless distinct values warns at most :data:`MAX_WARNED` times."""
        with self.lock:
            new = changes - self.warned
            if new and len(self.warned) < MAX_WARNED:
                self.warned |= new
                return True
            return False

    def environment_matches(self, d: Call, recorded: Any) -> bool:
        """Compare a replayed entry's recorded ``environment`` with the live one
        (:mod:`skipweave.store.format.environment`)
        and settle a difference with ``fingerprint.on_env_mismatch`` (:meth:`mismatch`); ``True``: serve the entry.
        A field only one side has is no difference; an environment that is not shaped as skipweave writes it (crafted,
        damaged) is one, named ``environment`` ("invalid: why").

        Raises:
            EnvironmentMismatch: they differ and ``on_env_mismatch`` is ``error``.
        """
        live = self.live_fields()
        if live is None:
            return True
        found = changes_from(recorded, live)
        if not found:
            return True
        role = self.ctx.role
        text = f"the recording was made in another environment: {describe(found)}"
        return self.mismatch(
            d, role.fingerprint.on_env_mismatch, EnvironmentMismatch, "on_env_mismatch", error=text,
            hint="record it again in this environment", warn=text, regenerate=text,
            once=frozenset((name, repr(old), repr(new)) for name, old, new in found))

    def live_fields(self) -> dict[str, Field] | None:
        """This process's environment of the target, flattened as a recorded one is (once per target); ``None`` when
        it cannot be (a host package whose name or version is longer than skipweave records): one WARNING then, and
        replays of this target are served without comparing environments, for the host's call must not fail."""
        if self.live is None and not self.live_unchecked:
            try:
                live = fields_of(self.ctx.environment.value())
            except Exception as exc:  # noqa: BLE001 - EnvironmentInvalid, or whatever a host's odd metadata provokes
                with self.lock:
                    first, self.live_unchecked = not self.live_unchecked, True
                if first:
                    logger.warning("skipweave: role %s target %s: this process's environment cannot be compared "
                                   "(%s: %s); replays are served without checking it", self.ctx.role.role,
                                   self.ctx.target.name, type(exc).__name__, exc)
                return None
            self.live = live
        return self.live

    def _match(self, d: Call, args: tuple[Any, ...],
               kwargs: Mapping[str, Any]) -> tuple[Match, tuple[int, int] | None] | None:
        """The entry of the serving step's part that serves ``d`` (see :mod:`skipweave.policy.matching`) and the
        part folder's modification time the part was read with (for :meth:`StepStore.load`); ``None`` when the part
        cannot be read (the call runs live without recording)."""
        assert d.served is not None
        ctx = self.ctx
        store, target, ledger = ctx.store, ctx.target.name, ctx.ledger
        same = d.served == d.step
        if same and store.is_fresh(d.step, target, d.shard):
            return Match(None, False, False, 0), None  # recorded afresh by this run: nothing in it serves this call
        claimed: Collection[int] = ledger.claimed_at(d.step, d.shard) if same else ()
        try:
            # an entry this process still writes in the background is read once committed (not this target's own
            # recordings of the step: never served to it)
            store.wait_pending(d.served, target, d.shard, skip=claimed)
            # one look at the folder, after the wait (what was pending is committed now), for the part and the load
            mtime = store.folder_mtime(d.served, target)
            entries = store.part_calls(d.served, target, d.shard, mtime=mtime)
        except Exception as exc:  # a symlinked or unreadable folder: never fail the training call
            logger.warning("skipweave: role %s target %s step %d: the recordings of step %d are unreadable "
                           "(%s: %s); running live without recording", ctx.role.role, target,
                           d.step, d.served, type(exc).__name__, exc)
            return None
        # a short part of an interrupted run this process resumes: its entries serve the calls of their step by inputs
        resumed = same and store.is_resumed(d.step, target, d.shard)
        match = match_call(self._view(d.served, d.shard, entries), d.call,
                           lambda rule: ledger.fingerprint(d, args, kwargs, rule), claimed, same_step=same,
                           me=this_writer(), started=started_unix(), inputs_only=resumed)
        if resumed:
            if match.call is not None:
                ledger.claim(d.step, d.shard, match.call)
                store.resumed_served(d.step, target, d.shard, match.call)
        elif match.call is None and (match.shared or match.others):
            if not same and match.shared:
                what = (f"holds recordings of several writers, so step {d.served} cannot serve step {d.step} "
                        f"(action {ctx.role.action.value} serves another step by call order only)")
            elif match.shared:
                what = "holds recordings of several writers"
            else:
                what = "is being recorded by another writer of this run"
            ledger.warn_shared(d, what)
        elif match.call is not None and same:
            ledger.claim(d.step, d.shard, match.call)
        return match, mtime

    def _view(self, step: int, shard: str, entries: tuple[Any, ...]) -> PartView:
        """The part's :class:`PartView`, judged again when its entries changed (``part_calls`` hands back the same
        tuple while the folder is unchanged) or after :data:`VIEW_TTL_S` (a concurrent writer may have ended)."""
        now = time.monotonic()
        with self.lock:
            seen = self.views.get((step, shard))
        if seen is not None and seen[0] is entries and now - seen[2] < VIEW_TTL_S:
            return seen[1]
        view = view_of(entries, me=this_writer(), started=started_unix())
        with self.lock:
            if len(self.views) > MAX_VIEWS:
                self.views.clear()
            self.views[(step, shard)] = (entries, view, now)
        return view

    def unusable(self, key: Any, reason: str, slot: int | None) -> Unserved:
        """An entry that cannot be served: set it aside (one WARNING from the store) and re-record it live at its
        ``slot``, the outcome returned. An action that only reads the store (verify) leaves it where it is and runs
        the call live."""
        if not self.ctx.action.records:
            logger.warning("skipweave: entry %s cannot be compared with (%s); left in place, the call runs live",
                           key, reason)
            return Unserved(reason, record=False, slot=slot)
        try:
            self.ctx.store.discard(key, reason=reason)
        except Exception as exc:  # a read-only cache or a symlinked _set_aside: leave it, run live, record nothing
            logger.warning("skipweave: entry %s is not served (%s) and could not be set aside (%s); running "
                           "live without recording", key, reason, exc)
            return Unserved(reason, record=False, slot=slot)
        return Unserved(reason, replace=True, slot=slot)

    def missing(self, d: Call, unserved: Unserved = NOT_SERVED) -> NoReturn:
        """Stop a replay-only run at a call no recording serves (its call index goes back: nothing ran); ``unserved``:
        why the entry found for it was not served, if one was.

        Raises:
            ReplayMissing: always, naming the role, target, step, call index, shard and dump dir.
        """
        ctx = self.ctx
        role, target, store = ctx.role, ctx.target, ctx.store
        ctx.ledger.give_back(d)
        ctx.ledger.unregister(d)
        what = "validation call" if d.validation else "call"
        holds = store.holdings()  # a bundle names what it holds: no recording run can add to it
        held = f" ({holds})" if holds else ""
        report.replay_missing(f"role {role.role} target {target.name} step {d.step} {what} {d.call} (shard {d.shard}) "
                              f"in dump dir {store.dump_dir} (namespace {store.namespace})")
        if unserved.why:
            raise ReplayMissing(
                f"skipweave: replay-only role {role.role} target {target.name} ({target.path}): the "
                f"recording of step {d.step} {what} {d.call} (shard {d.shard}) in dump dir {store.dump_dir} "
                f"cannot be served: {unserved.why}{held}")
        raise ReplayMissing(
            f"skipweave: replay-only role {role.role} target {target.name} ({target.path}): no "
            f"recording serves step {d.step} {what} {d.call} (shard {d.shard}) in dump dir {store.dump_dir} "
            f"(namespace {store.namespace}){held}; record it first with a recording run over the same steps "
            f"(e.g. {recording_profile(role.role)}{' with record_validation' if d.validation else ''}), narrow "
            f"skip.{role.role}.steps, or run the role live (skip.{role.role}.enable=false)")


def recording_profile(role: str) -> str:
    """How to record ``role``, for a message: ``+skip=<role>_cache`` when skipweave ships that profile (the rollout
    and every phase), else a recording action for the role's own profile."""
    from skipweave.config.profiles import shipped_profiles

    name = f"{role}_cache"
    return f"+skip={name}" if name in shipped_profiles() else f"skip.{role}.action=cache"


__all__ = ["EnvironmentMismatch", "FingerprintMismatch", "MAX_VIEWS", "MAX_WARNED",
           "Read", "ReplayMissing", "Replayer", "VIEW_TTL_S", "recording_profile"]
