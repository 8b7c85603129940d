"""Configuration layer: schema per role (each key declared once), validation with clear errors, profiles; hosts
add their own keys through config adapters (:mod:`skipweave.config.adapters`)."""

from skipweave.config.errors import ConfigError
from skipweave.config.loader import load_skip_config, to_container
from skipweave.config.parse import parse_role, parse_skip
from skipweave.config.schema import Action, RoleConfig, SkipConfig, StepSet, TargetSpec

__all__ = [
    "Action",
    "ConfigError",
    "RoleConfig",
    "SkipConfig",
    "StepSet",
    "TargetSpec",
    "load_skip_config",
    "parse_role",
    "parse_skip",
    "to_container",
]
