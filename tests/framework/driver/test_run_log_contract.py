"""Both run logs keep the run-log contract (`framework.driver._base.RunLog`): every method it names, with its
parameters, and nothing the driver calls outside it."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from framework.driver._base import RunLog
from framework.driver.log import MemoryRunLog, SQLiteRunLog

ROOT = Path(__file__).resolve().parents[3]
METHODS = sorted(n for n, v in vars(RunLog).items() if inspect.isfunction(v) and not n.startswith("_"))


def test_the_contract_names_what_the_loop_records():
    assert {"add_unit", "add_event", "commit", "record_command", "checkpoint", "load_latest"} <= set(METHODS)


@pytest.mark.parametrize("implementation", [SQLiteRunLog, MemoryRunLog])
def test_each_run_log_has_every_method_of_the_contract_with_its_parameters(implementation):
    for name in METHODS:
        want = list(inspect.signature(getattr(RunLog, name)).parameters)
        assert list(inspect.signature(getattr(implementation, name)).parameters) == want, f"{implementation}.{name}"


def test_the_driver_calls_nothing_of_its_log_outside_the_contract():
    """Every `<run>.log.<name>` in the driver's modules is a method of the contract."""
    called = set()
    for path in sorted((ROOT / "framework" / "driver").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and node.value.attr == "log":
                called.add(node.attr)
    assert called and called <= set(METHODS), sorted(called - set(METHODS))
