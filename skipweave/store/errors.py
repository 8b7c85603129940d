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


class StoreMoved(OSError):
    """The folder an entry was being written into was moved or removed meanwhile; nothing was committed."""


__all__ = ["EntryInvalid", "EntryRefused", "StoreMoved", "UnsafePath"]
