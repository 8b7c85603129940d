"""Opening ``skipweave view``'s pages in a real browser: Debian's Chromium, headless, driven by Playwright.

Chromium is required, not optional: when ``shutil.which("chromium")`` finds none, :func:`chromium` fails the test and
says how to install it (``apt-get install -y chromium``). Playwright's own browsers are never downloaded
(``playwright install`` is not needed: the system's chromium is launched through ``executable_path``).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
"""``tests/artifacts/``: screenshots kept after the run (ignored by git)."""


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium (Playwright's ``Browser``), closed at the end."""
    executable = shutil.which("chromium")
    if executable is None:
        pytest.fail("chromium is not installed: the browser test needs Debian's chromium (apt-get install -y "
                    "chromium); Playwright drives it through executable_path, never a downloaded browser")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("playwright is not installed: pip install 'skipweave[test]' (or pip install playwright); "
                    "never run `playwright install`: the test uses the system chromium")
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=executable, headless=True, args=["--no-sandbox"])
        try:
            yield launched
        finally:
            launched.close()


def open_page(browser: Any, path: Path) -> tuple[Any, list[str], list[str]]:
    """Open ``path``; returns the page, the console errors and page errors, and every request but the file's own."""
    page = browser.new_page(viewport={"width": 1100, "height": 900})
    errors: list[str] = []
    requests: list[str] = []
    own = path.resolve().as_uri()
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("request", lambda r: requests.append(r.url))
    page.goto(own, wait_until="load")
    assert requests[:1] == [own], f"the page's own load was not seen as a request: {requests}"  # the probe works
    del requests[0]
    return page, errors, requests


def keep(page: Any, name: str, tmp_path: Path) -> None:
    """The full page as a PNG, under ``tmp_path/artifacts/`` and in tests/artifacts/ (ignored by git)."""
    (tmp_path / "artifacts").mkdir(exist_ok=True)
    page.screenshot(path=str(tmp_path / "artifacts" / name), full_page=True)
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copyfile(tmp_path / "artifacts" / name, ARTIFACTS / name)
