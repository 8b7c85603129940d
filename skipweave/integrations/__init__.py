"""Integrations: Hydra search-path plugin and callback, Ray worker propagation, non-Hydra launcher."""
