"""The cost model measures storage reads with the page cache dropped, and compute throughput."""

from __future__ import annotations

import os

import pytest

from framework.planner import CostModel, measure_cost_model
from framework.planner.milp import measure_compute_throughput, measure_read_bandwidth


def test_read_bandwidth_drops_the_page_cache_where_the_os_can(tmp_path) -> None:
    bw, method = measure_read_bandwidth(1 << 22, directory=str(tmp_path), repeats=2)
    assert bw > 0 and method in ("fadvise", "o_direct", "cached")
    if hasattr(os, "posix_fadvise"):
        assert method == "fadvise"
    assert list(tmp_path.iterdir()) == []  # the probe file is gone


def test_read_bandwidth_rejects_tiny_probes() -> None:
    with pytest.raises(ValueError, match="`nbytes` is 1000, but must be an int >= 1 MiB"):
        measure_read_bandwidth(1000)


def test_cost_model_measures_both_and_keeps_overrides(tmp_path) -> None:
    cm = measure_cost_model(nbytes=1 << 22, directory=str(tmp_path))
    assert cm.flops_per_s > 0 and 0 < cm.disk_bytes_per_s < float("inf")
    assert measure_cost_model(flops_per_s=5.0, disk_bytes_per_s=7.0) == CostModel(5.0, 7.0)
    assert measure_compute_throughput(size=32, reps=2, repeats=2) > 0


def test_cost_model_converts_load_time_to_missed_flops() -> None:
    cm = CostModel(flops_per_s=1e9, disk_bytes_per_s=1e6)
    assert cm.load_cost(1000) == pytest.approx(1e6)  # 1 ms of reading = 1e6 FLOPs not done
    assert CostModel(1e9, float("inf")).load_cost(1000) == 0.0
