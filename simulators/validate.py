"""Independent validator of any schedule (simulated, planned or a live schedule.csv): the MOP invariants."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import pandas as pd

COLUMNS = ["config_id", "epoch", "partition", "worker", "kind", "start", "end"]
#: optional: the gang or pack a row ran in (rows of one unit of work share it; empty for a unit of its own)
GROUP = "group"


@dataclass(frozen=True)
class ValidationReport:
    ok: bool
    makespan: float
    violations: tuple[str, ...] = field(default_factory=tuple)

    def __bool__(self) -> bool:
        return self.ok


def as_frame(schedule) -> pd.DataFrame:
    """A DataFrame with COLUMNS from a DataFrame, a CSV path, a `Schedule`, or anything with `.schedule`/`.to_frame`."""
    if isinstance(schedule, pd.DataFrame):
        df = schedule
    elif isinstance(schedule, str) or hasattr(schedule, "__fspath__"):
        df = pd.read_csv(schedule)
    elif hasattr(schedule, "to_frame"):
        df = schedule.to_frame()
    elif hasattr(schedule, "schedule"):
        return as_frame(schedule.schedule)
    else:
        raise TypeError(f"cannot read a schedule from {type(schedule).__name__}")
    missing = set(COLUMNS) - set(df.columns)
    if missing:
        raise ValueError(f"schedule lacks columns {sorted(missing)}")
    return df


def _collapse(df: pd.DataFrame, *key: str) -> pd.DataFrame:
    """`df` with the rows of one group that share `key` kept once (a gang's rows of a config, a pack's on a worker)."""
    solo = df[df[GROUP].isna()]
    return pd.concat([solo, df[df[GROUP].notna()].drop_duplicates([GROUP, *key])]).sort_index()


def _overlaps(df: pd.DataFrame, key: str, tol: float) -> list[str]:
    out = []
    for k, g in df.sort_values(["start", "end"]).groupby(key, sort=True):
        starts, ends = g["start"].to_numpy(), g["end"].to_numpy()
        for i in range(1, len(g)):
            if starts[i] < ends[i - 1] - tol:
                a, b = g.iloc[i - 1], g.iloc[i]
                out.append(
                    f"{key} {k}: units (c{a.config_id} e{a.epoch} q{a.partition}) [{a.start:g}, {a.end:g}) and "
                    f"(c{b.config_id} e{b.epoch} q{b.partition}) [{b.start:g}, {b.end:g}) overlap"
                )
    return out


def validate_schedule(
    schedule,
    availability: Mapping[int, Iterable[int]] | None = None,
    partitions: Iterable[int] | None = None,
    eval_partitions: Iterable[int] | None = None,
    tol: float = 1e-9,
    raise_on_error: bool = False,
    cut: Iterable[tuple[int, int]] = (),
) -> ValidationReport:
    """Check the MOP invariants of Cerebro section 3.1 on completed units, plus availability.

    1. Completeness: every (config, epoch) that appears trained on every training partition exactly once
       (`partitions`; default: all train partitions seen in the schedule), and evaluated at most once per partition.
    2. Model isolation: a config's units never overlap in time.
    3. Worker exclusivity: a worker's never do.
    4. Barriers: a config's eval units of an epoch start after its train units of that epoch end; its epoch e + 1
       starts after its epoch e ends. Availability (if given): each unit ran on a worker that holds its partition.

    Non-preemption is structural (one row = one uninterrupted run); rows must have end >= start.
    Gangs and packs (rows sharing a `group`): a gang's rows of one config and partition (one per worker that
    trained it) are one visit, and all of a gang's rows one run of the config; a pack's rows on one worker (one per
    member) are one run; a group's rows share their kind and times, and a gang's its epoch (a pack's members may be
    at different epochs: an asynchronous procedure's configs).
    `cut`: `(config, epoch)` pairs a person stopped in the middle (a `stop_config` command): those epochs may miss
    partitions, and still train none twice.
    Makespan is max(end) - min(start). Returns a `ValidationReport`; raises `ValueError` if `raise_on_error`.
    """
    df = as_frame(schedule)
    v: list[str] = []
    if (df["end"] < df["start"] - tol).any():
        v.append(f"{int((df['end'] < df['start'] - tol).sum())} rows end before they start")
    grouped = GROUP in df.columns and df[GROUP].notna().any()
    if grouped:
        g = df[df[GROUP].notna()]
        for k, rows in g.groupby(GROUP):
            shared = ["kind", "start", "end"] + (["epoch"] if rows["worker"].nunique() > 1 else [])
            if rows[shared].drop_duplicates().shape[0] > 1:
                v.append(f"group {k}: its rows differ in {', '.join(shared[:-2])} or times")
            if rows.duplicated(["config_id", "worker"]).any():
                v.append(f"group {k}: a (config, worker) pair appears twice")
    # one row per config per visit (the rows of a gang's workers that trained one partition as one)
    visits = _collapse(df, "config_id", "partition") if grouped else df
    train = visits[visits["kind"] == "train"]
    parts = set(partitions) if partitions is not None else set(train["partition"].unique())
    ev = visits[visits["kind"] != "train"]
    cut = {(int(c), int(e)) for c, e in cut}
    for (c, e), g in train.groupby(["config_id", "epoch"]):
        counts = g["partition"].value_counts()
        dup = sorted(int(q) for q, n in counts.items() if n > 1)
        miss = sorted(int(q) for q in parts - set(counts.index)) if (c, e) not in cut else []
        extra = sorted(int(q) for q in set(counts.index) - parts)
        if dup or miss or extra:
            v.append(f"config {c} epoch {e}: completeness broken (duplicated {dup}, missing {miss}, unknown {extra})")
    for (c, e), g in ev.groupby(["config_id", "epoch"]):
        if g["partition"].duplicated().any():
            v.append(f"config {c} epoch {e}: an eval partition evaluated twice")
        if eval_partitions is not None and set(g["partition"]) != set(eval_partitions):
            v.append(f"config {c} epoch {e}: evaluated on {sorted(g['partition'])}, expected {sorted(eval_partitions)}")
        t = train[(train["config_id"] == c) & (train["epoch"] == e)]
        if len(t) and g["start"].min() < t["end"].max() - tol:
            v.append(f"config {c} epoch {e}: eval started before training finished")
    v += _overlaps(_collapse(df, "config_id") if grouped else df, "config_id", tol)  # (a gang's step is one run)
    v += _overlaps(_collapse(df, "worker") if grouped else df, "worker", tol)
    span = df.groupby(["config_id", "epoch"]).agg(s=("start", "min"), f=("end", "max")).reset_index()
    for c, g in span.sort_values("epoch").groupby("config_id"):
        s, f = g["s"].to_numpy(), g["f"].to_numpy()
        for i in range(1, len(g)):
            if s[i] < f[i - 1] - tol:
                v.append(f"config {c}: epoch {g['epoch'].iloc[i]} starts before epoch {g['epoch'].iloc[i - 1]} ends")
    if availability is not None:
        av = {int(q): {int(w) for w in ws} for q, ws in availability.items()}
        for row in df[["config_id", "partition", "worker"]].itertuples(index=False):
            if row.worker not in av.get(int(row.partition), set()):
                v.append(f"config {row.config_id}: partition {row.partition} ran on worker {row.worker}, not a holder")
    makespan = float(df["end"].max() - df["start"].min()) if len(df) else 0.0
    report = ValidationReport(not v, makespan, tuple(v))
    if raise_on_error and v:
        raise ValueError("invalid schedule: " + "; ".join(v[:10]))
    return report
