"""The comparison a verify run and ``skipweave diff`` make: statuses, first divergence, rules per path."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch

from skipweave.config.errors import ConfigError
from skipweave.store.hosts import HOST_TYPES, Compared, HostType
from skipweave.verify.compare import CompareSpec, Tolerance, compare, paths


class Batch:
    """A DataProto-shaped host object: compared by its attributes."""

    def __init__(self, responses: torch.Tensor, log_probs: torch.Tensor, uid: np.ndarray, meta: dict[str, Any]):
        self.batch = {"responses": responses, "rollout_log_probs": log_probs}
        self.non_tensor_batch = {"uid": uid}
        self.meta_info = meta
        self._private = object()  # never compared


@dataclass
class Sample:
    tokens: list[int]
    score: float


def make(seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    responses = torch.randint(0, 1000, (4, 8), generator=g)
    log_probs = torch.randn(4, 8, generator=g, dtype=torch.float32)
    uid = np.array([f"u{i}" for i in range(4)], dtype=object)
    return Batch(responses, log_probs, uid, {"global_steps": 3, "timing_s": 1.25})


def test_identical_results_are_identical_and_count_their_fields() -> None:
    out = compare(make(), make())
    assert out.status == "identical" and out.first is None and out.divergences == []
    assert out.fields == 2 + 4 + 2  # two tensors, four uids, two meta values


def test_a_token_that_differs_is_named_by_sample_and_position_with_the_match_ratio() -> None:
    live = make()
    live.batch["responses"][2, 5] += 1
    out = compare(make(), live)
    assert out.status == "diverged"
    assert out.first is not None and out.first.path == "batch.responses" and out.first.kind == "value"
    assert out.first.detail["first_index"] == [2, 5]
    assert out.first.detail["live"] == out.first.detail["recorded"] + 1
    assert out.first.detail["match_ratio"] == pytest.approx(31 / 32)


def test_floats_within_tolerance_are_close_and_beyond_it_diverged() -> None:
    live = make()
    live.batch["rollout_log_probs"][1, 2] += 1e-4
    spec = CompareSpec(fields=(("batch.rollout_log_probs", Tolerance(atol=1e-3)),))
    close = compare(make(), live, spec)
    assert close.status == "close" and close.first is not None
    assert close.first.detail["max_abs_diff"] == pytest.approx(1e-4, rel=1e-2)
    assert close.first.detail["at"] == [1, 2] and close.first.detail["beyond_fraction"] == 0.0
    diverged = compare(make(), live)  # exact by default
    assert diverged.status == "diverged" and diverged.first is not None
    assert diverged.first.detail["beyond_fraction"] == pytest.approx(1 / 32)


def test_ignored_fields_and_their_children_are_not_compared() -> None:
    live = make()
    live.meta_info["timing_s"] = 9.0
    live.batch["rollout_log_probs"] += 1
    spec = CompareSpec.parse({"fields": {"meta_info.timing*": "ignore", "batch.rollout_log_probs": "ignore"}})
    out = compare(make(), live, spec)
    assert out.status == "identical" and out.fields == 1 + 4 + 1
    assert compare(make(), live, CompareSpec.parse({"fields": {"batch": "ignore", "meta_info": "ignore"}})).fields == 4


def test_nested_dicts_object_arrays_dataclasses_and_lists_name_the_first_differing_path() -> None:
    rec = {"a": {"b": [1, 2, {"c": "x"}]}, "s": Sample([1, 2], 0.5), "o": np.array(["p", "q"], dtype=object)}
    live = {"a": {"b": [1, 2, {"c": "y"}]}, "s": Sample([1, 3], 0.5), "o": np.array(["p", "r"], dtype=object)}
    out = compare(rec, live)
    # a list of ints is a token field: one divergence at its first differing position, not a path per element
    assert [d.path for d in out.divergences] == ["a.b.2.c", "s.tokens", "o.1"]
    assert out.divergences[1].detail["first_index"] == [1]
    assert out.first is not None and out.first.detail == {"recorded": "'x'", "live": "'y'"}


@pytest.mark.parametrize(("rec", "live", "kind"), [
    (torch.zeros(2, 3), torch.zeros(3, 2), "shape"),
    (torch.zeros(2), torch.zeros(2, dtype=torch.float64), "dtype"),
    (["a", "b"], ["a", "b", "c"], "length"),
    ([[1, 2], [3]], [[1, 2]], "length"),  # token lists of another number of samples
    ({"a": 1}, {"b": 1}, "keys"),
    (torch.zeros(2), np.zeros(2), "type"),
    ("1", 1, "type"),
])
def test_mismatches_of_structure_are_said_as_such(rec: Any, live: Any, kind: str) -> None:
    out = compare(rec, live)
    assert out.status == "diverged" and out.first is not None and out.first.kind == kind


def test_nan_at_the_same_place_is_equal_and_numpy_numbers_compare_with_python_ones() -> None:
    a = torch.tensor([1.0, float("nan")])
    assert compare(a, a.clone()).status == "identical"
    assert compare({"x": np.float32(0.5)}, {"x": 0.5}).status == "identical"
    assert compare(np.arange(4), np.arange(4)).status == "identical"


def test_a_spec_is_read_from_yaml_values_and_bad_ones_name_the_key() -> None:
    spec = CompareSpec.parse({"default": {"atol": 0.1}, "fields": {"batch.responses": "exact"}})
    assert spec.rule_for("batch.responses") == "exact"
    assert spec.rule_for("batch.rollout_log_probs") == Tolerance(atol=0.1)
    with pytest.raises(ConfigError, match=r"skip.rollout.compare.fields.x.atol=-1"):
        CompareSpec.parse({"fields": {"x": {"atol": -1}}}, key="skip.rollout.compare")
    with pytest.raises(ConfigError, match="exact, ignore"):
        CompareSpec.parse({"default": "fuzzy"})
    with pytest.raises(ConfigError, match="only the keys default and fields"):
        CompareSpec.parse({"defaults": "exact"})


def test_paths_lists_every_leaf_a_glob_can_name() -> None:
    assert list(paths(make())) == ["batch.responses", "batch.rollout_log_probs", "non_tensor_batch.uid.0",
                                   "non_tensor_batch.uid.1", "non_tensor_batch.uid.2", "non_tensor_batch.uid.3",
                                   "meta_info.global_steps", "meta_info.timing_s"]


def test_a_tensordict_is_compared_by_its_keys() -> None:
    from tensordict import TensorDict

    rec = TensorDict({"responses": torch.arange(6).reshape(2, 3), "mask": torch.ones(2, 3)}, batch_size=[2])
    live = rec.clone()
    live["responses"][1, 0] = 99
    out = compare({"batch": rec}, {"batch": live})
    assert out.status == "diverged" and out.first is not None
    assert (out.first.path, out.first.detail["first_index"]) == ("batch.responses", [1, 0])
    assert compare({"batch": rec}, {"batch": rec.clone()}).status == "identical"


def test_a_verl_dataproto_is_compared_by_batch_non_tensor_batch_and_meta_info() -> None:
    from verl.protocol import DataProto

    def proto(shift: float) -> Any:
        return DataProto.from_dict(tensors={"responses": torch.arange(12).reshape(3, 4),
                                            "rollout_log_probs": torch.zeros(3, 4) + shift},
                                   non_tensors={"uid": np.array(["a", "b", "c"], dtype=object)},
                                   meta_info={"global_steps": 2, "timing_s": shift})

    assert compare(proto(0.0), proto(0.0)).status == "identical"
    spec = CompareSpec.parse({"fields": {"batch.rollout_log_probs": {"atol": 0.01}, "meta_info.timing*": "ignore"}})
    assert compare(proto(0.0), proto(0.005), spec).status == "close"
    out = compare(proto(0.0), proto(0.5), spec)
    assert out.status == "diverged" and out.first is not None and out.first.path == "batch.rollout_log_probs"
    assert out.first.detail["max_abs_diff"] == pytest.approx(0.5) and out.first.detail["beyond_fraction"] == 1.0


@pytest.mark.parametrize(("rec", "live", "exact", "within"), [
    (torch.tensor([float("inf")]), torch.tensor([float("inf")]), "identical", "identical"),
    (torch.tensor([float("inf")]), torch.tensor([float("-inf")]), "diverged", "diverged"),
    (torch.tensor([float("nan")]), torch.tensor([1.0]), "diverged", "diverged"),
    (torch.tensor([float("inf")], dtype=torch.bfloat16), torch.tensor([5.0], dtype=torch.bfloat16), "diverged",
     "diverged"),
    (torch.tensor([1 + 1j]), torch.tensor([1 + 2j]), "diverged", "diverged"),
    (np.array([1 + 1j]), np.array([1 + 2j]), "diverged", "diverged"),
    (2**60, 2**60 + 1, "diverged", "diverged"),  # integers are exact, tolerance or not (a float would call them
    # equal), as int tensors are
    (float("inf"), float("inf"), "identical", "identical"),  # inf - inf is NaN: equal values are never subtracted
    (np.float32("inf"), np.float32("inf"), "identical", "identical"),
    (10**400, 10**400 + 10**330, "diverged", "diverged"),  # a difference past a float's range: max |Δ| inf
    (10**400, 10**400 + 1, "diverged", "diverged"),  # rtol * 10**400 overflows: never taken for close
    (np.float32("nan"), np.float32("nan"), "identical", "identical"),
])
def test_infinities_nans_complex_and_big_integers(rec: Any, live: Any, exact: str, within: str) -> None:
    import json

    spec = CompareSpec(default=Tolerance(atol=0.5, rtol=0.1))
    for out, status in ((compare(rec, live), exact), (compare(rec, live, spec), within)):
        assert out.status == status
        json.dumps(out.to_json(), allow_nan=False)  # strict JSON: no NaN or Infinity in a report


def test_values_that_cannot_be_compared_are_divergences_not_errors() -> None:
    class Opaque:
        __slots__ = ()

        def __eq__(self, other: object) -> bool:
            raise RuntimeError("no")

        def __repr__(self) -> str:
            raise RuntimeError("no repr either")

    cyclic: list[Any] = [1]
    cyclic.append(cyclic)
    sparse = torch.eye(3).to_sparse()
    assert compare(Opaque(), Opaque()).status == "diverged"
    assert compare(sparse, sparse.clone()).first.kind == "error"  # type: ignore[union-attr]
    assert compare(cyclic, cyclic).status == "identical"
    assert compare(ValueError("a"), ValueError("b")).status == "diverged"
    assert compare(ValueError("a"), ValueError("a")).status == "identical"


def test_a_tensordict_batch_size_is_compared() -> None:
    from tensordict import TensorDict

    rec = TensorDict({"x": torch.zeros(2)}, batch_size=[2])
    out = compare(rec, TensorDict({"x": torch.zeros(2)}, batch_size=[]))
    assert out.status == "diverged" and out.first is not None and out.first.kind == "shape"


class Pair:
    """A host object of a test's own host type: compared by what the host type says, ``left`` and a shape ``n``."""

    def __init__(self, left: Any, right: Any, n: int) -> None:
        self.left, self.right, self.n = left, right, n


PAIR = HostType(kind="test_compare_pair", label="pair", matches=lambda obj: isinstance(obj, Pair),
                encode=lambda enc, obj, path: {}, decode=lambda dec, node, path: None, children=lambda node: (),
                compared=lambda obj: Compared({"left": obj.left}, [obj.n]))


def test_a_host_type_says_what_of_its_objects_is_compared() -> None:
    """verify names no host: it asks the registry, and the host type's ``compared`` gives the fields and the shape."""
    assert compare(Pair(1, 2, 3), Pair(1, 99, 3)).status == "diverged"  # unregistered: every public attribute
    HOST_TYPES.add(PAIR)
    try:
        assert compare(Pair(1, 2, 3), Pair(1, 99, 3)).status == "identical"  # right is not compared
        out = compare({"p": Pair(1, 2, 3)}, {"p": Pair(5, 2, 4)})
        assert [(d.path, d.kind) for d in out.divergences] == [("p", "shape"), ("p.left", "value")]
        assert out.divergences[0].detail == {"recorded": [3], "live": [4]}
        assert list(paths(Pair(1, 2, 3))) == ["left"]
    finally:
        HOST_TYPES.remove(PAIR)


def test_default_ignore_compares_only_the_fields_the_patterns_name() -> None:
    rec = {"batch": {"responses": torch.tensor([[1, 2], [3, 4]]), "log_probs": torch.zeros(2)}, "meta": {"t": 1.0}}
    live = {"batch": {"responses": torch.tensor([[1, 2], [3, 5]]), "log_probs": torch.ones(2)}, "meta": {"t": 2.0}}
    only = CompareSpec.parse({"default": "ignore", "fields": {"batch.responses": "exact"}})
    out = compare(rec, live, only)
    assert (out.status, out.fields, out.first.path if out.first else None) == ("diverged", 1, "batch.responses")
    assert compare(rec, {**live, "batch": {"log_probs": torch.ones(2)}}, only).first.kind == "keys"  # type: ignore[union-attr]
    star = CompareSpec.parse({"fields": {"*": "ignore", "batch.responses": "exact"}})  # a plain path beats a glob
    assert compare(rec, live, star).first.path == "batch.responses"  # type: ignore[union-attr]
    assert compare(rec, live, CompareSpec.parse({"fields": {"": "ignore"}})).status == "diverged"  # "" names no field
    # a user's plain path beats a profile's glob at the same length
    timing = CompareSpec.parse({"fields": {"meta.t*": "ignore", "meta.t": "exact"}})
    assert compare(rec, {**rec, "meta": {"t": 2.0}}, timing).status == "diverged"


def test_objects_without_an_eq_are_compared_by_their_state_never_their_address() -> None:
    class Private:
        def __init__(self, x: int) -> None:
            self._x = x

    class Slotted:
        __slots__ = ("x",)

        def __init__(self, x: int) -> None:
            self.x = x

    class Empty:
        pass

    class Sized(dict):  # type: ignore[type-arg]
        batch_size = 3

    assert compare(Private(1), Private(1)).status == "identical"
    assert compare(Private(1), Private(2)).first.path == "_x"  # type: ignore[union-attr]
    assert compare(Slotted(1), Slotted(1)).status == "identical"
    assert compare(Slotted(1), Slotted(2)).first.path == "x"  # type: ignore[union-attr]
    assert compare(Empty(), Empty()).status == "identical"
    assert compare(Sized(a=1), Sized(a=2)).first.path == "a"  # type: ignore[union-attr]


def test_an_ignored_field_is_never_compared_whatever_other_patterns_name() -> None:
    t = torch.tensor
    rec = {"a": t([1]), "b": t([1.0]), "meta": {"timing_s": 1.0, "keys": [1, 2]}, "batch": {"x_log_probs": t([0.0]),
                                                                                            "mask": t([1])}}
    live = {"a": t([2]), "b": t([1.5]), "meta": {"timing_s": "late", "keys": [1]}, "batch": {"x_log_probs": t([0.5]),
                                                                                            "mask": t([0])}}
    # a plain path beats a glob at one depth, and its ignore holds below it ("*" does not cross a dot)
    out = compare(rec, live, CompareSpec.parse({"fields": {"a": "ignore", "meta": "ignore", "batch": "ignore",
                                                           "*": {"atol": 1}}}))
    assert (out.status, [d.path for d in out.divergences]) == ("close", ["b"]), out.divergences
    # default ignore + a tolerance glob: only the fields it names are compared, with their tolerance
    only = compare(rec, live, CompareSpec.parse({"default": "ignore", "fields": {"batch.*_log_probs": {"atol": 1}}}))
    assert (only.status, only.fields, [d.path for d in only.divergences]) == ("close", 1, ["batch.x_log_probs"])
    # a profile's ignore glob and a user's glob elsewhere: nothing under the ignored field is reported
    both = compare(rec, live, CompareSpec.parse({"fields": {"meta.timing*": "ignore", "meta.keys": "ignore",
                                                            "*.*_log_probs": {"atol": 1}, "a": "ignore",
                                                            "b": "ignore", "batch.mask": "ignore"}}))
    assert both.status == "close" and [d.path for d in both.divergences] == ["batch.x_log_probs"]
    # first glob in order at one depth: "*" ignores b before "b*" could give it a tolerance
    assert compare(rec, live, CompareSpec.parse({"fields": {"*": "ignore", "b*": {"atol": 1}}})).status == "identical"


def test_inf_is_never_within_a_tolerance_and_huge_integers_stay_reportable() -> None:
    import json

    from skipweave.verify.report import describe, record

    spec = CompareSpec(default=Tolerance(atol=0.0, rtol=1e-3))
    assert compare({"x": math.inf}, {"x": 1.0}, spec).status == "diverged"
    assert compare({"x": -math.inf}, {"x": 0.0}, spec).status == "diverged"
    big = torch.tensor([3e38], dtype=torch.float32)
    assert compare(big, torch.tensor([math.inf]), CompareSpec(default=Tolerance(rtol=2.0))).status == "diverged"
    for rec, live in ((10**400, 0), (10**5000, 10**5000 + 1)):
        out = compare({"x": rec}, {"x": live})
        line = record(role="r", target="t", step=1, call=0, shard="r0", validation=False, comparison=out)
        json.dumps(line, allow_nan=False)
        assert "diverged at x" in describe(line)


def test_public_slots_beside_a_dict_and_a_batch_size_method() -> None:
    class Base:
        __slots__ = ("tokens",)

    class Rollout(Base):
        def __init__(self, tokens: list[int]) -> None:
            self.tokens, self.name = tokens, "r"

    class Sized(dict):  # type: ignore[type-arg]
        def batch_size(self) -> int:
            return 3

    assert compare(Rollout([1, 2]), Rollout([1, 3])).first.path == "tokens"  # type: ignore[union-attr]
    assert compare(Sized(a=1), Sized(a=1)).status == "identical"


# ------------------------------------------------------------------------------------------------ token fields
def trl_output(change: bool = False) -> dict[str, Any]:
    """What TRL's and vLLM's generation hands back: ragged Python lists of token ids, one per sample, and lists of
    float log-probs beside them."""
    completions = [[5, 17, 902, 4], [33, 8], [71, 71, 12, 90, 2], [6]]
    if change:
        completions[2] = [71, 71, 13, 90, 2, 2]  # sample 2 departs at position 2, and runs one token longer
    return {"prompt_ids": [[1, 2, 3]] * 4, "completion_ids": completions,
            "logprobs": [[-0.1 * (i + 1)] * len(c) for i, c in enumerate(completions)], "step": 3}


def test_ragged_lists_of_token_ids_are_compared_as_tokens_by_sample_and_position() -> None:
    out = compare(trl_output(), trl_output(change=True))
    assert out.status == "diverged" and out.first is not None
    assert (out.first.path, out.first.kind) == ("completion_ids", "value")
    detail = out.first.detail
    assert detail["first_index"] == [2, 2] and (detail["recorded"], detail["live"]) == (12, 13)
    # positions: 4 + 2 + 6 (the longer side's) + 1 = 13; equal: 4 + 2 + 4 + 1 = 11
    assert detail["match_ratio"] == pytest.approx(11 / 13) and detail["tokens"] is True
    assert out.token_match == pytest.approx(11 / 13)
    assert out.first_token is out.first
    assert "max_abs_diff" not in detail  # never "max |Δ| 1" between two tokens
    line = out.to_json()
    assert line["token_match"] == pytest.approx(11 / 13) and line["first_token"]["path"] == "completion_ids"
    same = compare(trl_output(), trl_output())
    assert (same.status, same.token_match, same.tokens) == ("identical", 1.0, 2)


def test_a_sequence_that_ends_early_diverges_at_its_end_and_a_tuple_holds_the_same_tokens_as_a_list() -> None:
    out = compare({"ids": [4, 5, 6]}, {"ids": [4, 5, 6, 7]})
    assert out.first is not None and out.first.detail["first_index"] == [3]
    assert (out.first.detail["recorded"], out.first.detail["live"]) == (None, 7)
    assert out.token_match == pytest.approx(3 / 4)
    assert compare({"ids": [[1, 2], [3]]}, {"ids": [(1, 2), (3,)]}).status == "identical"
    assert compare({"ids": [np.int64(4), 5]}, {"ids": [4, 5]}).status == "identical"
    from skipweave.verify.report import describe, record

    text = describe(record(role="rollout", target="gen", step=2, call=0, shard="r0", validation=False,
                           comparison=out))
    assert "diverged at ids [3]: recorded (end), live 7 (token match 0.750)" in text, text


def test_a_result_without_token_fields_has_no_token_match_and_one_without_floats_no_max_delta() -> None:
    floats = compare({"logp": torch.zeros(3), "reward": 0.5}, {"logp": torch.ones(3), "reward": 0.5})
    assert floats.status == "diverged" and floats.token_match is None and floats.max_abs_diff == 1.0
    assert floats.to_json()["token_match"] is None and floats.to_json()["first_token"] is None
    assert compare({"logp": [0.5, 0.25]}, {"logp": [0.5, 0.25]}).token_match is None
    ints = compare({"ids": torch.tensor([[1, 2]]), "step": 3}, {"ids": torch.tensor([[1, 2]]), "step": 4})
    assert (ints.status, ints.token_match, ints.max_abs_diff) == ("diverged", 1.0, None)
    assert ints.first is not None and ints.first.detail == {"recorded": 3, "live": 4}  # a step, not a token, no |Δ|


@pytest.mark.parametrize(("rec", "live", "path"), [
    ({"mask": [True, False]}, {"mask": [True, True]}, "mask.1"),  # bools are no tokens
    ({"shape": torch.Size([2, 3])}, {"shape": torch.Size([2, 4])}, "shape.1"),  # a Size is no token list
    ({"mixed": [1, 2.5]}, {"mixed": [1, 3.5]}, "mixed.1"),  # nor is a list holding anything but ints
    ({"m": torch.tensor([True, False])}, {"m": torch.tensor([True, True])}, "m"),  # a bool mask: not a token field
])
def test_bools_sizes_and_mixed_lists_are_not_token_fields(rec: Any, live: Any, path: str) -> None:
    out = compare(rec, live)
    assert out.status == "diverged" and out.first is not None and out.first.path == path
    assert out.token_match is None and out.first.detail.get("tokens") in (None, False)


def test_integer_tensors_and_numpy_arrays_are_token_fields_whose_shape_change_leaves_the_ratio_unknown() -> None:
    rec = {"responses": np.arange(12).reshape(3, 4), "logp": torch.zeros(3)}
    live = {"responses": np.arange(12).reshape(3, 4), "logp": torch.zeros(3)}
    live["responses"][1, 2] = 99
    out = compare(rec, live)
    assert out.first is not None and out.first.detail["tokens"] is True
    assert out.first.detail["first_index"] == [1, 2] and out.token_match == pytest.approx(11 / 12)
    assert out.max_abs_diff == 0.0  # a float field compared, equal
    shape = compare({"r": torch.zeros(2, 3, dtype=torch.long)}, {"r": torch.zeros(2, 4, dtype=torch.long)})
    assert shape.first is not None and shape.first.kind == "shape" and shape.token_match is None


def test_the_first_token_is_named_beside_an_earlier_float_divergence() -> None:
    from skipweave.verify.report import describe, record

    rec, live = trl_output(), trl_output(change=True)
    rec = {"a_logp": torch.zeros(2), **rec}
    live = {"a_logp": torch.ones(2), **live}
    out = compare(rec, live)
    assert out.first is not None and out.first.path == "a_logp"
    assert out.first_token is not None and out.first_token.path == "completion_ids"
    text = describe(record(role="r", target="t", step=1, call=0, shard="r0", validation=False, comparison=out))
    assert "diverged at a_logp: max |Δ| 1" in text
    assert "tokens first differ at completion_ids [2, 2]: recorded 12, live 13 (token match 0.846)" in text
