"""Render the configuration reference (``docs/configuration.md``) from the schema's dataclasses.

::

    python -m skipweave.config.reference                                  # print the page
    python -m skipweave.config.reference --write docs/configuration.md    # regenerate it
    python -m skipweave.config.reference --check docs/configuration.md    # exit 1 when it is stale

Everything on the page that describes a key comes from :mod:`skipweave.config.schema`: the fields of
:class:`RoleConfig` and of the mappings nested in it, their types (written as a config author writes
them: ``int or null``, ``list of string``, an enum's allowed values), their defaults (in config form:
``all``, ``cache``, ``null``) and the ``Attributes:`` sections of their docstrings; the allowed values
of each enum with the meaning its docstring gives them. ``tests/docs/test_configuration_reference.py``
fails when the page and the schema disagree, so a changed field, default or docstring shows up there.

Only the short introduction and the shorthand forms (which live in the schema's shorthand functions, not in a
dataclass) are written here by hand.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import inspect
import re
import sys
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from skipweave.config.compare import CompareSpec
from skipweave.config.schema import (
    RUN_KEYS,
    Action,
    BypassConfig,
    BypassKind,
    FingerprintConfig,
    KeepConfig,
    OnDiverge,
    OnForeign,
    OnMismatch,
    RoleConfig,
    Serve,
    ShardKind,
    SkipConfig,
    StepSet,
    StepSourceConfig,
    StepSourceKind,
    StubSpec,
    TargetSpec,
)
from skipweave.config.values import parse_steps

PAGE_PATH = "docs/configuration.md"
"""Where the rendered page lives, relative to the repository root."""

REGENERATE = f"python -m skipweave.config.reference --write {PAGE_PATH}"
"""The command that brings the page up to date."""

IDENTITY_FIELDS = {"role": "the role's name: the key under `skip`", "name": "the key under `targets`"}
"""Dataclass fields that are not keys of their mapping but its name."""

GUIDE: dict[type[enum.Enum], str] = {
    Action: "actions.md",
    StepSourceKind: "steps.md#step-sources",
    BypassKind: "steps.md#bypass",
    OnMismatch: "troubleshooting.md#a-fingerprint-mismatch",
    OnForeign: "troubleshooting.md#a-recording-of-a-newer-format",
    ShardKind: "ray.md#several-writers-of-one-target",
    Serve: "verify.md#what-the-host-gets",
    OnDiverge: "verify.md#what-the-host-gets",
}
"""The guide page that explains each enum with examples."""

INTRO = """\
# Configuration reference

<!-- Generated from skipweave/config/schema.py by `{regenerate}`.
     Do not edit by hand: tests/docs/test_configuration_reference.py fails when this page is stale. -->

Every setting lives under `skip.<role>` of the application's config (`skip.rollout`, `skip.async_rollout`,
`skip.rollout_tq`, or a role name of your own), but for the [settings of the run](#run-settings) as a whole
(`skip.strict`), which are therefore no role names. A profile (`+skip=rollout_cache`) fills some of them; the
application's YAML, the command line and `skipweave.weave(...)` set the others (see [Profiles](profiles.md)
and [Hydra](hydra.md)). Every value is validated before anything is patched: a bad one stops the run with
a `ConfigError` naming the key, the value and what is allowed.

Types are written as in YAML: `null` is YAML's null (Python's `None`); a *mapping* is a YAML mapping.

Shorthands the parser also accepts:

- `skip.<role>: false` means `{{enable: false}}`; a config without `skip` disables every role.
- `targets.<name>: pkg.mod:Class.method` (a string) means `{{path: pkg.mod:Class.method}}`;
  `targets.<name>: null` removes a target another config source added.
- `step: counter` (a string) means `{{source: counter}}`.
- `bypass: null` or `bypass: false` means `{{when: never}}`.
- `dump_dir: null` and `namespace: null` mean the default (a profile's `???` too).
- Keys such as `_target_` directly under `skip` (verl's `skip._target_`) are not roles and are ignored.
"""


# ------------------------------------------------------------------------------------------------ docstrings
def _markdown(text: str) -> str:
    """Turn reStructuredText inline markup of a docstring into Markdown."""
    text = re.sub(r":class:`~?([\w.]+)`", lambda m: _class_ref(m.group(1)), text)
    text = re.sub(r":(?:mod|func|meth|attr|data):`~?([\w.]+)`", r"`\1`", text)
    return text.replace("``None``", "`null`").replace("``", "`")


def _class_ref(dotted: str) -> str:
    name = dotted.rsplit(".", 1)[-1]
    enums = {cls.__name__ for cls in GUIDE}
    return f"[`{name}`](#{name.lower()})" if name in enums else f"`{name}`"


def _summary(obj: Any) -> str:
    """The first paragraph of ``obj``'s docstring, on one line."""
    doc = inspect.getdoc(obj) or ""
    return _markdown(" ".join(doc.split("\n\n", 1)[0].split()))


def attribute_docs(cls: type) -> dict[str, str]:
    """Parse the ``Attributes:`` section of a class docstring into ``{field: one-line text}``."""
    doc = inspect.getdoc(cls) or ""
    out: dict[str, str] = {}
    inside, current = False, None
    for line in doc.splitlines():
        if line.strip() == "Attributes:":
            inside = True
            continue
        if not inside:
            continue
        if line and not line.startswith(" "):  # the next section
            break
        m = re.match(r"^ {4}([A-Za-z_][\w, ]*):\s*(.*)$", line)
        if m:
            current = m.group(1)
            out[current] = m.group(2).strip()
        elif current is not None and line.strip():
            out[current] += " " + line.strip()
    # "a, b: text" documents several fields at once
    for names in [k for k in out if "," in k]:
        for name in names.split(","):
            out[name.strip()] = out[names]
    return {k: _markdown(v) for k, v in out.items()}


def enum_value_docs(cls: type[enum.Enum]) -> dict[str, str]:
    """Parse the ``- ``value``: text`` bullets of an enum's docstring into ``{value: text}``."""
    doc = inspect.getdoc(cls) or ""
    out: dict[str, str] = {}
    current: list[str] = []
    for line in doc.splitlines():
        m = re.match(r"^- ((?:``[\w-]+``(?: / )?)+):\s*(.*)$", line)
        if m:
            current = re.findall(r"``([\w-]+)``", m.group(1))
            for value in current:
                out[value] = m.group(2).strip()
        elif current and line.startswith("  ") and line.strip():
            for value in current:
                out[value] += " " + line.strip()
        else:
            current = []
    return {k: _markdown(v) for k, v in out.items()}


# ------------------------------------------------------------------------------------------------ types
def type_text(tp: Any) -> str:
    """Describe a field's annotation as a config author writes the value."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        parts = [type_text(a) for a in args if a is not type(None)]
        return " or ".join(parts + (["`null`"] if type(None) in args else []))
    if origin is tuple:
        if _is_target_mapping(tp):
            return "mapping name → [target](#target-settings)"
        item = typing.get_args(tp)[0]
        if typing.get_origin(item) is tuple and len(typing.get_args(item)) == 2:  # (name, value) pairs
            return "mapping `string` → " + ("any plain value" if typing.get_args(item)[1] is Any
                                            else type_text(typing.get_args(item)[1]))
        return f"list of {type_text(item)}"
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        values = ", ".join(f"`{m.value}`" for m in tp)
        return f"one of {values} ([`{tp.__name__}`](#{tp.__name__.lower()}))"
    if tp is StepSet:
        return "[step set](#step-sets)"
    if tp is CompareSpec:
        return ("mapping `{default: <rule>, fields: {<path glob>: <rule>}}`, a rule being `exact`, `ignore` or "
                "`{atol: .., rtol: ..}` ([verify.md](verify.md#what-equal-means))")
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return f"mapping ([below](#{_anchor(tp)}))"
    names = {bool: "`bool`", int: "`int`", str: "`string`", float: "`float`"}
    if tp in names:
        return names[tp]
    if tp is Any:
        return "any plain value (`null`, number, string, list, mapping)"
    return f"`{getattr(tp, '__name__', tp)}`"


def _anchor(cls: type) -> str:
    return {
        TargetSpec: "target-settings",
        StepSourceConfig: "step-source-settings",
        BypassConfig: "bypass-settings",
        FingerprintConfig: "fingerprint-settings",
        KeepConfig: "retention-settings",
        StubSpec: "stub-settings",
    }[cls]


# ------------------------------------------------------------------------------------------------ defaults
def config_value(value: Any) -> Any:
    """Return a default in the form a config holds it (enum value, step-set text, list for a tuple)."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, StepSet):
        return value.to_config()
    if isinstance(value, tuple):
        return [config_value(v) for v in value]
    return value


def default_text(f: dataclasses.Field[Any], hint: Any) -> str:
    """Render a field's default as YAML: ``see below`` for a nested mapping, ``required`` when it has none."""
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
        if isinstance(value, CompareSpec):
            return _yaml(value.to_config())
        if dataclasses.is_dataclass(value) and not isinstance(value, StepSet):
            return "see below"
    else:
        return "required"
    if _is_target_mapping(hint):
        return "`{}`" if not value else _yaml({t.name: t.path for t in value})
    return _yaml(config_value(value))


def _is_target_mapping(hint: Any) -> bool:
    """True for ``tuple[TargetSpec, ...]``, which a config writes as a mapping name -> target."""
    return typing.get_origin(hint) is tuple and typing.get_args(hint)[:1] == (TargetSpec,)


def _yaml(value: Any) -> str:
    if isinstance(value, dict):
        return "`{" + ", ".join(f"{k}: {_yaml(v).strip('`')}" for k, v in value.items()) + "}`"
    if isinstance(value, list):
        return "`[" + ", ".join(_yaml(v).strip("`") for v in value) + "]`" if value else "`[]`"
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    return f"`{value}`"


# ------------------------------------------------------------------------------------------------ page
def fields_table(cls: type, *, prefix: str) -> list[str]:
    """A Markdown table of the keys of one mapping: key, type, default, meaning."""
    hints = typing.get_type_hints(cls)
    docs = attribute_docs(cls)
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in IDENTITY_FIELDS:
            continue
        hint = hints[f.name]
        rows.append(f"| `{prefix}{f.name}` | {type_text(hint)} | {default_text(f, hint)} | {docs.get(f.name, '')} |")
    return rows


def enum_section(cls: type[enum.Enum]) -> list[str]:
    """The allowed values of one enum, with the meaning of each where its docstring gives one."""
    docs = enum_value_docs(cls)
    guide = GUIDE[cls]
    lines = [f"### `{cls.__name__}`", "", f"{_summary(cls)} Explained with examples in [{guide}]({guide}).", ""]
    if docs:
        lines += ["| value | meaning |", "|---|---|"]
        lines += [f"| `{m.value}` | {docs.get(m.value, '')} |" for m in cls]
    else:
        lines.append("Values: " + ", ".join(f"`{m.value}`" for m in cls) + ".")
    return lines + [""]


def run_table() -> list[str]:
    """A Markdown table of the keys directly under ``skip`` that are settings of the run (:data:`RUN_KEYS`)."""
    hints = typing.get_type_hints(SkipConfig)
    docs = attribute_docs(SkipConfig)
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for f in dataclasses.fields(SkipConfig):
        if f.name in RUN_KEYS:
            rows.append(f"| `{f.name}` | {type_text(hints[f.name])} | {default_text(f, hints[f.name])} | "
                        f"{docs.get(f.name, '')} |")
    return rows


def render() -> str:
    """Return the whole page as Markdown."""
    out = [INTRO.format(regenerate=REGENERATE)]
    out += ["## Run settings", "", "`skip`: settings of the run as a whole, beside its roles.", "", *run_table(), ""]
    sections: list[tuple[str, str, type, str]] = [
        ("Role settings", "skip.<role>", RoleConfig, ""),
        ("Target settings", "skip.<role>.targets.<name>", TargetSpec, ""),
        ("Step source settings", "skip.<role>.step", StepSourceConfig, "step."),
        ("Bypass settings", "skip.<role>.bypass", BypassConfig, "bypass."),
        ("Fingerprint settings", "skip.<role>.fingerprint", FingerprintConfig, "fingerprint."),
        ("Retention settings", "skip.<role>.keep", KeepConfig, "keep."),
        ("Stub settings", "skip.<role>.targets.<name>.stub", StubSpec, "stub."),
    ]
    for title, node, cls, prefix in sections:
        identity = [f for f in IDENTITY_FIELDS if f in {x.name for x in dataclasses.fields(cls)}]  # type: ignore[arg-type]
        out += [f"## {title}", "", f"`{node}`: {_summary(cls)}", ""]
        if identity:
            out += [f"Its name is {IDENTITY_FIELDS[identity[0]]}.", ""]
        out += fields_table(cls, prefix=prefix) + [""]
    out += [
        "## Step sets",
        "",
        "`steps` and `record_steps` take a *step set*. "
        + _summary(parse_steps).replace("Parse `steps`: ", "Any of: ").rstrip(".")
        + "; e.g. `steps: [1, 2, '5-8']` or, on a command line, `skip.rollout.steps=[1,2,5-8]`. "
        "Ranges may also be written `3..7` or `3:7`; overlapping ranges are merged. "
        "An empty list is refused (it would select no step: use `enable: false`).",
        "",
        "## Allowed values",
        "",
    ]
    for cls in GUIDE:
        out += enum_section(cls)
    return "\n".join(out).rstrip() + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Print, write or check the page; returns the exit status."""
    parser = argparse.ArgumentParser(description="Render the configuration reference from the schema.")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", metavar="PATH", type=Path, help="write the page to PATH")
    group.add_argument("--check", metavar="PATH", type=Path, help="exit 1 when PATH differs from the render")
    args = parser.parse_args(argv)
    page = render()
    if args.write:
        args.write.write_text(page, encoding="utf-8")
    elif args.check:
        current = args.check.read_text(encoding="utf-8") if args.check.exists() else ""
        if current != page:
            print(f"{args.check} is out of date with skipweave/config/schema.py; run: {REGENERATE}", file=sys.stderr)
            return 1
    else:
        sys.stdout.write(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
