"""``skipweave export``: one row per recorded sample, as Parquet (read back by pandas and ``datasets``) or JSONL.

Every store is recorded by weaving a tiny host in this process (tests/export/recording.py): the tiny_grpo example's
DataProto-shaped rollouts, TRL-shaped lists of token ids, a TensorDict, plain dicts and a scalar.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from skipweave.cli.main import main
from tests.export.recording import (
    STEP_ARG,
    forget,
    host_module,
    manifests,
    record,
    rewrite_manifest,
    rollouts,
    stepped,
)

N = 6


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Any]:
    module = host_module(tmp_path)
    yield module
    forget(module)


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def _rollout_store(dump: Path, host: Any, steps: tuple[int, ...] = (1, 2, 3), **settings: Any) -> None:
    record(dump, host, {"gen": "Rollout.generate_sequences"}, rollouts(steps, N, validate_at=(2,)),
           record_validation=True, **settings)


def test_a_dataproto_store_exports_one_row_per_sample_read_back_by_pandas_and_datasets(
        tmp_path: Path, host: Any, capsys: Any) -> None:
    dump, out = tmp_path / "dump", tmp_path / "rows.parquet"
    _rollout_store(dump, host)
    status, text, err = cli(capsys, "export", str(dump), "-o", str(out))
    assert status == 0, err
    assert f"exported {3 * N + 2} rows of 4 calls to {out}" in text

    df = pd.read_parquet(out)
    assert list(df.columns[:8]) == ["namespace", "role", "target", "step", "call", "shard", "validation", "sample"]
    assert len(df) == 3 * N + 2
    train = df[~df.validation]
    assert list(train.step) == [s for s in (1, 2, 3) for _ in range(N)]
    assert list(train["sample"]) == list(range(N)) * 3 and set(train.shard) == {"r0"}
    val = df[df.validation]
    assert list(val.shard) == ["val_r0"] * 2 and list(val.step) == [2, 2] and bool(val["meta_info.validate"].all())
    for step in (1, 2, 3):
        batch = host.rollout_batch(step, N)
        rows = train[train.step == step]
        for field in ("prompts", "responses", "input_ids", "attention_mask", "response_mask"):
            assert [list(x) for x in rows[field]] == batch.batch[field].tolist(), field
        assert np.allclose(np.stack(rows["old_log_probs"].to_list()), batch.batch["old_log_probs"].numpy())
        assert rows["token_level_scores"].to_list() == pytest.approx(batch.batch["token_level_scores"].tolist())
        assert rows["uid"].to_list() == list(batch.non_tensor_batch["uid"])  # reward_extra_info-style columns
        assert rows["acc"].to_list() == [float(i % 2) for i in range(N)]
        assert rows["pred"].to_list() == [str(i) for i in range(N)]
        assert set(rows["meta_info.global_steps"]) == {step} and set(rows["meta_info.temperature"]) == {0.7}
        assert set(rows["meta_info.timing.gen"]) == {0.25 * step}

    import datasets

    ds = datasets.load_dataset("parquet", data_files=str(out), split="train",
                               cache_dir=str(tmp_path / "hf_cache"))
    assert ds.num_rows == 3 * N + 2 and ds.column_names == list(df.columns)
    first = ds[0]
    assert first["prompts"] == host.rollout_batch(1, N).batch["prompts"][0].tolist()
    assert first["uid"] == "s1-p0" and first["validation"] is False and first["sample"] == 0


def test_a_bundle_exports_the_rows_its_dump_dir_does(tmp_path: Path, host: Any, capsys: Any) -> None:
    dump = tmp_path / "dump"
    _rollout_store(dump, host)
    bundle = tmp_path / "carried" / "rollouts.zip"
    bundle.parent.mkdir()
    status, _, err = cli(capsys, "pack", str(dump), "-o", str(bundle))
    assert status == 0, err
    for source, out in ((dump, tmp_path / "from_dir.parquet"), (bundle, tmp_path / "from_bundle.parquet")):
        status, _, err = cli(capsys, "export", str(source), "-o", str(out))
        assert status == 0, err
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "from_bundle.parquet"),
                                  pd.read_parquet(tmp_path / "from_dir.parquet"))
    assert sorted(p.name for p in bundle.parent.iterdir()) == ["rollouts.zip"]  # read in place: nothing beside it


def test_jsonl_holds_the_same_rows_as_parquet(tmp_path: Path, host: Any, capsys: Any) -> None:
    dump = tmp_path / "dump"
    _rollout_store(dump, host)
    assert cli(capsys, "export", str(dump), "-o", str(tmp_path / "rows.parquet"))[0] == 0
    assert cli(capsys, "export", str(dump), "-o", str(tmp_path / "rows.jsonl"))[0] == 0  # format from the suffix
    lines = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    df = pd.read_parquet(tmp_path / "rows.parquet")
    assert len(lines) == len(df) and list(lines[0]) == list(df.columns)
    for line, (_, row) in zip(lines, df.iterrows(), strict=True):
        assert line["responses"] == list(row["responses"]) and line["uid"] == row["uid"]
        assert line["step"] == row["step"] and line["sample"] == row["sample"]
    from_json = pd.read_json(tmp_path / "rows.jsonl", lines=True)
    assert list(from_json["uid"]) == list(df["uid"])


def test_trl_lists_of_token_ids_tensordicts_and_plain_results(tmp_path: Path, host: Any, capsys: Any) -> None:
    dump = tmp_path / "dump"
    record(dump, host, {"trl": "trl_generate"}, stepped("trl_generate", (0, 1), 3), role="trl", step=STEP_ARG)
    record(dump, host, {"td": "tensordict_result"}, stepped("tensordict_result", (1, 2), 4), role="td", step=STEP_ARG)
    record(dump, host, {"plain": "plain_no_axis"}, stepped("plain_no_axis", (1, 2)), role="plain", step=STEP_ARG)
    record(dump, host, {"scalar": "scalar"}, stepped("scalar", (1,)), role="scalar", step=STEP_ARG)
    out = tmp_path / "all.parquet"
    status, text, err = cli(capsys, "export", str(dump), "-o", str(out), "--json")
    assert status == 0, err
    doc = json.loads(text)
    assert doc["schema"] == "skipweave.export/1" and doc["ok"] and doc["rows"] == 2 * 3 + 2 * 4 + 2 + 1
    assert doc["passes"] == 2  # the roles' columns differ: the file is written with one schema for all
    df = pd.read_parquet(out)

    trl = df[df.role == "trl"]
    for step in (0, 1):
        want = host.trl_generate(step, 3)
        rows = trl[trl.step == step]
        assert [list(x) for x in rows["prompt_ids"]] == want["prompt_ids"]
        assert [list(x) for x in rows["completion_ids"]] == want["completion_ids"]
        assert rows["rewards"].to_list() == pytest.approx(want["rewards"])
        assert set(rows["num_items_in_batch"]) == {3 * step}  # the call's scalar, on each row
        assert rows["sample"].to_list() == [0, 1, 2]

    td = df[df.role == "td"]
    assert len(td) == 8 and td["sample"].to_list() == [0, 1, 2, 3] * 2
    want_td = host.tensordict_result(2, 4)
    rows = td[td.step == 2]
    assert [list(x) for x in rows["tokens"]] == want_td["tokens"].tolist()
    assert rows["reward"].to_list() == [2.0] * 4
    assert [list(x) for x in rows["nested.value"]] == want_td["nested", "value"].tolist()

    plain = df[df.role == "plain"]  # lengths 3 and 2: no sample axis, one row per call
    assert len(plain) == 2 and plain["sample"].isna().all()
    assert plain["loss"].to_list() == [0.5, 1.0] and list(plain["ids"].iloc[0]) == [0, 1, 2]
    assert list(plain["names"].iloc[1]) == ["a", "b"] and plain["step_seen"].to_list() == [1, 2]
    scalar = df[df.role == "scalar"]
    assert scalar["result"].to_list() == [1.5] and scalar["sample"].isna().all()
    assert pd.isna(df[df.role == "trl"]["loss"]).all()  # another role's column: null on these rows


def test_tokenizer_decodes_prompt_and_response_text_leaving_padding_out(
        tmp_path: Path, host: Any, capsys: Any) -> None:
    dump, folder = tmp_path / "dump", tmp_path / "tok"
    _rollout_store(dump, host, steps=(1,))
    record(dump, host, {"trl": "trl_generate"}, stepped("trl_generate", (1,), 3), role="trl", step=STEP_ARG)
    words = _tokenizer(folder)
    out = tmp_path / "text.parquet"
    status, _, err = cli(capsys, "export", str(dump), "-o", str(out), "--tokenizer", str(folder))
    assert status == 0, err
    df = pd.read_parquet(out)

    def text(ids: list[int]) -> str:
        return " ".join(words[i] for i in ids)

    rollout = df[(df.role == "rollout") & ~df.validation]
    batch = host.rollout_batch(1, N).batch
    for i, row in enumerate(rollout.itertuples()):
        prompt = [t for t, m in zip(batch["prompts"][i].tolist(), batch["attention_mask"][i, :4].tolist(),
                                    strict=True) if m]
        response = [t for t, m in zip(batch["responses"][i].tolist(), batch["response_mask"][i].tolist(),
                                      strict=True) if m]
        assert row.prompt_text == text(prompt) and row.prompt_text.startswith("<s>")
        assert row.response_text == text(response) and row.response_text.endswith("</s>")
        assert "<pad>" not in row.prompt_text + row.response_text
    status, _, err = cli(capsys, "export", str(dump), "-o", str(out), "--tokenizer", str(folder), "--role", "nothing")
    assert status == 0 and "decoded nothing" not in err  # no call at all: nothing to say
    record(dump, host, {"plain": "plain_no_axis"}, stepped("plain_no_axis", (1,)), role="plain", step=STEP_ARG)
    status, _, err = cli(capsys, "export", str(dump), "-o", str(out), "--tokenizer", str(folder), "--role", "plain")
    assert status == 0 and "--tokenizer decoded nothing" in err and "completion_ids" in err
    trl = df[df.role == "trl"]
    want = host.trl_generate(1, 3)
    assert trl["prompt_text"].to_list() == [text(ids) for ids in want["prompt_ids"]]
    assert trl["response_text"].to_list() == [text(ids) for ids in want["completion_ids"]]


def _tokenizer(folder: Path) -> list[str]:
    """A WordLevel tokenizer built in code (ids 0..7: <pad> <s> </s> then five words), saved as a
    ``PreTrainedTokenizerFast`` folder; returns its words by id."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "<s>", "</s>", "three", "four", "five", "six", "seven"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>",
                            eos_token="</s>").save_pretrained(str(folder))
    return words


def test_a_damaged_entry_is_named_and_the_rest_exported(tmp_path: Path, host: Any, capsys: Any) -> None:
    dump, out = tmp_path / "dump", tmp_path / "rows.parquet"
    _rollout_store(dump, host, write_buffer=0)  # one manifest per entry, no group
    tensors = sorted((dump / "default" / "rollout" / "2" / "gen").glob("r0-0000.*.tensors.safetensors"))[0]
    data = bytearray(tensors.read_bytes())
    data[-1] ^= 0xFF  # same size: only its checksum tells, when the entry is read
    tensors.write_bytes(bytes(data))
    truncated = sorted((dump / "default" / "rollout" / "3" / "gen").glob("r0-0000.*.tree.json"))[0]
    truncated.write_bytes(truncated.read_bytes()[:10])  # the scan sees it: corrupt
    status, text, err = cli(capsys, "export", str(dump), "-o", str(out))
    assert status == 1, err
    assert "SKIPPED" in text and str(tensors.parent / "r0-0000.manifest.json") in text
    assert str(truncated.parent / "r0-0000.manifest.json") in text and "2 damaged entries skipped" in text
    assert f"skipweave verify {dump}" in text
    df = pd.read_parquet(out)
    assert sorted(set(df[~df.validation].step)) == [1] and len(df) == N + 2

    status, text, _ = cli(capsys, "export", str(dump), "-o", str(out), "--json")
    skipped = json.loads(text)["skipped"]
    assert status == 1 and [(s["status"], s["step"]) for s in skipped] == [("unreadable", 2), ("corrupt", 3)]
    assert "checksum" in skipped[0]["reason"]


def test_foreign_and_format_1_entries(tmp_path: Path, host: Any, capsys: Any) -> None:
    dump, out = tmp_path / "dump", tmp_path / "rows.jsonl"
    _rollout_store(dump, host, write_buffer=0)
    gen = dump / "default" / "rollout"
    first, second = gen / "1" / "gen" / "r0-0000.manifest.json", gen / "2" / "gen" / "r0-0000.manifest.json"
    assert first in manifests(dump) and second in manifests(dump)
    rewrite_manifest(first, format_version=1, skipweave_version=None, fingerprint_rule=None)  # what 0.1.x wrote
    rewrite_manifest(second, format_version=99, skipweave_version="9.9.0")
    status, text, err = cli(capsys, "export", str(dump), "-o", str(out))
    assert status == 3, err
    assert "FOREIGN" in text and str(second) in text and "format version 99" in text
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted({(r["step"], r["shard"]) for r in rows}) == [(1, "r0"), (2, "val_r0"), (3, "r0")]
    assert sum(1 for r in rows if r["step"] == 1) == N  # the format-1 entry is read


def test_a_failed_export_leaves_the_earlier_file_and_no_temporary(
        tmp_path: Path, host: Any, capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from skipweave.export import sinks

    dump = tmp_path / "dump"
    _rollout_store(dump, host)
    for name, sink in (("rows.parquet", sinks.ParquetSink), ("rows.jsonl", sinks.JsonlSink)):
        out = tmp_path / name
        out.write_bytes(b"the earlier export")
        real = sink.write
        seen: list[int] = []

        def fail(self: Any, rows: Any, real: Any = real, seen: list[int] = seen) -> None:
            seen.append(rows.count)
            if len(seen) == 2:
                raise OSError(28, "No space left on device")
            real(self, rows)

        monkeypatch.setattr(sink, "write", fail)
        status, _, err = cli(capsys, "export", str(dump), "-o", str(out))
        assert status == 2 and "nothing written" in err and "No space left" in err
        assert out.read_bytes() == b"the earlier export"
        assert not [n for n in os.listdir(tmp_path) if ".tmp-" in n]
        monkeypatch.undo()


def test_parquet_without_pyarrow_names_the_extra_and_jsonl_still_works(
        tmp_path: Path, host: Any, capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    dump = tmp_path / "dump"
    _rollout_store(dump, host, steps=(1,))
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow raises ImportError
    status, _, err = cli(capsys, "export", str(dump), "-o", str(tmp_path / "rows.parquet"))
    assert status == 2 and "skipweave[export]" in err and not (tmp_path / "rows.parquet").exists()
    status, _, err = cli(capsys, "export", str(dump), "-o", str(tmp_path / "rows.out"), "--format", "jsonl")
    assert status == 0, err
    assert len((tmp_path / "rows.out").read_text().splitlines()) == N


def test_selection_and_progress_bar(tmp_path: Path, host: Any, capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    dump, out = tmp_path / "dump", tmp_path / "rows.jsonl"
    _rollout_store(dump, host)
    _rollout_store(dump, host, steps=(1,), namespace="other")
    record(dump, host, {"trl": "trl_generate"}, stepped("trl_generate", (1, 2), 3), role="trl", step=STEP_ARG)
    monkeypatch.setenv("SKIPWEAVE_PROGRESS", "1")
    status, _, err = cli(capsys, "export", str(dump), "-o", str(out), "--role", "rollout", "--steps", "2-3",
                         "--namespace", "default")
    assert status == 0 and "skipweave: exporting" in err
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert {(r["namespace"], r["role"], r["step"]) for r in rows} == {("default", "rollout", 2),
                                                                      ("default", "rollout", 3)}
    status, _, err = cli(capsys, "export", str(dump), "-o", str(out), "--steps", "x-y")
    assert status == 2 and "--steps" in err
    status, _, err = cli(capsys, "export", str(tmp_path / "missing"), "-o", str(out))
    assert status == 2 and "does not exist" in err


def test_grouped_small_entries_are_exported_call_by_call(tmp_path: Path, host: Any, capsys: Any) -> None:
    dump, out = tmp_path / "dump", tmp_path / "rows.jsonl"

    def calls(h: Any) -> Iterator[Any]:
        for step in (1, 2):
            for _ in range(3):  # three calls a step: the background writer commits them as one group
                yield h.trl_generate(step, 2)

    record(dump, host, {"trl": "trl_generate"}, calls, role="trl", step=STEP_ARG)
    assert list(dump.rglob("*.pack.json"))  # (a call the writer met alone is an entry of its own)
    status, _, err = cli(capsys, "export", str(dump), "-o", str(out))
    assert status == 0, err
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["step"], r["call"], r["sample"]) for r in rows] == [
        (s, c, i) for s in (1, 2) for c in range(3) for i in range(2)]
    assert [r["completion_ids"] for r in rows[:2]] == host.trl_generate(1, 2)["completion_ids"]


def test_a_pickled_entry_is_refused_unless_allowed(tmp_path: Path, host: Any, capsys: Any) -> None:
    dump, out = tmp_path / "dump", tmp_path / "rows.jsonl"
    record(dump, host, {"p": "pickled"}, stepped("pickled", (1, 2)), role="p", step=STEP_ARG, allow_pickle=True)
    status, text, _ = cli(capsys, "export", str(dump), "-o", str(out), "--json")
    doc = json.loads(text)
    assert status == 1 and doc["rows"] == 0 and [s["status"] for s in doc["skipped"]] == ["refused", "refused"]
    assert "--allow-pickle" in doc["skipped"][0]["reason"]
    status, _, err = cli(capsys, "export", str(dump), "-o", str(out), "--allow-pickle")
    assert status == 0, err
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["step"], r["ids"], r["day"]) for r in rows] == [
        (1, [1], "2026-12-01"), (1, [2], "2026-12-01"), (2, [2], "2026-12-02"), (2, [3], "2026-12-02")]


def test_an_output_that_would_replace_an_input_or_a_non_regular_file_is_refused(
        tmp_path: Path, host: Any, capsys: Any) -> None:
    dump = tmp_path / "dump"
    _rollout_store(dump, host, steps=(1,), write_buffer=0)
    bundle = tmp_path / "x.zip"
    assert cli(capsys, "pack", str(dump), "-o", str(bundle))[0] == 0
    packed = bundle.read_bytes()
    manifest = manifests(dump)[0]
    kept = manifest.read_bytes()
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me")
    link = tmp_path / "link.jsonl"
    link.symlink_to(precious)
    (tmp_path / "via").symlink_to(dump)  # a symlinked folder: the real path is inside the store all the same
    cases = [
        (bundle, bundle, "is the input"),
        (dump, manifest, "lies inside the input"),
        (dump, dump / "rows.jsonl", "lies inside the input"),
        (dump, tmp_path / "via" / "default" / "rows.jsonl", "lies inside the input"),
        (dump, fifo, "not a regular file"),
        (dump, link, "is a symlink"),
    ]
    for source, out, why in cases:
        status, _, err = cli(capsys, "export", str(source), "-o", str(out), "--format", "jsonl")
        assert status == 2 and why in err and str(out) in err and "nothing written" in err, (out, err)
    assert bundle.read_bytes() == packed and manifest.read_bytes() == kept and precious.read_text() == "keep me"
    assert not (dump / "rows.jsonl").exists() and not (dump / "default" / "rows.jsonl").exists()
    assert fifo.is_fifo() and link.is_symlink()
    assert not [p for p in tmp_path.rglob("*") if ".tmp-" in p.name]
    status, _, err = cli(capsys, "export", str(bundle), "-o", str(tmp_path / "rows.jsonl"))  # beside it: fine
    assert status == 0, err


def test_strings_holding_surrogates_are_written_escaped(tmp_path: Path, host: Any, capsys: Any) -> None:
    dump = tmp_path / "dump"
    record(dump, host, {"s": "surrogates"}, stepped("surrogates", (1,)), role="s", step=STEP_ARG)
    status, _, err = cli(capsys, "export", str(dump), "-o", str(tmp_path / "rows.jsonl"))
    assert status == 0, err
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [r["uid"] for r in rows] == ["\\udcff x", "ok"] and rows[0]["meta_info.tag"] == "\\udcfd"
    assert [r["note\\udcfe"] for r in rows] == ["a", "b"]  # a key too: the column's name
    status, _, err = cli(capsys, "export", str(dump), "-o", str(tmp_path / "rows.parquet"))
    assert status == 0, err
    df = pd.read_parquet(tmp_path / "rows.parquet")
    assert df["uid"].to_list() == ["\\udcff x", "ok"] and df["note\\udcfe"].to_list() == ["a", "b"]
    assert df["meta_info.tag"].to_list() == ["\\udcfd"] * 2


def test_a_tokenizer_folder_asking_to_run_its_own_code_is_never_run(
        tmp_path: Path, host: Any, capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    dump, folder, marker = tmp_path / "dump", tmp_path / "tok", tmp_path / "ran"
    _rollout_store(dump, host, steps=(1,))
    _tokenizer(folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.update(tokenizer_class="OwnTokenizer", auto_map={"AutoTokenizer": [None, "own_tok.OwnTokenizer"]})
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "own_tok.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\n"
        "from transformers import PreTrainedTokenizerFast\n\n\n"
        "class OwnTokenizer(PreTrainedTokenizerFast):\n    pass\n")
    asked: list[str] = []

    def yes(prompt: str = "") -> str:  # a person at a terminal answering transformers' question
        asked.append(prompt)
        return "y"

    monkeypatch.setattr(builtins, "input", yes)
    status, _, err = cli(capsys, "export", str(dump), "-o", str(tmp_path / "rows.jsonl"), "--tokenizer", str(folder))
    assert not marker.exists() and not asked
    assert status == 2 and "--tokenizer" in err and "never runs" in err and "trust_remote_code=True" not in err


def test_jsonl_is_portable_json_and_both_sinks_agree_on_awkward_values(
        tmp_path: Path, host: Any, capsys: Any) -> None:
    dump = tmp_path / "dump"
    record(dump, host, {"a": "awkward"}, stepped("awkward", (1,)), role="a", step=STEP_ARG)
    assert cli(capsys, "export", str(dump), "-o", str(tmp_path / "rows.jsonl"))[0] == 0

    def strict(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    rows = [json.loads(line, parse_constant=strict)
            for line in (tmp_path / "rows.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [r["score"] for r in rows] == [None, 1.0, None]  # non-finite floats: null
    assert rows[0]["nan"] is None
    big = str(10**30)
    assert [r["mixed"] for r in rows] == ["1", '"a"', "[2]"]  # no common type: JSON text
    assert [r["big"] for r in rows] == [big, "1", "2"]  # an int beyond int64: the column is JSON text
    assert [r["nested"] for r in rows] == ['{"a": 1}', '{"a": "x"}', None]
    assert rows[0]["huge"] == str(10**30 + 1) and rows[0]["ids"] == [1]

    assert cli(capsys, "export", str(dump), "-o", str(tmp_path / "rows.parquet"))[0] == 0
    df = pd.read_parquet(tmp_path / "rows.parquet")
    for column in ("mixed", "big", "nested", "huge"):
        assert [None if pd.isna(x) else x for x in df[column]] == [r[column] for r in rows], column
    assert np.isnan(df["score"][0]) and np.isinf(df["score"][2]) and np.isnan(df["nan"][0])  # Parquet keeps them


def test_the_calls_fields_keep_their_names_and_a_colliding_sample_field_is_renamed(
        tmp_path: Path, host: Any, capsys: Any) -> None:
    dump = tmp_path / "dump"
    record(dump, host, {"c": "colliding"}, stepped("colliding", (1,)), role="c", step=STEP_ARG)
    record(dump, host, {"p": "colliding_plain"}, stepped("colliding_plain", (1,)), role="p", step=STEP_ARG)
    for name in ("rows.jsonl", "rows.parquet"):
        assert cli(capsys, "export", str(dump), "-o", str(tmp_path / name))[0] == 0
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text(encoding="utf-8").splitlines()]
    c, p = [r for r in rows if r["role"] == "c"], [r for r in rows if r["role"] == "p"]
    assert [r["meta_info.k"] for r in c] == ["the call's"] * 2
    assert [r["non_tensor_batch.meta_info.k"] for r in c] == ["sample 0", "sample 1"]
    assert "result.meta_info.k" not in c[0]
    assert [r["a.b"] for r in p] == [1, 1] and [r["result.a.b"] for r in p] == [10, 11]
    df = pd.read_parquet(tmp_path / "rows.parquet")
    assert df[df.role == "c"]["meta_info.k"].to_list() == ["the call's"] * 2
    assert df[df.role == "c"]["non_tensor_batch.meta_info.k"].to_list() == ["sample 0", "sample 1"]
