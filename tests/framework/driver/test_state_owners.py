"""Every piece of the driver's run state has one owner, and only the owner writes it (issue 36, item 1).

A `ConfigRecord` changes through its own transitions (`framework/driver/configs.py`), a `RunState` through its named
operations (`framework/driver/_state.py`); no module sets another's private attribute. The check reads the source
(AST) of every module under `framework/`, `automl/` and `simulators/`: outside its owner, a write to a field of
either class is any attribute store with that field's name (`x.f = ...`, `x.f += ...`, `x.f: T = ...`, a tuple
target, `for x.f in`, `del x.f`), `setattr(x, "f", ...)`, and for a field that holds a list, dict or set, an in-place
change of it (`x.f.append(...)`, `x.f.setdefault(...).append(...)`, `x.f[k] = ...`). An object's writes to itself
(`self`, `cls`) are its own. Fields are matched by name: another object's attribute of the same name counts too, the
safe side (rename it, or say why here).
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from framework.driver._state import RunState
from framework.driver.configs import ConfigRecord

ROOT = Path(__file__).resolve().parents[3]
SCANNED = ("framework", "automl", "simulators")

#: class -> the one module that may write its fields
OWNERS = {ConfigRecord: "framework/driver/configs.py", RunState: "framework/driver/_state.py"}

#: methods that change a list, dict or set in place
MUTATORS = frozenset({"append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse", "update",
                      "setdefault", "popitem", "add", "discard", "difference_update", "intersection_update",
                      "symmetric_difference_update"})

#: (module, attribute) writes allowed outside their owner, each with its reason; keep it short
ALLOWED: dict[tuple[str, str], str] = {}


def _fields(cls: type) -> tuple[set[str], set[str]]:
    """The dataclass's field names, and those of them that hold a list, dict or set."""
    fields = dataclasses.fields(cls)
    containers = {f.name for f in fields if f.default_factory in (list, dict, set)
                  or str(f.type).startswith(("list[", "dict[", "set["))}
    return {f.name for f in fields}, containers


def _own(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _defined_here(tree: ast.AST) -> set[str]:
    """Private attribute names a module defines: set on `self`/`cls`, or declared in a class body."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _own(node.value):
            names.add(node.attr)
        elif isinstance(node, ast.ClassDef):
            for stmt in node.body:
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(
                    stmt, ast.AnnAssign) else []
                names.update(t.id for t in targets if isinstance(t, ast.Name))
    return {n for n in names if _private(n)}


def _container(node: ast.expr) -> ast.Attribute | None:
    """The attribute a chain of calls and subscripts starts from (`x.f` of `x.f.setdefault(k, [])[0]`), if any."""
    while True:
        if isinstance(node, ast.Subscript):
            node = node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            node = node.func.value
        else:
            return node if isinstance(node, ast.Attribute) else None


def violations(source: str, module: str) -> list[str]:
    """Writes in `source` (the text of `module`, a path relative to the repository) that break the owners' rule."""
    tree = ast.parse(source)
    owned: dict[str, str] = {}  # field -> owner class name, for the fields this module may not write
    containers: set[str] = set()
    for cls, owner in OWNERS.items():
        if module != owner:
            names, lists = _fields(cls)
            owned.update(dict.fromkeys(names, cls.__name__))
            containers |= lists
    mine = _defined_here(tree)
    lines = source.splitlines()
    out = []

    def check(node: ast.AST, obj: ast.expr, attr: str | None, how: str) -> None:
        if _own(obj) or (module, attr) in ALLOWED:
            return
        where = f"{module}:{node.lineno}: {lines[node.lineno - 1].strip()[:100]}"
        if attr is None:
            out.append(f"{where}  (sets an attribute named at run time on another object)")
        elif attr in owned and (how != "mutates" or attr in containers):
            out.append(f"{where}  ({how} {owned[attr]}.{attr} outside its owner)")
        elif how != "mutates" and _private(attr) and attr not in mine:
            out.append(f"{where}  (sets another module's private attribute {attr!r})")

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del)):
            check(node, node.value, node.attr, "writes")
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, (ast.Store, ast.Del)):
            target = _container(node.value)
            if target is not None:
                check(node, target.value, target.attr, "mutates")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr"):
            name = node.args[1] if len(node.args) > 1 else None
            attr = name.value if isinstance(name, ast.Constant) and isinstance(name.value, str) else None
            check(node, node.args[0], attr, "writes")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "__setattr__"
              and isinstance(node.func.value, ast.Name) and node.func.value.id == "object" and node.args):
            name = node.args[1] if len(node.args) > 1 else None
            attr = name.value if isinstance(name, ast.Constant) and isinstance(name.value, str) else None
            check(node, node.args[0], attr, "writes")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
            target = _container(node.func.value)
            if target is not None:
                check(node, target.value, target.attr, "mutates")
    return out


def _modules() -> list[Path]:
    return sorted(p for top in SCANNED for p in (ROOT / top).rglob("*.py"))


def test_state_owners_no_module_writes_run_state_it_does_not_own():
    modules = _modules()
    assert len(modules) > 50 and all(any(p.relative_to(ROOT).parts[0] == top for p in modules) for top in SCANNED)
    found = [v for p in modules for v in violations(p.read_text(), p.relative_to(ROOT).as_posix())]
    assert not found, "state written outside its owner:\n" + "\n".join(found)


def test_state_owners_every_owner_and_allowance_names_a_real_module():
    for module in [*OWNERS.values(), *(m for m, _ in ALLOWED)]:
        assert (ROOT / module).is_file(), module


@pytest.mark.parametrize("line", [
    "c.status = STOPPED",
    "c.open -= 1",
    "c.state = c.epoch_state = handle",
    "c.units, c.visited = 0, {}",
    "state, _, c.units = log.load_latest(1)",
    "c.checkpointed: tuple = (1, 2.0)",
    "for c.status in ():\n    pass",
    "del c.outcome",
    "setattr(c, 'stopping', True)",
    "object.__setattr__(c, 'budget', 3)",
    "setattr(c, name, 1)",
    "c.reports.append(report)",
    "c.visited.setdefault(0, []).append(1)",
    "c.visited[0] = [1]",
    "c.history[-1].update(m)",
    "run.ended.append(1)",
    "run.deferred += [fn]",
    "run.cpu_by_epoch[0][0] += 1.0",
    "del run.ended[0]",
    "run.round = 3",
    "driver.run_state.round = 3",
    "run.paused = True",
    "run.procedure._engine_started = True",
    "setattr(run.procedure, '_engine_started', True)",
])
def test_state_owners_a_write_outside_the_owner_is_found(line):
    assert violations(line, "framework/driver/commit.py"), line


@pytest.mark.parametrize("line", [
    "c.close_epoch()",
    "run.mark_ended(c.id)",
    "x = c.visited.get(0, [])",
    "n = len(run.ended)",
    "run.configs.add(c)",  # the config table's own method
    "run.workers.remove(3)",
    "run.observers.add(cb)",
    "self.state = None",  # an object's own attribute of the same name
    "self._queue = []",
    "class A:\n    _x = 0\n\n    def f(self, other):\n        other._x = 1",  # a private name this module defines
])
def test_state_owners_reads_owner_methods_and_own_attributes_pass(line):
    assert not violations(line, "framework/driver/commit.py"), line


def test_state_owners_the_owner_module_writes_its_own_fields():
    assert not violations("c.status = STOPPED\nc.reports.append(r)", OWNERS[ConfigRecord])
    assert violations("run.round = 1", OWNERS[ConfigRecord])  # but not the other owner's
