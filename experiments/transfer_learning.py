"""Nautilus FTR-2-like transfer-learning workload at CPU scale: the planner vs MAT-ALL vs current practice (no reuse),
in settings where the materialization MILP's choice matters.

A frozen backbone feeds 8 configs = 4 feature-transfer strategies x 2 learning rates, each training a head on a new
target task over labelling cycles that each add labelled records. Backbones (``--model``):
- ``transformer``: a small transformer encoder pre-trained inside the script on a synthetic source task (token
  sequences from class-specific token distributions); strategies: second last hidden, last hidden, sum of the last
  4 hidden, concat of the last 4 hidden.
- ``resnet18``: ``framework.architectures.resnet18`` with random weights on small synthetic images; strategies: the
  pooled output of layer2, layer3, layer4, and layer3 + layer4 concatenated.
Every method trains the same configs on the same batches from the same initial weights, so the best validation
accuracy is the same; only the time differs.

Settings (each run with every seed in ``--seeds``):
- ``unlimited``: no disk budget, storage read at the measured bandwidth (page cache dropped: ``measure_cost_model``).
- ``tight``: the disk budget is ``--tight-budget`` x what the unlimited plan stores: the MILP must pick cheaper layers.
- ``zero``: disk budget 0: nothing is stored, the planner can only fuse (share the frozen computation per batch).
- ``slow``: storage modelled at ``--slow-read-mb-s`` MB/s: the planner's cost model uses that bandwidth, and every
  feature-store read is slowed to it (it sleeps for the time the bytes would take at that rate), so recomputing a
  layer can beat loading it. Raw records stay in memory and are never slowed (they are a few % of one layer).
MAT-ALL ignores any budget (it stores everything), so it runs in ``unlimited`` and ``slow``; current practice stores
and reads nothing, so it runs once per seed and is the baseline of every setting. The FLOPs-optimal bound (Nautilus
equation 11: all FLOPs over those of the trainable part) and the measured wall-clock speedup over current practice
are separate columns: one counts operations of the architecture, the other is time on this machine.

Also printed, for the first seed: the MILP's objective against exhaustive enumeration (``exhaustive_materialization``)
on the small instance of one config per strategy in every setting; Vista's Eager vs Staged extraction of the stored
layers (time, peak bytes held, bytes read back); and HAPI's split point and extraction batch on the engine's
near-data path (``transfer_on_engine(split=...)``) against fixed layers (bytes per record moved, time).

Runs in-process (the planner is pure torch + OR-Tools); the distributed path belongs to the MOP engine.

    python experiments/transfer_learning.py --threads 1   # 5 seeds, about 2 minutes on 2 cores
    python experiments/transfer_learning.py --quick       # 2 seeds, under a minute
    python experiments/transfer_learning.py --model resnet18 --quick --threads 1   # a few minutes
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from experiments._common import parse_config, record_run  # noqa: E402
from framework.planner import (  # noqa: E402
    CostModel,
    FeatureStore,
    TransferSelection,
    build_multimodel,
    flops_optimal_speedup,
    optimize_materialization,
    profile_model,
)
from framework.planner.milp import (  # noqa: E402
    exhaustive_materialization,
    measure_compute_throughput,
    measure_read_bandwidth,
)

MODELS = ("transformer", "resnet18")
STRATEGIES = {
    "transformer": ("second_last", "last", "sum_last4", "concat_last4"),
    "resnet18": ("layer2", "layer3", "layer4", "concat34"),
}


@dataclass
class Defaults:
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)  # one comparison per seed: target task, records, initial weights, order
    model: str = "transformer"  # the frozen backbone: transformer (pre-trained here) or resnet18 (random weights)
    vocab: int = 128  # transformer: tokens in the vocabulary
    seq_len: int = 32  # transformer: tokens per sequence
    d_model: int = 64  # transformer: hidden size
    n_heads: int = 4  # transformer: attention heads per encoder layer
    d_ff: int = 256  # transformer: feed-forward size
    n_layers: int = 4  # transformer: encoder layers
    image_size: int = 32  # resnet18: input height and width (3 channels)
    head_dim: int = 128  # the trainable head's hidden size
    source_classes: int = 8  # classes of the pre-training (source) task
    target_classes: int = 4  # classes of the transfer (target) task
    task_scale: float = 0.35  # spread of the class token distributions: lower = harder
    pretrain_steps: int = 60  # transformer: optimizer steps of the pre-training (once, with the first seed)
    pretrain_batch: int = 64  # transformer: mini-batch size of the pre-training
    cycles: int = 3  # labelling cycles; each adds records and runs a model selection
    records_per_cycle: int = 64  # labelled training records each cycle adds
    valid_per_cycle: int = 32  # labelled validation records each cycle adds
    epochs: int = 2  # epochs per config and cycle
    batch_sizes: tuple[int, ...] = (32,)  # the grid's batch sizes
    lrs: tuple[float, ...] = (5e-3, 2e-3)  # the grid's learning rates
    initial_records: int = 512  # the planner's first estimate of the records r (doubles when exceeded: re-plan)
    tight_budget: float = 0.3  # the tight setting's disk budget, as a fraction of what the unlimited plan stores
    slow_read_mb_s: float = 20.0  # the slow setting's storage read bandwidth in MB/s (0 skips the setting)
    memory_budget_mb: float = 2048.0  # memory the fused models may take (Nautilus' B_mem)
    threads: int = 0  # torch threads (0: torch's default); 1 keeps timings steady on a machine shared with other work
    exhaustive: bool = True  # check the MILP against exhaustive enumeration on one config per strategy
    vista: bool = True  # time Vista's Staged against Eager extraction of the stored layers (all records)
    hapi: bool = True  # bytes moved and time of HAPI's split vs fixed layers, as the engine would extract them
    worker_memory_mb: float = 64.0  # HAPI: a worker's memory budget for extraction (sets its batch size)
    link_mb_s: float = 125.0  # HAPI: bandwidth between the data and the trainer (1 Gbit/s)
    quick: bool = False


QUICK = {
    "seeds": (0, 1),
    "cycles": 2,
    "records_per_cycle": 48,
    "valid_per_cycle": 24,
    "pretrain_steps": 30,
    "lrs": (5e-3,),
}


def check(a: Defaults) -> None:
    if a.model not in MODELS:
        raise ValueError(f"`--model` is {a.model!r}, but must be one of {MODELS}")
    if not a.seeds:
        raise ValueError("`--seeds` is empty, but must hold at least one seed")
    if not 0 < a.tight_budget < 1:
        raise ValueError(f"`--tight-budget` is {a.tight_budget}, but must be in (0, 1)")
    if a.threads < 0:
        raise ValueError(f"`--threads` is {a.threads}, but must be >= 0 (0: torch's default)")
    if a.slow_read_mb_s < 0:
        raise ValueError(f"`--slow-read-mb-s` is {a.slow_read_mb_s}, but must be >= 0 (0 skips the setting)")


# ---- backbones and tasks ----------------------------------------------------------------------------------------


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


class ResNetTransfer(nn.Module):
    """Frozen ResNet-18 trunk -> pooled features of one or two stages -> trainable head."""

    WIDTH = {"layer2": 128, "layer3": 256, "layer4": 512, "concat34": 768}

    def __init__(self, trunk: nn.Module, strategy: str, a: Defaults) -> None:
        super().__init__()
        self.trunk, self.strategy = trunk, strategy
        self.proj = nn.Linear(self.WIDTH[strategy], a.head_dim)
        self.out = nn.Linear(a.head_dim, a.target_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.trunk
        h = t.maxpool(t.relu(t.bn1(t.conv1(x))))  # (B, 64, H/4, W/4)
        h2 = t.layer2(t.layer1(h))  # (B, 128, H/8, W/8)
        if self.strategy == "layer2":
            f = h2.mean(dim=(2, 3))
        else:
            h3 = t.layer3(h2)  # (B, 256, H/16, W/16)
            if self.strategy == "layer3":
                f = h3.mean(dim=(2, 3))
            else:
                h4 = t.layer4(h3)  # (B, 512, H/32, W/32)
                f = h4.mean(dim=(2, 3))
                if self.strategy == "concat34":
                    f = torch.cat([h3.mean(dim=(2, 3)), f], dim=1)  # (B, 768)
        return self.out(torch.nn.functional.gelu(self.proj(f)))  # (B, C)


def make_task(n_classes: int, a: Defaults, g: torch.Generator) -> torch.Tensor:
    """Class-conditional token distributions (n_classes, vocab), or class image means (n_classes, 3, S, S)."""
    if a.model == "resnet18":
        return torch.randn(n_classes, 3, a.image_size, a.image_size, generator=g) * a.task_scale
    logits = torch.randn(n_classes, a.vocab, generator=g) * a.task_scale
    return torch.softmax(logits, dim=-1)


def sample(dists: torch.Tensor, n: int, a: Defaults, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    y = torch.randint(0, len(dists), (n,), generator=g)
    if a.model == "resnet18":
        return dists[y] + torch.randn(n, *dists.shape[1:], generator=g), y  # (n, 3, S, S)
    return torch.multinomial(dists[y], a.seq_len, replacement=True, generator=g), y  # (n, T)


def pretrain(a: Defaults, seed: int) -> nn.Module:
    """The frozen backbone: the transformer pre-trained on the source task, or a random-weight ResNet-18 trunk."""
    torch.manual_seed(seed)
    if a.model == "resnet18":
        from framework.architectures import resnet18

        enc = resnet18(num_classes=a.source_classes)
    else:
        g = torch.Generator().manual_seed(seed)
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


def model_factory(backbone: nn.Module, a: Defaults) -> Callable[[dict[str, Any]], nn.Module]:
    cls = ResNetTransfer if a.model == "resnet18" else TransferModel

    def model_fn(cfg: dict[str, Any]) -> nn.Module:
        return cls(backbone, cfg["strategy"], a)

    return model_fn


# ---- settings and runs ------------------------------------------------------------------------------------------


class CappedReadStore(FeatureStore):
    """A feature store on modelled slower storage: a read of n bytes takes at least n / ``bytes_per_s`` seconds."""

    def __init__(self, root: str | Path, bytes_per_s: float) -> None:
        super().__init__(root)
        self.bytes_per_s = bytes_per_s

    def read(self, key: str, ids: Sequence[int]) -> np.ndarray:
        t0 = time.perf_counter()
        out = super().read(key, ids)
        time.sleep(max(0.0, out.nbytes / self.bytes_per_s - (time.perf_counter() - t0)))
        return out


@dataclass(frozen=True)
class Setting:
    name: str
    disk_budget: float  # bytes
    cost_model: CostModel
    read_cap: float | None  # bytes/s the store's reads are slowed to, None: this machine's storage
    methods: tuple[str, ...]


def final_records(a: Defaults) -> int:
    r = a.initial_records
    while a.cycles * (a.records_per_cycle + a.valid_per_cycle) > r:
        r *= 2
    return r


def run_one(a: Defaults, s: Setting, method: str, seed: int, model_fn: Callable, configs: list[dict]) -> dict:
    """One labelling-cycle sequence of ``method`` in setting ``s``: its total time, storage and best accuracy."""
    g = torch.Generator().manual_seed(seed + 1)
    target = make_task(a.target_classes, a, g)
    cycles = [(sample(target, a.records_per_cycle, a, g), sample(target, a.valid_per_cycle, a, g)) for _ in
              range(a.cycles)]
    root = Path(tempfile.mkdtemp(prefix=f"features-{method}-"))
    store = CappedReadStore(root, s.read_cap) if s.read_cap else FeatureStore(root)
    sel = TransferSelection(model_fn, configs, store_dir=store, method=method, epochs=a.epochs,
                            disk_budget=s.disk_budget, memory_budget=a.memory_budget_mb * 2**20,
                            initial_records=a.initial_records, cost_model=s.cost_model, seed=seed)
    seconds = plan_s = mat_s = 0.0
    best = []
    try:
        for train, valid in cycles:
            res = sel.fit(train, valid)
            seconds += res.timings["total_s"]
            plan_s += res.timings["plan_s"]
            mat_s += res.timings["materialize_s"]
            row = res.metrics[res.metrics.config_id == res.best_config_id].iloc[-1]
            best.append(round(float(row.valid_acc), 6))
        stored = sel.store.nbytes()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    plan = res.plan
    loads_raw = sum(plan.input_key in plan.loaded_keys(gi) for gi in range(len(plan.groups)))
    return {"setting": s.name, "method": method, "seed": seed, "seconds": seconds, "plan_s": plan_s,
            "materialize_s": mat_s, "stored_mb": stored / 1e6, "V": len(plan.materialized),
            "groups": len(plan.groups), "groups_recompute_from_input": loads_raw, "best_acc": tuple(best)}


def summarise(runs: pd.DataFrame, settings: list[Setting], bound: float) -> pd.DataFrame:
    """One row per (setting, method): time and speedup over current practice (same seed) as median [min, max]."""
    cp = runs[runs.method == "current_practice"].set_index("seed")["seconds"]
    rows = []
    for s in settings:
        mat = runs[(runs.setting == s.name) & (runs.method == "mat_all")].set_index("seed")["seconds"]
        for method in s.methods:
            r = runs[(runs.setting == s.name) & (runs.method == method)].set_index("seed")
            speed = cp.loc[r.index] / r["seconds"]
            vs_mat = (mat.loc[r.index] / r["seconds"]) if len(mat) else pd.Series([math.nan])
            budget = s.disk_budget / 1e6
            rows.append({
                "setting": s.name, "method": method,
                "read_MB_s": s.cost_model.disk_bytes_per_s / 1e6,
                "budget_MB": budget,
                "seconds": f"{r.seconds.median():.2f} [{r.seconds.min():.2f}, {r.seconds.max():.2f}]",
                "speedup_vs_no_reuse": f"{speed.median():.2f} [{speed.min():.2f}, {speed.max():.2f}]",
                "planner_vs_mat_all": f"{vs_mat.median():.2f}" if method == "planner" and len(mat) else "",
                "flops_optimal_bound": bound,
                "stored_MB": r.stored_mb.median(),
                "fits": "yes" if r.stored_mb.max() * 1e6 <= s.disk_budget * (1 + 1e-9) + 1 else "no",
                "V": int(r.V.median()), "groups": int(r.groups.median()),
            })
    return pd.DataFrame(rows)


def exhaustive_check(a: Defaults, settings: list[Setting], model_fn: Callable, x0: torch.Tensor) -> pd.DataFrame:
    """MILP vs exhaustive enumeration on one config per strategy, in every setting, at the final r."""
    mm = build_multimodel([profile_model(model_fn({"strategy": st}), x0) for st in STRATEGIES[a.model]])
    r, epochs = final_records(a), [a.epochs] * len(STRATEGIES[a.model])
    rows = []
    for s in settings:
        t0 = time.perf_counter()
        milp = optimize_materialization(mm, s.cost_model, records=r, epochs=epochs, disk_budget=s.disk_budget)
        t1 = time.perf_counter()
        try:
            ex = exhaustive_materialization(mm, s.cost_model, records=r, epochs=epochs, disk_budget=s.disk_budget)
        except ValueError as e:  # too many storable layers to enumerate
            rows.append({"setting": s.name, "milp_objective": milp.objective, "exhaustive": str(e)})
            continue
        t2 = time.perf_counter()
        storable = sum(n.storable and n.op != "placeholder" for n in mm.layers.values())
        rows.append({"setting": s.name, "storable_layers": storable,
                     "milp_objective": milp.objective, "exhaustive_objective": ex.objective,
                     "equal": math.isclose(milp.objective, ex.objective, rel_tol=1e-6),
                     "milp_V": len(milp.materialized), "exhaustive_V": len(ex.materialized),
                     "milp_s": t1 - t0, "exhaustive_s": t2 - t1})
    return pd.DataFrame(rows)


def staged_vs_eager(a: Defaults, model_fn: Callable, configs: list[dict], cost_model: CostModel, seed: int,
                    repeats: int = 3) -> pd.DataFrame:
    """Extract V of MAT-ALL (every storable layer) and of the planner for every record of a run, Eager vs Staged."""
    from framework.planner import plan_transfer

    g = torch.Generator().manual_seed(seed + 1)
    target = make_task(a.target_classes, a, g)
    n = a.cycles * (a.records_per_cycle + a.valid_per_cycle)
    x, _ = sample(target, n, a, g)
    models = [model_fn(c) for c in configs]
    mm = build_multimodel([profile_model(m, x[:1]) for m in models])
    rows = []
    for method in ("mat_all", "planner"):
        plan = plan_transfer(models, x[:1], method=method, batch_sizes=[c["batch_size"] for c in configs],
                             epochs=[a.epochs] * len(configs), records=final_records(a), cost_model=cost_model, mm=mm)
        for execution in ("eager", "staged"):
            for _ in range(repeats):
                root = Path(tempfile.mkdtemp(prefix="vista-"))
                try:
                    plan.materialize(FeatureStore(root), np.arange(n), x, execution=execution)
                finally:
                    shutil.rmtree(root, ignore_errors=True)
                rows.append({"V_of": method, "layers": len(plan.materialized), "execution": execution,
                             "records": n, **{k: v for k, v in plan.last_extraction.items() if k != "execution"}})
    df = pd.DataFrame(rows)
    out = df.groupby(["V_of", "layers", "execution", "records"], sort=False).agg(
        seconds=("seconds", "median"), seconds_min=("seconds", "min"), seconds_max=("seconds", "max"),
        peak_MB=("peak_bytes", "max"), read_back_MB=("read_bytes", "max")).reset_index()
    out[["peak_MB", "read_back_MB"]] /= 1e6
    return out


def hapi_splits(
    a: Defaults, model_fn: Callable, configs: list[dict], cost_model: CostModel, seed: int
) -> pd.DataFrame:
    """What a worker extracts near its data and what that costs, per split rule (``transfer_on_engine``)."""
    from framework.planner.engine import measure_split, transfer_on_engine

    g = torch.Generator().manual_seed(seed + 1)
    n = a.cycles * (a.records_per_cycle + a.valid_per_cycle)
    x, _ = sample(make_task(a.target_classes, a, g), n, a, g)
    rows = []
    for split in ("input", "hapi", "freeze", "plan"):
        tr = transfer_on_engine(model_fn, configs, x[:2], epochs=a.epochs, records=n, seed=seed,
                                cost_model=cost_model, split=split, link_bytes_per_s=a.link_mb_s * 1e6,
                                worker_memory_budget=a.worker_memory_mb * 2**20)
        rep = measure_split(tr, x)
        names = [tr.plan.mm.layers[k].name for k in tr.split_keys]
        rows.append({**rep, "extracts": ",".join(names) or "(raw records)",
                     "MB_moved": rep["bytes_per_record"] * n / 1e6})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> None:
    a, out = parse_config(Defaults, argv, __doc__, QUICK, check)
    run_dir = Path(out)
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    t0 = time.perf_counter()
    backbone = pretrain(a, a.seeds[0])
    pretrain_s = time.perf_counter() - t0
    model_fn = model_factory(backbone, a)
    configs = [{"strategy": st, "batch_size": b, "lr": lr, "epochs": a.epochs}
               for st in STRATEGIES[a.model] for b in a.batch_sizes for lr in a.lrs]
    x0 = sample(make_task(a.target_classes, a, torch.Generator().manual_seed(0)), 1, a, torch.Generator())[0]

    t0 = time.perf_counter()
    flops = measure_compute_throughput()
    read_bw, read_method = measure_read_bandwidth()
    measure_s = time.perf_counter() - t0
    measured = CostModel(flops, read_bw)

    # the tight budget: a fraction of what the unlimited plan stores at the final r (sizes only: any seed's weights)
    mm = build_multimodel([profile_model(model_fn(c), x0) for c in configs])
    bound = flops_optimal_speedup(mm, [a.epochs] * len(configs))
    free = optimize_materialization(mm, measured, records=final_records(a), epochs=[a.epochs] * len(configs))
    settings = [
        Setting("unlimited", math.inf, measured, None, ("current_practice", "mat_all", "planner")),
        Setting("tight", a.tight_budget * free.storage_bytes, measured, None, ("planner",)),
        Setting("zero", 0.0, measured, None, ("planner",)),
    ]
    if a.slow_read_mb_s > 0:
        cap = a.slow_read_mb_s * 1e6
        settings.append(Setting("slow", math.inf, CostModel(flops, min(read_bw, cap)), min(read_bw, cap),
                                ("mat_all", "planner")))
    print(f"cost model: {flops / 1e9:.2f} GFLOP/s (float32 matmul), storage reads {read_bw / 1e6:.0f} MB/s "
          f"(page cache dropped: {read_method}); measured in {measure_s:.2f}s", flush=True)
    if a.slow_read_mb_s > 0:
        print(f"slow setting: reads capped at {a.slow_read_mb_s:.1f} MB/s (modelled: the store sleeps to that rate)")
    print(f"{a.model}: {len(configs)} configs, {a.cycles} cycles, seeds {list(a.seeds)}, {torch.get_num_threads()} "
          f"torch threads; backbone ready in {pretrain_s:.1f}s", flush=True)

    rows = []
    for seed in a.seeds:
        t_seed = time.perf_counter()
        for s in settings:
            for method in s.methods:
                rows.append(run_one(a, s, method, seed, model_fn, configs))
        print(f"  seed {seed}: {time.perf_counter() - t_seed:.1f}s", flush=True)
        pd.DataFrame(rows).to_csv(run_dir / "runs.csv", index=False)  # kept if a later seed is interrupted
    runs = pd.DataFrame(rows)
    same = runs.groupby("seed")["best_acc"].nunique().eq(1).all()
    summary = summarise(runs, settings, bound)
    runs.to_csv(run_dir / "runs.csv", index=False)
    summary.to_csv(run_dir / "summary.csv", index=False)

    print(f"\nmodel-selection time over all cycles (planner includes planning and materialization); median [min, max]"
          f" over {len(a.seeds)} seeds;\nbest validation accuracy equal across methods and settings: {same}")
    print(summary.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    detail = runs.groupby(["setting", "method"], sort=False)[["plan_s", "materialize_s",
                                                             "groups_recompute_from_input"]].median()
    print("\nmedian planning and materialization seconds, and groups that recompute from raw records:")
    print(detail.to_string(float_format=lambda v: f"{v:.2f}"))
    if a.exhaustive:
        ex = exhaustive_check(a, settings, model_fn, x0)
        ex.to_csv(run_dir / "exhaustive.csv", index=False)
        print("\nMILP vs exhaustive enumeration (one config per strategy, final r; objective in FLOPs):")
        print(ex.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    if a.vista:
        vs = staged_vs_eager(a, model_fn, configs, measured, a.seeds[0])
        vs.to_csv(run_dir / "vista.csv", index=False)
        print("\nVista: Eager (one pass, every layer held until written) vs Staged (one layer at a time, earlier "
              "stages read back);\nseconds median, min, max of 3; peak = feature and input bytes held at once:")
        print(vs.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    if a.hapi:
        hp = hapi_splits(a, model_fn, configs, measured, a.seeds[0])
        hp.to_csv(run_dir / "hapi.csv", index=False)
        print(f"\nHAPI on the engine's near-data extraction ({a.worker_memory_mb:.0f} MB worker budget, link "
              f"{a.link_mb_s:.0f} MB/s): per split, bytes per record leaving the data's side, extraction time and one "
              "forward+backward of every config's branch over the features:")
        print(hp.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    record_run(out, a, pretrain_s=pretrain_s, cost_model=dataclasses.asdict(measured), read_method=read_method,
               torch_threads=torch.get_num_threads())


if __name__ == "__main__":
    main()
