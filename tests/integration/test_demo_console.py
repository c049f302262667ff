"""The demo's console, pinned line by line: what a newcomer's first `python -m framework demo` prints on stdout (the
plan, a round line per round, the leaderboard, the best config, where the results are) and on stderr (our one
token line where Ray would have warned, the run directory, the progress bar, the time split, the results line),
with nothing else of ours or of third parties but Ray's own start-up line."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]  # a process of its own that starts its own Ray: make test-slow
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

STDOUT = [
    r"Model selection on scikit-learn digits: 1797 images, 2 partitions/workers, grid of 6 MLP configs x 1 epochs, "
    r"scheduler=randomized",
    r"round 0: [\d.]+s \| best config \d valid_accuracy=0\.\d{4} \| 6 active, 0 failed, 6 total",
    r"",
    r"Leaderboard \(latest epoch\):",
    r" config_id +valid_accuracy +valid_loss +train_loss +config",
    *[r" +\d +0\.\d+ +[\d.]+ +[\d.]+ +\{'hidden': \d+, 'lr': [\d.]+, 'batch_size': 32, 'optimizer': 'sgd'\}"] * 6,
    r"",
    r"Best config \d: \{'hidden': \d+, 'lr': [\d.]+, 'batch_size': 32, 'optimizer': 'sgd'\}",
    r"Results written to (?P<run>\S+) \(metrics.csv, schedule.csv, leaderboard.csv, checkpoints/, run.db, "
    r"learning_curves.png\)",
]
STDERR = [
    r"modelhopper: this run's Ray takes only processes holding the token in \S+, so other users of this machine "
    r"cannot attach; set RAY_AUTH_MODE=token to keep it on without the warning",
    r"Run directory: \S+",
    r"model selection: 100% 24/24 units .*",
    r"time: [\d.]+ s: start-up [\d.]+ s \(before run\(\) [\d.]+, Ray [\d.]+, set-up [\d.]+, workers [\d.]+\), "
    r"training [\d.]+ s \(first unit [\d.]+\), results [\d.]+ s",
    r"Results: \S+ \(6 configs, best \d, valid_accuracy=0\.\d{4}\)",
]
RAY_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+\s+INFO worker\.py:\d+ -- Started a local Ray instance\.$")


def test_the_demo_prints_exactly_its_lines(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}  # as a newcomer's shell
    env.update(MODELHOPPER_STORAGE=str(tmp_path / "runs"), PYTHONPATH=ROOT)
    done = subprocess.run([sys.executable, "-m", "framework", "demo", "--epochs", "1"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout.rstrip("\n").split("\n")
    assert len(out) == len(STDOUT), done.stdout
    for line, pattern in zip(out, STDOUT):
        assert re.fullmatch(pattern, line), (pattern, line)
    # the progress bar redraws with carriage returns: its last drawing is the line a terminal keeps
    err = [line.split("\r")[-1] for line in done.stderr.rstrip("\n").split("\n")]
    ours = [line for line in err if not RAY_LINE.match(line)]
    assert len(err) - len(ours) <= 1, done.stderr  # Ray's one start-up line, nothing else of Ray's
    assert len(ours) == len(STDERR), done.stderr
    for line, pattern in zip(ours, STDERR):
        assert re.fullmatch(pattern, line), (pattern, line)
