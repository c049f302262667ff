"""Independent validator of any schedule (simulated, planned or a live schedule.csv): the MOP invariants."""

from __future__ import annotations

from collections import Counter, defaultdict
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
    """Pairs of `df`'s rows of one `key` value that overlap in time, each row against the one before it in start
    order."""
    rows = sorted(zip(df[key].tolist(), df["start"].tolist(), df["end"].tolist(), df["config_id"].tolist(),
                      df["epoch"].tolist(), df["partition"].tolist()), key=lambda r: (r[0], r[1], r[2]))
    out = []
    for a, b in zip(rows, rows[1:]):
        if a[0] == b[0] and b[1] < a[2] - tol:
            out.append(f"{key} {a[0]}: units (c{a[3]} e{a[4]} q{a[5]}) [{a[1]:g}, {a[2]:g}) and "
                       f"(c{b[3]} e{b[4]} q{b[5]}) [{b[1]:g}, {b[2]:g}) overlap")
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
    # (plain lists from here: the checks below run once per simulated schedule, so in every property test)
    is_train = (visits["kind"] == "train").to_numpy()
    cols = [visits[c].tolist() for c in ("config_id", "epoch", "partition", "start", "end")]
    trained: dict[tuple, Counter] = defaultdict(Counter)  # (config, epoch) -> partition -> visits
    trained_end: dict[tuple, float] = {}
    evals: dict[tuple, list[tuple]] = defaultdict(list)  # (config, epoch) -> (partition, start) of its eval rows
    for t, c, e, q, start, end in zip(is_train, *cols):
        if t:
            trained[c, e][q] += 1
            trained_end[c, e] = max(end, trained_end.get((c, e), end))
        else:
            evals[c, e].append((q, start))
    parts = set(partitions) if partitions is not None else {q for counts in trained.values() for q in counts}
    cut = {(int(c), int(e)) for c, e in cut}
    for (c, e), counts in sorted(trained.items()):
        dup = sorted(int(q) for q, n in counts.items() if n > 1)
        miss = sorted(int(q) for q in parts - set(counts)) if (c, e) not in cut else []
        extra = sorted(int(q) for q in set(counts) - parts)
        if dup or miss or extra:
            v.append(f"config {c} epoch {e}: completeness broken (duplicated {dup}, missing {miss}, unknown {extra})")
    expected = None if eval_partitions is None else set(eval_partitions)
    for (c, e), rows in sorted(evals.items()):
        seen = [q for q, _ in rows]
        if len(set(seen)) < len(seen):
            v.append(f"config {c} epoch {e}: an eval partition evaluated twice")
        if expected is not None and set(seen) != expected:
            v.append(f"config {c} epoch {e}: evaluated on {sorted(seen)}, expected {sorted(expected)}")
        if (c, e) in trained_end and min(start for _, start in rows) < trained_end[c, e] - tol:
            v.append(f"config {c} epoch {e}: eval started before training finished")
    v += _overlaps(_collapse(df, "config_id") if grouped else df, "config_id", tol)  # (a gang's step is one run)
    v += _overlaps(_collapse(df, "worker") if grouped else df, "worker", tol)
    span: dict[tuple, list[float]] = {}  # (config, epoch) -> [first start, last end]
    for c, e, start, end in zip(df["config_id"].tolist(), df["epoch"].tolist(), df["start"].tolist(),
                                df["end"].tolist()):
        s_f = span.setdefault((c, e), [start, end])
        s_f[0], s_f[1] = min(s_f[0], start), max(s_f[1], end)
    ordered = sorted(span)
    for (c, e), (prev_c, prev_e) in zip(ordered[1:], ordered):
        if c == prev_c and span[c, e][0] < span[prev_c, prev_e][1] - tol:
            v.append(f"config {c}: epoch {e} starts before epoch {prev_e} ends")
    if availability is not None:
        av = {int(q): {int(w) for w in ws} for q, ws in availability.items()}
        for c, q, w in zip(df["config_id"].tolist(), df["partition"].tolist(), df["worker"].tolist()):
            if w not in av.get(int(q), set()):
                v.append(f"config {c}: partition {q} ran on worker {w}, not a holder")
    makespan = float(df["end"].max() - df["start"].min()) if len(df) else 0.0
    report = ValidationReport(not v, makespan, tuple(v))
    if raise_on_error and v:
        raise ValueError("invalid schedule: " + "; ".join(v[:10]))
    return report
