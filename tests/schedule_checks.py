"""Independent checks of the MOP invariants on a schedule log (a Result.schedule DataFrame)."""

from __future__ import annotations

import pandas as pd


def assert_mop_invariants(schedule: pd.DataFrame, partitions: list[int], availability: dict | None = None) -> None:
    """Completeness, model isolation, worker exclusivity (and availability, when a map is given)."""
    train = schedule[schedule.kind == "train"]
    # 1. completeness: each (config, epoch) trained on every partition exactly once
    for (cid, epoch), g in train.groupby(["config_id", "epoch"]):
        assert sorted(g.partition) == sorted(partitions), f"config {cid} epoch {epoch} visited {sorted(g.partition)}"
    # 2. model isolation: a config's units never overlap in time
    for cid, g in schedule.groupby("config_id"):
        g = g.sort_values("start")
        assert (g.start.values[1:] >= g.end.values[:-1] - 1e-9).all(), f"config {cid} ran two units at once"
    # 3. worker exclusivity: a worker's units never overlap in time
    for w, g in schedule.groupby("worker"):
        g = g.sort_values("start")
        assert (g.start.values[1:] >= g.end.values[:-1] - 1e-9).all(), f"worker {w} ran two units at once"
    if availability is not None:
        for row in schedule.itertuples():
            assert row.worker in availability[row.partition], f"{row} ran on a worker without its partition"
