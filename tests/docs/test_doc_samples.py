"""Every code sample in ``docs/*.md`` is checked here. The rule, by the language of the fenced block:

===========  ==========================================================================================
``python``   **executed**. A page's ``python`` and ``bash`` blocks run in document order in one fresh
             subprocess whose working folder is a new empty temp dir (also ``$HOME``, so nothing lands in
             the real ``~/.cache``). Python blocks share one namespace, like notebook cells, and that
             folder is first on ``sys.path``: a sample writes its own tiny host module there and imports
             it. Samples are self-contained: they make every file and store they use.
``bash``     **executed** in that same folder, in order with the python blocks (so ``skipweave ls
             rollouts`` reads the store a python block above made), with ``bash -e -o pipefail``; the
             block must exit 0. ``python`` and ``skipweave`` are this interpreter's. A transcript line
             (``$ cmd``) is refused here: transcripts are ``console``.
``console``  **shown, never executed**: commands that need what a test cannot have (verl and GPUs, a Ray
             cluster, the long main job, a fresh venv, a placeholder such as ``train.py`` or
             ``/data/rollouts``) and transcripts with ``$`` prompts and their output.
``text``     shown, never executed: output, log lines, error messages, file trees.
``yaml``     parsed with OmegaConf (``???`` and ``${...}`` allowed); a block that holds a top-level
             ``skip`` node or verl's legacy keys is validated with ``skipweave.config.load_skip_config``.
             A yaml block right after the line ``<!-- write: PATH -->`` is also written to ``PATH`` in
             the sample folder, in document order (a profile or config file the samples then use).
``json``     parsed with ``json.loads``.
===========  ==========================================================================================

A fence without a language, or with any other language (``sh``, ``py``, ``shell``…), fails
:func:`test_blocks_follow_the_rule`, so a sample cannot dodge execution by its label: a command shown
as ``bash`` always runs. Fences start at column 0 (Python-Markdown, which mkdocs uses, does not render
fences indented inside list items).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # starts processes: left out of the fast tier (README)

ROOT = Path(__file__).resolve().parents[2]
DOCS_DIR = ROOT / "docs"
RUNNER = Path(__file__).with_name("sample_runner.py")
EXECUTED = {"python", "bash"}
ALLOWED = EXECUTED | {"console", "text", "yaml", "json"}
PAGE_TIMEOUT_S = 240
_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_WRITE = re.compile(r"^<!-- write: (?P<path>[\w./-]+) -->$")


@dataclass(frozen=True)
class Block:
    """One fenced block of a page: ``line`` is the 1-based line of its opening fence."""

    doc: str
    line: int
    lang: str
    code: str
    indent: str
    write_to: str | None = None


def parse_blocks(text: str, doc: str = "<doc>") -> list[Block]:
    """Return the fenced blocks of a Markdown text, in order.

    Raises:
        ValueError: a fence is never closed.
    """
    blocks: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, indent = m.group("fence"), m.group("indent")
        lang = m.group("info").strip().split(" ")[0] if m.group("info").strip() else ""
        body: list[str] = []
        j = i + 1
        while j < len(lines):
            close = _FENCE.match(lines[j])
            if close and close.group("fence")[0] == fence[0] and len(close.group("fence")) >= len(fence) \
                    and not close.group("info").strip():
                break
            body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j])
            j += 1
        else:
            raise ValueError(f"{doc}:{i + 1}: fence {fence!r} is never closed")
        marker = _WRITE.match(lines[i - 1].strip()) if i > 0 else None
        write_to = marker.group("path") if marker else None
        blocks.append(Block(doc, i + 1, lang, "\n".join(body) + "\n", indent, write_to))
        i = j + 1
    return blocks


def rule_violations(blocks: list[Block]) -> list[str]:
    """Return one message per block that breaks the rule of the module docstring."""
    problems = []
    for b in blocks:
        where = f"{b.doc}:{b.line}"
        if not b.lang:
            problems.append(f"{where}: a fence without a language; use one of {sorted(ALLOWED)}")
        elif b.lang not in ALLOWED:
            problems.append(f"{where}: fence language {b.lang!r} is not one of {sorted(ALLOWED)} "
                            "(bash/python run; console/text are shown only)")
        if b.indent:
            problems.append(f"{where}: an indented fence; start fences at column 0")
        if b.write_to and b.lang != "yaml":
            problems.append(f"{where}: only yaml blocks may follow a '<!-- write: PATH -->' marker")
        if b.write_to and (b.write_to.startswith("/") or ".." in b.write_to.split("/")):
            problems.append(f"{where}: write to a relative path inside the sample folder")
        if b.lang == "bash" and any(line.startswith("$ ") for line in b.code.splitlines()):
            problems.append(f"{where}: a bash block with a '$ ' prompt is a transcript; mark it console")
    return problems


def pages() -> list[str]:
    return sorted(p.name for p in DOCS_DIR.glob("*.md"))


def blocks_of(page: str) -> list[Block]:
    path = DOCS_DIR / page
    return parse_blocks(path.read_text(encoding="utf-8"), str(path))


def _runs(b: Block) -> bool:
    return b.lang in EXECUTED or b.write_to is not None


def executed_pages() -> list[str]:
    return [p for p in pages() if any(b.lang in EXECUTED for b in blocks_of(p))]


# ------------------------------------------------------------------------------------------------ the rule
def test_docs_exist() -> None:
    assert executed_pages(), "no page of docs/ has a sample to run"


@pytest.mark.parametrize("page", pages())
def test_blocks_follow_the_rule(page: str) -> None:
    problems = rule_violations(blocks_of(page))
    assert not problems, "\n".join(problems)


def test_the_rule_is_enforced() -> None:
    """The checker itself: what it must refuse, and what it must accept."""
    bad = "```\nls\n```\n\n```sh\nskipweave ls x\n```\n\n- item\n\n  ```bash\n  echo hi\n  ```\n\n```bash\n$ ls\n```\n"
    found = rule_violations(parse_blocks(bad))
    assert [m.split(":")[1] for m in found] == ["1", "5", "11", "15"], found
    good = "```python\nprint(1)\n```\n\n````console\n$ python train.py\n```text\n````\n"
    blocks = parse_blocks(good)
    assert [b.lang for b in blocks] == ["python", "console"] and not rule_violations(blocks)
    with pytest.raises(ValueError, match="never closed"):
        parse_blocks("```python\nprint(1)\n")
    marked = parse_blocks("<!-- write: conf/a.yaml -->\n```yaml\na: 1\n```\n<!-- write: b.py -->\n```python\n```\n")
    assert marked[0].write_to == "conf/a.yaml" and _runs(marked[0])
    assert [m.split(": ", 1)[1] for m in rule_violations(marked)] == [
        "only yaml blocks may follow a '<!-- write: PATH -->' marker"
    ]


# ------------------------------------------------------------------------------------------------ running
def run_page(page: str, folder: Path) -> subprocess.CompletedProcess[str]:
    """Run a page's python and bash blocks in order in one fresh subprocess inside ``folder``."""
    blocks = [{"lang": b.lang, "line": b.line, "code": b.code, "write_to": b.write_to}
              for b in blocks_of(page) if _runs(b)]
    spec = folder.parent / f"{folder.name}.blocks.json"
    spec.write_text(json.dumps({"doc": str(DOCS_DIR / page), "blocks": blocks}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SKIPWEAVE_", "RAY_"))}
    # the test's own PYTHONPATH is not the samples' business, but this tree's skipweave is: without it, a checkout other
    # than the installed one (a git worktree) would run the installed skipweave's samples against this tree's docs
    env["PYTHONPATH"] = str(ROOT)
    env.update(HOME=str(folder), PATH=os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""),
               PYTHONUNBUFFERED="1", RAY_USAGE_STATS_ENABLED="0")
    return subprocess.run([sys.executable, str(RUNNER), str(spec)], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=PAGE_TIMEOUT_S, check=False)


Runs = dict[str, Future[subprocess.CompletedProcess[str]]]


@pytest.fixture(scope="module")
def page_runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    """Start the selected pages' runs in parallel, a few at a time; each test waits for its own page."""
    selected = [item.callspec.params["page"] for item in request.session.items
                if getattr(item, "originalname", "") == "test_samples_run" and hasattr(item, "callspec")]
    # Pages with shell commands start subprocesses of their own: start them first, to finish sooner.
    selected.sort(key=lambda page: -sum(b.code.count("\n") for b in blocks_of(page) if b.lang == "bash"))
    workers = min(3, os.cpu_count() or 2)  # the other test worker of `-n 2` runs beside them
    with ThreadPoolExecutor(max_workers=workers) as pool:
        yield {page: pool.submit(run_page, page, tmp_path_factory.mktemp(Path(page).stem)) for page in selected}


@pytest.mark.timeout(PAGE_TIMEOUT_S * 4)
@pytest.mark.parametrize("page", executed_pages())
def test_samples_run(page: str, page_runs: Runs) -> None:
    proc = page_runs[page].result()
    assert proc.returncode == 0, (
        f"a sample of docs/{page} failed (exit {proc.returncode})\n"
        f"--- stdout (tail)\n{proc.stdout[-6000:]}\n--- stderr (tail)\n{proc.stderr[-6000:]}"
    )


# ------------------------------------------------------------------------------------------------ yaml, json
def _yaml_blocks() -> list[Block]:
    return [b for p in pages() for b in blocks_of(p) if b.lang == "yaml"]


def _json_blocks() -> list[Block]:
    return [b for p in pages() for b in blocks_of(p) if b.lang == "json"]


@pytest.mark.parametrize("block", _yaml_blocks(), ids=lambda b: f"{Path(b.doc).name}:{b.line}")
def test_yaml_blocks_are_valid(block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from omegaconf import OmegaConf

    from skipweave.config import load_skip_config

    cfg = OmegaConf.create(block.code)
    if not OmegaConf.is_dict(cfg):
        return
    legacy = OmegaConf.select(cfg, "actor_rollout_ref.rollout", default=None)
    if "skip" not in cfg and legacy is None:
        return
    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # legacy keys warn; that is documented, not a failure
        plan = load_skip_config(cfg)
    assert plan.roles or legacy is not None, f"{block.doc}:{block.line}: the skip node holds no role"


@pytest.mark.parametrize("block", _json_blocks(), ids=lambda b: f"{Path(b.doc).name}:{b.line}")
def test_json_blocks_parse(block: Block) -> None:
    json.loads(block.code)
