"""``skipweave migrate DUMP_DIR [--yes] [--json]``: rewrite the manifests and group files of an older format version
to the current one.

Never needed to replay: this skipweave reads every format version it ever wrote. A dry run unless ``--yes``: the
listing says, per namespace and role, how many entries (and group files of small entries) would be rewritten.
With ``--yes`` each manifest or group file is rewritten on its own, under the lock its part's writers take,
through a temporary file, fsync and rename: a kill leaves each file old or migrated, never neither, and a rerun
migrates the rest. Payload files are never touched, so a run replaying meanwhile is not disturbed.

Not rewritten: files of the current version, files of a version this skipweave does not read (foreign: kept as
they are), and entries that are not valid (corrupt: a run would not serve them; ``skipweave gc`` removes them).
Migrate only once every skipweave that reads this dump dir reads the current version: to one that reads only
format 1, a migrated entry is foreign (kept, never served, its calls run live).

Exits 0 when done (or nothing to do; foreign files are no failure), 1 when some old entry is not (in a dry run:
would not be) migrated: corrupt, skipped because a writer held its part's lock, or failed; 2 when the dump dir
cannot be read. See docs/cli.md for the ``--json`` schema.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from skipweave.cli.common import EXIT_USAGE, add_json_argument, emit, emit_json
from skipweave.cli.format import plural, table

SCHEMA = "skipweave.migrate/1"
EXIT_OK, EXIT_NOT_MIGRATED = 0, 1
DETAIL_LINES = 20
"""Files listed one by one in the text report (foreign, corrupt, skipped, failed); ``--json`` lists every file."""

_WORDS = {"would_migrate": "would migrate", "migrated": "migrated", "current": "current", "foreign": "foreign",
          "corrupt": "corrupt", "skipped": "skipped", "failed": "FAILED", "gone": "gone"}


def register(subparsers: Any) -> None:
    """Add the ``migrate`` subcommand to ``subparsers``."""
    parser = subparsers.add_parser(
        "migrate", help="rewrite entries of an older format version to the current one (dry run unless --yes)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("dump_dir", metavar="DUMP_DIR", help="the store root (skip.<role>.dump_dir)")
    parser.add_argument("--yes", action="store_true", help="really rewrite (default: only list what would be)")
    add_json_argument(parser, SCHEMA)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """List and (with ``--yes``) migrate every manifest and group file; return 0, 1 (some old entry is not
    migrated) or 2."""
    from skipweave.progress import bars_enabled
    from skipweave.store.format.versions import FORMAT_VERSION
    from skipweave.store.migrate import NOT_MIGRATED, apply_migrate, plan_migrate
    from skipweave.store.scan import find_dump_dir_hint

    try:
        plan = plan_migrate(args.dump_dir)
    except (FileNotFoundError, NotADirectoryError, PermissionError) as exc:
        print(f"skipweave migrate: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return EXIT_USAGE
    if not plan.items and (hint := find_dump_dir_hint(plan.dump_dir)) is not None:
        print(f"skipweave migrate: {plan.dump_dir} is not a dump dir, but entries sit below it: "
              f"try `skipweave migrate {hint}`", file=sys.stderr)
        return EXIT_USAGE
    dry_run, now = not args.yes, time.time()
    bar = _bar(len(plan.items), dry_run) if bars_enabled() else None
    try:
        for item in plan.items:
            apply_migrate(item, dry_run=dry_run, unix=now)
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    status = EXIT_NOT_MIGRATED if any(i.outcome in NOT_MIGRATED for i in plan.items) else EXIT_OK
    if args.json:
        emit_json({
            "schema": SCHEMA, "dump_dir": plan.dump_dir, "dry_run": dry_run, "format_version": FORMAT_VERSION,
            "items": [item_doc(i) for i in plan.items],
            "roles": [{"namespace": ns, "role": role, "counts": counts(items)}
                      for (ns, role), items in by_role(plan.items).items()],
            "totals": counts(plan.items),
            "ignored": [{"path": path, "why": why} for path, why in plan.ignored],
        })
        return status
    emit(render(plan, dry_run=dry_run))
    return status


def _bar(total: int, dry_run: bool) -> Any:
    """A tqdm bar on stderr counting files; it shows only once the run lasts over a second (most stores take less)."""
    from tqdm import tqdm

    return tqdm(total=total, desc="skipweave: checking" if dry_run else "skipweave: migrating", unit="file",
                file=sys.stderr, leave=False, dynamic_ncols=True, delay=1.0)


def by_role(items: list[Any]) -> dict[tuple[str, str], list[Any]]:
    """``items`` (:class:`~skipweave.store.migrate.MigrateItem`) by ``(namespace, role)``, in their order."""
    out: dict[tuple[str, str], list[Any]] = {}
    for i in items:
        out.setdefault((i.key.namespace, i.key.role), []).append(i)
    return out


def counts(items: list[Any]) -> dict[str, dict[str, int]]:
    """The ``counts`` object documented in docs/cli.md: per outcome (every one, also at 0), ``entries`` (a group
    file counts the entries it holds) and ``groups`` (group files among them)."""
    from skipweave.store.migrate import Outcome

    out = {o.value: {"entries": 0, "groups": 0} for o in Outcome}
    for i in items:
        if i.outcome is None:
            continue
        out[i.outcome.value]["entries"] += i.entries
        out[i.outcome.value]["groups"] += i.kind == "group"
    return out


def item_doc(item: Any) -> dict[str, Any]:
    """The ``item`` object documented in docs/cli.md, of a :class:`~skipweave.store.migrate.MigrateItem`."""
    k = item.key
    return {
        "kind": item.kind, "path": item.path, "where": item.where, "namespace": k.namespace, "role": k.role,
        "target": k.target, "step": k.step, "shard": k.shard, "first": k.call, "last": item.last,
        "entries": item.entries, "version": item.version, "written_by": item.writer,
        "outcome": item.outcome.value if item.outcome is not None else None, "detail": item.detail,
    }


def render(plan: Any, *, dry_run: bool) -> str:
    """The human report of a migrate run: a table of counts per namespace and role, the files that were not
    migrated one by one (at most :data:`DETAIL_LINES`), a summary line."""
    from skipweave.store.format.versions import FORMAT_VERSION

    head = f"migrate {plan.dump_dir}"
    lines = [head + (" (dry run: nothing is rewritten; pass --yes to rewrite)" if dry_run else "")]
    if not plan.items:
        lines.append("no entry found")
        return "\n".join(lines + _ignored(plan))
    done = "would_migrate" if dry_run else "migrated"
    totals = counts(plan.items)
    columns = [done, "current", "foreign", "corrupt"] + [o for o in ("skipped", "failed", "gone")
                                                        if totals[o]["entries"]]
    header = ["namespace/role", *(_WORDS[c] if c != "current" else f"at format {FORMAT_VERSION}" for c in columns)]
    rows = [header]
    for (ns, role), items in by_role(plan.items).items():
        c = counts(items)
        rows.append([f"{ns}/{role}", *(_cell(c[o]) for o in columns)])
    lines += table(rows)
    lines.append("(entries; a group file of small entries counts the entries it holds)")
    shown = [i for i in plan.items if i.outcome is not None and i.outcome.value in ("foreign", "corrupt", "skipped",
                                                                                    "failed")]
    for i in shown[:DETAIL_LINES]:
        what = f"{i.where} ({i.kind if i.kind == 'group' else 'manifest'}" + (
            f", format {i.version}" if i.version is not None else "") + (
            f", written by skipweave {i.writer}" if i.writer else "") + ")"
        lines.append(f"{_WORDS[i.outcome.value]:<8} {what}")
        lines.append(f"{'':<8} at {i.path}")
        if i.detail:
            lines.append(f"{'':<8} {'why' if i.outcome.value != 'foreign' else 'kept'}: {i.detail}")
    if len(shown) > DETAIL_LINES:
        lines.append(f"... and {len(shown) - DETAIL_LINES} more (--json lists every file)")
    lines.append(_summary(plan.items, totals, dry_run=dry_run))
    return "\n".join(lines + _ignored(plan))


def _cell(count: dict[str, int]) -> str:
    return str(count["entries"]) + (f" ({plural(count['groups'], 'group')})" if count["groups"] else "")


def _summary(items: list[Any], totals: dict[str, dict[str, int]], *, dry_run: bool) -> str:
    from skipweave.store.format.versions import FORMAT_VERSION

    done = totals["would_migrate" if dry_run else "migrated"]
    if done["entries"]:
        old = sorted({i.version for i in items if i.outcome is not None
                      and i.outcome.value in ("would_migrate", "migrated") and i.version is not None})
        grouped = sum(i.entries for i in items if i.kind == "group" and i.outcome is not None
                      and i.outcome.value in ("would_migrate", "migrated"))
        text = (f"{'would migrate' if dry_run else 'migrated'} {plural(done['entries'], 'entry', 'entries')}"
                + (f" ({grouped} of them in {plural(done['groups'], 'group file')})" if done["groups"] else "")
                + f" from format {' and '.join(str(v) for v in old)} to format {FORMAT_VERSION}")
    else:
        text = "nothing to migrate"
    notes = []
    if totals["current"]["entries"]:
        notes.append(f"{plural(totals['current']['entries'], 'entry', 'entries')} at format {FORMAT_VERSION} already")
    if totals["foreign"]["entries"]:
        notes.append(f"{plural(totals['foreign']['entries'], 'foreign entry', 'foreign entries')} kept as "
                     f"{'it is' if totals['foreign']['entries'] == 1 else 'they are'}")
    if totals["corrupt"]["entries"]:
        n = totals["corrupt"]["entries"]
        notes.append(f"{plural(n, 'corrupt entry', 'corrupt entries')} not migrated "
                     f"(skipweave gc removes {'it' if n == 1 else 'them'})")
    if totals["skipped"]["entries"]:
        notes.append(f"{totals['skipped']['entries']} skipped (a writer held the lock; run again)")
    if totals["failed"]["entries"]:
        notes.append(f"{totals['failed']['entries']} FAILED")
    return text + ("; " + "; ".join(notes) if notes else "")


def _ignored(plan: Any) -> list[str]:
    if not plan.ignored:
        return []
    return [f"ignored (never followed): {len(plan.ignored)} symlink(s)",
            *(f"  {path}: {why}" for path, why in plan.ignored[:10])]
