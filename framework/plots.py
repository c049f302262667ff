"""PNG plots of a run: learning curves per config (matplotlib, headless)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402


def varying(configs: Mapping[int, Mapping[str, Any]]) -> list[str]:
    """The hyper-parameters whose value differs between `configs` (what tells their curves apart)."""
    names = sorted({k for c in configs.values() for k in c})
    return [k for k in names if len({repr(c.get(k)) for c in configs.values()}) > 1]


def config_label(config_id: int, config: Mapping[str, Any], names: list[str]) -> str:
    """`"3: lr=0.01, hidden=64"`: a config's id and the hyper-parameters in `names`."""
    parts = [f"{k}={_short(config.get(k))}" for k in names]
    return f"{config_id}: " + ", ".join(parts) if parts else f"config {config_id}"


def plot_learning_curves(
    metrics: pd.DataFrame,
    path: str,
    metric: str = "valid_loss",
    top: int = 10,
    mode: str = "min",
    configs: Mapping[int, Mapping[str, Any]] | None = None,
    best: int | None = None,
) -> str:
    """One line per config of `metric` over epochs (0-based, whole-epoch ticks). The legend names each config by the
    hyper-parameters that vary (when there are at most `top` configs; else only the best `top` are labelled); the
    `best` config is drawn thick and named in the title."""
    configs = configs or {}
    names = varying(configs)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    if metric in metrics and not metrics.empty:
        last = metrics.sort_values("epoch").groupby("config_id")[metric].last().dropna()
        ranked = list(last.sort_values(ascending=mode == "min").index)
        labelled = set(ranked[:top])
        for cid, g in metrics.groupby("config_id"):
            g = g.sort_values("epoch")
            label = config_label(int(cid), configs.get(cid, {}), names) if cid in labelled else None
            if cid == best:
                ax.plot(g.epoch, g[metric], marker="o", ms=4, lw=2.8, color="black", zorder=3,
                        label=f"best: {label or cid}")
            else:
                ax.plot(g.epoch, g[metric], marker="o", ms=2.5, lw=1, alpha=0.75, label=label)
        if labelled:
            ax.legend(fontsize=7, ncol=1 if len(labelled) <= 5 else 2, loc="best",
                      title=None if len(ranked) <= top else f"best {top} of {len(ranked)}", title_fontsize=7)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("epoch (0-based)")
    ax.set_ylabel(metric)
    title = f"learning curves ({metric}, {'lower' if mode == 'min' else 'higher'} is better)"
    if best is not None:
        title += f"; best: config {best}"
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.set_layout_engine(None)  # (laid out: else `savefig` draws the figure twice, a third of the plot's time)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _short(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)
