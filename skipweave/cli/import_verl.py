"""``skipweave import-verl VERL_DUMP STORE --trust-pickle``: import rollout caches verl itself wrote.

Reads verl's ``{dump_dir}/{exp}_{proj}/GBS{gbs}_N{n}_in{p}_out{r}/`` folders (``{step}/gen_batch.dp``,
the legacy ``genstep_000001/`` form, and the V1 trainer's ``tq_batch.pt``) and records each cached
call into the skipweave store STORE with the safe codec, under the namespace a verl run derives, so
``+skip=rollout_cache skip.rollout.dump_dir=STORE`` replays them. verl's files are pickles: nothing is
loaded without ``--trust-pickle``; ``--dry-run`` lists what would be imported and loads nothing.
See docs/verl.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

EXIT_OK, EXIT_USAGE = 0, 2


def register(subparsers: Any) -> None:
    """Add the ``import-verl`` subcommand to ``subparsers``."""
    parser = subparsers.add_parser(
        "import-verl", help="import rollout caches written by verl's own SkipManager", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("verl_dump", metavar="VERL_DUMP", help="verl's skip.<role>.dump_dir (or a folder below it)")
    parser.add_argument("store", metavar="STORE", help="the skipweave store root (skip.<role>.dump_dir)")
    parser.add_argument("--trust-pickle", action="store_true",
                        help="allow loading verl's pickled .dp/.pt files (they can run arbitrary code)")
    parser.add_argument("--role", default="rollout",
                        help="skipweave role to file the entries under (async_rollout for the async rollouter)")
    parser.add_argument("--target", default=None, help="target name for gen_batch.dp entries (default: the "
                        "profile's, verl_agent_loop or verl_fully_async)")
    parser.add_argument("--namespace", default=None, help="file everything under this namespace instead of "
                        "the one derived from verl's folder names")
    parser.add_argument("--overwrite", action="store_true", help="replace entries already in the store")
    parser.add_argument("--dry-run", action="store_true", help="list what would be imported; load nothing")
    parser.add_argument("--json", action="store_true", help="print a JSON summary")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Import (or list); return 0, or 2 when the dump cannot be read or trust was not given."""
    from skipweave.config.errors import ConfigError
    from skipweave.integrations.verl.importer import TrustRequired, import_verl

    try:
        report = import_verl(args.verl_dump, args.store, trust_pickle=args.trust_pickle, role=args.role,
                             target=args.target, namespace=args.namespace, dry_run=args.dry_run,
                             overwrite=args.overwrite)
    except (TrustRequired, FileNotFoundError, NotADirectoryError, ConfigError) as exc:
        print(f"skipweave import-verl: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
        return EXIT_OK
    for f in report.found:
        print(f"{f.namespace}/{args.role} step {f.step} call {f.call}  {f.kind}  {f.path}")
    if not report.found:
        print(f"no verl caches found under {args.verl_dump}")
    elif args.dry_run:
        print(f"{len(report.found)} cached call(s) found; nothing imported (--dry-run)")
    else:
        print(f"{report.imported} imported, {report.skipped} already in the store, {report.bytes} bytes written "
              f"to {args.store}")
    return EXIT_OK
