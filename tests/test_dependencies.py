"""The declared dependencies are honest: every floor in pyproject.toml is the version `make test-min` installs
(tools/constraints-min.txt), the library imports only what it declares (an optional extra only inside a function),
every core dependency is used, and the examples' data set names the extra to install when scikit-learn is missing.

Static checks (pyproject, the constraints file and the sources read with `ast`); nothing here starts Ray or trains.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("framework", "automl", "simulators")
CONSTRAINTS = ROOT / "tools" / "constraints-min.txt"
# the extras `make test-min` installs (through `dev`) and whose floors it therefore tests; `mutate` is a tool's pin
TESTED_EXTRAS = ("examples", "models", "tensorboard", "mlflow", "samplers", "dev", "bench")
# imported (inside a function, when available) but deliberately not declared: the release must match the user's torch
UNDECLARED = {"torchvision"}
# import name -> distribution name, where they differ
DIST_OF = {"sklearn": "scikit-learn", "mlflow": "mlflow-skinny"}


def _project() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]


def _floor(req: Requirement) -> Version:
    lower = [s for s in req.specifier if s.operator == ">="]
    assert len(lower) == 1 and all(s.operator in (">=", "<", "!=") for s in req.specifier), (
        f"`{req}` in pyproject.toml: a dependency has one floor (`>=`), which tools/constraints-min.txt pins")
    return Version(lower[0].version)


def _floors() -> dict[str, Version]:
    """Distribution -> floor, over the dependencies and the tested extras (one floor per distribution)."""
    project = _project()
    reqs = [*project["dependencies"]]
    for extra in TESTED_EXTRAS:
        reqs += project["optional-dependencies"][extra]
    floors: dict[str, Version] = {}
    for text in reqs:
        req = Requirement(text)
        name, floor = canonicalize_name(req.name), _floor(req)
        assert floors.setdefault(name, floor) == floor, f"{req.name} has two floors: {floors[name]} and {floor}"
    return floors


def _pins() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in CONSTRAINTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        req = Requirement(line)
        (spec,) = req.specifier
        assert spec.operator == "==" and "*" not in spec.version and not req.extras and not req.marker, (
            f"`{line}` in {CONSTRAINTS.name}: one exact `name==version` per line")
        assert canonicalize_name(req.name) not in pins, f"{req.name} twice in {CONSTRAINTS.name}"
        pins[canonicalize_name(req.name)] = Version(spec.version)
    return pins


def test_every_floor_is_the_version_test_min_installs():
    floors, pins = _floors(), _pins()
    assert sorted(pins) == sorted(floors), (
        f"in pyproject.toml only: {sorted(set(floors) - set(pins))}; "
        f"in {CONSTRAINTS.name} only: {sorted(set(pins) - set(floors))}")
    differ = {name: (str(floors[name]), str(pins[name])) for name in floors if floors[name] != pins[name]}
    assert not differ, f"(pyproject floor, {CONSTRAINTS.name} pin) differ: {differ}"


def _third_party_imports() -> dict[str, dict[str, bool]]:
    """Distribution -> {module: imported at module level} over the library's own packages."""
    found: dict[str, dict[str, bool]] = {}

    def visit(node: ast.AST, module: str, top_level: bool) -> None:
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for name in names if not getattr(node, "level", 0) else ():
                top = name.split(".")[0]
                if top not in PACKAGES and top not in sys.stdlib_module_names and top != "__future__":
                    seen = found.setdefault(canonicalize_name(DIST_OF.get(top, top)), {})
                    seen[module] = seen.get(module, False) or top_level
            return
        inner = top_level and not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        for child in ast.iter_child_nodes(node):
            visit(child, module, inner)

    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            visit(ast.parse(path.read_text(), str(path)), str(path.relative_to(ROOT)), True)
    return found


def test_the_library_imports_what_it_declares_and_uses_every_core_dependency():
    project = _project()
    core = {canonicalize_name(Requirement(r).name) for r in project["dependencies"]}
    optional = {canonicalize_name(Requirement(r).name) for extra in ("examples", "models", "tensorboard", "mlflow",
                "samplers", "integrations") for r in project["optional-dependencies"][extra]} | UNDECLARED
    imports = _third_party_imports()
    undeclared = {dist: sorted(mods) for dist, mods in imports.items() if dist not in core | optional}
    assert not undeclared, f"imported but not declared in pyproject.toml: {undeclared}"
    eager = {dist: sorted(m for m, top in mods.items() if top) for dist, mods in imports.items() if dist not in core}
    assert not any(eager.values()), f"an optional dependency imported when the module is imported: {eager}"
    assert not core - set(imports), f"declared in [project] dependencies but never imported: {sorted(core - set(imports))}"


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
def test_every_named_optuna_sampler_builds():
    """The optuna floor covers every sampler OptunaSearch takes by name (GPSampler: Optuna 3.6)."""
    from automl.optuna_search import SAMPLERS

    for name, make in SAMPLERS.items():
        assert make(0) is not None, name


def test_the_examples_data_set_names_the_extra_when_scikit_learn_is_missing(monkeypatch):
    from framework.examples import digits_arrays

    for name in [m for m in sys.modules if m == "sklearn" or m.startswith("sklearn.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "sklearn", None)  # `import sklearn...` now raises ModuleNotFoundError
    with pytest.raises(ImportError, match=r"pip install 'modelhopper\[examples\]'"):
        digits_arrays()
