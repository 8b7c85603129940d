"""Hydra search-path plugin of skipweave (found by Hydra under the ``hydra_plugins`` namespace package)."""
