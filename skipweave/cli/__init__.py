"""The ``skipweave`` command line (entry point ``skipweave.cli.main:main``)."""
