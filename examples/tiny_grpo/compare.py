"""Run the tiny GRPO job six times over one dump dir and compare: record every phase, replay, replay-only, only the
update, a new reward on recorded rollouts, verify.

Usage::

    python examples/tiny_grpo/compare.py [--dump-dir DIR] [--out-dir DIR] [--no-skip] [hydra overrides...]

Every run executes ``train.py`` with the same interpreter (``sys.executable``), ``skip.rollout.dump_dir=<dump
dir> hydra.run.dir=<out dir>/run{1..6}`` and any extra Hydra overrides given on this command line:

1. ``+skip=[rollout_cache,ref_cache,reward_cache]`` into a fresh dump dir: records every phase of every step
   (rollout, reference log-probs, rewards; validation apart);
2. ``+skip=rollout_cache``: replays the rollouts (the Ray rollout workers still started); reference and reward live;
3. ``+skip=rollout_replay``: replay-only rollouts, validation served too, no rollout worker started (the config's
   ``rollout_engine`` stub gives the trainer a stand-in manager);
4. ``+skip=update_only``: every phase but the update replayed, replay-only: no rollout or reference worker, no judge
   (the stubs of the config), no Ray cluster;
5. ``+skip=[rollout_cache,ref_cache]`` with a new reward (``--reward-change``, default ``reward.judge_weight=1.0``):
   "try a new reward on recorded rollouts": rollouts and reference log-probs replayed, only the reward recomputed;
   the rollouts' own scores (``rule_mean``, ``judge_mean``) are run 1's at every step, the reward and the update not;
6. ``+skip=rollout_verify`` with one changed setting (``--verify-change``, default ``actor.lr=0.02``: only the
   update changes, so step 1's rollout is as recorded and the rollouts first differ at step 2): every rollout runs
   live and is compared with its recording; the script prints the first diverging step, call, field and token
   from the run's report (``run6/skipweave-verify.jsonl``). ``--verify-change ''`` changes nothing: every step is
   identical.

The script prints a per-step table of rollout wall times and cache statuses, checks that ``loss``,
``reward_mean``, ``param_checksum`` and the validation rewards are exactly equal in runs 1-4, shows each run's wall
time, the phases it ran live (from ``metrics.jsonl``: a phase ran live unless skipweave replayed it) and the workers
it started, and exits non-zero when they differ, when a replayed phase ran live, when run 3 started a rollout
worker or run 4 any worker, or when run 6 does not find the first divergence where the change puts it (step 2 for a
change of the update, none for no change).

``--no-skip`` runs the job twice without any profile (two live runs): the metrics must still be identical
because the trainer is fully seeded.

Exit codes: 0 success, 1 metrics differ / a replayed phase ran live / workers started, 2 a run failed.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TRAIN_SCRIPT = HERE / "train.py"
COMPARED_KEYS = ("loss", "reward_mean", "param_checksum")
PHASES = ("rollout", "reward", "ref")
"""The phases of a step of this job that skipweave's profiles may replay (``metrics.jsonl``'s ``phases``)."""
ROLLOUT_SCORES = ("rule_mean", "judge_mean", "response_length_mean")
"""What a step's rollout alone decides: equal in a run that replays the rollouts, whatever its reward or update."""
_PLAIN_VALUE = re.compile(r"^[A-Za-z0-9_/.\-:+]+$")


def hydra_value(value: str | Path) -> str:
    """Quote ``value`` for a Hydra override when it holds characters the grammar treats specially."""
    text = str(value)
    if _PLAIN_VALUE.match(text):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def build_command(run_dir: Path, dump_dir: Path | None, overrides: Sequence[str],
                  profile: str = "rollout_cache") -> list[str]:
    """The ``train.py`` command line of one run (``dump_dir=None``: no profile, a live run); ``profile`` is one
    name or several in Hydra's list syntax (``[rollout_cache,ref_cache]``)."""
    cmd = [sys.executable, str(TRAIN_SCRIPT)]
    if dump_dir is not None:
        cmd += [f"+skip={profile}", f"skip.rollout.dump_dir={hydra_value(dump_dir)}"]
    cmd.append(f"hydra.run.dir={hydra_value(run_dir)}")
    cmd += list(overrides)
    return cmd


def verify_summary(run_dir: Path, change: str) -> dict[str, Any]:
    """What the verify run found, from its report (one JSON line per verified call, skipweave.verify.report):
    counts, the training steps by status, and the first diverging training call described.

    A change of the update (e.g. ``actor.lr``) leaves step 1's rollout as recorded and changes every rollout
    after it, so the first divergence must be at step 2; no change: every step identical.
    """
    from skipweave.verify.report import describe, read_lines, tally

    report = run_dir / "skipweave-verify.jsonl"
    lines = list(read_lines(str(report))) if report.exists() else []
    train = [x for x in lines if not x.get("validation")]
    found = tally(train)
    steps = sorted({x["step"] for x in train})
    expected = (2 if len(steps) > 1 else None) if change else None
    first = found.first if found.first is not None and found.first.get("status") == "diverged" else None
    return {
        "report": str(report),
        "change": change,
        "counts": tally(lines).counts,
        "statuses": {str(x["step"]): x["status"] for x in train},
        "first_step": first["step"] if first else None,
        "first": describe(first) if first else None,
        "first_line": first,
        "expected_first_step": expected,
        "ok": bool(train) and (first["step"] if first else None) == expected
        and all(x["status"] == "identical" for x in train if expected is None or x["step"] < expected),
    }


def run_job(name: str, cmd: list[str], log_path: Path, timeout: float | None) -> float:
    """Run one training job with its output captured in ``log_path``; returns its wall seconds.

    Raises:
        RuntimeError: if the job exits non-zero or times out (the log tail is included).
    """
    print(f"[compare] {name}: {' '.join(cmd)}", flush=True)
    start = time.perf_counter()
    with log_path.open("w", encoding="utf-8") as log:
        try:
            proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=timeout, check=False)
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"{name} timed out after {timeout}s\n{tail(log_path)}") from exc
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed with exit code {proc.returncode}\n{tail(log_path)}")
    print(f"[compare] {name}: done in {seconds:.1f}s (log: {log_path})", flush=True)
    return seconds


def tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a text file."""
    text = path.read_text(encoding="utf-8", errors="replace").splitlines()
    return "\n".join(text[-lines:])


def read_metrics(path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Split a ``metrics.jsonl`` into (training lines, validation lines)."""
    train: list[dict[str, Any]] = []
    val: list[dict[str, Any]] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            record = json.loads(line)
            (val if record.get("val") else train).append(record)
    return train, val


def same(a: Any, b: Any) -> bool:
    """Exact equality (floats compared bit-for-bit via their JSON values; NaN never matches)."""
    if isinstance(a, float) and math.isnan(a):
        return False
    return type(a) is type(b) and a == b


def compare_runs(run1: Path, run2: Path, expect_hits: bool) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Compare two run dirs; returns (per-step rows, summary)."""
    train1, val1 = read_metrics(run1 / "metrics.jsonl")
    train2, val2 = read_metrics(run2 / "metrics.jsonl")
    by_step2 = {r["step"]: r for r in train2}
    rows: list[dict[str, Any]] = []
    for r1 in train1:
        r2 = by_step2.get(r1["step"])
        diff = [k for k in COMPARED_KEYS if r2 is None or not same(r1.get(k), r2.get(k))]
        rows.append(
            {
                "step": r1["step"],
                "run1_rollout_s": r1["rollout_seconds"],
                "run2_rollout_s": r2["rollout_seconds"] if r2 else None,
                "run1_skip": r1.get("skip", "off"),
                "run2_skip": r2.get("skip", "off") if r2 else "missing",
                "identical": not diff,
                "differs": diff,
            }
        )
    steps_match = [r["step"] for r in train1] == [r["step"] for r in train2] and bool(train1)
    val_identical = len(val1) == len(val2) and all(
        a["step"] == b["step"] and same(a["val_reward_mean"], b["val_reward_mean"])
        for a, b in zip(val1, val2, strict=False)
    )
    total1 = sum(r["run1_rollout_s"] for r in rows)
    total2 = sum(r["run2_rollout_s"] or 0.0 for r in rows)
    run2_all_hits = bool(rows) and all(r["run2_skip"] == "hit" for r in rows)
    identical = steps_match and all(r["identical"] for r in rows)
    workers = [sorted({r.get("rollout_workers") for r in train + val}, key=str) for train, val in
               ((train1, val1), (train2, val2))]
    summary = {
        "mode": "skip" if expect_hits else "no-skip",
        "steps": len(rows),
        "identical": identical,
        "val_identical": val_identical,
        "run1_statuses": [r["run1_skip"] for r in rows],
        "run2_statuses": [r["run2_skip"] for r in rows],
        "run2_all_hits": run2_all_hits,
        "run1_rollout_seconds": total1,
        "run2_rollout_seconds": total2,
        "rollout_ratio": total2 / total1 if total1 > 0 else math.inf,
        "run1_rollout_workers": workers[0],
        "run2_rollout_workers": workers[1],
        "run2_val_statuses": [r.get("skip", "off") for r in val2],
        "ok": identical and val_identical and (run2_all_hits or not expect_hits),
        "rows": rows,
    }
    return rows, summary


def print_table(rows: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    """Print the per-step comparison and totals."""
    header = (
        f"{'step':>4} | {'run-1 rollout s':>15} | {'run-2 rollout s':>15} | {'run-1 skip':>10} | "
        f"{'run-2 skip':>10} | identical"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        run2 = f"{r['run2_rollout_s']:.3f}" if r["run2_rollout_s"] is not None else "-"
        ident = "yes" if r["identical"] else "NO (" + ", ".join(r["differs"]) + ")"
        print(
            f"{r['step']:>4} | {r['run1_rollout_s']:>15.3f} | {run2:>15} | {r['run1_skip']:>10} | "
            f"{r['run2_skip']:>10} | {ident}"
        )
    print("-" * len(header))
    hits = sum(s == "hit" for s in summary["run2_statuses"])
    hit_text = f"{hits}/{summary['steps']} hit"
    print(
        f"{'all':>4} | {summary['run1_rollout_seconds']:>15.3f} | {summary['run2_rollout_seconds']:>15.3f} | "
        f"{'':>10} | {hit_text:>10} | "
        f"{'yes' if summary['identical'] else 'NO'}"
    )
    print(f"identical: {', '.join(COMPARED_KEYS)} equal at the step in both runs (values in run1/ and run2/ "
          "metrics.jsonl)")
    print(f"rollout time ratio run2/run1: {summary['rollout_ratio']:.4f}")
    print(f"validation rewards identical: {'yes' if summary['val_identical'] else 'NO'}")


def phase_summary(run_dir: Path) -> dict[str, Any]:
    """What a run computed live, from its ``metrics.jsonl``: per phase the number of calls (training steps and
    validations) that ran live (status other than ``hit``; ``off`` when no skipweave role wove it), the phases it ran
    live at some call, and the workers it started (the most any row reports)."""
    train, val = read_metrics(run_dir / "metrics.jsonl")
    live = {phase: sum(1 for r in train + val if phase in r.get("phases", {}) and r["phases"][phase] != "hit")
            for phase in PHASES}
    workers = {key: max((int(r.get(key, 0)) for r in train + val), default=0)
               for key in ("rollout_workers", "ref_workers", "judges")}
    return {"live_calls": live, "live_phases": [p for p in PHASES if live[p]], **workers}


def new_reward_summary(run1: Path, run5: Path, change: str) -> dict[str, Any]:
    """Run 5 (recorded rollouts and reference log-probs, a new reward): every rollout and reference call replayed,
    the rollouts' own scores (``ROLLOUT_SCORES``) equal to run 1's at every step; with a change, the reward differs
    from run 1's at some step (without one, at none)."""
    train1, _ = read_metrics(run1 / "metrics.jsonl")
    train5, _ = read_metrics(run5 / "metrics.jsonl")
    pairs = list(zip(train1, train5, strict=False))
    replayed = all(r["phases"].get("rollout") == "hit" and r["phases"].get("ref") == "hit" for r in train5)
    scores_same = all(same(a.get(k), b.get(k)) for a, b in pairs for k in ROLLOUT_SCORES)
    reward_changed = [b["step"] for a, b in pairs if not same(a["reward_mean"], b["reward_mean"])]
    ok = (bool(pairs) and len(train1) == len(train5) and replayed and scores_same
          and bool(reward_changed) == bool(change))
    return {"change": change, "replayed": replayed, "rollout_scores_identical": scores_same,
            "reward_changed_steps": reward_changed, "ok": ok}


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """Parse this script's options; everything else is passed through to ``train.py``."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog="Other arguments (e.g. trainer.total_steps=3) are passed to train.py as Hydra overrides.",
    )
    parser.add_argument(
        "--dump-dir", type=Path, default=None, help="rollout dump dir (default: <out-dir>/dump)"
    )
    parser.add_argument(
        "--out-dir", type=Path, default=None, help="where run1/ ... run6/ go (default: a temp dir)"
    )
    parser.add_argument("--no-skip", action="store_true", help="two live runs without +skip=rollout_cache")
    parser.add_argument("--reward-change", default="reward.judge_weight=1.0", metavar="OVERRIDE",
                        help="the new reward of run 5 (recorded rollouts and reference log-probs; default: "
                             "%(default)s; '' for none)")
    parser.add_argument("--verify-change", default="actor.lr=0.02", metavar="OVERRIDE",
                        help="the one setting run 6 (+skip=rollout_verify) changes (default: %(default)s; '' for none)")
    parser.add_argument("--summary-json", type=Path, default=None, help="also write the comparison as JSON")
    parser.add_argument("--timeout", type=float, default=600.0, help="per-run timeout in seconds")
    args, overrides = parser.parse_known_args(argv)
    return args, [o for o in overrides if o != "--"]


RECORD_ALL = "[rollout_cache,ref_cache,reward_cache]"
NEW_REWARD = "[rollout_cache,ref_cache]"


def view_command(cli: Path, dump_dir: Path, out_dir: Path, report: Path | None) -> str:
    """The line naming the ``skipweave view`` command that turns the store (and the verify run's report, when there is
    one) into one HTML page: steps, charts, samples, the first divergence side by side."""
    import shlex

    cmd = [str(cli), "view", str(dump_dir)]
    if report is not None and report.exists():
        cmd.append(str(report))
    cmd += ["-o", str(out_dir / "view.html")]
    return f"see the store in a browser: {shlex.join(cmd)}"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    args, overrides = parse_args(argv)
    out_dir: Path = args.out_dir or Path(tempfile.mkdtemp(prefix="tiny_grpo_compare_"))
    out_dir = out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    dump_dir: Path | None = None
    if not args.no_skip:
        dump_dir = (args.dump_dir or out_dir / "dump").resolve()
        if dump_dir.exists() and any(dump_dir.iterdir()):
            print(f"[compare] warning: dump dir {dump_dir} is not empty; run 1 may replay too", flush=True)
    print(f"[compare] mode={'no-skip' if args.no_skip else 'skip'} out_dir={out_dir} dump_dir={dump_dir}")
    runs: list[tuple[str, list[str]]] = [(RECORD_ALL, []), ("rollout_cache", [])]
    if not args.no_skip:
        runs += [("rollout_replay", []), ("update_only", []),
                 (NEW_REWARD, [args.reward_change] if args.reward_change else []),
                 ("rollout_verify", [args.verify_change] if args.verify_change else [])]
    run_dirs = [out_dir / f"run{i}" for i in range(1, len(runs) + 1)]
    wall: list[float] = []
    try:
        for i, (run_dir, (profile, extra)) in enumerate(zip(run_dirs, runs, strict=True), start=1):
            cmd = build_command(run_dir, dump_dir, [*overrides, *extra], profile)
            wall.append(run_job(f"run-{i}", cmd, out_dir / f"run{i}.log", args.timeout))
    except RuntimeError as exc:
        print(f"[compare] {exc}", file=sys.stderr, flush=True)
        return 2
    rows, summary = compare_runs(run_dirs[0], run_dirs[1], expect_hits=not args.no_skip)
    summary.update(
        {"out_dir": str(out_dir), "dump_dir": str(dump_dir) if dump_dir else None, "wall_seconds": wall,
         "profiles": [" ".join([profile, *extra]) for profile, extra in runs],
         "phases": [phase_summary(d) for d in run_dirs]}
    )
    print()
    print_table(rows, summary)
    failures: list[str] = []
    if not summary["identical"] or not summary["val_identical"]:
        failures.append("metrics differ between runs 1 and 2")
    if not args.no_skip and not summary["run2_all_hits"]:
        failures.append("run 2 was not served entirely from the rollout cache")
    if not args.no_skip:
        failures += check_replays(summary, run_dirs, wall)
        failures += check_new_reward(summary, run_dirs, args.reward_change)
        failures += check_verify(summary, run_dirs, args.verify_change, wall)
        print_phases(summary)
    else:
        print(f"wall time: run-1 {wall[0]:.1f}s, run-2 {wall[1]:.1f}s")
    if dump_dir is not None:
        cli = Path(sys.executable).parent / "skipweave"  # the venv's own command: no activation needed
        print(f"store kept in {dump_dir} (look inside: {cli if cli.exists() else 'skipweave'} ls {dump_dir}); "
              f"runs and logs in {out_dir}")
        print(view_command(cli if cli.exists() else Path("skipweave"), dump_dir, out_dir,
                           None if args.no_skip else run_dirs[-1] / "skipweave-verify.jsonl"))
    summary["failures"] = failures
    summary["ok"] = not failures
    if args.summary_json is not None:
        args.summary_json.parent.mkdir(parents=True, exist_ok=True)
        args.summary_json.write_text(json.dumps(summary, indent=2), encoding="utf-8")
    for failure in failures:
        print(f"[compare] FAIL: {failure}", file=sys.stderr)
    return 0 if summary["ok"] else 1


def check_replays(summary: dict[str, Any], run_dirs: list[Path], wall: list[float]) -> list[str]:
    """Runs 3 (replay-only rollouts) and 4 (update_only) against run 1: all hits, identical metrics and validation
    rewards, no worker of a replayed phase started; returns what failed."""
    failures: list[str] = []
    for key, index, name in (("replay_only", 2, "run 3 (rollout_replay)"), ("update_only", 3, "run 4 (update_only)")):
        _, replay = compare_runs(run_dirs[0], run_dirs[index], expect_hits=True)
        part = {k: v for k, v in replay.items() if k != "rows"}
        part["wall_ratio"] = wall[index] / wall[0] if wall[0] else math.inf
        summary[key] = part
        if not (replay["ok"] and all(s == "hit" for s in replay["run2_val_statuses"])):
            failures.append(f"{name} differs from run 1 or was not all hits")
        print(f"run-{index + 1} (+skip={summary['profiles'][index]}): "
              f"{sum(s == 'hit' for s in replay['run2_statuses'])}/{replay['steps']} rollouts hit, validation "
              f"{replay['run2_val_statuses'].count('hit')}/{len(replay['run2_val_statuses'])} hit, metrics and "
              f"validation rewards identical to run-1: "
              f"{'yes' if replay['identical'] and replay['val_identical'] else 'NO'}")
    started = summary["phases"]
    if started[2]["rollout_workers"]:
        failures.append("run 3 (rollout_replay) started rollout workers")
    if started[3]["live_phases"] or any(started[3][k] for k in ("rollout_workers", "ref_workers", "judges")):
        failures.append(f"run 4 (update_only) ran {started[3]['live_phases']} live or started workers")
    return failures


def check_new_reward(summary: dict[str, Any], run_dirs: list[Path], change: str) -> list[str]:
    """Run 5: a new reward on recorded rollouts and reference log-probs; returns what failed."""
    found = new_reward_summary(run_dirs[0], run_dirs[4], change)
    summary["new_reward"] = found
    changed = found["reward_changed_steps"]
    print(f"run-5 (+skip={summary['profiles'][4]}): rollouts and reference log-probs replayed: "
          f"{'yes' if found['replayed'] else 'NO'}; the rollouts' own scores ({', '.join(ROLLOUT_SCORES)}) as in "
          f"run-1: {'yes' if found['rollout_scores_identical'] else 'NO'}; reward differs from run-1 at "
          f"{len(changed)} of {summary['steps']} steps")
    return [] if found["ok"] else ["run 5 (a new reward on recorded rollouts) did not replay the rollouts and "
                                   "reference log-probs, or its rewards are not what the change makes them"]


def check_verify(summary: dict[str, Any], run_dirs: list[Path], change: str, wall: list[float]) -> list[str]:
    """Run 6, the verify run: prints what it found; returns what failed."""
    verify = verify_summary(run_dirs[5], change)
    summary["verify"] = verify
    what = f"with {change}" if change else "with nothing changed"
    statuses = ", ".join(f"step {k} {v}" for k, v in verify["statuses"].items())
    print(f"run-6 (+skip=rollout_verify {what}): every rollout ran live and was compared with run-1's: {statuses}")
    if verify["first"]:
        print(f"  first divergence: {verify['first']}")
    elif verify["statuses"]:
        print("  every step is identical to run-1's recording")
    print(f"  report: {verify['report']}")
    if verify["ok"]:
        return []
    return [f"run 6 (verify) found the first divergence at step {verify['first_step']}, expected "
            f"{verify['expected_first_step']}"]


def print_phases(summary: dict[str, Any]) -> None:
    """One line per run: its profiles, wall time (and ratio to run 1), what ran live, the workers it started."""
    wall = summary["wall_seconds"]
    print("per run: profiles | wall s (x run-1) | phases live (calls) | rollout workers, ref workers, judges")
    for i, (profile, phases, seconds) in enumerate(zip(summary["profiles"], summary["phases"], wall,
                                                       strict=True), start=1):
        live = ", ".join(f"{p} ({phases['live_calls'][p]})" for p in phases["live_phases"]) or "none"
        print(f"  run-{i} {profile}: {seconds:.1f}s ({seconds / wall[0]:.2f}x) | live: {live} | "
              f"{phases['rollout_workers']}, {phases['ref_workers']}, {phases['judges']}")


if __name__ == "__main__":
    sys.exit(main())
