"""Which devices this process has: a decoded tensor goes back to its recorded device only when it exists here.

A recording made on a GPU node may be replayed on a CPU-only one (a laptop, a CI runner): tensors whose device
is missing are restored on CPU, with one warning per device, rather than failing the replay. Device strings
come from a file, so probing never imports a torch submodule by a name the file chose.
"""

from __future__ import annotations

import logging
import types
from typing import Any

import torch

logger = logging.getLogger(__name__)

_WARNED_DEVICES: set[str] = set()


def device_available(device: Any) -> bool:
    """True if tensors can be placed on ``device`` in this process.

    Args:
        device: a device string read from a tree (untrusted: any value; an invalid one is not available).
    """
    try:
        dev = torch.device(device)
    except Exception:
        return False
    if dev.type == "cpu":
        return True
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            return False
        return dev.index is None or dev.index < torch.cuda.device_count()
    backend = vars(torch).get(dev.type)  # no lazy submodule import for a device string read from a file
    if not isinstance(backend, types.ModuleType):
        return False
    is_available = getattr(backend, "is_available", None)
    if not callable(is_available):
        return False
    try:
        if not is_available():
            return False
        count = getattr(backend, "device_count", None)
        return dev.index is None or not callable(count) or dev.index < count()
    except Exception:
        return False


def to_recorded_device(t: torch.Tensor, device: Any) -> torch.Tensor:
    """``t`` moved to ``device`` when that exists here, else ``t`` itself (a warning is logged once per device).

    Args:
        t: a CPU tensor.
        device: the recorded device string.
    """
    if device == "cpu":
        return t
    if device_available(device):
        return t.to(device)
    if device not in _WARNED_DEVICES:
        _WARNED_DEVICES.add(device)
        logger.warning("recorded on %s, not available here, restored on CPU", device)
    return t


def build_device(recorded: Any) -> str | None:
    """The device to build a host container on for its recorded device: the recorded one when available here,
    else ``"cpu"`` (warning once per device, as for tensors); None for None."""
    if recorded is not None and not device_available(recorded):
        to_recorded_device(torch.empty(0), recorded)  # logs the once-per-device warning
        return "cpu"
    return None if recorded is None else str(recorded)
