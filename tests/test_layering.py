"""The package's layering (docs/architecture.md): what the generic layers import, import cycles, private names.

- The generic layers (``config``, ``policy``, ``weaving``, ``store``, ``verify``, ``export``, ``view``) name no
  host: importing any of their modules in a fresh interpreter leaves ``skipweave.integrations``, verl, Ray and
  tensordict out of ``sys.modules`` (integrations register with them through :mod:`skipweave.hooks` instead).
- Using a generic layer (reading a registry, loading a config, compiling a gate and reading steps and bypasses,
  scanning a store, the codec, weaving, recording and replaying a call, comparing two results and two recordings read
  as views, exporting a store, writing its page), each in a fresh interpreter, loads no integration and no host
  either: the registries are passive, and only the assembling entry points load the integrations. Every generic layer
  has such a case. A Hydra app that looks for a profile no earlier source holds makes skipweave's search-path plugin
  read the integrations' declarations, and nothing more.
- No import cycle among the package's modules at import time. The graph is built from each module's import-time
  statements (module level, class bodies and ``if``/``try``/``with`` blocks; not function bodies, not
  ``if TYPE_CHECKING:`` blocks), read from the source with :mod:`ast`, so one a refactoring would create in a rarely
  imported module counts. Counting every import (function-level and ``TYPE_CHECKING`` ones too), no circle but the
  known ones (:data:`KNOWN_CIRCLES`, a list that only shrinks).
- No module uses another module's private names: no ``from skipweave.x import _y``, no ``x._y`` where ``x`` was
  imported from another skipweave module (a module, or an object such as a singleton defined there); the owner adds
  a public function instead. Dunder names (``__version__``), enum ``_sunder_`` names and the namedtuple API
  (``_fields``, ``_replace``, ...) are public by convention and allowed.

Each test lists every violation it finds, so one run shows the whole list.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # starts processes: left out of the fast tier (README)

PACKAGE = "skipweave"
ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIR = ROOT / PACKAGE

GENERIC_LAYERS = ("config", "policy", "weaving", "store", "verify", "export", "view")
"""Sub-packages that must import no host and no integration."""

FORBIDDEN = ("skipweave.integrations", "skipweave.testing", "verl", "ray", "tensordict", "trl")
"""Modules (with their submodules) a generic layer may not bring into ``sys.modules`` at import time (the pytest plugin,
``skipweave.testing``, is an assembling entry point like the integrations' loaders)."""

PUBLIC_UNDERSCORE = frozenset({"_fields", "_field_defaults", "_replace", "_asdict", "_make"})
"""Underscore names that are public API (namedtuple's)."""


def module_name(path: Path) -> str:
    """Dotted name of the package module at ``path`` (``skipweave/store/__init__.py`` -> ``skipweave.store``)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_modules() -> dict[str, Path]:
    """Every module of the package (importable name -> file), files under non-package folders excluded."""
    out: dict[str, Path] = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        folders = [path.parent, *path.parent.parents]
        # a folder without __init__.py (the launcher's sitecustomize folder, put on PYTHONPATH) holds scripts
        if all((f / "__init__.py").exists() for f in folders if f.is_relative_to(PACKAGE_DIR)):
            out[module_name(path)] = path
    return out


MODULES = package_modules()


def is_package(name: str) -> bool:
    """Whether ``name`` is a package (its file is an ``__init__.py``)."""
    return MODULES[name].name == "__init__.py"


def resolve_from(importer: str, level: int, module: str | None) -> str:
    """Absolute name of the module a ``from`` import names, relative levels resolved against ``importer``."""
    if level == 0:
        return module or ""
    base = importer.split(".")
    if not is_package(importer):
        base.pop()
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def is_type_checking(test: ast.expr) -> bool:
    """Whether an ``if`` test is ``TYPE_CHECKING`` / ``typing.TYPE_CHECKING`` (a block that never runs)."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def import_time_statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements of ``body`` that run when the module is imported (function bodies and
    ``if TYPE_CHECKING:`` blocks excluded; class bodies, ``if``/``try``/``with``/loop blocks included)."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if isinstance(stmt, ast.If):
            if not is_type_checking(stmt.test):
                yield from import_time_statements(stmt.body)
            yield from import_time_statements(stmt.orelse)
        elif isinstance(stmt, ast.ClassDef):
            yield from import_time_statements(stmt.body)
        elif isinstance(stmt, (ast.Try, getattr(ast, "TryStar", ast.Try))):
            yield from import_time_statements(stmt.body)
            for handler in stmt.handlers:
                yield from import_time_statements(handler.body)
            yield from import_time_statements(stmt.orelse)
            yield from import_time_statements(stmt.finalbody)
        elif isinstance(stmt, (ast.With, ast.AsyncWith, ast.For, ast.AsyncFor, ast.While)):
            yield from import_time_statements(stmt.body)
            yield from import_time_statements(getattr(stmt, "orelse", []))


def imported_modules(importer: str, stmt: ast.stmt) -> list[str]:
    """The package modules an import statement executes, as seen from ``importer``.

    ``import a.b.c`` and ``from a.b import c`` run ``a``, ``a.b`` and (when it is a module) ``a.b.c``. Packages
    enclosing ``importer`` are left out where the import only passes through them: Python imported them before
    ``importer`` started, so they add no edge (an explicit ``from skipweave.x import name`` of an enclosing
    package still does).
    """
    named: list[tuple[str, bool]] = []  # (module, named explicitly)
    if isinstance(stmt, ast.Import):
        for alias in stmt.names:
            parts = alias.name.split(".")
            named += [(".".join(parts[:i]), i == len(parts)) for i in range(1, len(parts) + 1)]
    elif isinstance(stmt, ast.ImportFrom):
        base = resolve_from(importer, stmt.level, stmt.module)
        parts = base.split(".")
        named += [(".".join(parts[:i]), i == len(parts)) for i in range(1, len(parts) + 1)]
        named += [(f"{base}.{alias.name}", True) for alias in stmt.names if f"{base}.{alias.name}" in MODULES]
    out = []
    for name, explicit in named:
        if name not in MODULES or name == importer:
            continue
        enclosing = importer.startswith(name + ".")
        if enclosing and not explicit:
            continue
        out.append(name)
    return list(dict.fromkeys(out))


def parse(name: str) -> ast.Module:
    return ast.parse(MODULES[name].read_text(encoding="utf-8"), filename=str(MODULES[name]))


def import_graph() -> dict[str, dict[str, int]]:
    """``importer -> {imported module: line}`` over the package's import-time imports."""
    graph: dict[str, dict[str, int]] = {}
    for name in MODULES:
        edges: dict[str, int] = {}
        for stmt in import_time_statements(parse(name).body):
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                for target in imported_modules(name, stmt):
                    edges.setdefault(target, stmt.lineno)
        graph[name] = edges
    return graph


def strongly_connected(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Tarjan's strongly connected components of ``graph`` that hold a cycle (two or more nodes, or a self-loop)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph.get(v, {}):
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph) + 100))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return found


def one_cycle(graph: dict[str, dict[str, int]], component: list[str]) -> list[str]:
    """A shortest cycle through the first module of ``component`` (breadth-first within it), for the message."""
    start = component[0]
    members = set(component)
    paths = {start: [start]}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in graph[v]:
            if w == start:
                return paths[v] + [start]
            if w in members and w not in paths:
                paths[w] = paths[v] + [w]
                queue.append(w)
    return component


def describe_cycle(graph: dict[str, dict[str, int]], cycle: list[str]) -> str:
    steps = [f"{a} (line {graph[a][b]})" for a, b in zip(cycle, cycle[1:], strict=False)]
    return " -> ".join(steps + [cycle[-1]])


# ------------------------------------------------------------------------------------------- generic layers

PRELOAD = ("torch", "numpy", "wrapt", "omegaconf", "safetensors")
"""Third-party libraries the layers may import: loaded once before forking, so each check costs one fork."""

PRELOADED = """
def loaded():
    return sorted(m for m in sys.modules if any(m == f or m.startswith(f + ".") for f in forbidden))
for name in preload:
    try:
        importlib.import_module(name)
    except ImportError:
        pass
assert not loaded(), f"the preloaded libraries bring in {loaded()}"
assert not any(m == "skipweave" or m.startswith("skipweave.") for m in sys.modules)
out = {}
"""
"""The fork checks' shared start: ``loaded()`` lists the forbidden modules present; the preloaded libraries are
imported (and must bring in none of them, nor any of skipweave); ``out`` collects each child's report."""

CHECK_SOURCE = """
import importlib, json, os, sys
modules, forbidden, preload = json.loads(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])
""" + PRELOADED + """for module in modules:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # a child with nothing of skipweave imported yet: import one module, report, leave at once
        os.close(read)
        try:
            importlib.import_module(module)
            found = loaded()
        except BaseException as exc:
            found = f"import failed: {type(exc).__name__}: {exc}"
        os.write(write, json.dumps(found).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as fh:
        data = fh.read()
    os.waitpid(pid, 0)
    out[module] = json.loads(data) if data else "the child died without reporting"
print(json.dumps(out))
"""


def generic_modules() -> list[str]:
    return [m for m in MODULES if any(m == f"{PACKAGE}.{layer}" or m.startswith(f"{PACKAGE}.{layer}.")
                                      for layer in GENERIC_LAYERS)]


def forbidden_after_import(modules: list[str]) -> dict[str, list[str] | str]:
    """For each of ``modules``: the forbidden modules in ``sys.modules`` after importing it, each in a fresh child
    of one interpreter that has imported only the standard library and :data:`PRELOAD` (or why the import
    failed)."""
    proc = subprocess.run([sys.executable, "-c", CHECK_SOURCE, json.dumps(modules), json.dumps(FORBIDDEN),
                           json.dumps(PRELOAD)], capture_output=True, text=True, cwd=str(ROOT), timeout=900)
    assert proc.returncode == 0, proc.stderr
    result: dict[str, list[str] | str] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def test_the_generic_layers_exist() -> None:
    found = {m.split(".")[1] for m in generic_modules()}
    assert found == set(GENERIC_LAYERS), f"layers with no module: {set(GENERIC_LAYERS) - found}"


def test_no_generic_module_imports_an_integration_or_a_host() -> None:
    results = forbidden_after_import(generic_modules())
    bad = {m: r for m, r in results.items() if r}
    roots = {m: sorted({x if x.startswith(f"{PACKAGE}.") else x.split(".")[0] for x in r}) if isinstance(r, list)
             else r for m, r in bad.items()}
    assert not bad, ("importing these modules of the generic layers brings in an integration or a host:\n"
                     + "\n".join(f"  {m}: {r}" for m, r in sorted(roots.items())))


def test_the_import_check_sees_a_host() -> None:
    results = forbidden_after_import([f"{PACKAGE}.integrations.verl.coexist", f"{PACKAGE}.store.format.layout"])
    assert results[f"{PACKAGE}.store.format.layout"] == []
    assert f"{PACKAGE}.integrations.verl.coexist" in results[f"{PACKAGE}.integrations.verl.coexist"]


# ------------------------------------------------------------------------------------------- generic layers at run time

USE_FORBIDDEN = (*FORBIDDEN, "trl", "vllm", "sglang")
"""What using a generic layer may not bring into ``sys.modules`` either (the hosts of the integrations to come too)."""

USE_PRELOAD = (*PRELOAD, "hydra", "xxhash", "filelock")

USE_HOST = """
import random

def generate(n):
    return {"tokens": [random.randrange(100) for _ in range(n)], "n": n}
"""

USES: dict[str, str] = {
    "store.hosts: list the host types (nothing registers one by being read)": (
        "import skipweave.store.hosts as hosts\n"
        "assert list(hosts.HOST_TYPES) == [] and hosts.host_of(object()) is None, list(hosts.HOST_TYPES)\n"
    ),
    "config: load a config holding verl's legacy keys beside skip": (
        "from skipweave.config import load_skip_config\n"
        "plan = load_skip_config({'skip': {'rollout': {'enable': True, 'dump_dir': WORK + '/d', 'step': 'counter',\n"
        "                                  'targets': {'gen': 'usehost:generate'}}},\n"
        "                         'actor_rollout_ref': {'rollout': {'skip_rollout': False}},\n"
        "                         'trainer': {'experiment_name': 'e'}})\n"
        "assert plan.roles['rollout'].enable\n"
    ),
    "store: scan the fixture store, checksums and all": (
        "from skipweave.store.scan import scan\n"
        "result = scan(FIXTURE, checksums=True)\n"
        "assert result.parts, 'the fixture store holds parts'\n"
    ),
    "store: encode and decode a result": (
        "import dataclasses, numpy as np, torch\n"
        "from skipweave.store.format import codec\n"
        "@dataclasses.dataclass\n"
        "class Batch:\n"
        "    batch: dict\n"
        "    non_tensor_batch: dict\n"
        "    meta_info: dict\n"
        "value = {'t': torch.arange(4), 'a': np.arange(3), 'l': [1, 'x', None]}\n"
        "enc = codec.encode(value)\n"
        "back = codec.decode(enc.tree, enc.tensors)\n"
        "assert torch.equal(back['t'], value['t']) and back['l'] == value['l']\n"
    ),
    "weaving: weave a target, record a call, commit it, replay it": (
        "import os\n"
        "from skipweave.config import load_skip_config\n"
        "from skipweave.weaving.weaver import WEAVER\n"
        "from skipweave.store.write_behind import flush\n"
        "plan = load_skip_config({'skip': {'rollout': {'enable': True, 'dump_dir': WORK + '/dump', 'step': 'counter',\n"
        "                                  'targets': {'gen': 'usehost:generate'}}}})\n"
        "WEAVER.weave(plan)\n"
        "import usehost\n"
        "recorded = usehost.generate(3)\n"
        "flush()\n"
        "WEAVER.unweave()\n"
        "from skipweave.store.scan import scan\n"
        "assert scan(WORK + '/dump').entries, 'one entry recorded'\n"
        "WEAVER.weave(plan)  # a new weave: the counter starts again, so the call is step 1's\n"
        "assert usehost.generate(3) == recorded, 'the second call is served from the store'\n"
        "WEAVER.unweave()\n"
    ),
    "config: compose a shipped profile with Hydra (the search-path plugin runs)": (
        "from skipweave.config.profiles import compose_profile\n"
        "from skipweave.config import load_skip_config\n"
        "cfg = compose_profile('rollout_cache', overrides=['skip.rollout.dump_dir=' + WORK + '/d'])\n"
        "assert cfg.skip.rollout.convention == 'verl'  # known once the verl integration is loaded, not before:\n"
        "try:\n"
        "    load_skip_config(cfg)\n"
        "except Exception as exc:\n"
        "    assert 'skip.rollout.convention' in str(exc) and 'load_integrations' in str(exc), exc\n"
        "else:\n"
        "    raise AssertionError('a convention no loaded integration declares was accepted')\n"
        "cfg = compose_profile('trl_grpo_cache', overrides=['skip.rollout.dump_dir=' + WORK + '/d'])\n"
        "assert load_skip_config(cfg).roles['rollout'].enable\n"
    ),
    "export: write the fixture store as JSONL rows": (
        "from skipweave.export.exporter import export\n"
        "from skipweave.store.scan import scan\n"
        "report = export(scan(FIXTURE), WORK + '/rows.jsonl', 'jsonl')\n"
        "assert report.calls + len(report.skipped) > 0, report\n"
    ),
    "view: write the fixture store's page": (
        "from skipweave.store.scan import scan\n"
        "from skipweave.view.charts import charts\n"
        "from skipweave.view.page import Page, write\n"
        "from skipweave.view.summary import summarize\n"
        "summary = summarize(scan(FIXTURE), limit=2)\n"
        "assert write(Page(summary, charts(list(summary.rows.values()))), WORK + '/page.html') > 0\n"
    ),
    "policy: compile a role's gate and read steps and bypasses": (
        "from types import SimpleNamespace\n"
        "from skipweave.config import load_skip_config\n"
        "from skipweave.policy.bypass import make_bypass\n"
        "from skipweave.policy.gate import BYPASS, compile_gate\n"
        "from skipweave.policy.steps import StepSource, set_step\n"
        "role = load_skip_config({'skip': {'rollout': {'enable': True, 'steps': '2-3', 'targets': {'g': 'm:f'},\n"
        "                                  'bypass': {'paths': ['flags.eval']}}}}).roles['rollout']\n"
        "gate = compile_gate(role.bypass, make_bypass(role.bypass, lambda p: None), own=True, expr=None,\n"
        "                    expr_interpreted=None, source=StepSource(role.step), steps=role.steps, positions=None,\n"
        "                    defaults={})\n"
        "assert gate.first(None, (SimpleNamespace(flags={'eval': True}),), {}) is BYPASS\n"
        "assert 2 in gate.eligible and 1 not in gate.eligible\n"
        "assert [gate.first(None, (SimpleNamespace(flags={}),), {}) for _ in range(2)] == [1, 2]\n"
        "set_step(3)\n"
        "assert gate.first(None, (SimpleNamespace(flags={}),), {}) == 3\n"
    ),
    "verify: compare a recorded and a live result": (
        "import torch\n"
        "from skipweave.verify.compare import compare\n"
        "got = compare({'ids': torch.tensor([[1, 2, 3]])}, {'ids': torch.tensor([[1, 2, 4]])})\n"
        "assert got.first is not None\n"
    ),
    "verify: compare recordings read as views (skipweave diff), host-shaped objects among them": (
        "import torch\n"
        "from skipweave.store.format import codec\n"
        "from skipweave.store.format.codec.view import decode_view\n"
        "from skipweave.verify.compare import compare\n"
        "class Batch:\n"
        "    def __init__(self, x):\n"
        "        self.batch, self.non_tensor_batch, self.meta_info = {'x': torch.tensor([x])}, {}, {}\n"
        "views = [decode_view(e.tree, e.tensors) for e in (codec.encode({'a': [1, 2]}), codec.encode({'a': [1, 3]}))]\n"
        "assert compare(*views).first.path == 'a' and compare(views[0], views[0]).status == 'identical'\n"
        "assert compare(Batch(1), Batch(2)).first.path == 'batch.x'\n"
    ),
}
"""What each generic layer is used for (code run in a fresh child; ``WORK`` a private folder on ``sys.path`` holding
``usehost.py``, ``FIXTURE`` the fixture store): none of it may load an integration or a host."""

LOOK_UP = (
    "from hydra import compose, initialize_config_dir\n"
    "open(WORK + '/app.yaml', 'w').write('a: 1\\n')\n"
    "with initialize_config_dir(config_dir=WORK, version_base=None):\n"
    "    try:\n"
    "        compose(config_name='app', overrides=['+skip=no_profile_of_that_name'])\n"
    "    except Exception as exc:\n"
    "        assert 'no_profile_of_that_name' in str(exc), exc\n"
    "    else:\n"
    "        raise AssertionError('composed a profile that exists nowhere')\n"
)
"""A Hydra app looking for a profile no earlier source holds: skipweave's search-path plugin asks the integrations for
their profile folders, which reads their declarations and nothing more."""

USE_SOURCE = """
import importlib, json, os, sys, tempfile, traceback
cases, forbidden, preload, host, fixture = (json.loads(a) for a in sys.argv[1:6])
""" + PRELOADED + """for title, code in cases.items():
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # a child with nothing of skipweave imported yet: use one layer, report, leave at once
        os.close(read)
        try:
            work = tempfile.mkdtemp(prefix="skipweave-layering-")
            with open(os.path.join(work, "usehost.py"), "w") as fh:
                fh.write(host)
            sys.path.insert(0, work)
            exec(compile(code, title, "exec"), {"WORK": work, "FIXTURE": fixture, "__name__": "__case__"})
            found = loaded()
        except BaseException:
            found = "failed: " + traceback.format_exc()
        os.write(write, json.dumps(found).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as fh:
        data = fh.read()
    os.waitpid(pid, 0)
    out[title] = json.loads(data) if data else "the child died without reporting"
print(json.dumps(out))
"""


def forbidden_after_use(cases: dict[str, str]) -> dict[str, list[str] | str]:
    """For each case of ``cases`` (title -> code): the modules of :data:`USE_FORBIDDEN` in ``sys.modules`` after
    running it in a fresh child of one interpreter that imported only the standard library and :data:`USE_PRELOAD`
    (or the traceback of its failure)."""
    fixture = ROOT / "tests" / "fixtures" / "store_v1"
    proc = subprocess.run([sys.executable, "-c", USE_SOURCE, json.dumps(cases), json.dumps(USE_FORBIDDEN),
                           json.dumps(USE_PRELOAD), json.dumps(USE_HOST), json.dumps(str(fixture))],
                          capture_output=True, text=True, cwd=str(ROOT), timeout=900)
    assert proc.returncode == 0, proc.stderr
    result: dict[str, list[str] | str] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def declaration_modules() -> set[str]:
    """The modules Hydra's search-path plugin may load of ``skipweave.integrations``: the discovery, the declaration
    base and the package of each shipped declaration (the entry points name ``package:INTEGRATION``)."""
    from skipweave.integrations.discovery import SHIPPED

    return {f"{PACKAGE}.integrations", f"{PACKAGE}.integrations.base", f"{PACKAGE}.integrations.discovery",
            *(ref.partition(":")[0] for ref in SHIPPED.values())}


def test_using_a_generic_layer_loads_no_integration_and_no_host() -> None:
    """docs/architecture.md: registries are passive, so reading one, loading a config, scanning a store, running the
    codec, weaving and recording a call, comparing two results, composing a shipped profile -- each in a fresh
    interpreter -- load no module of ``skipweave.integrations`` and no host library (an earlier design imported 40
    modules, Ray's and verl's integrations among them, at the first read of a registry)."""
    results = forbidden_after_use(USES)
    failed = {t: r for t, r in results.items() if isinstance(r, str)}
    assert not failed, "a use case failed:\n" + "\n".join(f"--- {t}\n{r}" for t, r in failed.items())
    bad = {t: r for t, r in results.items() if r}
    assert not bad, "using a generic layer brings in an integration or a host:\n" + "\n".join(
        f"  {t}: {r}" for t, r in sorted(bad.items()))


def test_every_generic_layer_has_a_use_case() -> None:
    """Each generic layer is used by at least one case of :data:`USES` (a layer added later gets one too)."""
    used = {title.split(":")[0].split(".")[0] for title in USES}
    assert set(GENERIC_LAYERS) <= used, f"generic layers no use case covers: {set(GENERIC_LAYERS) - used}"


def test_looking_up_an_integrations_profile_reads_the_declarations_only() -> None:
    result = forbidden_after_use({"look up": LOOK_UP})["look up"]
    assert isinstance(result, list), result
    assert f"{PACKAGE}.integrations.discovery" in result, "skipweave's search-path plugin did not run"
    extra = sorted(set(result) - declaration_modules())
    assert not extra, f"looking up a profile loads more than the integrations' declarations: {extra}"


def test_the_use_check_sees_an_integration() -> None:
    results = forbidden_after_use({"load": "import skipweave\nskipweave.load_integrations()\n"})
    assert isinstance(results["load"], list) and f"{PACKAGE}.integrations.verl.hosts" in results["load"]


# ------------------------------------------------------------------------------------------- cycles

def test_the_import_graph_sees_the_package() -> None:
    graph = import_graph()
    assert len(graph) >= 50 and f"{PACKAGE}.api" in graph
    # the graph resolves absolute, relative and `from package import module` imports alike
    assert f"{PACKAGE}.weaving.weaver" in graph[f"{PACKAGE}.api"]


def test_no_import_cycle_at_import_time() -> None:
    graph = import_graph()
    components = strongly_connected(graph)
    assert not components, "import cycles among the package's modules (import-time imports only):\n" + "\n".join(
        f"  {len(c)} modules {c}\n    e.g. {describe_cycle(graph, one_cycle(graph, c))}" for c in components)


def every_import_graph() -> dict[str, dict[str, int]]:
    """``importer -> {imported module: line}`` over *every* import of the package: at module level, inside functions
    and under ``if TYPE_CHECKING:`` alike (what a module needs, whenever it needs it).

    ``from skipweave import hooks`` names the package only as the namespace of ``hooks``: it adds no edge to the package
    (whose facade names every public function under ``TYPE_CHECKING``), only to ``skipweave.hooks``.
    """
    graph: dict[str, dict[str, int]] = {}
    for name in MODULES:
        edges: dict[str, int] = {}
        for stmt in ast.walk(parse(name)):
            if not isinstance(stmt, (ast.Import, ast.ImportFrom)):
                continue
            targets = imported_modules(name, stmt)
            if isinstance(stmt, ast.ImportFrom):
                base = resolve_from(name, stmt.level, stmt.module)
                if base in MODULES and all(f"{base}.{a.name}" in MODULES for a in stmt.names):
                    targets = [t for t in targets if t != base]
            for target in targets:
                edges.setdefault(target, stmt.lineno)
        graph[name] = edges
    return graph


KNOWN_CIRCLES: dict[frozenset[str], str] = {}
"""The import circles left when function-level and ``TYPE_CHECKING`` imports count, each with what it is: none. The
last three (the call engine's helpers holding the ``SkipProxy``, the store's engine and upkeep typed against the
``StepStore`` facade, the codec's kinds typed against the ``Encoder``/``Decoder``) went with issue 43. The list only
shrinks: a new circle fails the test below."""


def test_import_circles_counting_every_import_are_the_known_ones() -> None:
    """No import circle but the known ones, counting every import (the integrations' 15-module circle through
    ``hooks.Registry``, the ``skipweave.__version__`` facade circle, Ray's failures and state, diff and its plot,
    the store's engine and upkeep around the ``StepStore`` facade (now typed against ``store/role_access.py``) and
    the codec's kinds around the ``Encoder``/``Decoder`` (now typed against ``codec/walk.py``) are gone)."""
    graph = every_import_graph()
    found = {frozenset(c): c for c in strongly_connected(graph)}
    new = [c for key, c in found.items() if key not in KNOWN_CIRCLES]
    gone = [sorted(key) for key in KNOWN_CIRCLES if key not in found]
    assert not new and not gone, (
        "import circles counting every import (function-level and TYPE_CHECKING ones too):\n"
        + "".join(f"  new: {len(c)} modules {c}\n    e.g. {describe_cycle(graph, one_cycle(graph, c))}\n" for c in new)
        + "".join(f"  gone (remove it from KNOWN_CIRCLES): {c}\n" for c in gone))


def test_the_every_import_graph_counts_function_level_and_type_checking_imports() -> None:
    graph = every_import_graph()
    # a function-level import (the Hydra callback reads the config when a job starts)
    assert f"{PACKAGE}.config" in graph[f"{PACKAGE}.integrations.hydra.callback"]
    # a TYPE_CHECKING import (the weave hook protocol names the plan's type)
    assert f"{PACKAGE}.config.schema" in graph[f"{PACKAGE}.weaving.weave_hooks"]
    # `from skipweave import hooks` reaches hooks, not the facade
    assert f"{PACKAGE}" not in graph[f"{PACKAGE}.store.hosts"] and f"{PACKAGE}.hooks" in graph[f"{PACKAGE}.store.hosts"]


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3, "d": 4}, "d": {}, "e": {"e": 5}}
    assert strongly_connected(graph) == [["a", "b", "c"], ["e"]]
    assert describe_cycle(graph, one_cycle(graph, ["a", "b", "c"])) == "a (line 1) -> b (line 2) -> c (line 3) -> a"


# ------------------------------------------------------------------------------------------- private names

def is_private(name: str) -> bool:
    """``_x`` and ``__x`` are private; ``__x__`` (dunder) and ``_x_`` (enum sunder) and namedtuple's API are not."""
    if not name.startswith("_") or name in PUBLIC_UNDERSCORE:
        return False
    if name.startswith("__") and name.endswith("__"):
        return False
    return not (len(name) > 2 and name.endswith("_") and not name.startswith("__"))


def owners_in(importer: str, tree: ast.Module, roots: tuple[str, ...]) -> dict[str, tuple[str, str | None]]:
    """Every name ``importer`` binds anywhere (module level or inside functions) to a module under ``roots`` or to
    an object imported from one: ``name -> (module, attribute)``; ``attribute`` is ``None`` for a module."""
    bound: dict[str, tuple[str, str | None]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if not under(alias.name, roots):
                    continue
                if alias.asname:
                    bound[alias.asname] = (alias.name, None)
                else:
                    top = alias.name.split(".")[0]
                    bound[top] = (top, None)
        elif isinstance(node, ast.ImportFrom):
            base = resolve_from(importer, node.level, node.module)
            if not under(base, roots):
                continue
            for alias in node.names:
                local = alias.asname or alias.name
                if f"{base}.{alias.name}" in MODULES:
                    bound[local] = (f"{base}.{alias.name}", None)
                else:
                    bound[local] = (base, alias.name)
    return bound


def under(name: str, roots: tuple[str, ...]) -> bool:
    return any(name == r or name.startswith(r + ".") for r in roots)


def chain(node: ast.expr) -> list[str] | None:
    """``a.b.c`` as ``["a", "b", "c"]``; ``None`` when the expression is not a plain dotted name."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


ATTRIBUTE_FUNCTIONS = frozenset({"getattr", "setattr", "hasattr", "delattr"})


def private_access(node: ast.AST) -> list[str] | None:
    """The dotted name ``node`` reads a private attribute through (``a.b._c``, or ``getattr(a.b, "_c")`` and its
    siblings), the private name last; ``None`` for any other node."""
    if isinstance(node, ast.Attribute) and is_private(node.attr):
        return chain(node)
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ATTRIBUTE_FUNCTIONS
            and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str) and is_private(node.args[1].value)):
        base = chain(node.args[0])
        return None if base is None else [*base, node.args[1].value]
    return None


def private_uses(importer: str, roots: tuple[str, ...]) -> list[str]:
    """Where ``importer`` uses a private name of another module under ``roots`` (``file:line: what``)."""
    tree = parse(importer)
    path = MODULES[importer]
    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = resolve_from(importer, node.level, node.module)
            if under(base, roots) and base != importer:
                found += [f"{where}:{node.lineno}: from {base} import {a.name}" for a in node.names
                          if is_private(a.name)]
    bound = owners_in(importer, tree, roots)
    for node in ast.walk(tree):
        parts = private_access(node)
        if parts is None or parts[0] not in bound:
            continue
        module, attribute = bound[parts[0]]
        rest = parts[1:-1]
        if attribute is None and module.split(".")[0] == PACKAGE:
            # walk a dotted module path as far as it names modules: skipweave.store.format.codec._x
            while rest and f"{module}.{rest[0]}" in MODULES:
                module = f"{module}.{rest.pop(0)}"
        elif attribute is None:
            module = ".".join([module, *rest])  # another library's module path: wrapt.importer._post_import_hooks
        if module == importer:
            continue
        owner = f"{module}.{attribute}" if attribute else module
        found.append(f"{where}:{node.lineno}: {'.'.join(parts)} (private name of {owner})")
    return sorted(set(found), key=lambda line: (int(line.split(":")[1]), line))


def test_no_module_uses_a_private_name_of_another_skipweave_module() -> None:
    found = [line for m in MODULES for line in private_uses(m, (PACKAGE,))]
    assert not found, "private names used across modules (add a public function instead):\n" + "\n".join(
        f"  {line}" for line in found)


def test_no_module_uses_a_private_name_of_wrapt() -> None:
    """docs/architecture.md: wrapt's private names included (its post-import hook table, its proxies' slots)."""
    found = [line for m in MODULES for line in private_uses(m, ("wrapt",))]
    assert not found, "private names of wrapt used (use its public API):\n" + "\n".join(f"  {line}" for line in found)


def test_the_private_name_check_sees_each_form(tmp_path: Path) -> None:
    source = (
        "import skipweave.store.format.codec\n"
        "import skipweave.weaving.weaver as w\n"
        "from skipweave.store.format import layout\n"
        "from skipweave.weaving.weaver import WEAVER\n"
        "from skipweave.store.format.codec import _Encoder\n"
        "def f():\n"
        "    from skipweave.report import _lock\n"
        "    return (skipweave.store.format.codec._flat_bytes, w._x, layout._y, WEAVER._lock, WEAVER.plan,\n"
        "            layout.__name__, WEAVER._value_, WEAVER._replace, getattr(layout, '_z', None))\n"
    )
    name = f"{PACKAGE}._layering_probe"
    MODULES[name] = tmp_path / "_layering_probe.py"
    MODULES[name].write_text(source)
    try:
        found = [line.split(": ", 1)[1] for line in private_uses(name, (PACKAGE,))]
    finally:
        del MODULES[name]
    assert sorted(found) == sorted([
        "from skipweave.store.format.codec import _Encoder",
        "from skipweave.report import _lock",
        "skipweave.store.format.codec._flat_bytes (private name of skipweave.store.format.codec)",
        "w._x (private name of skipweave.weaving.weaver)",
        "layout._y (private name of skipweave.store.format.layout)",
        "WEAVER._lock (private name of skipweave.weaving.weaver.WEAVER)",
        "layout._z (private name of skipweave.store.format.layout)",
    ])
