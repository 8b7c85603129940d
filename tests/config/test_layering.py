"""config and policy know nothing above them: no import of the integrations or a host, and config none of policy.

Read from the source (every import statement, also one inside a function), so a lazy import counts too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import skipweave

PACKAGE = Path(skipweave.__file__).parent
HOSTS = ("verl", "ray", "tensordict")
REFUSED = {
    "config": ("skipweave.integrations", "skipweave.policy", "skipweave.weaving", *HOSTS),
    "policy": ("skipweave.integrations", "skipweave.weaving", *HOSTS),
}


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
    return names


@pytest.mark.parametrize("layer", sorted(REFUSED))
def test_a_layer_imports_nothing_above_it(layer: str) -> None:
    found = [
        f"{path.relative_to(PACKAGE)} imports {name}"
        for path in sorted((PACKAGE / layer).glob("*.py"))
        for name in _imports(path)
        if any(name == refused or name.startswith(refused + ".") for refused in REFUSED[layer])
    ]
    assert not found, found
