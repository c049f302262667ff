"""Nautilus FTR-2-like transfer-learning workload at CPU scale: Current Practice vs MAT-ALL vs the planner.

A small transformer encoder is pre-trained inside the script on a synthetic source task (token sequences drawn from
class-specific token distributions), then frozen. 24 configs = 4 feature-transfer strategies (second last hidden,
last hidden, sum of last 4 hidden, concat of last 4 hidden) x 2 batch sizes x 3 learning rates each train a
trainable head on a new target task, over labelling cycles that each add a few hundred labelled records. Every
method trains the same configs on the same batches from the same initial weights, so the best validation accuracy
per cycle is the same; only the time differs. Prints speedups over Current Practice and the FLOPs-optimal bound
(Nautilus equation 11), and records config, seed and git revision next to the results.

Runs in-process (the planner is pure torch + OR-Tools); the distributed path belongs to the MOP engine.

    python experiments/transfer_learning.py            # default, a few minutes on 2 cores
    python experiments/transfer_learning.py --quick    # under a minute
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pandas as pd  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from experiments._common import parse_config, record_run  # noqa: E402
from framework.planner import METHODS, TransferSelection, measure_cost_model  # noqa: E402


@dataclass
class Defaults:
    seed: int = 0  # seeds the pre-training, the tasks, the records and the planner
    vocab: int = 128  # tokens in the vocabulary
    seq_len: int = 32  # tokens per sequence
    d_model: int = 64  # the encoder's hidden size
    n_heads: int = 4  # attention heads per encoder layer
    d_ff: int = 256  # the encoder's feed-forward size
    n_layers: int = 4  # encoder layers
    head_dim: int = 128  # the trainable head's hidden size
    source_classes: int = 8  # classes of the pre-training (source) task
    target_classes: int = 4  # classes of the transfer (target) task
    task_scale: float = 0.35  # spread of the class token distributions: lower = harder
    pretrain_steps: int = 150  # optimizer steps of the pre-training
    pretrain_batch: int = 64  # mini-batch size of the pre-training
    cycles: int = 5  # labelling cycles; each adds records and runs a model selection
    records_per_cycle: int = 160  # labelled training records each cycle adds
    valid_per_cycle: int = 80  # labelled validation records each cycle adds
    epochs: int = 5  # epochs per config and cycle
    batch_sizes: tuple[int, ...] = (16, 32)  # the grid's batch sizes
    lrs: tuple[float, ...] = (5e-3, 3e-3, 2e-3)  # the grid's learning rates
    strategies: tuple[str, ...] = ("second_last", "last", "sum_last4", "concat_last4")  # feature-transfer strategies
    methods: tuple[str, ...] = METHODS  # methods compared (framework.planner.METHODS)
    initial_records: int = 256  # the planner's first estimate of the records (doubles when exceeded)
    disk_budget_mb: float = 1024.0  # disk the materialized features may take (Nautilus' B_disk)
    memory_budget_mb: float = 2048.0  # memory the fused models may take (Nautilus' B_mem)
    quick: bool = False


QUICK = {"cycles": 2, "records_per_cycle": 64, "valid_per_cycle": 64, "epochs": 2, "pretrain_steps": 40}


class Encoder(nn.Module):
    """Token embedding + learned positions + n transformer layers; returns every hidden state."""

    def __init__(self, a: Defaults) -> None:
        super().__init__()
        self.emb = nn.Embedding(a.vocab, a.d_model)
        self.pos = nn.Parameter(torch.randn(1, a.seq_len, a.d_model) * 0.02)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(a.d_model, a.n_heads, a.d_ff, dropout=0.1, batch_first=True)
            for _ in range(a.n_layers)
        )

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        h = self.emb(x) + self.pos  # (B, T, D)
        hs = [h]
        for layer in self.layers:
            h = layer(h)
            hs.append(h)
        return hs


class TransferModel(nn.Module):
    """Frozen pre-trained encoder -> feature-transfer strategy -> trainable head (Nautilus FTR)."""

    def __init__(self, encoder: Encoder, strategy: str, a: Defaults) -> None:
        super().__init__()
        self.encoder, self.strategy = encoder, strategy
        d_in = a.d_model * (4 if strategy == "concat_last4" else 1)
        self.proj = nn.Linear(d_in, a.head_dim)
        self.out = nn.Linear(a.head_dim, a.target_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hs = self.encoder(x)
        if self.strategy == "second_last":
            f = hs[-2]
        elif self.strategy == "last":
            f = hs[-1]
        elif self.strategy == "sum_last4":
            f = hs[-1] + hs[-2] + hs[-3] + hs[-4]
        else:
            f = torch.cat([hs[-4], hs[-3], hs[-2], hs[-1]], dim=-1)  # (B, T, 4D)
        h = torch.nn.functional.gelu(self.proj(f))  # (B, T, H)
        return self.out(h.mean(dim=1))  # (B, C)


def make_task(n_classes: int, a: Defaults, g: torch.Generator) -> torch.Tensor:
    """Class-conditional token distributions (n_classes, vocab)."""
    logits = torch.randn(n_classes, a.vocab, generator=g) * a.task_scale
    return torch.softmax(logits, dim=-1)


def sample(dists: torch.Tensor, n: int, a: Defaults, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    y = torch.randint(0, len(dists), (n,), generator=g)
    x = torch.multinomial(dists[y], a.seq_len, replacement=True, generator=g)  # (n, T)
    return x, y


def pretrain(a: Defaults) -> Encoder:
    g = torch.Generator().manual_seed(a.seed)
    torch.manual_seed(a.seed)
    enc = Encoder(a)
    clf = nn.Linear(a.d_model, a.source_classes)
    dists = make_task(a.source_classes, a, g)
    opt = torch.optim.Adam(list(enc.parameters()) + list(clf.parameters()), lr=1e-3)
    for _ in range(a.pretrain_steps):
        x, y = sample(dists, a.pretrain_batch, a, g)
        loss = nn.functional.cross_entropy(clf(enc(x)[-1].mean(1)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    for p in enc.parameters():
        p.requires_grad_(False)
    return enc.eval()


def main(argv: list[str] | None = None) -> None:
    a, out = parse_config(Defaults, argv, __doc__, QUICK)
    run_dir = Path(out)
    torch.set_num_threads(max(1, torch.get_num_threads()))

    t0 = time.perf_counter()
    encoder = pretrain(a)
    pretrain_s = time.perf_counter() - t0
    configs = [
        {"strategy": s, "batch_size": b, "lr": lr, "epochs": a.epochs}
        for s in a.strategies
        for b in a.batch_sizes
        for lr in a.lrs
    ]
    g = torch.Generator().manual_seed(a.seed + 1)
    target = make_task(a.target_classes, a, g)
    cycles = [
        (sample(target, a.records_per_cycle, a, g), sample(target, a.valid_per_cycle, a, g)) for _ in range(a.cycles)
    ]
    cost_model = measure_cost_model()

    def model_fn(cfg: dict) -> nn.Module:
        return TransferModel(encoder, cfg["strategy"], a)

    rows, metrics = [], []
    for method in a.methods:
        store = Path(tempfile.mkdtemp(prefix=f"features-{method}-"))
        sel = TransferSelection(
            model_fn,
            configs,
            store_dir=store,
            method=method,
            epochs=a.epochs,
            disk_budget=a.disk_budget_mb * 2**20,
            memory_budget=a.memory_budget_mb * 2**20,
            initial_records=a.initial_records,
            cost_model=cost_model,
            seed=a.seed,
        )
        for c, (train, valid) in enumerate(cycles):
            res = sel.fit(train, valid)
            best = res.metrics[res.metrics.config_id == res.best_config_id].iloc[-1]
            rows.append(
                {
                    "method": method,
                    "cycle": c,
                    "seconds": res.timings["total_s"],
                    "materialize_s": res.timings["materialize_s"],
                    "best_config": res.best_config_id,
                    "best_valid_acc": float(best.valid_acc),
                    "groups": len(res.plan.groups),
                    "materialized": len(res.plan.materialized),
                    "bound": res.timings["flops_optimal_speedup"],
                }
            )
            metrics.append(res.metrics.assign(method=method))
        shutil.rmtree(store, ignore_errors=True)

    per_cycle = pd.DataFrame(rows)
    totals = per_cycle.groupby("method", sort=False)["seconds"].sum()
    base = totals.get("current_practice", float("nan"))
    bound = float(per_cycle["bound"].iloc[0])
    summary = pd.DataFrame({"seconds": totals, "speedup": base / totals, "fraction_of_bound": base / totals / bound})
    summary.loc["flops_optimal"] = [base / bound, bound, 1.0]
    acc = per_cycle.pivot(index="cycle", columns="method", values="best_valid_acc")

    pd.concat(metrics).to_csv(run_dir / "metrics.csv", index=False)
    per_cycle.to_csv(run_dir / "cycles.csv", index=False)
    summary.to_csv(run_dir / "summary.csv")

    print(f"pre-training {pretrain_s:.1f}s; {len(configs)} configs, {a.cycles} cycles")
    print(per_cycle.drop(columns=["bound"]).to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print("\nbest validation accuracy per cycle (equal across methods):")
    print(acc.to_string(float_format=lambda v: f"{v:.3f}"))
    print("\ntotal model-selection time (all cycles; planner includes planning and materialization):")
    print(summary.to_string(float_format=lambda v: f"{v:.2f}"))
    record_run(out, a, pretrain_s=pretrain_s, cost_model=dataclasses.asdict(cost_model),
               torch_threads=torch.get_num_threads())


if __name__ == "__main__":
    main()
