"""What the store commands (``ls``, ``verify``, ``gc``, ``show``) share: their dump-dir arguments, the scan with
its messages for people, and output to stdout.

Kept light at import time (every subcommand's module is imported to build the parser): the store is imported
when a command runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

__all__ = ["BAR_MIN_BYTES", "EXIT_OK", "EXIT_USAGE", "add_dump_dir_arguments", "add_json_argument", "emit", "emit_json",
           "misplaced", "output_refusal", "positive_int", "scan_bundle_or_explain", "scan_or_explain", "steps_option"]

EXIT_OK = 0
EXIT_USAGE = 2
"""Exit status of every store command when its dump dir or path cannot be read (or names no entry)."""

BAR_MIN_BYTES = 64 << 20
"""A bundle command reading this many bytes or more shows a progress bar (when bars show at all:
:func:`skipweave.progress.bars_enabled`)."""


def add_dump_dir_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``DUMP_DIR``, ``--calls-per-step`` and ``--allow-pickle`` (shared by ls, verify and gc)."""
    parser.add_argument("dump_dir", metavar="DUMP_DIR",
                        help="the store root (skip.<role>.dump_dir), or a bundle (a .zip file skipweave pack wrote)")
    parser.add_argument(
        "--calls-per-step", type=positive_int, default=None, metavar="N",
        help="calls one shard makes per step (as skip.<role>.calls_per_step); default: learned from closed steps",
    )
    parser.add_argument(
        "--allow-pickle", action="store_true",
        help="judge entries holding pickled data as a run with skip.<role>.allow_pickle=true would "
             "(default: they are 'refused', as a run refuses them)",
    )


def add_json_argument(parser: argparse.ArgumentParser, schema: str) -> None:
    """Add ``--json``: print one JSON document of ``schema`` (e.g. ``skipweave.ls/1``) instead of text."""
    parser.add_argument("--json", action="store_true", help=f"print one JSON document (schema {schema})")


def positive_int(text: str) -> int:
    """Parse a whole number of 1 or more (an ``argparse`` type).

    Raises:
        argparse.ArgumentTypeError: ``text`` is not such a number.
    """
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected 1 or more, got {value}")
    return value


def steps_option(text: str | None) -> Any:
    """``--steps`` as ``skip.<role>.steps`` reads it (a list written as YAML: ``[1,3,8]``): a
    :class:`~skipweave.config.values.StepSet`, or None when not given.

    Raises:
        ConfigError: not a step set (the message says what is allowed).
    """
    import yaml

    from skipweave.config.values import parse_steps

    if text is None:
        return None
    value: Any = text
    if text.strip().startswith("["):
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError:
            value = text  # parse_steps names what is allowed
    return parse_steps("--steps", value)


def output_refusal(output: str, inputs: list[str]) -> str | None:
    """Why ``-o output`` (a file ``export``/``view`` replaces whole, by a rename) must not be written, or None.

    The rename replaces whatever is at ``output``: it must not be one of the command's ``inputs`` (a bundle, a dump
    dir, a verify report) or lie inside one (a manifest, a payload of the store being read), and must not be anything
    but a regular file (a device such as ``/dev/stdout``, a FIFO, a symlink: the rename would put a regular file in
    its place). Real paths are compared, so a symlinked folder or ``..`` does not hide an input.

    Args:
        output: the ``-o`` path as given.
        inputs: the paths the command reads, as given (missing ones are ignored).

    Returns:
        The reason, naming the path (for ``skipweave CMD: ...``), or None when the output may be written.
    """
    folder = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(folder):
        return f"the folder of -o {output!r} ({folder}) does not exist"
    if os.path.islink(output):
        return (f"-o {output!r} is a symlink (to {os.readlink(output)!r}); the output replaces what is at PATH, "
                "so name a regular file (or the link's target)")
    if os.path.isdir(output):
        return f"-o {output!r} is a folder; name the file to write"
    if os.path.exists(output) and not os.path.isfile(output):
        return (f"-o {output!r} exists and is not a regular file (a device, a FIFO, a socket): the output would "
                "replace it; name a regular file")
    real = os.path.realpath(output)
    for source in inputs:
        if not os.path.exists(source):
            continue
        where = os.path.realpath(source)
        if real == where:
            return f"-o {output!r} is the input {source!r}: the output would replace what is being read"
        if os.path.isdir(where) and os.path.commonpath([real, where]) == where:
            return (f"-o {output!r} lies inside the input {source!r}: the output would replace or add a file in "
                    "the store being read; write it elsewhere")
    return None


def scan_or_explain(command: str, args: argparse.Namespace, *, checksums: bool) -> Any:
    """Scan ``args.dump_dir`` (:func:`skipweave.store.scan.scan`); on failure print a message for people to stderr
    and return ``None``.

    Args:
        command: the subcommand's name, for the message.
        args: the parsed arguments of :func:`add_dump_dir_arguments`.
        checksums: check every payload byte (else sizes only).

    Returns:
        The :class:`~skipweave.store.scan.DumpScan`, or ``None`` when the dump dir cannot be read.
    """
    from skipweave.store.bundle.layout import is_bundle_path
    from skipweave.store.scan import scan

    if is_bundle_path(args.dump_dir):
        return scan_bundle_or_explain(command, args, checksums=checksums)[0]
    try:
        return scan(args.dump_dir, checksums=checksums, calls_per_step=args.calls_per_step,
                    allow_pickle=getattr(args, "allow_pickle", False))
    except (FileNotFoundError, NotADirectoryError, PermissionError) as exc:
        print(f"skipweave {command}: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return None


def scan_bundle_or_explain(command: str, args: argparse.Namespace, *, checksums: bool) -> tuple[Any, bool]:
    """Scan the bundle ``args.dump_dir`` names (:func:`skipweave.store.bundle.scan.scan_bundle`), as
    :func:`scan_or_explain` scans a dump dir; on failure print a message for people to stderr.

    Returns:
        ``(the BundleScan or None, refused)``: ``refused`` is True when the file is there but is no bundle skipweave
        reads (damaged, crafted: the message names the member), which ``verify`` reports as a problem (exit 1).
    """
    from skipweave.progress import bars_enabled
    from skipweave.store.bundle.archive import BundleRefused
    from skipweave.store.bundle.scan import scan_bundle

    bar = None
    try:
        if checksums and bars_enabled() and os.path.getsize(args.dump_dir) >= BAR_MIN_BYTES:
            from skipweave.store.format.tensorfile import byte_bar

            bar = byte_bar(os.path.getsize(args.dump_dir), f"skipweave {command}: checking")
        return scan_bundle(args.dump_dir, checksums=checksums, calls_per_step=args.calls_per_step,
                           allow_pickle=getattr(args, "allow_pickle", False),
                           progress=bar.update if bar is not None else None), False
    except (FileNotFoundError, PermissionError, IsADirectoryError) as exc:
        print(f"skipweave {command}: no bundle {args.dump_dir}: {exc.strerror or exc}", file=sys.stderr)
        return None, False
    except BundleRefused as exc:
        print(f"skipweave {command}: {exc}", file=sys.stderr)
        return None, True
    finally:
        if bar is not None:
            bar.close()


def misplaced(command: str, result: Any) -> bool:
    """When ``result`` (a :class:`~skipweave.store.scan.DumpScan`) is empty but entries sit below it at another
    depth, say where to look (stderr).

    Returns:
        True when the message was printed: the caller exits 2, as for any dump dir that cannot be read.
    """
    from skipweave.store.scan import find_dump_dir_hint

    if result.parts or result.leftovers:
        return False
    hint = find_dump_dir_hint(result.dump_dir)
    if hint is None:
        return False
    print(f"skipweave {command}: {result.dump_dir} is not a dump dir, but entries sit below it: "
          f"try `skipweave {command} {hint}`", file=sys.stderr)
    return True


def emit(text: str) -> None:
    """Print ``text`` to stdout; a reader that stops early (``| head``) ends the output quietly."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's final flush must not fail again
        os.close(devnull)


def emit_json(doc: dict[str, Any]) -> None:
    """Print one JSON document (indented) to stdout, as :func:`emit` does."""
    emit(json.dumps(doc, indent=2))
