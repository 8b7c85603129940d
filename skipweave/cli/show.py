"""``skipweave show PATH [--call N] [--verify] [--json]``: one entry's manifest and a summary of its payload.

``PATH`` is an entry's manifest, one of its payload files, or a target folder holding a single entry; or a group
file (``r0-0000-0063.pack.json``) or its data file, with ``--call N`` naming the entry of the group.
The summary (every leaf's path, kind, dtype, shape and bytes) comes from the entry's JSON tree alone:
no tensor is loaded. Sizes are checked; ``--verify`` also checks checksums (reads every byte).
Exits 0 for a valid entry, 1 for a corrupt one (what can be read is still shown), 2 when ``PATH`` is
not an entry. See docs/cli.md for the ``--json`` schema.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from skipweave.cli.common import EXIT_OK, EXIT_USAGE, add_json_argument, emit, emit_json
from skipweave.cli.format import human_bytes, human_time, plural, table
from skipweave.cli.show_bundle import NotInBundle, describe_in_bundle, split_bundle_path

SCHEMA = "skipweave.show/1"
EXIT_CORRUPT = 1
EXIT_FOREIGN = 3
_MAX_ROWS = 200


class NotAnEntry(Exception):
    """``PATH`` names no single entry; the message says what it found instead."""


def register(subparsers: Any) -> None:
    """Add the ``show`` subcommand to ``subparsers``."""
    parser = subparsers.add_parser(
        "show", help="show one entry's manifest and a summary of its payload", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("path", metavar="PATH", help="a manifest, a payload file, or a folder holding one entry; or "
                                                     "a bundle (.zip) holding one, or BUNDLE/<member> as ls names it")
    parser.add_argument("--call", type=int, default=None, metavar="N",
                        help="with a target folder, or a group file of small entries (or its data file): the call "
                             "to show")
    parser.add_argument("--verify", action="store_true", help="also check payload checksums (reads every byte)")
    parser.add_argument("--all", action="store_true", help=f"list every leaf (default: the first {_MAX_ROWS})")
    parser.add_argument("--allow-pickle", action="store_true",
                        help="judge an entry holding pickled data as a run with allow_pickle=true would")
    add_json_argument(parser, SCHEMA)
    parser.set_defaults(func=run)


def resolve_manifest(path: str, call: int | None = None) -> tuple[str, int | None]:
    """Return the manifest that ``path`` designates, or the group file holding the entry and its call.

    ``path`` may also be an entry's manifest path where the entry sits in a group (``r0-0001.manifest.json`` when
    call 1 of shard r0 is grouped: what a person builds from ``skipweave ls``), or a target folder with ``call``.

    Raises:
        NotAnEntry: ``path`` does not exist, or is a file or folder that names no single entry; or it is a group
            file (or its data file) and ``call`` is not one of its calls.
    """
    from skipweave.store.format.layout import (
        GROUP_SUFFIX,
        MANIFEST_SUFFIX,
        TMP_PREFIX,
        parse_group_name,
        parse_manifest_name,
    )
    from skipweave.store.validity import payload_stem

    path = os.path.abspath(path)
    if os.path.isdir(path):
        listing = os.listdir(path)
        names = sorted(n for n in listing if n.endswith(MANIFEST_SUFFIX) and not n.startswith("."))
        groups = sorted(n for n in listing if parse_group_name(n) is not None)
        if call is not None:
            own = [n for n in names if (m := parse_manifest_name(n)) is not None and m[1] == call]
            shards = {m[0] for n in own if (m := parse_manifest_name(n)) is not None}
            held = [n for n in groups if (g := parse_group_name(n)) is not None and g[1] <= call <= g[2]
                    and g[0] not in shards]  # a call's own manifest serves it, not its group
            found = [*own, *held]
            if len(found) == 1:
                return os.path.join(path, found[0]), (call if held else None)
            if not found:
                raise NotAnEntry(f"{path} holds no entry of call {call}; `skipweave ls` lists what is recorded")
            listed = "\n  ".join(os.path.join(path, n) for n in found)
            raise NotAnEntry(f"{path} holds call {call} of several shards; name one:\n  {listed}")
        if groups:
            listed = "\n  ".join(os.path.join(path, n) for n in groups[:10])
            raise NotAnEntry(f"{path} holds groups of small entries; name the call with --call N:\n  {listed}")
        if len(names) == 1:
            return os.path.join(path, names[0]), None
        if not names:
            raise NotAnEntry(store_folder(path) or f"{path} holds no entry (no *{MANIFEST_SUFFIX}); "
                             "`skipweave ls DUMP_DIR` lists them")
        listed = "\n  ".join(os.path.join(path, n) for n in names[:10])
        more = f"\n  ... and {len(names) - 10} more" if len(names) > 10 else ""
        raise NotAnEntry(f"{path} holds {len(names)} entries; name one:\n  {listed}{more}")
    folder, name = os.path.split(path)
    entry = parse_manifest_name(name)
    if not os.path.exists(path):
        if entry is not None and os.path.isdir(folder):  # a grouped entry, named by the manifest it would have
            held = [n for n in os.listdir(folder) if (g := parse_group_name(n)) is not None and g[0] == entry[0]
                    and g[1] <= entry[1] <= g[2]]
            if len(held) == 1:
                return os.path.join(folder, held[0]), entry[1]
        raise NotAnEntry(f"{path} does not exist")
    if name.startswith(TMP_PREFIX):
        raise NotAnEntry(f"{path} is a temporary file of an unfinished write, not an entry")
    if name.endswith(MANIFEST_SUFFIX):
        return path, None
    stem = payload_stem(name)
    if stem is None and parse_group_name(name) is None:
        raise NotAnEntry(f"{path} is not an entry's manifest or payload file")
    group = name if stem is None else stem + GROUP_SUFFIX
    grouped = parse_group_name(group)
    if grouped is None:
        return os.path.join(folder, f"{stem}{MANIFEST_SUFFIX}"), None
    if call is None or not grouped[1] <= call <= grouped[2]:
        raise NotAnEntry(f"{path} is a group of small entries, calls {grouped[1]}..{grouped[2]}; name one with "
                         "--call N")
    return os.path.join(folder, group), call


_LEVELS = ("namespace", "role", "step")
"""What the folders below a dump dir are, by depth (``{dump_dir}/{namespace}/{role}/{step}/{target}``)."""


def store_folder(path: str) -> str | None:
    """Say what ``path`` is when it is a dump dir, one of its namespace, role or step folders, or a folder above
    one, and what it holds, pointing to one entry and to ``skipweave ls``; ``None`` when it holds no entry.

    The dump dir is found as ``skipweave ls`` finds a misplaced one, and read with the scan ``ls`` uses.

    Args:
        path: an absolute folder that holds no manifest itself.
    """
    from skipweave.store.scan import find_dump_dir_hint, scan

    dump = find_dump_dir_hint(path) or path
    rel = os.path.relpath(path, dump).split(os.sep)
    below = [] if rel == ["."] or rel[0] == os.pardir else rel  # path's namespace, role and step
    if len(below) > len(_LEVELS):
        return None  # a target folder: its entries are its own manifests
    try:
        found = scan(dump)
    except OSError:
        return None
    parts = [p for p in found.parts if [p.namespace, p.role, str(p.step)][: len(below)] == below]
    if not any(p.entries for p in parts):
        return None
    what = _what(dump, below, path)
    joint = " " if what == "a dump dir" else ", "  # the folder holds them, not the dump dir named last
    return f"{path} is {what}{joint}holding {_holding(parts, len(below))}; {_next_steps(dump, parts)}"


def _what(dump: str, below: list[str], path: str) -> str:
    """``a dump dir``, ``role rollout of namespace default of dump dir D``, …, or ``above the dump dir D``."""
    if dump != path and not below:
        return f"above the dump dir {dump}"
    if not below:
        return "a dump dir"
    names = [f"{level} {name}" for level, name in zip(_LEVELS, below, strict=False)]
    return " of ".join(reversed(names)) + f" of dump dir {dump}"


def _holding(parts: list[Any], depth: int) -> str:
    """What ``parts`` hold below a folder ``depth`` levels down the dump dir: roles by namespace (steps and
    entries each), a role's steps, or a step's targets."""
    entries = plural(sum(len(p.entries) for p in parts), "entry", "entries")
    if depth == 3:
        targets = list(dict.fromkeys(p.target for p in parts))
        return f"{'target' if len(targets) == 1 else 'targets'} {', '.join(targets)} ({entries})"
    if depth == 2:
        steps = sorted({p.step for p in parts})
        return f"{'step' if len(steps) == 1 else 'steps'} {_step_ranges(steps)}, {entries}"
    roles: dict[str, dict[str, list[Any]]] = {}  # namespace -> role -> parts
    for p in parts:
        roles.setdefault(p.namespace, {}).setdefault(p.role, []).append(p)
    said = {ns: f"{'role' if len(own) == 1 else 'roles'} " + ", ".join(f"{role} ({_holding(rp, 2)})"
                                                                       for role, rp in own.items())
            for ns, own in roles.items()}
    if depth == 1:
        return next(iter(said.values()))
    return " and ".join(f"{text} of namespace {ns}" for ns, text in said.items())


def _step_ranges(steps: list[int]) -> str:
    """``1-16``, or ``1-4, 7, 9-10``: sorted steps as inclusive runs."""
    runs: list[list[int]] = []
    for step in steps:
        if runs and step == runs[-1][1] + 1:
            runs[-1][1] = step
        else:
            runs.append([step, step])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _next_steps(dump: str, parts: list[Any]) -> str:
    """Point to the first entry of ``parts`` (as ``show`` takes it: a grouped one by its manifest name) and to ls."""
    from skipweave.store.format.layout import manifest_path

    first = next(e for p in parts for e in p.entries)
    return (f"show one entry with `skipweave show {manifest_path(dump, first.key)}`, or list them with "
            f"`skipweave ls {dump}`")


def describe(manifest_path: str, *, checksums: bool, allow_pickle: bool = False,
             call: int | None = None) -> dict[str, Any]:
    """Return the ``skipweave.show/1`` document of one entry (see docs/cli.md); ``call`` names the entry of a group
    file.

    Raises:
        FileNotFoundError: the manifest does not exist (a payload file whose entry was never committed).
    """
    from skipweave.store.format.layout import EntryKey, parse_group_name
    from skipweave.store.validity import check_entry

    key = None
    grouped = parse_group_name(os.path.basename(manifest_path))
    if grouped is not None and call is not None:
        parts = os.path.abspath(manifest_path).split(os.sep)
        namespace, role, step, target = parts[-5:-1]
        key = EntryKey(namespace, role, int(step), target, grouped[0], call) if step.lstrip("-").isdigit() else None
    validity = check_entry(manifest_path, checksums=checksums, allow_pickle=allow_pickle, key=key)
    manifest, reason = validity.manifest, validity.reason
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "path": manifest_path,
        "status": "foreign" if validity.foreign else "refused" if validity.refused else "corrupt" if reason
        else "valid",
        "reason": reason,
        "checksums_checked": checksums,
        "manifest": manifest,
        "payload": [],
        "result": [],
        "rng": [],
        "summary_error": None,
        "environment": {"fields": None, "error": None},
        "format_version": validity.foreign.version if validity.foreign else (manifest or {}).get("format_version"),
        "written_by": validity.foreign.writer if validity.foreign else None,
    }
    if manifest is None:
        return doc
    doc["environment"] = environment_of(manifest)
    folder = os.path.dirname(manifest_path)
    doc["payload"] = [_file_state(folder, item, checksums) for item in manifest.get("payload", [])
                      if isinstance(item, dict)]
    try:
        rows = _leaves(folder, manifest, call if grouped is not None else None)
    except Exception as exc:  # any unreadable tree: show what we can
        doc["summary_error"] = f"{type(exc).__name__}: {exc}"
        return doc
    rows = [r for r in rows if not (r["path"] == "['rng']" and r["kind"] == "none")]  # no RNG state recorded
    for row in rows:
        path = row["path"]
        if path.startswith("['rng']"):
            doc["rng"].append({**row, "path": path[len("['rng']"):].lstrip(".")})
        else:
            doc["result"].append({**row, "path": path[len("['result']"):].lstrip(".") if
                                  path.startswith("['result']") else path})
    return doc


def environment_of(manifest: dict[str, Any]) -> dict[str, Any]:
    """The ``environment`` part of the document: ``{"fields": {field: value} | None, "error": str | None}``, the
    manifest's environment checked and flattened as a replay compares it (:mod:`skipweave.store.format.environment`);
    ``fields`` is ``None`` when the entry has none (written before environments were) or it is invalid (``error``
    says why: a replay takes it for a changed environment)."""
    from skipweave.store.format.environment import EnvironmentInvalid, fields_of

    recorded = manifest.get("environment")
    if recorded is None:
        return {"fields": None, "error": None}
    try:
        return {"fields": fields_of(recorded), "error": None}
    except EnvironmentInvalid as exc:
        return {"fields": None, "error": str(exc)}


def _file_state(folder: str, item: dict[str, Any], checksums: bool) -> dict[str, Any]:
    from skipweave.store.format.manifest import file_checksum

    path = os.path.join(folder, str(item.get("name")))
    out = {"name": item.get("name"), "bytes": item.get("bytes"), "checksum": item.get("checksum"),
           "on_disk_bytes": None, "state": "ok"}
    try:
        out["on_disk_bytes"] = os.path.getsize(path)
    except OSError:
        out["state"] = "missing"
        return out
    if out["on_disk_bytes"] != item.get("bytes"):
        out["state"] = "size_mismatch"
    elif checksums and file_checksum(path) != item.get("checksum"):
        out["state"] = "checksum_mismatch"
    return out


def _leaves(folder: str, manifest: dict[str, Any], call: int | None = None) -> list[dict[str, Any]]:
    """Summarise the entry's tree file (or, for ``call`` of a group, its tree in the group's data file); each row
    gains ``bytes`` (``None`` when held in the JSON tree)."""
    from skipweave.store.format import jsonio
    from skipweave.store.format import tree as codec_tree

    names = [str(i.get("name")) for i in manifest.get("payload", []) if isinstance(i, dict)]
    if call is not None:
        from skipweave.store.format.group import read_tree

        tree = jsonio.loads(read_tree(os.path.join(folder, names[0]), call))
        return [{**row, "bytes": _leaf_bytes(row)} for row in codec_tree.summarize(tree)]
    tree_name = next((n for n in names if n.endswith(".tree.json")), None)
    if tree_name is None:
        raise ValueError("the manifest lists no tree file")
    from skipweave.store.fs import open_regular

    with open(open_regular(os.path.join(folder, tree_name)), "rb") as fh:  # never through a symlink
        tree = jsonio.loads(fh.read())  # (as a replay reads it: surrogates in its strings included)
    return [{**row, "bytes": _leaf_bytes(row)} for row in codec_tree.summarize(tree)]


TORCH_ITEMSIZE = {
    "bool": 1, "uint8": 1, "int8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1,
    "float8_e5m2fnuz": 1, "int16": 2, "uint16": 2, "float16": 2, "bfloat16": 2, "int32": 4, "uint32": 4,
    "float32": 4, "int64": 8, "uint64": 8, "float64": 8, "complex64": 8, "complex128": 16,
}
"""Bytes per element of the torch dtypes the codec writes (``str(dtype)`` without ``torch.``), so ``show``
needs no torch import (~2-3 s); a dtype missing here shows no size."""


def _leaf_bytes(row: dict[str, Any]) -> int | None:
    """Bytes a tensor or numeric array leaf takes in the tensor file, from its dtype and shape."""
    import numpy as np

    numel = 1
    for n in row["shape"]:
        numel *= int(n)
    if row["kind"] == "tensor":
        size = TORCH_ITEMSIZE.get(str(row["dtype"]).removeprefix("torch."))
        return None if size is None else numel * size
    if row["kind"] == "ndarray":
        try:
            dt = np.dtype(row["dtype"])
        except TypeError:
            return None
        return None if dt.kind in ("O", "U", "S") else numel * dt.itemsize
    return None


def run(args: argparse.Namespace) -> int:
    """Show one entry; return 0 (valid), 1 (corrupt or refused), 2 (``PATH`` is not an entry) or 3 (foreign: of a
    format version this skipweave does not read)."""
    try:
        inside_bundle = split_bundle_path(args.path)
        if inside_bundle is not None:
            doc = describe_in_bundle(*inside_bundle, call=args.call, checksums=args.verify,
                                     allow_pickle=args.allow_pickle, resolve_manifest=resolve_manifest,
                                     describe=describe)
        else:
            manifest_path, call = resolve_manifest(args.path, args.call)
            doc = describe(manifest_path, checksums=args.verify, allow_pickle=args.allow_pickle, call=call)
    except (NotAnEntry, NotInBundle) as exc:
        print(f"skipweave show: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except FileNotFoundError as exc:
        print(f"skipweave show: no manifest {exc.filename or ''}: the entry was never committed "
              "(its writer stopped before the manifest); `skipweave gc` removes such files", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        emit_json(doc)
    else:
        emit(render(doc, all_rows=args.all))
    if doc["status"] == "foreign":
        return EXIT_FOREIGN
    return EXIT_CORRUPT if doc["status"] in ("corrupt", "refused") else EXIT_OK


def _environment_lines(env: dict[str, Any]) -> list[str]:
    """The human lines of the entry's environment: one per field, what a replay compares with its own."""
    if env["error"]:
        return [f"environment INVALID: {env['error']} (a replay takes it for another environment)"]
    if not env["fields"]:
        return ["environment none recorded (written before skipweave recorded environments: never compared)"]
    rows = [[name, repr(value) if name.startswith("config ") else str(value)] for name, value in env["fields"].items()]
    return ["environment (compared on replay, skip.<role>.fingerprint.on_env_mismatch):",
            *("  " + r for r in table(rows))]


def render(doc: dict[str, Any], *, all_rows: bool = False) -> str:
    """Return the human view of a ``skipweave.show/1`` document."""
    m = doc["manifest"]
    lines = [f"entry     {doc['path']}"]
    if doc["status"] == "foreign":
        by = f"written by skipweave {doc['written_by']}" if doc["written_by"] else "writer unknown"
        lines.append(f"status    FOREIGN: format version {doc['format_version']} ({by}); this skipweave does not "
                     "read it: kept as it is, never served here (upgrade skipweave to read it)")
    elif doc["status"] == "corrupt":
        lines.append(f"status    CORRUPT: {doc['reason']}")
    elif doc["status"] == "refused":
        lines.append(f"status    REFUSED: {doc['reason']} (or pass --allow-pickle)")
    else:
        lines.append("status    valid (" + ("sizes and checksums match" if doc["checksums_checked"]
                                          else "sizes match; --verify checks checksums") + ")")
    if m is None:
        return "\n".join(lines)
    from skipweave.store.format.manifest import seconds_of

    writer = m.get("writer") if isinstance(m.get("writer"), dict) else {}  # a corrupt entry is shown too
    versions = m.get("versions") if isinstance(m.get("versions"), dict) else {}
    created = m.get("created_unix") if isinstance(m.get("created_unix"), int | float) else None
    lines += [
        f"key       role {m.get('role')}  target {m.get('target')}  step {m.get('step')}  "
        f"call {m.get('call_index')}  shard {m.get('shard')}",
        f"target    {m.get('target_path', '-')}",
        f"created   {human_time(created)} by {writer.get('argv0') or '?'} "
        f"(pid {writer.get('pid', '?')} on {writer.get('host', '?')})",
        f"duration  {seconds_of(m):.3f} s of generation (what a replay saves)",
        f"inputs    fingerprint {m.get('input_fingerprint')}",
        f"pickled   {'yes (loading needs allow_pickle: true)' if m.get('pickled') else 'no'}",
        "versions  " + ", ".join(f"{k} {v}" for k, v in versions.items()),
        *_environment_lines(doc.get("environment") or environment_of(m)),
        "payload files:",
    ]
    rows = [["NAME", "BYTES", "STATE", "CHECKSUM"]]
    for f in doc["payload"]:
        size = f["bytes"]  # as the manifest says: a crafted one may hold anything
        rows.append([str(f["name"]), human_bytes(size) if type(size) is int and size >= 0 else repr(size), f["state"],
                     str(f["checksum"])])
    lines += ["  " + r for r in table(rows)]
    if doc["summary_error"]:
        lines.append(f"payload summary unavailable: {doc['summary_error']}")
        return "\n".join(lines)
    res = doc["result"]
    tensor_bytes = sum(r["bytes"] or 0 for r in res)
    lines.append(f"result: {len(res)} leaves, {human_bytes(tensor_bytes)} in tensors")
    rows = [["PATH", "KIND", "DTYPE", "SHAPE", "BYTES"]]
    shown = res if all_rows else res[:_MAX_ROWS]
    for r in shown:
        rows.append([r["path"] or "(root)", r["kind"], str(r["dtype"]), str(list(r["shape"])),
                     "-" if r["bytes"] is None else human_bytes(r["bytes"])])
    lines += ["  " + r for r in table(rows)]
    if len(shown) < len(res):
        lines.append(f"  ... {len(res) - len(shown)} more leaves (--all lists them)")
    if doc["rng"]:
        lines.append(f"rng state: {len(doc['rng'])} leaves, "
                     f"{human_bytes(sum(r['bytes'] or 0 for r in doc['rng']))} in tensors (restored on replay)")
    else:
        lines.append("rng state: none recorded")
    return "\n".join(lines)

