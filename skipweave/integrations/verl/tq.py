"""verl's TransferQueue (V1) trainer: rollout split between submitting prompts and sampling trajectories.

In the V1 trainer no call returns the rollout: ``PPOTrainer._add_batch_to_generate`` submits a
step's prompts to the agent loop, whose workers write trajectories into the TransferQueue (TQ), and
``ReplayBuffer.sample`` (``ReplayBufferAsync.sample`` in the async modes) later returns their keys.
So, like verl's ``rollout_tq`` role (``verl.utils.skip.rollout_skip.RolloutTqSkip``):

- **record** — after each ``sample`` of the ``train`` partition at a step not recorded yet, the
  sampled trajectories are read back from TQ (``kv_batch_get``) and recorded with their keys and
  tags. With ``parameter_sync_step > 1`` a step samples that many mini-batches: each is one call of
  the step (call index 0, 1, …), and a step is complete once it holds all of them.
- **replay** — ``_add_batch_to_generate`` at a recorded step still draws the step's prompts from the
  dataloader (``_next_train_batch``, so later steps see the same data), then writes the recorded
  trajectories into TQ under the new prompts' uids (each prompt takes one recorded GRPO group of
  ``rollout.n`` trajectories, cycling when fewer were recorded), marks the prompts finished and does
  not submit them. ``sample`` then runs unchanged and finds them.
- **warm-up** — the async modes submit warm-up batches before the first step
  (``_add_async_warmup_batches``); verl leaves them out whenever its ``rollout_tq`` skip is on, and
  so does :class:`TqWarmupProxy` while its role is enabled, in the recording run and in the replay.

Validation (``sample`` of the ``val`` partition) always runs live. Jagged nested tensors (prompts and
responses in TQ) are recorded as their per-row tensors, so the safe codec holds them without pickle.
The step is the trainer's ``global_steps``: the instance attribute at submit, the ``global_steps``
argument at sample. Restoring RNG state does not apply here: generation runs in other processes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from skipweave import lifecycle, report
from skipweave.store.format.layout import list_steps
from skipweave.store.format.manifest import seconds_of
from skipweave.store.step_store import StepStore
from skipweave.weaving.calls import Call
from skipweave.weaving.proxy import SkipProxy, shard_label
from skipweave.weaving.record import Delivery, Recorder

logger = logging.getLogger(__name__)

TQ_TARGET = "verl_tq"
"""Store target name under which every V1 proxy of a role keeps the sampled trajectories."""

# ---------------------------------------------------------------------------------------------- payload


def flatten_fields(data: Any) -> dict[str, Any]:
    """Return TQ trajectory fields (a ``TensorDict``) as plain columns the safe codec holds.

    Columns: ``{"kind": "tensor", "value": t}``, ``{"kind": "nested", "ragged_idx": i, "items": [t, …]}``
    for jagged nested tensors, ``{"kind": "list", "items": [...]}`` for non-tensor stacks and
    ``{"kind": "data", "value": v}`` for batch-wide non-tensor data.
    """
    import torch

    columns: dict[str, Any] = {}
    for key, value in data.items():
        name = str(key)
        if isinstance(value, torch.Tensor) and value.is_nested:
            ragged = int(getattr(value, "_ragged_idx", value.dim() - 1))
            columns[name] = {"kind": "nested", "ragged_idx": ragged, "items": [t.clone() for t in value.unbind()]}
        elif isinstance(value, torch.Tensor):
            columns[name] = {"kind": "tensor", "value": value}
        elif type(value).__name__ == "NonTensorData":
            columns[name] = {"kind": "data", "value": value.data}
        elif hasattr(value, "tolist"):
            columns[name] = {"kind": "list", "items": list(value.tolist())}
        else:
            columns[name] = {"kind": "list", "items": list(value)}
    return {"batch_size": [int(d) for d in data.batch_size], "columns": columns}


def unflatten_fields(flat: Mapping[str, Any]) -> Any:
    """Rebuild the ``TensorDict`` :func:`flatten_fields` took apart (verl's own helpers build it)."""
    import verl.utils.tensordict_utils as tu

    tensors: dict[str, Any] = {}
    data: dict[str, Any] = {}
    for name, col in flat["columns"].items():
        kind = col["kind"]
        if kind == "tensor":
            tensors[name] = col["value"]
        elif kind == "nested":
            tensors[name] = tu.nested_tensor_from_tensor_list(list(col["items"]), ragged_idx=col["ragged_idx"])
        elif kind == "list":
            tensors[name] = list(col["items"])
        else:
            data[name] = col["value"]
    return tu.get_tensordict(tensors, non_tensor_dict=data)


def inject(payloads: list[Mapping[str, Any]], new_uids: list[str], *, n: int, step: int,
           partition_id: str = "train") -> int:
    """Write recorded trajectories into TQ for the new prompts; return the number written.

    Mirrors verl's ``RolloutTqSkip.load_dump_data``: the recorded trajectories (all mini-batches of
    the step) are grouped by their prompt uid (the key's first ``_`` part); prompt ``i`` takes group
    ``i mod groups`` and ``n`` trajectories from it (cycling inside a group that has fewer), under keys
    ``{uid}_{session}_0`` and tags re-stamped with ``step``; then the prompts are marked finished.
    """
    import transfer_queue as tq
    import verl.utils.tensordict_utils as tu

    parts = [unflatten_fields(p["fields"]) for p in payloads]
    data = parts[0] if len(parts) == 1 else tu.concat_tensordict(parts)
    old_keys = [k for p in payloads for k in p["keys"]]
    old_tags = [t for p in payloads for t in p["tags"]]
    groups: dict[str, list[int]] = {}
    for idx, key in enumerate(old_keys):
        groups.setdefault(str(key).split("_")[0], []).append(idx)
    ordered = list(groups.values())
    if not ordered:
        raise ValueError(f"the recording of step {step} holds no trajectory")
    new_keys, new_tags, rows = [], [], []
    for i, uid in enumerate(new_uids):
        group = ordered[i % len(ordered)]
        for session in range(n):
            row = group[session % len(group)]
            rows.append(row)
            new_keys.append(f"{uid}_{session}_0")
            tag = dict(old_tags[row])
            tag.update(global_steps=step, min_global_steps=step, max_global_steps=step)
            tag.pop("is_prompt", None)
            new_tags.append(tag)
    fields = tu.index_select_tensor_dict(data, rows)
    tq.kv_batch_put(keys=new_keys, fields=fields, tags=new_tags, partition_id=partition_id)
    finished = [{"is_prompt": True, "status": "finished", "global_steps": step} for _ in new_uids]
    tq.kv_batch_put(keys=list(new_uids), partition_id=partition_id, tags=finished)
    return len(new_keys)


# ---------------------------------------------------------------------------------------------- proxies


class _TqProxy(SkipProxy):
    """Shared decisions of the V1 proxies: which recorded step serves a step, per parameter-sync count."""

    def _tq_store(self, calls: int) -> StepStore:
        """The role's store (the weaver's), told that a step of the V1 rollout holds ``calls`` entries: the trainer's
        ``parameter_sync_step``, known only at the call."""
        self.store.expect_calls(TQ_TARGET, max(1, calls))
        return self.store

    def served_step(self, step: int, calls: int) -> int | None:
        """The recorded step that serves ``step`` (all ``calls`` mini-batches present), else ``None``."""
        store = self._tq_store(calls)
        shard = shard_label(self.role.shard)
        complete = []
        for s in list_steps(store.dump_dir, store.namespace, store.role):
            # Another step this process still writes counts once committed, when it may serve this one (a repeat
            # action); this step's own writes (its earlier mini-batches) are never waited for: what this process
            # records of a step never serves that step, and a wait would put the write back on the host's path.
            if s != step and not self.action.own_step_only(False):
                store.wait_pending(s, TQ_TARGET, shard)
            if store.part_info(s, TQ_TARGET, shard).contiguous >= calls:
                complete.append(s)
        return self.action.serving_step(step, complete)


def _psync_of_trainer(trainer: Any) -> int:
    value = getattr(trainer, "parameter_sync_step", None)
    return int(value) if isinstance(value, int) and value > 0 else 1


def _psync_of_buffer(buffer: Any) -> int:
    cfg = getattr(buffer, "trainer_config", None)
    try:
        value = cfg.get("parameter_sync_step", 1) if cfg is not None else 1
        return max(1, int(value))
    except (AttributeError, TypeError, ValueError):
        return 1


class TqSubmitProxy(_TqProxy):
    """``PPOTrainer._add_batch_to_generate``: at a recorded step, inject the recording instead of submitting."""

    def __call__(self, wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not self.active:
            return wrapped(*args, **kwargs)
        step = getattr(instance, "global_steps", None)
        if not isinstance(step, int) or step not in self.steps:
            return self.live_bypass(wrapped, args, kwargs, step if isinstance(step, int) else None)
        calls = _psync_of_trainer(instance)
        served = self.served_step(step, calls)
        if served is None:
            return wrapped(*args, **kwargs)  # the sample proxy records what this step samples
        t0 = time.perf_counter()
        store, shard = self._tq_store(calls), shard_label(self.role.shard)
        try:
            loaded = [store.load(store.key(served, TQ_TARGET, shard, i)) for i in range(calls)]
        except Exception as exc:  # noqa: BLE001 - unreadable recording: generate live instead
            logger.warning("skipweave: V1 step %d: the recording of step %d cannot be read (%s: %s); generating "
                           "live", step, served, type(exc).__name__, exc)
            return wrapped(*args, **kwargs)
        batch = instance._next_train_batch()  # keep the dataloader where a live step leaves it
        n = int(instance.config.actor_rollout_ref.rollout.n)
        written = inject([x.result for x in loaded], [str(u) for u in batch["uid"]], n=n, step=step)
        report.event(report.HIT, role=self.role.role, target=self.target.name, step=step, served=served,
                     nbytes=sum(x.bytes for x in loaded), seconds=time.perf_counter() - t0,
                     saved=sum(seconds_of(x.manifest) for x in loaded))
        logger.info("skipweave: V1 step %d: %d recorded trajectories of step %d injected for %d prompts",
                    step, written, served, len(batch["uid"]))
        return None


def read_back(result: Any, d: Call) -> dict[str, Any]:
    """What a V1 record keeps of one ``sample`` (``result``: its ``(KVBatchMeta, metrics)`` or the meta alone, ``d``:
    the call, whose step is the trainer's): the sampled trajectories read back from TQ (the host clears them once
    trained on) as plain columns, with their keys and tags. The :class:`~skipweave.weaving.record.Delivery` of
    :class:`TqSampleProxy`.

    Raises:
        Exception: whatever TQ or the payload's conversion raises (a failed record: counted and said once).
    """
    import transfer_queue as tq

    meta = result[0] if isinstance(result, tuple) else result
    data = tq.kv_batch_get(keys=meta.keys, partition_id=meta.partition_id)
    return {"fields": flatten_fields(data), "keys": [str(k) for k in meta.keys],
            "tags": [dict(t) for t in meta.tags], "global_steps": d.step}


TQ_DELIVERY = Delivery(store_target=TQ_TARGET, recorded=read_back, host_state=False)
"""How a ``sample``'s result reaches the store: read back from TQ, under :data:`TQ_TARGET`; no RNG state (generation
runs in other processes) and no declared effects (the role's belong to its rollout target)."""


class TqSampleProxy(_TqProxy):
    """``ReplayBuffer.sample`` / ``ReplayBufferAsync.sample``: record each train mini-batch of a new step.

    The role's step source and bypass are its rollout target's, so the proxy reads the step (``global_steps``) and
    the partition itself; a recorded step is served by :class:`TqSubmitProxy`'s injection, so ``sample`` always runs
    live. What it records goes through the generic :class:`~skipweave.weaving.record.Recorder`, with the
    :data:`TQ_DELIVERY` adapter (background write, failures, counters as every record).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tq_recorder = Recorder(self.context, TQ_DELIVERY)

    def __call__(self, wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not self.active:
            return wrapped(*args, **kwargs)
        step = kwargs.get("global_steps", args[0] if args else None)
        partition = kwargs.get("partition_id", args[1] if len(args) > 1 else "train")
        if partition != "train" or not isinstance(step, int) or step not in self.steps:
            return self.live_bypass(wrapped, args, kwargs, step if partition == "train" else None)
        calls = _psync_of_buffer(instance)
        t0 = time.perf_counter()
        result = wrapped(*args, **kwargs)
        if self.served_step(step, calls) is not None:
            return result  # a replayed step: these trajectories came from the recording
        self._record(result, step, calls, time.perf_counter() - t0)
        return result

    def _record(self, result: Any, step: int, calls: int, seconds: float) -> None:
        """Record the trajectories one ``sample`` returned as the step's next call (its mini-batch): read back from TQ
        here, written by the background writer when it runs behind the host (as every record, see
        :mod:`skipweave.store.write_behind`), else here."""
        work = lifecycle.Work()
        if not work.enter():  # the process exits: no work of ours may still run in torch (see lifecycle)
            logger.warning("skipweave: V1 step %d: a mini-batch sampled while the process exits is not recorded",
                           step)
            return
        try:
            store, shard = self._tq_store(calls), shard_label(self.role.shard)
            d = Call(step, self.ledger.take_index(step, shard), shard, None)
            d.work = work
            store.prepare_part(step, TQ_TARGET, shard)
            self.tq_recorder.after_live(result, d, seconds)
        finally:
            work.leave()


class TqWarmupProxy(SkipProxy):
    """``PPOTrainer._add_async_warmup_batches``: left out while the role is enabled, as verl does."""

    def __call__(self, wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not self.active:
            return wrapped(*args, **kwargs)
        logger.info("skipweave: async warm-up batches left out while role %s records/replays the V1 rollout "
                    "(verl does the same with skip.rollout_tq.enable)", self.role.role)
        return None
