"""``docs/configuration.md`` is generated from the schema and must match it.

Regenerate with ``python -m skipweave.config.reference --write docs/configuration.md``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from skipweave.config import reference, schema

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / reference.PAGE_PATH


def test_page_is_up_to_date() -> None:
    assert PAGE.read_text(encoding="utf-8") == reference.render(), (
        f"{reference.PAGE_PATH} is out of date with skipweave/config/schema.py; run: {reference.REGENERATE}"
    )


def test_check_command_reports_a_stale_page(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stale = tmp_path / "configuration.md"
    stale.write_text(reference.render().replace("`cache`", "`kache`"), encoding="utf-8")
    assert reference.main(["--check", str(stale)]) == 1
    assert reference.REGENERATE in capsys.readouterr().err
    assert reference.main(["--write", str(stale)]) == 0
    assert reference.main(["--check", str(stale)]) == 0


def test_every_key_and_allowed_value_is_on_the_page() -> None:
    page = reference.render()
    for cls, prefix in ((schema.RoleConfig, ""), (schema.TargetSpec, ""), (schema.StepSourceConfig, "step."),
                        (schema.BypassConfig, "bypass."), (schema.FingerprintConfig, "fingerprint.")):
        for f in dataclasses.fields(cls):
            if f.name not in reference.IDENTITY_FIELDS:
                assert f"| `{prefix}{f.name}` |" in page, f.name
    for enum_cls in reference.GUIDE:
        for value in (m.value for m in enum_cls):
            assert f"`{value}`" in page, value


def test_a_schema_change_changes_the_page(monkeypatch: pytest.MonkeyPatch) -> None:
    """A new field, a changed default or a new enum value each make the committed page stale."""
    page = reference.render()

    @dataclasses.dataclass(frozen=True)
    class Extended(schema.RoleConfig):
        """Validated settings of one role.

        Attributes:
            new_knob: a setting added to the schema.
        """

        new_knob: int = 3

    monkeypatch.setattr(reference, "RoleConfig", Extended)
    assert "| `new_knob` | `int` | `3` | a setting added to the schema. |" in reference.render()
    monkeypatch.undo()

    monkeypatch.setattr(schema.StepSourceConfig.__dataclass_fields__["path"], "default", "state.step")
    assert reference.render() != page
    monkeypatch.undo()
    assert reference.render() == page
