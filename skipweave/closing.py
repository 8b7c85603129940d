"""What a woven plan's end says of each role: the WARNINGs for what a user asked for and did not happen (a target
never woven or never called, a role none of whose calls was eligible, a role whose every call its bypass rule took
for a validation call), and the findings of :mod:`skipweave.failures` a strict run ends with (a target never
woven, a role that recorded and replayed nothing). Called by :func:`skipweave.report.end_plan` with the plan's
accounts (:mod:`skipweave.accounts`).
"""

from __future__ import annotations

import logging

from skipweave import failures
from skipweave.accounts import Expected, TargetCounters

logger = logging.getLogger("skipweave")

__all__ = ["judge_role", "judges_run", "warn_silent_targets", "warn_validation_only"]


def warn_silent_targets(role: str, names: list[str], targets: dict[tuple[str, str], TargetCounters],
                         expected: dict[tuple[str, str], Expected], unreached: list[str] | None = None) -> None:
    """The exit WARNINGs of one role: targets no process of the run called; a role with no eligible call.

    ``unreached``: a call of the run raised ReplayMissing: the targets never called are added to this list (said
    in one line with it) instead of being warned about one by one."""
    any_called = any_eligible = False
    for target in names:
        counts = targets.get((role, target), TargetCounters())
        exp = expected.get((role, target))
        called = counts.called or (exp is not None and exp.elsewhere("called"))
        any_called = any_called or called
        any_eligible = any_eligible or counts.eligible or (exp is not None and exp.elsewhere("eligible"))
        why = exp.unwoven() if exp is not None and not called else None
        if why and exp is not None and exp.elsewhere("woven"):
            why = None  # another process of the run (a Ray worker) wove it
        if why == "":
            continue  # optional, and its host is not in this program
        if why is not None:
            logger.warning(
                "skipweave: role %s target %s (%s) was never woven: %s; nothing was recorded or replayed for it "
                "(key skip.%s.targets.%s)", role, target, exp.path if exp else "?", why, role, target,
            )
            if judges_run():
                failures.note(failures.NEVER_WOVEN, role, f"skip.{role}.targets.{target}",
                              f"target {target} ({exp.path if exp else '?'}) was never woven")
        elif not called and exp is not None and unreached is not None:
            unreached.append(f"role {role} target {target} ({exp.path})")
        elif not called and exp is not None:
            logger.warning(
                "skipweave: role %s target %s (%s) was woven but never called in this run; check that the path "
                "names the method the trainer really calls (an override in a subclass, a copy taken by "
                "'from module import name' before weaving, or a method of another class run by the workers)",
                role, target, exp.path,
            )
    if any_called and not any_eligible and any(r == role for r, _ in expected):
        steps = next((e.steps for (r, _), e in expected.items() if r == role), "?")
        unread = failures.unread_of(role)
        if unread:
            calls = sum(targets.get((role, t), TargetCounters()).bypasses for t in names)
            _warn_unread(role, unread, calls, steps)
            return
        logger.warning(
            "skipweave: role %s: none of its calls was eligible, so nothing was recorded or replayed: each was a "
            "validation call or its step lies outside skip.%s.steps=%s; check the steps and skip.%s.step "
            "(where the step is read) and skip.%s.bypass", role, role, steps, role, role,
        )


def _warn_unread(role: str, unread: list[failures.Finding], calls: int, steps: str) -> None:
    """The closing WARNING of a role none of whose calls was eligible because its step or bypass could not be read:
    names the key, the expression and what it raised, on how many of the role's calls (in this process)."""
    causes = "; ".join(f"{f.text} (on {f.count} of its {max(calls, f.count)} calls)" for f in unread)
    rest = "" if sum(f.count for f in unread) >= calls else (
        f"; the others were validation calls or their step lies outside skip.{role}.steps={steps}")
    logger.warning("skipweave: role %s: none of its calls was eligible, so nothing was recorded or replayed: %s%s; "
                   "fix %s", role, causes, rest, ", ".join(dict.fromkeys(f.key for f in unread)))


def judge_role(role: str, names: list[str], targets: dict[tuple[str, str], TargetCounters],
                expected: dict[tuple[str, str], Expected]) -> None:
    """Note a role that records or replays (every action but ``verify``) and did neither in this run, as a finding of
    :mod:`skipweave.failures` (the WARNINGs before it, or a record failure's, said why). Judged by the run's first
    process only (:func:`judges_run`). Calls of this process count first; a process with no eligible call of the role
    (a driver whose workers make the calls) reads the run marks of the others."""
    own = [e for (r, _), e in expected.items() if r == role]
    if not own or not any(e.records for e in own) or not judges_run():
        return
    counts = [targets.get((role, t), TargetCounters()) for t in names]
    if any(c.hits or c.stored > 0 for c in counts):
        return
    if any(c.eligible for c in counts):
        if any(e.elsewhere("recorded") for e in own):  # another process recorded while these calls' records failed
            return
    elif any(e.elsewhere("eligible") or e.elsewhere("recorded") for e in own):
        return
    failures.note(failures.DID_NOTHING, role, f"skip.{role}", f"role {role} recorded and replayed nothing")


def judges_run() -> bool:
    """Whether this process judges the run as a whole (a target never woven, a role that did nothing) for
    :mod:`skipweave.failures`: it made the run id (the first process; it ends after the others and reads their marks).
    A process that inherited it (a subprocess, a Ray worker, a ``torchrun`` rank) warns as ever, but its view is its
    own and may come before the others' calls: it notes only the failures of its own calls."""
    from skipweave.store.identity import made_here

    return made_here() is not None


def warn_validation_only(role: str, names: list[str], targets: dict[tuple[str, str], TargetCounters],
                          expected: dict[tuple[str, str], Expected]) -> None:
    """The exit WARNING of a role whose calls reached the store, every one as a validation call: its bypass rule
    took them all (verl's reward rule on a trainer whose batches lack ``global_token_num``), so they were kept apart
    from training calls and no training call was ever recorded or replayed, run after run."""
    mine = [(targets.get((role, t), TargetCounters()), expected.get((role, t))) for t in names]
    if not any(exp is not None for _, exp in mine):
        return
    if any(c.training or (e is not None and e.elsewhere("training")) for c, e in mine):
        return
    if not any(c.validation or (e is not None and e.elsewhere("validation")) for c, e in mine):
        return
    rule = next((e.bypass for _, e in mine if e is not None and e.bypass), f"skip.{role}.bypass")
    logger.warning(
        "skipweave: role %s: none of its calls was a training call: the bypass rule %s took every one for a "
        "validation call, so they were kept apart (shard val_<shard>: recorded for, and served only in, replay-only "
        "runs) and no training call was recorded or replayed; if they are training calls, set skip.%s.bypass to "
        "what tells this trainer's validation calls apart (skip.%s.bypass.expr=...), or skip.%s.bypass=null when "
        "it has none (docs/phases.md#a-trainer-that-is-not-verl)", role, rule, role, role, role)
