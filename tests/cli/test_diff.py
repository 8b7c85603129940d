"""``skipweave diff``: two real stores (the same job recorded twice, the second changed from step 2 on) compared
entry by entry: text, JSON, plot, filters, tolerances, profiles, one-sided and damaged entries, exit statuses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import skipweave
from tests.cli.test_ls import cli

HOST = '''
from dataclasses import dataclass

import torch

CHANGE = {}


@dataclass
class Rollout:
    responses: torch.Tensor
    log_probs: torch.Tensor
    meta: dict


def generate(step, validate=False):
    return make(step, validate)


def make(step, validate=False):
    g = torch.Generator().manual_seed(step)
    responses = torch.randint(0, 100, (8, 16), generator=g)
    log_probs = torch.randn(8, 16, generator=g)
    if CHANGE.get("from_step") is not None and step >= CHANGE["from_step"] and not validate:
        responses[3, 5:] = (responses[3, 5:] + 1) % 100   # sample 3 departs at position 5
        log_probs = log_probs + 1e-3 * step
    if CHANGE.get("noise"):
        log_probs = log_probs + CHANGE["noise"]
    return {"responses": responses, "log_probs": log_probs, "timing": {"s": float(step) + CHANGE.get("t", 0.0)}}


def generate_obj(step):
    out = make(step)
    return Rollout(out["responses"], out["log_probs"], {"step": step})
'''


@pytest.fixture
def stores(host_module: Any, tmp_path: Path) -> tuple[Path, Path, Any]:
    """Store A: steps 1-4 of ``gen``; store B: the same job changed from step 2 on, its timing different too."""
    name, _ = host_module(HOST)
    mod = sys.modules[name]
    for dump, change in ((tmp_path / "a", {}), (tmp_path / "b", {"from_step": 2, "t": 0.5})):
        mod.CHANGE.clear()
        mod.CHANGE.update(change)
        skipweave.weave({"skip": {"rollout": {"enable": True, "dump_dir": str(dump), "targets": {
            "gen": f"{name}:generate", "obj": f"{name}:generate_obj"}, "step": {"expr": "step"}}}})
        for step in (1, 2, 3, 4):
            mod.generate(step=step)
        mod.generate_obj(1)
        skipweave.unweave()
    mod.CHANGE.clear()
    return tmp_path / "a", tmp_path / "b", mod


def test_text_names_each_step_and_the_first_diverging_step_call_field_and_token(
        stores: tuple[Path, Path, Any], capsys: Any) -> None:
    a, b, _ = stores
    status, out, err = cli(capsys, "diff", str(a), str(b), "--target", "gen", "--ignore", "timing")
    assert status == 1, err
    rows = [line.split() for line in out.splitlines() if line.startswith("  ") and line.split()[0].isdigit()]
    assert [(r[0], r[3]) for r in rows] == [("1", "identical"), ("2", "diverged"), ("3", "diverged"),
                                           ("4", "diverged")]
    # 11 of 128 tokens differ, the first at sample 3, position 5; max |Δ| 2e-3
    assert rows[1][4:7] == ["responses", "[3,", "5]"] and rows[1][7] == "0.914" and rows[1][-1] == "0.002"
    assert rows[1][8:10] == ["[3,", "5]"] and "→" in rows[1][10]  # the first differing token, A→B
    assert ("first divergence: role rollout target gen step 2 call 0: diverged at responses [3, 5]: recorded "
            in out)
    assert "4 entries: identical 1, diverged 3" in out


def test_identical_stores_and_tolerances_exit_0(stores: tuple[Path, Path, Any], capsys: Any) -> None:
    a, b, _ = stores
    status, out, _ = cli(capsys, "diff", str(a), str(a))
    assert status == 0 and "every aligned entry is identical" in out
    status, out, _ = cli(capsys, "diff", str(a), str(b), "--steps", "1", "--target", "gen")
    assert status == 1 and "timing.s" in out  # exact by default: the timing differs
    status, out, _ = cli(capsys, "diff", str(a), str(b), "--steps", "1", "--target", "gen", "--atol", "1")
    assert status == 0 and "identical 0" not in out and "close 1" in out
    status, _, _ = cli(capsys, "diff", str(a), str(b), "--steps", "2-4", "--target", "gen", "--atol", "1",
                       "--ignore", "responses")
    assert status == 0  # log-prob deltas of 2e-3..4e-3 lie within atol 1


def test_json_document(stores: tuple[Path, Path, Any], capsys: Any) -> None:
    a, b, _ = stores
    status, out, _ = cli(capsys, "diff", str(a), str(b), "--json", "--ignore", "timing", "--ignore", "meta")
    doc = json.loads(out)
    assert status == 1 and doc["schema"] == "skipweave.diff/1"
    assert doc["dump_a"] == str(a) and doc["dump_b"] == str(b)
    by = {(r["target"], r["step"]): r for r in doc["rows"]}
    assert set(by) == {("gen", 1), ("gen", 2), ("gen", 3), ("gen", 4), ("obj", 1)}
    assert by[("obj", 1)]["status"] == "identical" and by[("gen", 1)]["token_match"] == 1.0
    row = by[("gen", 3)]
    assert row["first"]["detail"]["first_index"] == [3, 5]
    assert row["token_match"] == pytest.approx(1 - 11 / 128)
    assert row["max_abs_diff"] == pytest.approx(3e-3, rel=1e-3)
    assert doc["first_divergence"]["step"] == 2
    assert doc["totals"] == {"entries": 5, "failing": 3, "identical": 2, "diverged": 3}


def test_plot_file_is_a_png_with_content(stores: tuple[Path, Path, Any], capsys: Any, tmp_path: Path) -> None:
    a, b, _ = stores
    png = tmp_path / "diff.png"
    status, out, _ = cli(capsys, "diff", str(a), str(b), "--plot", str(png), "--ignore", "timing")
    assert status == 1 and f"plot: {png}" in out
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_compare_from_a_profile_file(stores: tuple[Path, Path, Any], capsys: Any, tmp_path: Path) -> None:
    a, b, _ = stores
    profile = tmp_path / "tolerant.yaml"
    profile.write_text("skip:\n  rollout:\n    compare:\n      fields:\n        timing: ignore\n"
                       "        log_probs: {atol: 0.01}\n        responses: ignore\n")
    status, out, err = cli(capsys, "diff", str(a), str(b), "--compare-from", str(profile), "--target", "gen")
    assert status == 0, out + err
    assert "identical 1, close 3" in out
    status, _, err = cli(capsys, "diff", str(a), str(b), "--compare-from", str(tmp_path / "missing.yaml"))
    assert status == 2 and "missing.yaml" in err


def test_one_sided_and_damaged_entries_fail_and_name_why(stores: tuple[Path, Path, Any], capsys: Any) -> None:
    a, b, mod = stores
    skipweave.weave({"skip": {"rollout": {"enable": True, "dump_dir": str(b), "targets": {
        "gen": f"{mod.__name__}:generate"}, "step": {"expr": "step"}}}})
    mod.generate(step=5)
    skipweave.unweave()
    tensors = next((b / "default" / "rollout" / "1" / "gen").glob("r0-0000*.safetensors"))
    data = bytearray(tensors.read_bytes())
    data[-3] ^= 0xFF
    tensors.write_bytes(bytes(data))
    status, out, _ = cli(capsys, "diff", str(a), str(b), "--json", "--target", "gen")
    doc = json.loads(out)
    by = {r["step"]: r for r in doc["rows"]}
    assert status == 1
    assert by[5]["status"] == "only_in_b"
    assert by[1]["status"] == "unreadable" and by[1]["reason"].startswith("B: ") and "checksum" in by[1]["reason"]


def test_unusable_input_exits_2(stores: tuple[Path, Path, Any], capsys: Any, tmp_path: Path) -> None:
    a, _, _ = stores
    status, _, err = cli(capsys, "diff", str(a), str(tmp_path / "nowhere"))
    assert status == 2 and "nowhere" in err
    (tmp_path / "empty").mkdir()
    status, _, err = cli(capsys, "diff", str(a), str(tmp_path / "empty"))
    assert status == 2 and "holds no recording" in err
    status, _, err = cli(capsys, "diff", str(a), str(a), "--target", "nothing-like-it")
    assert status == 2 and "no entry" in err
    status, _, err = cli(capsys, "diff", str(a), str(a), "--atol", "-1")
    assert status == 2 and "--atol/--rtol.atol=-1" in err
    status, _, err = cli(capsys, "diff", str(a), str(a), "--steps", "x")
    assert status == 2 and "--steps" in err


def test_trust_rebuilds_the_host_objects_for_those_who_want_them(stores: tuple[Path, Path, Any]) -> None:
    a, b, mod = stores
    env = {**os.environ, "PYTHONPATH": str(Path.cwd())}  # the host's folder is not on the path
    base = [sys.executable, "-m", "skipweave.cli.main", "diff", str(a), str(b), "--target", "obj"]
    proc = subprocess.run(base + ["--trust", f"{mod.__name__}:Rollout"], capture_output=True, text=True, env=env,
                          timeout=120)
    # objects wanted, but their module cannot be imported here: unreadable, and the hint says what to do
    assert proc.returncode == 1 and "unreadable" in proc.stdout and "PYTHONPATH" in proc.stdout, proc.stdout
    env["PYTHONPATH"] = os.pathsep.join([str(Path(mod.__file__).parent), str(Path.cwd())])
    proc = subprocess.run(base + ["--trust", f"{mod.__name__}:Rollout"], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0 and "identical" in proc.stdout, proc.stdout + proc.stderr


def test_steps_as_a_list_and_a_plot_that_cannot_be_written(stores: tuple[Path, Path, Any], capsys: Any,
                                                            tmp_path: Path) -> None:
    a, b, _ = stores
    status, out, _ = cli(capsys, "diff", str(a), str(b), "--steps", "[1,3]", "--target", "gen", "--json")
    assert status == 1 and [r["step"] for r in json.loads(out)["rows"]] == [1, 3]
    for plot, why in ((tmp_path / "nowhere" / "p.png", "does not exist"), (tmp_path, "is a folder"),
                      (tmp_path / "p.txt", "image file")):
        status, out, err = cli(capsys, "diff", str(a), str(b), "--plot", str(plot))
        assert status == 2 and why in err and not out, (plot, err)  # refused before the diff runs


ASYNC_HOST = '''
import asyncio

import torch

async def generate(step, prompt):
    await asyncio.sleep(0.01)
    return {"tokens": torch.arange(4) + 10 * prompt + step}
'''


def test_concurrent_calls_are_paired_by_their_inputs_not_their_end_order(
        host_module: Any, tmp_path: Path, capsys: Any) -> None:
    import asyncio

    name, _ = host_module(ASYNC_HOST)
    mod = sys.modules[name]
    # the agent loop starts the same prompts in another order in the second run: call indices follow that order
    for dump, order in ((tmp_path / "a", (0, 1, 2)), (tmp_path / "b", (2, 0, 1))):
        skipweave.weave({"skip": {"rollout": {"enable": True, "dump_dir": str(dump), "calls_per_step": 3,
                                              "targets": {"gen": f"{name}:generate"}, "step": {"expr": "step"}}}})

        async def step() -> None:
            await asyncio.gather(*(mod.generate(1, p) for p in order))  # noqa: B023 - run before the next loop

        asyncio.run(step())
        skipweave.unweave()
    status, out, _ = cli(capsys, "diff", str(tmp_path / "a"), str(tmp_path / "b"), "--json")
    rows = json.loads(out)["rows"]
    assert status == 0 and [r["status"] for r in rows] == ["identical"] * 3, out
    assert sum("call_b" in r for r in rows) == 3  # every pair crosses call indices


def test_entries_are_paired_as_a_verify_run_matches_them(host_module: Any, tmp_path: Path, capsys: Any) -> None:
    name, _ = host_module(ASYNC_HOST.replace("async def", "def").replace("    await asyncio.sleep(0.01)\n", ""))
    mod = sys.modules[name]
    # sequential calls of one step in another order: paired by their inputs, not their call indices
    for dump, order in ((tmp_path / "a", (0, 1, 2)), (tmp_path / "b", (1, 2, 0))):
        skipweave.weave({"skip": {"rollout": {"enable": True, "dump_dir": str(dump), "calls_per_step": 3,
                                              "targets": {"gen": f"{name}:generate"}, "step": {"expr": "step"}}}})
        for p in order:
            mod.generate(1, p)
        skipweave.unweave()
    status, out, _ = cli(capsys, "diff", str(tmp_path / "a"), str(tmp_path / "b"))
    assert status == 0 and "call (A/B)" in out and "0/2" in out, out


TRL_HOST = '''
CHANGE = {}


class Batch:
    """A batch class of the host's own, DataProto-shaped (verl's), not a dataclass: its module is not on the diff
    process's path."""

    def __init__(self, batch, non_tensor_batch, meta_info):
        self.batch, self.non_tensor_batch, self.meta_info = batch, non_tensor_batch, meta_info


def generate(step, validate=False):
    # token ids as TRL and vLLM hand them back: ragged Python lists, one per sample
    completions = [[(5 * step + i + j) % 40 for j in range(2 + i)] for i in range(3)]
    return Batch({"completion_ids": completions}, {}, {"timing": {"gen": 0.1 + CHANGE.get("t", 0.0)}})


def reward(step, validate=False):
    return {"rewards": [0.5 * step + (CHANGE.get("reward", 0.0) if step >= 2 else 0.0)] * 3}
'''


@pytest.fixture
def trl_stores(host_module: Any, tmp_path: Path) -> tuple[Path, Path]:
    """Store A: steps 1-3 of ``gen`` (validation at step 3) and ``reward``; store B: the same job after an edit of
    ``generate``'s source that changes sample 2's token at position 1 from step 2 on, with another timing, a reward
    changed from step 2 on, and one step more."""
    import importlib

    name, folder = host_module(TRL_HOST)
    mod = sys.modules[name]
    for dump, steps in ((tmp_path / "a", (1, 2, 3)), (tmp_path / "b", (1, 2, 3, 4))):
        skipweave.weave({"skip": {"rollout": {
            "enable": True, "dump_dir": str(dump), "record_validation": True, "bypass": {"expr": "validate"},
            "targets": {"gen": f"{name}:generate", "reward": f"{name}:reward"}, "step": {"expr": "step"}}}})
        for step in steps:
            mod.generate(step)
            mod.reward(step)
        mod.generate(3, validate=True)
        skipweave.unweave()
        source = folder / f"{name}.py"
        source.write_text(source.read_text().replace(
            "    return Batch(", "    if step >= 2:\n        completions[2][1] += 1\n    return Batch("))
        mod = importlib.reload(mod)
        mod.CHANGE.update(t=0.3, reward=0.5)
    return tmp_path / "a", tmp_path / "b"


def test_token_lists_float_only_results_and_timings_with_no_flags(trl_stores: tuple[Path, Path],
                                                                  capsys: Any) -> None:
    a, b = trl_stores
    status, out, err = cli(capsys, "diff", str(a), str(b), "--json")
    assert status == 1, err
    rows = {(r["target"], r["shard"], r["step"]): r for r in json.loads(out)["rows"]}
    # the timing differs at every step, but the shipped verify profile's rules ignore it: step 1 is identical
    assert rows[("gen", "r0", 1)]["status"] == "identical" and rows[("gen", "r0", 1)]["token_match"] == 1.0
    gen = rows[("gen", "r0", 2)]
    assert (gen["status"], gen["first"]["path"]) == ("diverged", "batch.completion_ids")
    detail = gen["first"]["detail"]
    assert detail["first_index"] == [2, 1] and detail["live"] == detail["recorded"] + 1 and detail["tokens"]
    assert gen["token_match"] == pytest.approx(8 / 9) and gen["first_token"]["path"] == "batch.completion_ids"
    assert gen["max_abs_diff"] is None  # no float field compared (the timing is ignored)
    assert [c[0] for c in gen["environment"]] == ["target source"]  # generate's source was edited
    score = rows[("reward", "r0", 2)]  # floats only: token match null, never 1.0
    assert score["status"] == "diverged" and score["token_match"] is None and score["max_abs_diff"] == 0.5
    assert "environment" not in score  # reward's source did not change
    assert rows[("gen", "r0", 4)]["status"] == "only_in_b"

    status, out, _ = cli(capsys, "diff", str(a), str(b), "--target", "reward", "--steps", "2")
    (row,) = [line.split() for line in out.splitlines() if line.startswith("  2 ")]
    # a scalar has no position ("at" is empty, not the kind "value"); no token field: n/a, not 1.000
    assert row[3:] == ["diverged", "rewards.0", "n/a", "0.5"], row
    status, out, _ = cli(capsys, "diff", str(a), str(b), "--target", "gen", "--steps", "2")
    assert ("first divergence: role rollout target gen step 2 call 0: diverged at batch.completion_ids [2, 1]: "
            "recorded ") in out and "(token match 0.889); environment changed: target source " in out, out
    status, out, _ = cli(capsys, "diff", str(a), str(b), "--steps", "1", "--target", "gen", "--compare-from", "off")
    assert status == 1 and "meta_info.timing.gen" in out  # every field exact: the timing differs


def test_a_store_whose_classes_this_process_cannot_import_diffs_with_no_flags(
        trl_stores: tuple[Path, Path]) -> None:
    a, b = trl_stores
    env = {**os.environ, "PYTHONPATH": str(Path.cwd())}  # the host's folder is not on the diff's path
    proc = subprocess.run([sys.executable, "-m", "skipweave.cli.main", "diff", str(a), str(b), "--target", "gen"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "unreadable" not in proc.stdout and "batch.completion_ids" in proc.stdout, proc.stdout
    rows = [line.split() for line in proc.stdout.splitlines() if line.startswith("  ") and line.split()[0].isdigit()]
    assert [(r[0], r[2], r[3]) for r in rows] == [("1", "r0", "identical"), ("2", "r0", "diverged"),
                                                 ("3", "r0", "diverged"), ("3", "val_r0", "diverged"),
                                                 ("4", "r0", "only_in_b")], proc.stdout
    assert "environment differs between A and B in 4 entries: target source " in proc.stdout


def test_the_plot_leaves_gaps_where_a_series_has_no_value_and_marks_one_sided_steps(
        trl_stores: tuple[Path, Path], capsys: Any, tmp_path: Path) -> None:
    import math

    import matplotlib.pyplot as plt

    from skipweave.cli.diff_plot import figure, series

    a, b = trl_stores
    png = tmp_path / "p.png"
    status, out, _ = cli(capsys, "diff", str(a), str(b), "--json", "--plot", str(png))
    assert status == 1 and png.read_bytes()[:4] == b"\x89PNG"
    rows = json.loads(out)["rows"]
    data = series(rows)
    nan = math.nan
    assert data.steps == [1, 2, 3, 4]

    def same(got: list[float], want: list[float]) -> bool:
        return all((math.isnan(g) and math.isnan(w)) or g == pytest.approx(w) for g, w in zip(got, want, strict=True))

    # validation only at step 3: a point, not a line across steps 1-4; no value at step 4 (only B holds it)
    assert same(data.token_match["rollout/gen"], [1.0, 8 / 9, 8 / 9, nan])
    assert same(data.token_match["rollout/gen (validation)"], [nan, nan, 8 / 9, nan])
    assert "rollout/reward" not in data.token_match  # floats only: no token line at all, never a flat 1.0
    assert same(data.max_abs_diff["rollout/reward"], [0.0, 0.5, 0.5, nan])
    assert "rollout/gen" not in data.max_abs_diff  # no float field compared (its timing is ignored)
    assert data.marks == {"only_in_b": [4]}

    fig = figure(rows)  # what matplotlib is handed
    try:
        top, bottom = fig.axes
        lines = {line.get_label(): line for line in top.get_lines()}
        assert same(list(lines["rollout/gen (validation)"].get_ydata()), [nan, nan, 8 / 9, nan])
        assert "rollout/reward" not in lines
        assert list(lines["only in B"].get_xdata()) == [4, 4]  # a vertical line at the step only B holds
        assert [line.get_label() for line in bottom.get_lines() if not line.get_label().startswith("_")] == [
            "rollout/reward"]
    finally:
        plt.close(fig)
