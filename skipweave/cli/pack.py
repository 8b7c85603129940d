"""``skipweave pack DUMP_DIR -o FILE [--steps STEPS] [--role ROLE] [--namespace NS] [--json]``: complete entries into
one bundle file.

Writes a zip archive (members stored uncompressed, so a run reads them in place) holding every selected part that a
run would serve, whole: each entry's manifest and payload files, the part's state, and a bundle manifest
(``skipweave-bundle.json``: what is inside, sizes, checksums, skipweave and format versions, what was left out and
why). ``unzip -l FILE`` lists it; ``skipweave ls/show/verify/diff FILE`` read it; ``skip.<role>.dump_dir=FILE``
replays from it; ``skipweave unpack FILE DUMP_DIR`` writes it into a dump dir. Incomplete, corrupt and foreign
parts are left out with a note. Exits 0 when the bundle was written, 1 when nothing selected could be packed (or a
file failed its checksum while copied), 2 when the dump dir cannot be read. See docs/cli.md (Bundles).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from skipweave.cli.common import BAR_MIN_BYTES, EXIT_USAGE, add_json_argument, emit, emit_json
from skipweave.cli.format import human_bytes, plural

SCHEMA = "skipweave.pack/1"
EXIT_OK, EXIT_NOTHING = 0, 1


def register(subparsers: Any) -> None:
    """Add the ``pack`` subcommand to ``subparsers``."""
    parser = subparsers.add_parser(
        "pack", help="write the complete entries of a dump dir into one bundle file (.zip)", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dump_dir", metavar="DUMP_DIR", help="the store root (skip.<role>.dump_dir)")
    parser.add_argument("-o", "--output", required=True, metavar="FILE",
                        help="the bundle to write (a name ending in .zip; replaced only once the new one is whole)")
    parser.add_argument("--steps", default=None, metavar="STEPS",
                        help="only these steps, as skip.<role>.steps writes them (e.g. 1-5, '[1,3,8]')")
    parser.add_argument("--role", action="append", default=None, metavar="ROLE", help="only this role (repeatable)")
    parser.add_argument("--namespace", action="append", default=None, metavar="NS",
                        help="only this namespace (repeatable)")
    add_json_argument(parser, SCHEMA)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Pack; return 0, 1 or 2 (see the module docstring)."""
    from skipweave.cli.common import steps_option
    from skipweave.config.errors import ConfigError
    from skipweave.progress import bars_enabled
    from skipweave.store.bundle.layout import BUNDLE_SUFFIX, is_bundle_path
    from skipweave.store.bundle.pack import PackError, pack
    from skipweave.store.format.tensorfile import byte_bar

    if not is_bundle_path(args.output):
        print(f"skipweave pack: -o {args.output}: a bundle's name ends with {BUNDLE_SUFFIX} (what tells a run's "
              "dump_dir it names a bundle)", file=sys.stderr)
        return EXIT_USAGE
    try:
        steps = steps_option(args.steps)
    except ConfigError as exc:
        print(f"skipweave pack: {exc}", file=sys.stderr)
        return EXIT_USAGE
    bars: list[Any] = []

    def progress(total: int, members: int) -> Any:
        if not bars_enabled() or total < BAR_MIN_BYTES:
            return None
        bars.append(byte_bar(total, f"skipweave pack: {members} files"))
        return bars[-1].update

    try:
        result = pack(args.dump_dir, args.output, namespaces=args.namespace, roles=args.role, steps=steps,
                      progress=progress)
    except (FileNotFoundError, NotADirectoryError, PermissionError) as exc:
        print(f"skipweave pack: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return EXIT_USAGE
    except PackError as exc:
        print(f"skipweave pack: {exc}", file=sys.stderr)
        return EXIT_NOTHING
    finally:
        for bar in bars:
            bar.close()
    if args.json:
        emit_json({"schema": SCHEMA, "bundle": result.path, "bytes": result.bytes, "parts": result.parts,
                   "entries": result.entries, "members": result.members, "left_out": result.left_out,
                   "seconds": round(result.seconds, 3)})
    else:
        lines = [f"packed {plural(result.entries, 'entry', 'entries')} in {plural(len(result.parts), 'part')} of "
                 f"{args.dump_dir} into {result.path} ({human_bytes(result.bytes)}, {result.members} members, "
                 f"{result.seconds:.2f} s)"]
        for left in result.left_out:
            lines.append(f"left out   {left['namespace']}/{left['role']} {left['target']} step {left['step']} shard "
                         f"{left['shard']}: {left['reason']}")
        emit("\n".join(lines))
    return EXIT_OK
