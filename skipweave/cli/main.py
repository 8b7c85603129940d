"""The ``skipweave`` command: one module per subcommand.

Adding a subcommand: write ``skipweave/cli/<name>.py`` with ``register(subparsers)`` — which adds a
parser and sets ``func`` to a ``(args) -> int`` handler — and list the module in :data:`SUBCOMMANDS`.
Keep module-level imports light: every subcommand's module is imported to build the parser.

The command is one of the entry points that assemble the system: it loads the integrations of the environment
(:func:`skipweave.integrations.discovery.load_integrations`) once its arguments parse, so that every command reads
stores with their host types and ``run --skip`` finds the profiles integrations ship.

Arguments after a lone ``--`` are not parsed; they reach the handler as ``args.command`` (a list,
``None`` when there is no ``--``), e.g. the program that ``skipweave run`` launches.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from collections.abc import Sequence

SUBCOMMANDS: tuple[str, ...] = (
    "skipweave.cli.run",
    "skipweave.cli.ls",
    "skipweave.cli.show",
    "skipweave.cli.verify",
    "skipweave.cli.diff",
    "skipweave.cli.export",
    "skipweave.cli.view",
    "skipweave.cli.gc",
    "skipweave.cli.migrate",
    "skipweave.cli.pack",
    "skipweave.cli.unpack",
    "skipweave.cli.import_verl",
)
"""Modules providing a subcommand each (see the module docstring)."""


def build_parser() -> argparse.ArgumentParser:
    """Return the ``skipweave`` parser with every subcommand of :data:`SUBCOMMANDS` registered."""
    from skipweave.version import __version__

    parser = argparse.ArgumentParser(
        prog="skipweave", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Record and replay the rollouts of RL-for-LLM trainers, with no change to their source.\n\n"
        "In a Hydra app, add +skip=rollout_cache to its command line (a shipped profile, one on\n"
        "SKIPWEAVE_PROFILE_PATH, or several: '+skip=[a,b]'); any other program: skipweave run --skip\n"
        "PROFILE -- python train.py (PROFILE may be a YAML file). The other commands read, check and\n"
        "clean a dump dir.",
    )
    parser.add_argument("--version", action="version", version=f"skipweave {__version__}")
    subparsers = parser.add_subparsers(dest="subcommand", metavar="COMMAND")
    subparsers.required = True
    for name in SUBCOMMANDS:
        importlib.import_module(name).register(subparsers)
    for sub in subparsers.choices.values():  # module docstrings are reST: show them as plain text
        sub.description = plain_text(sub.description)
    return parser


def plain_text(text: str | None) -> str | None:
    """reST markup of a docstring made plain for ``--help``: ````x```` and ``:role:`x``` become ``x``."""
    if text is None:
        return None
    return re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", text).replace("``", "")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``skipweave`` command line; return the exit status."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    command: list[str] | None = None
    if "--" in args_list:
        cut = args_list.index("--")
        args_list, command = args_list[:cut], args_list[cut + 1 :]
    parser = build_parser()
    args = parser.parse_args(args_list)
    args.command = command
    from skipweave.integrations.discovery import load_integrations

    load_integrations()
    status: int = args.func(args)
    return status


if __name__ == "__main__":
    sys.exit(main())
