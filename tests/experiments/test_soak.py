"""experiments/soak.py: its audit of a schedule log (hand-made logs, exact counts), its option rules, that it stops
only the processes it started, and (opt-in, `-m cluster`: over a minute on 2 cores) a short soak end to end."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import pandas as pd
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def soak(monkeypatch):
    monkeypatch.setattr(sys, "path", [ROOT, *sys.path])
    return importlib.import_module("experiments.soak")


def _log(rows: list[tuple]) -> pd.DataFrame:
    """Unit attempts (seq, config_id, epoch, partition, kind, status) as `SQLiteCatalog.units(status=None)` reads
    them."""
    return pd.DataFrame(rows, columns=["seq", "config_id", "epoch", "partition", "kind", "status"])


def _configs(rows: list[tuple]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["config_id", "status", "epochs", "outcome"])


def _epoch(seq: int, config: int, epoch: int, partitions: int = 2) -> list[tuple]:
    """One clean epoch of a config: a train and an eval unit per partition, all done."""
    return [(seq + 2 * p + i, config, epoch, p, kind, "done") for p in range(partitions)
            for i, kind in enumerate(("train", "eval"))]


def test_soak_audit_of_a_clean_log_counts_every_unit_run_and_none_lost_or_twice(soak):
    units = _log(_epoch(0, 0, 0) + _epoch(4, 0, 1) + _epoch(8, 1, 0))
    configs = _configs([(0, "stopped", 2, "completed"), (1, "stopped", 1, "pruned")])
    f = soak.audit_log(units, configs, partitions=2)
    assert (f["units_run"], f["units_run_train"], f["attempts"]) == (12, 6, 12)
    assert (f["units_rerun"], f["units_lost"], f["units_twice"], f["units_dropped_with_config"]) == (0, 0, 0, 0)
    assert (f["configs_completed"], f["configs_pruned"], f["configs_active"]) == (1, 1, 0)


def test_soak_audit_counts_a_try_run_again_later_as_rerun_not_lost(soak):
    units = _log([(0, 0, 0, 0, "train", "interrupted"), (1, 0, 0, 0, "train", "lost")] + _epoch(2, 0, 0))
    f = soak.audit_log(units, _configs([(0, "stopped", 1, "completed")]), partitions=2)
    assert (f["units_rerun"], f["units_lost"]) == (2, 0)


def test_soak_audit_counts_a_try_never_run_again_as_lost(soak):
    # partition 1's training unit of epoch 0 was interrupted, and its only done row came before that try
    units = _log([(0, 0, 0, 1, "train", "done"), (1, 0, 0, 1, "train", "interrupted"),
                  (2, 0, 0, 0, "train", "done")])
    f = soak.audit_log(units, _configs([(0, "stopped", 1, "completed")]), partitions=2)
    assert (f["units_lost"], f["units_lost_tries"], f["units_lost_gaps"], f["units_rerun"]) == (1, 1, 0, 0)


def test_soak_audit_counts_a_committed_epoch_missing_a_partition_as_lost(soak):
    units = _log([(0, 0, 0, 0, "train", "done"), (1, 0, 1, 0, "train", "done"), (2, 0, 1, 1, "train", "done")])
    f = soak.audit_log(units, _configs([(0, "stopped", 2, "pruned")]), partitions=2)
    assert (f["units_lost"], f["units_lost_gaps"]) == (1, 1)


def test_soak_audit_counts_a_training_unit_done_twice(soak):
    units = _log(_epoch(0, 0, 0) + [(4, 0, 0, 1, "train", "done"), (5, 0, 0, 0, "eval", "done")])
    f = soak.audit_log(units, _configs([(0, "stopped", 1, "completed")]), partitions=2)
    assert (f["units_twice"], f["units_twice_eval"]) == (1, 1)


def test_soak_audit_drops_the_tries_of_an_epoch_a_failed_or_stopped_config_never_finished(soak):
    # config 0 a person stopped in epoch 1 (1 committed epoch); config 1 failed in epoch 0
    units = _log(_epoch(0, 0, 0) + [(4, 0, 1, 0, "train", "interrupted"), (5, 1, 0, 0, "train", "failed")])
    configs = _configs([(0, "stopped", 1, "stopped"), (1, "failed", 0, None)])
    f = soak.audit_log(units, configs, partitions=2)
    assert (f["units_dropped_with_config"], f["units_lost"]) == (2, 0)
    assert (f["configs_stopped"], f["configs_failed"]) == (1, 1)


@pytest.mark.parametrize("field, value, message", [
    ("minutes", 0.0, "`--minutes` is 0.0, but must be > 0"),
    ("kill_every_s", -1.0, "`--kill-every-s` is -1.0, but must be > 0"),
    ("node_up_s", 0.0, "`--node-up-s` is 0.0, but must be > 0"),
    ("node_down_s", 0.0, "`--node-down-s` is 0.0, but must be > 0"),
    ("command_every_s", 0.0, "`--command-every-s` is 0.0, but must be > 0"),
    ("grace_minutes", 0.0, "`--grace-minutes` is 0.0, but must be > 0"),
    ("workers", 0, "`--workers` is 0, but must be >= 1"),
    ("configs", 0, "`--configs` is 0, but must be >= 1"),
    ("max_epochs", 0, "`--max-epochs` is 0, but must be >= 1"),
    ("eta", 1, "`--eta` is 1, but must be >= 2"),
    ("driver_kills", -1, "`--driver-kills` is -1, but must be >= 0"),
    ("node_cpus", 0, "`--node-cpus` is 0, but must be >= 1"),
    ("replicas", 5, "`--replicas` is 5, but must be <= `--workers` (4)"),
])
def test_soak_check_rejects_a_bad_option(soak, field, value, message):
    with pytest.raises(ValueError) as e:
        soak.check(soak.Defaults(**{field: value}))
    assert str(e.value) == message


def test_soak_cluster_close_stops_its_own_processes_and_no_other(soak, tmp_path):
    cluster = soak.SoakCluster(soak.Defaults(), str(tmp_path / "logs"))
    try:
        mine = subprocess.Popen(["sleep", "60"], env=cluster.env)  # what a `ray start` of the soak would leave
        other = subprocess.Popen(["sleep", "60"])  # another engineer's process
        cluster.close()
        assert mine.wait(timeout=10) is not None
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()
        cluster.remove()
    assert not os.path.exists(cluster.tmp)


@pytest.mark.cluster
def test_soak_short_run_passes_with_a_driver_kill_and_worker_kills(tmp_path):
    out = tmp_path / "soak"
    argv = ["--minutes", "0.5", "--configs", "6", "--max-epochs", "1", "--device-s", "0.05", "--kill-every-s", "4",
            "--driver-kills", "1", "--node-up-s", "10", "--node-down-s", "5", "--command-every-s", "3",
            "--grace-minutes", "4", "--out", str(out)]
    done = subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "soak.py"), *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "soak PASSED" in done.stdout
    figures = pd.read_json(out / "soak.json").iloc[0]
    assert figures.units_lost == 0 and figures.units_twice == 0 and figures.driver_kills == 1
    assert figures.units_run > 0 and figures.configs_active == 0
