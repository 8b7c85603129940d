"""``skipweave view``'s page in a real browser: Debian's Chromium, headless, driven by Playwright.

One browser for the module. Each page is written by the command (``skipweave view A B -o page.html --tokenizer``, on
the stores of tests/view/stores.py: a tiny_grpo-shaped rollout store A, a store B whose step 2 diverges at one token,
and the verify run's report of B's calls against A) and opened from its file. The test checks that it loads with no
console error and no request but for the file itself, that the steps table and both charts render (visible, SVG
paths drawn), that a step and a sample open to the sample's text, that the markup in the store shows as text and runs
no script, and that the diff marks the first diverging token on both sides.

Screenshots are kept as test artefacts: ``<pytest tmp dir>/.../artifacts/view-*.png`` and ``tests/artifacts/view-*.png``
(ignored by git), one per page.

Chromium is required, not optional: when ``/usr/bin/chromium`` (``shutil.which("chromium")``) is absent the test fails
and says how to install it (``apt-get install -y chromium``). Playwright's own browsers are never downloaded.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from skipweave.cli.main import main
from tests.view import stores as st
from tests.view.browser import chromium, keep, open_page

pytestmark = pytest.mark.slow  # starts a browser


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as launched:
        yield launched


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> st.Stores:
    return st.make(tmp_path_factory.mktemp("browser-stores"))


def build(made: st.Stores, b: Path, out: Path) -> Path:
    status = main(["view", str(made.a), str(b), "-o", str(out), "--tokenizer", str(made.tokenizer),
                   "--samples", "3"])
    assert status == 0
    return out


def test_the_page_renders_offline_opens_a_sample_and_marks_the_first_diverging_token(
        browser: Any, made: st.Stores, tmp_path: Path) -> None:
    page, errors, requests = open_page(browser, build(made, made.b, tmp_path / "view.html"))
    try:
        assert page.title() == "skipweave view: a"
        assert page.locator("table.steps").first.is_visible()
        assert page.locator("table.steps tr.train").count() == 3 and page.locator("table.steps tr.val").count() == 1
        charts = page.locator("figure.chart svg")
        assert charts.count() == 2
        for i in range(2):
            assert charts.nth(i).is_visible()
            assert charts.nth(i).locator("path").count() > 10  # axes, lines, bands drawn
            box = charts.nth(i).bounding_box()
            assert box is not None and box["width"] > 300 and box["height"] > 100

        # a step opens to its samples, a sample to its text: the decoded response, the markup shown as text
        step = page.locator("details.step").first
        step.locator("summary").first.click()
        sample = step.locator("details.sample").first
        assert sample.is_visible()
        sample.locator("summary").first.click()
        response = sample.locator(".response-text")
        assert response.is_visible()
        assert response.inner_text().strip().endswith("</s>")
        fields = sample.locator("table.fields")
        assert fields.is_visible() and st.HOSTILE in fields.inner_text()  # the uid, as text
        assert st.HOSTILE_WORD in page.locator("body").inner_text()  # the decoded word, as text
        assert page.evaluate("document.querySelectorAll('script').length") == 0
        assert page.title() == "skipweave view: a"  # neither script ran

        # the diff: the first diverging token marked on both sides, A's end of sequence against B's "seven"
        marks = page.locator(".side-by-side mark.first-diff")
        assert marks.count() == 4  # A's and B's id, A's and B's text
        texts = [marks.nth(i).inner_text() for i in range(4)]
        assert texts == ["</s>", "2", "seven", str(st.LIVE_TOKEN)]
        for i in range(4):
            assert marks.nth(i).is_visible()
        colour = marks.first.evaluate("m => getComputedStyle(m).backgroundColor")
        assert colour == "rgb(255, 221, 68)"  # #fd4: the highlight applies
        assert page.locator("#first-divergence").inner_text().startswith("First divergence: role rollout")
        page.locator("#diff").scroll_into_view_if_needed()
        keep(page, "view-two-stores.png", tmp_path)
        assert errors == [] and requests == []
    finally:
        page.close()


def test_a_verify_report_page_renders_and_marks_the_live_token(browser: Any, made: st.Stores, tmp_path: Path) -> None:
    page, errors, requests = open_page(browser, build(made, made.report, tmp_path / "report.html"))
    try:
        marks = page.locator(".side-by-side mark.first-diff")
        assert [marks.nth(i).inner_text() for i in range(marks.count())] == ["</s>", "2", "seven",
                                                                             str(st.LIVE_TOKEN)]
        assert "from the verify report" in page.locator(".side-by-side").inner_text()
        assert page.locator("figure.chart svg").first.is_visible()
        keep(page, "view-verify-report.png", tmp_path)
        assert errors == [] and requests == []
    finally:
        page.close()
