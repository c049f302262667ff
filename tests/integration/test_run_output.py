"""What a run prints into a job log: a real `ModelSelection` in a process of its own, stderr to a file (as `ray job
submit` or `cmd 2> log` give it). The bar writes status lines, not redraws; the leaderboard lines still come; the
time split is printed and recorded, and adds up to no more than the wall time; our line beside Ray's token warning
comes once."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

from framework.driver.observers import STATUS_EVERY_S, TIME_PARTS
from framework.result import Result

pytestmark = [pytest.mark.ray, pytest.mark.slow]  # a process of its own that starts its own Ray: make test-slow
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = """
import sys
import automl, framework
from framework.examples import classifier_step_fn, mlp_model_fn, synthetic_classification
x, y = synthetic_classification(256, 16, classes=4, seed=0)
ds = framework.PartitionedDataset.from_arrays(x, y, num_partitions=1, seed=0)
space = {"hidden": [8], "lr": [0.05, 0.1], "batch_size": [64], "in_features": [16], "classes": [4]}
framework.ModelSelection(mlp_model_fn, step_fn=classifier_step_fn, dataset=ds, num_workers=1, seed=0,
                         procedure=automl.GridSearch(space, epochs=2), storage_path=sys.argv[1],
                         metric="valid_accuracy", mode="max").run()
"""


def test_a_run_into_a_job_log_writes_status_lines_its_time_split_and_one_token_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}  # a run of its own Ray
    env.update(XDG_STATE_HOME=str(tmp_path / "state"), PYTHONPATH=ROOT)
    storage = str(tmp_path / "run")
    start = time.monotonic()
    with open(tmp_path / "stderr", "w") as err:
        done = subprocess.run([sys.executable, "-c", SCRIPT, storage], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=err, text=True, timeout=400)
    wall = time.monotonic() - start
    log = (tmp_path / "stderr").read_text()
    assert done.returncode == 0, log[-3000:]

    # the bar: status lines (at most one per STATUS_EVERY_S, and the last one), never a redraw
    assert "\r" not in log
    lines = log.split("\n")
    bar = [line for line in lines if line.startswith("model selection:")]
    assert 1 <= len(bar) <= 1 + wall / STATUS_EVERY_S, bar
    assert " 100% 8/8 units " in bar[-1]  # 2 configs x 2 epochs x (a train and an eval unit)
    assert lines.index(f"Run directory: {storage}") < lines.index(bar[0])
    assert re.search(r"^round 0: .*\nround 1: ", done.stdout, re.M), done.stdout  # the leaderboard lines still come

    # the time split: printed once, recorded in run.db, its parts add up to no more than the wall time
    timed = [line for line in lines if line.startswith("time: ")]
    assert len(timed) == 1, log[-3000:]
    with Result.open(storage) as result:
        assert result.verified
        split = result.meta["time_split"]
    assert [k for k in split if k in TIME_PARTS] == list(TIME_PARTS)  # a process's first run: before run() too
    assert all(split[k] >= 0 for k in TIME_PARTS) and split["training"] > 0 and split["first_unit"] > 0
    assert split["total"] == pytest.approx(sum(split[k] for k in TIME_PARTS), abs=0.01)
    assert split["total"] <= wall
    assert float(re.match(r"time: ([\d.]+) s: start-up ", timed[0]).group(1)) == pytest.approx(split["total"], abs=0.06)
    for label in ("before run() ", "Ray ", "set-up ", "workers ", "training ", "(first unit ", "results "):
        assert label in timed[0], timed[0]
    assert lines.index(timed[0]) < next(i for i, line in enumerate(lines) if line.startswith("Results: "))

    # Ray's token-authentication warning, and our line about it, once
    assert "Token authentication is enabled for this Ray cluster" not in log  # Ray's note, replaced by our line
    assert log.count("modelhopper: this run's Ray takes only processes holding the token in ") == 1
