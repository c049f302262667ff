"""What every experiment script shares: defaults in a dataclass overridden from the command line, a `--quick`
variant, and a record of what ran (config, seed, git revision) next to the results."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import os
import re
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from framework.storage import git_revision

T = TypeVar("T")


class _Help(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written, and every option's default shown."""


def field_help(cls: type) -> dict[str, str]:
    """The trailing `# comment` of each field in a dataclass's source: its help text on the command line."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    found = re.findall(r"^\s+(\w+)\s*:[^=\n]*=[^\n#]*#\s*(.+)$", source, flags=re.MULTILINE)
    return {name: text.strip().replace("%", "%%") for name, text in found}  # argparse formats help with %


def parse_config(defaults: type[T], argv: list[str] | None, doc: str | None, quick: dict[str, Any]) -> T:
    """Build `defaults` from argv: one `--flag` per field, words joined by dashes (tuples take several values,
    bools --x/--no-x), its help the field's comment and its default shown; `--quick` swaps in `quick` for every field
    the command line left at its default."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=_Help)
    fields = [f for f in dataclasses.fields(defaults) if f.name != "quick"]
    helps = field_help(defaults)
    for f in fields:
        flag = f"--{f.name.replace('_', '-')}"
        text = helps.get(f.name, f.name.replace("_", " "))
        if isinstance(f.default, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default, help=text)
        elif isinstance(f.default, tuple):
            parser.add_argument(flag, type=type(f.default[0]) if f.default else str, nargs="+", default=f.default,
                                help=text)
        else:
            parser.add_argument(flag, type=type(f.default), default=f.default, help=text)
    parser.add_argument("--quick", action="store_true", help=f"a small variant: {quick}")
    args = parser.parse_args(argv)
    values = {f.name: getattr(args, f.name) for f in fields}
    if any(f.name == "quick" for f in dataclasses.fields(defaults)):
        values["quick"] = args.quick
    if args.quick:
        values.update({k: v for k, v in quick.items() if values[k] == getattr(defaults, k)})
    return defaults(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})


def record_run(out: str, cfg: Any, **extra: Any) -> str:
    """Write `run.json` (the config, the git revision and `extra`) into `out`; returns its path."""
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "run.json")
    with open(path, "w") as f:
        json.dump({"config": dataclasses.asdict(cfg), "git_revision": git_revision(), **extra}, f, indent=1,
                  default=str)
    return path


def utilisation(schedule: pd.DataFrame, p: int) -> tuple[float, float, float]:
    """(busy / (span x p), span, mean idle gap between consecutive units of a worker)."""
    busy = float((schedule["end"] - schedule["start"]).sum())
    span = float(schedule["end"].max() - schedule["start"].min())
    gaps = []
    for _, g in schedule.sort_values("start").groupby("worker"):
        gaps += list(np.maximum(g["start"].to_numpy()[1:] - g["end"].to_numpy()[:-1], 0.0))
    return busy / (span * p), span, float(np.mean(gaps)) if gaps else 0.0


def engine_columns(result: Any, p: int, called: float, returned: float) -> dict[str, float]:
    """The engine's own costs in a finished run (`framework.Result`), for a call to `run()` made at time `called`
    that returned at `returned`: utilisation, mean gap per unit, the driver's CPU time per unit in the first and the
    last epoch, start-up (call to the first unit's start) and teardown (last unit's end to the return)."""
    util, _, gap = utilisation(result.schedule, p)
    cpu = {int(e): s for e, s in result.meta.get("driver_cpu_s_per_unit", {}).items()}
    first = result.meta["start_time"] + float(result.schedule.start.min())
    last = result.meta["start_time"] + float(result.schedule.end.max())
    return {"utilisation": util, "gap_ms": 1000 * gap,
            "cpu_ms_first": 1000 * cpu.get(0, float("nan")),
            "cpu_ms_last": 1000 * cpu.get(max(cpu, default=0), float("nan")),
            "startup_s": first - called, "teardown_s": returned - last}
