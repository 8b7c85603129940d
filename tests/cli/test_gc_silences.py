"""``skipweave gc``: ``--pin all`` is accepted (retention then removes no step), and a run-mark folder gc keeps gets
one statement of why, not "the runs ended" beside "a run may still be writing it"."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.cli.test_gc import _recorded, _run_folder, _snapshot, _steps_store
from tests.cli.test_ls import NS, ROLE, cli, make_store


def test_pin_all_keeps_every_step_and_lists_what_the_rule_would_take(tmp_path: Path, capsys: Any) -> None:
    dump = tmp_path / "dump"
    _steps_store(dump, 4)
    before = _snapshot(dump)
    status, out, err = cli(capsys, "gc", str(dump), "--keep-last", "1", "--pin", "all", "--yes", "--min-age", "0")
    assert status == 0, err
    after = _snapshot(dump)  # (gc --yes adds the role's retention lock file, nothing else)
    assert _recorded(dump) == [1, 2, 3, 4] and {k: after.get(k) for k in before} == before
    assert out.count("kept: pinned") == 3 and "removed" not in out
    status, out, _ = cli(capsys, "gc", str(dump), "--keep-last", "1", "--pin", "2", "all", "--json")
    doc = json.loads(out)
    assert doc["retention"]["pin"] == ["2", "all"]
    assert {a["outcome"] for a in doc["actions"] if a["kind"] == "retention"} == {"skipped"}


@pytest.mark.parametrize(("pin", "why"), [("bogus", ""), ("9-1", "; a range ends at or after its start")])
def test_a_bad_pin_names_the_value_and_what_is_allowed_all_included(tmp_path: Path, capsys: Any, pin: str,
                                                                    why: str) -> None:
    dump = tmp_path / "dump"
    _steps_store(dump, 2)
    status, _, err = cli(capsys, "gc", str(dump), "--keep-last", "1", "--pin", "3", pin)
    assert status == 2
    assert err.strip() == (f"skipweave gc: --pin='{pin}' is not allowed: steps (3), inclusive ranges (10-20) or all "
                           f"(every step pinned: retention removes none){why}")


def test_the_help_lists_all_among_the_pin_values(capsys: Any) -> None:
    with pytest.raises(SystemExit):
        cli(capsys, "gc", "--help")
    assert "or all (retention then removes no step)" in " ".join(capsys.readouterr().out.split())


def test_a_kept_run_mark_folder_gets_one_statement_of_why(tmp_path: Path, capsys: Any) -> None:
    s = make_store(tmp_path / "dump", damage=False)
    _run_folder(s.dump, "just-ended", owner={"ended_unix": time.time() - 5})  # ended, but its marks are fresh
    status, out, _ = cli(capsys, "gc", str(s.dump))
    assert status == 0, out
    lines = out.splitlines()
    at = lines.index(next(x for x in lines if x.startswith("kept         run marks")))
    assert lines[at + 1].strip().startswith("kept: their run ended, but something in them changed "), out
    assert "less than --min-age 3600 s: a process of the run that outlived its first one may still" in lines[at + 1]
    assert not lines[at + 2].startswith(" "), out  # nothing more about that folder
    assert "why: the runs ended" not in out and "a run may still be writing it" not in out
    status, out, _ = cli(capsys, "gc", str(s.dump), "--min-age", "0")
    assert "would remove run marks" in out and "why: the runs ended" in out  # what goes still says why it goes
    assert (s.dump / ".runs" / "just-ended" / NS / ROLE).is_dir()  # a dry run
