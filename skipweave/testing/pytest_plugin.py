"""skipweave's pytest plugin: golden-recording tests (docs/ci.md).

Registered through the ``pytest11`` entry point ``skipweave.testing.pytest_plugin`` (pyproject.toml), so installing
skipweave is all a test suite needs; ``-p no:skipweave.testing.pytest_plugin`` turns it off. The entry point's name is
this module's, so that ``-p skipweave.testing.pytest_plugin`` (an environment whose metadata predates it) and the
entry point are one plugin, never two.

- ``@pytest.mark.skipweave(*profiles, dump_dir=... | bundle=..., cfg=..., **overrides)`` weaves the profiles' plan
  for the test's duration (from before its fixtures are set up until after they are torn down, a failing test
  included), on the recording the marker names; paths are relative to the test file's folder.
- ``--skipweave-mode=replay`` (default) replays (replay-only: a call with no recording fails the test naming role,
  target and step) and verifies (a diverging verify role fails it naming the first diverging step, field and
  position); ``record`` re-records (blesses) the recording when the test passes; ``off`` runs the test unwoven.
- ``skipweave_summary``: a fixture with the counters of the test's roles (hits, misses, live calls), which also go
  into the test's report section ``skipweave``.

Every pytest session of an environment with skipweave installed imports this module: it imports nothing of
skipweave's at module level (no torch, no Hydra), and uses only what pytest 7 already has (stash keys, old-style hook
wrappers); :mod:`skipweave.testing.golden` is imported by a marked test only.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from skipweave.testing.golden import GoldenRun, Summary

MODES = ("replay", "record", "off")
"""The values of ``--skipweave-mode``, the default first (:data:`skipweave.testing.golden.MODES`)."""

MARKER = "skipweave"
_RUN: pytest.StashKey[GoldenRun] = pytest.StashKey()
_PASSED: pytest.StashKey[bool] = pytest.StashKey()
_LIVE: pytest.StashKey[dict[str, GoldenRun]] = pytest.StashKey()  # runs not finished yet, by node id


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--skipweave-mode``."""
    group = parser.getgroup("skipweave", "skipweave golden-recording tests")
    group.addoption(
        "--skipweave-mode", dest="skipweave_mode", choices=MODES, default=MODES[0],
        help="what tests marked @pytest.mark.skipweave do with their recording: replay it (default; a call it does "
             "not hold or a diverging verify role fails the test), record it anew and bless it when the test passes, "
             "or run unwoven (off)")


def pytest_configure(config: pytest.Config) -> None:
    """Register the marker."""
    config.addinivalue_line(
        "markers",
        f"{MARKER}(*profiles, dump_dir=None, bundle=None, cfg=None, **overrides): weave skipweave's profiles for the "
        "test's duration on the recording dump_dir= (or bundle=), relative to the test file; --skipweave-mode says "
        "whether it is replayed (default), re-recorded or left off (docs/ci.md)")


def _mode(config: pytest.Config) -> str:
    return str(config.getoption("skipweave_mode", MODES[0]))


def pytest_report_header(config: pytest.Config) -> str | None:
    """Say the mode when it is not the default (a session that re-records should say so at the top)."""
    mode = _mode(config)
    return None if mode == MODES[0] else f"skipweave: --skipweave-mode={mode}"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Weave a marked test's plan before its fixtures are set up (a fixture may build what a stand-in replaces).

    A plain hook, not a wrapper: when the weave fails, the other plugins' setup wrappers (log capture) have run and
    their teardowns find what they left."""
    marker = item.get_closest_marker(MARKER)
    if marker is not None:
        from skipweave.config.errors import ConfigError
        from skipweave.testing.golden import GoldenError, GoldenRun, MarkerError, MarkerSpec, Mode
        from skipweave.weaving.resolve import TargetNotFound

        try:
            spec = MarkerSpec.from_marker(marker.args, marker.kwargs, item.path.parent)
            run = GoldenRun(spec, Mode(_mode(item.config)), item.nodeid)
            run.start()
        except (MarkerError, GoldenError, ConfigError, TargetNotFound) as exc:  # for people: no plugin traceback
            pytest.fail(f"{type(exc).__name__}: {exc}", pytrace=False)
        item.stash[_RUN] = run
        item.config.stash.setdefault(_LIVE, {})[item.nodeid] = run


def _fail(outcome: Any, message: str) -> None:
    """Fail the phase a hook wrapper wraps, said for people (no traceback through the plugin)."""
    try:
        pytest.fail(message, pytrace=False)
    except pytest.fail.Exception as exc:
        if not hasattr(outcome, "force_exception"):  # pluggy < 1.1: raised from a hook wrapper, it fails the phase
            raise
        outcome.force_exception(exc)


# Old-style wrappers (hookwrapper=True), which every pytest this plugin may meet knows: the plugin is imported by
# every pytest session of the environment, and pluggy before 1.1 refuses `wrapper=True` at import.
@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, None]:
    """Run the test; then fail it for what its body could not see (a divergence or a missing recording the code under
    test swallowed), and put its summary into its report section."""
    run = item.stash.get(_RUN, None)
    outcome = yield
    if run is None:
        return
    failed = outcome.excinfo is not None  # the Diverged or ReplayMissing that failed it says where; add what to do
    problems = run.problems(body_failed=failed)
    item.add_report_section("call", "skipweave", "\n".join([run.summary().text(), *problems]))
    if failed:
        return
    if problems:
        _fail(outcome, "\n".join(problems))
        return
    item.stash[_PASSED] = True


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, Any, None]:
    """After the test's fixtures are torn down: unweave (a failing test too), then bless or drop its recording. Only
    a test whose setup, call and teardown passed blesses; one that cannot be blessed (a role that recorded nothing,
    a path that is no recording, a pack that fails) fails its teardown, the recording left as it was."""
    outcome = yield
    run = item.stash.get(_RUN, None)
    if run is None:
        return
    from skipweave.testing.golden import GoldenError

    del item.stash[_RUN]
    item.config.stash.get(_LIVE, {}).pop(item.nodeid, None)
    passed = item.stash.get(_PASSED, False)
    torn_down = outcome.excinfo is None
    why = "the test did not pass" if not passed else "a fixture's teardown failed"
    try:
        line = run.finish(passed=passed and torn_down, why=why)
    except GoldenError as exc:
        item.add_report_section("teardown", "skipweave", str(exc))
        _fail(outcome, str(exc))
        return
    item.add_report_section("teardown", "skipweave", line)


@pytest.hookimpl(hookwrapper=True)
def pytest_sessionfinish(session: pytest.Session) -> Generator[None, Any, None]:
    """After the session's own teardown (its fixtures): finish a marked test the session never tore down (a
    KeyboardInterrupt skips the test's teardown), so that it is unwoven and its staging folder removed, nothing
    blessed."""
    yield
    live = session.config.stash.get(_LIVE, {})
    while live:
        _, run = live.popitem()
        run.finish(passed=False, why="the session was interrupted")


@pytest.fixture
def skipweave_summary(request: pytest.FixtureRequest) -> Summary:
    """The counters of the test's roles, read when asked: ``skipweave_summary["rollout"].hits``, ``.misses``,
    ``.live`` (misses, bypasses and verified calls: what ran the real code), a verify role's ``.identical``,
    ``.diverged``...; ``.mode``, ``.recording``, ``.roles()``. A test without the marker (or in mode ``off``) gets an
    empty one."""
    from skipweave.testing.golden import Mode, Summary

    run = request.node.stash.get(_RUN, None)
    return run.summary() if run is not None else Summary(Mode(_mode(request.config)))
