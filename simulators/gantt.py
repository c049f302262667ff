"""Gantt chart of any schedule (a simulation, a plan, or a live run's schedule.csv) as a PNG."""

from __future__ import annotations

from simulators.validate import as_frame


def plot_gantt(schedule, path, title: str = "", failed=None) -> None:
    """One row per worker, one bar per unit coloured by config (eval units hatched, failed attempts in grey)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    df = as_frame(schedule)
    workers = sorted(df["worker"].unique())
    row = {w: i for i, w in enumerate(workers)}
    cmap = plt.get_cmap("tab20")
    fig, ax = plt.subplots(figsize=(12, 0.45 * len(workers) + 1.5))
    for r in df.itertuples(index=False):
        ax.barh(
            row[r.worker], r.end - r.start, left=r.start, color=cmap(int(r.config_id) % 20), edgecolor="black",
            linewidth=0.3, hatch="//" if r.kind != "train" else None,
        )  # fmt: skip
        if len(df) <= 400:
            ax.text((r.start + r.end) / 2, row[r.worker], str(r.config_id), ha="center", va="center", fontsize=6)
    if failed is not None and len(failed):
        for r in as_frame(failed).itertuples(index=False):
            if r.worker in row:
                ax.barh(row[r.worker], r.end - r.start, left=r.start, color="lightgrey", edgecolor="red", hatch="xx")
    ax.set_yticks(range(len(workers)), [f"worker {w}" for w in workers])
    ax.invert_yaxis()
    ax.set_xlabel("time")
    span = float(df["end"].max() - df["start"].min()) if len(df) else 0.0
    ax.set_title(title or f"makespan {span:.4g}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
