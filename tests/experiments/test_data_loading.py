"""experiments/data_loading.py at a tiny size: its table has a task-parallel row and a MOP row per replica count,
and MOP's workers read about their share of what task parallelism's workers read."""

from __future__ import annotations

import os
import sys

import pandas as pd
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow  # fresh worker processes per row: make test-slow
def test_data_loading_measures_mop_against_task_parallelism(ray_cluster, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "path", [ROOT, *sys.path])
    from experiments import data_loading

    out = tmp_path / "out"
    table = data_loading.main(["--gb", "0.02", "--formats", "parquet", "--workers", "2", "--partitions", "2",
                               "--replicas", "1", "--out", str(out)])
    assert list(zip(table.way, table.replicas)) == [("task", "-"), ("mop", 1)]
    task, mop1 = table.itertuples()
    # half the data (the largest partition: within a row of half); a MOP row per replica count costs a fresh set of
    # worker processes, so one is enough here (docs/guides/data.md has replicas 1 and 2 at 1 GB)
    assert abs(2 * mop1.held_mb - task.held_mb) < 0.01 * task.held_mb
    assert mop1.read_mb < 0.75 * task.read_mb  # about half: each of 2 workers reads its one partition
    assert (table.load_s > 0).all() and (table.peak_rss_mb > 0).all()
    assert pd.read_csv(out / "data_loading.csv").shape[0] == 2
    assert "| format | way | replicas |" in capsys.readouterr().out
