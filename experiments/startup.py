"""A run's start-up against its floor: how long the demo takes to reach its first unit cold, attached to the warm
local service (`modelhopper up`), and as the second run of one process, beside what no such start can go below.

Each row is measured in fresh processes, one after another in one run of this script, so a busy moment of the machine
falls on all of them alike (run it twice to see the spread):

    ray.init() + shutdown        a bare local Ray started and stopped (timed inside the process: no imports)
    p processes import torch     `--workers` processes that `import torch` at once (wall, first start to last exit)
    ray.init(service) + shutdown a bare connection to the service, started and stopped
    demo: cold                   `python -m framework demo --epochs E --workers p`, no service: its printed `time:`
                                 line (`framework.driver.observers.RunClock`)
    demo: attached               the same demo while `modelhopper up` runs (its own service folder and Ray temp dir,
                                 never the user's service), after `up` has warmed the pool
    demo: 2nd run in a process   the demo's selection run twice in one process without the service: the second run's
                                 line (Ray up, its workers the first run's spares)
    ASHA on Parquet: cold        a Ray Tune user's search ported: ASHA over 8 sampled configs (up to 4 epochs, eta 2)
                                 on digits written as Parquet files that the workers read; no service
    ASHA on Parquet: attached    the same search while `modelhopper up` runs

For each demo row: `startup_s` is what the run spends before its first unit runs, the time line's Ray + set-up +
workers (the driver's own imports, `before run()`, are the same in every row and left out: `imports_s`); `first_unit_s`
the first unit; `process_s` the whole process. Its floor is what that start cannot go below: cold, starting a Ray and
its workers importing torch (the first two rows); attached, connecting to the service (the third); the second run of a
process has nothing to start (no floor). `x_floor` = startup_s / floor_s. Writes `startup.csv`.

    python experiments/startup.py --quick     # one worker; about 2 minutes on a busy 2-core machine
    python experiments/startup.py             # two workers; about 3 minutes
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pandas as pd  # noqa: E402

from experiments._common import markdown, parse_config, record_run  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_BARE_RAY = ("import sys, time, ray\nt = time.perf_counter()\n"
             "ray.init(address=sys.argv[1], include_dashboard=False, log_to_driver=False, **({'num_cpus': "
             "int(sys.argv[2])} if sys.argv[1] == 'local' else {}))\nray.shutdown()\nprint(time.perf_counter() - t)")
#: ASHA over 8 configs on Parquet files (argv: the data folder, the workers), as a user's script would run it
_ASHA = ("import sys\nimport automl, framework\nfrom framework.examples import classifier_step_fn, mlp_model_fn\n"
         "data, workers = sys.argv[1], int(sys.argv[2])\n"
         "ds = framework.PartitionedDataset.from_parquet(f'{data}/train', f'{data}/valid', num_partitions=workers)\n"
         "space = {'hidden': automl.choice([16, 32, 64]), 'lr': automl.loguniform(0.01, 0.3), 'batch_size': 64}\n"
         "framework.ModelSelection(mlp_model_fn, step_fn=classifier_step_fn, dataset=ds, procedure=automl.ASHA(\n"
         "    space, max_epochs=4, eta=2, max_configs=8, seed=0), num_workers=workers, seed=0, progress=False).run()")
_TWICE = ("import sys\nfrom framework.__main__ import main\n"
          "for _ in range(2):\n    main(sys.argv[1:])")


@dataclass
class Defaults:
    workers: int = 2  # the demo's workers, and how many processes import torch at once (p)
    epochs: int = 1  # epochs per config of the demo (its grid has 6 configs)
    repetitions: int = 1  # times each row is measured, in turn (the median is reported)


QUICK = dict(workers=1)


def _check(cfg: Defaults) -> None:
    for name in ("workers", "epochs", "repetitions"):
        if getattr(cfg, name) < 1:
            raise ValueError(f"`--{name}` is {getattr(cfg, name)}, but must be >= 1")


def _run(argv: list[str], env: dict[str, str], timeout: float = 600) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"{argv[:4]} exited with {done.returncode}:\n{done.stderr[-3000:]}")
    return done, wall


def parse_time_line(text: str) -> list[dict[str, float]]:
    """Every `time:` line in `text` (a run's stderr), as {part: seconds} with `first_unit` and `total`:
    "time: 21.3 s: start-up 17.6 s (before run() 6.4, Ray 7.9, set-up 0.2, workers 3.1), training 2.4 s (first unit
    0.6), results 1.3 s"."""
    found = []
    for m in re.finditer(r"time: ([\d.]+) s: start-up [\d.]+ s \(((?:before run\(\) [\d.]+, )?[^)]*)\)(.*)$", text, flags=re.MULTILINE):
        parts = {"total": float(m.group(1))}
        for item in m.group(2).split(", "):
            name, value = item.rsplit(" ", 1)
            parts[name] = float(value)
        first = re.search(r"first unit ([\d.]+)", m.group(3))
        parts["first_unit"] = float(first.group(1)) if first else float("nan")
        found.append(parts)
    return found


def _demo_row(name: str, line: dict[str, float], process_s: float, floor: str, floor_s: float) -> dict:
    startup = sum(line.get(k, 0.0) for k in ("Ray", "set-up", "workers"))
    return {"row": name, "startup_s": startup, "first_unit_s": line["first_unit"],
            "imports_s": line.get("before run()", float("nan")), "process_s": process_s, "floor": floor,
            "floor_s": floor_s, "x_floor": startup / floor_s if floor_s == floor_s and floor_s > 0 else float("nan")}


def _write_parquet(folder: str, workers: int) -> str:
    """digits as Parquet under folder/train and folder/valid (a file per worker each; one column per pixel and
    `label`), written before anything is timed."""
    from framework.examples import arrays_as_parquet, digits_arrays

    return arrays_as_parquet(folder, *digits_arrays(), files=(workers, workers))


def _measure(cfg: Defaults, out: str) -> dict[str, list]:
    """One measurement of every row: {row: value} (seconds, or a demo's time line and process wall)."""
    py = sys.executable
    base = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    base.update(PYTHONPATH=ROOT, MODELHOPPER_STORAGE=os.path.join(out, "runs"), XDG_STATE_HOME=os.path.join(out, "state"))
    cold = {**base, "MODELHOPPER_SERVICE_DIR": os.path.join(out, "no-service")}  # (an empty folder: no service)
    service_dir = tempfile.mkdtemp(prefix="mh-startup-")
    warm = {**base, "MODELHOPPER_SERVICE_DIR": service_dir}
    demo = ["-m", "framework", "demo", "--epochs", str(cfg.epochs), "--workers", str(cfg.workers)]
    asha = ["-c", _ASHA, _write_parquet(os.path.join(out, "parquet"), cfg.workers), str(cfg.workers)]
    got: dict[str, list] = {}
    got["ray"] = [float(_run([py, "-c", _BARE_RAY, "local", str(cfg.workers)], cold)[0].stdout.split()[-1])]
    t0 = time.perf_counter()
    procs = [subprocess.Popen([py, "-c", "import torch"], env=cold) for _ in range(cfg.workers)]
    if any(p.wait() for p in procs):
        raise RuntimeError("a process that imports torch failed")
    got["torch"] = [time.perf_counter() - t0]
    done, wall = _run([py, *demo], cold)
    got["cold"] = [parse_time_line(done.stderr)[-1], wall]
    done, wall = _run([py, "-c", _TWICE, *demo[2:]], cold)
    got["second"] = [parse_time_line(done.stderr)[-1], wall]
    done, wall = _run([py, *asha], cold)
    got["asha_cold"] = [parse_time_line(done.stderr)[-1], wall]
    up, wall = _run([py, "-m", "framework", "up", "--num-cpus", str(max(cfg.workers, os.cpu_count() or 1)), "--json"],
                    warm)
    got["up"] = [wall]
    try:
        address = json.loads(up.stdout)["address"]
        got["connect"] = [float(_run([py, "-c", _BARE_RAY, address], {**warm, "RAY_AUTH_MODE": "token"})[0]
                                .stdout.split()[-1])]
        done, wall = _run([py, *demo], warm)
        if "attached to the local service" not in done.stderr:
            raise RuntimeError(f"the demo did not attach to the service:\n{done.stderr[-3000:]}")
        got["attached"] = [parse_time_line(done.stderr)[-1], wall]
        done, wall = _run([py, *asha], warm)
        got["asha_attached"] = [parse_time_line(done.stderr)[-1], wall]
    finally:
        _run([py, "-m", "framework", "down", "--timeout", "60"], warm)
        shutil.rmtree(service_dir, ignore_errors=True)
    return got


def main(argv: list[str] | None = None) -> pd.DataFrame:
    cfg, out = parse_config(Defaults, argv, __doc__, QUICK, check=_check)
    runs = [_measure(cfg, out) for _ in range(cfg.repetitions)]

    def med(key: str, i: int = 0) -> float:
        return statistics.median(r[key][i] for r in runs)

    def line(key: str) -> dict[str, float]:
        lines = [r[key][0] for r in runs]
        return {k: statistics.median(x[k] for x in lines) for k in lines[0]}

    ray_s, torch_s, connect_s = med("ray"), med("torch"), med("connect")
    p = cfg.workers
    rows = [
        {"row": "ray.init() + shutdown", "startup_s": ray_s},
        {"row": f"{p} processes import torch", "startup_s": torch_s},
        {"row": "ray.init(service) + shutdown", "startup_s": connect_s},
        _demo_row("demo: cold", line("cold"), med("cold", 1), "Ray + torch imports", ray_s + torch_s),
        _demo_row("demo: attached to `up`", line("attached"), med("attached", 1), "connect", connect_s),
        _demo_row("demo: 2nd run in a process", line("second"), med("second", 1), "none", float("nan")),
        _demo_row("ASHA on Parquet: cold", line("asha_cold"), med("asha_cold", 1), "Ray + torch imports",
                  ray_s + torch_s),
        _demo_row("ASHA on Parquet: attached to `up`", line("asha_attached"), med("asha_attached", 1), "connect",
                  connect_s),
    ]
    table = pd.DataFrame(rows, columns=["row", "startup_s", "first_unit_s", "imports_s", "process_s", "floor",
                                        "floor_s", "x_floor"])
    table.to_csv(os.path.join(out, "startup.csv"), index=False)
    print(f"Seconds to the demo's first unit ({p} workers, {cfg.epochs} epoch(s), median of {cfg.repetitions}); "
          f"`modelhopper up` took {med('up'):.1f} s:\n")
    print(markdown(table.astype(object).where(table.notna(), "-"), digits=3))
    record_run(out, cfg, up_s=med("up"))
    return table


if __name__ == "__main__":
    main()
    sys.exit(0)
