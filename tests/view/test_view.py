"""``skipweave view``: the page's figures, its sample browser, its diff, its escaping and its exit statuses.

Stores are recorded by weaving a tiny host in this process (tests/view/stores.py); the browser test
(tests/view/test_browser.py) renders the same pages in Chromium.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from skipweave.cli.main import main
from skipweave.store.scan import scan
from skipweave.view.fields import response_lengths, rewards
from skipweave.view.summary import summarize
from tests.view import stores as st


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> st.Stores:
    return st.make(tmp_path_factory.mktemp("view"))


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def expected_lengths(step: int) -> list[int]:
    """The response lengths (text ids, EOS included) tests/export/recording.py's host gives the samples of ``step``."""
    return [1 + (i * 2 + step) % 4 + 1 for i in range(st.N)]


def test_the_summary_counts_every_sample_lengths_by_mask_and_rewards_by_field(made: st.Stores) -> None:
    summary = summarize(scan(str(made.a)), limit=2)
    rows = {(r.step, r.validation): r for r in summary.rows.values()}
    assert sorted(rows) == [(1, False), (2, False), (2, True), (3, False)]
    for step in st.STEPS:
        row = rows[(step, False)]
        lengths = expected_lengths(step)
        assert (row.calls, row.samples) == (1, st.N)
        assert row.lengths.mean == pytest.approx(sum(lengths) / st.N)
        assert (row.lengths.low, row.lengths.high) == (min(lengths), max(lengths))
        assert row.reward_field == "token_level_scores"
        assert row.rewards.mean == pytest.approx(step + sum(range(st.N)) / 10 / st.N)  # arange(n)/10 + step
        assert row.bytes > 0
    assert rows[(2, True)].samples == 2  # the validation call: a row of its own
    kept = summary.samples[next(k for k in summary.samples if k[3] == 1 and not k[4])]
    assert [s.index for s in kept] == [0, 1]  # the first --samples of the step
    assert kept[0].fields and dict(kept[0].fields)["uid"] == st.HOSTILE
    assert kept[1].response is not None and len(kept[1].response) == expected_lengths(1)[1]


def test_reward_and_length_fields_of_other_shapes() -> None:
    per_token = {"token_level_rewards": torch.tensor([[1.0, 2.0, 0.0], [0.5, 0.0, 0.0]])}
    assert rewards(per_token, 2)[0] == "token_level_rewards"  # type: ignore[index]
    assert rewards(per_token, 2)[1].tolist() == [3.0, 0.5]  # type: ignore[index]
    assert rewards({"rewards": [0.25, 1.0]}, 2)[1].tolist() == [0.25, 1.0]  # type: ignore[index]
    assert rewards({"batch.score": np.array([1, 2])}, 2)[0] == "batch.score"  # type: ignore[index]
    assert rewards({"reward": ["good", "bad"]}, 2) is None  # no number: no reward
    trl = {"completion_ids": [[4, 5, 2], [3]]}
    assert response_lengths(trl, 2).tolist() == [3, 1]  # type: ignore[union-attr]
    assert response_lengths({"other": [1, 2]}, 2) is None


def test_the_page_has_its_tables_charts_and_samples_and_escapes_the_store(
        made: st.Stores, tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "page.html"
    status, text, err = cli(capsys, "view", str(made.a), "-o", str(out), "--samples", "3",
                            "--tokenizer", str(made.tokenizer))
    assert status == 0, err
    assert f"wrote {out}" in text and "4 step rows of 4 entries" in text
    page = out.read_text(encoding="utf-8")
    # nothing from elsewhere: no script, no URL, the policy forbids both
    assert "<script" not in page.lower() and "://" not in page
    assert "default-src &#x27;none&#x27;" in page
    assert "&lt;script&gt;document.title=&#x27;pwned-uid&#x27;&lt;/script&gt;" in page  # the uid, as text
    assert "&lt;script&gt;document.title=&#x27;pwned-text&#x27;&lt;/script&gt;" in page  # the decoded word
    assert "training calls" in page and "validation calls (apart)" in page
    assert page.count('<tr class="train">') == 3 and page.count('<tr class="val">') == 1
    assert page.count("<svg") == 2 and "Response length per step" in page and "Reward per step" in page
    assert page.count('class="sample"') == 3 * 3 + 2  # 3 per step; the validation call holds 2
    assert "first 3 samples of each step" in page
    assert not list(tmp_path.glob(".page.html.tmp-*"))


def test_samples_zero_keeps_the_figures_and_no_sample(made: st.Stores, tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "page.html"
    status, _, err = cli(capsys, "view", str(made.a), "-o", str(out), "--samples", "0", "--steps", "1-2",
                         "--role", "rollout")
    assert status == 0, err
    page = out.read_text(encoding="utf-8")
    assert 'class="sample"' not in page and "No call with a sample axis" in page
    assert page.count('<tr class="train">') == 2  # steps 1 and 2 only


def _marked(side: str) -> list[str]:
    return re.findall(r'<mark class="first-diff" title="position (\d+)">(\d+)</mark>', side)


def test_two_stores_show_the_diff_and_the_first_diverging_token_side_by_side(
        made: st.Stores, tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "diff.html"
    status, text, err = cli(capsys, "view", str(made.a), str(made.b), "-o", str(out))
    assert status == 0, err
    assert "first divergence: role rollout target gen step 2 call 0: diverged at batch.responses [1, 1]" in text
    page = out.read_text(encoding="utf-8")
    assert '<h2 id="diff">Diff</h2>' in page and "identical 3, diverged 1" in page
    side = page[page.index('class="side-by-side"'):page.index('<table class="diff">')]
    # A's sample 1 holds the end-of-sequence id 2 at position 1, B's the live 7: marked on both sides
    assert _marked(side) == [(str(st.DIVERGING_POSITION), "2"), (str(st.DIVERGING_POSITION), str(st.LIVE_TOKEN))]
    assert "recorded 2, live 7" in side


def test_a_verify_report_stands_for_the_second_store(made: st.Stores, tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "report.html"
    status, text, err = cli(capsys, "view", str(made.a), str(made.report), "-o", str(out),
                            "--tokenizer", str(made.tokenizer))
    assert status == 0, err
    page = out.read_text(encoding="utf-8")
    assert "a verify run&#x27;s report" in page and "identical 3, diverged 1" in page
    side = page[page.index('class="side-by-side"'):page.index('<table class="diff">')]
    assert _marked(side) == [(str(st.DIVERGING_POSITION), "2"), (str(st.DIVERGING_POSITION), str(st.LIVE_TOKEN))]
    assert "from the verify report" in side
    assert '<mark class="first-diff">&lt;/s&gt;</mark>' in side and '<mark class="first-diff">seven</mark>' in side


def test_nothing_is_written_when_the_page_cannot_be_built(made: st.Stores, tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "page.html"
    out.write_text("earlier page")
    status, _, err = cli(capsys, "view", str(made.a), str(tmp_path / "nothing"), "-o", str(out))
    assert status == 2 and "DUMP_B" in err and "does not exist" in err
    status, _, err = cli(capsys, "view", str(tmp_path / "missing"), "-o", str(out))
    assert status == 2
    status, _, err = cli(capsys, "view", str(made.a), "-o", str(tmp_path / "no" / "page.html"))
    assert status == 2 and "does not exist" in err
    status, _, err = cli(capsys, "view", str(made.a), "-o", str(out), "--tokenizer", str(tmp_path / "none"))
    assert status == 2 and "--tokenizer" in err
    empty = tmp_path / "empty.jsonl"
    empty.write_text("not a report line\n")
    status, _, err = cli(capsys, "view", str(made.a), str(empty), "-o", str(out))
    assert status == 2 and "holds no well-formed line of a verify run's report" in err
    assert out.read_text() == "earlier page"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".page")] == []


def test_a_damaged_entry_is_named_and_the_rest_shown(made: st.Stores, tmp_path: Path, capsys: Any) -> None:
    import shutil

    dump = tmp_path / "dump"
    shutil.copytree(made.a, dump)
    tree = sorted((dump / "default" / "rollout" / "3" / "gen").glob("r0-0000*"))
    assert tree, "the step-3 entry's files"
    for path in tree:
        if path.name.endswith(".manifest.json"):
            path.write_text("{not json")
    out = tmp_path / "page.html"
    status, text, _ = cli(capsys, "view", str(dump), "-o", str(out))
    assert status == 1
    assert "SKIPPED" in text and "skipweave verify" in text
    assert "entries skipped (foreign, damaged or not summarized)" in out.read_text(encoding="utf-8")


def test_a_chart_series_has_gaps_where_a_step_has_no_value(made: st.Stores) -> None:
    from skipweave.view.charts import series

    summary = summarize(scan(str(made.a)), limit=0)
    steps, data = series(list(summary.rows.values()), "rewards")
    assert steps == [1, 2, 3]
    means, lows, highs = data["rollout/gen (validation)"]
    assert np.isnan(means[0]) and np.isnan(means[2]) and means[1] == pytest.approx(2.05)  # validation at step 2 only
    assert data["rollout/gen"][0] == pytest.approx([1.25, 2.25, 3.25])
    assert set(series(list(summary.rows.values()), "lengths")[1]) == {"rollout/gen", "rollout/gen (validation)"}


def test_a_build_that_fails_while_writing_leaves_the_earlier_page(
        made: st.Stores, tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import skipweave.view.page as page_module

    out = tmp_path / "page.html"
    out.write_text("earlier page")

    def broken(text: str) -> None:
        raise OSError(28, "No space left on device")

    real_open = open

    class Failing:
        def __init__(self, fh: Any) -> None:
            self.fh = fh

        def __enter__(self) -> Any:
            self.fh.write = broken
            return self.fh

        def __exit__(self, *exc: Any) -> None:
            self.fh.close()

    monkeypatch.setattr(page_module, "open", lambda *a, **k: Failing(real_open(*a, **k)), raising=False)
    status, _, err = cli(capsys, "view", str(made.a), "-o", str(out))
    assert status == 2 and "nothing written" in err and "No space left" in err
    assert out.read_text() == "earlier page"
    assert [p.name for p in tmp_path.iterdir()] == ["page.html"]  # the temporary file removed


def test_a_progress_bar_counts_the_entries_when_bars_show(
        made: st.Stores, tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SKIPWEAVE_PROGRESS", "1")
    status, _, err = cli(capsys, "view", str(made.a), str(made.b), "-o", str(tmp_path / "page.html"))
    assert status == 0 and "skipweave view: reading" in err and "skipweave view: diffing" in err
    monkeypatch.setenv("SKIPWEAVE_PROGRESS", "0")
    status, _, err = cli(capsys, "view", str(made.a), "-o", str(tmp_path / "page.html"))
    assert status == 0 and "skipweave view:" not in err


def test_a_result_the_page_cannot_summarize_is_named_and_the_rest_shown(
        made: st.Stores, tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import skipweave.view.summary as summary_module

    real = summary_module.rewards

    def rewards_failing_at_step_2(columns: Any, count: int) -> Any:  # its training and validation call
        if int(columns["token_level_scores"][0]) == 2:
            raise ValueError("a reward of a shape no rule reads")
        return real(columns, count)

    monkeypatch.setattr(summary_module, "rewards", rewards_failing_at_step_2)
    out = tmp_path / "page.html"
    status, text, _ = cli(capsys, "view", str(made.a), "-o", str(out))
    assert status == 1 and "(unsummarized): ValueError: a reward of a shape no rule reads" in text
    page = out.read_text(encoding="utf-8")
    assert "2 entries skipped" in page and page.count('<tr class="train">') == 3


def test_an_output_that_would_replace_an_input_or_a_non_regular_file_is_refused(
        made: st.Stores, tmp_path: Path, capsys: Any) -> None:
    import os
    import shutil

    dump = tmp_path / "a"
    shutil.copytree(made.a, dump)
    report = tmp_path / "report.jsonl"
    shutil.copy(made.report, report)
    kept = report.read_bytes()
    manifest = sorted(p for p in dump.rglob("*.manifest.json"))[0]
    before = manifest.read_bytes()
    fifo = tmp_path / "fifo.html"
    os.mkfifo(fifo)
    link = tmp_path / "link.html"
    link.symlink_to(report)
    for argv, out, why in (
            ([str(dump)], manifest, "lies inside the input"),
            ([str(dump)], dump / "page.html", "lies inside the input"),
            ([str(made.a), str(report)], report, "is the input"),
            ([str(dump), str(made.a)], made.a / "page.html", "lies inside the input"),
            ([str(dump)], fifo, "not a regular file"),
            ([str(dump)], link, "is a symlink")):
        status, _, err = cli(capsys, "view", *argv, "-o", str(out))
        assert status == 2 and why in err and str(out) in err and "nothing written" in err, (out, err)
    assert manifest.read_bytes() == before and report.read_bytes() == kept and fifo.is_fifo() and link.is_symlink()
    assert not (dump / "page.html").exists() and not (made.a / "page.html").exists()


def test_strings_holding_surrogates_are_shown_escaped(tmp_path: Path, capsys: Any) -> None:
    from tests.export.recording import STEP_ARG, forget, host_module, record, stepped

    host = host_module(tmp_path)
    try:
        record(tmp_path / "dump", host, {"s": "surrogates"}, stepped("surrogates", (1,)), role="s", step=STEP_ARG)
    finally:
        forget(host)
    out = tmp_path / "page.html"
    status, _, err = cli(capsys, "view", str(tmp_path / "dump"), "-o", str(out))
    assert status == 0, err
    page = out.read_text(encoding="utf-8")
    assert "\\udcff x" in page and "note\\udcfe" in page


def test_malformed_report_lines_are_skipped_and_named_and_a_bundle_is_a_store(
        made: st.Stores, tmp_path: Path, capsys: Any) -> None:
    import json

    good = made.report.read_text(encoding="utf-8").splitlines()
    record = json.loads(next(line for line in good if '"diverged"' in line))
    bad = [{k: v for k, v in record.items() if k != "status"}, {**record, "step": [1]}, {**record, "status": {}},
           {**record, "step": "1"}, {**record, "step": True}, {**record, "step": 1.5}]
    report = tmp_path / "report.jsonl"
    report.write_text("\n".join([*good, *(json.dumps(b) for b in bad), '{"step": NaN, "cut']) + "\n")
    out = tmp_path / "page.html"
    status, text, err = cli(capsys, "view", str(made.a), str(report), "-o", str(out))
    assert status == 0, err
    first = len(good) + 1
    for number, why in ((first, "no 'status'"), (first + 1, "step [1]"), (first + 2, "status {}"),
                        (first + 3, "step '1'"), (first + 4, "step True"), (first + 5, "step 1.5"),
                        (first + 6, "not JSON")):
        assert f"WARNING: line {number} of {report} skipped" in err and why in err, (number, why, err)
    page = out.read_text(encoding="utf-8")
    assert "identical 3, diverged 1" in page and f"line {first} of" in page  # the rest shown, the skipped named
    only_bad = tmp_path / "bad.jsonl"
    only_bad.write_text("\n".join(json.dumps(b) for b in bad) + "\n")
    status, _, err = cli(capsys, "view", str(made.a), str(only_bad), "-o", str(out))
    assert status == 2 and "holds no well-formed line" in err and "6 lines skipped as malformed" in err

    bundle = tmp_path / "b.zip"
    assert cli(capsys, "pack", str(made.b), "-o", str(bundle))[0] == 0
    status, text, err = cli(capsys, "view", str(made.a), str(bundle), "-o", str(out))
    assert status == 0, err
    assert "first divergence: role rollout target gen step 2 call 0: diverged at batch.responses [1, 1]" in text
    assert "identical 3, diverged 1" in out.read_text(encoding="utf-8")
