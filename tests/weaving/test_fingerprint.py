"""Tests for skipweave.weaving.fingerprint (real tensors, real subprocesses)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from skipweave.weaving.fingerprint import fingerprint

REPO = Path(__file__).resolve().parents[2]


@dataclasses.dataclass
class DataProto:
    batch: Any
    non_tensor_batch: dict[str, Any]
    meta_info: dict[str, Any]


@dataclasses.dataclass
class Cfg:
    lr: float
    names: list[str]


class Holder:
    def __init__(self, t: torch.Tensor) -> None:
        self.t = t
        self.fn = lambda x: x  # not codec-supported: skipped
        self.worker = object()  # not codec-supported: skipped


class Slotted:
    __slots__ = ("v",)

    def __init__(self, v: int) -> None:
        self.v = v


def make_proto(step: int = 3, seed: int = 0) -> DataProto:
    g = torch.Generator().manual_seed(seed)
    return DataProto(
        batch={
            "input_ids": torch.randint(0, 1000, (4, 8), generator=g),
            "log_probs": torch.randn(4, 8, generator=g).to(torch.bfloat16),
        },
        non_tensor_batch={
            "uid": np.array([f"u{i}" for i in range(4)], dtype=object),
            "raw_prompt": np.array([[{"role": "user", "content": "hi"}]] * 4 + [None], dtype=object)[:4],
        },
        meta_info={"global_steps": step, "timing": {"gen": 0.5}, "tags": {"a", "b", "c"}},
    )


def test_deterministic_and_identity_independent() -> None:
    a = fingerprint((make_proto(),), {"temperature": 1.0})
    b = fingerprint((make_proto(),), {"temperature": 1.0})
    assert a == b and len(a) == 32 and int(a, 16) >= 0


def test_one_tensor_element_changes_digest() -> None:
    p = make_proto()
    base = fingerprint((p,), {})
    p.batch["input_ids"][2, 5] += 1
    assert fingerprint((p,), {}) != base
    p.batch["input_ids"][2, 5] -= 1
    assert fingerprint((p,), {}) == base


@pytest.mark.parametrize(
    "a, b",
    [
        (torch.arange(6), torch.arange(6).reshape(2, 3)),  # shape
        (torch.arange(6), torch.arange(6).to(torch.int32)),  # dtype
        (torch.zeros(2), -torch.zeros(2)),  # bit pattern
        (np.arange(3), np.arange(3).astype(np.int32)),
        (np.array(["a", "b"], dtype=object), np.array(["a", "c"], dtype=object)),
        ([1, 2], (1, 2)),
        (1, 1.0),
        (1, True),
        ("1", b"1"),
        (None, "None"),
        (Cfg(1.0, ["a"]), Cfg(1.0, ["b"])),
        (range(3), range(4)),
        ({"a": 1}, {"a": 2}),
        ({"a": 1}, {"b": 1}),
        (np.float32(1.0), np.float64(1.0)),
        (["ab", "c"], ["a", "bc"]),
    ],
)
def test_differences_are_detected(a: Any, b: Any) -> None:
    assert fingerprint((a,), {}) != fingerprint((b,), {})


def test_equivalent_inputs_match() -> None:
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    assert fingerprint((x.T,), {}) == fingerprint((x.T.contiguous(),), {})  # layout does not matter
    assert fingerprint((x.requires_grad_(),), {}) == fingerprint((x.detach().clone(),), {})
    assert fingerprint(({"a": 1, "b": 2},), {}) == fingerprint(({"b": 2, "a": 1},), {})  # dict order
    assert fingerprint((), {"a": 1, "b": 2}) == fingerprint((), {"b": 2, "a": 1})  # kwarg order
    assert fingerprint(({3, 1, 2},), {}) == fingerprint(({2, 3, 1},), {})
    assert fingerprint((np.asfortranarray(np.eye(3)),), {}) == fingerprint((np.eye(3),), {})
    assert fingerprint((torch.ones(2, dtype=torch.bfloat16),), {}) == fingerprint(
        (torch.ones(2).to(torch.bfloat16),), {}
    )


def test_positional_vs_keyword_differ() -> None:
    assert fingerprint((1,), {}) != fingerprint((), {"x": 1})
    assert fingerprint((1, 2), {}) != fingerprint((2, 1), {})


def test_objects_with_dict_and_opaque_objects() -> None:
    h1, h2 = Holder(torch.ones(3)), Holder(torch.ones(3))
    assert fingerprint((h1,), {}) == fingerprint((h2,), {})  # lambda / object() attributes skipped
    h2.t[0] = 5
    assert fingerprint((h1,), {}) != fingerprint((h2,), {})
    # no __dict__, default repr with an address: type name only
    assert fingerprint((Slotted(1),), {}) == fingerprint((Slotted(2),), {})
    assert fingerprint((object(),), {}) == fingerprint((object(),), {})
    assert fingerprint((Slotted(1),), {}) != fingerprint((object(),), {})


def test_ignore_paths() -> None:
    a, b = make_proto(step=1), make_proto(step=2)
    b.meta_info["timing"] = {"gen": 99.0}
    b.non_tensor_batch["uid"] = np.array(["x", "y", "z", "w"], dtype=object)
    assert fingerprint((a,), {}) != fingerprint((b,), {})
    ign = ["0.meta_info.timing", "0.non_tensor_batch.uid", "0.meta_info.global_steps"]
    assert fingerprint((a,), {}, ignore=ign) == fingerprint((b,), {}, ignore=ign)
    assert fingerprint((a,), {}, ignore=ign[:2]) != fingerprint((b,), {}, ignore=ign[:2])

    # keyword arguments and the "*" wildcard
    ign_kw = ["prompts.meta_info.global_steps", "prompts.meta_info.timing", "prompts.non_tensor_batch.uid"]
    assert fingerprint((), {"prompts": a}, ignore=ign_kw) == fingerprint((), {"prompts": b}, ignore=ign_kw)
    star = ["*.meta_info.global_steps", "*.meta_info.timing", "*.non_tensor_batch.uid"]
    assert fingerprint((a,), {"p": a}, ignore=star) == fingerprint((b,), {"p": b}, ignore=star)

    # an ignored part contributes nothing: same as absent
    c = make_proto()
    del c.meta_info["timing"]
    assert fingerprint((make_proto(),), {}, ignore=["0.meta_info.timing"]) == fingerprint((c,), {})
    # ignoring a whole argument
    assert fingerprint((1, 2), {}, ignore=["0"]) == fingerprint((5, 2), {}, ignore=["0"])
    # ignoring does not hide other changes
    b.batch["input_ids"][0, 0] += 1
    assert fingerprint((a,), {}, ignore=ign) != fingerprint((b,), {}, ignore=ign)


def test_ignore_into_dataclass_and_object_attributes() -> None:
    assert fingerprint((Cfg(1.0, ["a"]),), {}, ignore=["0.lr"]) == fingerprint((Cfg(2.0, ["a"]),), {}, ignore=["0.lr"])
    h1, h2 = Holder(torch.ones(3)), Holder(torch.zeros(3))
    assert fingerprint((h1,), {}, ignore=["0.t"]) == fingerprint((h2,), {}, ignore=["0.t"])


def test_invalid_ignore_path() -> None:
    with pytest.raises(ValueError):
        fingerprint((1,), {}, ignore=["0..x"])
    with pytest.raises(ValueError, match="include"):
        fingerprint((1,), {}, include=["0."])


def test_include_paths_hash_only_the_parts_they_name() -> None:
    a, b = make_proto(step=1), make_proto(step=2)
    b.batch["rm_scores"] = torch.ones(4)  # what a reward phase unioned into the batch
    b.non_tensor_batch["acc"] = np.array([1, 0, 1, 0])
    tokens = ["*.batch.input_ids"]
    assert fingerprint((a,), {}) != fingerprint((b,), {})
    assert fingerprint((a,), {}, include=tokens) == fingerprint((b,), {}, include=tokens)
    assert fingerprint((), {"batch": a}, include=tokens) == fingerprint((), {"batch": b}, include=tokens)
    # a named part whole (everything below it), beside another: a change in either is seen
    whole = ["0.batch", "0.meta_info.global_steps"]
    assert fingerprint((a,), {}, include=whole) != fingerprint((b,), {}, include=whole)
    c = make_proto(step=1)
    c.non_tensor_batch["uid"] = np.array(["x", "y", "z", "w"], dtype=object)
    assert fingerprint((a,), {}, include=whole) == fingerprint((c,), {}, include=whole)
    # an ignore path still leaves out a part inside an included one
    assert fingerprint((a,), {}, include=["0.batch"], ignore=["*.batch.rm_scores"]) == fingerprint(
        (make_proto(step=7),), {}, include=["0.batch"], ignore=["*.batch.rm_scores"])
    # a change in an included field is seen; an argument no path names is left out
    b.batch["input_ids"][0, 0] += 1
    assert fingerprint((a,), {}, include=tokens) != fingerprint((b,), {}, include=tokens)
    assert fingerprint((a, 1), {}, include=["0"]) == fingerprint((a, 2), {}, include=["0"])
    # include paths that name every part: the digest of no include at all
    assert fingerprint((a,), {"k": 1}, include=["0", "k"]) == fingerprint((a,), {"k": 1})


def test_include_paths_that_name_nothing_hash_everything_and_say_so() -> None:
    """A digest of nothing would match any inputs: when no include path names a part, all parts are hashed."""
    said: list[int] = []
    a, b = {"prompt_ids": torch.arange(3)}, {"prompt_ids": torch.arange(3) + 1}
    none = ["*.batch.input_ids"]
    da = fingerprint((a,), {}, include=none, on_unmatched=lambda: said.append(1))
    assert da == fingerprint((a,), {}) and da != fingerprint((b,), {}, include=none)
    assert said == [1]
    # a path leading into the inputs but naming no leaf there counts as nothing named too
    assert fingerprint(({"batch": {"other": 1}},), {}, include=none) != fingerprint(({"batch": {"other": 2}},), {},
                                                                                    include=none)
    assert fingerprint((a,), {}, include=[]) == fingerprint((a,), {})


def test_tensordict_batch() -> None:
    import tensordict
    td1 = tensordict.TensorDict({"a": torch.ones(2, 3), "b": torch.zeros(2)}, batch_size=[2])
    td2 = tensordict.TensorDict({"b": torch.zeros(2), "a": torch.ones(2, 3)}, batch_size=[2])
    p1, p2 = DataProto(td1, {}, {}), DataProto(td2, {}, {})
    assert fingerprint((p1,), {}) == fingerprint((p2,), {})
    td2["a"][0, 0] = 2
    assert fingerprint((p1,), {}) != fingerprint((p2,), {})
    assert fingerprint((p1,), {}, ignore=["0.batch.a"]) == fingerprint((p2,), {}, ignore=["0.batch.a"])


_CASE = textwrap.dedent(
    """
    import dataclasses
    import numpy as np, torch
    from skipweave.weaving.fingerprint import fingerprint

    @dataclasses.dataclass
    class DataProto:
        batch: object
        non_tensor_batch: dict
        meta_info: dict

    class Holder:
        def __init__(self):
            self.names = {"x", "y", "zeta", "alpha"}
            self.cb = print

    def run():
        g = torch.Generator().manual_seed(0)
        p = DataProto(
            {"ids": torch.randint(0, 100, (3, 5), generator=g), "lp": torch.randn(3, 5, generator=g).half()},
            {"uid": np.array(["a", "b", "c"], dtype=object), "n": np.arange(3)},
            {"tags": {"s1", "s2", "s3", "s4"}, "frozen": frozenset({"q", "r"}), "step": 7, 3.5: None},
        )
        kw = {"cfg": {"b": [1, 2.5, "x"], "a": (b"y", None)}, "names": {"n1", "n2", "n3"}}
        return fingerprint((p, Holder()), kw, ignore=["*.meta_info.step"])
    """
)


def test_stable_across_processes_with_different_hash_seeds(tmp_path: Path) -> None:
    (tmp_path / "fp_case_mod.py").write_text(_CASE)
    sys.path.insert(0, str(tmp_path))
    try:
        import fp_case_mod  # type: ignore[import-not-found]

        here = fp_case_mod.run()
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("fp_case_mod", None)
    # a child process with a different string-hash seed (set/dict iteration orders differ) must agree
    seed = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"
    env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    proc = subprocess.run(
        # (the DataProto shape is the verl integration's host type: loaded as in this test session and a run)
        [sys.executable, "-c", "import skipweave; skipweave.load_integrations(); import fp_case_mod; "
         "print(fp_case_mod.run())"],
        env=env,
        cwd=str(REPO),
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout.decode().strip() == here
    assert len(here) == 32
