"""TRL integration: TRL's online trainers (``GRPOTrainer``, ``RLOOTrainer``) recorded and replayed by shipped profiles.

What a TRL trainer needs is data, and lives in the profiles (``conf/skip/base/trl.yaml`` and the ``trl_*`` profiles
built on it, see docs/trl.md): the method to hijack (:data:`TARGETS`), the step (``self.state.global_step``), the
evaluation bypass (``not self.model.training``) and the effects a generation leaves on the trainer. Their results are
plain dicts of tensors, numbers and lists, which the codec stores without a host type. What the profiles cannot say
is the range of TRL versions whose private names they use: :data:`INTEGRATION` declares it, and discovery
(:mod:`skipweave.integrations.discovery`) logs one WARNING naming both versions when the installed TRL lies outside
it (``SKIPWEAVE_FORCE_INTEGRATIONS=trl`` says the user checked; docs/trl.md#other-trl-versions).

This module is the integration's declaration (entry point ``trl`` of ``skipweave.integrations``) and imports nothing
else; importing it imports no trl: the targets are woven when TRL's trainer modules are first imported.
"""

from __future__ import annotations

from skipweave.integrations.base import Integration

HOST_PACKAGE = "trl"
"""The distribution (and top-level module) this integration is for."""

SUPPORTED_VERSIONS = ">=1.0,<2"
"""TRL versions whose trainers have the targets and the attributes the profiles' effects name (``self._metrics``,
``self._logs``: TRL 0.x before 0.20 kept the completions table in ``self._textual_logs``)."""

TESTED_VERSION = "1.16.0"
"""The TRL version tests/integrations/trl ran against when the profiles were written."""

TARGETS: dict[str, str] = {
    "GRPOTrainer": "trl.trainer.grpo_trainer.GRPOTrainer._generate_and_score_completions",
    "RLOOTrainer": "trl.trainer.rloo_trainer.RLOOTrainer._generate_and_score_completions",
}
"""Per trainer, the method its profiles record and replay: one call per generation batch (training) and per
evaluation batch, which samples the completions, scores them and returns what the loss is computed from."""

PROFILES: dict[str, tuple[str, ...]] = {
    "GRPOTrainer": ("trl_grpo_cache", "trl_grpo_replay", "trl_grpo_verify"),
    "RLOOTrainer": ("trl_rloo_cache", "trl_rloo_replay", "trl_rloo_verify"),
}
"""Per trainer, the shipped profiles (``conf/skip/<name>.yaml``) that weave its target."""

INTEGRATION = Integration(name="trl", host=HOST_PACKAGE, versions=SUPPORTED_VERSIONS)
"""skipweave's TRL integration: its profiles are shipped with skipweave's own (``conf/skip/trl_*.yaml``) and its
results are plain containers, so what it adds is the supported range, which a TRL outside it is warned against."""

__all__ = ["HOST_PACKAGE", "INTEGRATION", "PROFILES", "SUPPORTED_VERSIONS", "TARGETS", "TESTED_VERSION"]
