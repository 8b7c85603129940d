"""``skipweave unpack FILE DUMP_DIR [--json]``: a bundle's entries into a dump dir.

The bundle is judged as untrusted input and every member checked (sizes, checksums, the checksum of the whole) before
anything is written; a bundle that fails is refused, naming the member, and nothing is written. Then each entry is
committed as a run commits one (payload files, then its manifest, each through a temporary name, synced, renamed),
under its part's lock, never outside ``DUMP_DIR``. A part already there byte for byte is skipped; a part of which
``DUMP_DIR`` holds anything else is refused (unpack never replaces what is there). Exits 0 when done, 1 when the
bundle was refused or a part conflicts, 2 when the bundle cannot be found. See docs/cli.md (Bundles).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from skipweave.cli.common import BAR_MIN_BYTES, EXIT_USAGE, add_json_argument, emit, emit_json
from skipweave.cli.format import human_bytes, plural

SCHEMA = "skipweave.unpack/1"
EXIT_OK, EXIT_REFUSED = 0, 1


def register(subparsers: Any) -> None:
    """Add the ``unpack`` subcommand to ``subparsers``."""
    parser = subparsers.add_parser(
        "unpack", help="write a bundle's entries into a dump dir (never over different ones)", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundle", metavar="FILE", help="the bundle (.zip) skipweave pack wrote")
    parser.add_argument("dump_dir", metavar="DUMP_DIR", help="the store root to write into (made when missing)")
    add_json_argument(parser, SCHEMA)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Unpack; return 0, 1 or 2 (see the module docstring)."""
    import os

    from skipweave.progress import bars_enabled
    from skipweave.store.bundle.archive import BundleRefused
    from skipweave.store.bundle.unpack import UnpackConflict, unpack
    from skipweave.store.errors import UnsafePath
    from skipweave.store.format.tensorfile import byte_bar

    if os.path.lexists(args.dump_dir) and not os.path.isdir(args.dump_dir):
        print(f"skipweave unpack: {args.dump_dir} is no folder (a file of that name is there): unpack into a dump dir "
              "that exists or a path where none is", file=sys.stderr)
        return EXIT_USAGE
    bar = None
    try:
        size = os.path.getsize(args.bundle)
        if bars_enabled() and size >= BAR_MIN_BYTES:
            bar = byte_bar(size, "skipweave unpack: verifying")
        result = unpack(args.bundle, args.dump_dir, progress=bar.update if bar is not None else None)
    except (FileNotFoundError, IsADirectoryError) as exc:
        print(f"skipweave unpack: no bundle {args.bundle}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    except (BundleRefused, UnpackConflict, UnsafePath) as exc:
        print(f"skipweave unpack: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except OSError as exc:  # the dump dir cannot be written (permissions, a full disk): what was written is whole
        print(f"skipweave unpack: writing into {args.dump_dir} failed: {exc}; the parts written before it are whole, "
              "the others absent", file=sys.stderr)
        return EXIT_USAGE
    finally:
        if bar is not None:
            bar.close()
    if args.json:
        emit_json({"schema": SCHEMA, "bundle": args.bundle, "dump_dir": args.dump_dir, "written": result.written,
                   "present": result.present, "bytes": result.bytes, "seconds": round(result.seconds, 3)})
    else:
        lines = [f"unpacked {plural(len(result.written), 'part')} of {args.bundle} into {args.dump_dir} "
                 f"({human_bytes(result.bytes)}, {result.seconds:.2f} s)"]
        if result.present:
            lines.append(f"{plural(len(result.present), 'part')} already there, byte for byte: left as they are")
        emit("\n".join(lines))
    return EXIT_OK
