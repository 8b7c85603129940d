"""Configuration layer: schema per role, validation with clear errors, legacy-key remap."""

from skipweave.config.errors import ConfigError
from skipweave.config.loader import load_skip_config, to_container
from skipweave.config.schema import (
    Action,
    RoleConfig,
    SkipConfig,
    StepSet,
    TargetSpec,
    parse_role,
    parse_skip,
)

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
