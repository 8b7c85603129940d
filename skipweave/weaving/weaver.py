"""The weaver: turn a validated :class:`SkipConfig` into wrapt patches, and take them off again.

Modelled on OpenTelemetry's ``instrument()``/``uninstrument()`` pair: :meth:`Weaver.weave` is
idempotent (the same plan twice is a no-op, never a double wrap) and :meth:`Weaver.unweave` removes
exactly skipweave's wrappers, splicing them out from under other tools' wrapt wrappers.

Targets in modules not yet imported are patched from a post-import hook (ddtrace's approach), so the
host library is never imported just to be patched and ``from mod import func`` copies made after the
import see the patch.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import os
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

import wrapt

from skipweave import failures, lifecycle, report
from skipweave.accounts import Expected
from skipweave.config.errors import ConfigError
from skipweave.config.schema import RoleConfig, ShardKind, SkipConfig, TargetSpec
from skipweave.policy.bypass import describe_bypass, make_bypass
from skipweave.store import runs, upkeep
from skipweave.store.bundle.archive import BundleRefused
from skipweave.store.bundle.layout import is_bundle_path
from skipweave.store.bundle.store import open_role_store, shared_archive
from skipweave.store.fs import dump_dir_problem
from skipweave.store.identity import end_run, made_here, run_id, run_started
from skipweave.store.retention import KeepRule
from skipweave.store.step_store import StepStore
from skipweave.store.write_behind import flush
from skipweave.weaving.actions import action_class
from skipweave.weaving.binding import binding_of
from skipweave.weaving.main_script import MAIN, WATCH, names_main_script
from skipweave.weaving.notes import RESULT_NOTES
from skipweave.weaving.proxy import SkipProxy, shard_label, wraps_coroutine_function
from skipweave.weaving.resolve import ResolvedPath, TargetNotFound, resolve_owner, split_path
from skipweave.weaving.script_check import undefined_in_script
from skipweave.weaving.unpatch import remove_wrapper

logger = logging.getLogger(__name__)


@dataclass
class Patch:
    """One applied (or pending) patch.

    Attributes:
        role, target: what it serves.
        rpath: module and attribute path.
        proxy: the wrapper's decision object, once created.
        owner, attr: where the wrapper was installed.
        handle: the wrapt ``FunctionWrapper`` installed (identity used to remove it).
        pending: waiting for the module's first import.
        failed: its weave raised (the error said why; the exit summary says nothing more of it).
    """

    role: RoleConfig
    target: TargetSpec
    rpath: ResolvedPath
    proxy: SkipProxy | None = None
    owner: Any = None
    attr: str = ""
    handle: Any = None
    pending: bool = True
    failed: bool = False


@dataclass
class _State:
    plan_key: str | None = None
    plan: SkipConfig | None = None
    patches: list[Patch] = field(default_factory=list)
    stores: dict[tuple[str, str, str], StepStore] = field(default_factory=dict)
    generation: int = 0
    warned: set[str] = field(default_factory=set)  # roles whose depends_on_update WARNING was logged


def _check_note_keys(plan: SkipConfig) -> None:
    """Two enabled roles must not note their results under one key (``skip.<role>.note``, else the host's own, e.g.
    verl's ``skipweave``): a host merging a step's results (verl's ``DataProto.union``) would meet two different
    values under it. Roles that all leave ``note`` unset share the host's key, as the rollout roles always have.

    Raises:
        ConfigError: a role's ``note`` is the host's key while another enabled role leaves its ``note`` unset.
    """
    host_keys = {key for _, key in RESULT_NOTES.current()}
    defaulted = [r.role for r in plan.enabled_roles if r.note is None]
    for role in plan.enabled_roles:
        if role.note in host_keys and defaulted:
            raise ConfigError(f"skip.{role.role}.note", role.note,
                              f"a key other than the host's own {role.note!r}, which role {defaulted[0]} writes "
                              f"(its note is unset)")


class Weaver:
    """Owns the patches of one process. Use the module-level :func:`weave` / :func:`unweave`."""

    def __init__(self) -> None:
        self._state = _State()
        self._lock = threading.RLock()
        self._weaving = False

    @property
    def plan(self) -> SkipConfig | None:
        """The plan currently woven, or ``None``."""
        return self._state.plan

    @property
    def patches(self) -> list[Patch]:
        """The patches of the current plan (applied and pending)."""
        return list(self._state.patches)

    def weave(self, plan: SkipConfig) -> list[Patch]:
        """Patch every target of every enabled role of ``plan``.

        Weaving the plan already woven does nothing; another plan first unweaves the current one.
        Every target is split and checked before anything is patched.

        Returns:
            The patches (applied now, or pending until their module is imported).

        Raises:
            TargetNotFound: a non-optional target path does not resolve (nothing is patched).
        """
        key = json.dumps(plan.to_config(), sort_keys=True, default=str)
        with self._lock:
            if key == self._state.plan_key:
                return self.patches
            if self._weaving:
                # Splitting a path imports parent packages, whose import hooks (the launcher's deferred
                # weave) may call weave() again on this thread: the outer call finishes the job.
                logger.debug("skipweave: weave() re-entered while weaving; ignored")
                return self.patches
            self._weaving = True
            try:
                return self._weave_locked(plan, key)
            finally:
                self._weaving = False

    def _weave_locked(self, plan: SkipConfig, key: str) -> list[Patch]:
        with self._lock:
            if self._state.plan_key is not None:
                self.unweave()
            patches: list[Patch] = []
            for role in plan.enabled_roles:
                for target in role.targets:
                    if target.stub is not None and not role.replay_only:
                        continue  # the engine a replay-only run does without: called as usual otherwise
                    try:
                        rpath = split_path(target.path, may_import=not target.optional)
                    except TargetNotFound as exc:
                        if target.optional:
                            logger.debug("skipweave: optional target %s skipped: %s", target.path, exc)
                            continue
                        raise
                    patches.append(Patch(role, target, rpath))
            # Eagerly check targets whose module is already imported, and the main script's by its source, before
            # patching any.
            for p in patches:
                if names_main_script(p.rpath.module) is True:  # one name for it: its module object's
                    p.rpath = dataclasses.replace(p.rpath, module=MAIN)
                if p.target.optional:
                    continue
                mod = sys.modules.get(p.rpath.module)
                if mod is not None and p.rpath.module != MAIN:
                    resolve_owner(mod, p.rpath)
                elif names_main_script(p.rpath.module) is not False:
                    # A name the script has not defined yet: refused now when its source proves it never will be
                    # (else WATCH.wait_for weaves it at its definition, or resolves what is defined already).
                    missing = undefined_in_script(p.rpath.module, p.rpath.attr)
                    if missing is not None:
                        raise TargetNotFound(p.target.path, *missing)
            _check_note_keys(plan)
            for role in plan.enabled_roles:  # bad callables, proxy classes, RANK, dump dirs fail before any patch
                if role.shard is not ShardKind.FINGERPRINT:
                    shard_label(role.shard)
                if is_bundle_path(role.dump_dir):  # read in place, never written: judged whole before any patch
                    _judge_bundle(role)
                    unusable = read_only = None
                else:
                    unusable, read_only = dump_dir_problem(role.dump_dir)
                if unusable:
                    raise ConfigError(f"skip.{role.role}.dump_dir", role.dump_dir,
                                      f"a folder skipweave can create or use ({unusable})")
                if read_only:  # (INFO: a replay needs no write; the first record that fails is the WARNING)
                    logger.info("skipweave: skip.%s.dump_dir=%s: %s; recorded steps are replayed, nothing new is "
                                "recorded and unusable entries are not set aside", role.role, role.dump_dir, read_only)
                make_bypass(role.bypass, _resolve_callable)
                for target in role.targets:
                    _proxy_class(target)
            self._state = _State(key, plan, [], {}, self._state.generation + 1)
            failures.arm(plan.strict)
            RESULT_NOTES.role_keys = tuple(dict.fromkeys(r.note for r in plan.enabled_roles if r.note))
            generation = self._state.generation
            run_id()  # now, so that the processes this one starts inherit it (they are writers of this run)
            try:
                for p in patches:
                    report.expect(p.role.role, p.target.name, self._expected(p))
                    self._state.patches.append(p)
                    hook = self._hook(p, generation)
                    judged = names_main_script(p.rpath.module)
                    if judged is not False and WATCH.wait_for(p.rpath.module, p.rpath.attr, hook) and judged:
                        continue  # the main script's: woven when it defines the name
                    wrapt.register_post_import_hook(hook, p.rpath.module)
            except BaseException:
                report.forget_plan()  # a weave that failed has its own message: no exit warnings of its targets
                self.unweave()  # nothing stays patched, and the same plan can be woven again
                raise
            lifecycle.at_exit(lifecycle.FINISH, self.close_parts)
            for store in self._state.stores.values():  # what writers killed earlier left: off the host's calls
                if not is_bundle_path(store.dump_dir):  # (a bundle is never written)
                    upkeep.start(store.dump_dir, store.namespace, store.role)
            run = made_here()
            if run is not None:  # the run's first process owns its marks, and removes them at its end
                for dump_dir in dict.fromkeys(r.dump_dir for r in plan.enabled_roles):
                    runs.claim(dump_dir, run)
                lifecycle.at_exit(lifecycle.REPORT, report.log_summary)  # (once) the summary reads the marks:
                lifecycle.at_exit(lifecycle.REPORT, runs.release)  # registered before their cleanup, so run before it
            applied = sum(not p.pending for p in patches)
            waiting: dict[str, int] = {}
            for p in patches:
                if p.pending:
                    package = p.rpath.module.split(".")[0]
                    waiting[package] = waiting.get(package, 0) + 1
            logger.info(
                "skipweave: woven %d target(s) of role(s) %s%s", applied,
                ", ".join(r.role for r in plan.enabled_roles) or "-",
                "; waiting for their package's first import: " + ", ".join(
                    f"{n} target(s) of {package!r}" for package, n in sorted(waiting.items())) if waiting else "",
            )
            return self.patches

    def _expected(self, patch: Patch) -> Expected:
        """What the exit summary needs of a woven target: its path, its role's steps, and the run marks."""
        store = self._store(patch.role)
        target = patch.target.name

        def mark(kind: str) -> None:
            runs.mark(store.dump_dir, store.namespace, store.role, run_id(), target, kind)

        def elsewhere(kind: str) -> bool:
            return runs.marked(store.dump_dir, store.namespace, store.role, run_id(), target, kind,
                               since=run_started())

        def unwoven() -> str | None:
            if not patch.pending:
                return None
            if patch.target.optional or patch.failed:  # no host of it here; or its failure was said already
                return ""
            return _why_unwoven(patch.rpath)

        return Expected(patch.target.path, report.steps_text(patch.role.steps.to_config()), mark, elsewhere,
                               unwoven, records=action_class(patch.role).records,
                               bypass=describe_bypass(patch.role.bypass, f"skip.{patch.role.role}.bypass"))

    def _hook(self, patch: Patch, generation: int) -> Any:
        def on_import(module: Any) -> None:
            with self._lock:
                if generation != self._state.generation or not patch.pending:
                    return  # unwoven (or re-woven) since the hook was registered
                try:
                    self._apply(patch, module)
                except TargetNotFound as exc:
                    if patch.target.optional:
                        logger.debug("skipweave: optional target %s skipped: %s", patch.target.path, exc)
                        return
                    patch.failed = True  # its own error says why: no exit warning repeats it
                    raise

        return on_import

    def _store(self, role: RoleConfig) -> StepStore:
        key = (role.dump_dir, role.namespace, role.role)
        store = self._state.stores.get(key)
        if store is None:
            keep = role.keep
            if is_bundle_path(role.dump_dir):
                _judge_bundle(role)
            # a bundle (``dump_dir`` ends with .zip) is read in place by a store of its own
            store = open_role_store(role.dump_dir, role.namespace, role.role, allow_pickle=role.allow_pickle,
                                    calls_per_step=role.calls_per_step, trusted_classes=role.trusted_classes,
                                    compress=role.compress_level,
                                    keep=KeepRule(keep.last, keep.bytes, keep.pin if keep.pin is not None else ()))
            self._state.stores[key] = store
        return store

    def weave_object(self, role: RoleConfig, target: TargetSpec, owner: Any, attr: str) -> Patch:
        """Weave ``target`` of ``role`` onto ``owner.attr``, an object that its path does not reach.

        A Ray worker runs an actor class that Ray rebuilt by value, not the class its module holds: that class is
        woven here, exactly as the weaver weaves a target it resolved itself, and :meth:`unweave` removes it.

        Args:
            role: the role serving the target (one of the plan woven).
            target: the target; its ``path`` names ``attr`` of ``owner`` by the module ``owner`` came from.
            owner: the class (or module) holding the attribute.
            attr: the attribute's name on ``owner``.

        Returns:
            The applied patch, now one of :attr:`patches`.

        Raises:
            AttributeError: ``owner`` has no attribute ``attr``.
            TypeError: the target's ``proxy`` is not a subclass of :class:`SkipProxy`.
        """
        where = f"{getattr(owner, '__qualname__', type(owner).__qualname__)}.{attr}"
        patch = Patch(role, target, ResolvedPath(target.path, getattr(owner, "__module__", "") or "", where))
        with self._lock:
            self._install(patch, owner, attr)
            self._state.patches.append(patch)
        return patch

    def _apply(self, patch: Patch, module: Any) -> None:
        owner, attr = resolve_owner(module, patch.rpath)
        self._install(patch, owner, attr)

    def _install(self, patch: Patch, owner: Any, attr: str) -> None:
        """Wrap ``owner.attr`` in a new proxy of ``patch``'s target (the lock held)."""
        original = inspect.getattr_static(owner, attr)
        func = original.__func__ if isinstance(original, (classmethod, staticmethod)) else original
        is_async = inspect.iscoroutinefunction(func)
        bridge = not is_async and wraps_coroutine_function(func)
        positions = _positions(original, owner)
        bypass = make_bypass(patch.role.bypass, _resolve_callable, positions)
        proxy_cls = _proxy_class(patch.target)
        # original: its source and package are the entries' environment; binding: once per target, calls are bound
        # to it, never re-inspected
        proxy = proxy_cls(patch.role, patch.target, self._store(patch.role), bypass, is_async=is_async,
                          bridge=bridge, positions=positions, original=func, binding=binding_of(original, owner))
        proxy.defaults = _defaults(original)
        handle = wrapt.wrap_function_wrapper(owner, attr, proxy.wrapper())
        patch.proxy, patch.owner, patch.attr, patch.handle, patch.pending = proxy, owner, attr, handle, False
        store = self._store(patch.role)  # for a driver whose workers alone weave it: no never-woven warning
        if os.path.isdir(store.dump_dir):  # (weaving makes no dump dir; a call's own marks say it was woven too)
            runs.mark(store.dump_dir, store.namespace, store.role, run_id(), patch.target.name, runs.WOVEN)
        if patch.role.depends_on_update and proxy.action.records:
            self._warn_depends_on_update(patch.role)
        logger.debug("skipweave: patched %s (%s) for role %s", patch.target.path,
                     "async" if is_async else "sync", patch.role.role)

    def _warn_depends_on_update(self, role: RoleConfig) -> None:
        """Once per role and weave, when its first target is patched (a role none of whose targets exists in this
        trainer says nothing): its results come from the weights the run trains (old log-probs, critic values)."""
        if role.role in self._state.warned:
            return
        self._state.warned.add(role.role)
        logger.warning(
            "skipweave: role %s records or replays results computed from weights the run trains: a replay is what "
            "the live call would return only while every update before it is bit-identical to the recording run's; "
            "after a change to the loss, optimizer, data or seeds set skip.%s.enable=false (docs/phases.md#old-log-"
            "probs-and-critic-values)", role.role, role.role)

    def unweave(self) -> None:
        """Remove every skipweave patch of this process, restoring exactly the originals.

        A wrapper buried under another tool's wrapt wrapper is spliced out; one under a non-wrapt
        wrapper (e.g. a ``functools.wraps`` closure) cannot be, and is made a pass-through instead,
        with a warning. Parts this process recorded are closed (marked complete).
        """
        with self._lock:
            WATCH.forget()
            self.close_parts()
            if self._state.plan_key is not None:
                report.end_plan()
                end_run()
            for p in reversed(self._state.patches):
                if p.pending or p.handle is None:
                    continue
                assert p.proxy is not None
                p.proxy.active = False
                why = remove_wrapper(p.owner, p.attr, p.handle)
                if why is not None:
                    logger.warning("skipweave: %s stays wrapped under another tool's wrapper and now passes "
                                   "every call through (%s)", p.target.path, why)
            self._state = _State(generation=self._state.generation + 1)

    def close_parts(self) -> None:
        """Finish the pending background writes, then mark every part this process recorded as complete, then apply
        each role's ``keep`` rule once more (at unweave and interpreter exit: the run's end)."""
        flush()
        stores = list(self._state.stores.values())
        for store in stores:
            try:
                store.close_all()
            except OSError as exc:
                logger.warning("skipweave: could not close recorded steps under %s: %s", store.dump_dir, exc)
        for store in stores:  # after every part is closed: a closed step is no longer held by this process
            store.final_round()


def _judge_bundle(role: RoleConfig) -> None:
    """Open and judge the bundle a role replays from (shared by its roles: :func:`shared_archive`).

    Raises:
        ConfigError: key ``skip.<role>.dump_dir``: no file there, or not a bundle skipweave reads (naming the member
            and why).
    """
    try:
        shared_archive(role.dump_dir)
    except (FileNotFoundError, BundleRefused) as exc:
        raise ConfigError(f"skip.{role.role}.dump_dir", role.dump_dir,
                          f"a bundle skipweave can read (a path ending in .zip names a bundle: {exc})") from None


def _why_unwoven(rpath: ResolvedPath) -> str:
    """Why a target waiting at exit was never woven, for the exit WARNING."""
    name = rpath.attr.split(".", 1)[0]
    # (None: the command line names the script so; at exit, when CPython has taken __file__ off __main__ again)
    if names_main_script(rpath.module) is not False:
        return (f"the main script never defined '{name}' at its top level (a class or function defined inside a "
                "function, or behind a condition that was false, cannot be woven; see docs/own_trainer.md)")
    if rpath.module in sys.modules:
        return f"its module '{rpath.module}' was imported, but '{rpath.attr}' did not resolve in it"
    return (f"its module '{rpath.module}' was never imported by this program (check the path; a class in the "
            "script you run is named __main__:Class.method or by the script's name)")


def _positions(original: Any, owner: Any) -> dict[str, int]:
    """Parameter name -> index in the ``args`` wrapt hands the proxy (``self``/``cls`` are not in them)."""
    func = original.__func__ if isinstance(original, (classmethod, staticmethod)) else original
    try:
        params = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError):
        return {}
    drops_first = isinstance(original, classmethod) or (
        inspect.isclass(owner) and not isinstance(original, staticmethod)
    )
    if drops_first and params:
        params = params[1:]
    return {
        p.name: i for i, p in enumerate(params)
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    }


def _defaults(original: Any) -> dict[str, Any]:
    """Parameter name -> default value, for expressions naming a parameter the host did not pass."""
    func = original.__func__ if isinstance(original, (classmethod, staticmethod)) else original
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return {}
    return {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}


def _proxy_class(target: TargetSpec) -> type[SkipProxy]:
    """The proxy class serving ``target``: its ``proxy`` (a host integration's subclass), else :class:`SkipProxy`."""
    if target.stub is not None:
        from skipweave.weaving.stubs import StubProxy

        return StubProxy
    if not target.proxy:
        return SkipProxy
    cls = _resolve_callable(target.proxy)
    if not (isinstance(cls, type) and issubclass(cls, SkipProxy)):
        raise TypeError(f"target '{target.path}': proxy '{target.proxy}' is not a subclass of SkipProxy")
    return cls


def _resolve_callable(path: str) -> Any:
    rpath = split_path(path)
    module = __import__(rpath.module, fromlist=["_"])
    owner, attr = resolve_owner(module, rpath)
    return getattr(owner, attr)


WEAVER = Weaver()
"""The process-wide weaver behind :func:`skipweave.weave` and :func:`skipweave.unweave`."""
