"""``skipweave diff DUMP_A DUMP_B``: compare two stores entry by entry and say where they first differ.

Entries are aligned by namespace, role, target, step, shard and call (e.g. one job recorded on two engines, or
before and after a change); each pair is compared as a verify run compares a live call with its recording (A is the
recording, B the live side; see docs/verify.md). Only parts a run would serve are compared; an entry that cannot be
read is reported ``unreadable``, an entry on one side only ``only_in_a`` / ``only_in_b``.

Stores are read without rebuilding the host's classes: a recorded dataclass or batch object (verl's ``DataProto``, a
trainer's own ``Batch``) is compared by its class name and its recorded fields, so no ``--trust`` or ``PYTHONPATH`` is
needed; ``--trust CLASS`` rebuilds objects instead, for those who want them.

What "equal" means: what the shipped verify profile (``rollout_verify``) says, for every role: every field exact but
the per-run ones it ignores (``meta_info.timing*``, skipweave's own notes); ``--atol/--rtol`` (every float field) and
``--ignore GLOB`` (repeatable) add to it; ``--compare-from PROFILE`` takes ``skip.<role>.compare`` of another profile
(name or YAML file) for the roles it names (``--compare-from off``: every field exact); the options win over the
profile.

Prints a table per target (step, call, status, first diverging field and position, token match, the first differing
token, max |Δ| of float fields; ``n/a`` where a result has no token field / no float field) and the first divergence,
with what changed in the recorded environment (target source, packages, config keys) between the two entries as a
likely cause; ``--json`` prints one document (schema ``skipweave.diff/1``); ``--plot FILE.png`` draws the token match
ratio and the max |Δ| of float fields per step, with gaps where a series has no value and the steps only one store
holds marked (needs matplotlib: ``pip install 'skipweave[plot]'``).

Exit status: 0 every aligned pair identical or close; 1 some pair diverged, or an entry is only on one side or
unreadable; 2 a dump dir cannot be read, the options are invalid (a ``--plot`` file that cannot be written
included), or no entry is on both sides.

Entries are paired as a verify run matches a call to a recording: by input fingerprint first, else by call index
when A's part has one writer whose calls never overlapped; a pair whose call indices differ says so (``call_b``;
``A/B`` in the table's call column).
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
from collections.abc import Iterator
from typing import Any

from skipweave.cli.common import EXIT_OK, EXIT_USAGE, emit, emit_json, steps_option
from skipweave.cli.diff_plot import PAIRED

SCHEMA = "skipweave.diff/1"
EXIT_DIVERGED = 1


def register(subparsers: Any) -> None:
    """Add the ``diff`` subcommand to ``subparsers``."""
    parser = subparsers.add_parser(
        "diff", help="compare two dump dirs entry by entry; exit 1 if they diverge", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("dump_a", metavar="DUMP_A", help="the reference store (the 'recorded' side)")
    parser.add_argument("dump_b", metavar="DUMP_B", help="the store compared with it (the 'live' side)")
    parser.add_argument("--namespace", default=None, help="only this namespace")
    parser.add_argument("--role", default=None, help="only this role")
    parser.add_argument("--target", action="append", default=None, metavar="NAME",
                        help="only this target (repeatable)")
    parser.add_argument("--steps", default=None, metavar="STEPS",
                        help="only these steps, as skip.<role>.steps writes them (e.g. 1-5, '[1,3,8]')")
    parser.add_argument("--atol", type=float, default=None, help="absolute tolerance of every float field")
    parser.add_argument("--rtol", type=float, default=None, help="relative tolerance of every float field")
    parser.add_argument("--ignore", action="append", default=[], metavar="GLOB",
                        help="a field path (glob) left out of the comparison, e.g. 'meta_info.timing*' (repeatable)")
    parser.add_argument("--compare-from", default=None, metavar="PROFILE",
                        help="take skip.<role>.compare from this profile (a shipped name or a YAML file; default: "
                             f"{DEFAULT_RULES_PROFILE}'s rules for every role; 'off': every field exact)")
    parser.add_argument("--trust", action="append", default=[], metavar="PKG.MOD:CLASS",
                        help="rebuild the host's objects instead of comparing recorded fields by class name: a class "
                             "decoding may import and rebuild, as skip.<role>.trusted_classes (repeatable; its module "
                             "must be importable, e.g. through PYTHONPATH)")
    parser.add_argument("--allow-pickle", action="store_true",
                        help="decode entries holding pickled data (only for stores you trust)")
    parser.add_argument("--plot", default=None, metavar="FILE.png",
                        help="draw token match and max |Δ| per step into this image (needs matplotlib)")
    parser.add_argument("--json", action="store_true", help=f"print one JSON document (schema {SCHEMA})")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Diff the two dump dirs; return 0, 1 or 2 (see the module docstring)."""
    from skipweave.config.errors import ConfigError
    from skipweave.config.values import parse_class_refs

    try:
        specs, trusted = compare_specs(args)
        trusted += parse_class_refs("--trust", args.trust)
        views = not args.trust  # objects only for those who ask for them
        steps = steps_option(args.steps)
    except ConfigError as exc:
        print(f"skipweave diff: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.plot:
        problem = plot_problem(args.plot)
        if problem:
            print(f"skipweave diff: --plot {args.plot}: {problem}", file=sys.stderr)
            return EXIT_USAGE
    scans = []
    for path in (args.dump_a, args.dump_b):
        scanned = _scan(path, args.allow_pickle)
        if scanned is None:
            return EXIT_USAGE
        scans.append(scanned)
    rows = list(diff_rows(scans[0], scans[1], specs, namespace=args.namespace, role=args.role,
                          targets=args.target, steps=steps, trusted=trusted, views=views))
    paired = [r for r in rows if r["status"] not in ("only_in_a", "only_in_b")]
    doc = document(scans[0].dump_dir, scans[1].dump_dir, rows)
    if args.plot:
        from skipweave.cli.diff_plot import plot

        try:
            plot(rows, args.plot)
        except Exception as exc:  # noqa: BLE001 - the table still goes out; the status says the plot failed
            print(f"skipweave diff: --plot {args.plot} could not be written: {type(exc).__name__}: {exc}",
                  file=sys.stderr)
            plotted = False
        else:
            doc["plot"] = args.plot
            plotted = True
    if args.json:
        emit_json(doc)
    else:
        emit(render(doc))
    filtered = any(x is not None for x in (args.namespace, args.role, args.target, args.steps))
    if not paired:
        print(f"skipweave diff: no entry of {scans[0].dump_dir} has a counterpart in {scans[1].dump_dir}"
              f"{' under the filters given' if filtered else ''}; check both paths (each is a dump dir: "
              "skip.<role>.dump_dir) and --namespace/--role/--target/--steps", file=sys.stderr)
        return EXIT_USAGE
    if args.plot and not plotted:
        return EXIT_USAGE
    return EXIT_DIVERGED if doc["totals"]["failing"] else EXIT_OK


PLOT_FORMATS = ("png", "svg", "pdf", "jpg", "jpeg")


def plot_problem(path: str) -> str | None:
    """Why ``--plot PATH`` cannot be written (checked before the diff runs), or ``None``."""
    import os

    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "needs matplotlib: pip install 'skipweave[plot]'"
    if os.path.isdir(path):
        return "is a folder; name an image file, e.g. diff.png"
    ext = os.path.splitext(path)[1].lstrip(".").lower()
    if ext not in PLOT_FORMATS:
        return f"name an image file ending in {', '.join('.' + f for f in PLOT_FORMATS)}"
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        return f"its folder {folder} does not exist or is not writable"
    return None


# ------------------------------------------------------------------------------------------------ inputs
DEFAULT_RULES_PROFILE = "rollout_verify"
"""The shipped profile whose ``skip.rollout.compare`` is diff's rule for every role the options name no other for:
one definition of what differs from run to run (timings) for verify runs and diffs alike."""


def default_spec() -> Any:
    """The :class:`~skipweave.config.compare.CompareSpec` of :data:`DEFAULT_RULES_PROFILE`'s ``rollout`` role.

    Raises:
        ConfigError: the shipped profile cannot be composed (a broken installation).
    """
    from skipweave.config import load_skip_config
    from skipweave.config.profiles import compose_profile

    return load_skip_config(compose_profile(DEFAULT_RULES_PROFILE)).roles["rollout"].compare


def compare_specs(args: argparse.Namespace) -> tuple[dict[str | None, Any], tuple[str, ...]]:
    """``(role -> CompareSpec, trusted classes)`` from ``--compare-from`` (its roles' ``compare`` and
    ``trusted_classes``) and the options; key ``None``: every role the profile does not name, compared as
    :func:`default_spec` says.

    Raises:
        ConfigError: a profile that cannot be composed, or a tolerance that is not a finite number >= 0.
    """
    from skipweave.config.compare import IGNORE, CompareSpec, Tolerance, parse_rule

    by_role: dict[str | None, CompareSpec] = {None: default_spec()}
    trusted: tuple[str, ...] = ()
    if args.compare_from:
        from skipweave.config import load_skip_config
        from skipweave.config.profiles import compose_profile

        plan = load_skip_config(compose_profile(args.compare_from))
        by_role.update({name: role.compare for name, role in plan.roles.items()})
        trusted = tuple(c for role in plan.roles.values() for c in role.trusted_classes)
    extra = tuple(args.ignore)
    tolerance = None
    if args.atol is not None or args.rtol is not None:
        rule = parse_rule("--atol/--rtol", {"atol": args.atol or 0.0, "rtol": args.rtol or 0.0})
        assert isinstance(rule, Tolerance)
        tolerance = rule
    out = {}
    for name, spec in by_role.items():
        default = spec.default if tolerance is None or spec.default == IGNORE else tolerance
        fields = tuple((g, tolerance if tolerance is not None and isinstance(r, Tolerance) else r)
                       for g, r in spec.fields)
        out[name] = CompareSpec(default, fields, spec.always_ignore + extra)
    return out, trusted


def _scan(path: str, allow_pickle: bool) -> Any:
    from skipweave.store.bundle.layout import is_bundle_path
    from skipweave.store.scan import find_dump_dir_hint, scan

    if is_bundle_path(path):
        from skipweave.cli.common import scan_bundle_or_explain

        found = scan_bundle_or_explain("diff", argparse.Namespace(dump_dir=path, calls_per_step=None,
                                                                   allow_pickle=allow_pickle), checksums=False)[0]
        if found is not None and not found.parts:
            print(f"skipweave diff: {found.dump_dir} holds no recording", file=sys.stderr)
            return None
        return found
    try:
        result = scan(path, checksums=False, allow_pickle=allow_pickle)
    except (FileNotFoundError, NotADirectoryError, PermissionError) as exc:
        print(f"skipweave diff: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return None
    if not result.parts:
        hint = find_dump_dir_hint(result.dump_dir)
        more = f"; entries sit below it: try {hint}" if hint else ""
        print(f"skipweave diff: {result.dump_dir} holds no recording{more}", file=sys.stderr)
        return None
    return result


# ------------------------------------------------------------------------------------------------ the diff
def diff_rows(a: Any, b: Any, specs: Any, *, namespace: str | None = None, role: str | None = None,
              targets: list[str] | None = None, steps: Any = None,
              trusted: tuple[str, ...] = (), views: bool = True) -> Iterator[dict[str, Any]]:
    """One row per aligned entry of the scans ``a`` and ``b`` (:class:`~skipweave.store.scan.DumpScan`), in
    namespace, role, target, step, shard and call order: ``{namespace, role, target, step, shard, call, status,
    first, first_token, token_match, max_abs_diff, fields, reason}``, plus ``environment`` (``[[field, A's, B's],
    ...]``) when the two entries' recorded environments differ. ``views``: compare the recorded fields of the host's
    objects by class name (:func:`~skipweave.store.format.codec.decode_view`), else rebuild them (``trusted``:
    classes decoding may rebuild besides the codec's own, ``skip.<role>.trusted_classes``)."""
    from skipweave.store.bundle.store import open_role_store
    from skipweave.store.format.environment import EnvironmentInvalid, changes_from, fields_of
    from skipweave.store.scan import Status
    from skipweave.verify.compare import compare

    def parts(scan: Any) -> dict[tuple[Any, ...], Any]:
        return {(p.namespace, p.role, p.target, p.step, p.shard): p for p in scan.parts
                if not ((namespace is not None and p.namespace != namespace) or (role is not None and p.role != role)
                        or (targets and p.target not in targets) or (steps is not None and p.step not in steps))}

    parts_a, parts_b = parts(a), parts(b)
    stores: dict[tuple[int, str, str], Any] = {}

    def load(scan: Any, side: int, part: Any, entry: Any) -> tuple[Any, str | None]:
        if not part.complete or part.status is not Status.COMPLETE:
            return None, f"part {part.where} is {part.status.value} ({part.incomplete_reason or entry.reason})"
        store = stores.get((side, part.namespace, part.role))
        if store is None:  # (a bundle is read in place by a store of its own)
            store = stores[(side, part.namespace, part.role)] = open_role_store(
                scan.dump_dir, part.namespace, part.role, allow_pickle=scan.allow_pickle, trusted_classes=trusted,
                views=views)
        try:
            return store.load(entry.key).result, None
        except Exception as exc:  # noqa: BLE001 - a damaged or foreign entry is a row, never a crash
            return None, f"{type(exc).__name__}: {exc}"

    def environment(ea: Any, eb: Any) -> list[list[Any]]:
        """What B's recorded environment changes from A's (the entries' manifests; a damaged one is a change)."""
        env_a, env_b = (ea.manifest or {}).get("environment"), (eb.manifest or {}).get("environment")
        if env_a is None or env_b is None or env_a == env_b:
            return []
        try:
            live = fields_of(env_b)
        except EnvironmentInvalid as exc:  # B's is not shaped as skipweave writes it
            return [["environment", "A's", f"invalid in B ({exc})"]]
        return [list(change) for change in changes_from(env_a, live, "B's")]

    def diff_pair(where: tuple[Any, ...], pa: Any, ea: Any, pb: Any, eb: Any) -> dict[str, Any]:
        row: dict[str, Any] = dict(zip(("namespace", "role", "target", "step", "shard"), where, strict=True))
        row.update(call=(ea or eb).key.call, first=None, first_token=None, token_match=None, max_abs_diff=None,
                   fields=0, reason=None)
        if ea is not None and eb is not None and eb.key.call != ea.key.call:
            row["call_b"] = eb.key.call  # concurrent calls, paired by their inputs
        if ea is None or eb is None:
            row["status"] = "only_in_a" if eb is None else "only_in_b"
            return row
        ra, why_a = load(a, 0, pa, ea)
        rb, why_b = load(b, 1, pb, eb)
        if why_a or why_b:
            reason = (f"A and B: {why_a}" if why_a == why_b else
                      "; ".join(f"{s}: {w}" for s, w in (("A", why_a), ("B", why_b)) if w))
            row.update(status="unreadable", reason=reason)
            return row
        comparison = compare(ra, rb, specs.get(where[1], specs[None])).to_json()
        del ra, rb
        row.update(status=comparison["status"], first=comparison["first"], first_token=comparison["first_token"],
                   token_match=comparison["token_match"], max_abs_diff=comparison["max_abs_diff"],
                   fields=comparison["fields"])
        changed = environment(ea, eb)
        if changed:
            row["environment"] = changed
        return row

    for where in sorted(set(parts_a) | set(parts_b)):
        pa, pb = parts_a.get(where), parts_b.get(where)
        for ea, eb in pairs(pa.entries if pa else [], pb.entries if pb else []):
            yield diff_pair(where, pa, ea, pb, eb)


DIFF_WRITER = ("skipweave-diff", "", -1)
"""Who the matching takes ``diff`` for: no writer of any store (every entry is another, ended run's)."""


def pairs(left: list[Any], right: list[Any]) -> list[tuple[Any, Any]]:
    """The entries of one part on both sides, paired as a verify run matches a call of B to A's recordings
    (:func:`skipweave.policy.matching.match_call`): the entry of A recorded for the same inputs first (lowest call
    index), else, when A's part has one writer whose calls never overlapped, the entry at B's call index.
    ``(entry, None)`` / ``(None, entry)``: one side only. Ordered by A's call index, B's unpaired ones last."""
    from skipweave.policy.matching import match_call, view_of
    from skipweave.store.format.versions import fingerprint_rule
    from skipweave.store.identity import Writer, recorded_of

    me = Writer(*DIFF_WRITER)
    view = view_of([recorded_of(e.manifest or {}, e.key.call) for e in left], me=me, started=math.inf)
    by_call = {e.key.call: e for e in left}
    claimed: set[int] = set()
    paired: dict[int, Any] = {}
    alone: list[tuple[Any, Any]] = []
    for eb in right:
        manifest = eb.manifest or {}
        raw = manifest.get("input_fingerprint")
        fp: str = raw if isinstance(raw, str) else ""
        # B's digest compares only with A's entries of its own rule (a format-1 store beside a format-2 one: by index)
        match = match_call(view, eb.key.call, functools.partial(_under, fp, fingerprint_rule(manifest)), claimed,
                           same_step=True, me=me, started=math.inf)
        if match.call is not None and match.call in by_call:
            claimed.add(match.call)
            paired[match.call] = eb
        else:
            alone.append((None, eb))
    return [(ea, paired.get(ea.key.call)) for ea in left] + alone


def _under(fp: str, rule: str, asked: str) -> str:
    """``fp``, an entry's fingerprint taken by ``rule``, as the fingerprint under the rule ``asked`` (``""``: none)."""
    return fp if asked == rule else ""


def document(dump_a: str, dump_b: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``--json`` document: both dump dirs, the rows, totals by status, and the first diverging row."""
    totals: dict[str, int] = {}
    for r in rows:
        totals[r["status"]] = totals.get(r["status"], 0) + 1
    failing = sum(n for s, n in totals.items() if s not in ("identical", "close"))
    diverged = [r for r in rows if r["status"] == "diverged"]
    first = min(diverged, key=lambda r: (r["step"], r["call"])) if diverged else None
    return {"schema": SCHEMA, "dump_a": dump_a, "dump_b": dump_b, "rows": rows,
            "totals": {"entries": len(rows), "failing": failing, **totals}, "first_divergence": first}


def _where(first: Any) -> str:
    if not isinstance(first, dict):
        return ""
    detail = first.get("detail") or {}
    if "first_index" in detail:
        return str(detail["first_index"])
    if "at" in detail:
        return str(detail["at"])
    kind = str(first.get("kind", ""))
    return "" if kind == "value" else kind  # a scalar has no position; other kinds (shape, type, keys) say what differs



def _number(x: Any, fmt: str, paired: bool) -> str:
    """A table cell: ``n/a`` for a compared pair without such a field (no token field, no float field), ``-`` for a
    row that compared nothing."""
    if x is None:
        return "n/a" if paired else "-"
    if isinstance(x, str):
        return x
    return format(x, fmt)


def _token_cell(row: dict[str, Any]) -> str:
    """The first differing token of a row, ``[sample, position] A→B`` (the field's path first when it is not the
    row's first diverging field; ``(end)`` past a sequence's end)."""
    token = row.get("first_token")
    if not isinstance(token, dict):
        return ""
    detail = token.get("detail") or {}
    if "first_index" not in detail:
        return f"{token.get('path', '')}: {token.get('kind', '')}"
    first = row.get("first") if isinstance(row.get("first"), dict) else {}
    where = "" if token.get("path") == (first or {}).get("path") else f"{token.get('path')} "
    recorded, live = ("(end)" if v is None else str(v) for v in (detail.get("recorded"), detail.get("live")))
    return f"{where}{detail['first_index']} {recorded}→{live}"


def render(doc: dict[str, Any]) -> str:
    """The text form: a table per target, then totals and the first divergence."""
    from skipweave.cli.format import table
    from skipweave.verify.report import describe

    lines = [f"diff {doc['dump_a']} (A) against {doc['dump_b']} (B)"]
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in doc["rows"]:
        groups.setdefault((r["namespace"], r["role"], r["target"]), []).append(r)
    for (namespace, role, target), rows in groups.items():
        lines += ["", f"{namespace}/{role} target {target}:"]
        cells = [["step", "call (A/B)" if any("call_b" in r for r in rows) else "call", "shard", "status",
                  "first diverging field", "at", "token match", "first token A→B", "max |Δ|"]]
        for r in rows:
            first = r["first"] if isinstance(r["first"], dict) else None
            field = (first or {}).get("path", "") if r["status"] != "unreadable" else "(see below)"
            call = f"{r['call']}/{r['call_b']}" if "call_b" in r else str(r["call"])  # paired by inputs across
            paired = r["status"] in PAIRED
            cells.append([str(r["step"]), call, r["shard"], r["status"], field or "", _where(first),
                          _number(r["token_match"], ".3f", paired), _token_cell(r),
                          _number(r["max_abs_diff"], ".3g", paired)])
        lines += ["  " + line for line in table(cells)]
    t = doc["totals"]
    counts = ", ".join(f"{s} {n}" for s, n in t.items() if s not in ("entries", "failing"))
    lines += ["", f"{t['entries']} entries: {counts}"]
    first = doc["first_divergence"]
    if first is not None:
        lines.append("first divergence: " + describe({**first, "inputs": None}))
    elif t["entries"] and not t["failing"]:
        lines.append("every aligned entry is identical" + (" or within tolerance" if t.get("close") else ""))
    lines += _environment_lines(doc["rows"], first)
    reasons = list(dict.fromkeys(r["reason"] for r in doc["rows"] if r["status"] == "unreadable"))
    for reason in reasons[:3]:
        lines.append(f"unreadable ({sum(r['reason'] == reason for r in doc['rows'])} entries): {reason}")
    if len(reasons) > 3:
        lines.append(f"... and {len(reasons) - 3} other reasons (--json lists every row)")
    if any("cannot be rebuilt" in r or "cannot import module" in r for r in reasons):
        lines.append("with --trust, the host's objects are rebuilt: each class must be trusted (--trust PKG.MOD:CLASS) "
                     "and its module importable (e.g. PYTHONPATH=<the host's source>); without --trust, diff compares "
                     "their recorded fields by class name and needs neither")
    if doc.get("plot"):
        lines.append(f"plot: {doc['plot']}")
    return "\n".join(lines)


def _environment_lines(rows: list[dict[str, Any]], first: dict[str, Any] | None) -> list[str]:
    """One line per distinct environment change between A's and B's entries (the first divergence's own already
    said beside it), with the number of entries it concerns."""
    from skipweave.verify.report import environment_changes

    said = environment_changes(first) if first is not None else ""
    counts: dict[str, int] = {}
    for r in rows:
        text = environment_changes(r)
        if text:
            counts[text] = counts.get(text, 0) + 1
    return [f"environment differs between A and B in {n} entries: {text}" for text, n in counts.items()
            if text != said or n > 1][:5]


__all__ = ["DEFAULT_RULES_PROFILE", "PAIRED", "SCHEMA", "compare_specs", "default_spec", "diff_rows", "document",
           "register", "render", "run"]
