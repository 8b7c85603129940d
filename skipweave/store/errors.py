"""The store's exceptions, in a module of their own so the lowest layers (:mod:`~skipweave.store.fs`) can raise them.

Each is re-exported where callers have always found it (``manifest.EntryInvalid``, ``step_store.StoreMoved``).
"""

from __future__ import annotations


class UnsafePath(OSError):
    """A path below a dump dir is a symlink, or not a folder (a file) where a folder is expected."""


class EntryInvalid(Exception):
    """A committed entry cannot be served: unreadable manifest, foreign format, missing or corrupt payload."""


class EntryRefused(EntryInvalid):
    """A sound entry that this process's policy does not serve: it holds pickled data and pickle is not allowed.

    A run sets it aside like any invalid entry (never deleting it); ``skipweave verify`` reports it apart from
    corrupt entries and ``skipweave gc`` keeps it (``--allow-pickle`` judges it as a run with
    ``allow_pickle=true`` would).
    """


class EntryForeign(Exception):
    """A committed entry or group file of a format version this skipweave does not read (newer, or unknown).

    Not an :class:`EntryInvalid`: nothing is wrong with it, this code is too old (or too new) for it. A run never
    serves it, sets it aside or records over it (the call runs live, ``skip.<role>.on_foreign`` says whether that is
    a warning or an error); ``gc``, retention and ``migrate`` never touch it; the CLI lists it as *foreign*.

    Attributes:
        path: the manifest or group file.
        version: its ``format_version``.
        writer: the skipweave version that wrote it, ``None`` when it says none.
        what: ``"manifest"`` or ``"group"``.
    """

    def __init__(self, message: str, *, path: str, version: int, writer: str | None, what: str = "manifest") -> None:
        super().__init__(message)
        self.path, self.version, self.writer, self.what = path, version, writer, what


class StoreMoved(OSError):
    """The folder an entry was being written into was moved or removed meanwhile; nothing was committed."""


__all__ = ["EntryForeign", "EntryInvalid", "EntryRefused", "StoreMoved", "UnsafePath"]
