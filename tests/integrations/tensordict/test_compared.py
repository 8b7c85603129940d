"""The tensordict integration's host types in a comparison: what verify and ``skipweave diff`` compare of a
``TensorDict`` (its entries, and its batch size beside them) is the host type's to say
(:attr:`skipweave.store.hosts.HostType.compared`), not :mod:`skipweave.verify.compare`'s."""

from __future__ import annotations

from typing import Any

import torch

from skipweave.store.hosts import HOST_TYPES
from skipweave.verify.compare import compare


def test_a_tensordicts_batch_size_is_compared_through_its_host_type() -> None:
    """The batch size is the tensordict integration's knowledge: with the integration off, a TensorDict is compared
    as the Mapping it is (its keys), and its batch size is no field."""
    from tensordict import TensorDict

    from skipweave.integrations import discovery
    from skipweave.integrations.tensordict.hosts import TENSORDICT

    rec = TensorDict({"x": torch.zeros(2)}, batch_size=[2])
    live = TensorDict({"x": torch.zeros(2)}, batch_size=[])
    assert TENSORDICT.compared is not None and TENSORDICT.compared(rec).shape == torch.Size([2])
    discovery.unload_integrations()
    try:
        discovery.load_integrations({"SKIPWEAVE_DISABLED_INTEGRATIONS": "tensordict"})
        assert TENSORDICT not in HOST_TYPES and compare(rec, live).status == "identical"
    finally:
        discovery.unload_integrations()
        discovery.load_integrations()
    assert TENSORDICT in HOST_TYPES and compare(rec, live).first.kind == "shape"  # type: ignore[union-attr]


def test_views_of_recorded_tensordicts_compare_as_the_live_ones_do() -> None:
    """``skipweave diff`` compares views of two recordings: a view's kind names its host type, whose ``compared``
    gives its entries and its recorded batch size, so a change of batch size is said as the live comparison says it."""
    from tensordict import TensorDict

    from skipweave.store.format import codec
    from skipweave.store.format.codec.view import decode_view

    def view(td: Any) -> Any:
        enc = codec.encode({"batch": td})
        return decode_view(enc.tree, enc.tensors)

    rec = TensorDict({"x": torch.zeros(2), "ids": torch.tensor([1, 2])}, batch_size=[2])
    resized = TensorDict({"x": torch.zeros(2), "ids": torch.tensor([1, 2])}, batch_size=[])
    changed = TensorDict({"x": torch.zeros(2), "ids": torch.tensor([1, 3])}, batch_size=[2])
    for pair in ((rec, resized), (rec, changed), (rec, rec.clone())):
        live, recorded = compare({"batch": pair[0]}, {"batch": pair[1]}), compare(view(pair[0]), view(pair[1]))
        assert [(d.path, d.kind) for d in recorded.divergences] == [(d.path, d.kind) for d in live.divergences]
        assert recorded.status == live.status
    assert compare(view(rec), view(resized)).first.kind == "shape"  # type: ignore[union-attr]
