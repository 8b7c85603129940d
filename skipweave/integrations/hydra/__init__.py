"""Hydra integration: the callback that weaves a selected profile when each job starts.

The search-path plugin that makes ``+skip=<profile>`` composable lives apart, in
``hydra_plugins/skipweave_searchpath`` (Hydra's namespace package for plugins).
"""
