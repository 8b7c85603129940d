"""The divergence report: lines written whole by several writers, read back past damage, tallied and described."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import torch

from skipweave.verify.compare import CompareSpec, compare
from skipweave.verify.report import ReportFile, describe, read_lines, record, tally


def _line(step: int, recorded: torch.Tensor, live: torch.Tensor, call: int = 0) -> dict[str, object]:
    return record(role="rollout", target="gen", step=step, call=call, shard="r0", validation=False,
                  comparison=compare({"responses": recorded}, {"responses": live}, CompareSpec()), inputs="same")


def test_lines_of_many_writers_stay_whole_and_damaged_lines_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "report.jsonl"
    same = torch.arange(6)
    writers = [ReportFile(str(path)) for _ in range(4)]  # as four processes would hold it

    def write(w: ReportFile, n: int) -> None:
        for i in range(50):
            w.append(_line(n * 100 + i, same, same))

    threads = [threading.Thread(target=write, args=(w, n)) for n, w in enumerate(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with path.open("a") as fh:
        fh.write('{"schema": "skipweave.verify.call/1", "step": 9')  # a writer killed mid-line
        fh.write("\n[1, 2]\n")  # JSON, but no report line
    lines = list(read_lines(str(path)))
    assert len(lines) == 200 and len({x["step"] for x in lines}) == 200
    assert tally(lines).counts["identical"] == 200


def test_tally_first_divergence_is_the_earliest_step_whatever_the_order_lines_came_in() -> None:
    a = torch.tensor([[1, 2, 3], [4, 5, 6]])
    b = a.clone()
    b[1, 2] = 9
    lines = [_line(5, a, b), _line(3, a, a), _line(2, a, b, call=1), _line(2, a, b, call=0)]
    t = tally(lines)
    assert t.counts == {"identical": 1, "close": 0, "diverged": 3, "unrecorded": 0}
    assert t.first is not None and (t.first["step"], t.first["call"]) == (2, 0)
    assert t.summary().startswith("calls=4 identical=1 close=0 diverged=3 unrecorded=0; first divergence: role rollout "
                                  "target gen step 2 call 0: diverged at responses [1, 2]: recorded 6, live 9 "
                                  "(token match 0.833)")
    assert tally([_line(1, a, a)]).summary().endswith("every verified call is identical to its recording")


def test_describe_says_what_differs_for_each_kind() -> None:
    unrecorded = record(role="r", target="t", step=4, call=0, shard="r0", validation=True, comparison=None)
    assert describe(unrecorded) == "role r target t step 4 call 0 (validation): no recording to compare against " \
                                   "(ran live)"
    floats = record(role="r", target="t", step=1, call=0, shard="r0", validation=False, inputs="differ",
                    comparison=compare({"lp": torch.zeros(2, 3)}, {"lp": torch.full((2, 3), 0.5)}))
    assert describe(floats) == ("role r target t step 1 call 0: diverged at lp: max |Δ| 0.5 at [0, 0], 1.000 of "
                                "elements beyond tolerance; its inputs differ from the recording's too")
    shape = record(role="r", target="t", step=1, call=0, shard="r0", validation=False,
                   comparison=compare({"x": torch.zeros(2)}, {"x": torch.zeros(3)}))
    assert describe(shape) == 'role r target t step 1 call 0: diverged at x: shape differs ({"recorded": [2], ' \
                              '"live": [3]})'
    json.dumps(shape, allow_nan=False)  # strict JSON
    # a bare 0-d tensor (what TRL's compute_loss returns): no index to point at, its two values instead
    loss = record(role="update", target="loss", step=0, call=1, shard="r0", validation=False,
                  comparison=compare(torch.tensor(0.25), torch.tensor(0.5)))
    assert describe(loss) == ("role update target loss step 0 call 1: diverged at (the result): max |Δ| 0.25 "
                              "(recorded 0.25, live 0.5), 1.000 of elements beyond tolerance")
    json.dumps(loss, allow_nan=False)
