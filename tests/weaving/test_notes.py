"""Result notes: a host's convention for marking results is declared by its integration; the proxy writes it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

import skipweave
from skipweave.integrations.verl.meta_info import META_INFO
from skipweave.weaving.notes import RESULT_NOTES, ResultNote

HOST = '''
class Batch:
    def __init__(self, step):
        self.meta_info = {"global_steps": step}
        self.extra = {}


def gen(batch):
    return Batch(batch.meta_info["global_steps"])
'''


@pytest.fixture
def mod(host_module: Any) -> Any:
    name, _ = host_module(HOST)
    return sys.modules[name]


def test_verl_meta_info_is_a_registered_note() -> None:
    assert META_INFO in RESULT_NOTES.items()
    assert ("meta_info", "skipweave") in RESULT_NOTES.current()


def test_a_note_is_declared_not_called() -> None:
    with pytest.raises(TypeError, match="ResultNote"):
        RESULT_NOTES.add(lambda *a: None)  # type: ignore[arg-type]


@pytest.mark.parametrize("general", [False, True])
def test_every_registered_note_sees_each_result_and_a_removed_one_none(mod: Any, tmp_path: Path,
                                                                       general: bool) -> None:
    note = ResultNote("extra", "fate")

    skipweave.weave({"skip": {"rollout": {"enable": True, "convention": "verl", "dump_dir": str(tmp_path), "steps": [1],
                                          "targets": {"g": f"{mod.__name__}:gen"}}}})
    if general:  # the proxy's own path (async targets, subclasses that replace __call__) instead of the front
        from skipweave.weaving.proxy import proxy_of

        mod.gen._self_wrapper.skipweave_proxy.ledger.running += 1  # the front hands every call to the proxy
        assert proxy_of(mod.gen._self_wrapper) is not None
    RESULT_NOTES.add(note)
    try:
        out = mod.gen(mod.Batch(2))
        assert out.meta_info["skipweave"] == {"status": "bypass", "step": 2, "served_step": None}
        assert out.extra["fate"] == {"status": "bypass", "step": 2, "served_step": None}
        out = mod.gen(mod.Batch(1))
        assert out.extra["fate"] == {"status": "miss", "step": 1, "served_step": None}
    finally:
        RESULT_NOTES.remove(note)
        if general:
            mod.gen._self_wrapper.skipweave_proxy.ledger.running -= 1
    out = mod.gen(mod.Batch(3))
    assert out.extra == {}
    assert out.meta_info["skipweave"]["step"] == 3
