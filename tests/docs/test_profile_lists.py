"""Every list of the shipped profiles a reader meets comes from ``conf/skip/``: a new profile file fails here until the
docs name it.

What is checked, against :func:`skipweave.config.profiles.shipped_profiles` (the files of ``conf/skip/``):

- the table of docs/profiles.md's "Shipped profiles" section names each shipped profile, and nothing else;
- every inline list introduced as "shipped profile(s) (...)" in the docs, the README and ``skipweave run --help`` is
  the whole set, unless it ends in an ellipsis (an excerpt: then each name in it is still a shipped one);
- every sample of the error message that lists them ("one of the shipped profiles 'a', 'b', ...") lists the set the
  message itself lists;
- the ``skipweave`` group (``+skipweave=<name>``, for apps whose primary config is a dataclass) holds a twin of each,
  as docs/hydra.md says, but ``off``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from skipweave.cli import run as cli_run
from skipweave.config.profiles import compose_profile, conf_dir, shipped_profiles

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
SHIPPED = set(shipped_profiles())
_NAME = re.compile(r"[a-z][a-z0-9_]*")
_INLINE = re.compile(r"shipped profiles? \(((?:[^()]|\([^()]*\))*)\)", re.S)
_MESSAGE = re.compile(r"one of the shipped profiles ((?:'[a-z0-9_]+', )+)")
_ELLIPSIS = ("…", "...")
NO_TWIN = {"off"}
"""Shipped profiles without a ``+skipweave=`` twin: ``off`` enables nothing the callback's node could weave."""


def test_conf_ships_the_profiles_the_docs_were_written_for() -> None:
    """A guard on this test itself: it reads the real folder (an empty or moved folder would pass every check)."""
    assert {"rollout_cache", "rollout_verify", "update_only", "reward_cache", "off"} <= SHIPPED


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start:] if end < 0 else text[start:end]


def test_the_profiles_table_names_every_shipped_profile() -> None:
    section = _section((ROOT / "docs" / "profiles.md").read_text(encoding="utf-8"), "## Shipped profiles")
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    named = {name for row in rows for name in re.findall(r"`([a-z0-9_]+)`", row.split("|")[1])}
    assert SHIPPED - named == set(), f"docs/profiles.md's table of shipped profiles lacks {sorted(SHIPPED - named)}"
    assert named - SHIPPED == set(), f"docs/profiles.md's table names what conf/skip has not: {sorted(named - SHIPPED)}"


def _inline_lists() -> list[tuple[str, str]]:
    """``(where, text inside the parentheses)`` of each inline list of shipped profiles."""
    found = [(page.relative_to(ROOT).as_posix(), m.group(1))
             for page in PAGES for m in _INLINE.finditer(page.read_text(encoding="utf-8"))]
    found += [("skipweave run --help", m.group(1)) for m in _INLINE.finditer(cli_run.DESCRIPTION)]
    return found


def test_inline_lists_of_shipped_profiles_are_whole_or_say_they_are_excerpts() -> None:
    lists = _inline_lists()
    assert {where for where, _ in lists} >= {"docs/cli.md", "docs/hydra.md", "skipweave run --help"}, lists
    for where, text in lists:
        names = set(re.findall(r"`([a-z0-9_]+)`", text)) or set(_NAME.findall(text))  # (run --help: no backticks)
        assert names <= SHIPPED, f"{where}: {sorted(names - SHIPPED)} named as shipped profiles: {text!r}"
        if not any(mark in text for mark in _ELLIPSIS):
            assert names == SHIPPED, f"{where} lists the shipped profiles without {sorted(SHIPPED - names)}: {text!r}"


def test_error_message_samples_list_what_the_message_lists(tmp_path: Path) -> None:
    with pytest.raises(Exception) as caught:  # (a ConfigError: the message the samples show)
        compose_profile(str(tmp_path / "missing.yaml"))
    listed = set(re.findall(r"'([a-z0-9_]+)'", _MESSAGE.search(str(caught.value)).group(1)))  # type: ignore[union-attr]
    assert listed == SHIPPED
    samples = [(page.name, m.group(1)) for page in PAGES for m in _MESSAGE.finditer(page.read_text(encoding="utf-8"))]
    assert samples, "docs/profiles.md shows the message; the pattern no longer finds it"
    for page, text in samples:
        assert set(re.findall(r"'([a-z0-9_]+)'", text)) == SHIPPED, f"{page}: a stale sample of the message: {text}"


def test_every_shipped_profile_has_its_callback_node_twin() -> None:
    twins = {p.stem for p in (Path(conf_dir()) / "skipweave").glob("*.yaml")} - {"callback"}
    assert twins == SHIPPED - NO_TWIN, (
        f"conf/skipweave/ (+skipweave=<name>) lacks {sorted(SHIPPED - NO_TWIN - twins)}, "
        f"or has a twin of no shipped profile: {sorted(twins - SHIPPED)}")
