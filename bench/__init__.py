"""skipweave's benchmarks: ``python bench/run.py`` (see docs/performance.md)."""
