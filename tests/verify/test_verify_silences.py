"""Two silences of verify runs: a ``compare.fields`` rule that names no field (a typo compares nothing) is a WARNING
once per rule, and a call the host retried after ``Diverged`` counts once in the summary.

The rule check (:mod:`skipweave.verify.rules`) and the tally (:class:`skipweave.verify.report.Tally`) first, then the
same from the user's side: ``skipweave run --skip rollout_verify`` over a one-file trainer, in a subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch

from skipweave.config.compare import CompareSpec
from skipweave.verify.report import read_lines, tally
from skipweave.verify.rules import field_sample, unmatched_rules

ROOT = Path(__file__).resolve().parents[2]


def test_rules_naming_no_field_of_either_side_are_found_ignore_rules_aside() -> None:
    recorded = {"responses": torch.ones(2, 3, dtype=torch.long), "log_probs": torch.zeros(2, 3),
                "meta": {"timing": {"gen": 1.0}}}
    live = {**recorded, "extra": [1, 2]}
    spec = CompareSpec.parse({"default": "ignore", "fields": {
        "responses": "exact", "log_prob": {"atol": 1e-3}, "meta.tim*": "exact", "extra.1": "exact",
        "responses.0": "exact", "timng": "ignore", "*": {"rtol": 0.1}}})
    # log_prob: a typo; extra.1 and responses.0: below a token list and a tensor, each compared whole
    # (verify/tokens.py); timng: an ignore rule (never reported)
    assert [p for p, _ in unmatched_rules(spec, recorded, live)] == ["log_prob", "extra.1", "responses.0"]
    assert unmatched_rules(CompareSpec.parse({"fields": {"a": "exact"}}), torch.ones(3)) == [("a", "exact")]
    assert field_sample(recorded, live, limit=2) == "responses, log_probs, … (4 in all)"  # extra: one token list
    assert field_sample(torch.ones(3)) == "(none: the result is a single value)"


def _line(step: int, status: str, call: int = 0, shard: str = "r0") -> dict[str, Any]:
    return {"schema": "skipweave.verify.call/1", "role": "rollout", "target": "gen", "step": step, "call": call,
            "shard": shard, "validation": shard.startswith("val_"), "status": status, "fields": 1,
            "first": None if status == "identical" else {"path": "responses", "kind": "value", "status": status}}


def test_a_call_reported_again_counts_once_by_its_latest_line() -> None:
    lines = [_line(1, "identical"), _line(2, "diverged"), _line(2, "diverged"), _line(3, "diverged"),
             _line(3, "diverged", shard="val_r0"), _line(4, "unrecorded")]
    t = tally(lines)
    assert t.calls == 5 and t.counts == {"identical": 1, "close": 0, "diverged": 3, "unrecorded": 1}
    assert t.first is not None and t.first["step"] == 2
    # the retry of the earliest diverging call matched: the next one is the first divergence now
    t.add(_line(2, "identical"))
    assert t.counts["identical"] == 2 and t.counts["diverged"] == 2 and t.first is not None and t.first["step"] == 3
    # lines without a call's key (another writer's) count each
    assert tally([{"status": "identical"}, {"status": "identical"}]).calls == 2


TRAINER = '''
import os
import sys

import torch

ENGINE = os.environ.get("ENGINE", "old")


class Gen:
    def __init__(self):
        self.step = 0

    def generate(self, prompts):
        responses = torch.arange(6).reshape(2, 3) + 10 * self.step
        if ENGINE == "new" and self.step >= 2:
            responses[1, 2] += 1
        return {"responses": responses, "log_probs": torch.full((2, 3), -0.5)}


gen = Gen()
for step in (1, 2, 3):
    gen.step = step
    for attempt in (1, 2):  # a host that retries a step once when verify stops it
        try:
            gen.generate(["a", "b"])
            break
        except RuntimeError as exc:
            if type(exc).__name__ != "Diverged":
                raise
            print(f"step {step} attempt {attempt}: diverged", file=sys.stderr)
'''

GEN = ["+skip.rollout.targets.gen=vtrainer:Gen.generate", "+skip.rollout.step.expr=self.step",
       "skip.rollout.dump_dir=store"]


def _run(folder: Path, *args: str, engine: str = "old") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SKIPWEAVE_", "HYDRA_"))}
    env.update(ENGINE=engine, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p))
    return subprocess.run([sys.executable, "-m", "skipweave.cli", "run", *args, "--", sys.executable, "vtrainer.py"],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=180)


@pytest.fixture(scope="module")
def verified(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, subprocess.CompletedProcess[str]]]:
    """One recording, then two verify runs of the new engine over it (side by side)."""
    folder = tmp_path_factory.mktemp("verify_silences")
    (folder / "vtrainer.py").write_text(TRAINER)
    record = _run(folder, "--skip", "rollout_cache", *GEN)
    assert record.returncode == 0, record.stderr
    runs = {
        "typos": ["--skip", "rollout_verify", *GEN, "skip.rollout.report=typos.jsonl",
                  "+skip.rollout.compare.fields.log_prob={atol: 1e-3}", "+skip.rollout.compare.fields.respones=exact",
                  "+skip.rollout.compare.fields.timng=ignore"],
        "retry": ["--skip", "rollout_verify", *GEN, "skip.rollout.report=retry.jsonl", "skip.rollout.on_diverge=error"],
    }
    with ThreadPoolExecutor(max_workers=len(runs)) as pool:
        futures = {name: pool.submit(_run, folder, *args, engine="new") for name, args in runs.items()}
        return folder, {name: future.result() for name, future in futures.items()}


def test_a_compare_rule_naming_no_field_is_a_warning_once_per_rule(
        verified: tuple[Path, dict[str, subprocess.CompletedProcess[str]]]) -> None:
    _, runs = verified
    err = runs["typos"].stderr
    assert runs["typos"].returncode == 0, err
    for rule, form in (("log_prob", "{'atol': 0.001, 'rtol': 0.0}"), ("respones", "exact")):
        line = (f"skipweave verify: role rollout target gen: skip.rollout.compare.fields rule '{rule}' ({form}) names "
                "no field of the recorded or the live result of step 1 call 0, so it compares nothing (check its "
                "spelling); the result's fields: responses, log_probs")
        assert err.count(line) == 1, err  # once, though three calls were compared
    assert "'timng'" not in err and "meta_info.timing" not in err  # ignore rules (the profile's too): nothing said
    assert "calls=3 identical=1 close=0 diverged=2" in err


def test_a_retried_call_counts_once_in_the_verify_summary(
        verified: tuple[Path, dict[str, subprocess.CompletedProcess[str]]]) -> None:
    folder, runs = verified
    err = runs["retry"].stderr
    assert runs["retry"].returncode == 0, err
    assert err.count(": diverged\n") == 4, err  # steps 2 and 3, each stopped twice
    lines = list(read_lines(str(folder / "retry.jsonl")))
    assert [(x["step"], x["status"]) for x in lines] == [(1, "identical"), (2, "diverged"), (2, "diverged"),
                                                          (3, "diverged"), (3, "diverged")]
    summary = next(x for x in err.splitlines() if "skipweave verify summary role=rollout" in x)
    assert "calls=3 identical=1 close=0 diverged=2 unrecorded=0" in summary, summary
    assert "first divergence: role rollout target gen step 2 call 0" in summary
    assert tally(lines).calls == 3
