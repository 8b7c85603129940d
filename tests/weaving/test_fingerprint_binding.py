"""Input fingerprints bound to the target's signature (format 2's ``signature`` rule), and format-1 entries matched by
their own ``arguments`` rule: binding, defaults, ``*args``/``**kwargs``, ignore/include paths, and real replays."""

from __future__ import annotations

import inspect
import json
import logging
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import skipweave
from skipweave.weaving.binding import Binding, binding_of
from skipweave.weaving.fingerprint import fingerprint, signature_fingerprint

# ------------------------------------------------------------------------------------------------ binding


def _f_plain(batch, step):
    return dict(locals())


def _f_defaults(batch, step=1, mode="greedy", cfg=None, scale=1.0, extra=[]):  # noqa: B006
    return dict(locals())


def _f_kwonly(batch, *, temperature=0.7, seed):
    return dict(locals())


def _f_var(step, *samples, k=1, **opts):
    return dict(locals())


def _f_posonly(a, b=2, /, c=3, **kw):
    return dict(locals())


def _f_none():
    return dict(locals())


SIGNATURES = [_f_plain, _f_defaults, _f_kwonly, _f_var, _f_posonly, _f_none]
CALLS: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
    ((), {}), ((1,), {}), ((1, 2), {}), ((1, 2, 3), {}), ((1, 2, 3, 4, 5, 6, 7), {}),
    ((1,), {"step": 2}), ((), {"batch": 1, "step": 2}), ((1, 2), {"step": 2}), ((1,), {"seed": 0}),
    ((1,), {"seed": 0, "temperature": 0.7}), ((1, "a", "b"), {"k": 2, "z": 3}), ((1,), {"a": 5}),
    ((1,), {"b": 5, "c": 6}), ((1,), {"unknown": 1}), ((1,), {"mode": "greedy", "scale": 1.0, "cfg": None}),
    ((1,), {"extra": []}), ((1, 1, "greedy"), {}),
]


def _expected(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """What ``inspect.Signature.bind`` binds, with the documented rule for defaults applied; ``None`` when it refuses
    the call."""
    sig = inspect.signature(func)
    try:
        bound = dict(sig.bind(*args, **kwargs).arguments)
    except TypeError:
        return None
    for name, p in sig.parameters.items():
        if name in bound and p.default is not inspect.Parameter.empty and type(p.default) in (
                type(None), bool, int, float, str) and type(bound[name]) is type(p.default) \
                and bound[name] == p.default:
            del bound[name]
        if name in bound and p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and not bound[name]:
            del bound[name]
    return bound


def _completed(func: Any, bound: dict[str, Any]) -> dict[str, Any]:
    """``bound`` with what the call's frame holds for every parameter left out (defaults, empty ``*``/``**``)."""
    out: dict[str, Any] = {}
    for name, p in inspect.signature(func).parameters.items():
        empty = () if p.kind is p.VAR_POSITIONAL else {} if p.kind is p.VAR_KEYWORD else p.default
        out[name] = bound.get(name, empty)
    return out


@pytest.mark.parametrize("func", SIGNATURES, ids=lambda f: f.__name__)
def test_binding_agrees_with_python_s_own_call_on_every_call_form(func: Any) -> None:
    binding = binding_of(func, sys.modules[__name__])
    assert binding is not None
    for args, kwargs in CALLS:
        bound = binding.bind(args, kwargs)
        try:
            frame = func(*args, **kwargs)  # the call itself: what Python binds
        except TypeError:
            assert bound is None, (func.__name__, args, kwargs)
            continue
        assert bound is not None and _completed(func, bound) == frame, (func.__name__, args, kwargs)
        expected = _expected(func, args, kwargs)
        # inspect refuses a positional-only name passed by keyword into **kw, which Python accepts (3.11)
        assert bound == expected or (expected is None and func is _f_posonly), (func.__name__, args, kwargs)


def test_positional_keyword_and_mixed_forms_of_one_call_have_one_fingerprint() -> None:
    binding = binding_of(_f_defaults, None)
    assert binding is not None
    batch = {"ids": torch.arange(6).reshape(2, 3), "meta": {"seed": 4}}

    def fp(*args: Any, **kwargs: Any) -> str | None:
        return signature_fingerprint(binding, args, kwargs)

    one = fp(batch, 3)
    assert one is not None and len(one) == 32
    assert fp(batch, step=3) == fp(batch=batch, step=3) == fp(step=3, batch=batch) == one
    assert fp(batch, 4) != one and fp(dict(batch, ids=torch.zeros(2, 3)), 3) != one
    # under the arguments rule (format 1) the three forms differ: what the signature rule fixes
    assert len({fingerprint((batch, 3), {}), fingerprint((batch,), {"step": 3}),
                fingerprint((), {"batch": batch, "step": 3})}) == 3
    assert one not in {fingerprint((batch, 3), {}), fingerprint((batch,), {"step": 3})}  # the rules never meet


def test_a_parameter_left_out_equals_one_passed_with_its_plain_default_and_only_then() -> None:
    binding = binding_of(_f_defaults, None)
    assert binding is not None

    def fp(*args: Any, **kwargs: Any) -> str | None:
        return signature_fingerprint(binding, args, kwargs)

    base = fp("b")
    assert fp("b", 1) == fp("b", step=1) == fp("b", mode="greedy", cfg=None, scale=1.0) == base
    assert fp("b", True) != base and fp("b", 1.0) != base  # equal to 1 by ==, yet another type: another input
    assert fp("b", scale=-0.0) != fp("b", scale=0.0)  # floats by bit pattern, as the hash takes them
    assert fp("b", scale=0.0) != base
    assert fp("b", extra=[]) != base  # a mutable default is hashed when passed, never assumed equal
    assert fp("b", mode="sample") != base


def test_var_positional_and_var_keyword_targets_hash_in_a_canonical_order() -> None:
    binding = binding_of(_f_var, None)
    assert binding is not None

    def fp(*args: Any, **kwargs: Any) -> str | None:
        return signature_fingerprint(binding, args, kwargs)

    one = fp(1, "a", "b", x=1, y=[2])
    assert fp(1, "a", "b", y=[2], x=1) == one  # keywords in any order
    assert fp(1, "b", "a", x=1, y=[2]) != one  # extra positional arguments in order
    assert fp(1, "a", "b", x=1) != one and fp(1, "a", x=1, y=[2]) != one
    assert fp(1, "a", "b", x=1, y=[2], k=1) == one  # k is a keyword-only parameter passed at its default
    assert fp(1) == fp(1, k=1) and fp(1) != fp(1, ())  # empty *args/**kwargs left out; an extra () is an argument
    assert fp(step=1) == fp(1)


def test_a_call_that_does_not_bind_has_no_signature_fingerprint() -> None:
    binding = binding_of(_f_kwonly, None)
    assert binding is not None
    assert signature_fingerprint(binding, (1,), {}) is None  # seed is required
    assert signature_fingerprint(binding, (1, 2), {"seed": 0}) is None  # too many positional arguments
    assert signature_fingerprint(binding, (1,), {"seed": 0, "other": 1}) is None  # unknown keyword
    assert signature_fingerprint(binding, (1,), {"seed": 0}) is not None


class Host:
    def method(self, batch, step=1): ...

    @classmethod
    def klass(cls, batch, step=1): ...

    @staticmethod
    def static(batch, step=1): ...

    def varargs(*args): ...  # noqa: N805


@pytest.mark.parametrize("attr", ["method", "klass", "static"])
def test_methods_bind_without_self_or_cls_as_wrapt_hands_their_arguments(attr: str) -> None:
    binding = binding_of(inspect.getattr_static(Host, attr), Host)
    assert binding is not None and binding.positional == ("batch", "step")
    assert binding.bind((5,), {"step": 2}) == binding.bind((), {"batch": 5, "step": 2}) == {"batch": 5, "step": 2}


def test_a_method_taking_only_star_args_keeps_them() -> None:
    binding = binding_of(inspect.getattr_static(Host, "varargs"), Host)
    assert binding is not None and binding.var_positional == "args"
    assert binding.bind((1, 2), {}) == {"args": (1, 2)}


def test_a_target_without_a_readable_signature_has_no_binding() -> None:
    def gen(batch: Any) -> Any:
        return batch

    gen.__signature__ = "no signature"  # inspect.signature raises TypeError
    assert binding_of(gen, None) is None
    assert isinstance(binding_of(len, None), Binding)  # a builtin with a text signature binds


def test_the_plain_fast_path_binds_only_exact_positional_calls() -> None:
    binding = binding_of(_f_plain, None)
    assert binding is not None and binding.plain
    assert binding.bind((1, 2), {}) == {"batch": 1, "step": 2}
    assert binding.bind((1,), {}) is None and binding.bind((1, 2, 3), {}) is None


# ------------------------------------------------------------------------------------------------ paths


def _same(binding: Binding, a: tuple[tuple[Any, ...], dict[str, Any]], b: tuple[tuple[Any, ...], dict[str, Any]],
          **paths: Any) -> bool:
    return signature_fingerprint(binding, *a, **paths) == signature_fingerprint(binding, *b, **paths)


def test_ignore_paths_by_position_or_name_address_the_parameter_however_it_is_passed() -> None:
    binding = binding_of(_f_plain, None)
    assert binding is not None
    one, two = {"x": 1, "seed": 1}, {"x": 1, "seed": 2}
    for path in ("0.seed", "batch.seed", "*.seed"):
        ignore = [path]
        assert _same(binding, ((one, 3), {}), ((two, 3), {}), ignore=ignore)
        assert _same(binding, ((one, 3), {}), ((), {"batch": two, "step": 3}), ignore=ignore)
        assert _same(binding, ((one,), {"step": 3}), ((two, 3), {}), ignore=ignore)
        assert not _same(binding, ((one, 3), {}), (({"x": 2, "seed": 1}, 3), {}), ignore=ignore)
    assert not _same(binding, ((one, 3), {}), ((two, 3), {}), ignore=["1.seed"])  # names the step, not the batch
    assert _same(binding, ((one, 3), {}), ((one, 4), {}), ignore=["step"])
    assert _same(binding, ((one, 3), {}), ((one,), {"step": 4}), ignore=["1"])


def test_ignore_paths_address_extra_positional_and_keyword_arguments_as_the_arguments_rule_does() -> None:
    binding = binding_of(_f_var, None)
    assert binding is not None
    a, b = {"seed": 1, "v": 0}, {"seed": 2, "v": 0}
    # position 2 is the second extra positional argument (samples[1]); under the arguments rule the same path
    assert _same(binding, ((1, "s", a), {}), ((1, "s", b), {}), ignore=["2.seed"])
    assert fingerprint((1, "s", a), {}, ignore=["2.seed"]) == fingerprint((1, "s", b), {}, ignore=["2.seed"])
    assert not _same(binding, ((1, "s", a), {}), ((1, "s", b), {}), ignore=["1.seed"])
    # a keyword that is no parameter names a key of **opts
    assert _same(binding, ((1,), {"cfg": a}), ((1,), {"cfg": b}), ignore=["cfg.seed"])
    assert _same(binding, ((1,), {"cfg": a}), ((1,), {"cfg": b}), ignore=["*.seed"])
    assert not _same(binding, ((1,), {"cfg": a}), ((1,), {"cfg": b}), ignore=["opts.seed"])


def test_include_paths_hash_only_what_they_name_and_report_when_they_name_nothing() -> None:
    binding = binding_of(_f_plain, None)
    assert binding is not None
    tokens = torch.arange(4)
    batch = {"batch": {"input_ids": tokens, "rewards": torch.zeros(2)}}
    other = {"batch": {"input_ids": tokens, "rewards": torch.ones(2)}}
    include = ["*.batch.input_ids"]
    assert _same(binding, ((batch, 1), {}), ((), {"batch": other, "step": 1}), include=include)
    assert not _same(binding, ((batch, 1), {}), (({"batch": {"input_ids": tokens + 1}}, 1), {}), include=include)
    unmatched: list[int] = []
    fp = signature_fingerprint(binding, ({"x": 1}, 1), {}, include=include, on_unmatched=lambda: unmatched.append(1))
    assert unmatched == [1] and fp == signature_fingerprint(binding, ({"x": 1}, 1), {})  # everything hashed


# ------------------------------------------------------------------------------------------------ real replays

HOST = '''
import torch

CALLS = []


def gen(batch, step, n=2):
    CALLS.append(("gen", tuple(batch), step))
    return {"v": torch.tensor([float(sum(batch)) * n, float(step)])}


class Rollout:
    def generate(self, batch, step, *, temperature=1.0):
        CALLS.append(("generate", tuple(batch), step))
        return {"v": torch.tensor([float(sum(batch)) * temperature, float(step)])}


def score(step, *samples, **opts):
    CALLS.append(("score", samples, step))
    return {"v": torch.tensor([float(len(samples)), float(sum(opts.values())), float(step)])}


def unbound(batch, step):
    CALLS.append(("unbound", tuple(batch), step))
    return {"v": torch.tensor([float(sum(batch)), float(step)])}


unbound.__signature__ = "none"  # inspect.signature cannot read it: fingerprinted as passed
'''

STEP = {"source": "arg", "arg": "step", "path": ""}


def _plan(name: str, dump: Path, **role: Any) -> dict[str, Any]:
    return {"skip": {"rollout": {
        "enable": True, "dump_dir": str(dump), "step": STEP, "fingerprint": {"on_mismatch": "error"},
        "targets": {"gen": f"{name}:gen", "generate": f"{name}:Rollout.generate", "score": f"{name}:score",
                    "unbound": f"{name}:unbound"}, **role}}}


def _rules(dump: Path) -> dict[str, set[str]]:
    """Target -> the fingerprint rules its entries' manifests name (single manifests and group files)."""
    rules: dict[str, set[str]] = {}
    for path in dump.rglob("*.json"):
        if not path.name.endswith((".manifest.json", ".pack.json")):
            continue
        data = json.loads(path.read_text())
        for m in data.get("entries", [data]):
            rules.setdefault(m["target"], set()).add(m["fingerprint_rule"])
    return rules


def test_positional_keyword_and_mixed_calls_of_one_input_hit_one_recording(host_module: Any, tmp_path: Path,
                                                                             caplog: Any) -> None:
    name, _ = host_module(HOST)
    m = sys.modules[name]
    dump = tmp_path / "dump"
    skipweave.weave(_plan(name, dump))
    rollout = m.Rollout()
    recorded = [m.gen([1, 2], 1), m.gen([5], 1), m.gen([7, 7], 1),
                rollout.generate([1], 1), rollout.generate([2, 2], 1),
                m.score(1, "a", "b", k=1), m.score(1, "c", k=1, j=2)]
    skipweave.unweave()
    assert len(m.CALLS) == 7
    assert _rules(dump) == {"gen": {"signature"}, "generate": {"signature"}, "score": {"signature"}}
    m.CALLS.clear()

    # another order than the recording's, every call form: each call is served its own input's entry (a lone
    # writer's part would otherwise be served by position, and on_mismatch=error would stop the run)
    skipweave.weave(_plan(name, dump, replay_only=True))
    with caplog.at_level(logging.WARNING, logger="skipweave"):
        served = [m.gen(batch=[7, 7], step=1), m.gen([5], step=1), m.gen([1, 2], 1, n=2),
                  m.Rollout.generate(rollout, batch=[2, 2], step=1, temperature=1.0),
                  rollout.generate([1], step=1),
                  m.score(1, "c", j=2, k=1), m.score(1, "a", "b", k=1)]
    skipweave.unweave()
    assert m.CALLS == []
    assert "inputs differ" not in caplog.text and "other inputs" not in caplog.text
    expected = [recorded[2], recorded[1], recorded[0], recorded[4], recorded[3], recorded[6], recorded[5]]
    assert all(torch.equal(s["v"], e["v"]) for s, e in zip(served, expected, strict=True))


def _commit_as_passed(m: Any, dump: Path, step: int, calls: list[tuple[tuple[Any, ...], dict[str, Any]]],
                      shard: str = "r0") -> None:
    """Entries of ``gen`` as format 1 took them: the input fingerprint of the arguments as passed, the manifest's
    ``fingerprint_rule`` ``arguments``; the part closed (complete)."""
    from skipweave.store.step_store import EntryMeta, StepStore

    store = StepStore(str(dump), "default", "rollout")
    for c, (args, kwargs) in enumerate(calls):
        store.commit(store.key(step, "gen", shard, c), store.stage(m.gen(*args, **kwargs), rng_state=None),
                     EntryMeta(f"{m.__name__}:gen", fingerprint(args, kwargs), 0.1, fingerprint_rule="arguments"))
    store.close_part(step, "gen", shard)
    m.CALLS.clear()


def _count_arguments_digests(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the ``arguments`` digests the proxies take (:meth:`CallLedger.arguments_digest`)."""
    import skipweave.weaving.calls as calls

    taken: list[int] = []
    real = calls.fingerprint

    def counting(*args: Any, **kwargs: Any) -> str:
        taken.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(calls, "fingerprint", counting)
    return taken


def test_an_entry_whose_manifest_says_arguments_is_matched_by_the_as_passed_digest(
        host_module: Any, tmp_path: Path, caplog: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from skipweave.weaving.replay import FingerprintMismatch

    name, _ = host_module(HOST)
    m = sys.modules[name]
    dump = tmp_path / "dump"
    _commit_as_passed(m, dump, 1, [(([1, 2], 1), {}), (([5],), {"step": 1})])
    expected = [m.gen([5], step=1), m.gen([1, 2], 1)]
    m.CALLS.clear()
    taken = _count_arguments_digests(monkeypatch)
    skipweave.weave(_plan(name, dump, replay_only=True))
    with caplog.at_level(logging.WARNING, logger="skipweave"):
        served = [m.gen([5], step=1), m.gen([1, 2], 1)]  # the forms they were recorded in, in another order
    skipweave.unweave()
    assert m.CALLS == [] and "inputs differ" not in caplog.text
    assert all(torch.equal(s["v"], e["v"]) for s, e in zip(served, expected, strict=True))
    assert taken  # compared by the rule the entries were taken with

    # another form of the first input: as passed it is another input (format 1's rule), so the entry at its position
    # is refused with on_mismatch=error, naming the as-passed digest
    skipweave.weave(_plan(name, dump, replay_only=True))
    with pytest.raises(FingerprintMismatch, match=fingerprint(([1, 2],), {"step": 1})):
        m.gen([1, 2], step=1)


def test_a_store_of_signature_entries_never_takes_the_as_passed_digest(host_module: Any, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    name, _ = host_module(HOST)
    m = sys.modules[name]
    dump = tmp_path / "dump"
    taken = _count_arguments_digests(monkeypatch)
    skipweave.weave(_plan(name, dump))
    m.gen([1], 1)
    m.gen([2], 1)
    skipweave.unweave()
    skipweave.weave(_plan(name, dump, replay_only=True))
    m.gen(batch=[2], step=1)
    m.gen([1], step=1)
    skipweave.unweave()
    assert len(m.CALLS) == 2 and taken == []


def test_a_target_without_a_readable_signature_is_fingerprinted_as_passed(host_module: Any, tmp_path: Path) -> None:
    from skipweave.weaving.replay import FingerprintMismatch

    name, _ = host_module(HOST)
    m = sys.modules[name]
    dump = tmp_path / "dump"
    plan = {"skip": {"rollout": {"enable": True, "dump_dir": str(dump), "step": {"source": "set_step"},
                                 "fingerprint": {"on_mismatch": "error"}, "targets": {"unbound": f"{name}:unbound"}}}}
    skipweave.set_step(1)
    skipweave.weave(plan)
    recorded = [m.unbound([1], 1), m.unbound([2], 1)]
    skipweave.unweave()
    assert _rules(dump) == {"unbound": {"arguments"}}
    m.CALLS.clear()
    plan["skip"]["rollout"]["replay_only"] = True
    skipweave.weave(plan)
    served = [m.unbound([2], 1), m.unbound([1], 1)]
    skipweave.unweave()
    assert m.CALLS == [] and torch.equal(served[0]["v"], recorded[1]["v"]) and torch.equal(served[1]["v"],
                                                                                             recorded[0]["v"])
    skipweave.weave(plan)
    with pytest.raises(FingerprintMismatch):
        m.unbound([1], step=1)


def test_a_verify_run_compares_inputs_by_each_entry_s_rule(host_module: Any, tmp_path: Path) -> None:
    name, _ = host_module(HOST)
    m = sys.modules[name]
    dump, report = tmp_path / "dump", tmp_path / "report.jsonl"
    _commit_as_passed(m, dump, 1, [(([1, 2], 1), {})])  # format 1's rule
    skipweave.weave(_plan(name, dump))
    m.gen([3], 2)  # today's rule
    skipweave.unweave()
    verify = _plan(name, dump, action="verify", report=str(report))
    for args, kwargs in ((([1, 2], 1), {}), (([1, 2],), {"step": 1}), (([3],), {"step": 2}), (([3], 2), {})):
        skipweave.weave(verify)
        m.gen(*args, **kwargs)
        skipweave.unweave()
    lines = [json.loads(x) for x in report.read_text().splitlines()]
    # the format-1 entry: the same form is the same input, another form another (as passed); today's: any form
    assert [(x["step"], x["inputs"]) for x in lines] == [(1, "same"), (1, "differ"), (2, "same"), (2, "same")]


def test_a_fingerprint_shard_of_format_1_serves_its_input_after_the_upgrade(host_module: Any, tmp_path: Path,
                                                                            caplog: Any) -> None:
    name, _ = host_module(HOST)
    m = sys.modules[name]
    dump = tmp_path / "dump"
    # format 1 named each input's shard by its as-passed digest
    for args in (([1, 2], 1), ([5], 1)):
        _commit_as_passed(m, dump, 1, [(args, {})], shard="f" + fingerprint(args, {})[:16])
    expected = m.gen([5], 1)
    m.CALLS.clear()
    skipweave.weave(_plan(name, dump, shard="fingerprint", replay_only=True))
    with caplog.at_level(logging.WARNING, logger="skipweave"):
        served = m.gen([5], 1)
        assert m.gen([1, 2], 1)["v"].tolist() == [6.0, 1.0]
    skipweave.unweave()
    assert m.CALLS == [] and torch.equal(served["v"], expected["v"]) and "inputs differ" not in caplog.text
    # a new input is recorded in the shard of its signature digest, which then serves every form of it
    skipweave.weave(_plan(name, dump, shard="fingerprint"))
    m.gen([9], 1)
    skipweave.unweave()
    for args, kwargs in (((), {"batch": [9], "step": 1}), (([9],), {"step": 1})):
        skipweave.weave(_plan(name, dump, shard="fingerprint", replay_only=True))
        m.gen(*args, **kwargs)
        skipweave.unweave()
    assert m.CALLS == [("gen", (9,), 1)]
    shards = {p.name.split("-")[0] for p in (dump / "default" / "rollout" / "1" / "gen").glob("*.manifest.json")}
    shards |= {p.name.split("-")[0] for p in (dump / "default" / "rollout" / "1" / "gen").glob("*.pack.json")}
    assert len(shards) == 3
