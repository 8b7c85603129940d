"""Import rollout caches written by verl itself into a skipweave store (``skipweave import-verl``).

verl's layouts, all under ``{dump_dir}/{exp}_{proj}/GBS{gbs}_N{n}_in{p}_out{r}/`` (the *shape folder*):

=====================================================  ========================================================
verl writer                                            layout below the shape folder
=====================================================  ========================================================
``RolloutSkip`` / ``AsyncRolloutSkip`` (verl 0.9)     ``{step}/gen_batch.dp`` + ``meta.json``
``RolloutSkip`` (verl 2025-2026, legacy keys)          ``genstep_{gen:06d}/{new_batch.dp, gen_batch.dp,
                                                       meta.json}`` + ``train_step__gen_step.txt``
``RolloutTqSkip`` (V1 trainer)                         ``{step}/{inner}/tq_batch.pt`` + ``meta.json``, or the
                                                       older ``{step}/tq_batch.pt``
=====================================================  ========================================================

Each becomes entries of the safe codec (no pickle) under ``{store}/{exp}_{proj}.GBS…/{role}/{step}/``,
the namespace the verl integration derives for the same run, so a run with ``+skip=rollout_cache``
replays them:

- ``gen_batch.dp`` → target ``verl_agent_loop`` (``verl_fully_async`` with ``--role async_rollout``),
  call 0 of its step. A legacy ``genstep`` folder's step is the ``global_steps`` of its ``meta.json``
  (else ``train_step__gen_step.txt``, else the gen step); several gen steps of one train step (DAPO)
  become calls 0, 1, … in gen-step order. ``new_batch.dp`` (the input batch) is not needed.
- ``tq_batch.pt`` → target ``verl_tq`` (what the V1 proxies read), inner index = call index.

``.dp`` and ``.pt`` files are pickles: loading one runs whatever code it names. Nothing is loaded
unless the caller passes ``trust_pickle=True`` (``--trust-pickle``); listing never loads.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skipweave.integrations.verl.namespace import namespace_of

logger = logging.getLogger(__name__)

GEN_BATCH = "gen_batch.dp"
META = "meta.json"
TQ_BATCH = "tq_batch.pt"
STEP_FILE = "train_step__gen_step.txt"
_GENSTEP_RE = re.compile(r"^genstep_(\d+)$")
TARGET_OF_ROLE = {"rollout": "verl_agent_loop", "async_rollout": "verl_fully_async"}
"""Target name a role's ``gen_batch.dp`` entries are filed under (the profiles' target names)."""


class TrustRequired(PermissionError):
    """Loading verl's pickled caches was not explicitly allowed."""


@dataclass
class Found:
    """One cached call found in a verl dump: where it is and where it goes.

    Attributes:
        path: the pickle file (``gen_batch.dp`` or ``tq_batch.pt``).
        kind: ``gen_batch`` or ``tq_batch``.
        namespace: skipweave namespace of its shape folder.
        step: training step.
        call: index of the call within the step.
    """

    path: Path
    kind: str
    namespace: str
    step: int
    call: int


@dataclass
class Report:
    """What an import did (or, with ``dry_run``, would do)."""

    found: list[Found] = field(default_factory=list)
    imported: int = 0
    skipped: int = 0
    bytes: int = 0

    def as_dict(self) -> dict[str, Any]:
        """A JSON-serialisable summary."""
        return {
            "found": [
                {"path": str(f.path), "kind": f.kind, "namespace": f.namespace, "step": f.step, "call": f.call}
                for f in self.found
            ],
            "imported": self.imported,
            "skipped": self.skipped,
            "bytes": self.bytes,
        }


def _is_int(name: str) -> bool:
    return name.isdigit()


def _shape_folders(root: Path) -> Iterator[Path]:
    """Yield every folder under ``root`` (itself included) that directly holds verl step folders."""
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        if STEP_FILE in filenames or any(_GENSTEP_RE.match(d) for d in dirnames) or any(
            _is_int(d) and _holds_step(here / d) for d in dirnames
        ):
            yield here
            dirnames[:] = []  # a shape folder's children are steps, not more shape folders


def _holds_step(folder: Path) -> bool:
    if (folder / GEN_BATCH).is_file() or (folder / TQ_BATCH).is_file():
        return True
    return any(_is_int(c.name) and (c / TQ_BATCH).is_file() for c in folder.iterdir() if c.is_dir())


def _namespace(shape: Path, override: str | None) -> str:
    """The namespace of a shape folder: its parent's name and its own, as the verl integration derives it."""
    return override or namespace_of(shape.parent.name, shape.name)


def _legacy_train_steps(shape: Path) -> dict[int, int]:
    """``gen step -> train step`` from ``train_step__gen_step.txt`` (the last line for a gen step wins)."""
    mapping: dict[int, int] = {}
    try:
        lines = (shape / STEP_FILE).read_text(encoding="utf-8", errors="ignore").splitlines()
    except OSError:
        return mapping
    for line in lines:
        parts = line.split()
        if len(parts) >= 2 and parts[0].lstrip("-").isdigit() and parts[1].lstrip("-").isdigit():
            mapping[int(parts[1])] = int(parts[0])
    return mapping


def _meta_step(folder: Path) -> int | None:
    try:
        value = json.loads((folder / META).read_text(encoding="utf-8")).get("global_steps")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def scan(root: str | os.PathLike[str], *, namespace: str | None = None) -> list[Found]:
    """List every cached call in a verl dump under ``root`` without loading any of them.

    Args:
        root: verl's ``dump_dir``, an ``{exp}_{proj}`` folder or a shape folder.
        namespace: file everything under this namespace instead of the derived one.

    Raises:
        FileNotFoundError: ``root`` is not a folder.
    """
    base = Path(root).expanduser().resolve()
    if not base.is_dir():
        raise FileNotFoundError(f"no folder {base}")
    found: list[Found] = []
    for shape in _shape_folders(base):
        ns = _namespace(shape, namespace)
        legacy: list[tuple[int, int, Path]] = []  # (train step, gen step, file)
        gen_to_train = _legacy_train_steps(shape)
        for child in sorted(shape.iterdir(), key=lambda p: p.name):
            if not child.is_dir():
                continue
            m = _GENSTEP_RE.match(child.name)
            if m and (child / GEN_BATCH).is_file():
                gen = int(m.group(1))
                train = _meta_step(child) or gen_to_train.get(gen, gen)
                legacy.append((train, gen, child / GEN_BATCH))
            elif _is_int(child.name):
                step = int(child.name)
                if (child / GEN_BATCH).is_file():
                    found.append(Found(child / GEN_BATCH, "gen_batch", ns, step, 0))
                if (child / TQ_BATCH).is_file():
                    found.append(Found(child / TQ_BATCH, "tq_batch", ns, step, 0))
                inner = sorted((int(c.name), c) for c in child.iterdir() if c.is_dir() and _is_int(c.name))
                for idx, folder in inner:
                    if (folder / TQ_BATCH).is_file():
                        found.append(Found(folder / TQ_BATCH, "tq_batch", ns, step, idx))
        calls: dict[int, int] = {}
        for train, _gen, path in sorted(legacy):
            found.append(Found(path, "gen_batch", ns, train, calls.get(train, 0)))
            calls[train] = calls.get(train, 0) + 1
    found.sort(key=lambda f: (f.namespace, f.kind, f.step, f.call))
    return found


def import_verl(
    root: str | os.PathLike[str],
    dump_dir: str | os.PathLike[str],
    *,
    trust_pickle: bool = False,
    role: str = "rollout",
    target: str | None = None,
    namespace: str | None = None,
    shard: str = "r0",
    dry_run: bool = False,
    overwrite: bool = False,
) -> Report:
    """Import the verl caches under ``root`` into the skipweave store ``dump_dir``.

    Args:
        root: verl's dump (see :func:`scan`).
        dump_dir: the skipweave store root (``skip.<role>.dump_dir``).
        trust_pickle: allow loading verl's pickles (required unless ``dry_run``).
        role: the skipweave role to file entries under (``rollout``; ``async_rollout`` for the async
            rollouter's caches).
        target: target name for ``gen_batch.dp`` entries (default from the role, see
            :data:`TARGET_OF_ROLE`); ``tq_batch.pt`` always goes to ``verl_tq``.
        namespace: override the derived namespace.
        shard: shard label of the entries (``r0``: the trainer's process).
        dry_run: only list what would be imported.
        overwrite: replace entries already in the store (default: keep them).

    Raises:
        TrustRequired: ``trust_pickle`` is false and this is not a dry run.
        FileNotFoundError: ``root`` is not a folder.
        ConfigError: ``role``, ``target``, ``namespace`` or ``shard`` is not a single folder name (each becomes a
            folder of the store; see :func:`skipweave.store.fs.check_name`), naming the option.
    """
    from skipweave.config.errors import ConfigError
    from skipweave.store.fs import NAME_RULE, name_problem

    for option, value in (("--role", role), ("--target", target), ("--namespace", namespace), ("shard", shard)):
        if value is not None and name_problem(value) is not None:
            raise ConfigError(option, value, NAME_RULE)
    report = Report(found=scan(root, namespace=namespace))
    if dry_run:
        return report
    if not trust_pickle:
        raise TrustRequired(
            f"verl's caches under {root} are pickles: loading one runs any code it names. Pass --trust-pickle "
            "(trust_pickle=True) if you trust whoever wrote them"
        )
    from skipweave.integrations.verl.tq import TQ_TARGET, flatten_fields
    from skipweave.store.step_store import StepStore

    gen_target = target or TARGET_OF_ROLE.get(role, "verl_agent_loop")
    store_root = os.path.abspath(os.path.expanduser(str(dump_dir)))
    stores: dict[str, StepStore] = {}
    parts: set[tuple[str, int, str]] = set()
    for item in report.found:
        store = stores.setdefault(item.namespace, StepStore(store_root, item.namespace, role))
        name = TQ_TARGET if item.kind == "tq_batch" else gen_target
        key = store.key(item.step, name, shard, item.call)
        result = _load(item)
        if item.kind == "tq_batch":
            result = {"fields": flatten_fields(result["tensordict"]), "keys": [str(k) for k in result["keys"]],
                      "tags": [dict(t) for t in result["tags"]], "global_steps": result.get("global_steps")}
        written = store.record(key, result, target_path=f"verl-import:{item.path}", fingerprint="",
                               rng_state=None, seconds=0.0, replace=overwrite)
        if written:
            report.imported += 1
            report.bytes += written
        else:
            report.skipped += 1
        parts.add((item.namespace, item.step, name))
    for ns, step, name in parts:
        stores[ns].close_part(step, name, shard)
    return report


def _load(item: Found) -> Any:
    """Unpickle one verl cache file (the caller has been told to trust it)."""
    if item.kind == "gen_batch":
        import pickle

        with open(item.path, "rb") as fh:
            return pickle.load(fh)  # noqa: S301 - explicitly trusted by the caller (--trust-pickle)
    import torch

    return torch.load(item.path, weights_only=False)  # noqa: S614 - explicitly trusted (--trust-pickle)
