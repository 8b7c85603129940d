"""Targets in the script the user runs: a class method, a plain function and an async method of
``tests/apps/one_file/train.py``, named ``__main__:...`` and ``train....``, through ``weave()``, ``skipweave run`` and
a Hydra app. Run 1 records, run 2 replays with no real call and the same output. A misspelt class or method stops the
run before the script's first line (or at the class statement, when only the class can tell), naming the key; a
target never woven otherwise is named at exit."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.integrations.hydra.runner import Run, clean_env, run

pytestmark = pytest.mark.slow  # starts processes: left out of the fast tier (README)

TRAIN = Path(__file__).resolve().parents[1] / "apps" / "one_file" / "train.py"
REPO = Path(__file__).resolve().parents[2]
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
    return run([sys.executable, str(script)], cwd=tmp, env=_env(tmp))


def _env(tmp: Path) -> dict[str, str]:
    """The scripts' folder on the path, and this tree's skipweave before any installed one."""
    return clean_env(PYTHONPATH=os.pathsep.join([str(tmp), str(REPO)]))


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


def test_a_class_defined_without_the_method_fails_at_the_weave(tmp_path: Path) -> None:
    """``weave()`` above the definitions: the script's source already shows the class lacks the method."""
    body = """
        print("after the weave")
        class Trainer:
            def generat(self):
                return 1
    """
    r = _weave_then(tmp_path, body, "__main__:Trainer.generate")
    assert r.returncode != 0 and "after the weave" not in r.stdout, r
    assert "class 'Trainer' (app.py line 7) has no attribute 'generate'; did you mean 'generat'?" in r.stderr, r


def test_a_method_only_the_class_statement_can_tell_fails_there(tmp_path: Path) -> None:
    """A class deriving from an imported class: its methods are known when its ``class`` statement runs."""
    (tmp_path / "base_gen.py").write_text("class Base:\n    def generate(self):\n        return 1\n")
    body = """
        from base_gen import Base
        print("before the class")
        class Trainer(Base):
            pass
        print("after the class")
    """
    r = _weave_then(tmp_path, body, "__main__:Trainer.generat")
    assert r.returncode != 0 and "before the class" in r.stdout and "after the class" not in r.stdout, r
    assert "'Trainer' has no attribute 'generat'; did you mean 'generate'?" in r.stderr, r


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
    # (a __main__ target may be meant for another process's script: a name with nothing close is not refused)
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
    # (defined inside a function: the source shows the name, so nothing is refused up front)
    (tmp_path / "app.py").write_text("def main():\n    class Traner:\n        pass\nprint('done')\n")
    r = run([sys.executable, "-m", "skipweave.cli", "run", "--skip", "rollout_cache",
             f"skip.rollout.dump_dir={tmp_path / 'd'}", f"+skip.rollout.targets.gen={target}", "--",
             sys.executable, str(tmp_path / "app.py")], cwd=tmp_path, env=_env(tmp_path))
    assert r.returncode == 0 and r.stdout.strip() == "done", r
    assert f"role rollout target gen ({target}) was never woven: {reason}" in r.stderr, r
    assert "skip.rollout.targets.gen" in r.stderr


@pytest.mark.parametrize(("target", "suggestion"), [
    ("__main__:Traner.generate", "did you mean 'Trainer'?"), ("__main__:Trainer.generat", "did you mean 'generate'?"),
], ids=["class", "method"])
def test_a_hydra_app_with_a_misspelt_target_says_so_once(tmp_path: Path, target: str, suggestion: str) -> None:
    """The weave runs inside the app's ``main()``, past the definitions: the did-you-mean error stops the run before
    the task, naming the key (exit status 1, Hydra's, as for a target in a module), with no traceback and no exit
    warning about the same target beside it."""
    r = run([sys.executable, str(TRAIN), "hydra", "main", "-", f"hydra.run.dir={tmp_path}/hydra",
             "+skip=rollout_cache", f"skip.rollout.dump_dir={tmp_path / 'dump'}",
             f"+skip.rollout.targets.cls={target}"], cwd=tmp_path)
    assert r.returncode == 1 and suggestion in r.stderr and "REAL" not in r.stdout, r
    assert "the run was stopped before the task started" in r.stderr and "skip.rollout.targets.cls" in r.stderr, r
    assert "Traceback" not in r.stderr, r
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


def test_a_misspelt_method_fails_at_the_weave_and_says_so_once(tmp_path: Path) -> None:
    body = """
        class Trainer:
            def generate(self):
                return 1
    """
    r = _weave_then(tmp_path, body, "__main__:Trainer.generat")
    assert r.returncode != 0 and "did you mean 'generate'" in r.stderr, r
    assert "never woven" not in r.stderr and "never called" not in r.stderr, r


# --- misspelt targets of the script, checked before it runs (skipweave run) -----------------------------------------

ONE_FILE = '''\
from pathlib import Path

Path("first-line-ran").write_text("yes")  # the script's first line: a refused run never gets here
print("FIRST LINE RAN", flush=True)
{definition}

print("AFTER CLASS", flush=True)
for step in range(2):
    print("OUT", Policy().generate([step]))
'''

OWN = "class Policy:\n    def generate(self, prompts):\n        return [p * 2 for p in prompts]"
INHERITED = "from base_policy import BasePolicy\n\nclass Policy(BasePolicy):\n    pass"
BASE_POLICY = """\
class BasePolicy:
    def generate(self, prompts):
        return [p * 2 for p in prompts]


class OtherPolicy(BasePolicy):
    def generate(self, prompts):
        return [p * 3 for p in prompts]


def make_policy():
    class MadePolicy(BasePolicy):
        def generate(self, prompts):
            return [p * 4 for p in prompts]
    return MadePolicy
"""
SUPPLIED = """\
import base_policy
from base_policy import BasePolicy, OtherPolicy as Imported

Made = base_policy.make_policy()  # a class bound by an assignment


class Policy(BasePolicy):  # its method comes from a base the script imports
    pass
"""
"""Three classes whose method the script's source does not show: each is woven where the script binds it."""


def _skipweave_run(folder: Path, definition: str, *targets: str, options: tuple[str, ...] = (),
                   command: tuple[str, ...] | None = None) -> Run:
    """``skipweave run`` of :data:`ONE_FILE` with ``definition`` (written to ``folder/train.py``, beside
    ``base_policy.py``) and ``targets`` (``key=path``) added to ``rollout_cache``."""
    folder.mkdir()
    (folder / "train.py").write_text(ONE_FILE.format(definition=definition))
    (folder / "base_policy.py").write_text(BASE_POLICY)
    return run([sys.executable, "-m", "skipweave.cli", "run", "--skip", "rollout_cache",
                f"skip.rollout.dump_dir={folder / 'dump'}", "+skip.rollout.step=counter",
                *(f"+skip.rollout.targets.{t}" for t in targets), *options, "--",
                *(command or (sys.executable, "train.py"))], cwd=folder, env=_env(folder))


TYPOS = {  # name -> (definition, targets, options, command, what the message says)
    "class": (OWN, ["gen=__main__:Polcy.generate"], (), None,
              ["skip.rollout.targets.gen", "the main script train.py never defines 'Polcy'; did you mean 'Policy'?",
               "failed at '__main__.Polcy'"]),
    "class-script-name": (OWN, ["gen=train.Polcy.generate"], (), None,
                          ["skip.rollout.targets.gen", "never defines 'Polcy'; did you mean 'Policy'?"]),
    "method": (OWN, ["gen=__main__:Policy.generat"], (), None,
               ["skip.rollout.targets.gen",
                "class 'Policy' (train.py line 5) has no attribute 'generat'; did you mean 'generate'?",
                "failed at '__main__.Policy.generat'"]),
    "method-python-m": (OWN, ["gen=train.Policy.generat"], (), (sys.executable, "-m", "train"),
                        ["skip.rollout.targets.gen", "has no attribute 'generat'; did you mean 'generate'?"]),
    # the launcher's check off: each process checks at its start-up, before the script's first line (by the same
    # judgement: a misspelt method is refused there as the launcher refuses it above)
    "class-at-start-up": (OWN, ["gen=__main__:Polcy.generate"], ("--no-preflight",), None,
                          ["the run was stopped before the program's own code ran", "skip.rollout.targets.gen",
                           "did you mean 'Policy'?"]),
    # a method only the class statement can tell of (the class derives from an imported one): refused there
    "inherited-method": (INHERITED, ["gen=__main__:Policy.generat"], (), None,
                         ["the run was stopped at the main script's class statement 'Policy' at line 7",
                          "skip.rollout.targets.gen", "'Policy' has no attribute 'generat'; did you mean 'generate'?"]),
}

SUPPLIED_TARGETS = ["gen=__main__:Policy.generate", "made=__main__:Made.generate", "imported=train.Imported.generate"]


@pytest.fixture(scope="module")
def typo_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    tmp = tmp_path_factory.mktemp("typos")
    jobs = {name: (definition, targets, options, command)
            for name, (definition, targets, options, command, _) in TYPOS.items()}
    jobs["supplied"] = (SUPPLIED + "\nfor step in range(2):\n    print('OUT', Made().generate([step]), "
                        "Imported().generate([step]))", SUPPLIED_TARGETS, (), None)
    jobs["print-plan"] = (OWN, ["gen=__main__:Polcy.generate", "other=__main__:Policy.generat"], ("--print-plan",),
                          None)
    jobs["print-plan-fine"] = (OWN, ["gen=__main__:Policy.generate"], ("--print-plan",), None)
    with ThreadPoolExecutor(2) as pool:
        futures = {name: pool.submit(_skipweave_run, tmp / name, definition, *targets, options=options,
                                     command=command)
                   for name, (definition, targets, options, command) in jobs.items()}
        return {name: f.result() for name, f in futures.items()}


@pytest.mark.parametrize("name", [n for n in TYPOS if n != "inherited-method"])
def test_a_misspelt_class_or_method_stops_the_run_before_the_scripts_first_line(typo_runs: dict[str, Run],
                                                                               name: str) -> None:
    r = typo_runs[name]
    assert r.returncode == 2, r
    assert "FIRST LINE RAN" not in r.stdout and not (_folder(r) / "first-line-ran").exists(), r
    for needle in TYPOS[name][-1]:
        assert needle in r.stderr, (needle, r)
    assert "Traceback" not in r.stderr and "never woven" not in r.stderr, r


def test_a_misspelt_inherited_method_stops_the_run_at_the_class_statement(typo_runs: dict[str, Run]) -> None:
    r = typo_runs["inherited-method"]
    assert r.returncode == 2 and "FIRST LINE RAN" in r.stdout and "AFTER CLASS" not in r.stdout, r
    for needle in TYPOS["inherited-method"][-1]:
        assert needle in r.stderr, (needle, r)
    assert "Traceback" not in r.stderr and "never woven" not in r.stderr, r


def test_a_class_an_import_or_assignment_or_base_supplies_is_woven(typo_runs: dict[str, Run]) -> None:
    r = typo_runs["supplied"]
    assert r.returncode == 0 and r.stdout.count("OUT [") == 4, r
    assert "skipweave summary role=rollout: calls=6 hits=0 misses=6" in r.stderr, r
    assert "never woven" not in r.stderr and "never called" not in r.stderr and "does not resolve" not in r.stderr, r


def test_print_plan_with_a_command_checks_the_scripts_targets(typo_runs: dict[str, Run]) -> None:
    r = typo_runs["print-plan"]
    assert r.returncode == 2 and not (_folder(r) / "first-line-ran").exists(), r
    assert {"gen", "other"} <= set(json.loads(r.stdout)["skip"]["rollout"]["targets"]), r  # the plan, printed
    assert "--print-plan): the run was stopped before the program started" in r.stderr, r
    assert "Fix skip.rollout.targets.gen" in r.stderr and "did you mean 'Policy'?" in r.stderr, r
    assert "Fix skip.rollout.targets.other" in r.stderr and "did you mean 'generate'?" in r.stderr, r
    fine = typo_runs["print-plan-fine"]
    assert fine.returncode == 0 and fine.stderr == "" and not (_folder(fine) / "first-line-ran").exists(), fine


def _folder(r: Run) -> Path:
    """The folder a ``skipweave run`` of :func:`_skipweave_run` ran in (its dump dir's parent)."""
    dump = next(a for a in r.args if a.startswith("skip.rollout.dump_dir="))
    return Path(dump.partition("=")[2]).parent
