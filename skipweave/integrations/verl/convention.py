"""verl's convention: where a ``DataProto`` batch carries its call's step, validation flag and per-run ids.

A role naming it (``skip.<role>.convention: verl``; verl's profiles in ``conf/skip/`` set it, and so do verl's config
adapters for the roles of a verl app and the role its legacy keys fill) takes these for the keys it leaves unset (see
:mod:`skipweave.config.conventions`):

- ``step.path: meta_info.global_steps``: with the default ``step.source: auto``, the step of a call is
  ``meta_info["global_steps"]`` of its first argument when the batch has it (verl's trainer sets it), else
  :func:`skipweave.set_step`'s, else the call counter;
- ``bypass.paths: [meta_info.validate]``: a batch whose ``meta_info["validate"]`` is true is a validation call, which
  runs live (and is recorded apart with ``record_validation``);
- ``fingerprint.ignore: ['*.non_tensor_batch.uid', '*.meta_info.timing']``: verl draws a batch's ``uid`` anew in every
  run, and its timings are no input.

These were skipweave's defaults for every role before they moved here (a trainer of one's own saw verl's keys in its
resolved config). The verl integration registers :data:`VERL` when it is loaded, also where verl is not installed
(trainers of their own copy the ``DataProto`` shape, as the tiny_grpo example does); this module imports no verl.
"""

from __future__ import annotations

from skipweave.config.conventions import Convention

NAME = "verl"
"""What ``skip.<role>.convention`` names."""

VERL = Convention(
    NAME,
    {
        "step": {"path": "meta_info.global_steps"},
        "bypass": {"paths": ["meta_info.validate"]},
        "fingerprint": {"ignore": ["*.non_tensor_batch.uid", "*.meta_info.timing"]},
    },
    about="verl's DataProto batches (meta_info.global_steps, meta_info.validate, non_tensor_batch.uid)",
)
"""verl's convention (entry ``conventions`` of :data:`skipweave.integrations.verl.INTEGRATION`)."""

__all__ = ["NAME", "VERL"]
