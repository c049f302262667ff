"""What every experiment script shares: defaults in a dataclass overridden from the command line, a `--quick`
variant, where the results go, and a record of what ran (config, seed, git revision) next to them.

Results go to `<storage root>/experiments/<script>/<timestamp or --tag>` (the root is `$MODELHOPPER_STORAGE`, else
`~/modelhopper_runs`: `framework.store.storage.default_root`), or to `--out`; never to the working directory, which under
`ray job submit --working-dir .` is Ray's temporary copy of the code.

Every results table is printed with its provenance (`provenance`: the code's revision, the machine, the versions, the
date and the command line), which `record_run` prints under it and keeps in `run.json`.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import inspect
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from framework.result import CATALOG_FILE
from framework.store.storage import check_folder_name, default_root, enclosing_run, git_revision, unusable_dir
from framework.text import OneLineParser

T = TypeVar("T")

#: the repository the experiments are part of; its revision is the one `provenance` reports
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: the folders whose uncommitted changes to tracked files make a revision "+dirty"
CODE_DIRS = ("framework", "automl", "simulators", "experiments")


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


def output_dir(script: str, out: str | None = None, tag: str | None = None) -> str:
    """The folder an experiment writes to, made now: `out` when given, else `<default_root()>/experiments/<script>/`
    and in it `tag`, or a new folder named by the time (`20250101-120000`, then `-2`, `-3`, ... when taken)."""
    if out is not None:
        why = "it is empty (the working directory, which `ray job submit` replaces)" if out == "" else unusable_dir(out)
        run = enclosing_run(out, CATALOG_FILE) if why is None else None
        if run is not None:
            why = f"it is in the run directory {run!r}, which only its run writes into"
        if why is not None:
            raise ValueError(f"`--out` is {out!r}, but {why}")
        os.makedirs(out, exist_ok=True)
        return os.path.abspath(out)
    base = os.path.join(default_root(), "experiments", script)
    why = unusable_dir(base)
    if why is not None:
        raise ValueError(f"the default output folder {base!r} cannot be made: {why}; set $MODELHOPPER_STORAGE or "
                         "give --out")
    if tag is not None:
        check_folder_name("--tag", tag)
        path = os.path.join(base, tag)
        os.makedirs(path, exist_ok=True)
        return path
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path, n = os.path.join(base, stamp), 1
    while True:
        try:
            os.makedirs(path)
            return path
        except FileExistsError:  # another run started in the same second
            n += 1
            path = os.path.join(base, f"{stamp}-{n}")


def build_parser(defaults: type, doc: str | None, quick: dict[str, Any]) -> OneLineParser:
    """One `--flag` per field of `defaults` (words joined by dashes; tuples take several values, bools --x/--no-x),
    its help the field's trailing comment and its default shown; `--quick`; `--out` and `--tag`."""
    script = os.path.basename(inspect.getfile(defaults))
    parser = OneLineParser(prog=script, description=doc, formatter_class=_Help)
    helps = field_help(defaults)
    for f in dataclasses.fields(defaults):
        if f.name == "quick":
            continue
        if f.name not in helps:
            raise TypeError(f"field `{f.name}` of {defaults.__qualname__} in {script} has no trailing `# comment`: "
                            "write one, it is the option's --help")
        flag, text = f"--{f.name.replace('_', '-')}", helps[f.name]
        if isinstance(f.default, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default, help=text)
        elif isinstance(f.default, tuple):
            parser.add_argument(flag, type=type(f.default[0]) if f.default else str, nargs="+", default=f.default,
                                help=text)
        else:
            parser.add_argument(flag, type=type(f.default), default=f.default, help=text)
    parser.add_argument("--quick", action="store_true", help=f"a small variant: {quick}")
    base = os.path.join(default_root(), "experiments", script.removesuffix(".py"))
    where = parser.add_mutually_exclusive_group()  # no "(default: None)": the help says what happens without them
    where.add_argument("--out", metavar="DIR", default=argparse.SUPPRESS,
                       help=f"the results' folder (default: a new one named by the time in {base}, the storage root "
                            "being $MODELHOPPER_STORAGE, else ~/modelhopper_runs)")
    where.add_argument("--tag", default=argparse.SUPPRESS,
                       help=f"name the results' folder {os.path.join(base, 'TAG')} instead of by the time")
    return parser


def parse_config(
    defaults: type[T],
    argv: list[str] | None,
    doc: str | None,
    quick: dict[str, Any],
    check: Callable[[T], Any] | None = None,
) -> tuple[T, str]:
    """`defaults` built from argv (see `build_parser`; `--quick` swaps in `quick` for every field the command line
    left at its default) and the folder its results go to (`output_dir`), made and printed. `check(config)` runs
    first: its `ValueError` or `TypeError`, like a bad flag, is one line on stderr and exit code 2, and then nothing
    is made."""
    parser = build_parser(defaults, doc, quick)
    args = parser.parse_args(argv)
    fields = [f for f in dataclasses.fields(defaults) if f.name != "quick"]
    values = {f.name: getattr(args, f.name) for f in fields}
    if any(f.name == "quick" for f in dataclasses.fields(defaults)):
        values["quick"] = args.quick
    if args.quick:
        values.update({k: v for k, v in quick.items() if values[k] == getattr(defaults, k)})
    cfg = defaults(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})
    try:
        if check is not None:
            check(cfg)
        out = output_dir(parser.prog.removesuffix(".py"), getattr(args, "out", None), getattr(args, "tag", None))
    except (TypeError, ValueError) as e:
        parser.error(str(e))
    print(f"Results in {out}", flush=True)
    return cfg, out


def _git(*args: str) -> str | None:
    """`git args...` in `ROOT`, its stdout stripped; None where git or the repository is missing or it fails. Takes
    no optional lock, so it never writes the index of a checkout that someone is committing in."""
    try:
        done = subprocess.run(["git", "--no-optional-locks", "-C", ROOT, *args], capture_output=True, text=True,
                              timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()


def _revision() -> str:
    """The short hash of the code's HEAD, with "+dirty" when tracked files under `CODE_DIRS` have uncommitted
    changes; `$MODELHOPPER_GIT_REVISION` where the code came without its `.git` (`ray job submit`)."""
    short = _git("rev-parse", "--short", "HEAD")
    if short is None:
        given = os.environ.get("MODELHOPPER_GIT_REVISION")
        if given:
            return f"{given} (from $MODELHOPPER_GIT_REVISION; uncommitted changes unknown)"
        return "unknown (no git repository, and $MODELHOPPER_GIT_REVISION is not set)"
    changed = _git("status", "--porcelain", "--untracked-files=no", "--", *CODE_DIRS)
    return short + ("" if changed == "" else "+dirty" if changed else " (uncommitted changes unknown)")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "Model")) and ":" in line:
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    if sys.platform == "darwin":
        try:
            return subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                                  timeout=5, check=True).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _cores() -> str:
    n = os.cpu_count()
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else n
    return f"{n} logical cores" + ("" if usable == n else f" ({usable} usable by this process)")


def _ram() -> str:
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return "RAM unknown"
    return f"{total / 2**30:.1f} GiB RAM"


def _gpus() -> str:
    """The machine's GPUs ("1 x NVIDIA H100 80GB HBM3"), from nvidia-smi, else from torch where it is already
    imported (importing it here would cost seconds in scripts that never use it); "no GPU" when neither finds one."""
    names: list[str] = []
    try:
        names = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                               text=True, timeout=10, check=True).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError):
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    names = [n.strip() for n in names if n.strip()]
    if not names:
        return "no GPU"
    return ", ".join(f"{names.count(n)} x {n}" for n in dict.fromkeys(names))


def _os() -> str:
    try:
        name = platform.freedesktop_os_release().get("PRETTY_NAME")
    except (AttributeError, OSError):
        name = None
    kernel = f"{platform.system()} {platform.release()} {platform.machine()}"
    return f"{name} ({kernel})" if name else platform.platform()


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def provenance_fields() -> dict[str, str]:
    """Where a result comes from, one entry per line of `provenance`: revision, machine, software, date, command."""
    return {
        "revision": _revision(),
        "machine": ", ".join([_cpu_model(), _cores(), _ram(), _gpus(), _os()]),
        "software": f"Python {platform.python_version()}, torch {_version('torch')}, Ray {_version('ray')}",
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "command": shlex.join(["python", *sys.argv]),
    }


def provenance(fields: dict[str, str] | None = None) -> str:
    """What to print with a results table so that it can be traced and rerun: `fields` (default:
    `provenance_fields()`, taken now), one `# `-line each:

        # revision 66313c5+dirty
        # machine AMD EPYC, 2 logical cores, 7.8 GiB RAM, no GPU, Debian GNU/Linux 12 (bookworm) (Linux 6.1 x86_64)
        # software Python 3.11.9, torch 2.5.1, Ray 2.40.0
        # date 2025-01-31 12:00:00 +0000
        # command python experiments/scheduler_comparison.py --quick

    "+dirty": tracked files under framework/, automl/, simulators/ or experiments/ differ from the commit. The
    command is this process's `sys.argv` behind `python`."""
    fields = provenance_fields() if fields is None else fields
    return "\n".join(f"# {key} {value}" for key, value in fields.items())


def record_run(out: str, cfg: Any, **extra: Any) -> str:
    """Print `provenance()` (under the results table a script has just printed), write `run.json` (the config, the
    git revision, the provenance and `extra`) into `out` and print where the results are: a script's last call.
    Returns the file's path."""
    fields = provenance_fields()
    print("\n" + provenance(fields), flush=True)
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "run.json")
    with open(path, "w") as f:
        json.dump({"config": dataclasses.asdict(cfg), "git_revision": git_revision(), "provenance": fields, **extra},
                  f, indent=1, default=str)
    print(f"Results in {out}", flush=True)
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


def markdown(df: pd.DataFrame, digits: int = 4) -> str:
    """`df` as a markdown table (floats to `digits` significant digits), without pandas' optional `tabulate`."""
    def cell(v: object) -> str:
        return f"{v:.{digits}g}" if isinstance(v, (float, np.floating)) else str(v).replace("|", "/")

    lines = ["| " + " | ".join(map(str, df.columns)) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)
