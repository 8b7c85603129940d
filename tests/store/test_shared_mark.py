"""The driver's mark (``.runs/{run}/.shared.json``): found only as the driver wrote it, never through a crafted file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from skipweave.store.errors import UnsafePath
from skipweave.store.shared_mark import SHARED_MARK, holds_mark, mark_path, mark_problem, write_mark

RUN, TOKEN, OTHER = "run1", "0123456789abcdef" * 2, "f" * 32


def test_the_mark_the_driver_wrote_is_found_with_its_token_only(tmp_path: Path) -> None:
    dump = str(tmp_path / "dump")
    assert write_mark(dump, RUN, TOKEN) == mark_path(dump, RUN) == os.path.join(dump, ".runs", RUN, SHARED_MARK)
    assert mark_problem(dump, RUN, TOKEN) is None and holds_mark(os.path.dirname(mark_path(dump, RUN)))
    assert not holds_mark(os.path.join(dump, ".runs", "run2"))
    assert "another driver's token" in (mark_problem(dump, RUN, OTHER) or "")
    assert "is not in it" in (mark_problem(dump, "run2", TOKEN) or "")
    assert mark_problem(str(tmp_path / "elsewhere"), RUN, TOKEN) == "the folder does not exist here"
    assert not [n for n in os.listdir(os.path.dirname(mark_path(dump, RUN))) if n.startswith(".tmp-")]


def test_a_bad_token_or_run_name_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="32 lowercase hex"):
        write_mark(str(tmp_path / "dump"), RUN, "not-a-token")
    with pytest.raises(ValueError, match="run"):
        write_mark(str(tmp_path / "dump"), "../up", TOKEN)
    assert not (tmp_path / "dump").exists()


def _craft(dump: Path, content: bytes) -> None:
    (dump / ".runs" / RUN).mkdir(parents=True)
    (dump / ".runs" / RUN / SHARED_MARK).write_bytes(content)


@pytest.mark.parametrize("content", [
    b"{not json", b"[1, 2]", json.dumps({"token": TOKEN.upper()}).encode(), json.dumps({"token": 5}).encode(),
    json.dumps({"token": TOKEN, "pad": "x" * 5000}).encode(), b"[" * 100000 + b"]" * 100000,
], ids=["not-json", "a-list", "upper-case", "not-a-string", "too-big", "deeply-nested"])
def test_a_crafted_mark_is_a_reason_never_an_error_nor_a_pass(tmp_path: Path, content: bytes) -> None:
    _craft(tmp_path, content)
    assert "not a mark skipweave wrote" in (mark_problem(str(tmp_path), RUN, TOKEN) or "")
    assert not holds_mark(str(tmp_path / ".runs" / RUN))  # gc's age rule takes its folder: no worker accepts it


def test_a_mark_is_never_read_nor_written_through_a_symlink(tmp_path: Path) -> None:
    real = tmp_path / "real"
    write_mark(str(real), RUN, TOKEN)
    dump = tmp_path / "dump"
    (dump / ".runs" / RUN).mkdir(parents=True)
    (dump / ".runs" / RUN / SHARED_MARK).symlink_to(real / ".runs" / RUN / SHARED_MARK)
    assert "symlink" in (mark_problem(str(dump), RUN, TOKEN) or "")
    assert not holds_mark(str(dump / ".runs" / RUN))
    os.mkfifo(tmp_path / "fifo")  # opening one to read would block until a writer came
    (tmp_path / "fifo").rename(dump / ".runs" / RUN / SHARED_MARK)
    assert not holds_mark(str(dump / ".runs" / RUN)) and "not a regular file" in (mark_problem(str(dump), RUN, TOKEN)
                                                                                   or "")
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / ".runs").symlink_to(real / ".runs")
    assert "symlink" in (mark_problem(str(linked), RUN, TOKEN) or "")
    with pytest.raises(UnsafePath):
        write_mark(str(linked), RUN, OTHER)
    assert mark_problem(str(real), RUN, TOKEN) is None  # the folder behind the link is untouched
