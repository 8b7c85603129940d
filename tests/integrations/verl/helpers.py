"""Fakes standing in for what a CPU machine lacks: verl's inference engine behind its agent loop, and the
TransferQueue service of the V1 trainer. verl's own classes, configs and data types are used as they are.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import types
from collections import defaultdict
from typing import Any

import torch

from tests.integrations.verl.apps.agent_loop_app import FakeWorker  # noqa: F401 - re-exported for the tests


def tensordict_rows(fields: Any) -> list[dict[str, Any]]:
    """Split a TensorDict of TQ fields into one plain dict per row (tensors, nested rows, non-tensor items)."""
    n = int(fields.batch_size[0]) if len(fields.batch_size) else 1
    rows: list[dict[str, Any]] = [{} for _ in range(n)]
    for key, value in fields.items():
        if isinstance(value, torch.Tensor):
            items = list(value.unbind()) if value.is_nested else [value[i] for i in range(n)]
        elif type(value).__name__ == "NonTensorData":
            items = [value.data] * n
        else:
            items = list(value.tolist())
        for row, item in zip(rows, items, strict=True):
            row[str(key)] = item
    return rows


class FakeTQ:
    """An in-memory TransferQueue with the four calls verl's V1 trainer and ReplayBuffer make."""

    def __init__(self) -> None:
        self.tags: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
        self.rows: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)

    def install(self, monkeypatch: Any) -> FakeTQ:
        import transfer_queue

        for name in ("kv_batch_put", "kv_batch_get", "kv_list", "kv_clear"):
            monkeypatch.setattr(transfer_queue, name, getattr(self, name))
        return self

    def kv_batch_put(self, keys: list[str], partition_id: str, fields: Any = None, tags: Any = None) -> None:
        rows = tensordict_rows(fields) if fields is not None else [{} for _ in keys]
        for i, key in enumerate(keys):
            self.tags[partition_id].setdefault(key, {}).update(dict(tags[i]) if tags is not None else {})
            self.rows[partition_id].setdefault(key, {}).update(rows[i])

    def kv_batch_get(self, keys: list[str], partition_id: str, select_fields: Any = None) -> Any:
        import verl.utils.tensordict_utils as tu

        rows = [self.rows[partition_id][k] for k in keys]
        columns: dict[str, Any] = {}
        for name in rows[0]:
            values = [r[name] for r in rows]
            if isinstance(values[0], torch.Tensor):
                same = all(v.shape == values[0].shape for v in values)
                columns[name] = torch.stack(values) if same else tu.nested_tensor_from_tensor_list(values)
            else:
                columns[name] = values
        return tu.get_tensordict(columns)

    def kv_list(self, partition_id: str | None = None) -> dict[str, dict[str, dict[str, Any]]]:
        return {pid: {k: dict(t) for k, t in tags.items()} for pid, tags in self.tags.items()
                if partition_id in (None, pid)}

    def kv_clear(self, keys: list[str], partition_id: str) -> None:
        for key in keys:
            self.tags[partition_id].pop(key, None)
            self.rows[partition_id].pop(key, None)


class FakeTQAgentLoop:
    """Stands in for ``AgentLoopManagerTQ``: each prompt's ``n`` trajectories go straight into the fake TQ."""

    def __init__(self, tq: FakeTQ, n: int) -> None:
        self.tq, self.n, self.calls = tq, n, []  # type: ignore[var-annotated]

    def generate_sequences(self, batch: Any) -> None:
        import verl.utils.tensordict_utils as tu

        validate = "validate" in batch.keys() and bool(batch["validate"])
        step = batch["global_steps"]
        partition = "val" if validate else "train"
        uids = [str(u) for u in batch["uid"]]
        self.calls.append({"step": step, "prompts": len(uids), "validate": validate})
        keys, prompts, responses, tags = [], [], [], []
        for uid in uids:
            for session in range(self.n):
                p, r = torch.randint(2, 5, (2,)).tolist()
                keys.append(f"{uid}_{session}_0")
                prompts.append(torch.randint(3, 100, (p,)))
                responses.append(torch.randint(3, 100, (r,)))
                tags.append({"global_steps": step, "seq_len": p + r, "status": "finished"})
        fields = tu.get_tensordict({
            "prompts": tu.nested_tensor_from_tensor_list(prompts),
            "responses": tu.nested_tensor_from_tensor_list(responses),
            "old_log_probs": torch.randn(len(keys), 2).to(torch.bfloat16),
            "raw_prompt": [[{"role": "user", "content": k}] for k in keys],
        })
        self.tq.kv_batch_put(keys=keys, partition_id=partition, fields=fields, tags=tags)
        finished = [{"is_prompt": True, "status": "finished", "global_steps": step} for _ in uids]
        self.tq.kv_batch_put(keys=uids, partition_id=partition, tags=finished)


def trajectory_digest(data: Any) -> list[str]:
    """One hash per trajectory of a TQ batch (its tokens and bf16 log-probs, not its per-run key)."""
    out = []
    for row in tensordict_rows(data):
        h = hashlib.sha256()
        for name in ("prompts", "responses"):
            h.update(row[name].numpy().tobytes())
        h.update(row["old_log_probs"].view(torch.int16).numpy().tobytes())
        out.append(h.hexdigest()[:12])
    return sorted(out)


class FakeAsyncWorker:
    """Stands in for the async rollouter's Ray worker: ``generate_sequences.remote(p).future()`` is a Future."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.generate_sequences = types.SimpleNamespace(remote=self._remote)

    def _remote(self, prompts: Any) -> Any:
        from tensordict import TensorDict
        from verl.protocol import DataProto

        self.calls.append(str(prompts.non_tensor_batch["uid"][0]))
        bsz = len(prompts)
        out = DataProto(batch=TensorDict({"responses": torch.randint(3, 100, (bsz, 3))}, batch_size=bsz),
                        meta_info={"metrics": [{"generate_sequences": 0.1}] * bsz})
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        fut.set_result(out)
        return types.SimpleNamespace(future=lambda: fut)
