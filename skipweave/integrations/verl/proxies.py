"""Proxies for verl's rollout entry points (named by the profiles' ``targets.<name>.proxy``).

Each is the generic :class:`~skipweave.weaving.proxy.SkipProxy` plus what verl needs of a replay:

- :class:`AgentLoopProxy` — ``AgentLoopManager.generate_sequences`` (PPO trainer). A replayed batch
  gets the live batch's per-run random ids (``non_tensor_batch["uid"]``, a fresh ``uuid4`` per prompt
  each run): the trainer ``union``-s its own batch with the output, and verl's ``union`` refuses two
  different ``uid`` arrays. ``meta_info["timing"]`` is always present (the trainer pops it).
- :class:`AsyncSampleProxy` — ``FullyAsyncAgentLoopManager.generate_sequences_single`` (fully-async
  rollouter). Its step is the feed index in the sample id ``uid_sample_<epoch>_<index>`` verl puts
  into ``non_tensor_batch["uid"]`` (verl's ``AsyncRolloutSkip.extract_step``), not a trainer step:
  samples are generated concurrently, so neither a counter nor the trainer's step would do.

All of them bypass validation calls: ``meta_info["validate"]`` (the role's bypass) and the
``validate`` non-tensor entry of a ``TensorDict`` input (verl's V1 path).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from typing import Any

from skipweave.config.schema import StepSourceKind
from skipweave.integrations.tensordict.hosts import is_tensordict
from skipweave.policy.steps import StepError, StepSource
from skipweave.weaving.proxy import SkipProxy

logger = logging.getLogger(__name__)

ECHO_KEYS: tuple[str, ...] = ("uid",)
"""``non_tensor_batch`` entries taken from the live input on replay (verl's per-run random ids)."""

SAMPLE_ID = re.compile(r"^(?:uid_)?sample_(\d+)_(\d+)$")
"""verl's async sample id, ``sample_<epoch>_<feed index>`` with an optional ``uid_`` prefix."""


def prompts_of(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    """Return the batch a verl rollout call received (``prompts=`` or the first argument), or ``None``."""
    if "prompts" in kwargs:
        return kwargs["prompts"]
    return args[0] if args else None


def is_v1_validation(batch: Any) -> bool:
    """True when ``batch`` is a ``TensorDict`` carrying verl V1's non-tensor ``validate`` flag."""
    if not is_tensordict(batch):
        return False
    try:
        return "validate" in batch.keys() and bool(batch["validate"])
    except Exception:  # noqa: BLE001 - an odd value under that key is not a validation flag
        return False


def echo_non_tensor(live: Any, result: Any, keys: tuple[str, ...] = ECHO_KEYS) -> list[str]:
    """Copy ``non_tensor_batch[key]`` of the live input into ``result`` for each key both hold.

    Only keys the recorded output carries are replaced (verl's agent loop copies its input's
    non-tensor entries into its output), and only when the lengths agree.

    Returns:
        The keys replaced.
    """
    src = getattr(live, "non_tensor_batch", None)
    dst = getattr(result, "non_tensor_batch", None)
    if not isinstance(src, dict) or not isinstance(dst, dict):
        return []
    done = []
    for key in keys:
        if key not in src or key not in dst:
            continue
        if len(src[key]) != len(dst[key]):
            logger.warning("skipweave: replayed batch has %d '%s' values, the live one %d; kept the recorded ones",
                           len(dst[key]), key, len(src[key]))
            continue
        dst[key] = src[key].copy()
        done.append(key)
    return done


class VerlProxy(SkipProxy):
    """Base of the verl proxies: V1 validation bypass and the echo of per-run ids on replay."""

    echo_keys: tuple[str, ...] = ECHO_KEYS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        role_bypass: Callable[[tuple[Any, ...], Mapping[str, Any]], bool] = self.bypass

        def bypass(call_args: tuple[Any, ...], call_kwargs: Mapping[str, Any]) -> bool:
            return role_bypass(call_args, call_kwargs) or is_v1_validation(prompts_of(call_args, call_kwargs))

        self.bypass = bypass

    def on_replay(self, result: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        """Echo the live per-run ids into the replayed batch."""
        echo_non_tensor(prompts_of(args, kwargs), result, self.echo_keys)
        return result


class AgentLoopProxy(VerlProxy):
    """``AgentLoopManager.generate_sequences``: echo ``uid``; ``meta_info["timing"]`` always present."""

    def on_replay(self, result: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        """Echo the live ids and make sure the ``timing`` the trainer reads exists."""
        result = super().on_replay(result, args, kwargs)
        meta = getattr(result, "meta_info", None)
        if isinstance(meta, dict) and not isinstance(meta.get("timing"), dict):
            meta["timing"] = {}
        return result


def sample_step(batch: Any) -> int | None:
    """Return the feed index of verl's async sample id in ``batch.non_tensor_batch["uid"][0]``, if any."""
    nt = getattr(batch, "non_tensor_batch", None)
    uid = nt.get("uid") if isinstance(nt, dict) else None
    if uid is None or len(uid) == 0:
        return None
    match = SAMPLE_ID.match(str(uid[0]))
    return int(match.group(2)) if match else None


class _SampleIdStep(StepSource):
    """Step source of the async rollouter: the sample id's feed index, else the role's auto source."""

    def step_for(self, instance: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> int:
        step = sample_step(prompts_of(args, kwargs))
        if step is not None:
            return step
        if _has_uid(prompts_of(args, kwargs)):
            raise StepError("verl async rollout: non_tensor_batch['uid'][0] is not a sample id "
                            "'uid_sample_<epoch>_<index>'; set skip.<role>.step to say where the step is")
        return super().step_for(instance, args, kwargs)


def _has_uid(batch: Any) -> bool:
    nt = getattr(batch, "non_tensor_batch", None)
    return isinstance(nt, dict) and "uid" in nt


class AsyncSampleProxy(VerlProxy):
    """``FullyAsyncAgentLoopManager.generate_sequences_single``: one sample per call, step = feed index.

    The role's ``step`` settings win when set; with the default (``auto``) the step is read from the
    sample id, as verl's ``AsyncRolloutSkip`` reads it.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.role.step.source is StepSourceKind.AUTO:
            self.step_source = _SampleIdStep(self.role.step)
