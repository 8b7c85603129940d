"""Targets in the script the user runs: a class method, a plain function and an async method of
``tests/apps/one_file/train.py``, named ``__main__:...`` and ``train....``, through ``weave()``, ``skipweave run`` and
a Hydra app. Run 1 records, run 2 replays with no real call and the same output. A target never woven is named at
exit."""

from __future__ import annotations

import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.integrations.hydra.runner import Run, clean_env, run

TRAIN = Path(__file__).resolve().parents[1] / "apps" / "one_file" / "train.py"
NAMES = {"cls": "Trainer.generate", "fn": "score", "aio": "AsyncTrainer.generate"}


def _targets(naming: str) -> list[str]:
    prefix = "__main__:" if naming == "main" else "train."
    return [f"+skip.rollout.targets.{key}={prefix}{attr}" for key, attr in NAMES.items()]


def _command(mode: str, naming: str, dump: Path) -> list[str]:
    if mode == "weave":
        return [sys.executable, str(TRAIN), "weave", naming, str(dump)]
    if mode == "run":
        return [sys.executable, "-m", "skipweave.cli", "run", "--skip", "rollout_cache",
                f"skip.rollout.dump_dir={dump}", *_targets(naming), "--", sys.executable, str(TRAIN), "plain",
                naming, "-"]
    return [sys.executable, str(TRAIN), "hydra", naming, "-", f"hydra.run.dir={dump.parent}/hydra",
            "+skip=rollout_cache", f"skip.rollout.dump_dir={dump}", *_targets(naming)]


def _twice(case: tuple[str, str], tmp: Path) -> tuple[Run, Run]:
    mode, naming = case
    folder = tmp / f"{mode}-{naming}"
    folder.mkdir()
    first = run(_command(mode, naming, folder / "dump"), cwd=folder)
    return first, run(_command(mode, naming, folder / "dump"), cwd=folder)


def _line(r: Run, head: str) -> str:
    return next((x for x in r.stdout.splitlines() if x.startswith(head)), f"no {head} line\n{r}")


CASES = [(mode, naming) for mode in ("weave", "run", "hydra") for naming in ("main", "script")]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], tuple[Run, Run]]:
    tmp = tmp_path_factory.mktemp("one_file")
    with ThreadPoolExecutor(2) as pool:
        return dict(zip(CASES, pool.map(lambda case: _twice(case, tmp), CASES), strict=True))


@pytest.mark.parametrize("case", CASES, ids=[f"{m}-{n}" for m, n in CASES])
def test_a_trainer_defined_in_the_script_records_then_replays(runs: dict, case: tuple[str, str]) -> None:
    first, second = runs[case]
    assert first.returncode == 0 and second.returncode == 0, (first, second)
    assert _line(first, "REAL") == "REAL 9", first  # 3 steps x (class method, function, async method)
    assert _line(second, "REAL") == "REAL 0", second
    assert _line(first, "OUT") == _line(second, "OUT")
    assert "never woven" not in first.stderr + first.stdout


def _weave_then(tmp: Path, body: str, target: str) -> Run:
    script = tmp / "app.py"
    script.write_text(textwrap.dedent(f"""
        import skipweave
        skipweave.weave({{"skip": {{"rollout": {{"enable": True, "dump_dir": {str(tmp / "d")!r},
                         "step": "counter", "targets": {{"gen": {target!r}}}}}}}}})
    """) + textwrap.dedent(body))
    return run([sys.executable, str(script)], cwd=tmp, env=clean_env(PYTHONPATH=str(tmp)))


def test_a_target_whose_module_is_never_imported_is_named_at_exit(tmp_path: Path) -> None:
    (tmp_path / "elsewhere.py").write_text("class Gen:\n    def generate(self):\n        return 1\n")
    r = _weave_then(tmp_path, "print('done')\n", "elsewhere.Gen.generate")
    assert r.returncode == 0, r
    assert ("role rollout target gen (elsewhere.Gen.generate) was never woven: its module 'elsewhere' was never "
            "imported") in r.stderr, r
    assert "skip.rollout.targets.gen" in r.stderr


def test_a_class_the_script_never_defines_at_top_level_is_named_at_exit(tmp_path: Path) -> None:
    body = """
        def main():
            class Trainer:
                def generate(self):
                    return 1
            print(Trainer().generate())
        main()
    """
    r = _weave_then(tmp_path, body, "__main__:Trainer.generate")
    assert r.returncode == 0 and r.stdout.strip() == "1", r
    assert "was never woven: the main script never defined 'Trainer' at its top level" in r.stderr, r
    assert "skip.rollout.targets.gen" in r.stderr


def test_a_class_defined_without_the_method_fails_at_its_definition(tmp_path: Path) -> None:
    body = """
        class Trainer:
            def generat(self):
                return 1
        print("after the class")
    """
    r = _weave_then(tmp_path, body, "__main__:Trainer.generate")
    assert r.returncode != 0 and "after the class" not in r.stdout, r
    assert "did you mean 'generat'" in r.stderr, r


def test_a_class_target_needs_no_tracer_and_a_name_never_bound_waits_for_nothing(tmp_path: Path) -> None:
    """A class statement weaves its class (no tracer, so no cost to any call); a name the script never binds is
    not followed either, and is named at exit."""
    body = """
        import sys
        print("TRACE", sys.gettrace())
        class Trainer:
            def generate(self):
                return 1
        print("WOVEN", type(Trainer.__dict__["generate"]).__name__)
    """
    r = _weave_then(tmp_path, body, "__main__:Trainer.generate")
    assert r.returncode == 0 and "TRACE None" in r.stdout and "WOVEN FunctionWrapper" in r.stdout, r
    r = _weave_then(tmp_path, 'import sys\nprint("TRACE", sys.gettrace())\n', "__main__:Traner.generate")
    assert r.returncode == 0 and "TRACE None" in r.stdout, r
    assert "was never woven: the main script never defined 'Traner' at its top level" in r.stderr, r


def test_a_function_target_is_followed_until_defined_then_the_tracer_stands_down(tmp_path: Path) -> None:
    body = """
        import sys
        score = None  # bound before its definition: not what the target lives on, so not woven yet
        print("BEFORE", sys.gettrace() is not None)
        def score(xs):
            return sum(xs)
        print("AFTER", sys.gettrace() is not None, type(score).__name__)
    """
    r = _weave_then(tmp_path, body, "__main__:score")
    assert r.returncode == 0 and "BEFORE True" in r.stdout and "AFTER False FunctionWrapper" in r.stdout, r


def test_a_class_name_bound_before_the_class_statement_is_woven_at_the_statement(tmp_path: Path) -> None:
    body = """
        Trainer = None
        class Trainer:
            def generate(self):
                return 1
        print("WOVEN", type(Trainer.__dict__["generate"]).__name__)
    """
    r = _weave_then(tmp_path, body, "__main__:Trainer.generate")
    assert r.returncode == 0 and "WOVEN FunctionWrapper" in r.stdout, r


def test_a_class_defined_again_is_named(tmp_path: Path) -> None:
    body = """
        class Trainer:
            def generate(self):
                return 1
        class Trainer:
            def generate(self):
                return 2
        print("NEW", type(Trainer.__dict__["generate"]).__name__)
    """
    r = _weave_then(tmp_path, body, "__main__:Trainer.generate")
    assert r.returncode == 0 and "NEW function" in r.stdout, r
    assert "the main script defines class 'Trainer' again (line 9)" in r.stderr, r


@pytest.mark.parametrize(("target", "reason"), [
    ("elsewhere.Gen.generate", "no process of the program imported its package 'elsewhere'"),
    ("__main__:Traner.generate", "the main script never defined 'Traner' at its top level"),
    ("app.Traner.generate", "the main script never defined 'Traner' at its top level"),
], ids=["module", "main", "script-name"])
def test_under_skipweave_run_a_target_never_woven_is_named_at_exit(tmp_path: Path, target: str,
                                                                     reason: str) -> None:
    (tmp_path / "elsewhere.py").write_text("class Gen:\n    def generate(self):\n        return 1\n")
    (tmp_path / "app.py").write_text("print('done')\n")
    r = run([sys.executable, "-m", "skipweave.cli", "run", "--skip", "rollout_cache",
             f"skip.rollout.dump_dir={tmp_path / 'd'}", f"+skip.rollout.targets.gen={target}", "--",
             sys.executable, str(tmp_path / "app.py")], cwd=tmp_path, env=clean_env(PYTHONPATH=str(tmp_path)))
    assert r.returncode == 0 and r.stdout.strip() == "done", r
    assert f"role rollout target gen ({target}) was never woven: {reason}" in r.stderr, r
    assert "skip.rollout.targets.gen" in r.stderr


def test_a_hydra_app_with_a_misspelt_target_says_so_once(tmp_path: Path) -> None:
    """The weave runs inside the app's ``main()``, past the definitions: the did-you-mean error stops the run, with
    no exit warning about the same target beside it."""
    r = run([sys.executable, str(TRAIN), "hydra", "main", "-", f"hydra.run.dir={tmp_path}/hydra",
             "+skip=rollout_cache", f"skip.rollout.dump_dir={tmp_path / 'dump'}",
             "+skip.rollout.targets.cls=__main__:Traner.generate"], cwd=tmp_path)
    assert r.returncode != 0 and "did you mean 'Trainer'" in r.stderr, r
    assert "never woven" not in r.stderr and "never called" not in r.stderr, r


def test_class_statements_with_keywords_of_any_name_still_work(tmp_path: Path) -> None:
    """``class Echo(Plugin, name="echo")`` (an ``__init_subclass__`` registry) passes its keywords through the
    class-statement hook, which takes ``func`` and ``name`` positionally only."""
    body = """
        class Plugin:
            table = {}
            def __init_subclass__(cls, name="", func=None, **kw):
                super().__init_subclass__(**kw)
                Plugin.table[name] = func
        class Echo(Plugin, name="echo", func=len):
            pass
        class Trainer:
            def generate(self):
                return 1
        print("TABLE", sorted(Plugin.table), type(Trainer.__dict__["generate"]).__name__)
    """
    r = _weave_then(tmp_path, body, "__main__:Trainer.generate")
    assert r.returncode == 0 and "TABLE ['echo'] FunctionWrapper" in r.stdout, r


def test_a_misspelt_method_fails_at_the_class_statement_and_says_so_once(tmp_path: Path) -> None:
    body = """
        class Trainer:
            def generate(self):
                return 1
    """
    r = _weave_then(tmp_path, body, "__main__:Trainer.generat")
    assert r.returncode != 0 and "did you mean 'generate'" in r.stderr, r
    assert "never woven" not in r.stderr and "never called" not in r.stderr, r
