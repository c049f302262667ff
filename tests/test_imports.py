"""The import structure: the driver and the simulators run without torch, Ray or the engine's `Worker`; the backend
contract imports no implementation; no import cycle among the library's own modules.

The static checks read the sources with `ast` (nothing is imported); the runtime check imports in a fresh interpreter,
so what this test process already imported cannot hide anything.
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("framework", "automl", "simulators")
WORKER = "framework.engine.worker"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules(*packages: str) -> dict[str, Path]:
    """Dotted name -> source file of every module under `packages` (relative to the repo root)."""
    return {_module_name(p): p for pkg in packages for p in sorted((ROOT / pkg).rglob("*.py"))}


ALL = _modules(*PACKAGES)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.Module, module_level: bool) -> list[ast.Import | ast.ImportFrom]:
    """The import statements of a module: all of them, or (`module_level`) those that run when it is imported,
    i.e. outside function bodies and `if TYPE_CHECKING:` blocks (class bodies, `try` and other `if`s run)."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
            return
        if module_level and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            return
        if module_level and isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _imported(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The modules an import statement in `module` names: `import a.b` names a.b; `from a import b` names a.b when
    that is a module of ours (a submodule), else a; relative imports are resolved."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module.split(".") if ALL.get(module, Path()).name == "__init__.py" else module.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join(p for p in (*package, base) if p)
    names = []
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        names.append(sub if sub in ALL else base)
    return names


def _imports(module: str, module_level: bool) -> set[str]:
    tree = ast.parse(ALL[module].read_text(), filename=str(ALL[module]))
    return {name for node in _import_nodes(tree, module_level) for name in _imported(module, node)}


@functools.cache
def _graph() -> dict[str, set[str]]:
    """module -> the library's modules it imports when it is itself imported. An edge names the module a statement
    needs (`from framework.driver import units` needs framework.driver.units), not the packages above it, whose
    `__init__` is under way whenever one of its submodules imports a sibling."""
    return {m: {n for n in _imports(m, module_level=True) if n in ALL and n != m} for m in ALL}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
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
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return out


def _closure(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(graph.get(m, ()))
    return seen


def test_imports_driver_and_simulators_load_without_torch_ray_or_the_worker():
    code = (
        "import sys\n"
        "import framework.driver, framework.scheduling, simulators, automl\n"
        f"print(sorted(m for m in ('torch', 'ray', {WORKER!r}) if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", f"importing the driver and the simulators loaded {done.stdout.strip()}"


@pytest.mark.parametrize("module", sorted(m for m in ALL if m.startswith(("framework.driver", "simulators"))))
def test_imports_driver_and_simulator_modules_never_import_the_worker(module):
    """Not at module level, not inside a function, not through a module that imports the worker when imported."""
    graph = _graph()
    pulls_worker = {m for m in ALL if WORKER in _closure(graph, m)}
    named = _imports(module, module_level=False)
    assert not named & ({WORKER} | pulls_worker), f"{module} imports {sorted(named & ({WORKER} | pulls_worker))}"


#: the contracts, each with the modules of ours it may import (message types, no implementation)
CONTRACTS = {
    "framework.engine._base": {"framework.scheduling.units"},  # the backend
    "framework.driver._base": {"framework.scheduling.units"},  # the run log
    "framework.callbacks": {"framework.result"},  # callbacks (`Result` for a type annotation only)
    # a dispatch policy (the `DispatchState` it reads, for a type annotation only)
    "framework.scheduling._base": {"framework.scheduling.units", "framework.scheduling.dispatch_state"},
}


@pytest.mark.parametrize("contract", sorted(CONTRACTS))
def test_imports_a_contract_imports_no_implementation(contract):
    """Anywhere in the module, type-checking and function-level imports included; besides ours, only the standard
    library."""
    named = _imports(contract, module_level=False)
    ours = {n for n in named if n.split(".")[0] in PACKAGES}
    assert ours <= CONTRACTS[contract], f"{ALL[contract]} imports {sorted(ours - CONTRACTS[contract])}"
    others = {n.split(".")[0] for n in named - ours}
    assert others <= set(sys.stdlib_module_names) | {"__future__"}, sorted(others - set(sys.stdlib_module_names))


def test_imports_no_cycle_among_the_librarys_modules():
    cycles = _cycles(_graph())
    assert not cycles, "import cycles (module-level imports): " + "; ".join(" <-> ".join(c) for c in cycles)


def test_imports_no_cycle_counting_imports_inside_functions_and_for_type_checking():
    """A function-level import hides a cycle from the interpreter, not from a reader: none either."""
    graph = {m: {n for n in _imports(m, module_level=False) if n in ALL and n != m} for m in ALL}
    cycles = _cycles(graph)
    assert not cycles, "import cycles (all imports): " + "; ".join(" <-> ".join(c) for c in cycles)


def test_imports_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(graph) == [["a", "b", "c"]]


LAYOUT_PAGE = ROOT / "docs" / "contributing" / "layout.md"


def _layers(text: str) -> dict[str, int]:
    """The layer table of the contributor's layout page: each package ("framework/engine/") or module
    ("framework/data.py") it names, with its layer number."""
    layers: dict[str, int] = {}
    for m in re.finditer(r"^\| (\d+) \| (.+?) \|", text, re.MULTILINE):
        for unit in re.findall(r"`([^`]+)`", m.group(2)):
            assert unit not in layers, f"the layout page names {unit} in two layers"
            layers[unit] = int(m.group(1))
    return layers


def _unit(module: str, layers: dict[str, int]) -> str | None:
    """The entry of the layer table that holds `module`: the module's own file, else its deepest package named."""
    path = ALL[module].relative_to(ROOT).as_posix()
    if path in layers:
        return path
    parts = path.split("/")[:-1]
    for i in range(len(parts), 0, -1):
        if "/".join(parts[:i]) + "/" in layers:
            return "/".join(parts[:i]) + "/"
    return None


def _arrows_up(graph: dict[str, set[str]], unit_of: dict[str, str | None], layers: dict[str, int]) -> list[str]:
    """Every import from one entry of the table to another that is not in a lower layer."""
    out = []
    for m, named in sorted(graph.items()):
        for n in sorted(named):
            a, b = unit_of[m], unit_of[n]
            if a != b and layers[b] >= layers[a]:
                out.append(f"{m} (layer {layers[a]}, {a}) imports {n} (layer {layers[b]}, {b})")
    return out


def test_imports_follow_the_layers_of_the_layout_page():
    """Every module belongs to one entry of the page's layer table, and imports (inside functions and for type
    checking too) only from entries in lower layers: no arrow up, none within a layer."""
    layers = _layers(LAYOUT_PAGE.read_text())
    assert layers, "docs/contributing/layout.md has no layer table"
    missing = [u for u in layers if not (ROOT / u).exists()]
    assert not missing, f"the layout page's layer table names what is not in the tree: {missing}"
    unit_of = {m: _unit(m, layers) for m in ALL}
    unplaced = sorted(m for m, u in unit_of.items() if u is None)
    assert not unplaced, f"modules in no layer of docs/contributing/layout.md: {unplaced}"
    graph = {m: {n for n in _imports(m, module_level=False) if n in ALL and n != m} for m in ALL}
    up = _arrows_up(graph, unit_of, layers)
    assert not up, "imports that do not point down the layers:\n" + "\n".join(up)


def test_imports_the_layer_check_finds_an_arrow_up_and_one_within_a_layer():
    layers = {"low/": 0, "mid.py": 1, "high/": 2, "side.py": 2}
    unit_of = {"low.a": "low/", "mid": "mid.py", "high.b": "high/", "side": "side.py"}
    graph = {"low.a": {"mid"}, "mid": set(), "high.b": {"mid", "side"}, "side": set()}
    assert _arrows_up(graph, unit_of, layers) == [
        "high.b (layer 2, high/) imports side (layer 2, side.py)",
        "low.a (layer 0, low/) imports mid (layer 1, mid.py)",
    ]


#: calls that open a run's catalog or a checkpoint file: only `framework/store/` makes them
_STORE_CALLS = {("sqlite3", "connect"), ("torch", "load"), ("torch", "save")}


def test_only_the_store_opens_a_runs_catalog_or_checkpoints():
    found = []
    for module, path in ALL.items():
        if module.startswith("framework.store"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name) and (node.func.value.id, node.func.attr) in _STORE_CALLS):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.func.value.id}.{node.func.attr}")
    assert not found, f"outside framework/store/: {found}"
