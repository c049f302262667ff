"""PNG plots of a run: learning curves per config (matplotlib, headless)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402


def plot_learning_curves(metrics: pd.DataFrame, path: str, metric: str = "valid_loss", top: int = 10) -> str:
    """One line per config of `metric` over epochs (the `top` configs by their last value highlighted)."""
    fig, ax = plt.subplots(figsize=(7, 4))
    if metric in metrics:
        for cid, g in metrics.groupby("config_id"):
            g = g.sort_values("epoch")
            ax.plot(g.epoch, g[metric], marker="o", ms=3, lw=1, label=f"config {cid}")
        if metrics.config_id.nunique() <= top:
            ax.legend(fontsize=7, ncol=2)
    ax.set_xlabel("epoch")
    ax.set_ylabel(metric)
    ax.set_title(f"learning curves ({metric})")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
