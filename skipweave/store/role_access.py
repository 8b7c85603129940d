"""What the store's helpers may ask of one role's store: narrow protocols, below the StepStore facade.

:class:`~skipweave.store.step_store.StepStore` is the facade over a role's folders, indexes, committer and retainer.
Some of the helpers it holds need a little of it back: retention reads the role's folders and the state of its parts,
the retainer asks which steps the process still writes, and a resumed part writes grouped entries again as entries of
their own. Typed against the facade, each of them imported the module that holds them (an import circle of eight
modules, issue 43). They are typed against these protocols instead, which name only what each one uses; the facade
satisfies them (mypy checks it where it hands itself over), and this module imports nothing of the helpers.
"""

from __future__ import annotations

from typing import Any, Protocol

from skipweave.store.format.layout import EntryKey
from skipweave.store.identity import Recorded
from skipweave.store.index import PartInfo
from skipweave.store.read import Loaded
from skipweave.store.staging import Item, Staged


class RoleSteps(Protocol):
    """One role's store as retention and the retainer see it: where it lives, and what of it is still in use.

    Attributes:
        dump_dir: the store root (absolute).
        namespace: the run identity's folder under ``dump_dir``.
        role: the role's name (its folder under the namespace).
    """

    dump_dir: str
    namespace: str
    role: str

    def held_steps(self) -> set[int]:
        """The steps this process still writes or resumes (never removed under it)."""
        ...

    def key(self, step: int, target: str, shard: str, call: int) -> EntryKey:
        """The key of one call, its names checked as every path component (``UnsafePath``)."""
        ...

    def part_info(self, step: int, target: str, shard: str) -> PartInfo:
        """What the part's marker says (complete, closed, expected calls)."""
        ...

    def part_calls(self, step: int, target: str, shard: str) -> tuple[Recorded, ...]:
        """The calls the part holds, with who recorded each."""
        ...


class EntryRewriter(Protocol):
    """One role's store as a resumed part sees it when it writes grouped entries again as entries of their own."""

    def load(self, key: EntryKey) -> Loaded:
        """Read and verify one entry (``EntryInvalid``, ``EntryForeign``)."""
        ...

    def stage(self, result: Any, *, rng_state: dict[str, Any] | None, effects: dict[str, Any] | None = None,
              appended: dict[str, Any] | None = None) -> Staged:
        """Encode a result into what :meth:`commit_many` writes (the codec's ``CodecError``)."""
        ...

    def commit_many(self, items: list[Item]) -> list[tuple[int, EntryKey] | BaseException | None]:
        """Commit staged entries with one group sync; per item the bytes and key, or what failed."""
        ...


__all__ = ["EntryRewriter", "RoleSteps"]
