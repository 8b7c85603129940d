"""Print the resolved config of every shipped profile, as a run reads it, as one JSON document.

Run it on two checkouts and compare the outputs to prove a change to the schema's defaults, a profile or a config
adapter leaves what the profiles resolve to as it was::

    PYTHONPATH=/path/to/old python bench/resolved_configs.py > old.json
    PYTHONPATH=/path/to/new python bench/resolved_configs.py > new.json
    python bench/resolved_configs.py --compare old.json new.json [--ignore-key convention]

Cases, each ``SkipConfig.to_config()`` after :func:`skipweave.config.load_skip_config` (the integrations loaded first,
as every entry point does):

- ``profile/<name>``: every profile of ``skipweave/conf/skip/`` composed alone (``compose_profile``), and the
  combinations the docs show;
- ``verl/<name>``: verl's own ``ppo_trainer`` config with ``+skip=<name>`` composed by Hydra (as ``main_ppo`` does),
  and with no profile (needs verl installed);
- ``legacy/<name>``: verl's legacy keys (``actor_rollout_ref.rollout.skip*``) in a verl-shaped config;
- ``tiny_grpo/<name>``: the main job's config (examples/tiny_grpo/config.yaml) with ``+skip=<name>``;
- ``generic/<name>``: configs of a trainer of one's own, written without any profile.

A verify role's ``report`` (a file name holding the time and pid) is printed as ``<report>``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DUMP = os.path.join(tempfile.gettempdir(), "skipweave-resolved-configs")


def _resolved(cfg: Any) -> Any:
    from skipweave.config import load_skip_config

    try:
        out = load_skip_config(cfg).to_config()
    except Exception as exc:  # noqa: BLE001 - a case that fails is a result to compare too
        return {"error": f"{type(exc).__name__}: {exc}"}
    for role in out["skip"].values():
        if isinstance(role, dict) and role.get("report") is not None:
            role["report"] = "<report>"
    return out


def _profiles() -> list[str]:
    return sorted(p.stem for p in (ROOT / "skipweave" / "conf" / "skip").glob("*.yaml"))


COMBINATIONS = ("rollout_cache,ref_cache,reward_cache", "rollout_cache,ref_cache,reward_cache,values_cache,"
                "old_log_prob_cache", "rollout_replay,reward_cache")


def profile_cases() -> Iterator[tuple[str, Any]]:
    from skipweave.config.profiles import compose_profile

    for name in (*_profiles(), *COMBINATIONS):
        try:
            cfg = compose_profile(name, overrides=[f"skip.rollout.dump_dir={DUMP}"] if "rollout" in name else [])
        except Exception:  # noqa: BLE001 - a profile without skip.rollout: no override
            cfg = compose_profile(name)
        yield f"profile/{name}", _resolved(cfg)


def _hydra(config_dir: str, config_name: str, overrides: list[str]) -> Any:
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name=config_name, overrides=overrides, return_hydra_config=True)


def verl_cases() -> Iterator[tuple[str, Any]]:
    try:
        import verl
    except ImportError:
        return
    from skipweave.integrations.hydra.callback import job_skip_config

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    identity = ["trainer.experiment_name=exp", "trainer.project_name=proj", "data.train_batch_size=4"]
    for name in ("rollout_cache", "rollout_repeat", "rollout_replay", "rollout_verify", "async_rollout_cache",
                 "ref_cache", "reward_cache", "values_cache", "old_log_prob_cache", "update_only", "off",
                 "[rollout_cache,ref_cache,reward_cache]"):
        cfg = _hydra(config_dir, "ppo_trainer", [f"+skip={name}", *identity])
        yield f"verl/{name}", _resolved(job_skip_config(cfg))
    yield "verl/(no profile)", _resolved(job_skip_config(_hydra(config_dir, "ppo_trainer", identity)))


def legacy_cases() -> Iterator[tuple[str, Any]]:
    """verl's legacy keys (verl 2025's ``skip_rollout``, verl 2026's ``skip`` block) in a verl-shaped config."""
    shape = {"trainer": {"experiment_name": "exp"}, "data": {"train_batch_size": 4}}
    yield "legacy/2025 keys", _resolved({**shape, "actor_rollout_ref": {"rollout": {
        "skip_rollout": True, "skip_dump_dir": DUMP}}})
    yield "legacy/2026 block", _resolved({**shape, "actor_rollout_ref": {"rollout": {"skip": {
        "enable": True, "dump_dir": DUMP, "action": "repeat"}}}})


def tiny_grpo_cases() -> Iterator[tuple[str, Any]]:
    from skipweave.integrations.hydra.callback import job_skip_config

    config_dir = str(ROOT / "examples" / "tiny_grpo")
    for name in ("rollout_cache", "rollout_replay", "rollout_verify", "update_only", "off",
                 "[rollout_cache,ref_cache,reward_cache]"):
        yield f"tiny_grpo/{name}", _resolved(job_skip_config(_hydra(config_dir, "config", [f"+skip={name}"])))


def generic_cases() -> Iterator[tuple[str, Any]]:
    yield "generic/targets only", _resolved({"skip": {"rollout": {"enable": True, "targets": {"gen": "m:f"}}}})
    yield "generic/step counter, bypass null", _resolved(
        {"skip": {"rollout": {"enable": True, "step": "counter", "bypass": None, "targets": {"gen": "m:f"}}}})


def snapshot() -> dict[str, Any]:
    import skipweave

    skipweave.load_integrations()
    out: dict[str, Any] = {}
    for cases in (profile_cases, verl_cases, legacy_cases, tiny_grpo_cases, generic_cases):
        out.update(cases())
    return out


def _without(value: Any, key: str) -> Any:
    if isinstance(value, dict):
        return {k: _without(v, key) for k, v in value.items() if k != key}
    if isinstance(value, list):
        return [_without(v, key) for v in value]
    return value


def compare(old_path: str, new_path: str, ignore: list[str]) -> int:
    """Print each case whose resolved config differs (key by key), and a summary; 1 when any differs."""
    old, new = (json.loads(Path(p).read_text()) for p in (old_path, new_path))
    for key in ignore:
        old, new = _without(old, key), _without(new, key)
    differ = 0
    for case in sorted(set(old) | set(new)):
        a, b = old.get(case), new.get(case)
        if a == b:
            continue
        differ += 1
        print(f"{case}:")
        for line in _diff(a, b, ""):
            print(f"    {line}")
    same = len(set(old) & set(new)) - differ + len(set(old) ^ set(new))
    print(f"{len(set(old) | set(new))} cases: {same} resolve to the same values, {differ} differ"
          + (f" (ignoring keys {ignore})" if ignore else ""))
    return 1 if differ else 0


def _diff(a: Any, b: Any, path: str) -> Iterator[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in list(a) + [k for k in b if k not in a]:
            yield from _diff(a.get(k, "<absent>"), b.get(k, "<absent>"), f"{path}.{k}" if path else k)
    elif a != b:
        yield f"{path}: {json.dumps(a)} -> {json.dumps(b)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--compare", nargs=2, metavar=("OLD", "NEW"), help="compare two printed snapshots")
    parser.add_argument("--ignore-key", action="append", default=[], help="a key left out of the comparison")
    args = parser.parse_args(argv)
    if args.compare:
        return compare(*args.compare, args.ignore_key)
    json.dump(snapshot(), sys.stdout, indent=1, sort_keys=True)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
