"""Start-up of the `modelhopper` command line: the wall time of the commands a person types in the first minutes
(`--help`, `list`, `show`, `status`, `watch --once`), each a fresh `python -m framework` process, beside
`python -c pass` (the interpreter alone) and `python -c "import pandas"` (the floor of every command that reads a
run: its tables are DataFrames).

The commands read a run this script writes first: `--configs` configs with `--epochs` epochs each, signed as a run's
catalog is, in `<results>/runs/run` (`list` lists `<results>/runs`). Each command runs `--repetitions` times, the
commands taking turns, so that a slow moment of the machine falls on all of them alike. Prints, per command:

    median_s, min_s, max_s   wall seconds of the whole process, start to exit
    over_python_s            median_s less the median of `python -c pass`: what the command itself costs
    imports                  which of torch, ray, automl (with Optuna) and pandas the command imported (one more run
                             of it, in a process that reports its modules)

`--tree DIR` times the command line of another checkout of the project (e.g. an older revision, unpacked with
`git archive REV | tar -x -C DIR`) on the same run; `--baseline DIR` times that checkout beside this one, the two
taking turns command by command (a `tree` column says which), for a before/after on one machine at one moment.
Writes `cli_startup.csv`.

    python experiments/cli_startup.py --quick     # a few seconds
    python experiments/cli_startup.py             # under a minute on 2 CPU cores
    python experiments/cli_startup.py --baseline /tmp/old   # this checkout beside an older one
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pandas as pd  # noqa: E402

from experiments._common import markdown, parse_config, record_run  # noqa: E402
from framework.result import CATALOG_FILE  # noqa: E402
from framework.store.catalog import SQLiteCatalog  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: the modules a command's `imports` column looks for (the slow ones to import)
WATCHED = ("torch", "ray", "automl", "pandas")
#: what the `imports` run executes: the command, then its modules as JSON on the last line
_REPORT = ("import contextlib, io, json, sys; from framework.__main__ import main\n"
           "with contextlib.redirect_stdout(io.StringIO()):\n"
           "    try:\n        main(sys.argv[1:])\n    except SystemExit:\n        pass\n"
           "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))")


@dataclass
class Defaults:
    repetitions: int = 7  # times each command runs (the median is reported)
    configs: int = 20  # configs of the run the commands read
    epochs: int = 10  # epochs of each of its configs
    tree: str = ""  # a checkout of the project whose command line is timed (empty: this one)
    baseline: str = ""  # another checkout timed beside it, turn by turn (empty: none)


QUICK = dict(repetitions=2, configs=4, epochs=2)


def _check(cfg: Defaults) -> None:
    for name in ("repetitions", "configs", "epochs"):
        if getattr(cfg, name) < 1:
            raise ValueError(f"`--{name}` is {getattr(cfg, name)}, but must be >= 1")
    for name in ("tree", "baseline"):
        path = getattr(cfg, name)
        if path and not os.path.isfile(os.path.join(path, "framework", "__main__.py")):
            raise ValueError(f"`--{name}` is {path!r}, but it holds no framework/__main__.py: it must be a checkout "
                             "of the project")


def make_run(path: str, configs: int, epochs: int) -> str:
    """A finished run's catalog (signed, as a run writes it): `configs` configs of `epochs` epochs each."""
    os.makedirs(path)
    catalog = SQLiteCatalog(os.path.join(path, CATALOG_FILE))
    try:
        catalog.set_meta(metric="valid_loss", mode="min", start_time=time.time(), num_workers=2, executor="mop",
                         scheduler="randomized")
        for cid in range(configs):
            catalog.add_config(cid, {"lr": 0.01 * (cid + 1), "hidden": 64}, "active")
            for epoch in range(epochs):
                loss = 1.0 / (1 + epoch) + 0.01 * cid
                catalog.add_epoch(cid, epoch, epoch, {"valid_loss": loss, "valid_accuracy": 1 - loss / 2})
            catalog.update_config(cid, status="completed", epochs=epochs)
    finally:
        catalog.close()
    return path


def main(argv: list[str] | None = None) -> pd.DataFrame:
    cfg, out = parse_config(Defaults, argv, __doc__, QUICK, check=_check)
    tree = os.path.abspath(cfg.tree) if cfg.tree else ROOT
    trees = {"this": tree, **({"baseline": os.path.abspath(cfg.baseline)} if cfg.baseline else {})}
    run = make_run(os.path.join(out, "runs", "run"), cfg.configs, cfg.epochs)
    python = [sys.executable]
    commands = {
        "python -c pass": [*python, "-c", "pass"],
        "python -c 'import pandas'": [*python, "-c", "import pandas"],
        "--help": ["--help"],
        "list": ["list", os.path.dirname(run)],
        "show": ["show", run],
        "status": ["status", run],
        "watch --once": ["watch", run, "--once"],
    }
    times: dict[tuple[str, str], list[float]] = {(t, name): [] for t in trees for name in commands}
    for _ in range(cfg.repetitions):
        for name, argv_ in commands.items():
            for label, path in trees.items():
                cmd = argv_ if argv_[0] == sys.executable else [*python, "-m", "framework", *argv_]
                t0 = time.perf_counter()
                done = subprocess.run(cmd, cwd=path, env={**os.environ, "PYTHONPATH": path},
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=300)
                times[label, name].append(time.perf_counter() - t0)
                if done.returncode != 0:
                    raise RuntimeError(f"{name!r} ({path}) exited with {done.returncode}:\n{done.stderr[-2000:]}")
    rows = []
    for label, path in trees.items():
        base = statistics.median(times[label, "python -c pass"])
        for name, argv_ in commands.items():
            imported = ""
            if argv_[0] != sys.executable:
                report = subprocess.run([*python, "-c", _REPORT, *argv_], cwd=path,
                                        env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True,
                                        timeout=300)
                modules = set(json.loads(report.stdout.strip().splitlines()[-1]))
                imported = ", ".join(m for m in WATCHED if m in modules) or "none of them"
            t = times[label, name]
            rows.append({**({"tree": label} if len(trees) > 1 else {}), "command": name,
                         "median_s": statistics.median(t), "min_s": min(t), "max_s": max(t),
                         "over_python_s": statistics.median(t) - base, "imports": imported})
    table = pd.DataFrame(rows)
    table.to_csv(os.path.join(out, "cli_startup.csv"), index=False)
    where = tree if len(trees) == 1 else f"{tree} (this) and {trees['baseline']} (baseline)"
    print(f"Wall seconds of `python -m framework COMMAND` in {where}, {cfg.repetitions} runs each, on a run of "
          f"{cfg.configs} configs x {cfg.epochs} epochs:\n")
    print(markdown(table, digits=3))
    record_run(out, cfg, tree=tree)
    return table


if __name__ == "__main__":
    main()
    sys.exit(0)
