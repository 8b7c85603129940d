"""Which versions of the format this code writes and reads, and the one judgement of a file's version.

A recording outlives the code that wrote it: users keep stores for weeks, share them across machines, and run
clusters where one node is upgraded before another. So a version this code does not read is never taken for
damage. An entry or group file whose ``format_version`` is an integer outside :data:`READABLE` is *foreign*
(:class:`~skipweave.store.errors.EntryForeign`): a run never serves it, never sets it aside and never records over
it (the call runs live), ``gc`` and retention never remove it, ``migrate`` never rewrites it, and the CLI lists it
with its version and the skipweave that wrote it. Only a file that is not a version at all (no integer) is invalid.

What each version added (docs/format.md "Versions and migration"):

- **1** (skipweave 0.1.x): the manifest, group files, codec trees.
- **2** (skipweave 0.2.0 and later): the manifest names the skipweave that wrote it (``skipweave_version``) and
  how its input fingerprint was taken (``fingerprint_rule``: ``"signature"``, the call's arguments bound to the
  target's signature, or ``"arguments"``, as passed, the rule of every format-1 entry); a call of a plain ``def``
  that returned an awaitable says so (``returned: "awaitable"``) and is replayed as one.

Every version this code ever wrote stays in :data:`READABLE`; ``skipweave migrate`` rewrites older entries to
:data:`FORMAT_VERSION` when a user wants it, never because a run needs it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from skipweave.store.errors import EntryForeign, EntryInvalid

SIGNATURE = "signature"
"""The ``fingerprint_rule`` of a digest taken over the call's arguments bound to the target's signature."""

ARGUMENTS = "arguments"
"""The ``fingerprint_rule`` of a digest taken over the call's arguments as passed (every format-1 entry's)."""

FINGERPRINT_RULES = (SIGNATURE, ARGUMENTS)
"""``fingerprint_rule`` values: ``signature`` binds a call's arguments to the target's signature before hashing
(``gen(b, 3)``, ``gen(b, step=3)`` and ``gen(batch=b, step=3)`` are one fingerprint), ``arguments`` hashes them as
passed (format 1)."""


@dataclass(frozen=True)
class VersionReader:
    """How the manifests of one format version read: what the version added, and the meaning of its fields where an
    older version lacks them. The engine asks :func:`reader_of` a checked manifest instead of testing versions.

    Attributes:
        version: the ``format_version``.
        added: what the version added, for people (docs/format.md's version table).
        default_rule: the fingerprint rule of a manifest that names none.
        names_rule: the version's manifests may name their rule (``fingerprint_rule``); else ``default_rule`` holds.
        says_returned: the version's manifests may say a plain ``def`` returned an awaitable (``returned``).
    """

    version: int
    added: str
    default_rule: str
    names_rule: bool
    says_returned: bool

    def fingerprint_rule(self, manifest: Mapping[str, Any]) -> str:
        """How ``manifest``'s ``input_fingerprint`` was taken, one of :data:`FINGERPRINT_RULES`."""
        rule = manifest.get("fingerprint_rule", self.default_rule) if self.names_rule else self.default_rule
        return rule if rule in FINGERPRINT_RULES else self.default_rule

    def returned(self, manifest: Mapping[str, Any]) -> str | None:
        """``"awaitable"`` when the recorded value is what an awaitable returned by a plain ``def`` resolved to."""
        value = manifest.get("returned") if self.says_returned else None
        return value if isinstance(value, str) else None


READERS: dict[int, VersionReader] = {
    1: VersionReader(1, "manifests, group files of small entries, codec trees, environments", ARGUMENTS,
                     names_rule=False, says_returned=False),
    2: VersionReader(2, "skipweave_version, fingerprint_rule (signature-bound fingerprints), returned, migrated",
                     SIGNATURE, names_rule=True, says_returned=True),
}
"""A reader per version this code knows; every version it ever wrote stays here."""

FORMAT_VERSION = max(READERS)
"""The version of every manifest and group file this code writes."""

READABLE: frozenset[int] = frozenset(READERS)
"""The versions this code reads; every other integer version is foreign. Read at each call, so a test can simulate
an older reader by setting it to ``frozenset({1})``."""

_WRITER_MAX = 64
_INT64 = 2.0**63


def written_by(data: Mapping[str, Any]) -> str | None:
    """The skipweave version a manifest or group file says wrote it (``skipweave_version``, or format 1's
    ``versions.skipweave``), ``None`` when it says none readable. Bounded and printable: it is shown to people."""
    found = data.get("skipweave_version")
    if not isinstance(found, str):
        versions = data.get("versions")
        found = versions.get("skipweave") if isinstance(versions, Mapping) else None
        if not isinstance(found, str):
            return None
    return found[:_WRITER_MAX] if found.isprintable() else found[:_WRITER_MAX].encode("unicode_escape").decode()


def version_of(data: Any, path: str, what: str = "manifest") -> int:
    """The format version of a parsed manifest or group file that this code reads.

    Args:
        data: the parsed JSON.
        path: the file, for messages.
        what: ``"manifest"`` or ``"group"``, for messages.

    Returns:
        The version, a member of :data:`READABLE`.

    Raises:
        EntryForeign: an integer version this code does not read (newer, or unknown): the file is kept as it is.
        EntryInvalid: no JSON object, or no integer ``format_version``.
    """
    found = data.get("format_version") if isinstance(data, dict) else None
    if type(found) is float and found.is_integer() and abs(found) >= _INT64:
        # a JSON integer beyond 64 bits, which jsonio (orjson) reads as a float: still an integer version, so foreign
        # (kept), never taken for damage; its value is shown as that float's (close, not exact)
        found = int(found)
    if type(found) is not int:
        shown = found if isinstance(data, dict) else type(data).__name__
        raise EntryInvalid(f"{what} {path} has format_version {shown!r:.40}, not a version number")
    if found not in READABLE:
        writer = written_by(data)
        by = f"written by skipweave {writer}" if writer else "by an unknown skipweave"
        upgrade = (f"Upgrade skipweave to at least {writer} to use it" if writer and _newer(writer)
                   else f"Use a skipweave that reads format {found} to use it")
        raise EntryForeign(f"{what} {path} is of format version {found} ({by}); this skipweave reads versions "
                           f"{readable_text()}: it is kept as it is and never served here. {upgrade}", path=path,
                           version=found, writer=writer, what=what)
    return found


def reader_of(manifest: Mapping[str, Any]) -> VersionReader:
    """The :class:`VersionReader` of a manifest that passed :func:`version_of` (an unknown version reads as the
    newest: only checked manifests are asked)."""
    version = manifest.get("format_version")
    return READERS.get(version, READERS[FORMAT_VERSION]) if type(version) is int else READERS[FORMAT_VERSION]


def fingerprint_rule(manifest: Mapping[str, Any]) -> str:
    """How a readable manifest's ``input_fingerprint`` was taken (one of :data:`FINGERPRINT_RULES`): format 1 always
    ``arguments``; format 2 as its ``fingerprint_rule`` says (``signature`` when absent)."""
    return reader_of(manifest).fingerprint_rule(manifest)


def _newer(writer: str) -> bool:
    """Whether ``writer`` names a skipweave release newer than this one (then it is the one to upgrade to); a version
    that cannot be compared is not."""
    from packaging.version import InvalidVersion, Version

    from skipweave.version import __version__

    try:
        return Version(writer) > Version(__version__)
    except InvalidVersion:
        return False


def readable_text() -> str:
    """The versions this code reads, for messages: ``"1 and 2"``."""
    known = sorted(READABLE)
    return " and ".join([", ".join(str(v) for v in known[:-1]), str(known[-1])]) if len(known) > 1 else str(known[0])


__all__ = ["ARGUMENTS", "FINGERPRINT_RULES", "FORMAT_VERSION", "READABLE", "READERS", "SIGNATURE", "VersionReader",
           "fingerprint_rule", "readable_text", "reader_of", "version_of", "written_by"]
