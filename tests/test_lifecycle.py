"""A woven run ends as the unwoven one would: exit status 0 in every fresh process of a resume run.

The workflow is a user's who resumes a partly recorded run: the store holds steps 11-16 of a DAPO-shaped trainer
(:mod:`tests.apps.resume.dapo_host`), and a run of steps 1-16 records 1-10 and replays 11-16 with no delay between
calls. Before skipweave joined its writer thread at exit, most such processes aborted after a clean run
("terminate called without an active exception", exit status 134): the writer was still freeing a batch's
tensors when the interpreter finalized. The abort is a race, so each shape runs in many fresh processes.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.integrations.hydra.runner import Run, clean_env, run

pytestmark = pytest.mark.slow  # starts processes: left out of the fast tier (README)

APP = Path(__file__).resolve().parent / "apps" / "resume"
TARGET = "dapo_host.Rollout.generate_sequences"
FIRST, RESUMED, LAST = 1, 11, 16
CALLS = {s: 1 + s % 3 for s in range(FIRST, LAST + 1)}
RECORDED_LIVE = sum(n for s, n in CALLS.items() if s < RESUMED)  # 20 generations; 12 calls replayed


def results(r: Run) -> tuple[int, dict[str, str]]:
    """(generations that really ran, digest per call) over every RESULT line of a run, its children's included."""
    real, digests = 0, {}
    for line in r.stdout.splitlines():
        if line.startswith("RESULT "):
            got = json.loads(line[len("RESULT "):])
            real += got["real"]
            digests.update(got["digests"])
    return real, digests


def drive(mode: str, first: int, last: int, dump: Path | None, cwd: Path) -> Run:
    args = [sys.executable, str(APP / "drive.py"), mode, str(first), str(last)]
    return run([*args, *([str(dump)] if dump else [])], cwd=cwd, env=clean_env(PYTHONPATH=str(APP)))


@pytest.fixture(scope="module")
def resume(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    """A store holding steps 11-16 (recorded by an earlier run), and the unwoven run's digests of steps 1-16."""
    tmp = tmp_path_factory.mktemp("resume")
    with ThreadPoolExecutor(2) as pool:
        earlier = pool.submit(drive, "weave", RESUMED, LAST, tmp / "store", tmp)
        reference = pool.submit(drive, "unwoven", FIRST, LAST, None, tmp)
        assert earlier.result().returncode == 0, earlier.result()
        assert reference.result().returncode == 0, reference.result()
    yield tmp / "store", results(reference.result())[1]


def resumed_runs(store: Path, count: int, command: object) -> list[tuple[Run, Path]]:
    """``count`` fresh processes, each on its own copy of ``store``, two at a time; ``command(dump, cwd)`` -> Run."""
    def one(i: int) -> tuple[Run, Path]:
        cwd = store.parent / f"{command.__name__}-{i}"  # type: ignore[attr-defined]
        cwd.mkdir()
        shutil.copytree(store, cwd / "store")
        return command(cwd / "store", cwd), cwd / "store"  # type: ignore[operator]

    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(one, range(count)))


def check(runs: list[tuple[Run, Path]], reference: dict[str, str]) -> None:
    """Every process exited 0, generated steps 1-10 for real and got results identical to the unwoven run's."""
    failed = [r for r, _ in runs if r.returncode != 0 or "terminate called" in r.stderr]
    assert not failed, f"{len(failed)} of {len(runs)} runs did not exit 0; the first:\n{failed[0]}"
    for r, _ in runs:
        real, digests = results(r)
        assert real == RECORDED_LIVE, r
        assert digests == reference, r


def weave_run(dump: Path, cwd: Path) -> Run:
    """``weave()`` at the top of a plain script."""
    return drive("weave", FIRST, LAST, dump, cwd)


def hydra_run(dump: Path, cwd: Path) -> Run:
    """A Hydra app given ``+skip=rollout_cache`` on its command line."""
    return run([sys.executable, str(APP / "hydra_train.py"), f"hydra.run.dir={cwd}/out", f"+first={FIRST}",
                f"+last={LAST}", "+skip=rollout_cache", f"skip.rollout.dump_dir={dump}",
                f"+skip.rollout.targets.gen={TARGET}"], cwd=cwd, env=clean_env(PYTHONPATH=str(APP)))


def launcher_run(dump: Path, cwd: Path) -> Run:
    """The unwoven program under ``skipweave run``."""
    return run([sys.executable, "-m", "skipweave.cli", "run", "--skip", "rollout_cache",
                f"skip.rollout.dump_dir={dump}", f"+skip.rollout.targets.gen={TARGET}", "--",
                sys.executable, str(APP / "drive.py"), "unwoven", str(FIRST), str(LAST)],
               cwd=cwd, env=clean_env(PYTHONPATH=str(APP)))


def threads_run(dump: Path, cwd: Path) -> Run:
    """Steps in non-daemon threads still recording when the main thread returns."""
    return drive("threads", FIRST, LAST, dump, cwd)


def fork_run(dump: Path, cwd: Path) -> Run:
    """The parent runs steps 1-8, a forked ``multiprocessing`` child 9-16."""
    return drive("fork", FIRST, LAST, dump, cwd)


def spawn_run(dump: Path, cwd: Path) -> Run:
    """The same with a spawned child, which weaves for itself."""
    return drive("spawn", FIRST, LAST, dump, cwd)


def daemons_run(dump: Path, cwd: Path) -> Run:
    """Daemon threads of the host's record without pause until the interpreter ends them, beside the steps; their
    own calls do no torch work, so only skipweave's could abort the process (it hung, flushing their endless
    recordings, before skipweave stopped recording once the exit began)."""
    return drive("daemons", FIRST, LAST, dump, cwd)


# (shape, fresh processes): the plain script, where the abort showed in 9 of 20 before the fix, runs most often; at
# that rate 12 processes all pass by chance once in ~1,300 suites, and every shape ends through the same exit path
SHAPES = [(weave_run, 12), (hydra_run, 4), (launcher_run, 4), (threads_run, 4), (fork_run, 3), (spawn_run, 3),
          (daemons_run, 2)]


@pytest.mark.parametrize(("command", "count"), SHAPES, ids=[c.__name__ for c, _ in SHAPES])
def test_every_fresh_process_of_a_resume_run_exits_0(resume: tuple[Path, dict[str, str]], command: object,
                                                     count: int) -> None:
    store, reference = resume
    check(resumed_runs(store, count, command), reference)
