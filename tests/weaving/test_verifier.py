"""``action: verify``: a live call compared with its recording, reported per call, served live or recorded.

Real wrapt patches over a host module written to disk, real stores: a recording run (``cache``) and a verify run
are two weaves over the same dump dir, as two processes would be; the exit and error paths run in subprocesses.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

import skipweave
from skipweave.config.errors import ConfigError
from skipweave.verify.report import describe
from skipweave.weaving import verifier

HOST = '''
from dataclasses import dataclass, field

import numpy as np
import torch

CHANGE = {}   # what the next calls change: "token", "logp", "nested", "tags", "shape", "val"
CALLS = []


@dataclass
class Batch:
    batch: dict
    non_tensor_batch: dict = field(default_factory=dict)
    meta_info: dict = field(default_factory=dict)


class Engine:
    def generate(self, prompts):
        return self.make(prompts)

    def make(self, prompts):
        step = prompts.meta_info["global_steps"]
        validate = bool(prompts.meta_info.get("validate"))
        CALLS.append((step, validate))
        g = torch.Generator().manual_seed(100 * step + validate)
        responses = torch.randint(0, 50, (4, 6), generator=g)
        logp = torch.randn(4, 6, generator=g)
        torch.rand(2)  # the call consumes the global generator, as sampling does
        if CHANGE.get("token") == step and not validate:
            responses[2, 3] += 1
        if CHANGE.get("logp"):
            logp = logp + CHANGE["logp"]
        if CHANGE.get("shape") == step:
            responses = responses[:, :5]
        if CHANGE.get("val") and validate:
            responses = responses + 1
        tags = np.array(["a", "b", "c", "d"], dtype=object)
        if CHANGE.get("tags") == step:
            tags[2] = "z"
        extra = {"k": [1, 2, 3] if CHANGE.get("nested") != step else [1, 2, 4]}
        return Batch({"responses": responses, "logp": logp}, {"tags": tags},
                     {"global_steps": step, "extra": extra, "timing": {"s": float(len(CALLS))}})

    async def agenerate(self, prompts):
        await asyncio.sleep(0)
        return self.make(prompts)


import asyncio  # noqa: E402
'''


@pytest.fixture
def mod(host_module: Any) -> Any:
    name, _ = host_module(HOST)
    return sys.modules[name]


def _plan(mod: Any, dump: Path, report: Path, action: str = "verify", **role: Any) -> dict[str, Any]:
    targets = {"gen": f"{mod.__name__}:Engine.generate", "agen": f"{mod.__name__}:Engine.agenerate"}
    settings: dict[str, Any] = {"enable": True, "convention": "verl",
                                "dump_dir": str(dump), "action": action, "targets": targets,
                                "record_validation": True, **role}
    if action == "verify":
        settings.setdefault("report", str(report))
        settings.setdefault("compare", {"fields": {"meta_info.timing": "ignore"}})
    return {"skip": {"rollout": settings}}


def _prompts(mod: Any, step: int, validate: bool = False) -> Any:
    return mod.Batch({}, {}, {"global_steps": step, **({"validate": True} if validate else {})})


def _record(mod: Any, dump: Path, report: Path, steps: tuple[int, ...] = (1, 2, 3),
            validation: bool = False) -> list[Any]:
    skipweave.weave(_plan(mod, dump, report, action="cache"))
    engine = mod.Engine()
    out = [engine.generate(_prompts(mod, s)) for s in steps]
    if validation:
        engine.generate(_prompts(mod, steps[-1], validate=True))
    skipweave.unweave()
    return out


def _lines(report: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in report.read_text().splitlines()]


def _files(dump: Path) -> list[str]:
    return sorted(str(p.relative_to(dump)) for p in dump.rglob("*") if p.is_file() and ".runs" not in p.parts)


def test_an_unchanged_run_is_identical_at_every_step_and_records_nothing(mod: Any, tmp_path: Path) -> None:
    dump, report = tmp_path / "dump", tmp_path / "report.jsonl"
    _record(mod, dump, report)
    before = _files(dump)
    skipweave.weave(_plan(mod, dump, report))
    engine = mod.Engine()
    calls = len(mod.CALLS)
    outs = [engine.generate(_prompts(mod, s)) for s in (1, 2, 3)]
    assert len(mod.CALLS) == calls + 3  # every call ran live
    assert [o.meta_info["skipweave"]["status"] for o in outs] == ["verify"] * 3
    lines = _lines(report)
    assert [(x["step"], x["call"], x["status"], x["inputs"]) for x in lines] == [
        (1, 0, "identical", "same"), (2, 0, "identical", "same"), (3, 0, "identical", "same")]
    assert all(x["schema"] == "skipweave.verify.call/1" and x["fields"] > 0 for x in lines)
    skipweave.unweave()
    assert _files(dump) == before, set(_files(dump)) ^ set(before)


def test_a_changed_token_names_step_field_position_tokens_and_match_ratio(mod: Any, tmp_path: Path) -> None:
    dump, report = tmp_path / "dump", tmp_path / "report.jsonl"
    _record(mod, dump, report)
    mod.CHANGE["token"] = 2
    skipweave.weave(_plan(mod, dump, report))
    engine = mod.Engine()
    live = [engine.generate(_prompts(mod, s)) for s in (1, 2, 3)]
    assert int(live[1].batch["responses"][2, 3]) == int(_record_value(mod, 2)[2, 3]) + 1  # serve: live
    line = _lines(report)[1]
    assert (line["step"], line["status"]) == (2, "diverged")
    first = line["first"]
    assert first["path"] == "batch.responses" and first["kind"] == "value"
    assert first["detail"]["first_index"] == [2, 3]
    assert first["detail"]["live"] == first["detail"]["recorded"] + 1
    assert first["detail"]["match_ratio"] == pytest.approx(23 / 24)
    assert line["token_match"] == pytest.approx(23 / 24)
    tally = verifier.tallies()[("rollout", str(report))]
    assert tally.counts["diverged"] == 1 and tally.counts["identical"] == 2
    assert tally.first is not None and tally.first["step"] == 2
    assert "step 2 call 0: diverged at batch.responses [2, 3]" in tally.summary()


def _record_value(mod: Any, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 * step)
    return torch.randint(0, 50, (4, 6), generator=g)


@pytest.mark.parametrize(("change", "path", "kind"), [
    ({"nested": 1}, "meta_info.extra.k", "value"),  # a list of ints: a token field, compared whole
    ({"tags": 1}, "non_tensor_batch.tags.2", "value"),
    ({"shape": 1}, "batch.responses", "shape"),
])
def test_a_nested_dict_an_object_array_and_a_shape_diverge_where_they_differ(
        mod: Any, tmp_path: Path, change: dict[str, int], path: str, kind: str) -> None:
    dump, report = tmp_path / "dump", tmp_path / "report.jsonl"
    _record(mod, dump, report, steps=(1,))
    mod.CHANGE.update(change)
    skipweave.weave(_plan(mod, dump, report))
    mod.Engine().generate(_prompts(mod, 1))
    (line,) = _lines(report)
    assert (line["status"], line["first"]["path"], line["first"]["kind"]) == ("diverged", path, kind)
    if kind == "shape":
        assert line["first"]["detail"] == {"recorded": [4, 6], "live": [4, 5], "tokens": True}
        assert line["token_match"] is None


def test_floats_within_tolerance_are_close_beyond_it_diverged_and_ignored_fields_are_not_compared(
        mod: Any, tmp_path: Path) -> None:
    dump, report = tmp_path / "dump", tmp_path / "report.jsonl"
    _record(mod, dump, report, steps=(1,))
    mod.CHANGE["logp"] = 1e-4
    for compare, status in (({"fields": {"meta_info.timing": "ignore", "batch.logp": {"atol": 1e-3}}}, "close"),
                            ({"fields": {"meta_info.timing": "ignore", "batch.logp": {"atol": 1e-6}}}, "diverged"),
                            ({"fields": {"meta_info.timing*": "ignore", "batch.logp": "ignore"}}, "identical")):
        skipweave.weave(_plan(mod, dump, report, compare=compare))
        mod.Engine().generate(_prompts(mod, 1))
        skipweave.unweave()
        line = _lines(report)[-1]
        assert line["status"] == status, (compare, line)
        if status != "identical":
            detail = line["first"]["detail"]
            assert line["first"]["path"] == "batch.logp"
            assert detail["max_abs_diff"] == pytest.approx(1e-4, rel=1e-3)
            assert detail["beyond_fraction"] == (0.0 if status == "close" else 1.0)
    skipweave.weave(_plan(mod, dump, report, compare={}))  # timing not ignored: the call counter differs
    mod.Engine().generate(_prompts(mod, 1))
    assert _lines(report)[-1]["first"]["path"] == "batch.logp"  # walk order: batch before meta_info


def test_serve_recorded_hands_back_the_recording_and_the_rng_state_so_downstream_is_bit_identical(
        mod: Any, tmp_path: Path) -> None:
    dump, report = tmp_path / "dump", tmp_path / "report.jsonl"
    torch.manual_seed(7)
    skipweave.weave(_plan(mod, dump, report, action="cache"))
    recorded = mod.Engine().generate(_prompts(mod, 1))
    downstream = torch.rand(3)
    skipweave.unweave()

    mod.CHANGE.update(token=1, logp=0.5)
    torch.manual_seed(99)  # another stream: only the restored state can give run 1's numbers after the call
    skipweave.weave(_plan(mod, dump, report, serve="recorded"))
    served = mod.Engine().generate(_prompts(mod, 1))
    assert torch.equal(torch.rand(3), downstream)
    assert torch.equal(served.batch["responses"], recorded.batch["responses"])
    assert torch.equal(served.batch["logp"], recorded.batch["logp"])
    assert served.meta_info["skipweave"]["status"] == "hit"
    assert _lines(report)[-1]["status"] == "diverged"  # compared first, then the recording served


def test_on_diverge_error_raises_diverged_naming_role_target_step_call_and_field(mod: Any, tmp_path: Path) -> None:
    dump, report = tmp_path / "dump", tmp_path / "report.jsonl"
    _record(mod, dump, report)
    mod.CHANGE["token"] = 2
    skipweave.weave(_plan(mod, dump, report, on_diverge="error"))
    engine = mod.Engine()
    engine.generate(_prompts(mod, 1))
    with pytest.raises(skipweave.Diverged) as caught:
        engine.generate(_prompts(mod, 2))
    for part in ("role rollout", "target gen", "step 2", "call 0", "batch.responses [2, 3]", str(report)):
        assert part in str(caught.value), (part, str(caught.value))
    assert caught.value.line["step"] == 2
    assert _lines(report)[-1]["status"] == "diverged"  # the report has the line before the run stops


def test_a_call_without_recording_runs_live_is_reported_unrecorded_and_is_not_recorded(
        mod: Any, tmp_path: Path) -> None:
    dump, report = tmp_path / "dump", tmp_path / "report.jsonl"
    _record(mod, dump, report, steps=(1,))
    skipweave.weave(_plan(mod, dump, report))
    engine = mod.Engine()
    engine.generate(_prompts(mod, 1))
    out = engine.generate(_prompts(mod, 5))
    out2 = engine.generate(_prompts(mod, 1))  # a second call of step 1: no recording of call 1
    assert out.meta_info["skipweave"]["status"] == "verify" and out2.meta_info["skipweave"]["status"] == "verify"
    assert [(x["step"], x["call"], x["status"]) for x in _lines(report)] == [
        (1, 0, "identical"), (5, 0, "unrecorded"), (1, 1, "unrecorded")]
    skipweave.unweave()
    assert not (dump / "default" / "rollout" / "5").exists()
    assert verifier.tallies()[("rollout", str(report))].counts["unrecorded"] == 2


def test_async_targets_are_verified_with_the_same_outcome(mod: Any, tmp_path: Path) -> None:
    dump, report = tmp_path / "dump", tmp_path / "report.jsonl"
    skipweave.weave(_plan(mod, dump, report, action="cache"))
    engine = mod.Engine()

    async def steps(first: int) -> list[Any]:
        return list(await asyncio.gather(*(engine.agenerate(_prompts(mod, s)) for s in (first, first + 1))))

    asyncio.run(steps(1))
    skipweave.unweave()
    mod.CHANGE["token"] = 2
    skipweave.weave(_plan(mod, dump, report))
    outs = asyncio.run(steps(1))
    assert [o.meta_info["skipweave"]["status"] for o in outs] == ["verify", "verify"]
    by_step = {x["step"]: x for x in _lines(report)}
    assert by_step[1]["status"] == "identical" and by_step[2]["status"] == "diverged", json.dumps(by_step)
    assert by_step[2]["target"] == "agen" and by_step[2]["first"]["detail"]["first_index"] == [2, 3]
    skipweave.unweave()
    skipweave.weave(_plan(mod, dump, report, serve="recorded", on_diverge="error"))
    with pytest.raises(skipweave.Diverged, match="target agen step 2"):
        asyncio.run(steps(1))


def test_validation_calls_are_compared_with_validation_recordings_never_training_ones(
        mod: Any, tmp_path: Path) -> None:
    dump, report = tmp_path / "dump", tmp_path / "report.jsonl"
    _record(mod, dump, report, steps=(1, 2), validation=True)  # validation recorded at step 2 only
    mod.CHANGE["val"] = True
    skipweave.weave(_plan(mod, dump, report))
    engine = mod.Engine()
    engine.generate(_prompts(mod, 2))
    engine.generate(_prompts(mod, 2, validate=True))
    engine.generate(_prompts(mod, 1, validate=True))  # training recorded at step 1, validation not
    lines = _lines(report)
    assert [(x["step"], x["validation"], x["shard"], x["status"]) for x in lines] == [
        (2, False, "r0", "identical"), (2, True, "val_r0", "diverged"), (1, True, "val_r0", "unrecorded")]


def test_the_exit_summary_gives_counts_the_first_divergence_and_the_report_path(mod: Any, tmp_path: Path) -> None:
    dump, report = tmp_path / "dump", tmp_path / "report.jsonl"
    _record(mod, dump, report)
    script = tmp_path / "verify_run.py"
    script.write_text(textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {str(Path(mod.__file__).parent)!r})
        import skipweave, {mod.__name__} as mod
        mod.CHANGE.update({{"token": 3}})
        skipweave.weave(json.loads({json.dumps(json.dumps(_plan(mod, dump, report)))}))
        engine = mod.Engine()
        for step in (1, 2, 3):
            engine.generate(mod.Batch({{}}, {{}}, {{"global_steps": step}}))
        if len(sys.argv) > 1:
            skipweave.unweave()
            skipweave.weave(json.loads({json.dumps(json.dumps(_plan(mod, dump, report, on_diverge="error")))}))
            engine.generate(mod.Batch({{}}, {{}}, {{"global_steps": 3}}))
        print("finished")
    """))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "SKIPWEAVE_SUMMARY": "1"})
    assert proc.returncode == 0, proc.stderr
    assert "finished" in proc.stdout
    summary = [x for x in proc.stderr.splitlines() if "verify summary" in x]
    assert len(summary) == 1, proc.stderr
    assert ("calls=3 identical=2 close=0 diverged=1 unrecorded=0; first divergence: role rollout target gen step 3 "
            "call 0: diverged at batch.responses [2, 3]") in summary[0]
    assert summary[0].endswith(f"report: {report}")

    proc = subprocess.run([sys.executable, str(script), "error"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "finished" not in proc.stdout
    assert "skipweave.weaving.verifier.Diverged: skipweave verify: role rollout target gen step 3 call 1" not in \
        proc.stderr  # the second weave starts its call count afresh: step 3 is call 0 again
    assert "Diverged: skipweave verify: role rollout target gen step 3 call 0: diverged at batch.responses" in \
        proc.stderr


@pytest.mark.parametrize(("role", "key", "allowed"), [
    ({"action": "verify", "replay_only": True}, "skip.rollout.replay_only", "false with action verify"),
    ({"action": "cache", "serve": "recorded"}, "skip.rollout.serve", "only with action verify"),
    ({"action": "cache", "on_diverge": "error"}, "skip.rollout.on_diverge", "only with action verify"),
    ({"action": "verify", "serve": "both"}, "skip.rollout.serve", "live"),
    ({"action": "verify", "compare": {"fields": {"batch.logp": {"atol": -1}}}},
     "skip.rollout.compare.fields.batch.logp.atol", "finite number >= 0"),
    ({"action": "verify", "compare": {"default": "fuzzy"}}, "skip.rollout.compare.default", "exact, ignore"),
    ({"action": "verify", "record_steps": [1]}, "skip.rollout.record_steps", "verify records nothing"),
])
def test_a_bad_verify_setting_names_the_key_the_value_and_what_is_allowed_before_weaving(
        mod: Any, tmp_path: Path, role: dict[str, Any], key: str, allowed: str) -> None:
    plan = _plan(mod, tmp_path / "dump", tmp_path / "r.jsonl", **{k: v for k, v in role.items() if k != "action"},
                 action=role["action"])
    with pytest.raises(ConfigError) as caught:
        skipweave.weave(plan)
    assert caught.value.key == key and allowed in str(caught.value), str(caught.value)
    assert skipweave.woven_plan() is None


def test_the_default_report_is_one_absolute_file_per_run_fixed_when_the_config_is_read(
        mod: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from skipweave.config.parse import parse_skip

    monkeypatch.chdir(tmp_path)
    skip = {name: {"enable": True, "convention": "verl",
                   "action": "verify", "targets": {"g": f"{mod.__name__}:Engine.generate"}}
            for name in ("rollout", "ref")}
    config = parse_skip(skip)
    paths = {r.report for r in config.roles.values()}
    (path,) = paths
    assert path is not None and os.path.isabs(path) and Path(path).parent == tmp_path
    assert Path(path).name.startswith("skipweave-verify-") and path.endswith(".jsonl")
    assert parse_skip(config.to_config()["skip"]) == config  # what a Ray worker reads back: the same file
    assert parse_skip({"rollout": {"enable": True, "convention": "verl",
                                   "targets": {"g": "a.b:C.d"}}}).roles["rollout"].report is None


def test_a_corrupt_recording_is_left_in_place_and_the_call_is_reported_with_the_reason(
        mod: Any, tmp_path: Path) -> None:
    dump, report = tmp_path / "dump", tmp_path / "report.jsonl"
    _record(mod, dump, report, steps=(1, 2))
    (tensors,) = (dump / "default" / "rollout" / "2" / "gen").glob("r0-0000*.safetensors")
    data = bytearray(tensors.read_bytes())
    data[-3] ^= 0xFF
    tensors.write_bytes(bytes(data))
    before = _files(dump)
    skipweave.weave(_plan(mod, dump, report))
    engine = mod.Engine()
    outs = [engine.generate(_prompts(mod, s)) for s in (1, 2)]
    skipweave.unweave()
    assert [o.meta_info["skipweave"]["status"] for o in outs] == ["verify", "verify"]
    line = _lines(report)[1]
    assert (line["step"], line["status"]) == (2, "unrecorded") and "checksum" in line["reason"], line
    assert _files(dump) == before  # not set aside: a verify run changes nothing in the store
    assert "its recording cannot be used" in describe(line)


def test_serve_recorded_leaves_declared_effects_as_a_replay_does_not_doubled(mod: Any, tmp_path: Path) -> None:
    dump, report = tmp_path / "dump", tmp_path / "report.jsonl"
    name = mod.__name__
    mod.Engine.log = None

    def plan(action: str, **role: Any) -> dict[str, Any]:
        p = _plan(mod, dump, report, action=action, effects=["self.log", "self.seen"], **role)
        p["skip"]["rollout"]["targets"] = {"logged": f"{name}:Logged.generate"}
        return p

    exec(textwrap.dedent("""
        class Logged(Engine):
            def __init__(self):
                self.log, self.seen = [], 0

            def generate(self, prompts):
                out = self.make(prompts)
                self.log.append(("step", prompts.meta_info["global_steps"], len(CALLS)))
                self.seen += 1
                return out
    """), mod.__dict__)
    skipweave.weave(plan("cache"))
    recorded = mod.Logged()
    for step in (1, 2):
        recorded.generate(_prompts(mod, step))
    skipweave.unweave()

    skipweave.weave(plan("verify", serve="recorded"))
    verified = mod.Logged()
    for step in (1, 2):
        verified.generate(_prompts(mod, step))
    assert verified.log == recorded.log and verified.seen == 2  # the recorded items once, not the live ones too
    assert [x["status"] for x in _lines(report)] == ["identical", "identical"]
    skipweave.unweave()

    skipweave.weave(plan("verify"))  # serve: live keeps what the live call did
    live = mod.Logged()
    live.generate(_prompts(mod, 1))
    assert len(live.log) == 1 and live.log[0][2] != recorded.log[0][2]


def test_a_retry_after_the_host_raised_is_compared_and_served_from_the_same_recording(
        mod: Any, tmp_path: Path) -> None:
    dump, report = tmp_path / "dump", tmp_path / "report.jsonl"
    recorded = _record(mod, dump, report, steps=(1, 2))
    skipweave.weave(_plan(mod, dump, report, serve="recorded"))
    engine = mod.Engine()
    engine.generate(_prompts(mod, 1))
    real = mod.Engine.make
    mod.Engine.make = lambda self, prompts: (_ for _ in ()).throw(RuntimeError("engine hiccup"))
    try:
        with pytest.raises(RuntimeError, match="engine hiccup"):
            engine.generate(_prompts(mod, 2))
    finally:
        mod.Engine.make = real
    mod.CHANGE["token"] = 2
    served = engine.generate(_prompts(mod, 2))  # the retry takes call 0 and its recording back
    assert torch.equal(served.batch["responses"], recorded[1].batch["responses"])
    assert [(x["step"], x["call"], x["status"]) for x in _lines(report)] == [(1, 0, "identical"), (2, 0, "diverged")]


def test_a_run_with_nothing_to_compare_says_so_loudly_and_report_null_is_one_file(
        mod: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    dump = tmp_path / "dump"
    _record(mod, dump, tmp_path / "r.jsonl", steps=(1,))
    monkeypatch.chdir(tmp_path)
    plan = _plan(mod, tmp_path / "typo", tmp_path / "r.jsonl")
    plan["skip"]["rollout"]["report"] = None  # as `skip.rollout.report=null`: the run's one default file
    skipweave.weave(plan)
    (role,) = skipweave.woven_plan().roles.values()  # type: ignore[union-attr]
    assert role.report is not None and Path(role.report).parent == tmp_path
    with caplog.at_level("INFO", logger="skipweave"):
        engine = mod.Engine()
        engine.generate(_prompts(mod, 1))
        engine.generate(_prompts(mod, 2))
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "verify" in r.getMessage()]
    assert len(warnings) == 1 and "no recording to compare against" in warnings[0] and "typo" in warnings[0]
    tally = verifier.tallies()[("rollout", role.report)]
    assert tally.summary().endswith("nothing was compared: no call had a recording (check the dump dir and "
                                    "namespace)")


def test_a_retry_after_diverged_is_compared_again_and_a_spec_that_compares_nothing_is_a_warning(
        mod: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    dump, report = tmp_path / "dump", tmp_path / "report.jsonl"
    _record(mod, dump, report, steps=(1,))
    mod.CHANGE["token"] = 1
    skipweave.weave(_plan(mod, dump, report, on_diverge="error"))
    engine = mod.Engine()
    for _ in range(2):  # a host (or Ray) retrying the call: compared with the same recording, raises again
        with pytest.raises(skipweave.Diverged, match="step 1 call 0"):
            engine.generate(_prompts(mod, 1))
    skipweave.unweave()
    typo = {"default": "ignore", "fields": {"batch.respones": "exact"}}
    skipweave.weave(_plan(mod, dump, report, compare=typo))
    with caplog.at_level("WARNING", logger="skipweave"):
        engine.generate(_prompts(mod, 1))
    assert _lines(report)[-1]["status"] == "identical" and _lines(report)[-1]["fields"] == 0
    assert any("no field of the result was compared" in r.getMessage() for r in caplog.records)


TRL_HOST = '''
CHANGE = {}


class Generator:
    """Shaped as TRL's and vLLM's outputs: token ids as ragged Python lists, log-probs as lists of floats."""

    def generate(self, prompts, step):
        completions = [[(7 * step + 3 * i + j) % 50 for j in range(3 + i)] for i in range(len(prompts))]
        if CHANGE.get("token") == step:
            completions[1][2] += 100  # sample 1 departs at position 2
        return {"prompt_ids": [[1, 2]] * len(prompts), "completion_ids": completions,
                "logps": [[-0.5] * len(c) for c in completions]}

    def score(self, prompts, step):
        return {"rewards": [0.25 * step + CHANGE.get("reward", 0.0) for _ in prompts]}
'''


def _trl_plan(name: str, dump: Path, report: Path, action: str) -> dict[str, Any]:
    return {"skip": {"rollout": {"enable": True, "convention": "verl",
                                 "dump_dir": str(dump), "action": action, "report": str(report),
                                 "targets": {"gen": f"{name}:Generator.generate", "score": f"{name}:Generator.score"},
                                 "step": {"expr": "step"}}}}


def _trl_steps(mod: Any, steps: tuple[int, ...] = (1, 2)) -> None:
    engine = mod.Generator()
    for step in steps:
        engine.generate(["p0", "p1", "p2"], step=step)
        engine.score(["p0", "p1", "p2"], step=step)


def test_token_ids_in_lists_are_verified_as_tokens_and_a_float_only_result_has_no_token_match(
        host_module: Any, tmp_path: Path) -> None:
    name, _ = host_module(TRL_HOST)
    mod = sys.modules[name]
    dump, report = tmp_path / "dump", tmp_path / "report.jsonl"
    skipweave.weave(_trl_plan(name, dump, report, "cache"))
    _trl_steps(mod)
    skipweave.unweave()
    mod.CHANGE.update(token=2, reward=0.5)
    skipweave.weave(_trl_plan(name, dump, report, "verify"))
    _trl_steps(mod)
    by = {(x["target"], x["step"]): x for x in _lines(report)}
    assert by[("gen", 1)]["status"] == "identical" and by[("gen", 1)]["token_match"] == 1.0
    line = by[("gen", 2)]
    assert (line["status"], line["first"]["path"], line["first"]["kind"]) == ("diverged", "completion_ids", "value")
    detail = line["first"]["detail"]
    assert detail["first_index"] == [1, 2] and detail["live"] == detail["recorded"] + 100
    assert line["token_match"] == pytest.approx(11 / 12)  # 3 + 4 + 5 positions, one differs
    assert line["max_abs_diff"] == 0.0  # the log-probs, floats, are equal
    assert line["first_token"]["path"] == "completion_ids"
    score = by[("score", 1)]  # floats only: no token match, never 1.0
    assert score["status"] == "diverged" and score["token_match"] is None and score["first_token"] is None
    assert score["max_abs_diff"] == pytest.approx(0.5)
    summary = verifier.tallies()[("rollout", str(report))].summary()
    assert ("first divergence: role rollout target score step 1 call 0: diverged at rewards.0: max |Δ| 0.5"
            in summary), summary
    text = describe(line)
    assert (f"diverged at completion_ids [1, 2]: recorded {detail['recorded']}, live {detail['recorded'] + 100} "
            "(token match 0.917)") in text, text


def test_a_changed_target_source_is_named_beside_the_divergence_as_a_likely_cause(
        host_module: Any, tmp_path: Path) -> None:
    import importlib

    name, folder = host_module(TRL_HOST)
    mod = sys.modules[name]
    dump, report = tmp_path / "dump", tmp_path / "report.jsonl"
    skipweave.weave(_trl_plan(name, dump, report, "cache"))
    _trl_steps(mod, (1,))
    skipweave.unweave()
    source = folder / f"{name}.py"  # someone edits the generation code: a new token at step 1
    source.write_text(source.read_text().replace("completions[1][2] += 100", "completions[1][2] += 100\n"
                                                 "        completions[0][0] += 1 if step == 1 else 0"))
    mod = importlib.reload(mod)
    skipweave.weave(_trl_plan(name, dump, report, "verify"))
    _trl_steps(mod, (1,))
    line = next(x for x in _lines(report) if x["target"] == "gen")
    assert line["status"] == "diverged" and [c[0] for c in line["environment"]] == ["target source"]
    assert line["environment"][0][1] != line["environment"][0][2]
    assert "; environment changed: target source " in describe(line) and "(a likely cause)" in describe(line)
    score = next(x for x in _lines(report) if x["target"] == "score")
    assert score["status"] == "identical" and "environment" not in score  # score's own source did not change
    summary = verifier.tallies()[("rollout", str(report))].summary()
    assert "diverged at completion_ids [0, 0]" in summary and "environment changed: target source" in summary
