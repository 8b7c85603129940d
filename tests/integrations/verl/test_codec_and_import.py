"""verl's ``DataProto`` through the safe codec, and caches written by verl itself imported and replayed.

The caches are written by verl's own ``RolloutSkip`` / ``RolloutTqSkip`` (current layouts) and by hand in
the legacy ``genstep_000001`` layout. Needs verl (CI installs it).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import numpy as np  # noqa: E402
import pytest
import torch  # noqa: E402

import skipweave  # noqa: E402
from skipweave.cli.main import main as cli  # noqa: E402
from skipweave.config import load_skip_config  # noqa: E402
from skipweave.integrations.hydra.callback import job_skip_config  # noqa: E402
from skipweave.integrations.verl.importer import scan  # noqa: E402
from skipweave.store.format import codec  # noqa: E402
from skipweave.store.step_store import StepStore  # noqa: E402
from tests.integrations.verl.apps.agent_loop_app import N, compose, train_batch  # noqa: E402
from tests.integrations.verl.helpers import FakeTQ, FakeTQAgentLoop, FakeWorker  # noqa: E402

NS = "exp_proj.GBS2_N2_in4_out3"


def _dataproto(rows: int = 4, seed: int = 0) -> Any:
    from tensordict import TensorDict
    from verl.protocol import DataProto

    g = torch.Generator().manual_seed(seed)
    dicts = np.empty(rows, dtype=object)
    dicts[:] = [{"score": float(i), "tags": ["a", str(i)], "nested": {"ok": i % 2 == 0}} for i in range(rows)]
    return DataProto(
        batch=TensorDict({
            "responses": torch.randint(0, 1000, (rows, 5), generator=g),
            "old_log_probs": torch.randn(rows, 5, generator=g).to(torch.bfloat16),
            "attention_mask": torch.ones(rows, 9, dtype=torch.bool),
        }, batch_size=rows),
        non_tensor_batch={
            "uid": np.array([str(uuid.UUID(int=i)) for i in range(rows)], dtype=object),
            "extras": dicts,
            "__num_turns__": np.arange(rows, dtype=np.int32),
        },
        meta_info={"timing": {"gen": 1.5}, "metrics": [{"a": 1}], "nested": {"x": [1, (2, 3)], "y": None}},
    )


def _assert_same(a: Any, b: Any) -> None:
    assert type(a) is type(b)
    assert a.batch.batch_size == b.batch.batch_size and sorted(a.batch.keys()) == sorted(b.batch.keys())
    for key in a.batch.keys():
        assert a.batch[key].dtype == b.batch[key].dtype and torch.equal(a.batch[key], b.batch[key]), key
    assert list(a.non_tensor_batch) == list(b.non_tensor_batch)
    for key, arr in a.non_tensor_batch.items():
        assert arr.dtype == b.non_tensor_batch[key].dtype and list(arr) == list(b.non_tensor_batch[key]), key
    assert a.meta_info == b.meta_info


def test_dataproto_round_trips_exactly_through_the_safe_codec(tmp_path: Path) -> None:
    import safetensors.torch

    dp = _dataproto()
    enc = codec.encode(dp)  # no allow_pickle: refused if anything needed pickle
    assert not enc.pickled
    tree = json.loads(json.dumps(enc.tree))
    safetensors.torch.save_file(enc.tensors, tmp_path / "t.safetensors")
    back = codec.decode(tree, safetensors.torch.load_file(tmp_path / "t.safetensors"))
    _assert_same(dp, back)
    assert isinstance(back.meta_info["nested"]["x"][1], tuple)
    back.check_consistency()  # verl's own invariants hold on the decoded object


def _write_verl_caches(root: Path, cfg: Any, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Caches in every layout, written the way verl writes them."""
    from transfer_queue import KVBatchMeta
    from verl.utils.skip.config import RolloutSkipConfig, RolloutTqSkipConfig
    from verl.utils.skip.rollout_skip import RolloutSkip, RolloutTqSkip

    written: dict[str, Any] = {}
    rollout = RolloutSkip(RolloutSkipConfig(enable=True, dump_dir=str(root), steps=[1, 2]), cfg)
    for step in (1, 2):
        written[f"gen{step}"] = _dataproto(2 * N, seed=step)
        rollout.prepare_data(step, written[f"gen{step}"])
    # V1: two mini-batches of step 3 ({step}/{inner}/tq_batch.pt), via verl's writer and a fake TransferQueue.
    tq = FakeTQ().install(monkeypatch)
    agent = FakeTQAgentLoop(tq, N)
    tq_skip = RolloutTqSkip(RolloutTqSkipConfig(enable=True, dump_dir=str(root), steps=[3]), cfg)
    tq_skip.parameter_sync_step = 2
    from verl.utils import tensordict_utils as tu

    for _inner in range(2):
        uids = [f"{uuid.uuid4().hex}" for _ in range(2)]
        batch = tu.get_tensordict({"uid": uids})
        tu.assign_non_tensor_data(batch, "global_steps", 3)
        agent.generate_sequences(batch)
        keys = [k for k in tq.tags["train"] if k.split("_")[0] in uids and "_" in k]
        tq_skip.prepare_data(3, KVBatchMeta(keys=keys, tags=[tq.tags["train"][k] for k in keys],
                                            partition_id="train"), 3)
    # Legacy verl (2025-2026): genstep folders; train step 4 made two gen steps (DAPO).
    shape = root / "exp_proj" / "GBS2_N2_in4_out3"
    with open(shape / "train_step__gen_step.txt", "a") as fh:
        for gen, train in ((7, 4), (8, 4)):
            folder = shape / f"genstep_{gen:06d}"
            folder.mkdir()
            written[f"legacy{gen}"] = _dataproto(2 * N, seed=gen)
            written[f"legacy{gen}"].save_to_disk(folder / "gen_batch.dp")
            _dataproto(2, seed=99).save_to_disk(folder / "new_batch.dp")
            (folder / "meta.json").write_text(json.dumps({"global_steps": train, "gen_steps": gen}))
            fh.write(f"{train} {gen}\n")
    # The older V1 form: {step}/tq_batch.pt
    old = torch.load(shape / "3" / "0" / "tq_batch.pt", weights_only=False)
    (shape / "5").mkdir()
    torch.save(old, shape / "5" / "tq_batch.pt")
    return written


def test_import_verl_caches_then_replay_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    cfg = compose(str(tmp_path / "store"))
    written = _write_verl_caches(tmp_path / "verl", cfg, monkeypatch)
    found = [(f.kind, f.namespace, f.step, f.call) for f in scan(tmp_path / "verl")]
    assert found == [("gen_batch", NS, 1, 0), ("gen_batch", NS, 2, 0), ("gen_batch", NS, 4, 0),
                     ("gen_batch", NS, 4, 1), ("tq_batch", NS, 3, 0), ("tq_batch", NS, 3, 1),
                     ("tq_batch", NS, 5, 0)]

    store = tmp_path / "store"
    assert cli(["import-verl", str(tmp_path / "verl"), str(store)]) == 2  # pickles need explicit trust
    assert "--trust-pickle" in capsys.readouterr().err
    assert cli(["import-verl", str(tmp_path / "verl"), str(store), "--dry-run"]) == 0
    assert not store.exists()
    assert cli(["import-verl", str(tmp_path / "verl"), str(store), "--trust-pickle"]) == 0
    assert "7 imported" in capsys.readouterr().out
    assert cli(["import-verl", str(tmp_path / "verl"), str(store), "--trust-pickle"]) == 0
    assert "0 imported, 7 already in the store" in capsys.readouterr().out

    entries = StepStore(str(store), NS, "rollout")
    manifest = json.loads((store / NS / "rollout" / "1" / "verl_agent_loop" / "r0-0000.manifest.json").read_text())
    assert not manifest["pickled"]  # the safe codec holds what verl pickled
    _assert_same(written["gen1"], entries.load(entries.key(1, "verl_agent_loop", "r0", 0)).result)
    _assert_same(written["legacy8"], entries.load(entries.key(4, "verl_agent_loop", "r0", 1)).result)
    tq_entry = entries.load(entries.key(3, "verl_tq", "r0", 1)).result
    assert tq_entry["global_steps"] == 3 and len(tq_entry["keys"]) == 2 * N

    # A run with +skip=rollout_cache replays the imported steps: the workers are never reached.
    from verl.experimental.agent_loop.agent_loop import AgentLoopManager

    skipweave.weave(load_skip_config(job_skip_config(cfg)))
    mgr = AgentLoopManager(cfg, llm_client=None)  # type: ignore[arg-type]
    mgr.agent_loop_workers = [FakeWorker(0)]  # type: ignore[list-item]
    for step in (1, 2):
        batch, gen = train_batch(step)
        out = mgr.generate_sequences(gen)
        assert out.meta_info["skipweave"]["status"] == "hit"
        assert torch.equal(out.batch["old_log_probs"], written[f"gen{step}"].batch["old_log_probs"])
        batch.repeat(repeat_times=N, interleave=True).union(out)  # live uids echoed into verl's own cache
    from tests.integrations.verl.apps import agent_loop_app

    assert agent_loop_app.WORKER_CALLS == []
