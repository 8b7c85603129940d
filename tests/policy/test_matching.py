"""Which entry of a part serves a call: inputs first, call order only for a lone writer, never a concurrent one's."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time

from skipweave.policy.matching import match_call
from skipweave.store.identity import Recorded, Writer, is_concurrent_other

ME = Writer("run-now", platform.node(), os.getpid())
STARTED = 1000.0
EARLIER = ("run-before", platform.node(), 999_999_999)  # a process of an earlier run, long gone


def rec(call: int, fp: str, writer: tuple[str, str, int] | None = EARLIER, created: float = 10.0,
        concurrent: bool = False) -> Recorded:
    return Recorded(call, fp, writer, created, concurrent)


def match(recorded: list[Recorded], position: int, fp: str, claimed: set[int] | None = None,
          same_step: bool = True) -> int | None:
    return match_call(recorded, position, lambda rule: fp, claimed or set(), same_step=same_step, me=ME,
                      started=STARTED).call


def test_the_entry_recorded_for_the_same_inputs_wins_over_call_order() -> None:
    part = [rec(0, "a"), rec(1, "b"), rec(2, "c")]
    assert match(part, 0, "c") == 2
    assert match(part, 2, "a") == 0


def test_identical_inputs_take_the_part_s_entries_in_turn() -> None:
    part = [rec(0, "a"), rec(1, "a")]
    assert match(part, 0, "a") == 0
    assert match(part, 1, "a", claimed={0}) == 1
    assert match(part, 2, "a", claimed={0, 1}) is None


def test_a_lone_writer_s_part_falls_back_to_call_order_when_inputs_changed() -> None:
    part = [rec(0, "a"), rec(1, "b")]
    assert match(part, 1, "zz") == 1  # verl's uid per run changes the inputs: served, the proxy warns
    assert match(part, 2, "zz") is None
    imported = [rec(0, "")]  # recorded without a fingerprint (verl import): call order only
    assert match(imported, 0, "x") == 0


def test_several_writers_in_one_part_are_matched_by_inputs_only() -> None:
    part = [rec(0, "a", ("r1", "h", 1)), rec(1, "b", ("r1", "h", 2))]
    assert match(part, 0, "b") == 1
    assert match(part, 0, "zz") is None  # never "entry 0": it may be the other writer's
    threads = [rec(0, "a", concurrent=True), rec(1, "b", concurrent=True)]  # one process, overlapping threads
    assert match(threads, 0, "zz") is None


def test_a_concurrent_writer_s_entry_is_never_served() -> None:
    sibling = rec(0, "a", (ME.run, ME.host, 1))  # pid 1 (init) is alive: another process of this run
    assert is_concurrent_other(sibling, ME, STARTED)
    assert match([sibling], 0, "a") is None
    young_other_host = rec(0, "a", ("other-run", "another-host", 5), created=STARTED + 1)
    assert match([young_other_host], 0, "a") is None
    mine = rec(0, "a", (ME.run, ME.host, ME.pid), created=STARTED + 1)
    assert match([mine], 0, "a") == 0


def test_an_ended_process_s_entry_is_servable_even_from_this_run() -> None:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    gone = int(proc.stdout)
    for run in (ME.run, "other"):
        assert not is_concurrent_other(rec(0, "a", (run, ME.host, gone), created=time.time()), ME, STARTED)


def test_another_step_is_served_by_call_order_and_only_from_a_lone_writer() -> None:
    part = [rec(0, "a"), rec(1, "b")]
    assert match(part, 1, "other-step-inputs", same_step=False) == 1
    assert match(part, 1, "b", claimed={1}, same_step=False) == 1  # claims count within a step only
    shared = [rec(0, "a", ("r1", "h", 1)), rec(1, "b", ("r1", "h", 2))]
    assert match(shared, 0, "a", same_step=False) is None


def test_the_fingerprint_is_computed_only_when_an_entry_carries_one() -> None:
    asked: list[int] = []

    def fp(rule: str) -> str:
        asked.append(1)
        return "a"

    match_call([rec(0, "")], 0, fp, set(), same_step=True, me=ME, started=STARTED)
    assert not asked
    match_call([rec(0, "a")], 0, fp, set(), same_step=True, me=ME, started=STARTED)
    assert asked == [1]


def test_each_entry_is_compared_by_its_own_fingerprint_rule_and_only_asked_rules_are_computed() -> None:
    # a part of today's entries (signature) and of format 1 (arguments, as passed) side by side
    part = [Recorded(0, "s-other", EARLIER, 10.0, False, "signature"),
            Recorded(1, "a-mine", EARLIER, 10.0, False, "arguments"),
            Recorded(2, "s-mine", EARLIER, 10.0, False, "signature")]
    asked: list[str] = []

    def fp(rule: str) -> str:
        asked.append(rule)
        return {"signature": "s-mine", "arguments": "a-mine"}[rule]

    found = match_call(part, 0, fp, set(), same_step=True, me=ME, started=STARTED)
    assert (found.call, found.exact) == (1, True)  # the lowest call index among the exact entries of either rule
    assert sorted(asked) == ["arguments", "signature"]
    assert match_call(part, 0, fp, {1}, same_step=True, me=ME, started=STARTED).call == 2
    # a digest equal to another rule's never matches: "a-mine" recorded by the signature rule is another input
    crossed = [Recorded(0, "a-mine", EARLIER, 10.0, False, "signature")]
    assert match_call(crossed, 5, fp, set(), same_step=True, me=ME, started=STARTED).call is None

    asked.clear()
    signature_only = [Recorded(c, f"s{c}", EARLIER, 10.0, False, "signature") for c in range(3)]
    match_call(signature_only, 0, fp, set(), same_step=True, me=ME, started=STARTED)
    assert asked == ["signature"]  # the as-passed digest is never taken for a part without format-1 entries
