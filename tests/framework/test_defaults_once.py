"""Every option's default lives in `framework.options`: the engine's pieces take `RunOptions`' own, the simulators
and replays `SERIAL_QUEUE_DEPTH` (Cerebro's model); no module restates a number."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from framework.driver.dispatch import Dispatcher
from framework.options import SERIAL_QUEUE_DEPTH, RunOptions
from simulators import Simulator, simulate_selection

ROOT = Path(__file__).resolve().parents[2]


def test_defaults_once_the_queue_depth_comes_from_options():
    assert inspect.signature(Dispatcher).parameters["depth"].default == RunOptions.queue_depth
    assert inspect.signature(Simulator).parameters["queue_depth"].default == SERIAL_QUEUE_DEPTH
    assert inspect.signature(simulate_selection).parameters["queue_depth"].default == SERIAL_QUEUE_DEPTH


def test_defaults_once_no_module_restates_a_queue_depth():
    files = [p for d in ("framework", "simulators") for p in (ROOT / d).rglob("*.py") if p.name != "options.py"]
    assert files
    restated = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in files
                for m in re.finditer(r"queue_depth(: int)?\s*=\s*\d", p.read_text())]
    assert not restated
