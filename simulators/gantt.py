"""Gantt chart of any schedule (a simulation, a plan, or a live run's schedule.csv) as a PNG."""

from __future__ import annotations

from simulators.validate import as_frame


def plot_gantt(schedule, path, title: str = "", failed=None) -> None:
    """One row per worker, one bar per unit coloured by config (eval units hatched, failed attempts in grey)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    df = as_frame(schedule)
    t0 = float(df["start"].min()) if len(df) else 0.0  # the axis starts at the first unit, as the makespan does
    df = df.assign(start=df["start"] - t0, end=df["end"] - t0)
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
    handles = [Patch(facecolor="white", edgecolor="black", label="train unit (colour: config, label: its id)")]
    if (df["kind"] != "train").any():
        handles.append(Patch(facecolor="white", edgecolor="black", hatch="//", label="eval unit"))
    if failed is not None and len(failed):
        for r in as_frame(failed).itertuples(index=False):
            if r.worker in row:
                ax.barh(row[r.worker], r.end - r.start, left=r.start - t0, color="lightgrey", edgecolor="red",
                        hatch="xx")
        handles.append(Patch(facecolor="lightgrey", edgecolor="red", hatch="xx", label="failed or lost attempt"))
    ax.legend(handles=handles, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12 if len(workers) > 3 else -0.3),
              ncol=len(handles), frameon=False)
    ax.set_yticks(range(len(workers)), [f"worker {w}" for w in workers])
    ax.invert_yaxis()
    ax.set_xlabel("time since the first unit started (s)")
    span = float(df["end"].max() - df["start"].min()) if len(df) else 0.0
    ax.set_title(title or f"makespan {span:.4g}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
